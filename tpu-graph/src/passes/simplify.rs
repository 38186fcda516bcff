//! Algebraic simplification: rewrites that give the same bits with fewer nodes.
//!
//! - Arithmetic identities with a constant operand whose every element is the identity: `x * 1`,
//!   `1 * x`, `x / 1`, `x - 0`, `x + (-0.0)` and `(-0.0) + x`; on integer and bool results
//!   also `x + 0` and `0 + x`. Only where the result has `x`'s shape and dtype, so a dtype
//!   promotion or a broadcast is never dropped. `x + 0.0` on floats is *not* folded: for
//!   `x = -0.0` it gives `+0.0`. The products and quotients by one are exact in IEEE
//!   arithmetic; what they may change is only a signalling NaN's payload (quietened by the
//!   multiply) and subnormals on hardware that flushes them in arithmetic but not in copies.
//! - Views that change nothing (the view is the value itself) are dropped.
//! - A view of a view is one view, when the composition is a strided layout of the first view's
//!   operand: transposes of transposes, reshape chains, expands of expands, slices of slices.
//!   Views of views arise where another rewrite removed the node between two views.
//!
//! A returned `x * 1` whose `x` is an input or a view stays: the caller gets a fresh tensor, as
//! eagerly, not one it could reach another way and write in place.

use tpu_ops::ops::elementwise::binary::{Binary, BinaryKind};
use tpu_ops::tpu_tensor::shape::contiguous_strides;
use tpu_ops::tpu_tensor::with_element;
use tpu_ops::tpu_tensor::{DType, Device, Element, Layout, Result, Tensor};

use super::{Defs, Rewrite, rewrite};
use crate::ir::{Graph, Node, ValueId};
use crate::view::ViewNode;

/// Elements of a constant read to decide an identity; larger constants are left alone.
const READ_LIMIT: usize = 1 << 20;

/// Elements of a view of a view that [`compose`] walks; larger compositions are left alone.
const COMPOSE_LIMIT: usize = 1 << 22;

/// Applies the identities and view rewrites; returns how many nodes it changed.
pub fn simplify(graph: &mut Graph) -> Result<usize> {
    rewrite(graph, |g, defs, n| Ok(simplify_node(g, defs, n)))
}

fn simplify_node(g: &Graph, defs: &Defs<'_>, n: &Node) -> Rewrite {
    if let Some(v) = n.op.as_any().downcast_ref::<ViewNode>() {
        return simplify_view(g, defs, n, v);
    }
    match identity_operand(g, n) {
        Some(x) => Rewrite::Alias(x),
        None => Rewrite::Keep,
    }
}

/// Which element value makes an operand an identity.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ident {
    One,
    /// `-0.0` on floats, `0` on integers.
    NegZero,
    /// `+0.0` on floats, `0` on integers.
    PosZero,
}

/// The operand a binary node returns unchanged, if it is one of the identities.
fn identity_operand(g: &Graph, n: &Node) -> Option<ValueId> {
    let [a, b] = n.inputs[..] else { return None };
    let [out] = n.outputs[..] else { return None };
    let op = n.op.as_any().downcast_ref::<Binary>()?;
    let candidates: &[(ValueId, ValueId, Ident)] = match op.kind {
        BinaryKind::Mul => &[(a, b, Ident::One), (b, a, Ident::One)],
        BinaryKind::Div => &[(a, b, Ident::One)],
        BinaryKind::Add => &[(a, b, Ident::NegZero), (b, a, Ident::NegZero)],
        BinaryKind::Sub => &[(a, b, Ident::PosZero)],
        _ => return None,
    };
    let float = g.meta(out).dtype.is_float();
    candidates.iter().find_map(|&(x, c, want)| {
        if g.meta(x) != g.meta(out) {
            return None;
        }
        let t = g.constant_of(c)?;
        all_elements_are(t, want, float).then_some(x)
    })
}

