//! 3-D pooling (`max_pool3d` with its indices, `avg_pool3d`, `adaptive_avg_pool3d`) as
//! compositions of the 2-D ops, since every one of them is separable along depth: a window of
//! `[D, H, W]` is a run of depth taps, each an `[H, W]` window of one depth slice. For each tap
//! the slices of every output depth are gathered at once (`index_select`; taps in the padding
//! read any slice and are masked out) and pooled by the 2-D op with the depth folded into the
//! channels, so an op costs `kd` 2-D poolings; the taps then combine elementwise. They run on
//! every device and differentiate through those ops.
//!
//! - max: taps combine in depth order by PyTorch's rule (a larger value or any NaN replaces the
//!   maximum), starting from the first tap at or past depth 0, so ties go to the first
//!   position in `(d, h, w)` order and a NaN to the last, with the index `d·H·W + h·W + w`.
//! - average: the window's divisor is the product of its depth extent and the 2-D one (as
//!   PyTorch computes it, with or without the padding), so the taps' 2-D averages sum and
//!   divide by the depth extent; `divisor_override` sums and divides once.
//! - adaptive average: the depth window `[floor(i·D/od), ceil((i+1)·D/od))` of each output
//!   averages the 2-D adaptive averages of its slices.

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{Error, Result, Tensor};

use super::options::{AvgPoolOptions, Ints, MaxPoolOptions};
use super::pool::{adaptive_windows, pool_out};
use super::{ConvOps, arith, dilated};
use crate::TensorOps;
use crate::op::Meta;
use crate::op::args::check_float;
use crate::ops::movement::MovementOps;

/// The input as `[N, C, D, H, W]`, and whether it had a batch dim; an error for other ranks,
/// empty spatial dims or a dtype that is not a float.
pub(super) fn five_d(op: &str, x: &Tensor) -> Result<(Tensor, bool)> {
    check_float(op, &Meta::of(x))?;
    let r = x.rank();
    if (r != 4 && r != 5) || x.shape()[r - 3..].contains(&0) {
        return Err(Error::shape(
            op,
            format!(
                "expected a 4-D [C, D, H, W] or 5-D [N, C, D, H, W] input with non-zero D, H \
                 and W, got shape {}",
                fmt_shape(x.shape())
            ),
        ));
    }
    Ok(match r {
        5 => (x.clone(), true),
        _ => (x.unsqueeze(0)?, false),
    })
}

/// `out` `[N, C, D', H', W']` without its batch dim when the input had none.
pub(super) fn unbatch(out: Tensor, batched: bool) -> Result<Tensor> {
    if batched { Ok(out) } else { out.squeeze_dim(0) }
}

/// The depth of every tap `i` of output depth `o`: `starts[o] + i·dil`.
fn tap_depths(starts: &[isize], taps: usize, dil: usize) -> Vec<Vec<isize>> {
    (0..taps)
        .map(|i| starts.iter().map(|&s| s + (i * dil) as isize).collect())
        .collect()
}

/// The slices at `depths` (one per output depth; those outside `[0, len)` read slice 0, or
/// hold `fill` where given), pooled by `pool` with depth folded into the channels; gives
/// `[N, C, od, H', W']`.
fn pool_slices(
    x: &Tensor,
    depths: &[isize],
    fill: Option<f64>,
    pool: impl Fn(&Tensor) -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    let [n, c, len, h, w] = [0, 1, 2, 3, 4].map(|i| x.shape()[i]);
    let od = depths.len();
    let valid = inside(depths, len);
    let idx: Vec<i64> = depths
        .iter()
        .zip(&valid)
        .map(|(&d, &ok)| if ok { d as i64 } else { 0 })
        .collect();
    let idx = Tensor::from_vec(idx, [od], x.device())?;
    let mut slices = x.index_select(2, &idx)?;
    if let Some(v) = fill {
        slices = crate::where_(&per_depth(valid, x)?, &slices, &slices.full_like(v)?)?;
    }
    let slices = slices.reshape([n, c * od, h, w])?;
    pool(&slices)?
        .into_iter()
        .map(|t| {
            let (oh, ow) = (t.shape()[2], t.shape()[3]);
            t.reshape([n, c, od, oh, ow])
        })
        .collect()
}

/// A `[1, 1, od, 1, 1]` tensor of one value per output depth.
fn per_depth<T: tpu_tensor::Element>(v: Vec<T>, x: &Tensor) -> Result<Tensor> {
    let od = v.len();
    Tensor::from_vec(v, [1, 1, od, 1, 1], x.device())
}

