//! Argument checks and shape helpers that several movement sub-families share, so each
//! sub-family's shape rule words its errors the same way.

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Dims, Error, Result, Scalar};

use crate::op::Meta;

pub(super) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A 0-dim shape seen as `[1]`: PyTorch's index ops treat scalars as 1-element vectors.
pub(super) fn at_least_1d(shape: &[usize]) -> Dims {
    if shape.is_empty() {
        Dims::from_elem(1, 1)
    } else {
        shape.into()
    }
}

pub(super) fn need_index(op: &str, what: &str, m: &Meta) -> Result<()> {
    if m.dtype == DType::I64 {
        return Ok(());
    }
    Err(Error::DTypeMismatch {
        context: format!("{op}: {what} of shape {}", fmt_shape(&m.shape)),
        expected: DType::I64,
        given: m.dtype,
    })
}

pub(super) fn need_same_dtype(op: &str, what: &str, x: &Meta, other: &Meta) -> Result<()> {
    if x.dtype == other.dtype {
        return Ok(());
    }
    Err(Error::DTypeMismatch {
        context: format!(
            "{op}: {what} of shape {} must have the dtype of the input",
            fmt_shape(&other.shape)
        ),
        expected: x.dtype,
        given: other.dtype,
    })
}

/// A fill value must fit the dtype, as PyTorch checks (`-1.5` cannot fill a u8 tensor).
pub(super) fn check_fill(op: &str, value: Scalar, dtype: DType) -> Result<()> {
    // PyTorch's pad refuses negative u8 values that fill values elsewhere wrap (-1 -> 255).
    value.check_fits(op, dtype, op == "pad")
}
