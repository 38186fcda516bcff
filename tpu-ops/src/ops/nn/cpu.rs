//! CPU plumbing every nn kernel shares: reading inputs in the compute type, and writing an
//! output computed in f32/f64 (rounded once for the 16-bit floats).

use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::tpu_runtime::buffer::describe;
use tpu_tensor::tpu_runtime::memory::try_host_vec;
use tpu_tensor::{DType, Device, Element, Error, Result, Tensor, bf16, f16};

use crate::cpu::float::Float;
use crate::cpu::kernels::{Reader, output, output_overwrite};
use crate::op::args::unsupported;
use crate::op::{DTypeSet, Meta};

/// `t` converted to the compute type and made contiguous (no copy when it already is both).
pub(super) fn contiguous_compute<C: Float>(t: &Tensor) -> Result<Tensor> {
    t.to_dtype(C::DTYPE)?.contiguous()
}

/// The elements of the dense tensor `t`, in order.
pub(super) fn elems<'a, C: Float>(r: &'a Reader, t: &Tensor) -> Result<&'a [C]> {
    let data = r.data::<C>(t)?;
    data.get(t.offset()..t.offset() + t.numel())
        .ok_or_else(|| Error::invalid_argument("kernel", "view reaches outside its storage"))
}

pub(super) fn store<T: Element, C: Float>(
    dev: &CpuDevice,
    meta: &Meta,
    device: &Device,
    tmp: &[C],
) -> Result<Tensor> {
    // `tmp` covers the whole output.
    output_overwrite::<T>(meta, device, |o| {
        crate::cpu::kernels::par_chunks(dev, o, |chunk, base| {
            for (o, &v) in chunk.iter_mut().zip(&tmp[base..]) {
                *o = T::from_f64(v.to_f64());
            }
        })
    })
}

/// An output of `meta` filled in the compute type `C`; 16-bit outputs are rounded once at the
/// end.
pub(super) fn emit<C: Float>(
    meta: &Meta,
    device: &Device,
    dev: &CpuDevice,
    fill: impl FnOnce(&mut [C]) -> Result<()>,
) -> Result<Tensor> {
    if meta.dtype == C::DTYPE {
        return output::<C>(meta, device, fill);
    }
    // Scratch in the compute type, up to twice the output's bytes: checked, never an abort.
    let mut tmp = try_host_vec(meta.numel(), C::ZERO, || {
        format!("scratch for {}", describe(meta.dtype, &meta.shape))
    })?;
    fill(&mut tmp)?;
    match meta.dtype {
        DType::F16 => store::<f16, C>(dev, meta, device, &tmp),
        DType::BF16 => store::<bf16, C>(dev, meta, device, &tmp),
        DType::F32 => store::<f32, C>(dev, meta, device, &tmp),
        DType::F64 => store::<f64, C>(dev, meta, device, &tmp),
        d => Err(unsupported("output", d, DTypeSet::FLOAT)),
    }
}

/// [`emit`] for a `fill` that writes every element: the output is not zeroed first.
pub(super) fn emit_overwrite<C: Float>(
    meta: &Meta,
    device: &Device,
    dev: &CpuDevice,
    fill: impl FnOnce(&mut [C]) -> Result<()>,
) -> Result<Tensor> {
    if meta.dtype == C::DTYPE {
        return output_overwrite::<C>(meta, device, fill);
    }
    emit(meta, device, dev, fill)
}

/// `(outer, n, inner)` around `dim` of `shape` (a 0-dim shape counts as `[1]`).
pub(super) fn split3(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    if shape.is_empty() {
        return (1, 1, 1);
    }
    let outer = shape[..dim].iter().product();
    let inner = shape[dim + 1..].iter().product();
    (outer, shape[dim], inner)
}

/// Storage offset of row `row` of a tensor viewed as `lead` rows, given per-dim `strides`.
pub(super) fn lead_offset(mut row: usize, lead: &[usize], strides: &[usize]) -> usize {
    let mut off = 0;
    for d in (0..lead.len()).rev() {
        let i = row % lead[d];
        row /= lead[d];
        off += i * strides[d];
    }
    off
}
