//! `F.grid_sample` on 4-D inputs (Core ATen's `grid_sampler_2d`) as a composition of
//! elementwise ops and `gather`, so it runs on every device and differentiates with respect to
//! both the input and the grid.
//!
//! Each output pixel reads the input at the grid's `(x, y)` (in `[-1, 1]`, unnormalised by
//! PyTorch's rule for `align_corners`). Bilinear and nearest sampling first move the point by
//! the padding mode (border clips it into the image; reflection mirrors it at the edges, then
//! clips); bicubic sampling moves each of its 4 x 4 taps instead, as PyTorch does. Every tap is
//! one `gather` from the flattened planes at `y·W + x`, weighted, with taps outside the image
//! reading zero. 16-bit inputs compute in f32 and round once.

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Error, Result, Tensor};

use crate::TensorOps;
use crate::op::promote::compute_dtype;
use crate::ops::movement::MovementOps;

const OP: &str = "grid_sampler_2d";

/// How `grid_sample` reads between pixels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GridMode {
    /// The four nearest pixels, weighted by distance (PyTorch's default).
    #[default]
    Bilinear,
    /// The nearest pixel (halves round to even).
    Nearest,
    /// 4 x 4 pixels under the cubic convolution kernel with `A = -0.75`.
    Bicubic,
}

/// What `grid_sample` reads outside the image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GridPadding {
    /// Zero (PyTorch's default).
    #[default]
    Zeros,
    /// The nearest edge pixel.
    Border,
    /// The image mirrored at its edges.
    Reflection,
}

/// The options of `grid_sample`; `Default` is PyTorch's (bilinear, zeros, no align_corners).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GridSampleOptions {
    /// How to read between pixels.
    pub mode: GridMode,
    /// What to read outside the image.
    pub padding_mode: GridPadding,
    /// `-1` and `1` name the centres of the corner pixels rather than their outer edges.
    pub align_corners: bool,
}

/// `F.grid_sample(x, grid, mode, padding_mode, align_corners)`: `x` `[N, C, H, W]`, `grid`
/// `[N, Ho, Wo, 2]` of the same float dtype, giving `[N, C, Ho, Wo]`.
pub fn grid_sample(x: &Tensor, grid: &Tensor, opts: &GridSampleOptions) -> Result<Tensor> {
    let (n, c, h, w, ho, wo) = check(x, grid)?;
    let dtype = x.dtype();
    let ct = compute_dtype(dtype);
    let (x, grid) = (x.to(ct)?, grid.to(ct)?);
    let planes = x.reshape([n, c, h * w])?;
    let ix = unnormalize(&grid.select(3, 0)?, w, opts.align_corners)?;
    let iy = unnormalize(&grid.select(3, 1)?, h, opts.align_corners)?;
    let read = |xs: &Tensor, ys: &Tensor, weight: &Tensor| {
        tap(&planes, xs, ys, weight, [h, w], [c, ho, wo])
    };
    let mut taps = Vec::new();
    match opts.mode {
        GridMode::Bilinear | GridMode::Nearest => {
            let ix = pad_coord(&ix, w, opts)?;
            let iy = pad_coord(&iy, h, opts)?;
            if opts.mode == GridMode::Nearest {
                taps.push(read(&ix.round()?, &iy.round()?, &ix.ones_like()?)?);
            } else {
                let (x0, y0) = (ix.floor()?, iy.floor()?);
                let (x1, y1) = (x0.add(1.0)?, y0.add(1.0)?);
                let (east, south) = (ix.sub(&x0)?, iy.sub(&y0)?);
                let (west, north) = (x1.sub(&ix)?, y1.sub(&iy)?);
                for (xs, ys, wx, wy) in [
                    (&x0, &y0, &west, &north),
                    (&x1, &y0, &east, &north),
                    (&x0, &y1, &west, &south),
                    (&x1, &y1, &east, &south),
                ] {
                    taps.push(read(xs, ys, &wx.mul(wy)?)?);
                }
            }
        }
        GridMode::Bicubic => {
            let (x0, y0) = (ix.floor()?, iy.floor()?);
            let wx = cubic_weights(&ix.sub(&x0)?)?;
            let wy = cubic_weights(&iy.sub(&y0)?)?;
            for (j, wy) in wy.iter().enumerate() {
                let ys = pad_coord(&y0.add(j as f64 - 1.0)?, h, opts)?;
                for (i, wx) in wx.iter().enumerate() {
                    let xs = pad_coord(&x0.add(i as f64 - 1.0)?, w, opts)?;
                    taps.push(read(&xs, &ys, &wx.mul(wy)?)?);
                }
            }
        }
    }
    let mut out = taps.remove(0);
    for t in &taps {
        out = out.add(t)?;
    }
    out.to(dtype)
}

