//! The CPU kernels: the input's complex values in one row-major buffer, transformed along each
//! dim by `rustfft` (lines of a dim that is not the last are transposed into rows first, so
//! every transform reads contiguous memory), then written out as pairs or real parts.

use std::sync::Arc;

use rayon::prelude::*;
use rustfft::num_complex::Complex;
use rustfft::{Fft, FftNum, FftPlanner};
use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::tpu_runtime::memory::try_host_vec;
use tpu_tensor::{Element, Result, Tensor};

use super::{FftC2c, FftC2r, FftR2c, FftScale, last_dim, points};
use crate::cpu::float::{Float, with_compute};
use crate::cpu::kernels::launch;
use crate::op::{Meta, OpDef};
use crate::ops::conv::cpu::{produce, read};

/// About this many complex values per task, so one scratch serves many short lines.
const TASK: usize = 1 << 14;

/// `(outer, n, inner)` around `dim` of `shape`.
fn split(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    let outer = shape[..dim].iter().product();
    let inner = shape[dim + 1..].iter().product();
    (outer, shape[dim], inner)
}

/// Complex values of a row-major complex shape.
struct Spectrum<C> {
    shape: Vec<usize>,
    data: Vec<Complex<C>>,
}

fn buffer<C: Float>(shape: &[usize]) -> Result<Vec<Complex<C>>> {
    let n = shape.iter().product();
    try_host_vec(n, Complex::new(C::ZERO, C::ZERO), || {
        format!("complex scratch of shape {}", fmt_shape(shape))
    })
}

impl<C: Float + FftNum> Spectrum<C> {
    /// The real values `xs` of `shape`, with zero imaginary parts.
    fn from_real(xs: &[C], shape: &[usize]) -> Result<Self> {
        let mut data = buffer::<C>(shape)?;
        for (c, &x) in data.iter_mut().zip(xs) {
            c.re = x;
        }
        Ok(Spectrum {
            shape: shape.to_vec(),
            data,
        })
    }

    /// The pairs `zs` (real, imaginary) of the complex `shape`.
    fn from_pairs(zs: &[C], shape: &[usize]) -> Result<Self> {
        let mut data = buffer::<C>(shape)?;
        for (c, z) in data.iter_mut().zip(zs.chunks_exact(2)) {
            *c = Complex::new(z[0], z[1]);
        }
        Ok(Spectrum {
            shape: shape.to_vec(),
            data,
        })
    }

    /// Transforms along `dim`, forward (`exp(-2πi jk/n)`) or backward, unscaled.
    fn transform(&mut self, dev: &CpuDevice, dim: usize, forward: bool) -> Result<()> {
        let (outer, n, inner) = split(&self.shape, dim);
        if self.data.is_empty() || n <= 1 {
            return Ok(());
        }
        let mut planner = FftPlanner::<C>::new();
        let fft = if forward {
            planner.plan_fft_forward(n)
        } else {
            planner.plan_fft_inverse(n)
        };
        if inner == 1 {
            return run_lines(dev, &fft, &mut self.data, n);
        }
        let mut rows = buffer::<C>(&self.shape)?;
        transpose(&self.data, &mut rows, outer, n, inner);
        run_lines(dev, &fft, &mut rows, n)?;
        transpose(&rows, &mut self.data, outer, inner, n);
        Ok(())
    }

    /// Transforms along each of `dims`.
    fn transform_all(&mut self, dev: &CpuDevice, dims: &[usize], forward: bool) -> Result<()> {
        dims.iter()
            .try_for_each(|&d| self.transform(dev, d, forward))
    }

    /// The full spectrum of `n` points along `dim` whose first half is this one-sided spectrum
    /// (cut, or read as zeros past its end) and whose second half mirrors it conjugated.
    fn hermitian(&self, dim: usize, n: usize) -> Result<Self> {
        let (outer, m, inner) = split(&self.shape, dim);
        let mut shape = self.shape.clone();
        shape[dim] = n;
        let mut data = buffer::<C>(&shape)?;
        let zero = Complex::new(C::ZERO, C::ZERO);
        for o in 0..outer {
            for k in 0..n {
                let (src, conj) = if k <= n / 2 {
                    (k, false)
                } else {
                    (n - k, true)
                };
                for j in 0..inner {
                    let v = if src < m {
                        self.data[(o * m + src) * inner + j]
                    } else {
                        zero
                    };
                    data[(o * n + k) * inner + j] = if conj { v.conj() } else { v };
                }
            }
        }
        Ok(Spectrum { shape, data })
    }

