//! Pooling (`max_pool2d`, `avg_pool2d`, `adaptive_avg_pool2d`): the op structs, their window
//! geometry and shape rules, and `OpDef` impls that hand the kernels, lowerings and backward
//! rules to the files below.

mod cpu;
mod grad;
mod lower;

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Error, Result, Tensor};

use crate::op::args::check_float;
use crate::op::{Meta, OpDef, op_parts};

use super::options::{AvgPoolOptions, MaxPoolOptions};
use super::{arith, dilated, nchw, pair, single};

/// Window geometry of a 2-D pooling op over `[P, H, W]` planes.
#[derive(Clone, Copy, Debug)]
struct PoolGeom {
    planes: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
}

/// PyTorch's pooling output size (`pooling_output_shape`), or `None` when it is below 1.
pub(super) fn pool_out(
    len: usize,
    k: usize,
    s: usize,
    p: usize,
    d: usize,
    ceil: bool,
) -> Option<usize> {
    // In i128, where sums and the products below of sizes that fit a usize cannot overflow.
    let (len, k, s, p, d) = (len as i128, k as i128, s as i128, p as i128, d as i128);
    let num = len + 2 * p - d.checked_mul(k - 1)? - 1 + if ceil { s - 1 } else { 0 };
    let mut out = num.div_euclid(s) + 1;
    // The last window must start inside the input or its left padding.
    if ceil && (out - 1) * s >= len + p {
        out -= 1;
    }
    (out >= 1).then(|| usize::try_from(out).ok()).flatten()
}

/// Checks a pooling input and options and returns the geometry and the output shape.
fn pool_geom(
    op: &str,
    x: &Meta,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    ceil: bool,
) -> Result<(PoolGeom, Vec<usize>)> {
    check_float(op, x)?;
    let ok_rank = x.rank() == 4 || x.rank() == 3;
    let dims = &x.shape[x.rank().saturating_sub(3)..];
    if !ok_rank || dims.contains(&0) {
        return Err(Error::shape(
            op,
            format!(
                "expected a 3-D [C, H, W] or 4-D [N, C, H, W] input with non-zero C, H and W, got shape {}",
                fmt_shape(&x.shape)
            ),
        ));
    }
    for i in 0..2 {
        // Kernels stay well inside isize, so the kernels' window arithmetic cannot overflow.
        let eff = arith(
            op,
            "dilated kernel",
            dilated(k[i], d[i]).filter(|&e| e <= isize::MAX as usize / 4),
        )?;
        if p[i] > eff / 2 {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "padding must be at most half of the effective kernel size, got padding {p:?}, kernel_size {k:?}, dilation {d:?}"
                ),
            ));
        }
    }
    let [n, c, h, w] = nchw(&x.shape);
    let oh = pool_out(h, k[0], s[0], p[0], d[0], ceil);
    let ow = pool_out(w, k[1], s[1], p[1], d[1], ceil);
    let (Some(oh), Some(ow)) = (oh, ow) else {
        return Err(Error::shape(
            op,
            format!(
                "input of shape {} with kernel_size {k:?}, stride {s:?}, padding {p:?}, dilation {d:?} gives an empty output",
                fmt_shape(&x.shape)
            ),
        ));
    };
    let mut out = x.shape[..x.rank() - 2].to_vec();
    out.extend([oh, ow]);
    let g = PoolGeom {
        planes: n * c,
        h,
        w,
        oh,
        ow,
        k,
        s,
        p,
        d,
    };
    Ok((g, out))
}

/// First window tap at or after `start` (stepping by `d`) and the end of the window, clipped
/// to `[0, len)`.
fn taps(start: isize, k: usize, d: usize, len: usize) -> (usize, usize) {
    let end = (start + ((k - 1) * d + 1) as isize).min(len as isize);
    // The first tap at or after 0, in one step: padding may be billions of taps wide.
    let s = if start < 0 {
        start + (start.unsigned_abs().div_ceil(d) * d) as isize
    } else {
        start
    };
    (s as usize, end.max(0) as usize)
}

/// `max_pool2d`, optionally with PyTorch's indices (flat within each `H x W` plane) as a
/// second output.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MaxPool2dOp {
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    ceil_mode: bool,
    indices: bool,
}

impl MaxPool2dOp {
    pub(super) fn new(o: &MaxPoolOptions, indices: bool) -> Result<MaxPool2dOp> {
        let name = "max_pool2d";
        let k = o.kernel_size.positive(name, "kernel_size", 2)?;
        let s = match &o.stride {
            Some(s) => s.positive(name, "stride", 2)?,
            None => k.clone(),
        };
        Ok(MaxPool2dOp {
            k: pair(k),
            s: pair(s),
            p: pair(o.padding.resolve(name, "padding", 2)?),
            d: pair(o.dilation.positive(name, "dilation", 2)?),
            ceil_mode: o.ceil_mode,
            indices,
        })
    }

