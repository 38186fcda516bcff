//! Constant folding: a node whose operands are all constants runs once, when the graph is
//! optimised, and its outputs become constants.
//!
//! The node runs through the op's own kernel on the device its constants live on (the native
//! CPU for a CPU graph), so the folded bits are the ones the program would have computed there;
//! folding on the host for a PJRT graph could differ (TPUs multiply f32 in bf16 passes by
//! default). Ops are pure (random masks are drawn on the host and enter as tensors), so
//! running one early changes nothing but when it runs.
//!
//! On a PJRT device only ops whose every result is exactly determined are folded (IEEE's
//! correctly rounded add, sub, mul, max, min, comparisons, logical and bitwise ops, and views):
//! the op run alone is a program of its own, and XLA may compute a transcendental function or
//! a product differently inside a fused program than alone (tanh was seen one unit in the last
//! place apart), so folding those would change the program's bits.
//!
//! Not folded: outputs above [`FOLD_LIMIT_BYTES`] (a constant is kept for the program's whole
//! life, while the node's output would only live until its last use: an expand of a scalar to
//! a large shape stays an expand); nodes whose kernel fails (an integer division by zero, an
//! index out of range), which keep failing when the program runs, where the error belongs;
//! nodes whose output the graph returns (the caller gets a fresh tensor on every call, as
//! eagerly, not one shared constant it could write in place).

use tpu_ops::ops::elementwise::binary::{Binary, BinaryKind};
use tpu_ops::tpu_tensor::{Result, Tensor};
use tpu_ops::{Meta, OpDef, run_kernel};

use super::{Rewrite, rewrite};
use crate::ir::{Graph, InputKind};
use crate::view::ViewNode;

/// The most bytes of outputs a folded node may make.
pub const FOLD_LIMIT_BYTES: usize = 1 << 20;

/// Folds the nodes over constants only; returns how many it folded.
pub fn fold_constants(graph: &mut Graph) -> Result<usize> {
    rewrite(graph, |g, _, n| {
        // A returned value stays computed: as a constant, every call would return the same
        // tensor, which a caller could write in place.
        if n.inputs.is_empty() || n.outputs.len() != 1 || g.outputs().contains(&n.outputs[0]) {
            return Ok(Rewrite::Keep);
        }
        let Some(ins) = n
            .inputs
            .iter()
            .map(|v| g.constant_of(*v).cloned())
            .collect::<Option<Vec<Tensor>>>()
        else {
            return Ok(Rewrite::Keep);
        };
        let device = ins[0].device().clone();
        if ins.iter().any(|t| t.device() != &device) || !(device.is_cpu() || exact(&*n.op)) {
            return Ok(Rewrite::Keep);
        }
        let metas: Vec<Meta> = n.outputs.iter().map(|v| g.meta(*v).clone()).collect();
        let bytes: usize = metas
            .iter()
            .map(|m| m.numel().saturating_mul(m.dtype.size_in_bytes()))
            .sum();
        if bytes > FOLD_LIMIT_BYTES {
            return Ok(Rewrite::Keep);
        }
        let refs: Vec<&Tensor> = ins.iter().collect();
        let out = tpu_ops::tpu_tensor::host_reads::allow_host_reads(|| {
            run_kernel(&*n.op, &refs, &metas, &device)
        });
        let Ok(mut out) = out else {
            return Ok(Rewrite::Keep);
        };
        let (Some(t), true) = (out.pop(), out.is_empty()) else {
            return Ok(Rewrite::Keep);
        };
        if Meta::new(t.shape(), t.dtype()) != metas[0] {
            return Ok(Rewrite::Keep);
        }
        Ok(Rewrite::Alias(g.add_constant(t)))
    })
}

/// True for ops whose results are the same bits however a compiler arranges them.
fn exact(op: &dyn OpDef) -> bool {
    use BinaryKind::*;
    if op.as_any().is::<ViewNode>() {
        return true;
    }
    op.as_any().downcast_ref::<Binary>().is_some_and(|b| {
        matches!(
            b.kind,
            Add | Sub
                | Mul
                | Maximum
                | Minimum
                | Eq
                | Ne
                | Lt
                | Le
                | Gt
                | Ge
                | LogicalAnd
                | LogicalOr
                | LogicalXor
                | BitwiseAnd
                | BitwiseOr
                | BitwiseXor
        )
    })
}

