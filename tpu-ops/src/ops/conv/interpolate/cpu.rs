//! The CPU interpolation kernels: per `(N, C)` plane, a copy from the nearest source pixels or
//! a blend of four, in f32 (f64 for f64 inputs), rounded once to the input's dtype.

use tpu_tensor::{Result, Tensor};

use crate::cpu::float::{Float, with_compute};
use crate::cpu::kernels::par_rows;
use crate::op::{Meta, OpDef};
use crate::ops::conv::cpu::{produce, read};
use crate::ops::conv::nchw;
use crate::ops::conv::options::InterpolateMode;

use super::{Interpolate, linear_taps, nearest_sources};

/// `op` applied to `x`, into a new tensor of `meta`.
pub(super) fn interpolate(op: &Interpolate, x: &Tensor, meta: &Meta) -> Result<Tensor> {
    with_compute!(op.name(), x.dtype(), |C| {
        match op.mode {
            InterpolateMode::Nearest => nearest::<C>(op, x, meta),
            InterpolateMode::Bilinear { align_corners } => {
                bilinear::<C>(op, x, meta, align_corners)
            }
        }
    })
}

/// Nearest-neighbour resampling of `x`, computed in `F`.
fn nearest<F: Float>(op: &Interpolate, x: &Tensor, meta: &Meta) -> Result<Tensor> {
    let [_, _, h, w] = nchw(x.shape());
    let [oh, ow] = op.size;
    let (sy, sx) = (
        nearest_sources(h, oh, op.scales[0]),
        nearest_sources(w, ow, op.scales[1]),
    );
    let d = read::<F>(x)?;
    produce::<F>(op.name(), x, meta, |dev, out| {
        par_rows(dev, out, oh * ow, oh * ow, |pl, o| {
            let src = &d[pl * h * w..(pl + 1) * h * w];
            for (oy, &iy) in sy.iter().enumerate() {
                for (ox, &ix) in sx.iter().enumerate() {
                    o[oy * ow + ox] = src[iy * w + ix];
                }
            }
        })
    })
}

/// Bilinear resampling of `x`, computed in `F`.
fn bilinear<F: Float>(op: &Interpolate, x: &Tensor, meta: &Meta, align: bool) -> Result<Tensor> {
    let [_, _, h, w] = nchw(x.shape());
    let [oh, ow] = op.size;
    let ty = linear_taps::<F>(h, oh, align, op.scales[0]);
    let tx = linear_taps::<F>(w, ow, align, op.scales[1]);
    let d = read::<F>(x)?;
    produce::<F>(op.name(), x, meta, |dev, out| {
        par_rows(dev, out, oh * ow, 4 * oh * ow, |pl, o| {
            let src = &d[pl * h * w..(pl + 1) * h * w];
            for (oy, &(y0, y1, hy0, hy1)) in ty.iter().enumerate() {
                for (ox, &(x0, x1, wx0, wx1)) in tx.iter().enumerate() {
                    let t0 = src[y0 * w + x0] * wx0 + src[y0 * w + x1] * wx1;
                    let t1 = src[y1 * w + x0] * wx0 + src[y1 * w + x1] * wx1;
                    o[oy * ow + ox] = t0 * hy0 + t1 * hy1;
                }
            }
        })
    })
}
