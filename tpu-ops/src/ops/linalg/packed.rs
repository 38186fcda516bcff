//! Weights packed once for the products that reuse them: [`PackedWeight`] and
//! [`packed_linear`].
//!
//! `linear` on the native CPU packs its weight into the kernels' panels on every call; a
//! weight read transposed (as `x · Wᵀ` reads it) takes about a fifth of a bf16 product's time
//! to pack. A model that runs the same weights many times packs them once at load with
//! [`PackedWeight::new`] and calls [`packed_linear`], which gives `linear`'s bits (see its
//! doc) without the repacking. Anywhere the panels cannot serve (other devices, a graph
//! capture, gradients to record, a weight changed since it was packed) it is `linear` itself,
//! so the weight stays an ordinary tensor with every op's semantics.

use std::sync::Arc;

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Element, Error, Result, Tensor, bf16, f16};

use super::cpu::{PAR_WORK, bias_row};
use crate::cpu::kernels::{Reader, cpu_context, map1, output, output_overwrite};
use crate::cpu::simd::{Elem, MatView, PackedPanels, gemm_packed, gemm_packed_bias};
use crate::op::Meta;

/// A `[out, in]` weight and, on the native CPU with the SIMD kernels, its transpose packed
/// into the matrix kernels' panels. Cheap to clone (shared), `Send + Sync`. The panels take
/// about the weight's size again (twice it for f16, whose panels hold f32).
#[derive(Clone, Debug)]
pub struct PackedWeight {
    weight: Tensor,
    /// The panels and the weight storage's version when they were packed.
    panels: Option<(Arc<PackedPanels>, u64)>,
}

impl PackedWeight {
    /// `weight` (`[out, in]`, any float dtype, any device) with its panels where its device
    /// runs them: f32, f16 or bf16 on the native CPU with AVX2 or AVX-512. Elsewhere it holds
    /// only the weight, and [`packed_linear`] is `linear`.
    pub fn new(weight: &Tensor) -> Result<PackedWeight> {
        const OP: &str = "PackedWeight::new";
        if weight.rank() != 2 {
            return Err(Error::shape(
                OP,
                format!(
                    "expected a weight [out, in], got shape {}",
                    fmt_shape(weight.shape())
                ),
            ));
        }
        let panels = match weight.device().as_cpu() {
            Some(_) => match weight.dtype() {
                DType::F32 => pack::<f32>(weight)?,
                DType::BF16 => pack::<bf16>(weight)?,
                DType::F16 => pack::<f16>(weight)?,
                _ => None,
            },
            None => None,
        };
        Ok(PackedWeight {
            weight: weight.clone(),
            panels: panels.map(|p| (Arc::new(p), weight.storage().version())),
        })
    }

    /// The weight itself.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// Whether the panels exist (the native CPU with the SIMD kernels, a float weight).
    pub fn is_packed(&self) -> bool {
        self.panels.is_some()
    }

    /// Bytes the panels take (0 without them), beyond the weight's own.
    pub fn packed_nbytes(&self) -> usize {
        self.panels.as_ref().map_or(0, |(p, _)| p.nbytes())
    }
}

/// The panels of `w`'s transpose (`[in, out]`), read in place.
fn pack<T: Element + Elem>(w: &Tensor) -> Result<Option<PackedPanels>> {
    let r = Reader::new(&[w]);
    let data = r.data::<T>(w)?;
    let view = MatView {
        data,
        offset: w.offset(),
        rows: w.shape()[1],
        cols: w.shape()[0],
        rs: w.strides()[1],
        cs: w.strides()[0],
    };
    PackedPanels::pack(view)
}