/// True when every element of `t` is `want` (read as f64, so a bf16 or i64 one counts too).
/// On float results the sign of a zero matters; integers and bools have only one zero.
fn all_elements_are(t: &Tensor, want: Ident, float: bool) -> bool {
    if t.numel() == 0 || t.numel() > READ_LIMIT {
        return false;
    }
    let Some(values) = values_f64(t) else {
        return false;
    };
    values.iter().all(|&x| match want {
        Ident::One => x == 1.0,
        Ident::NegZero => x == 0.0 && (!float || x.is_sign_negative()),
        Ident::PosZero => x == 0.0 && (!float || x.is_sign_positive()),
    })
}

/// The elements of a constant as f64 (exact for every dtype but large i64s, which are not the
/// values looked for).
pub(crate) fn values_f64(t: &Tensor) -> Option<Vec<f64>> {
    tpu_ops::tpu_tensor::host_reads::allow_host_reads(|| {
        let host = t.to_device(&Device::cpu()).ok()?;
        let dtype: DType = host.dtype();
        with_element!(dtype, T, {
            host.to_vec::<T>()
                .ok()
                .map(|v| v.into_iter().map(Element::to_f64).collect())
        })
    })
}

fn simplify_view(g: &Graph, defs: &Defs<'_>, n: &Node, v: &ViewNode) -> Rewrite {
    let [x] = n.inputs[..] else {
        return Rewrite::Keep;
    };
    if same_elements(&v.base, &v.view) && g.meta(x) == g.meta(n.outputs[0]) {
        return Rewrite::Alias(x);
    }
    let Some(inner_node) = defs.node_of(x) else {
        return Rewrite::Keep;
    };
    let Some(inner) = inner_node.op.as_any().downcast_ref::<ViewNode>() else {
        return Rewrite::Keep;
    };
    let [y] = inner_node.inputs[..] else {
        return Rewrite::Keep;
    };
    match compose(inner, v) {
        Some(c) => Rewrite::Replace(Node {
            op: std::sync::Arc::new(c),
            inputs: vec![y],
            outputs: n.outputs.clone(),
        }),
        None => Rewrite::Keep,
    }
}

/// True when `view` picks the elements of the dense `base` in their order, all of them.
fn same_elements(base: &Layout, view: &Layout) -> bool {
    if view.shape != base.shape {
        return false;
    }
    if view.shape.contains(&0) {
        return true;
    }
    view.offset == base.offset
        && view
            .shape
            .iter()
            .zip(view.strides.iter().zip(base.strides.iter()))
            .all(|(&n, (s, t))| n == 1 || s == t)
}

