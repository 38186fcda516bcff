//! Selections by a mask's contents: `nonzero` (its output's shape depends on the data, so it
//! reads the mask back to the host once on PJRT devices) and `masked_scatter` (composed from
//! `cumsum`, `index_select` and `where`, so it stays on the device and carries their backward
//! rules).

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Device, Error, Result, Tensor};

use super::MovementOps;
use super::cpu::unravel;
use crate::TensorOps;
use crate::ops::reduce::ReduceOps;

/// The i64 indices `[count, rank]` of `x`'s non-zero elements (NaN counts, -0.0 does not), in
/// row-major order (`torch.nonzero`).
pub(crate) fn nonzero(x: &Tensor) -> Result<Tensor> {
    let set = x.ne(0.0)?.to_device(&Device::cpu())?.to_vec::<bool>()?;
    let shape = x.shape();
    let mut idx: Vec<i64> = Vec::new();
    let mut count = 0;
    for flat in (0..set.len()).filter(|&i| set[i]) {
        count += 1;
        idx.extend(unravel(flat, shape).iter().map(|&c| c as i64));
    }
    Tensor::from_vec(idx, [count, shape.len()], &Device::cpu())?.to_device(x.device())
}

/// `x` with the positions where `mask` (bool, broadcast to `x`) is true taking `source`'s
/// elements in order (`Tensor.masked_scatter`).
pub(crate) fn masked_scatter(x: &Tensor, mask: &Tensor, source: &Tensor) -> Result<Tensor> {
    const OP: &str = "masked_scatter";
    if mask.dtype() != DType::Bool || source.dtype() != x.dtype() {
        return Err(Error::invalid_argument(
            OP,
            format!(
                "expected a bool mask and a source of the input's dtype {}, got a {} mask and a \
                 {} source",
                x.dtype(),
                mask.dtype(),
                source.dtype()
            ),
        ));
    }
    let m = mask.expand(x.shape()).map_err(|_| {
        Error::shape(
            OP,
            format!(
                "the mask {} does not broadcast to the input {}",
                fmt_shape(mask.shape()),
                fmt_shape(x.shape())
            ),
        )
    })?;
    let n = x.numel();
    // The k-th true position takes source element k: the running count of trues, less one.
    let flat = m.to(DType::I64)?.reshape([n])?;
    let k = flat.cumsum(0)?.sub(1)?.relu()?;
    let src = source.reshape([source.numel()])?;
    if src.numel() == 0 {
        // Nothing to take: right only when no position is selected (one host read).
        if m.to_device(&Device::cpu())?
            .to_vec::<bool>()?
            .contains(&true)
        {
            return Err(Error::invalid_argument(
                OP,
                "the mask selects positions, and the source is empty",
            ));
        }
        return x.copy();
    }
    let picked = src.index_select(0, &k)?.reshape(x.shape())?;
    crate::where_(&m, &picked, x)
}
