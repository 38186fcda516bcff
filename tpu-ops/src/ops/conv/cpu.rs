//! CPU helpers that the pooling, interpolation and transposed-convolution kernels share: they
//! read their input whole in the compute type, and fill a fresh output plane by plane.

use rayon::prelude::*;
use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::{Result, Tensor};

use crate::cpu::float::Float;
use crate::cpu::kernels::{PAR_THRESHOLD, cpu_context};
use crate::op::Meta;

/// The elements of `t` in row-major order, converted to `F`.
pub(super) fn read<F: Float>(t: &Tensor) -> Result<Vec<F>> {
    t.to_dtype(F::DTYPE)?.to_vec::<F>()
}

/// Allocates the output of `meta`'s shape in compute precision on `x`'s device, fills it
/// with `fill`, and rounds it to `meta`'s dtype.
pub(super) fn produce<F: Float>(
    op: &str,
    x: &Tensor,
    meta: &Meta,
    fill: impl FnOnce(&CpuDevice, &mut [F]) -> Result<()>,
) -> Result<Tensor> {
    let (dev, device) = cpu_context(op, x)?;
    Tensor::from_fn_typed::<F>(&meta.shape, &device, |out| fill(&dev, out))?.to_dtype(meta.dtype)
}

/// Runs `f(plane, out_plane)` over the `(N, C)` planes of `out`, in parallel when `work`
/// (elements read) is large.
pub(super) fn each_plane<T: Send>(
    dev: &CpuDevice,
    out: &mut [T],
    plane: usize,
    work: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) -> Result<()> {
    if plane == 0 || out.is_empty() {
        return Ok(());
    }
    if work < PAR_THRESHOLD || dev.num_threads() <= 1 {
        out.chunks_mut(plane).enumerate().for_each(|(p, o)| f(p, o));
        return Ok(());
    }
    dev.install(|| {
        out.par_chunks_mut(plane)
            .enumerate()
            .for_each(|(p, o)| f(p, o))
    })
}
