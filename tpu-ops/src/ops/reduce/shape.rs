//! The shape and dtype rules of the reductions and scans: which dims a reduction covers, the
//! shape it leaves, and the dtypes results take and kernels compute in (PyTorch's rules).

use tpu_tensor::shape::resolve_dim_in;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Error, Result};

use crate::op::promote::compute_dtype;
use crate::op::{DTypeSet, Meta};

/// Which dims of `shape` a reduction over `dims` covers; empty `dims` means every dim.
pub(super) fn reduce_mask(op: &str, dims: &[i64], shape: &[usize]) -> Result<Vec<bool>> {
    let rank = shape.len();
    let mut mask = vec![dims.is_empty(); rank];
    // A 0-dim tensor accepts dim 0 and -1 (both name its one implicit dim), as in PyTorch.
    let mut seen = vec![false; rank.max(1)];
    for &d in dims {
        let r = resolve_dim_in(op, d, rank, shape)?;
        if std::mem::replace(&mut seen[r], true) {
            return Err(Error::shape(
                op,
                format!(
                    "dim {r} appears more than once in dims {dims:?} (tensor of shape {})",
                    fmt_shape(shape)
                ),
            ));
        }
        if rank > 0 {
            mask[r] = true;
        }
    }
    Ok(mask)
}

/// The mask of a reduction over one optional dim (`None`: every dim).
pub(super) fn single_mask(op: &str, dim: Option<i64>, shape: &[usize]) -> Result<Vec<bool>> {
    match dim {
        None => Ok(vec![true; shape.len()]),
        Some(d) => reduce_mask(op, &[d], shape),
    }
}

/// The shape a reduction over `mask` leaves.
pub(super) fn reduced_shape(shape: &[usize], mask: &[bool], keepdim: bool) -> Vec<usize> {
    shape
        .iter()
        .zip(mask)
        .filter_map(|(&s, &m)| match (m, keepdim) {
            (false, _) => Some(s),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// How many elements each output of a reduction over `mask` folds.
pub(super) fn reduced_count(shape: &[usize], mask: &[bool]) -> usize {
    shape
        .iter()
        .zip(mask)
        .filter(|(_, m)| **m)
        .map(|(s, _)| *s)
        .product()
}

/// Refuses a reduction that has no identity (max, the inf norm, ...) over an empty extent.
pub(super) fn check_nonempty(op: &str, shape: &[usize], mask: &[bool]) -> Result<()> {
    if let Some(d) = (0..shape.len()).find(|&d| mask[d] && shape[d] == 0) {
        return Err(Error::shape(
            op,
            format!(
                "cannot reduce over dim {d} of size 0 of a tensor of shape {}: {op} has no \
                 identity for an empty reduction",
                fmt_shape(shape)
            ),
        ));
    }
    Ok(())
}

/// Refuses a dtype outside `supported`; unlike [`crate::op::args::check_dtype_in`] the error
/// names the input's shape.
pub(super) fn check_dtype(op: &str, m: &Meta, supported: DTypeSet) -> Result<()> {
    if supported.contains(m.dtype) {
        return Ok(());
    }
    Err(Error::UnsupportedDType {
        op: op.into(),
        given: format!("{} (input of shape {})", m.dtype, fmt_shape(&m.shape)),
        supported: supported.to_string(),
    })
}

/// The one input of a reduction's shape rule.
pub(super) fn one_input<'a>(op: &str, inputs: &'a [Meta]) -> Result<&'a Meta> {
    match inputs {
        [m] => Ok(m),
        _ => Err(Error::invalid_argument(
            op,
            format!("expected one input tensor, got {}", inputs.len()),
        )),
    }
}

/// The one input (a tensor or a lowered value) and the one output of a kernel.
pub(super) fn one_to_one<'a, T>(
    op: &str,
    inputs: &'a [T],
    outputs: &'a [Meta],
) -> Result<(&'a T, &'a Meta)> {
    match (inputs, outputs) {
        ([x], [out]) => Ok((x, out)),
        _ => Err(Error::internal(op, "expected one input and one output")),
    }
}

/// PyTorch's result dtype of sum, prod, cumsum and cumprod: integers and bool widen to i64.
pub(super) fn sum_dtype(d: DType) -> DType {
    if d.is_float() { d } else { DType::I64 }
}

/// The dtype kernels compute in when the op keeps or widens its input's dtype: i64 for integers
/// and bool, f32 for the 16-bit floats.
pub(super) fn wide(d: DType) -> DType {
    if d.is_float() {
        compute_dtype(d)
    } else {
        DType::I64
    }
}
