//! Helpers the nn backward rules share. The rules are written with ops, so they run on the
//! device the forward ran on; they compute in the compute dtype (f32 for the 16-bit floats,
//! as the forward kernels do) and autograd casts each gradient back to its input's dtype.

use tpu_tensor::{Result, Tensor};

use crate::TensorOps;
use crate::op::promote::compute_dtype;
use crate::ops::reduce::ReduceOps;

pub(super) use crate::op::Grads;

/// `t` in the dtype backward rules compute in.
pub(super) fn up(t: &Tensor) -> Result<Tensor> {
    t.to(compute_dtype(t.dtype()))
}

/// `dims` as the i64 dims reductions take.
pub(super) fn dims_i64(dims: impl IntoIterator<Item = usize>) -> Vec<i64> {
    dims.into_iter().map(|d| d as i64).collect()
}

/// Sums `t` over `dims`; no dims leaves it as it is (an empty list would mean "all dims" to
/// a reduction).
pub(super) fn sum_over(t: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    if dims.is_empty() {
        Ok(t.clone())
    } else {
        t.sum(dims, keepdim)
    }
}

/// The mean over `dims`, keeping them (see [`sum_over`]).
pub(super) fn mean_over(t: &Tensor, dims: &[i64]) -> Result<Tensor> {
    if dims.is_empty() {
        Ok(t.clone())
    } else {
        t.mean(dims, true)
    }
}

/// The incoming gradient of output 0, or `None` when it is zero.
pub(super) fn first(grads: &[Option<Tensor>]) -> Option<&Tensor> {
    grads.first().and_then(Option::as_ref)
}
