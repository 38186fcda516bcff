//! The native executor: runs a graph's nodes in order with their CPU kernels, without dispatch
//! (no shape rules, hooks or autograd records per op: the graph already holds the shapes), and
//! drops each intermediate value after its last use.

use tpu_ops::tpu_tensor::{Device, Error, Result, Tensor};
use tpu_ops::{Meta, run_kernel};

use crate::ir::{Graph, InputKind};

/// Runs `graph` on `device` with `args` and `captured` as its inputs.
pub fn run(
    graph: &Graph,
    args: &[Tensor],
    captured: &[Tensor],
    device: &Device,
) -> Result<Vec<Tensor>> {
    let last = graph.last_uses();
    let mut env: Vec<Option<Tensor>> = vec![None; graph.num_values()];
    for (v, kind) in graph.inputs() {
        let t = match *kind {
            InputKind::Arg(i) => args.get(i),
            InputKind::Captured(i) => captured.get(i),
            InputKind::Constant(i) => graph.constants().get(i),
        };
        let t = t.ok_or_else(|| {
            Error::invalid_argument("compiled graph", format!("no tensor for input {kind:?}"))
        })?;
        env[v.0 as usize] = Some(t.clone());
    }
    for (i, node) in graph.nodes().iter().enumerate() {
        let name = node.op.name();
        let metas: Vec<Meta> = node
            .outputs
            .iter()
            .map(|v| graph.meta(*v).clone())
            .collect();
        let outs = {
            let ins = node
                .inputs
                .iter()
                .map(|v| {
                    env[v.0 as usize].as_ref().ok_or_else(|| {
                        Error::internal(name, format!("operand {v} is not computed"))
                    })
                })
                .collect::<Result<Vec<&Tensor>>>()?;
            run_kernel(&*node.op, &ins, &metas, device)?
        };
        if outs.len() != node.outputs.len() {
            return Err(Error::internal(
                name,
                format!(
                    "{} outputs, the graph expects {}",
                    outs.len(),
                    node.outputs.len()
                ),
            ));
        }
        for v in &node.inputs {
            if last[v.0 as usize] == Some(i) {
                env[v.0 as usize] = None;
            }
        }
        for (v, t) in node.outputs.iter().zip(outs) {
            if last[v.0 as usize].is_some() {
                env[v.0 as usize] = Some(t);
            }
        }
    }
    graph
        .outputs()
        .iter()
        .map(|v| {
            env[v.0 as usize].clone().ok_or_else(|| {
                Error::internal("compiled graph", format!("output {v} is not computed"))
            })
        })
        .collect()
}
