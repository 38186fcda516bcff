//! CPU helpers that the pooling, interpolation, transposed-convolution and FFT kernels share: they
//! read their input whole in the compute type, and fill a fresh output in it.

use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::{Result, Tensor};

use crate::cpu::float::Float;
use crate::cpu::kernels::cpu_context;
use crate::op::Meta;

/// The elements of `t` in row-major order, converted to `F`.
pub(crate) fn read<F: Float>(t: &Tensor) -> Result<Vec<F>> {
    t.to_dtype(F::DTYPE)?.to_vec::<F>()
}

/// Allocates the output of `meta`'s shape in compute precision on `x`'s device, fills it
/// with `fill`, and rounds it to `meta`'s dtype.
pub(crate) fn produce<F: Float>(
    op: &str,
    x: &Tensor,
    meta: &Meta,
    fill: impl FnOnce(&CpuDevice, &mut [F]) -> Result<()>,
) -> Result<Tensor> {
    let (dev, device) = cpu_context(op, x)?;
    Tensor::from_fn_typed::<F>(&meta.shape, &device, |out| fill(&dev, out))?.to_dtype(meta.dtype)
}