/// Whether each depth lies in `[0, len)`.
fn inside(depths: &[isize], len: usize) -> Vec<bool> {
    depths
        .iter()
        .map(|&d| (0..len as isize).contains(&d))
        .collect()
}

/// The sum over taps (each its depths and which of them count) of `pool` of the tap's
/// slices, a tap that does not count adding 0.
fn sum_taps(
    op: &str,
    x: &Tensor,
    taps: impl IntoIterator<Item = (Vec<isize>, Vec<bool>)>,
    pool: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let mut sum: Option<Tensor> = None;
    for (depths, valid) in taps {
        let a = pool_slices(x, &depths, None, |s| Ok(vec![pool(s)?]))?.remove(0);
        let a = crate::where_(&per_depth(valid, x)?, &a, &a.zeros_like()?)?;
        sum = Some(match sum {
            None => a,
            Some(s) => s.add(&a)?,
        });
    }
    sum.ok_or_else(|| Error::internal(op, "a window without taps"))
}

/// The kernel, stride, padding and dilation of a 3-D pooling op, and the output depth, checked
/// as the 2-D ops check theirs (the 2-D op checks height and width).
struct Depth {
    k: Vec<usize>,
    s: Vec<usize>,
    p: Vec<usize>,
    d: Vec<usize>,
    /// Each output depth's first tap (may be in the padding).
    starts: Vec<isize>,
}

impl Depth {
    fn new(
        op: &str,
        len: usize,
        kernel: &Ints,
        stride: &Option<Ints>,
        padding: &Ints,
        dilation: &Ints,
        ceil: bool,
    ) -> Result<Depth> {
        let k = kernel.positive(op, "kernel_size", 3)?;
        let s = match stride {
            Some(s) => s.positive(op, "stride", 3)?,
            None => k.clone(),
        };
        let p = padding.resolve(op, "padding", 3)?;
        let d = dilation.positive(op, "dilation", 3)?;
        let eff = arith(
            op,
            "dilated kernel",
            dilated(k[0], d[0]).filter(|&e| e <= isize::MAX as usize / 4),
        )?;
        if p[0] > eff / 2 {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "padding must be at most half of the effective kernel size, got padding \
                     {p:?}, kernel_size {k:?}, dilation {d:?}"
                ),
            ));
        }
        let out = pool_out(len, k[0], s[0], p[0], d[0], ceil).ok_or_else(|| {
            Error::shape(
                op,
                format!(
                    "a depth of {len} with kernel_size {k:?}, stride {s:?}, padding {p:?}, \
                     dilation {d:?} gives an empty output"
                ),
            )
        })?;
        let starts = (0..out)
            .map(|o| (o * s[0]) as isize - p[0] as isize)
            .collect();
        Ok(Depth { k, s, p, d, starts })
    }
}

/// `max_pool3d` of `[N, C, D, H, W]` or `[C, D, H, W]` (NaN propagates).
pub fn max_pool3d(x: &Tensor, opts: &MaxPoolOptions) -> Result<Tensor> {
    Ok(max_pool3d_with_indices(x, opts)?.0)
}

/// `max_pool3d` with each maximum's index (i64) within its `D × H × W` volume (see the
/// module doc).
pub fn max_pool3d_with_indices(x: &Tensor, o: &MaxPoolOptions) -> Result<(Tensor, Tensor)> {
    const OP: &str = "max_pool3d";
    let (x, batched) = five_d(OP, x)?;
    let [len, h, w] = [2, 3, 4].map(|i| x.shape()[i]);
    let g = Depth::new(
        OP,
        len,
        &o.kernel_size,
        &o.stride,
        &o.padding,
        &o.dilation,
        o.ceil_mode,
    )?;
    let opts2 = MaxPoolOptions::new([g.k[1], g.k[2]])
        .stride([g.s[1], g.s[2]])
        .padding([g.p[1], g.p[2]])
        .dilation([g.d[1], g.d[2]])
        .ceil_mode(o.ceil_mode);
    let depths = tap_depths(&g.starts, g.k[0], g.d[0]);
    let mut best: Option<(Tensor, Tensor)> = None;
    for (i, col) in depths.iter().enumerate() {
        // A tap in the padding pools a slice of -inf: its value never wins, and where it
        // starts a window with no tap inside, its index is the window's first, as PyTorch's.
        let mut pooled = pool_slices(&x, col, Some(f64::NEG_INFINITY), |s| {
            let (v, j) = s.max_pool2d_with_indices(&opts2)?;
            Ok(vec![v, j])
        })?;
        let (v, j) = (pooled.remove(0), pooled.remove(0));
        let valid = inside(col, len);
        // PyTorch starts each window at its first tap at or past depth 0.
        let first: Vec<bool> = g
            .starts
            .iter()
            .map(|&s| i == first_tap(s, g.d[0]))
            .collect();
        let valid_t = per_depth(valid, &x)?;
        let base: Vec<i64> = col
            .iter()
            .map(|&d| d.max(0) as i64 * (h * w) as i64)
            .collect();
        let j = j.add(&per_depth(base, &x)?)?;
        let first_t = per_depth(first, &x)?;
        best = Some(match best {
            None => (v, j),
            Some((bv, bj)) => {
                let better = v.gt(&bv)?.logical_or(&v.isnan()?)?.logical_and(&valid_t)?;
                let take = better.logical_or(&first_t)?;
                (
                    crate::where_(&take, &v, &bv)?,
                    crate::where_(&take, &j, &bj)?,
                )
            }
        });
    }
    let (v, j) = best.ok_or_else(|| Error::internal(OP, "a kernel without taps"))?;
    Ok((unbatch(v, batched)?, unbatch(j, batched)?))
}

