//! Data movement that materialises (cat, stack, pad, gather, scatter, index ops, masks, tril/triu, repeat, flip, roll, topk, sort).

use crate::op::OpInfo;

/// The rows of the op table for this file's ops.
pub fn table() -> Vec<OpInfo> {
    Vec::new()
}

/// This file's ops as methods on `Tensor`.
pub trait MovementOps {}

impl MovementOps for tpu_tensor::Tensor {}
