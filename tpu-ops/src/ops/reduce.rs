//! Reductions (sum, mean, prod, max/min with indices, argmax/argmin, var/std, logsumexp, norm, all/any, cumsum/cumprod).

use crate::op::OpInfo;

/// The rows of the op table for this file's ops.
pub fn table() -> Vec<OpInfo> {
    Vec::new()
}

/// This file's ops as methods on `Tensor`.
pub trait ReduceOps {}

impl ReduceOps for tpu_tensor::Tensor {}