    /// Writes the first `keep` values along `dim` as pairs times `f` into `out`.
    fn write_pairs(&self, out: &mut [C], dim: usize, keep: usize, f: C) {
        let (outer, n, inner) = split(&self.shape, dim);
        for o in 0..outer {
            for k in 0..keep {
                let src = &self.data[(o * n + k) * inner..][..inner];
                let dst = &mut out[2 * (o * keep + k) * inner..][..2 * inner];
                for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                    d[0] = s.re * f;
                    d[1] = s.im * f;
                }
            }
        }
    }
}

/// Transforms each line of `n` values of `data`, the lines shared out over the device's threads.
fn run_lines<C: FftNum>(
    dev: &CpuDevice,
    fft: &Arc<dyn Fft<C>>,
    data: &mut [Complex<C>],
    n: usize,
) -> Result<()> {
    let per = (TASK / n).max(1) * n;
    if data.len() <= per || dev.num_threads() <= 1 {
        fft.process(data);
        return Ok(());
    }
    dev.install(|| data.par_chunks_mut(per).for_each(|c| fft.process(c)))
}

/// `dst[o][j][i] = src[o][i][j]` for `src` of `[outer, a, b]`.
fn transpose<T: Copy>(src: &[T], dst: &mut [T], outer: usize, a: usize, b: usize) {
    for (s, d) in src
        .chunks_exact(a * b)
        .zip(dst.chunks_exact_mut(a * b))
        .take(outer)
    {
        for i in 0..a {
            for j in 0..b {
                d[j * a + i] = s[i * b + j];
            }
        }
    }
}

/// Transforms `t` (real values when `real`, pairs otherwise) over `dims` in one direction and
/// writes the values kept along the last of them (as many as `out` has) as scaled pairs.
fn transform_to_pairs(
    op: &impl OpDef,
    t: &Tensor,
    out: &Meta,
    real: bool,
    dims: &[usize],
    forward: bool,
    scale: FftScale,
) -> Result<Vec<Tensor>> {
    let (name, dev, _) = launch(op, t)?;
    with_compute!(name, t.dtype(), |C| {
        let values = read::<C>(t)?;
        let mut s = if real {
            Spectrum::<C>::from_real(&values, t.shape())?
        } else {
            Spectrum::<C>::from_pairs(&values, &t.shape()[..t.rank() - 1])?
        };
        s.transform_all(&dev, dims, forward)?;
        let f = C::from_f64(scale.factor(points(&s.shape, dims)));
        let l = last_dim(dims);
        let keep = out.shape[l];
        let t = produce::<C>(name, t, out, |_, o| {
            s.write_pairs(o, l, keep, f);
            Ok(())
        })?;
        Ok(vec![t])
    })
}

pub(super) fn r2c(op: &FftR2c, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let (x, out) = (inputs[0], &outputs[0]);
    transform_to_pairs(op, x, out, true, &op.dims, true, op.scale)
}

pub(super) fn c2r(op: &FftC2r, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let z = inputs[0];
    let (name, dev, _) = launch(op, z)?;
    let lead = &z.shape()[..z.rank() - 1];
    with_compute!(name, z.dtype(), |C| {
        let mut s = Spectrum::<C>::from_pairs(&read::<C>(z)?, lead)?;
        let (l, others) = op.dims.split_last().unwrap_or((&0, &[]));
        s.transform_all(&dev, others, false)?;
        let mut full = s.hermitian(*l, op.last_dim_size)?;
        full.transform(&dev, *l, false)?;
        let f = C::from_f64(op.scale.factor(points(&outputs[0].shape, &op.dims)));
        let t = produce::<C>(name, z, &outputs[0], |_, o| {
            for (o, c) in o.iter_mut().zip(&full.data) {
                *o = c.re * f;
            }
            Ok(())
        })?;
        Ok(vec![t])
    })
}

pub(super) fn c2c(op: &FftC2c, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let (z, out) = (inputs[0], &outputs[0]);
    transform_to_pairs(op, z, out, false, &op.dims, op.forward, op.scale)
}
