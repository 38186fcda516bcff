//! Argument checks the nn ops share beyond `crate::op::args`: arity, dtype equality, the
//! shape and dtype of parameter tensors, and the walk over optional operands.

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Error, Result};

use crate::op::Meta;

pub(super) fn check_dtype(op: &str, what: &str, m: &Meta, want: DType) -> Result<()> {
    if m.dtype == want {
        Ok(())
    } else {
        Err(Error::DTypeMismatch {
            context: format!("{op}: {what}"),
            expected: want,
            given: m.dtype,
        })
    }
}

pub(super) fn check_arity(op: &str, inputs: &[Meta], n: usize) -> Result<()> {
    if inputs.len() == n {
        Ok(())
    } else {
        Err(Error::invalid_argument(
            op,
            format!("expected {n} input tensors, got {}", inputs.len()),
        ))
    }
}

/// The next optional operand: `items[*idx]` when `present`, advancing `idx`.
pub(super) fn take<'a, T>(items: &'a [T], present: bool, idx: &mut usize) -> Option<&'a T> {
    if !present {
        return None;
    }
    let t = items.get(*idx);
    *idx += 1;
    t
}

/// Checks that a parameter tensor (weight, bias, running stat) has `shape` and `dtype`.
pub(super) fn check_param(
    op: &str,
    what: &str,
    m: &Meta,
    shape: &[usize],
    dtype: DType,
) -> Result<()> {
    if m.shape[..] != *shape {
        return Err(Error::shape(
            op,
            format!(
                "expected {what} of shape {}, got {}",
                fmt_shape(shape),
                fmt_shape(&m.shape)
            ),
        ));
    }
    check_dtype(op, what, m, dtype)
}
