//! The CPU pooling kernels: direct loops over each `(N, C)` plane's windows, computed in f32
//! (f64 for f64 inputs) and rounded once to the input's dtype.

use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::tpu_runtime::memory::try_host_vec;
use tpu_tensor::{Result, Tensor};

use crate::cpu::float::{Float, with_compute};
use crate::cpu::kernels::{cpu_context, par_rows};
use crate::op::{Meta, OpDef};
use crate::ops::conv::cpu::{produce, read};
use crate::ops::conv::nchw;

use super::{AdaptiveAvgPool2d, AvgPool2d, PoolGeom, adaptive_windows, taps};

/// `max_pool2d`'s values and, with `indices`, their indices.
pub(super) fn max_pool(
    g: &PoolGeom,
    x: &Tensor,
    outputs: &[Meta],
    indices: bool,
) -> Result<Vec<Tensor>> {
    with_compute!("max_pool2d", x.dtype(), |C| {
        run_max_pool::<C>(g, x, outputs, indices)
    })
}

/// The taps (see [`taps`]) of output position `o` along `axis` (0 for rows, 1 for columns),
/// with dilation `dil`.
fn window(g: &PoolGeom, axis: usize, o: usize, dil: usize) -> (usize, usize) {
    let start = (o * g.s[axis]) as isize - g.p[axis] as isize;
    taps(start, g.k[axis], dil, [g.h, g.w][axis])
}

/// The (value, index) pair of every window's maximum, plane by plane.
fn max_pool_cpu<F: Float>(
    g: &PoolGeom,
    x: &[F],
    dev: &CpuDevice,
    out: &mut [(F, i64)],
) -> Result<()> {
    // Work per plane. Kernels may be far larger than the input (padding reaches half a
    // kernel): saturate.
    let work = (g.oh * g.ow).saturating_mul(g.k[0]).saturating_mul(g.k[1]);
    par_rows(dev, out, g.oh * g.ow, work, |pl, o| {
        let src = &x[pl * g.h * g.w..(pl + 1) * g.h * g.w];
        for oy in 0..g.oh {
            let (y0, y1) = window(g, 0, oy, g.d[0]);
            for ox in 0..g.ow {
                let (x0, x1) = window(g, 1, ox, g.d[1]);
                // As PyTorch: the first maximum wins ties, and any NaN (the last one) wins.
                let mut best = (F::of(f64::NEG_INFINITY), (y0 * g.w + x0) as i64);
                for iy in (y0..y1).step_by(g.d[0]) {
                    for ix in (x0..x1).step_by(g.d[1]) {
                        let v = src[iy * g.w + ix];
                        if v > best.0 || v.is_nan() {
                            best = (v, (iy * g.w + ix) as i64);
                        }
                    }
                }
                o[oy * g.ow + ox] = best;
            }
        }
    })
}

/// `max_pool2d` computed in `F`: the values rounded to the output dtype, and the indices.
fn run_max_pool<F: Float>(
    g: &PoolGeom,
    x: &Tensor,
    outputs: &[Meta],
    indices: bool,
) -> Result<Vec<Tensor>> {
    let data = read::<F>(x)?;
    let (dev, device) = cpu_context("max_pool2d", x)?;
    let mut both = try_host_vec(g.planes * g.oh * g.ow, (F::default(), 0i64), || {
        format!("max_pool2d scratch for {}", fmt_shape(&outputs[0].shape))
    })?;
    max_pool_cpu(g, &data, &dev, &mut both)?;
    let vals = Tensor::from_fn_typed::<F>(&outputs[0].shape, &device, |o| {
        o.iter_mut().zip(&both).for_each(|(o, b)| *o = b.0);
        Ok(())
    })?
    .to_dtype(outputs[0].dtype)?;
    let mut res = vec![vals];
    if indices {
        res.push(Tensor::from_fn_typed::<i64>(
            &outputs[1].shape,
            &device,
            |o| {
                o.iter_mut().zip(&both).for_each(|(o, b)| *o = b.1);
                Ok(())
            },
        )?);
    }
    Ok(res)
}

/// `avg_pool2d` of `x` into a new tensor of `meta`.
pub(super) fn avg_pool(op: &AvgPool2d, g: &PoolGeom, x: &Tensor, meta: &Meta) -> Result<Tensor> {
    with_compute!(op.name(), x.dtype(), |C| {
        let d = read::<C>(x)?;
        produce::<C>(op.name(), x, meta, |dev, o| avg_pool_cpu(op, g, &d, dev, o))
    })
}

/// Every window's sum divided by PyTorch's divisor, plane by plane.
fn avg_pool_cpu<F: Float>(
    op: &AvgPool2d,
    g: &PoolGeom,
    x: &[F],
    dev: &CpuDevice,
    out: &mut [F],
) -> Result<()> {
    let (dh, dw) = (op.divisors(g, 0), op.divisors(g, 1));
    // Work per plane. Kernels may be far larger than the input (padding reaches half a
    // kernel): saturate.
    let work = (g.oh * g.ow).saturating_mul(g.k[0]).saturating_mul(g.k[1]);
    par_rows(dev, out, g.oh * g.ow, work, |pl, o| {
        let src = &x[pl * g.h * g.w..(pl + 1) * g.h * g.w];
        for oy in 0..g.oh {
            let (y0, y1) = window(g, 0, oy, 1);
            for ox in 0..g.ow {
                let (x0, x1) = window(g, 1, ox, 1);
                let mut sum = F::default();
                for iy in y0..y1 {
                    for &v in &src[iy * g.w + x0..iy * g.w + x1.max(x0)] {
                        sum += v;
                    }
                }
                let div = op.divisor_override.unwrap_or(dh[oy] * dw[ox]).max(1);
                o[oy * g.ow + ox] = sum / F::of_usize(div);
            }
        }
    })
}

/// `adaptive_avg_pool2d` of `x` into a new tensor of `meta`.
pub(super) fn adaptive_avg_pool(op: &AdaptiveAvgPool2d, x: &Tensor, meta: &Meta) -> Result<Tensor> {
    let [n, c, h, w] = nchw(x.shape());
    let g = PoolGeom {
        planes: n * c,
        h,
        w,
        oh: op.size[0],
        ow: op.size[1],
        k: [1, 1],
        s: [1, 1],
        p: [0, 0],
        d: [1, 1],
    };
    with_compute!(op.name(), x.dtype(), |C| {
        let d = read::<C>(x)?;
        produce::<C>(op.name(), x, meta, |dev, o| adaptive_cpu(&g, &d, dev, o))
    })
}

/// Every adaptive window's mean, plane by plane.
fn adaptive_cpu<F: Float>(g: &PoolGeom, x: &[F], dev: &CpuDevice, out: &mut [F]) -> Result<()> {
    let (wh, ww) = (adaptive_windows(g.h, g.oh), adaptive_windows(g.w, g.ow));
    par_rows(dev, out, g.oh * g.ow, g.h * g.w, |pl, o| {
        let src = &x[pl * g.h * g.w..(pl + 1) * g.h * g.w];
        for (oy, &(y0, y1)) in wh.iter().enumerate() {
            for (ox, &(x0, x1)) in ww.iter().enumerate() {
                let mut sum = F::default();
                for iy in y0..y1 {
                    for &v in &src[iy * g.w + x0..iy * g.w + x1] {
                        sum += v;
                    }
                }
                // PyTorch divides by the height and then by the width.
                o[oy * g.ow + ox] = sum / F::of_usize(y1 - y0) / F::of_usize(x1 - x0);
            }
        }
    })
}
