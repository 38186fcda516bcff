//! The graph IR: SSA values that carry a shape and a dtype, and nodes that are ops of the op
//! table. A graph is built in order (a node's inputs are defined before it), so its node list is
//! already a topological order, and the same program always gives the same graph, text and
//! fingerprint.

use std::fmt::{self, Write as _};
use std::hash::Hasher;
use std::sync::Arc;

use tpu_ops::tpu_tensor::{Error, Result, Tensor};
use tpu_ops::{Meta, OpDef};

/// One SSA value of a graph: an input or an output of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ValueId(pub u32);

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Where a graph input comes from when the graph runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputKind {
    /// The `n`-th argument of the compiled function.
    Arg(usize),
    /// The `n`-th tensor the function read from its environment (a parameter, a buffer, a
    /// number it turned into a tensor), read again on every call.
    Captured(usize),
    /// The `n`-th of the graph's own constants ([`Graph::constants`]): a tensor nothing
    /// outside the graph can write, so passes may read and fold it.
    Constant(usize),
}

/// One op applied to values.
#[derive(Clone, Debug)]
pub struct Node {
    /// The op, with its attributes.
    pub op: Arc<dyn OpDef>,
    /// Its operands.
    pub inputs: Vec<ValueId>,
    /// The values it defines.
    pub outputs: Vec<ValueId>,
}