/// `outer` (a view of `inner`'s result) as one view of `inner`'s operand, when the positions it
/// reads there form a strided layout. Walks every element: exact, and bounded by
/// [`COMPOSE_LIMIT`].
pub(crate) fn compose(inner: &ViewNode, outer: &ViewNode) -> Option<ViewNode> {
    if outer.base.shape != inner.view.shape {
        return None;
    }
    let shape = &outer.view.shape;
    let numel: usize = shape.iter().product();
    if numel == 0 || numel > COMPOSE_LIMIT {
        return None;
    }
    let mid = &inner.view.shape;
    let mid_dense = contiguous_strides(mid);
    // Position in the inner operand's elements of the outer view's element at row-major `r` of
    // the inner view.
    let inner_pos = |r: usize| -> Option<usize> {
        let mut q = inner.view.offset.checked_sub(inner.base.offset)?;
        for ((&len, &dense), &stride) in mid.iter().zip(&mid_dense).zip(inner.view.strides.iter()) {
            let j = (r / dense) % len.max(1);
            q += j * stride;
        }
        Some(q)
    };
    let outer_rel = outer.view.offset.checked_sub(outer.base.offset)?;
    let pos = |idx: &[usize]| -> Option<usize> {
        let r = outer_rel
            + idx
                .iter()
                .zip(outer.view.strides.iter())
                .map(|(i, s)| i * s)
                .sum::<usize>();
        inner_pos(r)
    };
    let rank = shape.len();
    let origin = pos(&vec![0; rank])?;
    let mut strides = contiguous_strides(shape);
    let mut unit = vec![0; rank];
    for d in 0..rank {
        if shape[d] > 1 {
            unit[d] = 1;
            strides[d] = pos(&unit)?.checked_sub(origin)?;
            unit[d] = 0;
        }
    }
    // Check every element against the affine guess.
    let mut idx = vec![0usize; rank];
    for _ in 0..numel {
        let guess = origin + idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>();
        if pos(&idx)? != guess {
            return None;
        }
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    let view = Layout::strided(shape, &strides, inner.base.offset + origin);
    ViewNode::over(&inner.base, &view)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tpu_ops::Meta;

    use super::*;
    use crate::exec::native;
    use crate::ir::InputKind;
    use crate::passes::dce;

    fn binary(kind: BinaryKind, numbers: [bool; 2]) -> Arc<dyn tpu_ops::OpDef> {
        Arc::new(Binary { kind, numbers })
    }

    fn run(g: &Graph, args: &[Tensor]) -> Vec<Vec<u32>> {
        native::run(g, args, &[], &Device::cpu(), &[])
            .unwrap()
            .iter()
            .map(|t| tpu_ops::testing::f32_bits(t).unwrap())
            .collect()
    }

    fn transpose(shape: [usize; 2]) -> ViewNode {
        let base = Layout::contiguous(&shape);
        let view = Layout::strided(&[shape[1], shape[0]], &[1, shape[1]], 0);
        ViewNode::over(&base, &view).unwrap()
    }

    #[test]
    fn times_one_and_minus_zero_go_plus_zero_stays() {
        let dev = Device::cpu();
        let mut g = Graph::new();
        let x = g.add_input(Meta::new(&[2, 3], DType::F32), InputKind::Arg(0));
        let one = g.add_constant(Tensor::scalar(1.0f64, &dev).unwrap());
        let zero = g.add_constant(Tensor::scalar(0.0f64, &dev).unwrap());
        let f32s = [Meta::new(&[2, 3], DType::F32)];
        let a = g
            .add_node(binary(BinaryKind::Mul, [false, true]), &[x, one], &f32s)
            .unwrap()[0];
        let b = g
            .add_node(binary(BinaryKind::Sub, [false, true]), &[a, zero], &f32s)
            .unwrap()[0];
        let c = g
            .add_node(binary(BinaryKind::Add, [false, true]), &[b, zero], &f32s)
            .unwrap()[0];
        g.set_outputs(vec![c]);
        let before = g.clone();
        assert_eq!(simplify(&mut g).unwrap(), 2);
        dce(&mut g).unwrap();
        assert_eq!((before.nodes().len(), g.nodes().len()), (3, 1));
        let text = g.to_string();
        assert!(text.contains("= add(%0, %2)"), "{text}");
        assert!(text.contains("constant 0 tensor(1."), "{text}");
        let arg = Tensor::new([[-0.0f32, 1.5, -2.0], [0.0, 3.0, 1e-3]], &dev).unwrap();
        assert_eq!(run(&before, std::slice::from_ref(&arg)), run(&g, &[arg]));
    }

    #[test]
    fn a_returned_identity_of_an_argument_stays() {
        let dev = Device::cpu();
        let mut g = Graph::new();
        let x = g.add_input(Meta::new(&[2], DType::F32), InputKind::Arg(0));
        let one = g.add_constant(Tensor::scalar(1.0f64, &dev).unwrap());
        let m = [Meta::new(&[2], DType::F32)];
        let a = g
            .add_node(binary(BinaryKind::Mul, [false, true]), &[x, one], &m)
            .unwrap()[0];
        let b = g
            .add_node(binary(BinaryKind::Mul, [false, true]), &[a, one], &m)
            .unwrap()[0];
        g.set_outputs(vec![a, b]);
        // `b` may become `a` (a fresh result); `a` may not become the argument.
        assert_eq!(simplify(&mut g).unwrap(), 1);
        assert_eq!(g.outputs(), &[a, a]);
    }

    #[test]
    fn a_promotion_or_a_broadcast_is_kept() {
        let dev = Device::cpu();
        let mut g = Graph::new();
        let x = g.add_input(Meta::new(&[3], DType::F32), InputKind::Arg(0));
        let ones = g.add_constant(Tensor::new([[1.0f32, 1.0, 1.0]; 2], &dev).unwrap());
        let one64 = g.add_constant(Tensor::new([1.0f64], &dev).unwrap());
        let a = g
            .add_node(
                binary(BinaryKind::Mul, [false, false]),
                &[x, ones],
                &[Meta::new(&[2, 3], DType::F32)],
            )
            .unwrap()[0];
        let b = g
            .add_node(
                binary(BinaryKind::Mul, [false, false]),
                &[x, one64],
                &[Meta::new(&[3], DType::F64)],
            )
            .unwrap()[0];
        g.set_outputs(vec![a, b]);
        assert_eq!(simplify(&mut g).unwrap(), 0);
    }

    #[test]
    fn a_transpose_of_a_transpose_is_the_value() {
        let mut g = Graph::new();
        let x = g.add_input(Meta::new(&[2, 3], DType::F32), InputKind::Arg(0));
        let t = g
            .add_node(
                Arc::new(transpose([2, 3])),
                &[x],
                &[Meta::new(&[3, 2], DType::F32)],
            )
            .unwrap()[0];
        let tt = g
            .add_node(
                Arc::new(transpose([3, 2])),
                &[t],
                &[Meta::new(&[2, 3], DType::F32)],
            )
            .unwrap()[0];
        let y = g
            .add_node(
                binary(BinaryKind::Add, [false, false]),
                &[tt, x],
                &[Meta::new(&[2, 3], DType::F32)],
            )
            .unwrap()[0];
        g.set_outputs(vec![y]);
        let before = g.clone();
        // First the two views become one identity view, then that one goes.
        assert!(simplify(&mut g).unwrap() >= 1);
        simplify(&mut g).unwrap();
        dce(&mut g).unwrap();
        assert_eq!(g.nodes().len(), 1, "{g}");
        assert!(g.to_string().contains("= add(%0, %0)"), "{g}");
        let arg = Tensor::new([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::cpu()).unwrap();
        assert_eq!(run(&before, std::slice::from_ref(&arg)), run(&g, &[arg]));
    }

    #[test]
    fn reshape_and_expand_chains_compose() {
        let dev = Device::cpu();
        let x = Tensor::new([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &dev).unwrap();
        // x [2, 3] → reshape [3, 2] → transpose [2, 3]: one view, not the identity.
        let r = x.reshape([3, 2]).unwrap();
        let rt = r.t().unwrap();
        let first = ViewNode::over(x.layout(), r.layout()).unwrap();
        let second = transpose([3, 2]);
        let c = compose(&first, &second).unwrap();
        assert_eq!(&c.view.shape[..], rt.shape());
        assert_eq!(&c.view.strides[..], rt.strides());
        // A row [3] → expand [4, 3] → unsqueeze-and-expand [2, 4, 3]: strides (0, 0, 1).
        let row = Tensor::new([1.0f32, 2.0, 3.0], &dev).unwrap();
        let e1 = row.expand([4, 3]).unwrap();
        let first = ViewNode::over(row.layout(), e1.layout()).unwrap();
        let second = ViewNode {
            base: Layout::contiguous(&[4, 3]),
            view: Layout::strided(&[2, 4, 3], &[0, 3, 1], 0),
        };
        let c = compose(&first, &second).unwrap();
        assert_eq!(&c.view.strides[..], &[0, 0, 1]);
        // A flatten of a transpose is no strided layout.
        let flat = ViewNode {
            base: Layout::contiguous(&[3, 2]),
            view: Layout::contiguous(&[6]),
        };
        assert!(compose(&transpose([2, 3]), &flat).is_none());
    }
}
