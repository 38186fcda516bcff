//! Neural-network functions: softmax and log-softmax, layer/RMS/group/batch normalisation,
//! dropout, scaled dot-product attention, rotary position embeddings and losses.
//!
//! Every op here is float-only (f16, bf16, f32, f64). The 16-bit floats compute in f32 and round
//! once at the end, in the CPU kernels and in the lowerings alike. The CPU kernels are fused: each
//! makes its passes over a row in one place and builds no intermediate tensors (the attention
//! kernel never holds more than one block of scores per query row). Sums of many terms (norm
//! statistics, loss reductions) accumulate in f64 on the CPU.
//!
//! Every op has a backward rule with PyTorch's formulas, written with ops (so it runs on the
//! device the forward ran on) in the private `grad` module.
//!
//! The free functions with PyTorch's `torch.nn.functional` names live in [`functional`]; the
//! per-tensor ones are also methods through [`NnOps`].

use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub};
use std::sync::Arc;

use rayon::prelude::*;
use tpu_tensor::shape::{broadcast_shapes, resolve_dim};
use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::tpu_runtime::buffer::describe;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::tpu_runtime::memory::{try_host_capacity, try_host_vec};
use tpu_tensor::{DType, Device, Dim, Element, Error, Generator, Result, Tensor, bf16, f16};

use crate::autograd::Saved;
use crate::cpu::float::with_compute;
use crate::cpu::kernels::{
    MultiWalk, PAR_THRESHOLD, Reader, broadcast_strides, cpu_device, output, output_overwrite,
    par_map, par_rows,
};
use crate::cpu::simd::rows as simd_rows;
use crate::hlo::checks::DeviceCheck;
use crate::hlo::{Cmp, FnBuilder, Value};
use crate::op::promote::compute_dtype;
use crate::op::{DTypeSet, Meta, OpDef, OpInfo};

// ---- compute types --------------------------------------------------------------------------

/// The types kernels compute in: f32 (for f32 and the 16-bit floats) and f64.
trait Real:
    Element
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + MulAssign
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INF: Self;
    fn exp(self) -> Self;
    /// `e^self` through the vectorisable kernels' exp (`crate::cpu::math::exp_f32` for f32).
    fn fexp(self) -> Self;
    fn ln_1p(self) -> Self;
    fn abs(self) -> Self;
}

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: $t = 0.0;
            const ONE: $t = 1.0;
            const NEG_INF: $t = <$t>::NEG_INFINITY;
            #[inline]
            fn exp(self) -> $t {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn fexp(self) -> $t {
                <$t as simd_rows::Float>::fexp(self)
            }
            #[inline]
            fn ln_1p(self) -> $t {
                <$t>::ln_1p(self)
            }
            #[inline]
            fn abs(self) -> $t {
                <$t>::abs(self)
            }
        }
    };
}
real!(f32);
real!(f64);

// ---- shared checks and kernel plumbing ------------------------------------------------------

fn unsupported(op: &str, d: DType) -> Error {
    Error::UnsupportedDType {
        op: op.into(),
        given: d.to_string(),
        supported: DTypeSet::FLOAT.to_string(),
    }
}

fn check_float(op: &str, m: &Meta) -> Result<()> {
    if m.dtype.is_float() {
        Ok(())
    } else {
        Err(unsupported(op, m.dtype))
    }
}

fn check_dtype(op: &str, what: &str, m: &Meta, want: DType) -> Result<()> {
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

fn check_arity(op: &str, inputs: &[Meta], n: usize) -> Result<()> {
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
fn take<'a, T>(items: &'a [T], present: bool, idx: &mut usize) -> Option<&'a T> {
    if !present {
        return None;
    }
    let t = items.get(*idx);
    *idx += 1;
    t
}

/// Checks that a parameter tensor (weight, bias, running stat) has `shape` and `dtype`.
fn check_param(op: &str, what: &str, m: &Meta, shape: &[usize], dtype: DType) -> Result<()> {
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

fn ctx(op: &str, t: &Tensor) -> Result<(Arc<CpuDevice>, Device)> {
    let dev = cpu_device(op, t)?;
    let device = Device::from_cpu(dev.clone());
    Ok((dev, device))
}

/// `t` converted to the compute type and made dense (no copy when it already is both).
fn dense<C: Real>(t: &Tensor) -> Result<Tensor> {
    t.to_dtype(C::DTYPE)?.contiguous()
}

/// The elements of the dense tensor `t`, in order.
fn elems<'a, C: Real>(r: &'a Reader, t: &Tensor) -> Result<&'a [C]> {
    let data = r.data::<C>(t)?;
    data.get(t.offset()..t.offset() + t.numel())
        .ok_or_else(|| Error::invalid_argument("kernel", "view reaches outside its storage"))
}

fn store<T: Element, C: Real>(
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
fn emit<C: Real>(
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
        d => Err(unsupported("output", d)),
    }
}