/// A computation: inputs, nodes in execution order, outputs.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    metas: Vec<Meta>,
    inputs: Vec<(ValueId, InputKind)>,
    nodes: Vec<Node>,
    outputs: Vec<ValueId>,
    constants: Vec<Tensor>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    fn fresh(&mut self, meta: Meta) -> ValueId {
        self.metas.push(meta);
        ValueId(self.metas.len() as u32 - 1)
    }

    /// Adds an input of the given shape and dtype.
    pub fn add_input(&mut self, meta: Meta, kind: InputKind) -> ValueId {
        let v = self.fresh(meta);
        self.inputs.push((v, kind));
        v
    }

    /// Adds an input that is the constant `t` (owned by the graph from now on).
    pub fn add_constant(&mut self, t: Tensor) -> ValueId {
        let i = self.constants.len();
        self.constants.push(t);
        let meta = Meta::new(self.constants[i].shape(), self.constants[i].dtype());
        self.add_input(meta, InputKind::Constant(i))
    }

    /// The graph's constants, in the order of [`InputKind::Constant`].
    pub fn constants(&self) -> &[Tensor] {
        &self.constants
    }

    /// The tensor of `v` when `v` is a constant input.
    pub fn constant_of(&self, v: ValueId) -> Option<&Tensor> {
        self.inputs.iter().find_map(|(u, kind)| match kind {
            InputKind::Constant(i) if *u == v => self.constants.get(*i),
            _ => None,
        })
    }

    /// Makes the input `v` the constant `t` (its shape and dtype must be `v`'s): for a
    /// captured tensor that nothing outside the graph can write any more.
    pub fn make_constant(&mut self, v: ValueId, t: Tensor) -> Result<()> {
        if Meta::new(t.shape(), t.dtype()) != *self.meta(v) {
            return Err(Error::internal(
                "graph",
                format!(
                    "a constant {} for input {v} of type {}",
                    meta_text(&Meta::new(t.shape(), t.dtype())),
                    meta_text(self.meta(v))
                ),
            ));
        }
        let i = self.constants.len();
        let Some(slot) = self.inputs.iter_mut().find(|(u, _)| *u == v) else {
            return Err(Error::internal("graph", format!("{v} is not an input")));
        };
        slot.1 = InputKind::Constant(i);
        self.constants.push(t);
        Ok(())
    }

    /// Drops the constant inputs nothing reads and renumbers the rest; returns how many it
    /// dropped. (Arguments and captured tensors stay: callers index them by position.)
    pub fn drop_unused_constants(&mut self) -> usize {
        let last = self.last_uses();
        let before = self.inputs.len();
        let mut kept = Vec::new();
        let constants = std::mem::take(&mut self.constants);
        self.inputs.retain_mut(|(v, kind)| match kind {
            InputKind::Constant(i) if last[v.0 as usize].is_some() => {
                kept.push(constants[*i].clone());
                *kind = InputKind::Constant(kept.len() - 1);
                true
            }
            InputKind::Constant(_) => false,
            _ => true,
        });
        self.constants = kept;
        before - self.inputs.len()
    }

    /// Appends `op` applied to `inputs`, defining one value per output meta. The metas are the
    /// op's shape rule applied to the inputs' metas; they are checked against it.
    pub fn add_node(
        &mut self,
        op: Arc<dyn OpDef>,
        inputs: &[ValueId],
        outputs: &[Meta],
    ) -> Result<Vec<ValueId>> {
        for v in inputs {
            if v.0 as usize >= self.metas.len() {
                return Err(Error::invalid_argument(
                    op.name(),
                    format!("an operand {v} that the graph does not define"),
                ));
            }
        }
        let outs: Vec<ValueId> = outputs.iter().map(|m| self.fresh(m.clone())).collect();
        self.nodes.push(Node {
            op,
            inputs: inputs.to_vec(),
            outputs: outs.clone(),
        });
        Ok(outs)
    }

    /// Sets the values the graph returns.
    pub fn set_outputs(&mut self, outputs: Vec<ValueId>) {
        self.outputs = outputs;
    }

    /// The shape and dtype of a value.
    pub fn meta(&self, v: ValueId) -> &Meta {
        &self.metas[v.0 as usize]
    }

    /// The number of values defined (inputs and node outputs, live or not).
    pub fn num_values(&self) -> usize {
        self.metas.len()
    }

    /// The inputs, in the order the executors take them.
    pub fn inputs(&self) -> &[(ValueId, InputKind)] {
        &self.inputs
    }

    /// The nodes, in execution order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The returned values.
    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }

    /// Replaces the node list (passes rebuild it); [`Graph::validate`] checks the result.
    pub fn set_nodes(&mut self, nodes: Vec<Node>) {
        self.nodes = nodes;
    }

    /// Renames every use of a value by `map` (in nodes and outputs).
    pub fn rename_uses(&mut self, map: &dyn Fn(ValueId) -> ValueId) {
        for n in &mut self.nodes {
            for v in &mut n.inputs {
                *v = map(*v);
            }
        }
        for v in &mut self.outputs {
            *v = map(*v);
        }
    }

    /// Checks the SSA rules: every value is defined once, before any use, and every use and
    /// output names a defined value.
    pub fn validate(&self) -> Result<()> {
        let mut defined = vec![false; self.metas.len()];
        let bad = |what: String| Err(Error::internal("graph", what));
        for (v, _) in &self.inputs {
            if std::mem::replace(&mut defined[v.0 as usize], true) {
                return bad(format!("input {v} is defined twice"));
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            for v in &n.inputs {
                if !defined.get(v.0 as usize).copied().unwrap_or(false) {
                    return bad(format!(
                        "node {i} ({}) uses {v} before it is defined",
                        n.op.name()
                    ));
                }
            }
            for v in &n.outputs {
                if std::mem::replace(&mut defined[v.0 as usize], true) {
                    return bad(format!("{v} is defined twice"));
                }
            }
        }
        for v in &self.outputs {
            if !defined.get(v.0 as usize).copied().unwrap_or(false) {
                return bad(format!("the output {v} is not defined"));
            }
        }
        Ok(())
    }

    /// For each value, the index of the last node that reads it (`usize::MAX` for graph
    /// outputs, which live to the end; `None` for values nothing reads).
    pub fn last_uses(&self) -> Vec<Option<usize>> {
        let mut last = vec![None; self.metas.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for v in &n.inputs {
                last[v.0 as usize] = Some(i);
            }
        }
        for v in &self.outputs {
            last[v.0 as usize] = Some(usize::MAX);
        }
        last
    }

    /// A 64-bit fingerprint of the program: its text with values renumbered in order of
    /// definition, so two graphs of one program agree even when built with other value numbers.
    pub fn fingerprint(&self) -> u64 {
        let mut h = fnv::FnvHasher::default();
        h.write(self.canonical_text().as_bytes());
        // The text shows a constant's type and a preview only; its bytes decide.
        for c in &self.constants {
            match tpu_ops::tpu_tensor::host_reads::allow_host_reads(|| c.to_host_bytes()) {
                Ok(bytes) => h.write(&bytes),
                Err(e) => h.write(e.to_string().as_bytes()),
            }
        }
        h.finish()
    }

    /// The text dump with values renumbered in order of definition.
    fn canonical_text(&self) -> String {
        let mut order = vec![u32::MAX; self.metas.len()];
        let mut next = 0u32;
        let mut number = |v: ValueId| {
            if order[v.0 as usize] == u32::MAX {
                order[v.0 as usize] = next;
                next += 1;
            }
        };
        for (v, _) in &self.inputs {
            number(*v);
        }
        for n in &self.nodes {
            n.outputs.iter().for_each(|v| number(*v));
        }
        let name = |v: ValueId| ValueId(order[v.0 as usize]);
        let mut s = String::new();
        self.write_text(&mut s, &name);
        s
    }

    fn write_text(&self, s: &mut String, name: &dyn Fn(ValueId) -> ValueId) {
        let ty = |v: ValueId| meta_text(self.meta(v));
        for (v, kind) in &self.inputs {
            let _ = match kind {
                InputKind::Arg(i) => writeln!(s, "{} = arg {i} : {}", name(*v), ty(*v)),
                InputKind::Captured(i) => writeln!(s, "{} = captured {i} : {}", name(*v), ty(*v)),
                InputKind::Constant(i) => writeln!(
                    s,
                    "{} = constant {i} {} : {}",
                    name(*v),
                    self.constants.get(*i).map(preview).unwrap_or_default(),
                    ty(*v)
                ),
            };
        }
        for n in &self.nodes {
            let outs: Vec<String> = n.outputs.iter().map(|v| name(*v).to_string()).collect();
            let ins: Vec<String> = n.inputs.iter().map(|v| name(*v).to_string()).collect();
            let tys: Vec<String> = n.outputs.iter().map(|v| ty(*v)).collect();
            let _ = writeln!(
                s,
                "{} = {}({}) {} : {}",
                outs.join(", "),
                n.op.name(),
                ins.join(", "),
                n.op.attrs(),
                tys.join(", ")
            );
        }
        let outs: Vec<String> = self.outputs.iter().map(|v| name(*v).to_string()).collect();
        let _ = writeln!(s, "return {}", outs.join(", "));
    }

    /// The graph in Graphviz DOT: one box per node, one ellipse per input, edges labelled with
    /// the value's type.
    pub fn to_dot(&self) -> String {
        let mut s = String::from("digraph tpu_graph {\n  rankdir=TB;\n");
        let mut producer = vec![String::new(); self.metas.len()];
        for (v, kind) in &self.inputs {
            let id = format!("in{}", v.0);
            let label = match kind {
                InputKind::Arg(i) => format!("arg {i}"),
                InputKind::Captured(i) => format!("captured {i}"),
                InputKind::Constant(i) => format!("constant {i}"),
            };
            let _ = writeln!(
                s,
                "  {id} [shape=ellipse, label=\"{label}\\n{}\"];",
                meta_text(self.meta(*v))
            );
            producer[v.0 as usize] = id;
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let id = format!("n{i}");
            let _ = writeln!(s, "  {id} [shape=box, label=\"{}\"];", n.op.name());
            for v in &n.inputs {
                let _ = writeln!(
                    s,
                    "  {} -> {id} [label=\"{}\"];",
                    producer[v.0 as usize],
                    meta_text(self.meta(*v))
                );
            }
            for v in &n.outputs {
                producer[v.0 as usize] = id.clone();
            }
        }
        for (i, v) in self.outputs.iter().enumerate() {
            let _ = writeln!(s, "  out{i} [shape=plaintext, label=\"output {i}\"];");
            let _ = writeln!(s, "  {} -> out{i};", producer[v.0 as usize]);
        }
        s.push_str("}\n");
        s
    }
}

/// A constant's values in the text dump: all of them when there are a few, else a count.
fn preview(t: &Tensor) -> String {
    const SHOWN: usize = 8;
    if t.numel() > SHOWN {
        return format!("<{} elements>", t.numel());
    }
    let text = tpu_ops::tpu_tensor::host_reads::allow_host_reads(|| t.to_string());
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `f32[2, 3]`: a value's type in the text dump.
pub fn meta_text(m: &Meta) -> String {
    let dims: Vec<String> = m.shape.iter().map(|d| d.to_string()).collect();
    format!("{}[{}]", m.dtype, dims.join(", "))
}

/// The text dump: one line per input and node, then the returned values.
impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        self.write_text(&mut s, &|v| v);
        f.write_str(&s)
    }
}
