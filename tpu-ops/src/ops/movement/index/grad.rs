//! Backward rules of the index ops, written with the family's own ops so they run on the
//! device the forward ran on. Index tensors get no gradient.

use tpu_tensor::shape::resolve_dim;
use tpu_tensor::{Error, Result, Tensor};

use super::super::args::at_least_1d;
use super::super::grad::zero_pad_dim;
use super::super::{MovementOps, ScatterReduction};
use super::{Gather, IndexAdd, IndexCopy, IndexSelect, Scatter, ScatterReduce};
use crate::TensorOps;
use crate::autograd::Saved;
use crate::op::Grads;
use crate::ops::elementwise::binary::where_;

/// `t` (shaped like an index) padded with zeros at the end of every dim to `shape` (a scatter's
/// `src`, which may be larger than the index): `src` elements no index reads get no gradient.
fn zero_pad_to(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if t.shape() == shape {
        return Ok(t.clone());
    }
    // Index ops treat 0-dim tensors as 1-element vectors, so the ranks agree after this.
    let mut v = t.reshape(&at_least_1d(t.shape())[..])?;
    let want = at_least_1d(shape);
    if v.rank() != want.len() {
        return Err(Error::internal(
            "scatter backward",
            "index and src ranks differ",
        ));
    }
    for (d, &n) in want.iter().enumerate() {
        let have = v.shape()[d];
        v = zero_pad_dim(&v, d, 0, n.saturating_sub(have))?;
    }
    v.reshape(shape)
}

/// The gradient added at the positions the index read (duplicates accumulate).
pub(super) fn gather(op: &Gather, saved: &Saved, g: &Tensor) -> Grads {
    let (x, index) = (&saved.inputs[0], &saved.inputs[1]);
    let z = Tensor::zeros(x.shape(), g.dtype(), g.device())?;
    Ok(vec![Some(z.scatter_add(op.dim, index, g)?), None])
}

/// `src`'s part that the index reads (its leading corner of the index's shape).
fn read_part(src: &Tensor, index: &Tensor) -> Result<Tensor> {
    if src.shape() == index.shape() {
        return Ok(src.clone());
    }
    let mut v = src.reshape(&at_least_1d(src.shape())[..])?;
    for (d, &n) in at_least_1d(index.shape()).iter().enumerate() {
        v = v.narrow(d, 0, n)?;
    }
    v.reshape(index.shape())
}

/// PyTorch's rules (`scatter_reduce_backward`), on the part of `src` the index reads:
/// replace zeroes the overwritten positions of the input's gradient and reads the gradient
/// back for `src`; add passes it through; prod divides the product by each factor, with zeros
/// masked so a single zero gets the product of the others; amax and amin share the gradient
/// evenly among the values equal to the result (PyTorch also counts an input left out by
/// `include_self=false` when it happens to equal the result; it is not counted here, so the
/// shares always add up to the gradient). Without `include_self`, the input gets no gradient
/// where an index points. A value and the index get none.
pub(super) fn scatter(op: &Scatter, saved: &Saved, g: &Tensor) -> Grads {
    let (x, index, src_full) = (&saved.inputs[0], &saved.inputs[1], &saved.inputs[2]);
    let d = op.dim;
    // Replace and add need not read `src`, which is a 0-dim value for `scatter(value)`.
    let (gx, gs) = match op.reduce {
        ScatterReduce::Replace => (g.scatter_value(d, index, 0)?, g.gather(d, index)?),
        ScatterReduce::Add => (g.clone(), g.gather(d, index)?),
        ScatterReduce::Prod => {
            let src = read_part(src_full, index)?;
            let prod = |x: &Tensor, src: &Tensor| {
                x.scatter_reduce(d, index, src, ScatterReduction::Prod, op.include_self)
            };
            let result = saved.output(0)?;
            let x_masked = x.masked_fill(&x.eq(0)?, 1)?;
            let gx = g.mul(&prod(&x_masked, &src)?)?.div(&x_masked)?;
            let src_zero = src.eq(0)?;
            let zeros = Tensor::zeros(x.shape(), x.dtype(), x.device())?;
            let zeros_met = zeros
                .scatter_add(d, index, &src_zero.to_dtype(x.dtype())?)?
                .gather(d, index)?;
            let single_zero = src_zero.logical_and(&zeros_met.eq(1)?)?;
            let others = prod(x, &src.masked_fill(&single_zero, 1)?)?;
            let gs = where_(
                &single_zero,
                &g.mul(&others)?.gather(d, index)?,
                &g.mul(result)?
                    .gather(d, index)?
                    .div(&src.masked_fill(&src_zero, 1)?)?,
            )?;
            (gx, gs)
        }
        ScatterReduce::Amax | ScatterReduce::Amin => {
            let src = read_part(src_full, index)?;
            let result = saved.output(0)?;
            let mut x_wins = x.eq(result)?.to_dtype(x.dtype())?;
            if !op.include_self {
                // An input left out is no tie, even where it equals the result.
                x_wins = x_wins.scatter_value(d, index, 0)?;
            }
            let src_wins = src.eq(&result.gather(d, index)?)?.to_dtype(x.dtype())?;
            let winners = x_wins.scatter_add(d, index, &src_wins)?;
            // A NaN result equals nothing: no winner, and no gradient rather than NaN.
            let winners = winners.masked_fill(&winners.eq(0)?, 1)?;
            let share = g.div(&winners)?;
            (x_wins.mul(&share)?, src_wins.mul(&share.gather(d, index)?)?)
        }
    };
    let gx = if op.include_self || op.reduce == ScatterReduce::Replace {
        gx
    } else {
        gx.scatter_value(d, index, 0)?
    };
    let gs = if op.value {
        None
    } else {
        Some(zero_pad_to(&gs, src_full.shape())?)
    };
    Ok(vec![Some(gx), None, gs])
}

/// The gradient's slices added into zeros at the indexed positions (duplicates
/// accumulate); embedding flattens its index first. The index gets none.
pub(super) fn index_select(op: &IndexSelect, saved: &Saved, g: &Tensor) -> Grads {
    let (x, index) = (&saved.inputs[0], &saved.inputs[1]);
    let d = resolve_dim(op.op_name(), op.dim, x.shape())?;
    let (index, g) = if op.embedding {
        let n = index.numel();
        (
            index.reshape([n])?,
            g.reshape(&op.flat_shape(x.shape(), d, n)[..])?,
        )
    } else {
        (index.clone(), g.clone())
    };
    let z = Tensor::zeros(x.shape(), g.dtype(), g.device())?;
    Ok(vec![Some(z.index_add(d, &index, &g, 1)?), None])
}

/// Input: the gradient. Source: alpha times the gradient's slices at the index.
pub(super) fn index_add(op: &IndexAdd, saved: &Saved, g: &Tensor) -> Grads {
    let index = &saved.inputs[1];
    let mut gs = g.index_select(op.dim, index)?;
    let alpha = op.alpha.to_f64();
    if alpha != 1.0 {
        gs = gs.mul(alpha)?;
    }
    Ok(vec![Some(g.clone()), None, Some(gs)])
}

/// Input: the gradient with the overwritten slices zeroed. Source: the gradient's slices at
/// the index.
pub(super) fn index_copy(op: &IndexCopy, saved: &Saved, g: &Tensor) -> Grads {
    let (index, src) = (&saved.inputs[1], &saved.inputs[2]);
    let zeros = Tensor::zeros(src.shape(), g.dtype(), g.device())?;
    Ok(vec![
        Some(g.index_copy(op.dim, index, &zeros)?),
        None,
        Some(g.index_select(op.dim, index)?),
    ])
}