/// `linear(x, w.weight(), bias)`: the same value, shape, dtype, gradients and errors, and the
/// same bits wherever `linear`'s kernel reads `x` as one matrix (its leading dims fold into
/// rows without a copy). On the native CPU it reads the weight's panels instead of packing the
/// weight again; it is `linear` itself for inputs of one row (a matrix-vector product reads
/// the weight as it is), other dtypes or devices, under a graph capture, when a gradient is to
/// be recorded, or when the weight has changed in place since it was packed.
pub fn packed_linear(x: &Tensor, w: &PackedWeight, bias: Option<&Tensor>) -> Result<Tensor> {
    if let Some(t) = fast(x, w, bias)? {
        return Ok(t);
    }
    super::linear(x, &w.weight, bias)
}

/// The product on the panels, or `None` where they cannot serve.
fn fast(x: &Tensor, w: &PackedWeight, bias: Option<&Tensor>) -> Result<Option<Tensor>> {
    let Some((panels, version)) = &w.panels else {
        return Ok(None);
    };
    let weight = &w.weight;
    let (n, k) = (weight.shape()[0], weight.shape()[1]);
    let mut inputs = vec![x, weight];
    inputs.extend(bias);
    let usable = weight.storage().version() == *version
        && x.rank() >= 1
        && x.shape().last() == Some(&k)
        && inputs.iter().all(|t| t.dtype() == weight.dtype())
        && crate::exec::fast::may_skip_dispatch(&inputs);
    if !usable {
        return Ok(None);
    }
    // Rows of every batch as one matrix, as `linear`'s kernel reads them.
    let m = x.numel() / k.max(1);
    let Ok(x2) = x.view([m, k]).or_else(|_| x.contiguous()?.view([m, k])) else {
        return Ok(None);
    };
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank >= 1, checked above") = n;
    if m <= 1 || n <= 1 || k == 0 {
        return Ok(None);
    }
    if let Some(b) = bias
        && tpu_tensor::shape::broadcast_shapes("linear", &shape, b.shape())
            .ok()
            .as_deref()
            != Some(&shape[..])
    {
        return Ok(None);
    }
    match weight.dtype() {
        DType::F32 => run::<f32>(&x2, panels, bias, &shape),
        DType::BF16 => run::<bf16>(&x2, panels, bias, &shape),
        DType::F16 => run::<f16>(&x2, panels, bias, &shape),
        _ => Ok(None),
    }
}

/// `out = x · panels (+ bias)` into a new `shape` tensor, as `linear`'s kernel fills it: the
/// bias broadcast first, then the product added.
fn run<T: Element + Elem>(
    x: &Tensor,
    panels: &PackedPanels,
    bias: Option<&Tensor>,
    shape: &[usize],
) -> Result<Option<Tensor>> {
    let (dev, device) = cpu_context("linear", x)?;
    let (m, k) = (x.shape()[0], x.shape()[1]);
    let n = panels.shape().1;
    let meta = Meta::new(shape, T::DTYPE);
    let mut locked = vec![x];
    locked.extend(bias);
    let r = Reader::new(&locked);
    let view = MatView {
        data: r.data::<T>(x)?,
        offset: x.offset(),
        rows: m,
        cols: k,
        rs: x.strides()[0],
        cs: x.strides()[1],
    };
    let threads = match m.saturating_mul(n).saturating_mul(k) < PAR_WORK {
        true => 1,
        false => dev.num_threads(),
    };
    let row = match bias {
        Some(b) => bias_row::<T>(&r, b, n)?,
        None => None,
    };
    let mut ran = false;
    let body = |o: &mut [T]| -> Result<()> {
        ran = match (bias, row) {
            (_, Some(v)) => dev.install(|| gemm_packed_bias(view, panels, v, o, threads))??,
            (Some(b), None) => {
                map1(&dev, (r.data::<T>(b)?, b), shape, o, |v: T| v)?;
                dev.install(|| gemm_packed(view, panels, o, true, threads))??
            }
            (None, None) => dev.install(|| gemm_packed(view, panels, o, false, threads))??,
        };
        Ok(())
    };
    let t = match (bias, row) {
        (Some(_), None) => output::<T>(&meta, &device, body)?,
        _ => output_overwrite::<T>(&meta, &device, body)?,
    };
    // Declined: the kernels' level changed since the weight was packed.
    Ok(ran.then_some(t))
}