    fn geom(&self, x: &Meta) -> Result<(PoolGeom, Vec<usize>)> {
        pool_geom(
            self.name(),
            x,
            self.k,
            self.s,
            self.p,
            self.d,
            self.ceil_mode,
        )
    }
}

impl OpDef for MaxPool2dOp {
    fn name(&self) -> &'static str {
        "max_pool2d"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = single(self.name(), inputs)?;
        let (_, out) = self.geom(x)?;
        let mut metas = vec![Meta::new(&out, x.dtype)];
        if self.indices {
            metas.push(Meta::new(&out, DType::I64));
        }
        Ok(metas)
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let (g, _) = self.geom(&Meta::of(inputs[0]))?;
        cpu::max_pool(&g, inputs[0], outputs, self.indices)
    }

    op_parts! {
        lower: lower::max_pool,
        grad: grad::max_pool,
    }
}

/// `avg_pool2d`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AvgPool2d {
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: Option<usize>,
}

impl AvgPool2d {
    pub(super) fn new(o: &AvgPoolOptions) -> Result<AvgPool2d> {
        let name = "avg_pool2d";
        let k = o.kernel_size.positive(name, "kernel_size", 2)?;
        let s = match &o.stride {
            Some(s) => s.positive(name, "stride", 2)?,
            None => k.clone(),
        };
        if o.divisor_override == Some(0) {
            return Err(Error::invalid_argument(
                name,
                "expected divisor_override to be non-zero, got 0",
            ));
        }
        Ok(AvgPool2d {
            k: pair(k),
            s: pair(s),
            p: pair(o.padding.resolve(name, "padding", 2)?),
            ceil_mode: o.ceil_mode,
            count_include_pad: o.count_include_pad,
            divisor_override: o.divisor_override,
        })
    }

    fn geom(&self, x: &Meta) -> Result<(PoolGeom, Vec<usize>)> {
        pool_geom(
            self.name(),
            x,
            self.k,
            self.s,
            self.p,
            [1, 1],
            self.ceil_mode,
        )
    }

    /// PyTorch's divisor for each output index along dim `i`: the window clipped to the
    /// padded input, or to the input itself without `count_include_pad`. (The 2-D divisor is
    /// the product of the two.)
    fn divisors(&self, g: &PoolGeom, i: usize) -> Vec<usize> {
        let (len, out) = if i == 0 { (g.h, g.oh) } else { (g.w, g.ow) };
        (0..out)
            .map(|o| {
                let start = (o * g.s[i]) as isize - g.p[i] as isize;
                let end = (start + g.k[i] as isize).min((len + g.p[i]) as isize);
                if self.count_include_pad {
                    (end - start) as usize
                } else {
                    (end.min(len as isize) - start.max(0)).max(0) as usize
                }
            })
            .collect()
    }
}

impl OpDef for AvgPool2d {
    fn name(&self) -> &'static str {
        "avg_pool2d"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = single(self.name(), inputs)?;
        let (_, out) = self.geom(x)?;
        Ok(vec![Meta::new(&out, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let (g, _) = self.geom(&Meta::of(inputs[0]))?;
        Ok(vec![cpu::avg_pool(self, &g, inputs[0], &outputs[0])?])
    }

    op_parts! {
        lower: lower::avg_pool,
        grad: grad::avg_pool,
    }
}

/// `adaptive_avg_pool2d`: output index `i` of `out` averages input `[floor(i * in / out),
/// ceil((i + 1) * in / out))`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AdaptiveAvgPool2d {
    pub(super) size: [usize; 2],
}

/// The windows of adaptive pooling along one dim: `(start, end)` per output index.
pub(super) fn adaptive_windows(len: usize, out: usize) -> Vec<(usize, usize)> {
    // In u128: `i * len` may pass usize when both sizes are huge.
    let (l, o) = (len as u128, out as u128);
    (0..out as u128)
        .map(|i| (((i * l) / o) as usize, ((i + 1) * l).div_ceil(o) as usize))
        .collect()
}

impl AdaptiveAvgPool2d {
    fn check(&self, x: &Meta) -> Result<Vec<usize>> {
        let op = self.name();
        check_float(op, x)?;
        let dims = &x.shape[x.rank().saturating_sub(3)..];
        if (x.rank() != 3 && x.rank() != 4) || dims[1] == 0 || dims[2] == 0 {
            return Err(Error::shape(
                op,
                format!(
                    "expected a 3-D [C, H, W] or 4-D [N, C, H, W] input with non-zero H and W, got shape {}",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        let mut out = x.shape[..x.rank() - 2].to_vec();
        out.extend(self.size);
        Ok(out)
    }
}

impl OpDef for AdaptiveAvgPool2d {
    fn name(&self) -> &'static str {
        "adaptive_avg_pool2d"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = single(self.name(), inputs)?;
        let out = self.check(x)?;
        Ok(vec![Meta::new(&out, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        Ok(vec![cpu::adaptive_avg_pool(self, inputs[0], &outputs[0])?])
    }

    op_parts! {
        lower: lower::adaptive_avg_pool,
        grad: grad::adaptive_avg_pool,
    }
}
