//! Softmax and log-softmax along one dim: the op, its fused CPU kernel (the contiguous case
//! runs `crate::cpu::simd::rows`), its lowering (shared with attention and the class losses)
//! and its backward rule. Small enough to stay one file.

use tpu_tensor::shape::resolve_dim;
use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::{Dim, Error, Result, Tensor};

use crate::TensorOps;
use crate::autograd::Saved;
use crate::cpu::float::{Float, with_compute};
use crate::cpu::kernels::{Reader, cpu_context, par_map, par_rows};
use crate::cpu::simd::rows::RowKernels;
use crate::exec::dispatch::run1;
use crate::hlo::lower::{Lowered, OpIo, bcast_back, lower_reduce, lower_sum};
use crate::hlo::{Cmp, FnBuilder, Value};
use crate::op::args::check_float;
use crate::op::{Meta, OpDef, op_parts};
use crate::ops::nn::args::check_arity;
use crate::ops::nn::cpu::{contiguous_compute, elems, emit_overwrite, split3};
use crate::ops::nn::grad::{Grads, up};
use crate::ops::nn::lower::{cst, div, sub, to_compute};
use crate::ops::reduce::ReduceOps;

/// `softmax` or `log_softmax` along one dim, with a max-shifted fused kernel.
#[derive(Clone, Debug)]
pub struct Softmax {
    /// The dim, resolved against the input's rank.
    pub dim: usize,
    /// Log-softmax instead of softmax.
    pub log: bool,
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

    op_parts! {
        cpu: softmax_cpu,
        lower: softmax_lower,
        grad: softmax_backward,
    }
}

// ---- the CPU kernel -------------------------------------------------------------------------

fn softmax_cpu(this: &Softmax, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let (dev, device) = cpu_context(this.name(), x)?;
    let (outer, n, inner) = split3(x.shape(), this.dim);
    let log = this.log;
    with_compute!(this.name(), x.dtype(), |C| {
        let xd = contiguous_compute::<C>(x)?;
        let r = Reader::new(&[&xd]);
        let xs = elems::<C>(&r, &xd)?;
        let t = emit_overwrite::<C>(&outputs[0], &device, &dev, |o| {
            if inner == 1 {
                par_rows(&dev, o, n, n, |r, os| {
                    <C as RowKernels>::softmax_row(&xs[r * n..(r + 1) * n], os, log)
                })
            } else {
                softmax_strided(&dev, xs, o, outer, n, inner, log)
            }
        })?;
        Ok(vec![t])
    })
}

/// Columns per task of the strided softmax.
const COLS: usize = 64;

/// Softmax along the middle dim of `[outer, n, inner]` with `inner > 1`. Reading whole rows of
/// `inner` columns keeps the loops contiguous: first the max and sum of each column (in
/// parallel over blocks of columns), then the outputs (in parallel over rows).
fn softmax_strided<C: Float>(
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

// ---- the lowering ---------------------------------------------------------------------------

fn softmax_lower(this: &Softmax, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let shape = io.dims(0);
    let x = if shape.is_empty() {
        b.reshape(&inputs[0], &[1])
    } else {
        inputs[0].clone()
    };
    let x = to_compute(b, &x);
    let y = lower_softmax(b, &x, this.dim, this.log, false);
    let y = b.convert(&y, outputs[0].dtype);
    Ok(vec![b.reshape(&y, &shape)])
}

/// Softmax or log-softmax of `x` along `dim`. `safe` gives zeros (not NaN) for rows that are
/// entirely -inf, as PyTorch's attention does.
pub(super) fn lower_softmax(
    b: &mut FnBuilder,
    x: &Value,
    dim: usize,
    log: bool,
    safe: bool,
) -> Value {
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

// ---- the backward rule ----------------------------------------------------------------------

fn softmax_backward(op: &Softmax, saved: &Saved, g: &Tensor) -> Grads {
    let y = saved.output(0)?;
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

// ---- public functions -----------------------------------------------------------------------

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
