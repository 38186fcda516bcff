//! Graph passes. Each is a function from a graph to a smaller or equal graph computing the same
//! outputs; [`optimize`] runs them in turn until none changes the graph.
//!
//! - [`cse`]: repeated nodes merged.
//! - [`dce`]: nodes whose outputs nothing reads dropped.
//! - [`simplify`]: arithmetic identities (`x * 1`, `x - 0`, `x / 1`, ...), views that change
//!   nothing, and views of views composed into one (transposes of transposes, reshape chains,
//!   expands of expands).
//! - [`matmul_transposes`]: a product with a transposed matrix operand becomes the product that
//!   reads the matrix transposed (`matmul(x, wᵀ)` is `linear(x, w)`, and back).
//! - [`fold_constants`]: nodes over constants only evaluated once, when the graph is optimised.
//! - [`fuse_for_cpu`]: plain SGD updates fused into their gradients' products
//!   ([`fuse_product_updates`]), then chains of f32 elementwise nodes made one kernel that
//!   reads and writes memory once; run after the others, for the native CPU executor only.
//!
//! Constants are the graph's own tensors ([`crate::ir::InputKind::Constant`]);
//! [`promote_constants`] makes them of the captured tensors that nothing outside the graph can
//! write any more (numbers and tensors the traced function made itself).

mod cse;
mod dce;
mod epilogue;
mod fold;
mod fuse;
mod matmul;
mod simplify;

pub use cse::cse;
pub use dce::dce;
pub use epilogue::fuse_product_updates;
pub use fold::{FOLD_LIMIT_BYTES, fold_constants, promote_constants};
pub use fuse::fuse_for_cpu;
pub use matmul::matmul_transposes;
pub use simplify::simplify;

use tpu_ops::tpu_tensor::{Error, Result};

use crate::ir::{Graph, Node, ValueId};

/// What the passes did to one graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Nodes before the passes.
    pub nodes_before: usize,
    /// Nodes after them.
    pub nodes_after: usize,
    /// Rounds until nothing changed.
    pub rounds: usize,
}

/// How often each pass changed the graph while [`optimize_counted`] ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassCounts {
    /// Nodes merged into an earlier equal node.
    pub cse: usize,
    /// Dead nodes dropped.
    pub dce: usize,
    /// Nodes removed or rewritten by [`simplify`].
    pub simplify: usize,
    /// Products rewritten by [`matmul_transposes`].
    pub matmul_transposes: usize,
    /// Nodes evaluated by [`fold_constants`].
    pub folded: usize,
    /// Constants dropped because nothing read them any more.
    pub constants_dropped: usize,
    /// Captured tensors made constants before the passes ([`promote_constants`]).
    pub promoted: usize,
    /// Nodes replaced by fused elementwise kernels ([`fuse_for_cpu`]).
    pub fused: usize,
}

impl std::fmt::Display for PassCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} promoted to constants, {} folded, {} simplified, {} transposes into products, \
             {} merged, {} dead, {} fused",
            self.promoted,
            self.folded,
            self.simplify,
            self.matmul_transposes,
            self.cse,
            self.dce,
            self.fused
        )
    }
}

/// Most rounds [`optimize`] runs; every pass shrinks the graph or rewrites a node into a simpler
/// one, so real graphs settle in a few, and the bound only guards against a pair of rewrites
/// that would undo each other.
const MAX_ROUNDS: usize = 64;

/// Runs every pass until the graph stops changing.
pub fn optimize(graph: &mut Graph) -> Result<PassReport> {
    optimize_counted(graph).map(|(report, _)| report)
}

/// [`optimize`], also saying what each pass did.
pub fn optimize_counted(graph: &mut Graph) -> Result<(PassReport, PassCounts)> {
    let nodes_before = graph.nodes().len();
    let mut counts = PassCounts::default();
    let mut rounds = 0;
    loop {
        rounds += 1;
        let mut changed = false;
        let mut count = |n: usize, into: &mut usize| {
            *into += n;
            changed |= n > 0;
        };
        count(simplify(graph)?, &mut counts.simplify);
        count(matmul_transposes(graph)?, &mut counts.matmul_transposes);
        count(fold_constants(graph)?, &mut counts.folded);
        let n = graph.nodes().len();
        cse(graph)?;
        count(n - graph.nodes().len(), &mut counts.cse);
        let n = graph.nodes().len();
        dce(graph)?;
        count(n - graph.nodes().len(), &mut counts.dce);
        if !changed || rounds >= MAX_ROUNDS {
            break;
        }
    }
    counts.constants_dropped = graph.drop_unused_constants();
    let report = PassReport {
        nodes_before,
        nodes_after: graph.nodes().len(),
        rounds,
    };
    Ok((report, counts))
}

