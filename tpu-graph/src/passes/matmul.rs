//! Transposes folded into products. The op table has one product that reads a matrix operand
//! transposed: `linear(x, w) = x · wᵀ`. So `matmul(x, wᵀ)` (and `mm`) with `wᵀ` a transpose view
//! of a matrix `w` becomes `linear(x, w)`, and `linear(x, wᵀ)` becomes `matmul(x, w)`; the view
//! node goes when nothing else reads it. Both forms run one product kernel over the same
//! operands (the CPU kernels read strided operands in place; StableHLO's `dot_general` takes
//! the contracting dim of either side), so the result bits are the same.
//!
//! Not folded: a transposed *first* operand (`xᵀ · w`): no op of the table reads its first
//! operand transposed. Batched transposes (`bmm` of a transposed batch): no `bmm` form reads
//! an operand transposed either. A `linear` with a bias is left alone as well, since `matmul`
//! has no bias.

use std::sync::Arc;

use tpu_ops::Meta;
use tpu_ops::OpDef;
use tpu_ops::ops::linalg::{Linear, Matmul, ProductKind};
use tpu_ops::tpu_tensor::Result;

use super::{Defs, Rewrite, rewrite};
use crate::ir::{Graph, Node, ValueId};
use crate::view::ViewNode;

/// Rewrites products of transposed matrices; returns how many it rewrote.
pub fn matmul_transposes(graph: &mut Graph) -> Result<usize> {
    rewrite(graph, |g, defs, n| Ok(rewrite_product(g, defs, n)))
}

fn rewrite_product(g: &Graph, defs: &Defs<'_>, n: &Node) -> Rewrite {
    let [x, wt] = n.inputs[..] else {
        return Rewrite::Keep;
    };
    let Some(w) = transposed_matrix(defs, wt) else {
        return Rewrite::Keep;
    };
    let op: Arc<dyn OpDef> = if let Some(m) = n.op.as_any().downcast_ref::<Matmul>() {
        if !matches!(m.kind, ProductKind::Matmul | ProductKind::Mm) {
            return Rewrite::Keep;
        }
        Arc::new(Linear {
            precision: m.precision,
        })
    } else if let Some(l) = n.op.as_any().downcast_ref::<Linear>() {
        Arc::new(Matmul {
            kind: ProductKind::Matmul,
            precision: l.precision,
        })
    } else {
        return Rewrite::Keep;
    };
    // The new product must type the same: its rank rules differ from the old one's.
    let want: Vec<Meta> = n.outputs.iter().map(|v| g.meta(*v).clone()).collect();
    match op.infer(&[g.meta(x).clone(), g.meta(w).clone()]) {
        Ok(got) if got == want => Rewrite::Replace(Node {
            op,
            inputs: vec![x, w],
            outputs: n.outputs.clone(),
        }),
        _ => Rewrite::Keep,
    }
}

/// `w` when `v` is the transpose view of the matrix `w` (all of it, as `w.t()` makes).
fn transposed_matrix(defs: &Defs<'_>, v: ValueId) -> Option<ValueId> {
    let node = defs.node_of(v)?;
    let view = node.op.as_any().downcast_ref::<ViewNode>()?;
    let [w] = node.inputs[..] else { return None };
    let (base, t) = (&view.base, &view.view);
    let [rows, cols] = base.shape[..] else {
        return None;
    };
    // Element (i, j) of the view is element (j, i) of the dense base.
    let ok = t.shape[..] == [cols, rows]
        && t.offset == base.offset
        && (cols <= 1 || t.strides[0] == 1)
        && (rows <= 1 || t.strides[1] == cols);
    ok.then_some(w)
}

#[cfg(test)]
mod tests {
    use tpu_ops::tpu_tensor::{DType, Device, Layout, Tensor};

    use super::*;
    use crate::exec::native;
    use crate::ir::InputKind;
    use crate::passes::dce;

    fn bits(ts: Vec<Tensor>) -> Vec<Vec<u32>> {
        ts.iter()
            .map(|t| tpu_ops::testing::f32_bits(t).unwrap())
            .collect()
    }

    /// A transpose view node of the `[rows, cols]` f32 value `v`.
    fn transposed(g: &mut Graph, v: ValueId, [rows, cols]: [usize; 2]) -> ValueId {
        let view = Layout::strided(&[cols, rows], &[1, cols], 0);
        let t = ViewNode::over(&Layout::contiguous(&[rows, cols]), &view).unwrap();
        g.add_node(Arc::new(t), &[v], &[Meta::new(&[cols, rows], DType::F32)])
            .unwrap()[0]
    }

    #[test]
    fn matmul_of_a_transpose_becomes_linear() {
        let dev = Device::cpu();
        let mut g = Graph::new();
        let x = g.add_input(Meta::new(&[4, 3], DType::F32), InputKind::Arg(0));
        let w = g.add_input(Meta::new(&[5, 3], DType::F32), InputKind::Arg(1));
        let wt = transposed(&mut g, w, [5, 3]);
        let y = g
            .add_node(
                Arc::new(Matmul::new(ProductKind::Matmul)),
                &[x, wt],
                &[Meta::new(&[4, 5], DType::F32)],
            )
            .unwrap()[0];
        g.set_outputs(vec![y]);
        let before = g.clone();
        assert_eq!(matmul_transposes(&mut g).unwrap(), 1);
        dce(&mut g).unwrap();
        assert_eq!(g.nodes().len(), 1);
        assert!(g.to_string().contains("= linear(%0, %1)"), "{g}");
        let mut r = tpu_ops::tpu_tensor::Generator::new(7);
        let args = [
            r.randn([4, 3], DType::F32, &dev).unwrap(),
            r.randn([5, 3], DType::F32, &dev).unwrap(),
        ];
        let want = bits(native::run(&before, &args, &[], &dev, &[]).unwrap());
        let got = bits(native::run(&g, &args, &[], &dev, &[]).unwrap());
        assert_eq!(want, got);
    }

    #[test]
    fn a_transposed_first_operand_is_left_alone() {
        let mut g = Graph::new();
        let x = g.add_input(Meta::new(&[3, 4], DType::F32), InputKind::Arg(0));
        let w = g.add_input(Meta::new(&[3, 5], DType::F32), InputKind::Arg(1));
        let xt = transposed(&mut g, x, [3, 4]);
        let y = g
            .add_node(
                Arc::new(Matmul::new(ProductKind::Matmul)),
                &[xt, w],
                &[Meta::new(&[4, 5], DType::F32)],
            )
            .unwrap()[0];
        g.set_outputs(vec![y]);
        assert_eq!(matmul_transposes(&mut g).unwrap(), 0);
    }
}
