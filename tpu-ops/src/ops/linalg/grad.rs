//! The backward rules of `matmul` (and `mm`, `bmm`, `dot`) and `linear`: products of the
//! output's gradient with the other operand, so gradients run where the forward ran.

use tpu_tensor::Tensor;

use super::shape::plan;
use super::{Linear, Matmul, ProductKind};
use crate::autograd::Saved;
use crate::op::Grads;

/// With `a` and `b` seen as (batched) matrices, `da = g · bᵀ` and `db = aᵀ · g`. A vector
/// operand is a one-row (`a`) or one-column (`b`) matrix whose extra dim is dropped again;
/// gradients keep the broadcast batch dims, which autograd sums down to each operand.
pub(super) fn matmul(op: &Matmul, saved: &Saved, g: &Tensor) -> Grads {
    let (a, b) = (&saved.inputs[0], &saved.inputs[1]);
    let p = plan(op.kind, a.shape(), b.shape())?;
    let am = if p.a_vec { a.unsqueeze(0)? } else { a.clone() };
    let bm = if p.b_vec { b.unsqueeze(1)? } else { b.clone() };
    let mut gshape = p.batch.clone();
    gshape.extend([p.m, p.n]);
    let gm = g.reshape(&gshape)?;
    // The general product accepts every rank combination the gradients need.
    let prod = Matmul {
        kind: ProductKind::Matmul,
        precision: op.precision,
    };
    let ga = crate::exec::dispatch::run1(&prod, &[&gm, &bm.transpose(-2, -1)?])?;
    let ga = if p.a_vec { ga.squeeze_dim(-2)? } else { ga };
    let gb = crate::exec::dispatch::run1(&prod, &[&am.transpose(-2, -1)?, &gm])?;
    let gb = if p.b_vec { gb.squeeze_dim(-1)? } else { gb };
    Ok(vec![Some(ga), Some(gb)])
}

/// `dx = g · weight`, `dweight = gᵀ · x` over all rows of the batch, and `dbias = g`
/// (autograd sums it down to the bias's shape).
pub(super) fn linear(op: &Linear, saved: &Saved, g: &Tensor) -> Grads {
    let n_in = saved.inputs.len();
    let (x, w) = (&saved.inputs[0], &saved.inputs[1]);
    let (out_f, in_f) = (w.shape()[0], w.shape()[1]);
    let prod = Matmul {
        kind: ProductKind::Matmul,
        precision: op.precision,
    };
    let gx = crate::exec::dispatch::run1(&prod, &[g, w])?;
    let rows: usize = x.shape()[..x.rank() - 1].iter().product();
    let g2 = g.reshape([rows, out_f])?;
    let x2 = x.reshape([rows, in_f])?;
    let gw = crate::exec::dispatch::run1(&prod, &[&g2.t()?, &x2])?;
    let mut res = vec![Some(gx), Some(gw)];
    if n_in == 3 {
        res.push(Some(g.clone()));
    }
    Ok(res)
}