/// [`emit`] for a `fill` that writes every element: the output is not zeroed first.
fn emit_overwrite<C: Real>(
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
fn split3(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    if shape.is_empty() {
        return (1, 1, 1);
    }
    let outer = shape[..dim].iter().product();
    let inner = shape[dim + 1..].iter().product();
    (outer, shape[dim], inner)
}

/// Storage offset of row `row` of a tensor viewed as `lead` rows, given per-dim `strides`.
fn lead_offset(mut row: usize, lead: &[usize], strides: &[usize]) -> usize {
    let mut off = 0;
    for d in (0..lead.len()).rev() {
        let i = row % lead[d];
        row /= lead[d];
        off += i * strides[d];
    }
    off
}

// ---- lowering helpers -----------------------------------------------------------------------

fn cst(b: &mut FnBuilder, like: &Value, v: f64) -> Value {
    b.splat(like.ty.clone(), v)
}

fn add(b: &mut FnBuilder, x: &Value, y: &Value) -> Value {
    b.ew("stablehlo.add", &[x, y])
}

fn sub(b: &mut FnBuilder, x: &Value, y: &Value) -> Value {
    b.ew("stablehlo.subtract", &[x, y])
}

fn mul(b: &mut FnBuilder, x: &Value, y: &Value) -> Value {
    b.ew("stablehlo.multiply", &[x, y])
}

fn div(b: &mut FnBuilder, x: &Value, y: &Value) -> Value {
    b.ew("stablehlo.divide", &[x, y])
}

fn to_compute(b: &mut FnBuilder, v: &Value) -> Value {
    b.convert(v, compute_dtype(v.dtype()))
}

fn lower_reduce(b: &mut FnBuilder, v: &Value, dims: &[usize], max: bool) -> Value {
    let init = b.scalar(v.dtype(), if max { f64::NEG_INFINITY } else { 0.0 });
    let name = if max {
        "stablehlo.maximum"
    } else {
        "stablehlo.add"
    };
    b.reduce(&[v], &[&init], dims, |b, a| {
        vec![b.ew(name, &[&a[0], &a[1]])]
    })
    .remove(0)
}

fn lower_sum(b: &mut FnBuilder, v: &Value, dims: &[usize]) -> Value {
    lower_reduce(b, v, dims, false)
}

/// Broadcasts a value reduced over `reduced` back to `dims`.
fn bcast_back(b: &mut FnBuilder, v: &Value, reduced: &[usize], dims: &[usize]) -> Value {
    let map: Vec<i64> = (0..dims.len())
        .filter(|d| !reduced.contains(d))
        .map(|d| d as i64)
        .collect();
    b.broadcast_in_dim(v, &map, dims)
}

/// Softmax or log-softmax of `x` along `dim`. `safe` gives zeros (not NaN) for rows that are
/// entirely -inf, as PyTorch's attention does.
fn lower_softmax(b: &mut FnBuilder, x: &Value, dim: usize, log: bool, safe: bool) -> Value {
    let dims = x.dims().to_vec();
    let m = lower_reduce(b, x, &[dim], true);
    let m = if safe {
        let ninf = cst(b, &m, f64::NEG_INFINITY);
        let empty = b.compare(Cmp::Eq, &m, &ninf);
        let zero = cst(b, &m, 0.0);
        b.select(&empty, &zero, &m)
    } else {
        m
    };
    let mb = bcast_back(b, &m, &[dim], &dims);
    let z = sub(b, x, &mb);
    let e = b.ew("stablehlo.exponential", &[&z]);
    let s = lower_sum(b, &e, &[dim]);
    if log {
        let ls = b.ew("stablehlo.log", &[&s]);
        let lsb = bcast_back(b, &ls, &[dim], &dims);
        sub(b, &z, &lsb)
    } else {
        let s = if safe {
            let zero = cst(b, &s, 0.0);
            let one = cst(b, &s, 1.0);
            let empty = b.compare(Cmp::Eq, &s, &zero);
            b.select(&empty, &one, &s)
        } else {
            s
        };
        let sb = bcast_back(b, &s, &[dim], &dims);
        div(b, &e, &sb)
    }
}

/// `(x - mean) * rsqrt(var + eps)` over the last dim of `x` (or `x * rsqrt(mean(x^2) + eps)`
/// for RMS).
fn lower_normalize_last(b: &mut FnBuilder, x: &Value, rms: bool, eps: f64) -> Value {
    let dims = x.dims().to_vec();
    let last = dims.len() - 1;
    let len = dims[last] as f64;
    let centered = if rms {
        x.clone()
    } else {
        let s = lower_sum(b, x, &[last]);
        let n = cst(b, &s, len);
        let mean = div(b, &s, &n);
        let mb = bcast_back(b, &mean, &[last], &dims);
        sub(b, x, &mb)
    };
    let sq = mul(b, &centered, &centered);
    let ss = lower_sum(b, &sq, &[last]);
    let n = cst(b, &ss, len);
    let var = div(b, &ss, &n);
    let e = cst(b, &var, eps);
    let ve = add(b, &var, &e);
    let rstd = b.ew("stablehlo.rsqrt", &[&ve]);
    let rb = bcast_back(b, &rstd, &[last], &dims);
    mul(b, &centered, &rb)
}

// ---- softmax --------------------------------------------------------------------------------

/// `softmax` or `log_softmax` along one dim, with a max-shifted fused kernel.
#[derive(Clone, Debug)]
pub struct Softmax {
    /// The dim, resolved against the input's rank.
    pub dim: usize,
    /// Log-softmax instead of softmax.
    pub log: bool,
}

/// Columns per task of the strided softmax.
const COLS: usize = 64;

/// Softmax along the middle dim of `[outer, n, inner]` with `inner > 1`. Reading whole rows of
/// `inner` columns keeps the loops contiguous: first the max and sum of each column (in
/// parallel over blocks of columns), then the outputs (in parallel over rows).
fn softmax_strided<C: Real>(
    dev: &CpuDevice,
    xs: &[C],
    o: &mut [C],
    outer: usize,
    n: usize,
    inner: usize,
    log: bool,
) -> Result<()> {
    let blocks = inner.div_ceil(COLS);
    let parts = par_map(dev, outer * blocks, 2 * n * COLS, |k| {
        let (slab, d0) = (k / blocks, (k % blocks) * COLS);
        let w = COLS.min(inner - d0);
        let base = slab * n * inner + d0;
        let mut m = vec![C::NEG_INF; w];
        for c in 0..n {
            for (mm, &v) in m.iter_mut().zip(&xs[base + c * inner..][..w]) {
                if v > *mm {
                    *mm = v;
                }
            }
        }
        let mut s = vec![C::ZERO; w];
        for c in 0..n {
            for ((t, &mm), &v) in s.iter_mut().zip(&m).zip(&xs[base + c * inner..][..w]) {
                *t += (v - mm).fexp();
            }
        }
        m.into_iter().zip(s).collect::<Vec<_>>()
    })?;
    let stats: Vec<(C, C)> = parts
        .into_iter()
        .flatten()
        .map(|(m, s)| {
            if log {
                (m, C::from_f64(s.to_f64().ln()))
            } else {
                (m, s)
            }
        })
        .collect();
    par_rows(dev, o, inner, inner, |row, or| {
        let st = &stats[(row / n) * inner..][..inner];
        let xr = &xs[row * inner..][..inner];
        for ((o, &v), &(m, s)) in or.iter_mut().zip(xr).zip(st) {
            let z = v - m;
            *o = if log { z - s } else { z.fexp() / s };
        }
    })
}

impl OpDef for Softmax {
    fn name(&self) -> &'static str {
        if self.log { "log_softmax" } else { "softmax" }
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        check_arity(self.name(), inputs, 1)?;
        let x = &inputs[0];
        check_float(self.name(), x)?;
        if self.dim >= x.rank().max(1) {
            return Err(Error::DimOutOfRange {
                op: self.name().into(),
                dim: self.dim as i64,
                rank: x.rank(),
                shape: x.shape.to_vec(),
            });
        }
        Ok(vec![Meta::new(&x.shape, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0];
        let (dev, device) = ctx(self.name(), x)?;
        let (outer, n, inner) = split3(x.shape(), self.dim);
        let log = self.log;
        with_compute!(self.name(), x.dtype(), |C| {
            let xd = dense::<C>(x)?;
            let r = Reader::new(&[&xd]);
            let xs = elems::<C>(&r, &xd)?;
            let t = emit_overwrite::<C>(&outputs[0], &device, &dev, |o| {
                if inner == 1 {
                    par_rows(&dev, o, n, n, |r, os| {
                        <C as simd_rows::Float>::softmax_row(&xs[r * n..(r + 1) * n], os, log)
                    })
                } else {
                    softmax_strided(&dev, xs, o, outer, n, inner, log)
                }
            })?;
            Ok(vec![t])
        })
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let shape = inputs[0].dims().to_vec();
        let x = if shape.is_empty() {
            b.reshape(&inputs[0], &[1])
        } else {
            inputs[0].clone()
        };
        let x = to_compute(b, &x);
        let y = lower_softmax(b, &x, self.dim, self.log, false);
        let y = b.convert(&y, outputs[0].dtype);
        Ok(vec![b.reshape(&y, &shape)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        grad::softmax(self, saved, grads)
    }
}

// ---- layer, RMS and group norm --------------------------------------------------------------

/// Which statistic a [`Norm`] op normalises with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// Mean and variance over the trailing `normalized` dims.
    Layer,
    /// Root mean square over the trailing `normalized` dims.
    Rms,
    /// Mean and variance per group of channels of an `[N, C, *]` input.
    Group(usize),
}

/// Layer, RMS or group normalisation with an optional elementwise affine transform. Inputs:
/// `x`, then `weight` and `bias` when present.
#[derive(Clone, Debug)]
pub struct Norm {
    /// Which normalisation.
    pub kind: NormKind,
    /// The trailing dims normalised over (layer and RMS norm).
    pub normalized: Vec<usize>,
    /// Added to the variance (or mean square) before the square root.
    pub eps: f64,
    /// A weight is given.
    pub weight: bool,
    /// A bias is given.
    pub bias: bool,
}

impl Norm {
    fn layout(&self, shape: &[usize]) -> (usize, usize, usize) {
        match self.kind {
            NormKind::Group(g) => {
                let c = shape[1];
                let s: usize = shape[2..].iter().product();
                (c / g * s, s, g)
            }
            _ => (self.normalized.iter().product(), 1, 1),
        }
    }
}

impl OpDef for Norm {
    fn name(&self) -> &'static str {
        match self.kind {
            NormKind::Layer => "layer_norm",
            NormKind::Rms => "rms_norm",
            NormKind::Group(_) => "group_norm",
        }
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.name();
        check_arity(op, inputs, 1 + self.weight as usize + self.bias as usize)?;
        let x = &inputs[0];
        check_float(op, x)?;
        let pshape: Vec<usize> = match self.kind {
            NormKind::Layer | NormKind::Rms => {
                let ns = &self.normalized;
                if ns.is_empty() {
                    return Err(Error::shape(
                        op,
                        "expected normalized_shape to have at least one dim, got []",
                    ));
                }
                if x.rank() < ns.len() || x.shape[x.rank() - ns.len()..] != ns[..] {
                    let dims: Vec<String> = ns.iter().map(|d| d.to_string()).collect();
                    return Err(Error::shape(
                        op,
                        format!(
                            "given normalized_shape={}, expected input with shape [*, {}], got input of shape {}",
                            fmt_shape(ns),
                            dims.join(", "),
                            fmt_shape(&x.shape)
                        ),
                    ));
                }
                if self.kind == NormKind::Rms && self.bias {
                    return Err(Error::invalid_argument(op, "rms_norm takes no bias"));
                }
                ns.clone()
            }
            NormKind::Group(g) => {
                if x.rank() < 2 {
                    return Err(Error::shape(
                        op,
                        format!(
                            "expected an input of shape [N, C, *], got {}",
                            fmt_shape(&x.shape)
                        ),
                    ));
                }
                if g == 0 || !x.shape[1].is_multiple_of(g) {
                    return Err(Error::shape(
                        op,
                        format!(
                            "expected the number of channels to be divisible by num_groups, got input of shape {} and num_groups={g}",
                            fmt_shape(&x.shape)
                        ),
                    ));
                }
                vec![x.shape[1]]
            }
        };
        let mut i = 1;
        if let Some(w) = take(inputs, self.weight, &mut i) {
            check_param(op, "weight", w, &pshape, x.dtype)?;
        }
        if let Some(b) = take(inputs, self.bias, &mut i) {
            check_param(op, "bias", b, &pshape, x.dtype)?;
        }
        Ok(vec![Meta::new(&x.shape, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let op = self.name();
        let x = inputs[0];
        let mut i = 1;
        let w = take(inputs, self.weight, &mut i).copied();
        let bias = take(inputs, self.bias, &mut i).copied();
        let (dev, device) = ctx(op, x)?;
        let (row_len, seg, groups) = self.layout(x.shape());
        // Parameters per group: one per segment (group norm) or per element.
        let per_group = row_len / seg.max(1);
        let (rms, eps) = (self.kind == NormKind::Rms, self.eps);
        with_compute!(op, x.dtype(), |C| {
            let xd = dense::<C>(x)?;
            let wd = w.map(dense::<C>).transpose()?;
            let bd = bias.map(dense::<C>).transpose()?;
            let mut all = vec![&xd];
            all.extend(wd.iter());
            all.extend(bd.iter());
            let r = Reader::new(&all);
            let xs = elems::<C>(&r, &xd)?;
            let ws = wd.as_ref().map(|t| elems::<C>(&r, t)).transpose()?;
            let bs = bd.as_ref().map(|t| elems::<C>(&r, t)).transpose()?;
            let t = emit_overwrite::<C>(&outputs[0], &device, &dev, |o| {
                par_rows(&dev, o, row_len, 3 * row_len, |row, os| {
                    let g = row % groups;
                    let range = g * per_group..(g + 1) * per_group;
                    let p = simd_rows::NormParams {
                        rms,
                        eps,
                        w: ws.map(|w| &w[range.clone()]),
                        b: bs.map(|b| &b[range.clone()]),
                        seg,
                    };
                    <C as simd_rows::Float>::norm_row(
                        &xs[row * row_len..(row + 1) * row_len],
                        os,
                        &p,
                    )
                })
            })?;
            Ok(vec![t])
        })
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let shape = inputs[0].dims().to_vec();
        let x = to_compute(b, &inputs[0]);
        let numel: usize = shape.iter().product();
        let (row_len, seg, groups) = self.layout(&shape);
        let rms = self.kind == NormKind::Rms;
        let y = match self.kind {
            NormKind::Group(_) => {
                let n = shape[0];
                let x3 = b.reshape(&x, &[n, groups, row_len]);
                let y3 = lower_normalize_last(b, &x3, false, self.eps);
                b.reshape(&y3, &[n, shape[1], seg])
            }
            _ => {
                let rows = numel.checked_div(row_len).unwrap_or(0);
                let x2 = b.reshape(&x, &[rows, row_len]);
                lower_normalize_last(b, &x2, rms, self.eps)
            }
        };
        let ydims = y.dims().to_vec();
        // The parameters line up with dim 1 of the normalised value in both layouts.
        let mut y = y;
        let mut i = 1;
        for (present, is_weight) in [(self.weight, true), (self.bias, false)] {
            if let Some(p) = take(inputs, present, &mut i) {
                let p = to_compute(b, p);
                let p = b.reshape(&p, &[ydims[1]]);
                let pb = b.broadcast_in_dim(&p, &[1], &ydims);
                y = if is_weight {
                    mul(b, &y, &pb)
                } else {
                    add(b, &y, &pb)
                };
            }
        }
        let y = b.reshape(&y, &shape);
        Ok(vec![b.convert(&y, outputs[0].dtype)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        grad::norm(self, saved, grads)
    }
}

// ---- batch norm -----------------------------------------------------------------------------

/// Batch normalisation of an `[N, C, *]` input. Inputs: `x`, then `running_mean` and
/// `running_var` (both or neither), `weight` and `bias` when present. Outputs: the normalised
/// input, then, in training with running stats, the updated running mean and variance.
#[derive(Clone, Debug)]
pub struct BatchNorm {
    /// Normalise with the batch's statistics (and update the running ones).
    pub training: bool,
    /// Weight of the batch statistics in the running update.
    pub momentum: f64,
    /// Added to the variance before the square root.
    pub eps: f64,
    /// Running mean and variance are given.
    pub running: bool,
    /// A weight is given.
    pub weight: bool,
    /// A bias is given.
    pub bias: bool,
}

impl OpDef for BatchNorm {
    fn name(&self) -> &'static str {
        "batch_norm"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.name();
        let n = 1 + 2 * self.running as usize + self.weight as usize + self.bias as usize;
        check_arity(op, inputs, n)?;
        let x = &inputs[0];
        check_float(op, x)?;
        if x.rank() < 2 {
            return Err(Error::shape(
                op,
                format!(
                    "expected an input of shape [N, C, *], got {}",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        let c = x.shape[1];
        if self.training && x.numel() / c.max(1) == 1 {
            return Err(Error::shape(
                op,
                format!(
                    "expected more than 1 value per channel when training, got input of shape {}",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        if !self.training && !self.running {
            return Err(Error::invalid_argument(
                op,
                "running_mean and running_var must be given in evaluation mode",
            ));
        }
        let mut i = 1;
        for (present, what) in [
            (self.running, "running_mean"),
            (self.running, "running_var"),
            (self.weight, "weight"),
            (self.bias, "bias"),
        ] {
            if let Some(m) = take(inputs, present, &mut i) {
                check_param(op, what, m, &[c], x.dtype)?;
            }
        }
        let mut out = vec![Meta::new(&x.shape, x.dtype)];
        if self.training && self.running {
            out.push(Meta::new(&[c], x.dtype));
            out.push(Meta::new(&[c], x.dtype));
        }
        Ok(out)
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let op = self.name();
        let x = inputs[0];
        let mut i = 1;
        let rm = take(inputs, self.running, &mut i).copied();
        let rv = take(inputs, self.running, &mut i).copied();
        let w = take(inputs, self.weight, &mut i).copied();
        let bias = take(inputs, self.bias, &mut i).copied();
        let (dev, device) = ctx(op, x)?;
        let shape = x.shape();
        let (n, ch) = (shape[0], shape[1]);
        let s: usize = shape[2..].iter().product();
        let count = n * s;
        let (training, momentum, eps) = (self.training, self.momentum, self.eps);
        with_compute!(op, x.dtype(), |C| {
            let xd = dense::<C>(x)?;
            let params: Vec<Option<Tensor>> = [rm, rv, w, bias]
                .into_iter()
                .map(|t| t.map(dense::<C>).transpose())
                .collect::<Result<_>>()?;
            let mut all = vec![&xd];
            all.extend(params.iter().flatten());
            let r = Reader::new(&all);
            let xs = elems::<C>(&r, &xd)?;
            let p: Vec<Option<&[C]>> = params
                .iter()
                .map(|t| t.as_ref().map(|t| elems::<C>(&r, t)).transpose())
                .collect::<Result<_>>()?;
            let (rms, rvs, ws, bs) = (p[0], p[1], p[2], p[3]);
            let stats: Vec<(f64, f64)> = if training {
                par_map(&dev, ch, 2 * count, |c| {
                    let seg = |b: usize| &xs[(b * ch + c) * s..(b * ch + c + 1) * s];
                    let sum: f64 = (0..n).flat_map(seg).map(|v| v.to_f64()).sum();
                    let mean = sum / count as f64;
                    let sq: f64 = (0..n)
                        .flat_map(seg)
                        .map(|v| (v.to_f64() - mean) * (v.to_f64() - mean))
                        .sum();
                    (mean, sq / count as f64)
                })?
            } else {
                let (m, v) = rms.zip(rvs).ok_or_else(|| {
                    Error::invalid_argument(op, "running stats are required in evaluation mode")
                })?;
                (0..ch).map(|c| (m[c].to_f64(), v[c].to_f64())).collect()
            };
            let coef: Vec<(C, C)> = stats
                .iter()
                .map(|&(m, v)| (C::from_f64(m), C::from_f64(1.0 / (v + eps).sqrt())))
                .collect();
            let y = emit::<C>(&outputs[0], &device, &dev, |o| {
                par_rows(&dev, o, s, s, |row, os| {
                    let c = row % ch;
                    let (m, rstd) = coef[c];
                    let xr = &xs[row * s..(row + 1) * s];
                    for (o, &v) in os.iter_mut().zip(xr) {
                        let mut y = (v - m) * rstd;
                        if let Some(w) = ws {
                            y *= w[c];
                        }
                        if let Some(b) = bs {
                            y += b[c];
                        }
                        *o = y;
                    }
                })
            })?;
            let mut outs = vec![y];
            if let (true, Some(rm), Some(rv)) = (training, rms, rvs) {
                let mom = C::from_f64(momentum);
                let keep = C::from_f64(1.0 - momentum);
                let unbias = count as f64 / (count as f64 - 1.0);
                outs.push(emit::<C>(&outputs[1], &device, &dev, |o| {
                    for (c, o) in o.iter_mut().enumerate() {
                        *o = mom * C::from_f64(stats[c].0) + keep * rm[c];
                    }
                    Ok(())
                })?);
                outs.push(emit::<C>(&outputs[2], &device, &dev, |o| {
                    for (c, o) in o.iter_mut().enumerate() {
                        *o = mom * C::from_f64(stats[c].1 * unbias) + keep * rv[c];
                    }
                    Ok(())
                })?);
            }
            Ok(outs)
        })
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let dims = inputs[0].dims().to_vec();
        let x = to_compute(b, &inputs[0]);
        let ch = dims[1];
        let count: usize = dims.iter().product::<usize>() / ch.max(1);
        let red: Vec<usize> = (0..dims.len()).filter(|&d| d != 1).collect();
        let mut i = 1;
        let rm = take(inputs, self.running, &mut i).map(|v| to_compute(b, v));
        let rv = take(inputs, self.running, &mut i).map(|v| to_compute(b, v));
        let w = take(inputs, self.weight, &mut i).map(|v| to_compute(b, v));
        let bias = take(inputs, self.bias, &mut i).map(|v| to_compute(b, v));
        let (mean, var) = if self.training {
            let s = lower_sum(b, &x, &red);
            let cnt = cst(b, &s, count as f64);
            let mean = div(b, &s, &cnt);
            let mb = bcast_back(b, &mean, &red, &dims);
            let xc = sub(b, &x, &mb);
            let sq = mul(b, &xc, &xc);
            let ss = lower_sum(b, &sq, &red);
            (mean, div(b, &ss, &cnt))
        } else {
            match (&rm, &rv) {
                (Some(m), Some(v)) => (m.clone(), v.clone()),
                _ => {
                    return Err(Error::invalid_argument(
                        self.name(),
                        "running stats are required in evaluation mode",
                    ));
                }
            }
        };
        let mb = bcast_back(b, &mean, &red, &dims);
        let xc = sub(b, &x, &mb);
        let e = cst(b, &var, self.eps);
        let ve = add(b, &var, &e);
        let rstd = b.ew("stablehlo.rsqrt", &[&ve]);
        let rb = bcast_back(b, &rstd, &red, &dims);
        let mut y = mul(b, &xc, &rb);
        if let Some(w) = &w {
            let wb = bcast_back(b, w, &red, &dims);
            y = mul(b, &y, &wb);
        }
        if let Some(bv) = &bias {
            let bb = bcast_back(b, bv, &red, &dims);
            y = add(b, &y, &bb);
        }
        let mut outs = vec![b.convert(&y, outputs[0].dtype)];
        if let (true, Some(rm), Some(rv)) = (self.training, &rm, &rv) {
            let mom = cst(b, &mean, self.momentum);
            let keep = cst(b, &mean, 1.0 - self.momentum);
            let unbias = cst(b, &mean, count as f64 / (count as f64 - 1.0));
            let a = mul(b, &mom, &mean);
            let k = mul(b, &keep, rm);
            let new_m = add(b, &a, &k);
            let vu = mul(b, &var, &unbias);
            let a = mul(b, &mom, &vu);
            let k = mul(b, &keep, rv);
            let new_v = add(b, &a, &k);
            outs.push(b.convert(&new_m, outputs[1].dtype));
            outs.push(b.convert(&new_v, outputs[2].dtype));
        }
        Ok(outs)
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        grad::batch_norm(self, saved, grads)
    }
}

// ---- dropout --------------------------------------------------------------------------------

/// Dropout with a given keep mask: `x * (keep ? scale : 0)`. Inputs: `x` and the bool mask
/// of `x`'s shape. The mask comes from the host's Philox generator, so every device drops the
/// same elements for the same seed.
#[derive(Clone, Debug)]
pub struct Dropout {
    /// The factor for kept elements, `1 / (1 - p)`.
    pub scale: f64,
}

impl OpDef for Dropout {
    fn name(&self) -> &'static str {
        "dropout"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        check_arity("dropout", inputs, 2)?;
        let (x, keep) = (&inputs[0], &inputs[1]);
        check_float("dropout", x)?;
        check_param("dropout", "mask", keep, &x.shape, DType::Bool)?;
        Ok(vec![Meta::new(&x.shape, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0];
        let keep = inputs[1].contiguous()?;
        let (dev, device) = ctx("dropout", x)?;
        with_compute!("dropout", x.dtype(), |C| {
            let xd = dense::<C>(x)?;
            let r = Reader::new(&[&xd, &keep]);
            let xs = elems::<C>(&r, &xd)?;
            let ks = r
                .data::<bool>(&keep)?
                .get(keep.offset()..keep.offset() + keep.numel())
                .ok_or_else(|| Error::invalid_argument("dropout", "mask outside its storage"))?;
            let scale = C::from_f64(self.scale);
            let t = emit::<C>(&outputs[0], &device, &dev, |o| {
                crate::cpu::kernels::par_chunks(&dev, o, |chunk, base| {
                    for ((o, &v), &k) in chunk.iter_mut().zip(&xs[base..]).zip(&ks[base..]) {
                        *o = v * if k { scale } else { C::ZERO };
                    }
                })
            })?;
            Ok(vec![t])
        })
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let x = to_compute(b, &inputs[0]);
        let scale = cst(b, &x, self.scale);
        let zero = cst(b, &x, 0.0);
        let m = b.select(&inputs[1], &scale, &zero);
        let y = mul(b, &x, &m);
        Ok(vec![b.convert(&y, outputs[0].dtype)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        grad::dropout(self, saved, grads)
    }
}

// ---- rotary embedding -----------------------------------------------------------------------

/// Rotary position embedding in the rotate-half convention: `x * cos + rotate_half(x) * sin`
/// with `rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])`. Inputs: `x` and `cos` and `sin`
/// broadcastable to `x`.
#[derive(Clone, Debug)]
pub struct Rotary;

impl OpDef for Rotary {
    fn name(&self) -> &'static str {
        "apply_rotary_emb"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.name();
        check_arity(op, inputs, 3)?;
        let x = &inputs[0];
        check_float(op, x)?;
        let d = x.shape.last().copied().unwrap_or(0);
        if x.rank() == 0 || d % 2 != 0 {
            return Err(Error::shape(
                op,
                format!(
                    "expected an input whose last dim has even size, got shape {}",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        for (m, what) in [(&inputs[1], "cos"), (&inputs[2], "sin")] {
            check_dtype(op, what, m, x.dtype)?;
            let s = broadcast_shapes(op, &x.shape, &m.shape)?;
            if s != x.shape {
                return Err(Error::shape(
                    op,
                    format!(
                        "expected {what} broadcastable to the input's shape {}, got {}",
                        fmt_shape(&x.shape),
                        fmt_shape(&m.shape)
                    ),
                ));
            }
        }
        Ok(vec![Meta::new(&x.shape, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let op = self.name();
        let x = inputs[0];
        let (dev, device) = ctx(op, x)?;
        let shape = x.shape();
        let rank = shape.len();
        let d = shape[rank - 1];
        let h = d / 2;
        let lead = &shape[..rank - 1];
        with_compute!(op, x.dtype(), |C| {
            let xd = dense::<C>(x)?;
            let cd = inputs[1].to_dtype(C::DTYPE)?;
            let sd = inputs[2].to_dtype(C::DTYPE)?;
            let (cstr, sst) = (broadcast_strides(&cd, shape), broadcast_strides(&sd, shape));
            let r = Reader::new(&[&xd, &cd, &sd]);
            let xs = elems::<C>(&r, &xd)?;
            let (cdat, sdat) = (r.data::<C>(&cd)?, r.data::<C>(&sd)?);
            let (cl, sl) = (cstr[rank - 1], sst[rank - 1]);
            let t = emit::<C>(&outputs[0], &device, &dev, |o| {
                par_rows(&dev, o, d, 2 * d, |row, os| {
                    let co = cd.offset() + lead_offset(row, lead, &cstr);
                    let so = sd.offset() + lead_offset(row, lead, &sst);
                    let xr = &xs[row * d..(row + 1) * d];
                    for j in 0..h {
                        let (a, z) = (xr[j], xr[j + h]);
                        os[j] = a * cdat[co + j * cl] - z * sdat[so + j * sl];
                        os[j + h] = z * cdat[co + (j + h) * cl] + a * sdat[so + (j + h) * sl];
                    }
                })
            })?;
            Ok(vec![t])
        })
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let dims = inputs[0].dims().to_vec();
        let rank = dims.len();
        let d = dims[rank - 1] as i64;
        let x = to_compute(b, &inputs[0]);
        let start = vec![0i64; rank];
        let mut mid = dims.iter().map(|&v| v as i64).collect::<Vec<_>>();
        let limit = mid.clone();
        mid[rank - 1] = d / 2;
        let mut mid_start = start.clone();
        mid_start[rank - 1] = d / 2;
        let ones = vec![1i64; rank];
        let x1 = b.slice(&x, &start, &mid, &ones);
        let x2 = b.slice(&x, &mid_start, &limit, &ones);
        let nx2 = b.ew("stablehlo.negate", &[&x2]);
        let rot = b.concatenate(&[&nx2, &x1], rank - 1);
        let c = to_compute(b, &inputs[1]);
        let c = b.broadcast_to(&c, &dims);
        let s = to_compute(b, &inputs[2]);
        let s = b.broadcast_to(&s, &dims);
        let xc = mul(b, &x, &c);
        let rs = mul(b, &rot, &s);
        let y = add(b, &xc, &rs);
        Ok(vec![b.convert(&y, outputs[0].dtype)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        grad::rotary(saved, grads)
    }
}

// ---- scaled dot-product attention -----------------------------------------------------------

/// Scaled dot-product attention over `[..., L, E]` queries and `[..., S, E]` keys and
/// `[..., S, Ev]` values, with grouped-query heads. Inputs: `q`, `k`, `v`, then the mask when
/// present (bool, true = attend; or additive of `q`'s dtype).
#[derive(Clone, Debug)]
pub struct Attention {
    /// Factor applied to `q · k`.
    pub scale: f64,
    /// Query `i` attends to keys `j <= i` only.
    pub causal: bool,
    /// Keys and values may have fewer heads (dim -3) than queries, dividing them.
    pub gqa: bool,
    /// A mask is given.
    pub mask: bool,
}

/// Query batches (leading dims, heads included), query heads and key heads.
fn attn_batches(q: &[usize], k: &[usize]) -> (usize, usize, usize) {
    let r = q.len();
    let b = q[..r - 2].iter().product();
    if r >= 3 {
        (b, q[r - 3], k[r - 3])
    } else {
        (b, 1, 1)
    }
}

/// Runs attention `a` into `o` (`[B, L, Ev]`): one task per block of query rows of a query
/// batch, on the device's pool when the work is large enough.
fn attn_run<C: simd_rows::Float>(
    dev: &CpuDevice,
    a: &simd_rows::Attn<'_, C>,
    o: &mut [C],
) -> Result<()> {
    let head = a.l * a.ev;
    if head == 0 || o.is_empty() {
        return Ok(());
    }
    let rows = simd_rows::ATTN_ROWS;
    let block = rows * a.ev;
    let work = (o.len() / a.ev).saturating_mul(a.s.max(1) * (a.e + a.ev).max(1));
    let tasks = (o.len() / head) * a.l.div_ceil(rows);
    if tasks <= 1 || dev.num_threads() <= 1 || work < PAR_THRESHOLD {
        for (bq, oh) in o.chunks_mut(head).enumerate() {
            for (qb, ob) in oh.chunks_mut(block).enumerate() {
                a.block(bq, qb * rows, ob);
            }
        }
        return Ok(());
    }
    dev.install(|| {
        o.par_chunks_mut(head).enumerate().for_each(|(bq, oh)| {
            oh.par_chunks_mut(block)
                .enumerate()
                .for_each(|(qb, ob)| a.block(bq, qb * rows, ob))
        })
    })
}

impl OpDef for Attention {
    fn name(&self) -> &'static str {
        "scaled_dot_product_attention"
    }

    fn attrs(&self) -> String {
        format!("{self:?}|{:?}", crate::ops::linalg::matmul_precision())
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.name();
        check_arity(op, inputs, 3 + self.mask as usize)?;
        let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
        check_float(op, q)?;
        check_dtype(op, "key", k, q.dtype)?;
        check_dtype(op, "value", v, q.dtype)?;
        let shapes = || {
            format!(
                "query {}, key {}, value {}",
                fmt_shape(&q.shape),
                fmt_shape(&k.shape),
                fmt_shape(&v.shape)
            )
        };
        let r = q.rank();
        if r < 2 || k.rank() != r || v.rank() != r {
            return Err(Error::shape(
                op,
                format!(
                    "expected query, key and value of one rank >= 2 ([..., L, E]), got {}",
                    shapes()
                ),
            ));
        }
        let (l, e, s, ev) = (
            q.shape[r - 2],
            q.shape[r - 1],
            k.shape[r - 2],
            v.shape[r - 1],
        );
        if k.shape[r - 1] != e || v.shape[r - 2] != s || k.shape[..r - 2] != v.shape[..r - 2] {
            return Err(Error::shape(
                op,
                format!(
                    "expected key [..., S, E] and value [..., S, Ev] for query [..., L, E], got {}",
                    shapes()
                ),
            ));
        }
        let grouped = self.gqa && r >= 3;
        let lead_ok = if grouped {
            let (hq, hk) = (q.shape[r - 3], k.shape[r - 3]);
            if hk == 0 || hq % hk != 0 {
                return Err(Error::shape(
                    op,
                    format!(
                        "expected the key/value heads (dim -3) to divide the query heads, got {}",
                        shapes()
                    ),
                ));
            }
            q.shape[..r - 3] == k.shape[..r - 3]
        } else {
            q.shape[..r - 2] == k.shape[..r - 2]
        };
        if !lead_ok {
            return Err(Error::shape(
                op,
                format!(
                    "expected key and value with the query's batch dims{}, got {}",
                    if self.gqa {
                        ""
                    } else {
                        " (enable_gqa allows fewer key/value heads)"
                    },
                    shapes()
                ),
            ));
        }
        if self.mask {
            let m = &inputs[3];
            if m.dtype != DType::Bool {
                check_dtype(op, "attn_mask", m, q.dtype)?;
            }
            if self.causal {
                return Err(Error::invalid_argument(
                    op,
                    "an explicit attn_mask must not be given with is_causal=true",
                ));
            }
            let mut full: Vec<usize> = q.shape[..r - 2].to_vec();
            full.extend([l, s]);
            let bs = broadcast_shapes(op, &full, &m.shape)?;
            if bs[..] != full[..] {
                return Err(Error::shape(
                    op,
                    format!(
                        "expected attn_mask broadcastable to {}, got {}",
                        fmt_shape(&full),
                        fmt_shape(&m.shape)
                    ),
                ));
            }
        }
        let mut out: Vec<usize> = q.shape[..r - 1].to_vec();
        out.push(ev);
        Ok(vec![Meta::new(&out, q.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let op = self.name();
        let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
        let (dev, device) = ctx(op, q)?;
        let qs = q.shape();
        let r = qs.len();
        let (l, e, s, ev) = (qs[r - 2], qs[r - 1], k.shape()[r - 2], v.shape()[r - 1]);
        let (_, hq, hk) = attn_batches(qs, k.shape());
        let causal = self.causal;
        let lead = &qs[..r - 2];
        with_compute!(op, q.dtype(), |C| {
            let (qd, kd, vd) = (dense::<C>(q)?, dense::<C>(k)?, dense::<C>(v)?);
            let mask = match inputs.get(3) {
                Some(m) if m.dtype() == DType::Bool => Some((*m).clone()),
                Some(m) => Some(m.to_dtype(C::DTYPE)?),
                None => None,
            };
            let mut full: Vec<usize> = lead.to_vec();
            full.extend([l, s]);
            let mst = mask.as_ref().map(|m| broadcast_strides(m, &full));
            let mut all = vec![&qd, &kd, &vd];
            all.extend(mask.iter());
            let rd = Reader::new(&all);
            let (qx, kx, vx) = (
                elems::<C>(&rd, &qd)?,
                elems::<C>(&rd, &kd)?,
                elems::<C>(&rd, &vd)?,
            );
            let bools = match &mask {
                Some(m) if m.dtype() == DType::Bool => Some(rd.data::<bool>(m)?),
                _ => None,
            };
            let adds = match &mask {
                Some(m) if m.dtype() != DType::Bool => Some(rd.data::<C>(m)?),
                _ => None,
            };
            let moff = mask.as_ref().map_or(0, |m| m.offset());
            let scale = C::from_f64(self.scale);
            let row_of = |bq: usize, i: usize| match &mst {
                Some(st) => moff + lead_offset(bq, lead, st) + i * st[r - 2],
                None => 0,
            };
            let vals = match (bools, adds) {
                (Some(b), _) => Some(simd_rows::MaskVals::Keep(b)),
                (None, Some(a)) => Some(simd_rows::MaskVals::Add(a)),
                _ => None,
            };
            let mask = vals.map(|vals| simd_rows::AttnMask {
                vals,
                row: &row_of,
                sj: mst.as_ref().map_or(0, |st| st[r - 1]),
            });
            let a = simd_rows::Attn {
                q: qx,
                k: kx,
                v: vx,
                l,
                s,
                e,
                ev,
                hq,
                hk,
                scale,
                causal,
                mask,
            };
            let t = emit_overwrite::<C>(&outputs[0], &device, &dev, |o| attn_run(&dev, &a, o))?;
            Ok(vec![t])
        })
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let qd = inputs[0].dims().to_vec();
        let kd = inputs[1].dims().to_vec();
        let r = qd.len();
        let (l, e, s, ev) = (qd[r - 2], qd[r - 1], kd[r - 2], inputs[2].dims()[r - 1]);
        let (bq, hq, hk) = attn_batches(&qd, &kd);
        let q = to_compute(b, &inputs[0]);
        let q = b.reshape(&q, &[bq, l, e]);
        // The queries are scaled before the product, as on the CPU (and as PyTorch scales q
        // and k): a product over an empty head dim is then exactly 0 whatever the scale, where
        // scaling the scores would give 0 * inf = NaN with the default 1 / sqrt(0).
        let scale = cst(b, &q, self.scale);
        let q = mul(b, &q, &scale);
        let outer = bq.checked_div(hq).unwrap_or(0);
        let mut kv = Vec::new();
        for (i, last) in [(1, e), (2, ev)] {
            let t = to_compute(b, &inputs[i]);
            let t = if hk != hq && hk > 0 {
                let t = b.reshape(&t, &[outer, hk, s, last]);
                let t = b.broadcast_in_dim(&t, &[0, 1, 3, 4], &[outer, hk, hq / hk, s, last]);
                b.reshape(&t, &[bq, s, last])
            } else {
                b.reshape(&t, &[bq, s, last])
            };
            kv.push(t);
        }
        let cdt = q.dtype();
        let scores_ty = crate::hlo::TensorType::new(&[bq, l, s], cdt);
        let sc = b.dot_general(
            &q,
            &kv[0],
            (&[0], &[0]),
            (&[2], &[2]),
            scores_ty,
            crate::ops::linalg::matmul_precision(),
        );
        let mut sc = sc;
        let ninf = cst(b, &sc, f64::NEG_INFINITY);
        if self.mask {
            let mut full: Vec<usize> = qd[..r - 2].to_vec();
            full.extend([l, s]);
            let m = b.broadcast_to(&inputs[3], &full);
            let m = b.reshape(&m, &[bq, l, s]);
            sc = if m.dtype() == DType::Bool {
                b.select(&m, &sc, &ninf)
            } else {
                let m = b.convert(&m, cdt);
                add(b, &sc, &m)
            };
        }
        if self.causal {
            let i = b.iota(&[bq, l, s], 1, DType::I64);
            let j = b.iota(&[bq, l, s], 2, DType::I64);
            let keep = b.compare(Cmp::Le, &j, &i);
            sc = b.select(&keep, &sc, &ninf);
        }
        let p = lower_softmax(b, &sc, 2, false, true);
        let out_ty = crate::hlo::TensorType::new(&[bq, l, ev], cdt);
        let y = b.dot_general(
            &p,
            &kv[1],
            (&[0], &[0]),
            (&[2], &[1]),
            out_ty,
            crate::ops::linalg::matmul_precision(),
        );
        let y = b.reshape(&y, &outputs[0].shape);
        Ok(vec![b.convert(&y, outputs[0].dtype)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        grad::attention(self, saved, grads)
    }
}

// ---- losses ---------------------------------------------------------------------------------

/// How a loss reduces its per-element values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// One loss per element (or per target position).
    None,
    /// The (weighted) mean.
    #[default]
    Mean,
    /// The sum.
    Sum,
}

/// PyTorch's default `ignore_index`.
pub const DEFAULT_IGNORE_INDEX: i64 = -100;

/// Cross entropy (from logits) or negative log-likelihood (from log-probabilities) of class
/// indices. Inputs: `input` (`[N, C, d...]` or `[C]`), `target` (i64, `[N, d...]` or `[]`),
/// then the class weights `[C]` when present.
#[derive(Clone, Debug)]
pub struct ClassLoss {
    /// The input holds logits (cross entropy) instead of log-probabilities (NLL).
    pub logits: bool,
    /// Reduction.
    pub reduction: Reduction,
    /// Targets equal to this contribute nothing (not even to the mean's denominator).
    pub ignore_index: i64,
    /// Label smoothing in `[0, 1]` (cross entropy only).
    pub label_smoothing: f64,
    /// Class weights are given.
    pub weight: bool,
}

/// `(N, C, inner)` of a class-loss input.
fn class_layout(shape: &[usize]) -> (usize, usize, usize) {
    if shape.len() == 1 {
        (1, shape[0], 1)
    } else {
        (shape[0], shape[1], shape[2..].iter().product())
    }
}

/// Per target position of one sample: `[nll, smoothing term, target weight]`, zeros where
/// ignored.
#[allow(clippy::too_many_arguments)]
fn class_slab<C: Real>(
    x: &[C],
    tgt: &[i64],
    classes: usize,
    logits: bool,
    ignore: i64,
    w: Option<&[f64]>,
    smoothing: bool,
    out: &mut [[f64; 3]],
) {
    let inner = tgt.len();
    let lse: Vec<f64> = if logits {
        let mut m = vec![C::NEG_INF; inner];
        for c in 0..classes {
            for (mm, &v) in m.iter_mut().zip(&x[c * inner..(c + 1) * inner]) {
                if v > *mm {
                    *mm = v;
                }
            }
        }
        let mut s = vec![0f64; inner];
        for c in 0..classes {
            for d in 0..inner {
                s[d] += (x[c * inner + d] - m[d]).exp().to_f64();
            }
        }
        m.iter().zip(&s).map(|(m, s)| m.to_f64() + s.ln()).collect()
    } else {
        vec![0.0; inner]
    };
    for d in 0..inner {
        let t = tgt[d];
        out[d] = if t == ignore {
            [0.0; 3]
        } else {
            let wt = w.map_or(1.0, |w| w[t as usize]);
            let lp = x[t as usize * inner + d].to_f64() - lse[d];
            [-wt * lp, 0.0, wt]
        };
    }
    if smoothing {
        let mut acc = vec![0f64; inner];
        for c in 0..classes {
            let wc = w.map_or(1.0, |w| w[c]);
            for d in 0..inner {
                acc[d] += wc * (x[c * inner + d].to_f64() - lse[d]);
            }
        }
        for d in 0..inner {
            if tgt[d] != ignore {
                out[d][1] = -acc[d];
            }
        }
    }
}

impl OpDef for ClassLoss {
    fn name(&self) -> &'static str {
        if self.logits {
            "cross_entropy"
        } else {
            "nll_loss"
        }
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.name();
        check_arity(op, inputs, 2 + self.weight as usize)?;
        let (x, t) = (&inputs[0], &inputs[1]);
        check_float(op, x)?;
        check_dtype(op, "target", t, DType::I64)?;
        if x.rank() == 0 {
            return Err(Error::shape(
                op,
                "expected an input of shape [N, C, d...] or [C], got []",
            ));
        }
        let want: Vec<usize> = if x.rank() == 1 {
            vec![]
        } else {
            std::iter::once(x.shape[0])
                .chain(x.shape[2..].iter().copied())
                .collect()
        };
        if t.shape[..] != want[..] {
            return Err(Error::shape(
                op,
                format!(
                    "expected a target of shape {} for an input of shape {}, got {}",
                    fmt_shape(&want),
                    fmt_shape(&x.shape),
                    fmt_shape(&t.shape)
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.label_smoothing) {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "expected label_smoothing in [0, 1], got {}",
                    self.label_smoothing
                ),
            ));
        }
        let classes = class_layout(&x.shape).1;
        if let Some(w) = inputs.get(2) {
            check_param(op, "weight", w, &[classes], x.dtype)?;
        }
        let out: Vec<usize> = if self.reduction == Reduction::None {
            want
        } else {
            vec![]
        };
        Ok(vec![Meta::new(&out, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let op = self.name();
        let (x, target) = (inputs[0], inputs[1].contiguous()?);
        let (dev, device) = ctx(op, x)?;
        let (n, classes, inner) = class_layout(x.shape());
        let tgt: Vec<i64> = {
            let r = Reader::new(&[&target]);
            r.data::<i64>(&target)?
                .get(target.offset()..target.offset() + target.numel())
                .ok_or_else(|| Error::invalid_argument(op, "target outside its storage"))?
                .to_vec()
        };
        let ignore = self.ignore_index;
        if let Some(&bad) = tgt
            .iter()
            .find(|&&t| t != ignore && (t < 0 || t as usize >= classes))
        {
            return Err(Error::IndexOutOfRange {
                op: op.into(),
                index: bad,
                dim: if x.rank() == 1 { 0 } else { 1 },
                size: classes,
                shape: x.shape().to_vec(),
            });
        }
        let weights: Option<Vec<f64>> = inputs
            .get(2)
            .map(|w| w.to_dtype(DType::F64)?.to_vec::<f64>())
            .transpose()?;
        let eps = self.label_smoothing;
        let (logits, smoothing) = (self.logits, self.logits && eps > 0.0);
        let reduction = self.reduction;
        with_compute!(op, x.dtype(), |C| {
            let xd = dense::<C>(x)?;
            let r = Reader::new(&[&xd]);
            let xs = elems::<C>(&r, &xd)?;
            // Three sums per target: more than the (possibly scalar) output, so checked.
            let mut per = try_host_vec(n * inner, [0f64; 3], || {
                format!("{op} scratch for {} targets", n * inner)
            })?;
            let slab = classes * inner;
            par_rows(&dev, &mut per, inner, 3 * slab, |i, out| {
                class_slab(
                    &xs[i * slab..(i + 1) * slab],
                    &tgt[i * inner..(i + 1) * inner],
                    classes,
                    logits,
                    ignore,
                    weights.as_deref(),
                    smoothing,
                    out,
                )
            })?;
            let mix = |nll: f64, sm: f64| {
                if smoothing {
                    (1.0 - eps) * nll + sm * (eps / classes as f64)
                } else {
                    nll
                }
            };
            let t = emit::<C>(&outputs[0], &device, &dev, |o| {
                match reduction {
                    Reduction::None => {
                        for (o, p) in o.iter_mut().zip(&per) {
                            *o = C::from_f64(mix(p[0], p[1]));
                        }
                    }
                    _ => {
                        let (mut a, mut sm, mut w) = (0.0, 0.0, 0.0);
                        for p in &per {
                            a += p[0];
                            sm += p[1];
                            w += p[2];
                        }
                        o[0] = C::from_f64(if reduction == Reduction::Mean {
                            mix(a / w, sm / w)
                        } else {
                            mix(a, sm)
                        });
                    }
                }
                Ok(())
            })?;
            Ok(vec![t])
        })
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let xshape = inputs[0].dims().to_vec();
        let (n, classes, inner) = class_layout(&xshape);
        let x = to_compute(b, &inputs[0]);
        let x = b.reshape(&x, &[n, classes, inner]);
        let dims = [n, classes, inner];
        let lp = if self.logits {
            lower_softmax(b, &x, 1, true, false)
        } else {
            x
        };
        let t = b.reshape(&inputs[1], &[n, inner]);
        let ci = b.iota(&dims, 1, DType::I64);
        let tb = b.broadcast_in_dim(&t, &[0, 2], &dims);
        let hot = b.compare(Cmp::Eq, &ci, &tb);
        let zero3 = cst(b, &lp, 0.0);
        let picked = b.select(&hot, &lp, &zero3);
        let lpt = lower_sum(b, &picked, &[1]);
        let ign = b.splat(t.ty.clone(), self.ignore_index);
        let valid = b.compare(Cmp::Ne, &t, &ign);
        let zero2 = cst(b, &lpt, 0.0);
        let wfull = inputs.get(2).map(|w| {
            let w = to_compute(b, w);
            b.broadcast_in_dim(&w, &[1], &dims)
        });
        let wt = match &wfull {
            Some(wf) => {
                let sel = b.select(&hot, wf, &zero3);
                lower_sum(b, &sel, &[1])
            }
            None => cst(b, &lpt, 1.0),
        };
        let wt = b.select(&valid, &wt, &zero2);
        let prod = mul(b, &wt, &lpt);
        let nll = b.ew("stablehlo.negate", &[&prod]);
        let nll = b.select(&valid, &nll, &zero2);
        let eps = self.label_smoothing;
        let smooth = if self.logits && eps > 0.0 {
            let terms = match &wfull {
                Some(wf) => mul(b, &lp, wf),
                None => lp.clone(),
            };
            let s = lower_sum(b, &terms, &[1]);
            let s = b.ew("stablehlo.negate", &[&s]);
            Some(b.select(&valid, &s, &zero2))
        } else {
            None
        };
        let mix = |b: &mut FnBuilder, nll: &Value, sm: &Option<Value>| match sm {
            Some(sm) => {
                let a = cst(b, nll, 1.0 - eps);
                let c = cst(b, nll, eps / classes as f64);
                let x = mul(b, &a, nll);
                let y = mul(b, &c, sm);
                add(b, &x, &y)
            }
            None => nll.clone(),
        };
        let y = match self.reduction {
            Reduction::None => {
                let y = mix(b, &nll, &smooth);
                b.reshape(&y, &outputs[0].shape)
            }
            red => {
                let mut a = lower_sum(b, &nll, &[0, 1]);
                let mut sm = smooth.map(|s| lower_sum(b, &s, &[0, 1]));
                if red == Reduction::Mean {
                    let w = lower_sum(b, &wt, &[0, 1]);
                    a = div(b, &a, &w);
                    sm = sm.map(|s| div(b, &s, &w));
                }
                mix(b, &a, &sm)
            }
        };
        Ok(vec![b.convert(&y, outputs[0].dtype)])
    }

    fn lower_checks(
        &self,
        b: &mut FnBuilder,
        inputs: &[Value],
        _outputs: &[Meta],
    ) -> Result<Vec<DeviceCheck>> {
        let shape = inputs[0].dims().to_vec();
        let classes = class_layout(&shape).1;
        let dim = if shape.len() == 1 { 0 } else { 1 };
        let check =
            crate::hlo::checks::index_in_range(b, &inputs[1], classes, Some(self.ignore_index));
        Ok(check
            .map(|value| DeviceCheck {
                value,
                error: crate::hlo::checks::index_error(self.name(), dim, classes, &shape),
            })
            .into_iter()
            .collect())
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        grad::class_loss(self, saved, grads)
    }
}

/// Which elementwise loss a [`PointLoss`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointKind {
    /// `(input - target)^2`.
    Mse,
    /// Binary cross entropy of logits: `-w [p t log σ(x) + (1 - t) log(1 - σ(x))]`.
    BceWithLogits,
}

/// An elementwise loss with a reduction. Inputs: `input`, `target` (same shape), then `weight`
/// and `pos_weight` (broadcastable to the input) when present.
#[derive(Clone, Debug)]
pub struct PointLoss {
    /// Which loss.
    pub kind: PointKind,
    /// Reduction.
    pub reduction: Reduction,
    /// A weight is given (BCE only).
    pub weight: bool,
    /// A positive-class weight is given (BCE only).
    pub pos_weight: bool,
}

const SUM_CHUNK: usize = 1 << 14;

#[inline]
fn bce<C: Real>(x: C, t: C, w: C, pw: C) -> C {
    let neg = if x < C::ZERO { x } else { C::ZERO };
    let log_sig = (neg - (-x.abs()).exp().ln_1p()) * ((pw - C::ONE) * t + C::ONE);
    ((C::ONE - t) * x - log_sig) * w
}

impl OpDef for PointLoss {
    fn name(&self) -> &'static str {
        match self.kind {
            PointKind::Mse => "mse_loss",
            PointKind::BceWithLogits => "binary_cross_entropy_with_logits",
        }
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.name();
        check_arity(
            op,
            inputs,
            2 + self.weight as usize + self.pos_weight as usize,
        )?;
        let (x, t) = (&inputs[0], &inputs[1]);
        check_float(op, x)?;
        check_dtype(op, "target", t, x.dtype)?;
        if t.shape != x.shape {
            return Err(Error::shape(
                op,
                format!(
                    "expected a target of the input's shape {}, got {}",
                    fmt_shape(&x.shape),
                    fmt_shape(&t.shape)
                ),
            ));
        }
        let mut i = 2;
        for (present, what) in [(self.weight, "weight"), (self.pos_weight, "pos_weight")] {
            if let Some(m) = take(inputs, present, &mut i) {
                check_dtype(op, what, m, x.dtype)?;
                let s = broadcast_shapes(op, &x.shape, &m.shape)?;
                if s != x.shape {
                    return Err(Error::shape(
                        op,
                        format!(
                            "expected {what} broadcastable to the input's shape {}, got {}",
                            fmt_shape(&x.shape),
                            fmt_shape(&m.shape)
                        ),
                    ));
                }
            }
        }
        let out: &[usize] = if self.reduction == Reduction::None {
            &x.shape
        } else {
            &[]
        };
        Ok(vec![Meta::new(out, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let op = self.name();
        let x = inputs[0];
        let (dev, device) = ctx(op, x)?;
        let shape = x.shape();
        let mut i = 2;
        let w = take(inputs, self.weight, &mut i).copied();
        let pw = take(inputs, self.pos_weight, &mut i).copied();
        let (kind, reduction) = (self.kind, self.reduction);
        with_compute!(op, x.dtype(), |C| {
            let conv = |t: Option<&Tensor>| t.map(|t| t.to_dtype(C::DTYPE)).transpose();
            let ops: [Option<Tensor>; 4] = [
                Some(x.to_dtype(C::DTYPE)?),
                Some(inputs[1].to_dtype(C::DTYPE)?),
                conv(w)?,
                conv(pw)?,
            ];
            let all: Vec<&Tensor> = ops.iter().flatten().collect();
            let r = Reader::new(&all);
            let one = [C::ONE];
            let zeros = vec![0usize; shape.len()];
            let mut data: [&[C]; 4] = [&one; 4];
            let mut strides: [tpu_tensor::Dims; 4] = std::array::from_fn(|_| zeros[..].into());
            let mut offsets = [0usize; 4];
            for (k, t) in ops.iter().enumerate() {
                if let Some(t) = t {
                    data[k] = r.data::<C>(t)?;
                    strides[k] = broadcast_strides(t, shape);
                    offsets[k] = t.offset();
                }
            }
            let walk = MultiWalk::<4>::new(
                shape,
                [
                    &strides[0][..],
                    &strides[1][..],
                    &strides[2][..],
                    &strides[3][..],
                ],
                offsets,
            );
            let f = |a: C, b: C, c: C, d: C| match kind {
                PointKind::Mse => (a - b) * (a - b),
                PointKind::BceWithLogits => bce(a, b, c, d),
            };
            let at = |off: [usize; 4], st: [usize; 4], j: usize| {
                f(
                    data[0][off[0] + j * st[0]],
                    data[1][off[1] + j * st[1]],
                    data[2][off[2] + j * st[2]],
                    data[3][off[3] + j * st[3]],
                )
            };
            let numel = walk.numel();
            let t = emit::<C>(&outputs[0], &device, &dev, |o| {
                if reduction == Reduction::None {
                    return crate::cpu::kernels::par_chunks(&dev, o, |chunk, base| {
                        walk.spans(base, base + chunk.len(), |start, len, off, st| {
                            for j in 0..len {
                                chunk[start - base + j] = at(off, st, j);
                            }
                        })
                    });
                }
                // Fixed chunks summed in order: the result does not depend on the threads.
                let parts = par_map(&dev, numel.div_ceil(SUM_CHUNK), SUM_CHUNK, |c| {
                    let mut acc = 0f64;
                    let hi = ((c + 1) * SUM_CHUNK).min(numel);
                    walk.spans(c * SUM_CHUNK, hi, |_, len, off, st| {
                        for j in 0..len {
                            acc += at(off, st, j).to_f64();
                        }
                    });
                    acc
                })?;
                let total: f64 = parts.iter().sum();
                o[0] = C::from_f64(if reduction == Reduction::Mean {
                    total / numel as f64
                } else {
                    total
                });
                Ok(())
            })?;
            Ok(vec![t])
        })
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let dims = inputs[0].dims().to_vec();
        let x = to_compute(b, &inputs[0]);
        let t = to_compute(b, &inputs[1]);
        let loss = match self.kind {
            PointKind::Mse => {
                let d = sub(b, &x, &t);
                mul(b, &d, &d)
            }
            PointKind::BceWithLogits => {
                let mut i = 2;
                let w = take(inputs, self.weight, &mut i).map(|v| {
                    let v = to_compute(b, v);
                    b.broadcast_to(&v, &dims)
                });
                let pw = take(inputs, self.pos_weight, &mut i).map(|v| {
                    let v = to_compute(b, v);
                    b.broadcast_to(&v, &dims)
                });
                let zero = cst(b, &x, 0.0);
                let one = cst(b, &x, 1.0);
                let neg = b.extreme(&x, &zero, false);
                let ax = b.ew("stablehlo.abs", &[&x]);
                let nax = b.ew("stablehlo.negate", &[&ax]);
                let ex = b.ew("stablehlo.exponential", &[&nax]);
                let lp = b.ew("stablehlo.log_plus_one", &[&ex]);
                let mut log_sig = sub(b, &neg, &lp);
                if let Some(pw) = &pw {
                    let pm = sub(b, pw, &one);
                    let pt = mul(b, &pm, &t);
                    let lw = add(b, &pt, &one);
                    log_sig = mul(b, &log_sig, &lw);
                }
                let omt = sub(b, &one, &t);
                let a = mul(b, &omt, &x);
                let mut loss = sub(b, &a, &log_sig);
                if let Some(w) = &w {
                    loss = mul(b, &loss, w);
                }
                loss
            }
        };
        let all: Vec<usize> = (0..dims.len()).collect();
        let y = match self.reduction {
            Reduction::None => loss,
            Reduction::Sum => lower_sum(b, &loss, &all),
            Reduction::Mean => {
                let s = lower_sum(b, &loss, &all);
                let n = cst(b, &s, dims.iter().product::<usize>() as f64);
                div(b, &s, &n)
            }
        };
        Ok(vec![b.convert(&y, outputs[0].dtype)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        grad::point_loss(self, saved, grads)
    }
}

// ---- backward rules -------------------------------------------------------------------------

/// The backward rules of this file's ops, written with ops so that they run on the device the
/// forward ran on (PyTorch's formulas). They live in their own module because `Tensor` also
/// implements `std::ops::{Add, Mul, ..}`, which the parent imports for the kernels' compute
/// types: with both in scope `x.add(&y)` would be ambiguous.
///
/// Every rule computes in the compute dtype (f32 for the 16-bit floats, as the forward kernels
/// do); autograd casts each gradient back to its input's dtype.
mod grad {
    use tpu_tensor::{DType, Error, Result, Tensor};

    use super::{
        Attention, BatchNorm, ClassLoss, Dropout, Norm, NormKind, PointKind, PointLoss, Reduction,
        Softmax, attn_batches, class_layout, take,
    };
    use crate::TensorOps;
    use crate::autograd::Saved;
    use crate::op::promote::compute_dtype;
    use crate::ops::linalg::LinalgOps;
    use crate::ops::movement::{MovementOps, cat};
    use crate::ops::reduce::ReduceOps;

    type Grads = Result<Vec<Option<Tensor>>>;

    /// `t` in the dtype backward rules compute in.
    fn up(t: &Tensor) -> Result<Tensor> {
        t.to(compute_dtype(t.dtype()))
    }

    /// `dims` as the i64 dims reductions take.
    fn dims_i64(dims: impl IntoIterator<Item = usize>) -> Vec<i64> {
        dims.into_iter().map(|d| d as i64).collect()
    }

    /// Sums `t` over `dims`; no dims leaves it as it is (an empty list would mean "all dims" to
    /// a reduction).
    fn sum_over(t: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        if dims.is_empty() {
            Ok(t.clone())
        } else {
            t.sum(dims, keepdim)
        }
    }

    /// The mean over `dims`, keeping them (see [`sum_over`]).
    fn mean_over(t: &Tensor, dims: &[i64]) -> Result<Tensor> {
        if dims.is_empty() {
            Ok(t.clone())
        } else {
            t.mean(dims, true)
        }
    }

    /// The incoming gradient of output 0, or `None` when it is zero.
    fn first(grads: &[Option<Tensor>]) -> Option<&Tensor> {
        grads.first().and_then(Option::as_ref)
    }

    // ---- softmax ----------------------------------------------------------------------------

    pub(super) fn softmax(op: &Softmax, saved: &Saved, grads: &[Option<Tensor>]) -> Grads {
        let Some(g) = first(grads) else {
            return Ok(vec![None]);
        };
        let y = &saved.outputs[0];
        let shape = y.shape().to_vec();
        // A 0-dim input is softmaxed as one row of one element.
        let flat = |t: &Tensor| -> Result<Tensor> {
            let t = up(t)?;
            if shape.is_empty() {
                t.reshape([1])
            } else {
                Ok(t)
            }
        };
        let (y, g) = (flat(y)?, flat(g)?);
        let d = [op.dim as i64];
        let gx = if op.log {
            // y = x - lse(x): dx = g - softmax(x) * sum(g).
            g.sub(&y.exp()?.mul(&g.sum(&d, true)?)?)?
        } else {
            // dx = y * (g - sum(g * y)).
            y.mul(&g.sub(&g.mul(&y)?.sum(&d, true)?)?)?
        };
        Ok(vec![Some(gx.reshape(&shape)?)])
    }

    // ---- layer, RMS and group norm ----------------------------------------------------------

    /// `(xhat, rstd)` of `x` normalised over its last dim: `xhat = (x - mean) * rstd` (or
    /// `x * rstd` for RMS), recomputed from the saved input as PyTorch's kernels do from the
    /// saved statistics.
    fn normalize_last(x: &Tensor, rms: bool, eps: f64) -> Result<(Tensor, Tensor)> {
        let xc = if rms {
            x.clone()
        } else {
            x.sub(&x.mean(&[-1], true)?)?
        };
        let rstd = xc.square()?.mean(&[-1], true)?.add(eps)?.rsqrt()?;
        Ok((xc.mul(&rstd)?, rstd))
    }

    /// The input gradient of a normalisation from `gy` (the gradient of `xhat`), `xhat` and
    /// `rstd`, with means over `dims`: `rstd * (gy - mean(gy) - xhat * mean(gy * xhat))`; RMS
    /// norm has no mean to subtract.
    fn norm_input_grad(
        gy: &Tensor,
        xhat: &Tensor,
        rstd: &Tensor,
        dims: &[i64],
        centered: bool,
    ) -> Result<Tensor> {
        let proj = xhat.mul(&mean_over(&gy.mul(xhat)?, dims)?)?;
        let mut inner = gy.sub(&proj)?;
        if centered {
            inner = inner.sub(&mean_over(gy, dims)?)?;
        }
        inner.mul(rstd)
    }

    pub(super) fn norm(op: &Norm, saved: &Saved, grads: &[Option<Tensor>]) -> Grads {
        let n_in = saved.inputs.len();
        let Some(g) = first(grads) else {
            return Ok(vec![None; n_in]);
        };
        let x = up(&saved.inputs[0])?;
        let g = up(g)?;
        let shape = x.shape().to_vec();
        let rank = shape.len();
        let mut i = 1;
        let w = take(&saved.inputs, op.weight, &mut i).map(up).transpose()?;
        let (row_len, _, groups) = op.layout(&shape);
        // Statistics are per row of `stat_shape`'s last dim; the parameters follow `pshape`
        // (the normalised trailing dims, or `[C, 1, ..]` per channel for group norm) and their
        // gradients sum over `pdims`.
        let (stat_shape, pshape, pdims): (Vec<usize>, Vec<usize>, Vec<i64>) = match op.kind {
            NormKind::Group(_) => {
                let mut ps = vec![shape[1]];
                ps.resize(rank - 1, 1);
                let pdims = dims_i64(std::iter::once(0).chain(2..rank));
                (vec![shape[0], groups, row_len], ps, pdims)
            }
            _ => {
                let rows = shape.iter().product::<usize>().checked_div(row_len);
                let lead = rank - op.normalized.len();
                (
                    vec![rows.unwrap_or(0), row_len],
                    op.normalized.clone(),
                    dims_i64(0..lead),
                )
            }
        };
        let (xhat, rstd) =
            normalize_last(&x.reshape(&stat_shape)?, op.kind == NormKind::Rms, op.eps)?;
        let gy = match &w {
            Some(w) => g.mul(&w.reshape(&pshape)?)?,
            None => g.clone(),
        };
        let gx = norm_input_grad(
            &gy.reshape(&stat_shape)?,
            &xhat,
            &rstd,
            &[-1],
            op.kind != NormKind::Rms,
        )?
        .reshape(&shape)?;
        let xhat = xhat.reshape(&shape)?;
        let param_shape = |t: Tensor| -> Result<Tensor> {
            let s = sum_over(&t, &pdims, false)?;
            match op.kind {
                NormKind::Group(_) => s.reshape([shape[1]]),
                _ => s.reshape(&op.normalized),
            }
        };
        let mut out = vec![Some(gx)];
        if op.weight {
            out.push(Some(param_shape(g.mul(&xhat)?)?));
        }
        if op.bias {
            out.push(Some(param_shape(g.clone())?));
        }
        Ok(out)
    }

    // ---- batch norm -------------------------------------------------------------------------

    pub(super) fn batch_norm(op: &BatchNorm, saved: &Saved, grads: &[Option<Tensor>]) -> Grads {
        let n_in = saved.inputs.len();
        let g = first(grads).map(up).transpose()?;
        // In training with running stats, outputs 1 and 2 are the updated running mean and
        // variance; gradients reaching them (nothing does in PyTorch, where the update is an
        // in-place buffer write) flow back exactly.
        let g_rm = grads.get(1).and_then(Option::as_ref).map(up).transpose()?;
        let g_rv = grads.get(2).and_then(Option::as_ref).map(up).transpose()?;
        if g.is_none() && g_rm.is_none() && g_rv.is_none() {
            return Ok(vec![None; n_in]);
        }
        let x = up(&saved.inputs[0])?;
        let shape = x.shape().to_vec();
        let rank = shape.len();
        let ch = shape[1];
        let count = x.numel() / ch.max(1);
        let red = dims_i64(std::iter::once(0).chain(2..rank));
        let mut pshape = vec![1, ch];
        pshape.resize(rank, 1);
        let mut i = 1;
        let per_channel = |t: &Tensor| up(t)?.reshape(&pshape);
        let rm = take(&saved.inputs, op.running, &mut i);
        let rv = take(&saved.inputs, op.running, &mut i);
        let w = take(&saved.inputs, op.weight, &mut i)
            .map(per_channel)
            .transpose()?;
        let (xc, rstd) = if op.training {
            let xc = x.sub(&x.mean(&red, true)?)?;
            let var = xc.square()?.mean(&red, true)?;
            (xc, var.add(op.eps)?.rsqrt()?)
        } else {
            let (rm, rv) = rm.zip(rv).ok_or_else(|| {
                Error::invalid_argument(
                    "batch_norm backward",
                    "running stats are required in evaluation mode",
                )
            })?;
            let rstd = per_channel(rv)?.add(op.eps)?.rsqrt()?;
            (x.sub(&per_channel(rm)?)?, rstd)
        };
        let xhat = xc.mul(&rstd)?;
        let to_c = |t: &Tensor| t.sum(&red, false)?.reshape([ch]);
        let mut gx: Option<Tensor> = None;
        let mut gw = None;
        let mut gb = None;
        if let Some(g) = &g {
            let gy = match &w {
                Some(w) => g.mul(w)?,
                None => g.clone(),
            };
            gx = Some(if op.training {
                // Through the batch statistics too.
                norm_input_grad(&gy, &xhat, &rstd, &red, true)?
            } else {
                // The running statistics are constants here.
                gy.mul(&rstd)?
            });
            if op.weight {
                gw = Some(to_c(&g.mul(&xhat)?)?);
            }
            if op.bias {
                gb = Some(to_c(g)?);
            }
        }
        // new_mean = m * mean + (1 - m) * running_mean, new_var = m * var * n / (n - 1) +
        // (1 - m) * running_var, with the batch's biased `var`.
        let m = op.momentum;
        let mut grm = None;
        let mut grv = None;
        let add_to = |acc: Option<Tensor>, t: Tensor| -> Result<Option<Tensor>> {
            Ok(Some(match acc {
                Some(a) => a.add(&t)?,
                None => t,
            }))
        };
        if let Some(gm) = &g_rm {
            let part = gm.reshape(&pshape)?.mul(m / count as f64)?;
            // Materialised at the input's shape: autograd only sums gradients down.
            let full = Tensor::zeros(&shape[..], x.dtype(), x.device())?.add(&part)?;
            gx = add_to(gx, full)?;
            grm = Some(gm.mul(1.0 - m)?);
        }
        if let Some(gv) = &g_rv {
            let unbias = count as f64 / (count as f64 - 1.0);
            let k = 2.0 * m * unbias / count as f64;
            gx = add_to(gx, xc.mul(&gv.reshape(&pshape)?)?.mul(k)?)?;
            grv = Some(gv.mul(1.0 - m)?);
        }
        let mut out = vec![gx];
        if op.running {
            out.push(grm);
            out.push(grv);
        }
        if op.weight {
            out.push(gw);
        }
        if op.bias {
            out.push(gb);
        }
        Ok(out)
    }

    // ---- dropout ----------------------------------------------------------------------------

    pub(super) fn dropout(op: &Dropout, saved: &Saved, grads: &[Option<Tensor>]) -> Grads {
        let Some(g) = first(grads) else {
            return Ok(vec![None, None]);
        };
        // The same mask and scale: dropout is linear in x. The mask gets no gradient.
        let gx = crate::exec::dispatch::run1(op, &[g, &saved.inputs[1]])?;
        Ok(vec![Some(gx), None])
    }

    // ---- rotary embedding -------------------------------------------------------------------

    /// `cat(-u[..., D/2:], u[..., :D/2])`. As a matrix it is antisymmetric, so its transpose is
    /// its negation.
    fn rotate_half(u: &Tensor) -> Result<Tensor> {
        let d = u.shape().last().copied().unwrap_or(0);
        let h = d / 2;
        let a = u.narrow(-1, 0, h)?;
        let b = u.narrow(-1, h as i64, h)?;
        cat(&[&b.neg()?, &a], -1)
    }

    pub(super) fn rotary(saved: &Saved, grads: &[Option<Tensor>]) -> Grads {
        let Some(g) = first(grads) else {
            return Ok(vec![None, None, None]);
        };
        let g = up(g)?;
        let x = up(&saved.inputs[0])?;
        let cos = up(&saved.inputs[1])?;
        let sin = up(&saved.inputs[2])?;
        // y = x cos + R x sin with R antisymmetric: dx = g cos - R (g sin); the tables get
        // g x and g R x, which autograd sums down to their broadcast shapes.
        let gx = g.mul(&cos)?.sub(&rotate_half(&g.mul(&sin)?)?)?;
        let gcos = g.mul(&x)?;
        let gsin = g.mul(&rotate_half(&x)?)?;
        Ok(vec![Some(gx), Some(gcos), Some(gsin)])
    }

    // ---- scaled dot-product attention -------------------------------------------------------

    pub(super) fn attention(op: &Attention, saved: &Saved, grads: &[Option<Tensor>]) -> Grads {
        let n_in = saved.inputs.len();
        let Some(g) = first(grads) else {
            return Ok(vec![None; n_in]);
        };
        let (q, k, v) = (
            up(&saved.inputs[0])?,
            up(&saved.inputs[1])?,
            up(&saved.inputs[2])?,
        );
        let g = up(g)?;
        let qs = q.shape().to_vec();
        let ks = k.shape().to_vec();
        let r = qs.len();
        let (l, e, s, ev) = (qs[r - 2], qs[r - 1], ks[r - 2], v.shape()[r - 1]);
        let (bq, hq, hk) = attn_batches(&qs, &ks);
        let mask = saved.inputs.get(3);
        let float_mask = mask.is_some_and(|m| m.dtype() != DType::Bool);
        if bq == 0 || l == 0 || s == 0 {
            // No query or no key: nothing is attended to and every gradient is zero.
            let mut out = vec![
                Some(q.zeros_like()?),
                Some(k.zeros_like()?),
                Some(v.zeros_like()?),
            ];
            if let Some(m) = mask {
                out.push(if float_mask {
                    Some(up(m)?.zeros_like()?)
                } else {
                    None
                });
            }
            return Ok(out);
        }
        let outer = bq / hq.max(1);
        let rep = if hk > 0 && hk != hq { hq / hk } else { 1 };
        // Keys and values per query batch: grouped heads repeat each key/value head `rep`
        // times, as the forward reads them.
        let per_query = |t: &Tensor, last: usize| -> Result<Tensor> {
            if rep > 1 {
                t.reshape([outer, hk, 1, s, last])?
                    .expand([outer, hk, rep, s, last])?
                    .reshape([bq, s, last])
            } else {
                t.reshape([bq, s, last])
            }
        };
        let q3 = q.reshape([bq, l, e])?;
        let k3 = per_query(&k, e)?;
        let v3 = per_query(&v, ev)?;
        // Recompute the attention weights (PyTorch's math backend saves them; recomputing
        // keeps the forward free of them, as flash attention does), from the scaled queries
        // as the forward: an empty head dim gives scores of exactly 0, not 0 * inf.
        let qs3 = q3.mul(op.scale)?;
        let mut sc = qs3.bmm(&k3.transpose(1, 2)?)?;
        let mut full: Vec<usize> = qs[..r - 2].to_vec();
        full.extend([l, s]);
        if let Some(m) = mask {
            let m3 = |t: &Tensor| t.broadcast_to(&full)?.reshape([bq, l, s]);
            sc = if m.dtype() == DType::Bool {
                sc.masked_fill(&m3(m)?.logical_not()?, f64::NEG_INFINITY)?
            } else {
                sc.add(&m3(&up(m)?)?)?
            };
        }
        if op.causal {
            let dev = q.device();
            let i = Tensor::arange(0i64, l as i64, 1i64, DType::I64, dev)?.reshape([l, 1])?;
            let j = Tensor::arange(0i64, s as i64, 1i64, DType::I64, dev)?.reshape([1, s])?;
            sc = sc.masked_fill(&j.gt(&i)?, f64::NEG_INFINITY)?;
        }
        // Rows with nothing to attend to gave zeros; their weights are zeros too.
        let empty = sc.amax(&[-1], true)?.eq(f64::NEG_INFINITY)?;
        let p = super::functional::softmax(&sc.masked_fill(&empty, 0.0)?, -1)?
            .masked_fill(&empty, 0.0)?;
        let g3 = g.reshape([bq, l, ev])?;
        let dv3 = p.transpose(1, 2)?.bmm(&g3)?;
        let dp = g3.bmm(&v3.transpose(1, 2)?)?;
        // Softmax backward: ds = p * (dp - sum(p * dp)).
        let ds = p.mul(&dp.sub(&p.mul(&dp)?.sum(&[-1], true)?)?)?;
        let dq = ds.bmm(&k3)?.mul(op.scale)?.reshape(&qs)?;
        let dk3 = ds.transpose(1, 2)?.bmm(&qs3)?;
        // Grouped heads: each key/value head sums the gradients of the query heads it served.
        let back = |t: Tensor, like: &[usize], last: usize| -> Result<Tensor> {
            if rep > 1 {
                t.reshape([outer, hk, rep, s, last])?
                    .sum(&[2], false)?
                    .reshape(like)
            } else {
                t.reshape(like)
            }
        };
        let dk = back(dk3, &ks, e)?;
        let dv = back(dv3, v.shape(), ev)?;
        let mut out = vec![Some(dq), Some(dk), Some(dv)];
        if mask.is_some() {
            // An additive mask adds to the scores: it gets their gradient, which autograd sums
            // down to the mask's broadcast shape. A bool mask gets none.
            out.push(if float_mask {
                Some(ds.reshape(&full)?)
            } else {
                None
            });
        }
        Ok(out)
    }

    // ---- losses -----------------------------------------------------------------------------

    pub(super) fn class_loss(op: &ClassLoss, saved: &Saved, grads: &[Option<Tensor>]) -> Grads {
        let n_in = saved.inputs.len();
        let Some(g) = first(grads) else {
            return Ok(vec![None; n_in]);
        };
        let g = up(g)?;
        let xshape = saved.inputs[0].shape().to_vec();
        let (n, classes, inner) = class_layout(&xshape);
        let x = up(&saved.inputs[0])?.reshape([n, classes, inner])?;
        let dt = x.dtype();
        let t = saved.inputs[1].reshape([n, 1, inner])?;
        let ignored = t.eq(op.ignore_index)?;
        let cls = Tensor::arange(0i64, classes as i64, 1i64, DType::I64, x.device())?
            .reshape([1, classes, 1])?;
        let is_target = cls.eq(&t)?;
        let hot = is_target.to(dt)?;
        let w = saved
            .inputs
            .get(2)
            .map(|w| up(w)?.reshape([1, classes, 1]))
            .transpose()?;
        let eps = if op.logits { op.label_smoothing } else { 0.0 };
        // d(loss at a position) / d(log-probability of class c), before the reduction:
        // -(1 - eps) w[t] [c == t] - (eps / C) w[c].
        let target_w = match &w {
            Some(w) => hot.mul(w)?,
            None => hot,
        };
        let mut coef = target_w.mul(-(1.0 - eps))?;
        if eps > 0.0 {
            let k = -eps / classes as f64;
            coef = match &w {
                Some(w) => coef.add(&w.mul(k)?)?,
                None => coef.add(k)?,
            };
        }
        let factor = match op.reduction {
            Reduction::None => g.reshape([n, 1, inner])?,
            Reduction::Sum => g,
            Reduction::Mean => {
                // The mean divides by the summed weights of the targets not ignored.
                let total = target_w
                    .sum(&[1], true)?
                    .masked_fill(&ignored, 0.0)?
                    .sum_all()?;
                g.div(&total)?
            }
        };
        // Zeroing ignored positions after scaling keeps them 0 even when every target is
        // ignored (the mean's factor is then infinite), as PyTorch.
        let dlp = coef.mul(&factor)?.masked_fill(&ignored, 0.0)?;
        let dx = if op.logits {
            // Through log_softmax: dx = dlp - softmax(x) * sum_c(dlp).
            let sm = super::functional::softmax(&x, 1)?;
            dlp.sub(&sm.mul(&dlp.sum(&[1], true)?)?)?
        } else {
            // NLL: only the targets' log-probabilities have a gradient. Selected, as PyTorch
            // scatters it, so a NaN or infinite output gradient does not reach other classes
            // through the zeros of the one-hot factor.
            dlp.masked_fill(&is_target.logical_not()?, 0.0)?
        };
        let mut out = vec![Some(dx.reshape(&xshape)?), None];
        // Class weights get no gradient (PyTorch does not differentiate them either).
        out.resize(n_in, None);
        Ok(out)
    }

    pub(super) fn point_loss(op: &PointLoss, saved: &Saved, grads: &[Option<Tensor>]) -> Grads {
        let n_in = saved.inputs.len();
        let Some(g) = first(grads) else {
            return Ok(vec![None; n_in]);
        };
        let x = up(&saved.inputs[0])?;
        let t = up(&saved.inputs[1])?;
        let g = up(g)?;
        let factor = match op.reduction {
            Reduction::Mean => g.div(x.numel() as f64)?,
            _ => g,
        };
        match op.kind {
            PointKind::Mse => {
                let gx = x.sub(&t)?.mul(&factor)?.mul(2.0)?;
                let gt = gx.neg()?;
                Ok(vec![Some(gx), Some(gt)])
            }
            PointKind::BceWithLogits => {
                let mut i = 2;
                let w = take(&saved.inputs, op.weight, &mut i).map(up).transpose()?;
                let pw = take(&saved.inputs, op.pos_weight, &mut i)
                    .map(up)
                    .transpose()?;
                // loss = w [(1 - t) x - lw log σ(x)] with lw = (pw - 1) t + 1.
                // log σ(x) = min(x, 0) - log1p(exp(-|x|)), stable for large |x|.
                let log_sig = x.minimum(0.0)?.sub(&x.abs()?.neg()?.exp()?.log1p()?)?;
                let one_minus_t = t.rsub(1.0)?;
                let lw = match &pw {
                    Some(pw) => Some(pw.sub(1.0)?.mul(&t)?.add(1.0)?),
                    None => None,
                };
                let weighted = |v: Tensor| -> Result<Tensor> {
                    let v = v.mul(&factor)?;
                    match &w {
                        Some(w) => v.mul(w),
                        None => Ok(v),
                    }
                };
                // d/dx = w [(1 - t) - lw (1 - σ(x))].
                let one_minus_sig = x.sigmoid()?.rsub(1.0)?;
                let gx = match &lw {
                    Some(lw) => one_minus_t.sub(&lw.mul(&one_minus_sig)?)?,
                    None => one_minus_t.sub(&one_minus_sig)?,
                };
                // d/dt = w [-x - (pw - 1) log σ(x)].
                let gt = match &pw {
                    Some(pw) => x.neg()?.sub(&pw.sub(1.0)?.mul(&log_sig)?)?,
                    None => x.neg()?,
                };
                let mut out = vec![Some(weighted(gx)?), Some(weighted(gt)?)];
                // PyTorch does not differentiate weight and pos_weight; their gradients are
                // simple, so they get them: d/dw is the unweighted loss, d/dpw = -w t log σ(x).
                // Autograd sums both down to their broadcast shapes.
                if op.weight {
                    let unweighted = match &lw {
                        Some(lw) => one_minus_t.mul(&x)?.sub(&lw.mul(&log_sig)?)?,
                        None => one_minus_t.mul(&x)?.sub(&log_sig)?,
                    };
                    out.push(Some(unweighted.mul(&factor)?));
                }
                if op.pos_weight {
                    out.push(Some(weighted(t.mul(&log_sig)?.neg()?)?));
                }
                Ok(out)
            }
        }
    }
}

// ---- public functions -----------------------------------------------------------------------

/// The ops of this file as free functions with `torch.nn.functional`'s names and semantics.
pub mod functional {
    use super::*;
    use crate::exec::dispatch::{run, run1};

    pub use super::{DEFAULT_IGNORE_INDEX, Reduction};

    /// `softmax(x)` along `dim`.
    pub fn softmax(x: &Tensor, dim: impl Dim) -> Result<Tensor> {
        let dim = resolve_dim("softmax", dim, x.shape())?;
        run1(&Softmax { dim, log: false }, &[x])
    }

    /// `log(softmax(x))` along `dim`, computed without forming the softmax.
    pub fn log_softmax(x: &Tensor, dim: impl Dim) -> Result<Tensor> {
        let dim = resolve_dim("log_softmax", dim, x.shape())?;
        run1(&Softmax { dim, log: true }, &[x])
    }

    fn with_opts<'a>(x: &'a Tensor, opts: &[Option<&'a Tensor>]) -> Vec<&'a Tensor> {
        std::iter::once(x)
            .chain(opts.iter().flatten().copied())
            .collect()
    }

    /// Layer normalisation over the trailing `normalized_shape` dims (biased variance), then
    /// `* weight + bias` where given.
    pub fn layer_norm(
        x: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let op = Norm {
            kind: NormKind::Layer,
            normalized: normalized_shape.to_vec(),
            eps,
            weight: weight.is_some(),
            bias: bias.is_some(),
        };
        run1(&op, &with_opts(x, &[weight, bias]))
    }

    /// RMS normalisation over the trailing `normalized_shape` dims, then `* weight` where given.
    /// `eps` defaults, as in PyTorch, to the machine epsilon of the compute type (f32's for
    /// the 16-bit floats).
    pub fn rms_norm(
        x: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        eps: Option<f64>,
    ) -> Result<Tensor> {
        let eps = eps.unwrap_or(match x.dtype() {
            DType::F64 => f64::EPSILON,
            _ => f32::EPSILON as f64,
        });
        let op = Norm {
            kind: NormKind::Rms,
            normalized: normalized_shape.to_vec(),
            eps,
            weight: weight.is_some(),
            bias: false,
        };
        run1(&op, &with_opts(x, &[weight]))
    }

    /// Group normalisation of an `[N, C, *]` input: statistics per sample and group of
    /// `C / num_groups` channels, then per-channel `* weight + bias` where given.
    pub fn group_norm(
        x: &Tensor,
        num_groups: usize,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let op = Norm {
            kind: NormKind::Group(num_groups),
            normalized: Vec::new(),
            eps,
            weight: weight.is_some(),
            bias: bias.is_some(),
        };
        run1(&op, &with_opts(x, &[weight, bias]))
    }

    /// What [`batch_norm`] returns.
    #[derive(Clone)]
    pub struct BatchNormOutput {
        /// The normalised input.
        pub output: Tensor,
        /// In training with running stats: the updated running mean (a new tensor; the one
        /// passed in is left as it was).
        pub running_mean: Option<Tensor>,
        /// In training with running stats: the updated running variance (from the unbiased
        /// batch variance), a new tensor.
        pub running_var: Option<Tensor>,
    }

    /// Batch normalisation of an `[N, C, *]` input.
    ///
    /// In training it normalises with the batch's mean and biased variance per channel and,
    /// when running stats are given, returns them updated as
    /// `momentum * batch + (1 - momentum) * running` (the variance term unbiased). Tensors are
    /// immutable handles, so the updated stats come back as new tensors instead of being
    /// written in place. In evaluation it normalises with the running stats, which are then
    /// required.
    ///
    /// Gradients: the output is differentiated through the batch statistics in training and
    /// with the running stats as constants in evaluation; the running stats get no gradient from
    /// it. The updated running stats are differentiable too (`momentum` times the batch
    /// statistic's gradient, `1 - momentum` into the old stat), though PyTorch's in-place
    /// update gives them no graph at all.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm(
        x: &Tensor,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> Result<BatchNormOutput> {
        if running_mean.is_some() != running_var.is_some() {
            return Err(Error::invalid_argument(
                "batch_norm",
                "expected running_mean and running_var both given or both absent",
            ));
        }
        let op = BatchNorm {
            training,
            momentum,
            eps,
            running: running_mean.is_some(),
            weight: weight.is_some(),
            bias: bias.is_some(),
        };
        let mut outs = run(
            &op,
            &with_opts(x, &[running_mean, running_var, weight, bias]),
        )?
        .into_iter();
        let output = outs
            .next()
            .ok_or_else(|| Error::invalid_argument("batch_norm", "the op produced no output"))?;
        Ok(BatchNormOutput {
            output,
            running_mean: outs.next(),
            running_var: outs.next(),
        })
    }

    /// Dropout: in training, zeroes each element with probability `p` (drawn from
    /// `generator`) and scales the others by `1 / (1 - p)`; otherwise returns `x` itself. The
    /// mask is drawn on the host, so a seed gives the same mask on every device.
    pub fn dropout(
        x: &Tensor,
        p: f64,
        training: bool,
        generator: &mut Generator,
    ) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid_argument(
                "dropout",
                format!("expected a probability in [0, 1], got {p}"),
            ));
        }
        if !training || p == 0.0 {
            return Ok(x.clone());
        }
        if !x.dtype().is_float() {
            return Err(unsupported("dropout", x.dtype()));
        }
        let cpu = Device::cpu();
        let what = || format!("the dropout mask of {}", describe(x.dtype(), x.shape()));
        let keep: Vec<bool> = if p == 1.0 {
            try_host_vec(x.numel(), false, what)?
        } else {
            let threshold = (1.0 - p) as f32;
            let u = generator
                .rand(x.shape(), DType::F32, &cpu)?
                .to_vec::<f32>()?;
            let mut keep = try_host_capacity(u.len(), what)?;
            keep.extend(u.into_iter().map(|u| u < threshold));
            keep
        };
        let keep = Tensor::from_vec(keep, x.shape(), x.device())?;
        let scale = if p == 1.0 { 0.0 } else { 1.0 / (1.0 - p) };
        run1(&Dropout { scale }, &[x, &keep])
    }

    /// [`dropout`] with a fresh generator seeded with `seed`.
    pub fn dropout_seeded(x: &Tensor, p: f64, training: bool, seed: u64) -> Result<Tensor> {
        dropout(x, p, training, &mut Generator::new(seed))
    }

    /// `softmax(q kᵀ * scale + mask) v` for `[..., L, E]` queries, `[..., S, E]` keys and
    /// `[..., S, Ev]` values.
    ///
    /// `attn_mask` is bool (true = attend) or additive (the query's dtype), broadcastable to
    /// `[..., L, S]`; `is_causal` lets query `i` see keys `j <= i` and excludes a mask.
    /// `scale` defaults to `1 / sqrt(E)`. With `enable_gqa`, keys and values may have fewer
    /// heads (dim -3) than queries, dividing them; query head `h` uses key head
    /// `h / (Hq / Hk)`. Query rows that attend to nothing give zeros. On the CPU the scores
    /// are never materialised: each query row runs an online softmax over blocks of keys.
    pub fn scaled_dot_product_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        attn_mask: Option<&Tensor>,
        is_causal: bool,
        scale: Option<f64>,
        enable_gqa: bool,
    ) -> Result<Tensor> {
        let e = q.shape().last().copied().unwrap_or(1);
        let op = Attention {
            scale: scale.unwrap_or(1.0 / (e as f64).sqrt()),
            causal: is_causal,
            gqa: enable_gqa,
            mask: attn_mask.is_some(),
        };
        let mut ins = vec![q, k, v];
        ins.extend(attn_mask);
        run1(&op, &ins)
    }

    /// Rotary position embedding, Hugging Face Llama's rotate-half convention:
    /// `x * cos + rotate_half(x) * sin`, where `cos` and `sin` (from [`rotary_cos_sin`])
    /// broadcast to `x` (`[..., S, D]` with tables `[S, D]`).
    pub fn apply_rotary_emb(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        run1(&Rotary, &[x, cos, sin])
    }

    /// The `[P, dim]` cos and sin tables of rotary embeddings for `positions`: column `i` and
    /// `i + dim/2` hold the angle `position * base^(-2i/dim)`. Computed in f64 and rounded
    /// once to `dtype`.
    pub fn rotary_cos_sin(
        positions: &[usize],
        dim: usize,
        base: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        if dim == 0 || !dim.is_multiple_of(2) || base.is_nan() || base <= 0.0 {
            return Err(Error::invalid_argument(
                "rotary_cos_sin",
                format!("expected an even dim > 0 and a base > 0, got dim {dim} and base {base}"),
            ));
        }
        if !dtype.is_float() {
            return Err(unsupported("rotary_cos_sin", dtype));
        }
        let half = dim / 2;
        let inv: Vec<f64> = (0..half)
            .map(|i| base.powf(-((2 * i) as f64) / dim as f64))
            .collect();
        let mut cos = vec![0f64; positions.len() * dim];
        let mut sin = vec![0f64; positions.len() * dim];
        for (p, &pos) in positions.iter().enumerate() {
            for (i, &f) in inv.iter().enumerate() {
                let a = pos as f64 * f;
                let (s, c) = a.sin_cos();
                for col in [i, i + half] {
                    cos[p * dim + col] = c;
                    sin[p * dim + col] = s;
                }
            }
        }
        let cpu = Device::cpu();
        let shape = [positions.len(), dim];
        let cos = Tensor::from_vec(cos, shape, &cpu)?.to_dtype(dtype)?;
        let sin = Tensor::from_vec(sin, shape, &cpu)?.to_dtype(dtype)?;
        Ok((cos.to_device(device)?, sin.to_device(device)?))
    }

    /// Cross entropy of logits `input` (`[N, C, d...]` or `[C]`) against class indices
    /// `target` (i64, `[N, d...]` or `[]`), with optional class `weight` (`[C]`),
    /// `ignore_index` (PyTorch's default is [`DEFAULT_IGNORE_INDEX`]) and `label_smoothing` as
    /// PyTorch 2.x: the mean divides by the summed weights of the non-ignored targets.
    /// Targets outside `[0, C)` other than `ignore_index` are errors on the CPU. Only `input`
    /// gets a gradient (the class weights do not, as in PyTorch).
    pub fn cross_entropy(
        input: &Tensor,
        target: &Tensor,
        weight: Option<&Tensor>,
        ignore_index: i64,
        reduction: Reduction,
        label_smoothing: f64,
    ) -> Result<Tensor> {
        let op = ClassLoss {
            logits: true,
            reduction,
            ignore_index,
            label_smoothing,
            weight: weight.is_some(),
        };
        let mut ins = vec![input, target];
        ins.extend(weight);
        run1(&op, &ins)
    }

    /// Negative log-likelihood of log-probabilities `input` at class indices `target`; the
    /// options are [`cross_entropy`]'s without label smoothing.
    pub fn nll_loss(
        input: &Tensor,
        target: &Tensor,
        weight: Option<&Tensor>,
        ignore_index: i64,
        reduction: Reduction,
    ) -> Result<Tensor> {
        let op = ClassLoss {
            logits: false,
            reduction,
            ignore_index,
            label_smoothing: 0.0,
            weight: weight.is_some(),
        };
        let mut ins = vec![input, target];
        ins.extend(weight);
        run1(&op, &ins)
    }

    /// Mean squared error of `input` against a `target` of the same shape.
    pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
        let op = PointLoss {
            kind: PointKind::Mse,
            reduction,
            weight: false,
            pos_weight: false,
        };
        run1(&op, &[input, target])
    }

    /// Binary cross entropy of logits `input` against probabilities `target` (same shape),
    /// computed stably through `log σ(x)`; `weight` and `pos_weight` (the weight of the
    /// positive term, typically one per class along the last dim) broadcast to the input.
    /// Unlike PyTorch, which does not differentiate them, `weight` and `pos_weight` get
    /// gradients too.
    pub fn binary_cross_entropy_with_logits(
        input: &Tensor,
        target: &Tensor,
        weight: Option<&Tensor>,
        pos_weight: Option<&Tensor>,
        reduction: Reduction,
    ) -> Result<Tensor> {
        let op = PointLoss {
            kind: PointKind::BceWithLogits,
            reduction,
            weight: weight.is_some(),
            pos_weight: pos_weight.is_some(),
        };
        let mut ins = vec![input, target];
        ins.extend(weight);
        ins.extend(pos_weight);
        run1(&op, &ins)
    }
}

/// This file's per-tensor ops as methods on `Tensor` (see [`functional`] for the others).
pub trait NnOps {
    /// `softmax` along `dim`.
    fn softmax(&self, dim: impl Dim) -> Result<Tensor>;
    /// `log_softmax` along `dim`.
    fn log_softmax(&self, dim: impl Dim) -> Result<Tensor>;
    /// Layer normalisation over the trailing `normalized_shape` dims.
    fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor>;
    /// RMS normalisation over the trailing `normalized_shape` dims.
    fn rms_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        eps: Option<f64>,
    ) -> Result<Tensor>;
    /// Group normalisation of an `[N, C, *]` tensor.
    fn group_norm(
        &self,
        num_groups: usize,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor>;
    /// Dropout with a mask drawn from `generator`.
    fn dropout(&self, p: f64, training: bool, generator: &mut Generator) -> Result<Tensor>;
    /// Rotary position embedding (rotate-half convention).
    fn apply_rotary_emb(&self, cos: &Tensor, sin: &Tensor) -> Result<Tensor>;
}

impl NnOps for Tensor {
    fn softmax(&self, dim: impl Dim) -> Result<Tensor> {
        functional::softmax(self, dim)
    }

    fn log_softmax(&self, dim: impl Dim) -> Result<Tensor> {
        functional::log_softmax(self, dim)
    }

    fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        functional::layer_norm(self, normalized_shape, weight, bias, eps)
    }

    fn rms_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        eps: Option<f64>,
    ) -> Result<Tensor> {
        functional::rms_norm(self, normalized_shape, weight, eps)
    }

    fn group_norm(
        &self,
        num_groups: usize,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        functional::group_norm(self, num_groups, weight, bias, eps)
    }

    fn dropout(&self, p: f64, training: bool, generator: &mut Generator) -> Result<Tensor> {
        functional::dropout(self, p, training, generator)
    }

    fn apply_rotary_emb(&self, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        functional::apply_rotary_emb(self, cos, sin)
    }
}

// ---- the op table ---------------------------------------------------------------------------

/// Seeded normals `scale * z + shift`, as `dtype` on `device`.
fn randn(
    g: &mut Generator,
    shape: &[usize],
    scale: f64,
    shift: f64,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let t = g.randn(shape, DType::F64, &Device::cpu())?;
    crate::op::samples::host_map(&t, |v| v * scale + shift)?
        .to_dtype(dtype)?
        .to_device(device)
}

fn positive(g: &mut Generator, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
    let t = g.randn(shape, DType::F64, &Device::cpu())?;
    crate::op::samples::host_map(&t, |v| v.abs() + 0.5)?
        .to_dtype(dtype)?
        .to_device(device)
}

fn sample_softmax(log: bool, d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(21);
    let base = g.randn([3, 5, 4], DType::F64, &Device::cpu())?;
    let mut x = crate::op::samples::host_map(&base, |v| v * 3.0)?.to_vec::<f64>()?;
    // One -inf logit, and a row that is -inf but for one element.
    x[7] = f64::NEG_INFINITY;
    for j in [0, 4, 8, 12] {
        x[40 + j] = f64::NEG_INFINITY;
    }
    let x = Tensor::from_vec(x, [3, 5, 4], &Device::cpu())?
        .to_dtype(d)?
        .to_device(dev)?;
    let xt = x.transpose(0, 2)?;
    let f = |t: &Tensor, dim: i64| {
        if log {
            functional::log_softmax(t, dim)
        } else {
            functional::softmax(t, dim)
        }
    };
    Ok(vec![f(&x, -1)?, f(&xt, 1)?])
}

fn sample_norms(kind: NormKind, d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    use functional::{group_norm, layer_norm, rms_norm};
    let mut g = Generator::new(22);
    // [2, 6, 5] seen through a transpose: non-contiguous.
    let x = randn(&mut g, &[2, 5, 6], 2.0, 0.5, d, dev)?.transpose(1, 2)?;
    Ok(match kind {
        NormKind::Layer => {
            let w = randn(&mut g, &[5], 1.0, 0.0, d, dev)?;
            let b = randn(&mut g, &[5], 1.0, 0.0, d, dev)?;
            vec![
                layer_norm(&x, &[5], Some(&w), Some(&b), 1e-5)?,
                layer_norm(&x, &[6, 5], None, None, 1e-3)?,
            ]
        }
        NormKind::Rms => {
            let w = randn(&mut g, &[5], 1.0, 0.0, d, dev)?;
            vec![
                rms_norm(&x, &[5], Some(&w), None)?,
                rms_norm(&x, &[6, 5], None, Some(1e-3))?,
            ]
        }
        NormKind::Group(_) => {
            let w = randn(&mut g, &[6], 1.0, 0.0, d, dev)?;
            let b = randn(&mut g, &[6], 1.0, 0.0, d, dev)?;
            vec![
                group_norm(&x, 3, Some(&w), Some(&b), 1e-5)?,
                group_norm(&x, 2, None, None, 1e-5)?,
            ]
        }
    })
}

fn sample_batch_norm(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(23);
    let x = randn(&mut g, &[4, 5, 3], 2.0, 0.0, d, dev)?.transpose(1, 2)?;
    let rm = randn(&mut g, &[3], 1.0, 0.0, d, dev)?;
    let rv = positive(&mut g, &[3], d, dev)?;
    let w = randn(&mut g, &[3], 1.0, 0.0, d, dev)?;
    let b = randn(&mut g, &[3], 1.0, 0.0, d, dev)?;
    let train = functional::batch_norm(
        &x,
        Some(&rm),
        Some(&rv),
        Some(&w),
        Some(&b),
        true,
        0.1,
        1e-5,
    )?;
    let eval = functional::batch_norm(&x, Some(&rm), Some(&rv), None, Some(&b), false, 0.1, 1e-5)?;
    let mut out = vec![train.output];
    out.extend(train.running_mean);
    out.extend(train.running_var);
    out.push(eval.output);
    Ok(out)
}

fn sample_dropout(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(24);
    let x = randn(&mut g, &[16, 8], 1.0, 0.0, d, dev)?.t()?;
    Ok(vec![
        functional::dropout_seeded(&x, 0.3, true, 7)?,
        functional::dropout_seeded(&x, 1.0, true, 7)?,
    ])
}

fn sample_rotary(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(25);
    // [batch, seq, heads, dim] transposed to [batch, heads, seq, dim].
    let x = randn(&mut g, &[2, 4, 3, 8], 1.0, 0.0, d, dev)?.transpose(1, 2)?;
    let (cos, sin) = functional::rotary_cos_sin(&[0, 1, 2, 3], 8, 10000.0, d, dev)?;
    Ok(vec![functional::apply_rotary_emb(&x, &cos, &sin)?])
}

fn sample_sdpa(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    use functional::scaled_dot_product_attention as sdpa;
    let mut g = Generator::new(26);
    // Queries [B, L, H, E] viewed as [B, H, L, E]; 4 query heads over 2 key/value heads.
    let q = randn(&mut g, &[2, 5, 4, 8], 1.0, 0.0, d, dev)?.transpose(1, 2)?;
    let k = randn(&mut g, &[2, 2, 7, 8], 1.0, 0.0, d, dev)?;
    let v = randn(&mut g, &[2, 2, 7, 6], 1.0, 0.0, d, dev)?;
    let mut keep = g
        .randint(0, 2, [5, 7], DType::Bool, &Device::cpu())?
        .to_vec::<bool>()?;
    keep[7..14].iter_mut().for_each(|b| *b = false);
    let keep = Tensor::from_vec(keep, [5, 7], dev)?;
    let bias = randn(&mut g, &[2, 1, 5, 7], 1.0, 0.0, d, dev)?;
    Ok(vec![
        sdpa(&q, &k, &v, None, true, None, true)?,
        sdpa(&q, &k, &v, Some(&keep), false, Some(0.5), true)?,
        sdpa(&q, &k, &v, Some(&bias), false, None, true)?,
    ])
}

fn sample_class_loss(logits: bool, d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(27);
    let cpu = Device::cpu();
    let x = randn(&mut g, &[4, 5], 2.0, 0.0, d, dev)?.t()?;
    let mut t = g.randint(0, 4, [5], DType::I64, &cpu)?.to_vec::<i64>()?;
    t[2] = DEFAULT_IGNORE_INDEX;
    let t = Tensor::from_vec(t, [5], dev)?;
    let w = positive(&mut g, &[4], d, dev)?;
    let x3 = randn(&mut g, &[3, 4, 2], 2.0, 0.0, d, dev)?;
    let t3 = g.randint(0, 4, [3, 2], DType::I64, &cpu)?.to_device(dev)?;
    Ok(if logits {
        use functional::cross_entropy as ce;
        vec![
            ce(&x, &t, Some(&w), DEFAULT_IGNORE_INDEX, Reduction::Mean, 0.1)?,
            ce(&x, &t, None, DEFAULT_IGNORE_INDEX, Reduction::None, 0.2)?,
            ce(&x3, &t3, Some(&w), 1, Reduction::Sum, 0.0)?,
        ]
    } else {
        use functional::nll_loss as nll;
        vec![
            nll(&x, &t, Some(&w), DEFAULT_IGNORE_INDEX, Reduction::Mean)?,
            nll(&x3, &t3, None, 1, Reduction::None)?,
        ]
    })
}

fn sample_point_loss(kind: PointKind, d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(28);
    let x = randn(&mut g, &[3, 4], 2.0, 0.0, d, dev)?.t()?;
    Ok(match kind {
        PointKind::Mse => {
            let t = randn(&mut g, &[4, 3], 1.0, 0.0, d, dev)?;
            use functional::mse_loss;
            vec![
                mse_loss(&x, &t, Reduction::None)?,
                mse_loss(&x, &t, Reduction::Mean)?,
                mse_loss(&x, &t, Reduction::Sum)?,
            ]
        }
        PointKind::BceWithLogits => {
            let t = g
                .rand([4, 3], DType::F64, &Device::cpu())?
                .to_dtype(d)?
                .to_device(dev)?;
            let w = positive(&mut g, &[4, 1], d, dev)?;
            let pw = positive(&mut g, &[3], d, dev)?;
            use functional::binary_cross_entropy_with_logits as bce;
            vec![
                bce(&x, &t, Some(&w), Some(&pw), Reduction::None)?,
                bce(&x, &t, None, Some(&pw), Reduction::Mean)?,
                bce(&x, &t, Some(&w), None, Reduction::Sum)?,
            ]
        }
    })
}

/// The rows of the op table for this file's ops.
pub fn table() -> Vec<OpInfo> {
    fn row(
        name: &'static str,
        tolerance: f64,
        f: impl Fn(DType, &Device) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    ) -> OpInfo {
        OpInfo {
            name,
            cpu: DTypeSet::FLOAT,
            hlo: DTypeSet::FLOAT,
            sample: Arc::new(f),
            tolerance,
            // Every op of this file has a backward rule (see `grad`).
        }
    }
    vec![
        row("softmax", 1e-5, |d, dev| sample_softmax(false, d, dev)),
        row("log_softmax", 1e-5, |d, dev| sample_softmax(true, d, dev)),
        row("layer_norm", 1e-5, |d, dev| {
            sample_norms(NormKind::Layer, d, dev)
        }),
        row("rms_norm", 1e-5, |d, dev| {
            sample_norms(NormKind::Rms, d, dev)
        }),
        row("group_norm", 1e-5, |d, dev| {
            sample_norms(NormKind::Group(0), d, dev)
        }),
        row("batch_norm", 1e-5, sample_batch_norm),
        row("dropout", 1e-6, sample_dropout),
        row("apply_rotary_emb", 1e-6, sample_rotary),
        row("scaled_dot_product_attention", 1e-5, sample_sdpa),
        row("cross_entropy", 1e-5, |d, dev| {
            sample_class_loss(true, d, dev)
        }),
        row("nll_loss", 1e-5, |d, dev| sample_class_loss(false, d, dev)),
        row("mse_loss", 1e-5, |d, dev| {
            sample_point_loss(PointKind::Mse, d, dev)
        }),
        row("binary_cross_entropy_with_logits", 1e-5, |d, dev| {
            sample_point_loss(PointKind::BceWithLogits, d, dev)
        }),
    ]
}
