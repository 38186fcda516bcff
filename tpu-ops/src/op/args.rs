//! Argument checks that many ops share, with one wording for their errors.

use tpu_tensor::shape::broadcast_shapes;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Error, Result};

use super::{DTypeSet, Meta};

/// The error of an op given a dtype outside `supported`.
pub fn unsupported(op: &str, dtype: DType, supported: DTypeSet) -> Error {
    Error::UnsupportedDType {
        op: op.into(),
        given: dtype.to_string(),
        supported: supported.to_string(),
    }
}

/// Refuses a dtype outside `supported`.
pub fn check_dtype_in(op: &str, m: &Meta, supported: DTypeSet) -> Result<()> {
    if supported.contains(m.dtype) {
        Ok(())
    } else {
        Err(unsupported(op, m.dtype, supported))
    }
}

/// Refuses a dtype that is not a float.
pub fn check_float(op: &str, m: &Meta) -> Result<()> {
    check_dtype_in(op, m, DTypeSet::FLOAT)
}

/// Refuses an argument `what` that does not broadcast to the input's `shape` (or would grow it).
pub fn check_broadcasts_to(op: &str, what: &str, m: &Meta, shape: &[usize]) -> Result<()> {
    let s = broadcast_shapes(op, shape, &m.shape)?;
    if s[..] != shape[..] {
        return Err(Error::shape(
            op,
            format!(
                "expected {what} broadcastable to the input's shape {}, got {}",
                fmt_shape(shape),
                fmt_shape(&m.shape)
            ),
        ));
    }
    Ok(())
}