/// Makes constants of the captured inputs whose tensors nothing outside `captured` holds any
/// more (the numbers and tensors the traced function made itself), so the passes may read and
/// fold them; returns how many it made. Call it after the trace's other tensors (its eager
/// outputs) are dropped: a tensor still shared with a caller could be written in place between
/// calls, and stays captured.
pub fn promote_constants(graph: &mut Graph, captured: &[Tensor]) -> Result<usize> {
    let candidates: Vec<_> = graph
        .inputs()
        .iter()
        .filter_map(|(v, kind)| match kind {
            InputKind::Captured(i) => Some((*v, *i)),
            _ => None,
        })
        .collect();
    let mut made = 0;
    for (v, i) in candidates {
        let Some(t) = captured.get(i) else { continue };
        if t.is_sole_handle() && t.autograd_meta().is_none() {
            graph.make_constant(v, t.clone())?;
            made += 1;
        }
    }
    Ok(made)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tpu_ops::prelude::*;
    use tpu_ops::tpu_tensor::{DType, Device};

    use super::*;
    use crate::capture::trace;
    use crate::exec::native;
    use crate::passes::{dce, optimize_counted};

    #[test]
    fn a_subgraph_over_constants_becomes_one_constant() {
        let dev = Device::cpu();
        let mut g = Graph::new();
        let x = g.add_input(Meta::new(&[3], DType::F32), InputKind::Arg(0));
        let a = g.add_constant(Tensor::new([1.0f32, 2.0, 3.0], &dev).unwrap());
        let two = g.add_constant(Tensor::scalar(2.0f64, &dev).unwrap());
        let m = [Meta::new(&[3], DType::F32)];
        let mul = |n| -> Arc<dyn tpu_ops::OpDef> {
            Arc::new(Binary {
                kind: BinaryKind::Mul,
                numbers: n,
            })
        };
        let b = g.add_node(mul([false, true]), &[a, two], &m).unwrap()[0];
        let c = g.add_node(mul([false, false]), &[b, b], &m).unwrap()[0];
        let y = g.add_node(mul([false, false]), &[x, c], &m).unwrap()[0];
        g.set_outputs(vec![y]);
        let before = g.clone();
        assert_eq!(fold_constants(&mut g).unwrap(), 2);
        dce(&mut g).unwrap();
        assert_eq!(g.drop_unused_constants(), 3);
        assert_eq!(g.nodes().len(), 1);
        let text = g.to_string();
        assert!(
            text.contains("constant 0 tensor([ 4., 16., 36.])"),
            "{text}"
        );
        let arg = [Tensor::new([1.0f32, -1.0, 0.5], &dev).unwrap()];
        let want = native::run(&before, &arg, &[], &dev, &[]).unwrap();
        let got = native::run(&g, &arg, &[], &dev, &[]).unwrap();
        assert_eq!(
            want[0].to_vec::<f32>().unwrap(),
            got[0].to_vec::<f32>().unwrap()
        );
        assert_ne!(before.fingerprint(), g.fingerprint());
    }

    #[test]
    fn large_outputs_and_failing_kernels_stay() {
        let dev = Device::cpu();
        let mut g = Graph::new();
        let big = g.add_constant(Tensor::zeros([1 << 19], DType::F32, &dev).unwrap());
        let m = [Meta::new(&[1 << 19], DType::F32)];
        let add: Arc<dyn tpu_ops::OpDef> = Arc::new(Binary {
            kind: BinaryKind::Add,
            numbers: [false, false],
        });
        let y = g.add_node(add, &[big, big], &m).unwrap()[0];
        let i = g.add_constant(Tensor::new([1i64, 2], &dev).unwrap());
        let z = g.add_constant(Tensor::new([0i64, 1], &dev).unwrap());
        let div: Arc<dyn tpu_ops::OpDef> = Arc::new(Binary {
            kind: BinaryKind::DivFloor,
            numbers: [false, false],
        });
        let q = g
            .add_node(div, &[i, z], &[Meta::new(&[2], DType::I64)])
            .unwrap()[0];
        g.set_outputs(vec![y, q]);
        assert_eq!(fold_constants(&mut g).unwrap(), 0);
    }

    #[test]
    fn numbers_made_while_tracing_become_constants_and_fold() {
        let dev = Device::cpu();
        let w = Tensor::new([0.5f32, 0.25, 2.0], &dev).unwrap();
        let w2 = w.clone();
        let f = move |a: &[Tensor]| -> Result<Vec<Tensor>> {
            let k = Tensor::new([1.0f32, 2.0, 3.0], a[0].device())?;
            let k = k.mul(2.0)?.add(1.0)?;
            Ok(vec![a[0].mul(&k)?.mul(&w2)?.mul(1.0)?])
        };
        let args = [Tensor::new([1.0f32, 2.0, 3.0], &dev).unwrap()];
        let t = trace(&f, &args).unwrap();
        let (mut g, captured) = (t.graph, t.captured);
        drop(t.outputs);
        let made = promote_constants(&mut g, &captured).unwrap();
        // The tensor `k`, 2.0, 1.0 and 1.0; `w` is shared with the caller and stays captured.
        assert_eq!(made, 4, "{g}");
        let before = g.clone();
        let (report, counts) = optimize_counted(&mut g).unwrap();
        assert_eq!((counts.folded, counts.simplify), (2, 1), "{g}");
        assert_eq!(report.nodes_after, 2, "{g}");
        assert_eq!(g.constants().len(), 1, "{g}");
        let want = native::run(&before, &args, &captured, &dev, &[]).unwrap();
        let got = native::run(&g, &args, &captured, &dev, &[]).unwrap();
        assert_eq!(
            want[0].to_vec::<f32>().unwrap(),
            got[0].to_vec::<f32>().unwrap()
        );
    }
}
