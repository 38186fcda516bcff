//! `select_scatter` and `slice_scatter` (Core ATen's functional slice writes): compositions of
//! `index_copy` with the slice's indices, so they run on every device and carry its backward
//! rule (the input's gradient with the slice zeroed, the source's the slice of the gradient).

use tpu_tensor::shape::resolve_dim;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Dim, Error, Result, Tensor};

use crate::ops::movement::MovementOps;

/// `x` with `src` written at `index` along `dim` (`torch.select_scatter`).
pub(crate) fn select_scatter(
    x: &Tensor,
    src: &Tensor,
    dim: impl Dim,
    index: i64,
) -> Result<Tensor> {
    const OP: &str = "select_scatter";
    let d = dim_of(OP, x, dim)?;
    let size = x.shape()[d];
    let i = if index < 0 {
        index + size as i64
    } else {
        index
    };
    if i < 0 || i >= size as i64 {
        return Err(Error::IndexOutOfRange {
            op: OP.into(),
            index,
            dim: d,
            size,
            shape: x.shape().to_vec(),
        });
    }
    let mut slice = x.shape().to_vec();
    slice.remove(d);
    same_shape(OP, src, &slice)?;
    let at = Tensor::from_vec(vec![i], [1], &tpu_tensor::Device::cpu())?.to_device(x.device())?;
    x.index_copy(d as i64, &at, &src.unsqueeze(d as i64)?)
}

/// `x` with `src` written over `x[start:end:step]` along `dim` (`torch.slice_scatter`): `start`
/// and `end` as Python slices take them (negative from the end, clamped to the dim).
pub(crate) fn slice_scatter(
    x: &Tensor,
    src: &Tensor,
    dim: impl Dim,
    start: Option<i64>,
    end: Option<i64>,
    step: i64,
) -> Result<Tensor> {
    const OP: &str = "slice_scatter";
    let d = dim_of(OP, x, dim)?;
    if step < 1 {
        return Err(Error::invalid_argument(
            OP,
            format!("expected a step of at least 1, got {step}"),
        ));
    }
    let size = x.shape()[d] as i64;
    let clamp = |v: i64| (if v < 0 { v + size } else { v }).clamp(0, size);
    let (lo, hi) = (clamp(start.unwrap_or(0)), clamp(end.unwrap_or(size)));
    let hi = hi.max(lo);
    let mut slice = x.shape().to_vec();
    slice[d] = ((hi - lo) as usize).div_ceil(step as usize);
    same_shape(OP, src, &slice)?;
    let at = Tensor::arange(lo, hi, step, DType::I64, x.device())?;
    x.index_copy(d as i64, &at, src)
}

/// `dim` of `x`, which must have at least one.
fn dim_of(op: &str, x: &Tensor, dim: impl Dim) -> Result<usize> {
    let d = resolve_dim(op, dim, x.shape())?;
    if x.rank() == 0 {
        return Err(Error::shape(
            op,
            "expected a tensor with at least 1 dim, got a scalar",
        ));
    }
    Ok(d)
}

fn same_shape(op: &str, src: &Tensor, slice: &[usize]) -> Result<()> {
    if src.shape() != slice {
        return Err(Error::shape(
            op,
            format!(
                "expected src of the slice's shape {}, got {}",
                fmt_shape(slice),
                fmt_shape(src.shape())
            ),
        ));
    }
    Ok(())
}