/// The first tap at or past depth 0 of a window starting at `start`.
fn first_tap(start: isize, dil: usize) -> usize {
    if start >= 0 {
        0
    } else {
        start.unsigned_abs().div_ceil(dil)
    }
}

/// `avg_pool3d` of `[N, C, D, H, W]` or `[C, D, H, W]`.
pub fn avg_pool3d(x: &Tensor, o: &AvgPoolOptions) -> Result<Tensor> {
    const OP: &str = "avg_pool3d";
    let (x, batched) = five_d(OP, x)?;
    if o.divisor_override == Some(0) {
        return Err(Error::invalid_argument(
            OP,
            "expected divisor_override to be non-zero, got 0",
        ));
    }
    let len = x.shape()[2];
    let g = Depth::new(
        OP,
        len,
        &o.kernel_size,
        &o.stride,
        &o.padding,
        &1.into(),
        o.ceil_mode,
    )?;
    // With an override the taps' sums add up, divided once at the end.
    let opts2 = AvgPoolOptions::new([g.k[1], g.k[2]])
        .stride([g.s[1], g.s[2]])
        .padding([g.p[1], g.p[2]])
        .ceil_mode(o.ceil_mode)
        .count_include_pad(o.count_include_pad)
        .divisor_override(o.divisor_override.map(|_| 1));
    let taps = tap_depths(&g.starts, g.k[0], 1).into_iter().map(|col| {
        let valid = inside(&col, len);
        (col, valid)
    });
    let sum = sum_taps(OP, &x, taps, |s| s.avg_pool2d(&opts2))?;
    let out = match o.divisor_override {
        Some(div) => sum.div(div as f64)?,
        None => {
            let divisors: Vec<f64> = g
                .starts
                .iter()
                .map(|&start| {
                    let end = (start + g.k[0] as isize).min((len + g.p[0]) as isize);
                    match o.count_include_pad {
                        true => (end - start) as f64,
                        false => (end.min(len as isize) - start.max(0)).max(0) as f64,
                    }
                })
                .collect();
            sum.div(&per_depth(divisors, &x)?.to(sum.dtype())?)?
        }
    };
    unbatch(out, batched)
}

/// `adaptive_avg_pool3d` of `[N, C, D, H, W]` or `[C, D, H, W]` to `output_size` (one value
/// for every dim, or depth, height and width).
pub fn adaptive_avg_pool3d(x: &Tensor, output_size: impl Into<Ints>) -> Result<Tensor> {
    const OP: &str = "adaptive_avg_pool3d";
    let size = output_size.into().resolve(OP, "output_size", 3)?;
    let (x, batched) = five_d(OP, x)?;
    let len = x.shape()[2];
    if size[0] == 0 {
        return Err(Error::invalid_argument(
            OP,
            format!("expected a non-zero output depth, got output_size {size:?}"),
        ));
    }
    let windows = adaptive_windows(len, size[0]);
    let taps = windows.iter().map(|(s, e)| e - s).max().unwrap_or(1);
    let starts: Vec<isize> = windows.iter().map(|&(s, _)| s as isize).collect();
    let taps = tap_depths(&starts, taps, 1)
        .into_iter()
        .enumerate()
        .map(|(i, col)| {
            let valid = windows.iter().map(|&(s, e)| s + i < e).collect();
            (col, valid)
        });
    let sum = sum_taps(OP, &x, taps, |s| s.adaptive_avg_pool2d([size[1], size[2]]))?;
    let counts: Vec<f64> = windows.iter().map(|&(s, e)| (e - s) as f64).collect();
    unbatch(sum.div(&per_depth(counts, &x)?.to(sum.dtype())?)?, batched)
}