/// What a pass does with one node.
pub(crate) enum Rewrite {
    /// Keeps it.
    Keep,
    /// Drops it: its one output is this value, which has the same shape and dtype.
    Alias(ValueId),
    /// Replaces it by another node defining the same outputs.
    Replace(Node),
}

/// The nodes a pass has already kept, by the values they define.
pub(crate) struct Defs<'a> {
    nodes: &'a [Node],
    producer: &'a [Option<usize>],
}

impl Defs<'_> {
    /// The node (as rewritten so far) that defines `v`; `None` for inputs.
    pub(crate) fn node_of(&self, v: ValueId) -> Option<&Node> {
        let i = (*self.producer.get(v.0 as usize)?)?;
        self.nodes.get(i)
    }
}

/// Runs `f` on every node in order, with its operands renamed by the earlier rewrites, and
/// applies what it returns; returns how many nodes it changed. `f` may add constants to the
/// graph (they are inputs, so the node order stays valid).
pub(crate) fn rewrite(
    graph: &mut Graph,
    mut f: impl FnMut(&mut Graph, &Defs<'_>, &Node) -> Result<Rewrite>,
) -> Result<usize> {
    let old = graph.nodes().to_vec();
    let mut rename: Vec<ValueId> = (0..graph.num_values() as u32).map(ValueId).collect();
    let mut producer: Vec<Option<usize>> = vec![None; graph.num_values()];
    let mut nodes: Vec<Node> = Vec::with_capacity(old.len());
    let mut changed = 0;
    let mut is_output = vec![false; graph.num_values()];
    for v in graph.outputs() {
        is_output[v.0 as usize] = true;
    }
    let mut is_input = vec![false; graph.num_values()];
    for (v, _) in graph.inputs() {
        is_input[v.0 as usize] = true;
    }
    for n in old {
        let mut n = n;
        for v in &mut n.inputs {
            *v = rename[v.0 as usize];
        }
        let defs = Defs {
            nodes: &nodes,
            producer: &producer,
        };
        match f(graph, &defs, &n)? {
            Rewrite::Keep => {}
            Rewrite::Alias(to) => {
                let [out] = n.outputs[..] else {
                    return Err(Error::internal(
                        "passes",
                        format!("{} has several outputs and cannot alias one", n.op.name()),
                    ));
                };
                // A returned value must not become a tensor the caller could reach another
                // way, and write in place: an argument, a captured or constant tensor (the
                // same one on every call), or a view of one. So results stay fresh, as they
                // are eagerly.
                let shared = is_input.get(to.0 as usize).copied().unwrap_or(true)
                    || defs
                        .node_of(to)
                        .is_some_and(|p| p.op.as_any().is::<crate::view::ViewNode>());
                if is_output[out.0 as usize] && shared {
                    nodes_push(&mut nodes, &mut producer, n);
                    continue;
                }
                if graph.meta(to) != graph.meta(out) {
                    return Err(Error::internal(
                        "passes",
                        format!("{out} aliased to {to} of another type ({})", n.op.name()),
                    ));
                }
                rename[out.0 as usize] = to;
                changed += 1;
                continue;
            }
            Rewrite::Replace(m) => {
                if m.outputs != n.outputs {
                    return Err(Error::internal(
                        "passes",
                        format!("{} replaced by a node with other outputs", n.op.name()),
                    ));
                }
                n = m;
                changed += 1;
            }
        }
        nodes_push(&mut nodes, &mut producer, n);
    }
    if changed == 0 {
        return Ok(0);
    }
    graph.set_nodes(nodes);
    let map = move |v: ValueId| rename.get(v.0 as usize).copied().unwrap_or(v);
    graph.rename_uses(&map);
    graph.validate()?;
    Ok(changed)
}

/// Appends a kept node, noting it as its outputs' producer.
fn nodes_push(nodes: &mut Vec<Node>, producer: &mut [Option<usize>], n: Node) {
    for v in &n.outputs {
        if let Some(p) = producer.get_mut(v.0 as usize) {
            *p = Some(nodes.len());
        }
    }
    nodes.push(n);
}
