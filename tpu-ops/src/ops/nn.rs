//! Neural-network functions (softmax, normalisations, dropout, attention, rotary embeddings, losses).

use crate::op::OpInfo;

/// The rows of the op table for this file's ops.
pub fn table() -> Vec<OpInfo> {
    Vec::new()
}

/// This file's ops as methods on `Tensor`.
pub trait NnOps {}

impl NnOps for tpu_tensor::Tensor {}
