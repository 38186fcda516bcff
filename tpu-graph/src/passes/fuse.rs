//! Elementwise fusion for the native CPU executor: groups of f32 elementwise nodes of one
//! output shape become one [`FusedElementwise`] node, which reads its inputs and writes its
//! output once instead of writing and reading back every intermediate.
//!
//! A group grows from a node (its root) to the nodes defining its operands, as long as each
//! such node is fusable, has the root's shape, and its result is read only inside the group and
//! is not returned. Only the root's result then leaves the group, so the group can run at the
//! root's place. Operands are f32 values of the output's shape or one-element values (numbers
//! such as the `0.5` of `x * 0.5`), and a `where`'s condition is bool of that shape or one bool.
//! What does not fuse: ops without an f32 slice kernel (comparisons and other bool-valued ops,
//! casts), other dtypes, broadcasts other than of one element, and nodes whose result is used
//! by another group, another op or the caller.

use std::sync::Arc;

use tpu_ops::Meta;
use tpu_ops::ops::elementwise::binary::{Binary, Where};
use tpu_ops::ops::elementwise::unary::Unary;
use tpu_ops::tpu_tensor::{DType, Result};

use crate::fusion::{FusedElementwise, Src, Step, StepOp};
use crate::ir::{Graph, Node, ValueId};

/// Most steps in one fused node: a bound on its text and scratch, far above real chains.
const MAX_STEPS: usize = 256;

/// The step a node would be in a fused program, when it can be one: a unary or binary op with
/// an f32 slice kernel giving f32, over f32 operands of its shape or one-element operands, or a
/// `where` giving f32 whose condition is bool of its shape or one bool.
fn fusable(graph: &Graph, n: &Node) -> Option<StepOp> {
    let [out] = n.outputs[..] else {
        return None;
    };
    let m = graph.meta(out);
    if m.dtype != DType::F32 {
        return None;
    }
    let any = n.op.as_any();
    let step = if let Some(u) = any.downcast_ref::<Unary>() {
        StepOp::Unary(u.clone())
    } else if let Some(b) = any.downcast_ref::<Binary>() {
        StepOp::Binary(b.clone())
    } else if any.is::<Where>() {
        StepOp::Where
    } else {
        return None;
    };
    if !step.fuses() || n.inputs.len() != step.arity() {
        return None;
    }
    let unary = matches!(step, StepOp::Unary(_));
    let operands_fit = n.inputs.iter().enumerate().all(|(k, v)| {
        let x = graph.meta(*v);
        if matches!(step, StepOp::Where) && k == 0 {
            return x.dtype == DType::Bool && (x.shape == m.shape || x.numel() == 1);
        }
        (x.shape == m.shape && x.dtype == DType::F32) || (!unary && x.numel() == 1)
    });
    operands_fit.then_some(step)
}

/// Fuses the products that plain SGD updates consume ([`super::fuse_product_updates`]) and
/// then the elementwise groups of `graph` (see the module's text); returns how many nodes
/// fused nodes replaced. For graphs the native CPU executor runs: a PJRT compiler fuses on its
/// own, and the fused node's lowering only repeats the steps'.
pub fn fuse_for_cpu(graph: &mut Graph) -> Result<usize> {
    let updates = super::fuse_product_updates(graph)?;
    Ok(updates + fuse_elementwise(graph)?)
}

/// The elementwise groups of [`fuse_for_cpu`].
fn fuse_elementwise(graph: &mut Graph) -> Result<usize> {
    let nodes = graph.nodes().to_vec();
    let steps: Vec<Option<StepOp>> = nodes.iter().map(|n| fusable(graph, n)).collect();
    let mut producer: Vec<Option<usize>> = vec![None; graph.num_values()];
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); graph.num_values()];
    for (i, n) in nodes.iter().enumerate() {
        for v in &n.outputs {
            producer[v.0 as usize] = Some(i);
        }
        for v in &n.inputs {
            let c = &mut consumers[v.0 as usize];
            if c.last() != Some(&i) {
                c.push(i);
            }
        }
    }
    let mut returned = vec![false; graph.num_values()];
    for v in graph.outputs() {
        returned[v.0 as usize] = true;
    }
    // From the last node back, so a node's readers have their groups when it is placed.
    let mut group: Vec<Option<usize>> = vec![None; nodes.len()];
    let mut size = vec![0usize; nodes.len()];
    for i in (0..nodes.len()).rev() {
        if steps[i].is_none() {
            continue;
        }
        let out = nodes[i].outputs[0];
        let readers = &consumers[out.0 as usize];
        let joined = match readers.first().and_then(|&c| group[c]) {
            Some(g)
                if !returned[out.0 as usize]
                    && size[g] < MAX_STEPS
                    && readers.iter().all(|&c| group[c] == Some(g))
                    && graph.meta(nodes[g].outputs[0]).shape == graph.meta(out).shape =>
            {
                g
            }
            _ => i,
        };
        group[i] = Some(joined);
        size[joined] += 1;
    }
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, g) in group.iter().enumerate() {
        if let Some(g) = *g {
            members[g].push(i);
        }
    }
    let mut fused = 0;
    let mut out_nodes: Vec<Node> = Vec::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        match group[i] {
            Some(g) if members[g].len() > 1 => {
                if g == i {
                    out_nodes.push(fuse_group(graph, &nodes, &steps, &members[g], &producer)?);
                    fused += members[g].len();
                }
            }
            _ => out_nodes.push(n.clone()),
        }
    }
    if fused == 0 {
        return Ok(0);
    }
    graph.set_nodes(out_nodes);
    graph.validate()?;
    Ok(fused)
}

/// The fused node of one group (`members` in order, the root last).
fn fuse_group(
    graph: &Graph,
    nodes: &[Node],
    steps: &[Option<StepOp>],
    members: &[usize],
    producer: &[Option<usize>],
) -> Result<Node> {
    let mut inputs: Vec<ValueId> = Vec::new();
    let mut program: Vec<Step> = Vec::with_capacity(members.len());
    for &m in members {
        let args = nodes[m]
            .inputs
            .iter()
            .map(|v| {
                let inside =
                    producer[v.0 as usize].and_then(|p| members.iter().position(|&q| q == p));
                match inside {
                    Some(k) => Src::Step(k),
                    None => Src::Input(inputs.iter().position(|u| u == v).unwrap_or_else(|| {
                        inputs.push(*v);
                        inputs.len() - 1
                    })),
                }
            })
            .collect();
        let op = steps[m]
            .clone()
            .ok_or_else(|| tpu_ops::tpu_tensor::Error::internal("fuse", "an unfusable member"))?;
        program.push(Step { op, args });
    }
    let root = &nodes[members[members.len() - 1]];
    let shape = graph.meta(root.outputs[0]).shape.clone();
    let metas: Vec<Meta> = inputs.iter().map(|v| graph.meta(*v).clone()).collect();
    let op = FusedElementwise::new(&shape, &metas, program)?;
    Ok(Node {
        op: Arc::new(op),
        inputs,
        outputs: root.outputs.clone(),
    })
}
