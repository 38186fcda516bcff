//! Backward rules of the index ops, written with the family's own ops so they run on the
//! device the forward ran on. Index tensors get no gradient.

use tpu_tensor::shape::resolve_dim;
use tpu_tensor::{Error, Result, Tensor};

use super::super::MovementOps;
use super::super::args::at_least_1d;
use super::super::grad::zero_pad_dim;
use super::{Gather, IndexAdd, IndexCopy, IndexSelect, Scatter, ScatterReduce};
use crate::TensorOps;
use crate::autograd::Saved;
use crate::op::Grads;

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

/// Input: the gradient, with the overwritten positions zeroed (replace) or as is (add).
/// Src: the gradient read back at the index positions. A value and the index get none.
pub(super) fn scatter(op: &Scatter, saved: &Saved, g: &Tensor) -> Grads {
    let (index, src) = (&saved.inputs[1], &saved.inputs[2]);
    let gx = match op.reduce {
        ScatterReduce::Replace => g.scatter_value(op.dim, index, 0)?,
        ScatterReduce::Add => g.clone(),
    };
    let gs = if op.value {
        None
    } else {
        Some(zero_pad_to(&g.gather(op.dim, index)?, src.shape())?)
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