/// Shapes `(N, C, H, W, Ho, Wo)`, after checking ranks, batch, dtypes and the last grid dim.
fn check(x: &Tensor, grid: &Tensor) -> Result<(usize, usize, usize, usize, usize, usize)> {
    if !x.dtype().is_float() {
        return Err(Error::invalid_argument(
            OP,
            format!("expected a floating-point input, got {}", x.dtype()),
        ));
    }
    if grid.dtype() != x.dtype() {
        return Err(Error::DTypeMismatch {
            context: format!(
                "{OP}: grid of shape {} must have the input's dtype",
                fmt_shape(grid.shape())
            ),
            expected: x.dtype(),
            given: grid.dtype(),
        });
    }
    let (xs, gs) = (x.shape(), grid.shape());
    if xs.len() != 4 || xs[2] == 0 || xs[3] == 0 {
        return Err(Error::shape(
            OP,
            format!(
                "expected a 4-D [N, C, H, W] input with non-zero H and W, got shape {}",
                fmt_shape(xs)
            ),
        ));
    }
    if gs.len() != 4 || gs[3] != 2 || gs[0] != xs[0] {
        return Err(Error::shape(
            OP,
            format!(
                "expected a grid of shape [{}, Ho, Wo, 2] for input of shape {}, got {}",
                xs[0],
                fmt_shape(xs),
                fmt_shape(gs)
            ),
        ));
    }
    Ok((xs[0], xs[1], xs[2], xs[3], gs[1], gs[2]))
}

/// Grid values in `[-1, 1]` as pixel coordinates along a dim of `size`.
fn unnormalize(g: &Tensor, size: usize, align_corners: bool) -> Result<Tensor> {
    let s = size as f64;
    if align_corners {
        g.add(1.0)?.mul((s - 1.0) / 2.0)
    } else {
        g.add(1.0)?.mul(s)?.sub(1.0)?.div(2.0)
    }
}

/// A coordinate moved by the padding mode: clipped into `[0, size - 1]` (border), mirrored
/// at the edges and then clipped (reflection), or left as is (zeros).
fn pad_coord(v: &Tensor, size: usize, opts: &GridSampleOptions) -> Result<Tensor> {
    let hi = size as f64 - 1.0;
    match opts.padding_mode {
        GridPadding::Zeros => Ok(v.clone()),
        GridPadding::Border => v.clamp(Some(0.0), Some(hi)),
        GridPadding::Reflection => {
            let reflected = if opts.align_corners {
                reflect(v, 0.0, 2.0 * hi)?
            } else {
                reflect(v, -1.0, 2.0 * size as f64 - 1.0)?
            };
            reflected.clamp(Some(0.0), Some(hi))
        }
    }
}

/// `v` mirrored into `[low / 2, high / 2]` (both doubled, as PyTorch passes them), as many
/// times as it takes.
fn reflect(v: &Tensor, twice_low: f64, twice_high: f64) -> Result<Tensor> {
    if twice_low == twice_high {
        return v.zeros_like();
    }
    let min = twice_low / 2.0;
    let span = (twice_high - twice_low) / 2.0;
    let d = v.sub(min)?.abs()?;
    let extra = d.fmod(span)?;
    let even = d.div(span)?.floor()?.remainder(2.0)?.eq(0.0)?;
    crate::where_(&even, &extra.add(min)?, &extra.rsub(span + min)?)
}

/// The four bicubic weights of the taps at offsets -1, 0, 1, 2 from `floor(x)`, for the
/// fraction `t = x - floor(x)`.
fn cubic_weights(t: &Tensor) -> Result<[Tensor; 4]> {
    const A: f64 = -0.75;
    // |d| <= 1: ((A + 2)·d - (A + 3))·d² + 1; 1 < |d| < 2: ((A·d - 5A)·d + 8A)·d - 4A.
    let near = |d: &Tensor| d.mul(A + 2.0)?.sub(A + 3.0)?.mul(d)?.mul(d)?.add(1.0);
    let far = |d: &Tensor| {
        d.mul(A)?
            .sub(5.0 * A)?
            .mul(d)?
            .add(8.0 * A)?
            .mul(d)?
            .sub(4.0 * A)
    };
    let one_minus = t.rsub(1.0)?;
    Ok([
        far(&t.add(1.0)?)?,
        near(t)?,
        near(&one_minus)?,
        far(&one_minus.add(1.0)?)?,
    ])
}

/// The planes read at pixel `(xs, ys)` (integer-valued, `[N, Ho, Wo]`) times `weight`, zero
/// where the pixel is outside the `[h, w]` image: `[N, C, Ho, Wo]`.
fn tap(
    planes: &Tensor,
    xs: &Tensor,
    ys: &Tensor,
    weight: &Tensor,
    [h, w]: [usize; 2],
    [c, ho, wo]: [usize; 3],
) -> Result<Tensor> {
    let n = planes.shape()[0];
    let inside = xs
        .ge(0.0)?
        .logical_and(&xs.le(w as f64 - 1.0)?)?
        .logical_and(&ys.ge(0.0)?)?
        .logical_and(&ys.le(h as f64 - 1.0)?)?;
    // Outside (or NaN) reads pixel 0 and is weighted 0.
    let zero = xs.zeros_like()?;
    let (xs, ys) = (
        crate::where_(&inside, xs, &zero)?,
        crate::where_(&inside, ys, &zero)?,
    );
    let at = ys.mul(w as f64)?.add(&xs)?.to(DType::I64)?;
    let at = at.reshape([n, 1, ho * wo])?.expand([n, c, ho * wo])?;
    let weight = crate::where_(&inside, weight, &zero)?.reshape([n, 1, ho * wo])?;
    planes.gather(2, &at)?.mul(&weight)?.reshape([n, c, ho, wo])
}
