//! Rotary position embeddings (rotate-half convention): the op, its CPU kernel, lowering and
//! backward rule, and the tables of angles. Small enough to stay one file.

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Device, Element, Error, Result, Tensor};

use crate::TensorOps;
use crate::autograd::Saved;
use crate::cpu::float::with_compute;
use crate::cpu::kernels::{Reader, broadcast_strides, launch, par_rows};
use crate::exec::dispatch::run1;
use crate::hlo::{FnBuilder, Value};
use crate::op::args::{check_broadcasts_to, check_float, unsupported};
use crate::op::{DTypeSet, Meta, OpDef, op_parts};
use crate::ops::movement::cat;
use crate::ops::nn::args::{check_arity, check_dtype};
use crate::ops::nn::cpu::{contiguous_compute, elems, emit, lead_offset};
use crate::ops::nn::grad::{Grads, first, up};
use crate::ops::nn::lower::{add, mul, to_compute};

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
            check_broadcasts_to(op, what, m, &x.shape)?;
        }
        Ok(vec![Meta::new(&x.shape, x.dtype)])
    }

    op_parts! {
        cpu: rotary_cpu,
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        rotary_lower(b, inputs, outputs)
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        rotary_backward(saved, grads)
    }
}

// ---- the CPU kernel -------------------------------------------------------------------------

fn rotary_cpu(this: &Rotary, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let (op, dev, device) = launch(this, x)?;
    let shape = x.shape();
    let rank = shape.len();
    let d = shape[rank - 1];
    let h = d / 2;
    let lead = &shape[..rank - 1];
    with_compute!(op, x.dtype(), |C| {
        let xd = contiguous_compute::<C>(x)?;
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

// ---- the lowering ---------------------------------------------------------------------------

fn rotary_lower(b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
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

// ---- the backward rule ----------------------------------------------------------------------

/// `cat(-u[..., D/2:], u[..., :D/2])`. As a matrix it is antisymmetric, so its transpose is
/// its negation.
fn rotate_half(u: &Tensor) -> Result<Tensor> {
    let d = u.shape().last().copied().unwrap_or(0);
    let h = d / 2;
    let a = u.narrow(-1, 0, h)?;
    let b = u.narrow(-1, h as i64, h)?;
    cat(&[&b.neg()?, &a], -1)
}

fn rotary_backward(saved: &Saved, grads: &[Option<Tensor>]) -> Grads {
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

// ---- public functions -----------------------------------------------------------------------

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
        return Err(unsupported("rotary_cos_sin", dtype, DTypeSet::FLOAT));
    }
    let inv: Vec<f64> = (0..dim / 2)
        .map(|i| base.powf(-((2 * i) as f64) / dim as f64))
        .collect();
    rotary_cos_sin_freqs(positions, &inv, dtype, device)
}

/// The `[P, 2 F]` cos and sin tables of rotary embeddings for `positions` and the inverse
/// frequencies `inv_freq` (`F` of them, as a scaled rotary embedding computes them): column
/// `i` and `i + F` hold the angle `position * inv_freq[i]`. Computed in f64 and rounded once
/// to `dtype`.
pub fn rotary_cos_sin_freqs(
    positions: &[usize],
    inv_freq: &[f64],
    dtype: DType,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    if inv_freq.is_empty() || inv_freq.iter().any(|f| !f.is_finite()) {
        return Err(Error::invalid_argument(
            "rotary_cos_sin",
            format!("expected finite inverse frequencies, got {inv_freq:?}"),
        ));
    }
    if !dtype.is_float() {
        return Err(unsupported("rotary_cos_sin", dtype, DTypeSet::FLOAT));
    }
    let half = inv_freq.len();
    let dim = 2 * half;
    let inv = inv_freq;
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
