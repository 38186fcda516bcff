//! `conv3d`, `conv_transpose3d` and `conv_transpose1d` as compositions of the 2-D
//! convolutions, so they run on every device and differentiate through those ops.
//!
//! A 3-D kernel is a run of `kd` depth taps, each a 2-D kernel. For `conv3d`, tap `t` of
//! output depth `o` reads input depth `o·sd + t·dd` of the depth-padded input: per tap, those
//! slices for every output depth are gathered at once (`index_select`), folded into the batch
//! and convolved with the tap's 2-D kernel; the taps' results add up. `conv_transpose3d` is the
//! adjoint: each input depth slice is transposed-convolved with every tap's 2-D kernel and
//! added at output depth `i·sd + t·dd` (one `index_add` for all taps), then the depth padding
//! is cropped. A 1-D transposed convolution is the 2-D one over a height of 1.
//!
//! An op so costs `kd` 2-D convolutions of `N·D'` images; `stablehlo.convolution` could take
//! three spatial dims at once, but the CPU kernels are 2-D, and a composition keeps one path
//! (and one backward rule) on every device.

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Error, Result, Tensor};

use super::options::{ConvOptions, ConvTransposeOptions, Padding};
use super::pool3d::{five_d, unbatch};
use super::{ConvOps, arith, dilated};
use crate::TensorOps;
use crate::ops::movement::{MovementOps, PadMode, cat};

/// Checks the weight (`rank` dims) and the bias against an input of dtype `dtype` and `c`
/// channels, giving the output channels: a convolution's weight holds `in / groups` input
/// channels, a transposed one's all of them and `out / groups` outputs.
fn check_weight(
    op: &str,
    dtype: DType,
    c: usize,
    weight: &Tensor,
    bias: Option<&Tensor>,
    groups: usize,
    rank: usize,
) -> Result<usize> {
    let transposed = op.contains("transpose");
    let layout = if transposed {
        "in_channels, out_channels / groups, kernel..."
    } else {
        "out_channels, in_channels / groups, kernel..."
    };
    let ws = weight.shape();
    if ws.len() != rank {
        return Err(Error::shape(
            op,
            format!(
                "expected a {rank}-D weight [{layout}], got shape {}",
                fmt_shape(ws)
            ),
        ));
    }
    if groups == 0 {
        return Err(Error::invalid_argument(
            op,
            "expected groups to be positive, got 0",
        ));
    }
    let (fits, out) = if transposed {
        let out = ws[1].checked_mul(groups);
        (
            ws[0] == c && c.is_multiple_of(groups) && out.is_some(),
            out.unwrap_or(0),
        )
    } else {
        let fits = ws[1].checked_mul(groups) == Some(c) && ws[0].is_multiple_of(groups);
        (fits, ws[0])
    };
    if !fits {
        return Err(Error::shape(
            op,
            format!(
                "a weight of shape {} with groups={groups} does not fit an input with {c} channels",
                fmt_shape(ws)
            ),
        ));
    }
    if ws[2..].contains(&0) {
        return Err(Error::shape(
            op,
            format!(
                "expected a non-empty kernel, got weight of shape {}",
                fmt_shape(ws)
            ),
        ));
    }
    if let Some(b) = bias
        && b.shape() != [out]
    {
        return Err(Error::shape(
            op,
            format!(
                "expected a bias of shape [{out}], got {}",
                fmt_shape(b.shape())
            ),
        ));
    }
    for (what, t) in [("weight", Some(weight)), ("bias", bias)] {
        if let Some(t) = t
            && t.dtype() != dtype
        {
            return Err(Error::DTypeMismatch {
                context: format!(
                    "{op}: {what} of shape {} must have the input's dtype",
                    fmt_shape(t.shape())
                ),
                expected: dtype,
                given: t.dtype(),
            });
        }
    }
    Ok(out)
}

/// `F.conv3d`: `[N, C, D, H, W]` or `[C, D, H, W]` with a weight `[out, C / groups, kd, kh, kw]`
/// and an optional bias `[out]`.
pub fn conv3d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    opts: &ConvOptions,
) -> Result<Tensor> {
    const OP: &str = "conv3d";
    let (x, batched) = five_d(OP, x)?;
    let [n, c, d, _, _] = [0, 1, 2, 3, 4].map(|i| x.shape()[i]);
    let out = check_weight(OP, x.dtype(), c, weight, bias, opts.groups, 5)?;
    let stride = opts.stride.positive(OP, "stride", 3)?;
    let dil = opts.dilation.positive(OP, "dilation", 3)?;
    let kd = weight.shape()[2];
    let span: Vec<usize> = (0..3)
        .map(|i| arith(OP, "dilated kernel", dilated(weight.shape()[2 + i], dil[i])))
        .collect::<Result<_>>()?;
    let pads = match opts.padding.sides(OP, 3, &stride)? {
        Some(p) => p,
        // "same": the dilated kernel's extent less one, the odd one after.
        None => span
            .iter()
            .map(|&k| [(k - 1) / 2, (k - 1) - (k - 1) / 2])
            .collect(),
    };
    let padded = arith(
        OP,
        "padded input",
        d.checked_add(pads[0][0])
            .and_then(|v| v.checked_add(pads[0][1])),
    )?;
    if padded < span[0] {
        return Err(Error::shape(
            OP,
            format!(
                "the padded input depth ({padded}) is smaller than the dilated kernel depth ({}); input shape {}, weight shape {}",
                span[0],
                fmt_shape(x.shape()),
                fmt_shape(weight.shape())
            ),
        ));
    }
    let od = (padded - span[0]) / stride[0] + 1;
    let x = if pads[0] == [0, 0] {
        x
    } else {
        x.pad(
            &[0, 0, 0, 0, pads[0][0], pads[0][1]],
            PadMode::Constant(0.into()),
        )?
    };
    let opts2d = ConvOptions::new()
        .stride([stride[1], stride[2]])
        .padding(Padding::Sides(vec![pads[1], pads[2]]))
        .dilation([dil[1], dil[2]])
        .groups(opts.groups);
    let mut sum: Option<Tensor> = None;
    for t in 0..kd {
        let depths: Vec<i64> = (0..od)
            .map(|o| (o * stride[0] + t * dil[0]) as i64)
            .collect();
        let idx = Tensor::from_vec(depths, [od], x.device())?;
        let slices = x.index_select(2, &idx)?.permute([0, 2, 1, 3, 4])?;
        let [h, w] = [slices.shape()[3], slices.shape()[4]];
        let slices = slices.reshape([n * od, c, h, w])?;
        let y = slices.conv2d(&weight.select(2, t as i64)?, None, &opts2d)?;
        sum = Some(match sum {
            None => y,
            Some(s) => s.add(&y)?,
        });
    }
    let y = sum.ok_or_else(|| Error::internal(OP, "a kernel without depth taps"))?;
    let [oh, ow] = [y.shape()[2], y.shape()[3]];
    let y = y.reshape([n, od, out, oh, ow])?.permute([0, 2, 1, 3, 4])?;
    finish(y, bias, batched)
}

/// `[N, out, D', H', W']` (a permuted view) plus the bias, laid out afresh, without its batch
/// dim when the input had none.
fn finish(y: Tensor, bias: Option<&Tensor>, batched: bool) -> Result<Tensor> {
    let y = match bias {
        Some(b) => y.add(&b.reshape([1, b.numel(), 1, 1, 1])?)?,
        None => y.contiguous()?,
    };
    unbatch(y, batched)
}

/// The transposed convolution's options resolved for `sp` spatial dims: stride, padding,
/// output padding and dilation, with PyTorch's rule that an output padding is smaller than the
/// stride or the dilation.
fn transposed_options(op: &str, opts: &ConvTransposeOptions, sp: usize) -> Result<[Vec<usize>; 4]> {
    let stride = opts.stride.positive(op, "stride", sp)?;
    let pad = opts.padding.resolve(op, "padding", sp)?;
    let out_pad = opts.output_padding.resolve(op, "output_padding", sp)?;
    let dil = opts.dilation.positive(op, "dilation", sp)?;
    for i in 0..sp {
        if out_pad[i] >= stride[i] && out_pad[i] >= dil[i] {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "expected output_padding smaller than the stride or the dilation, got output_padding {out_pad:?}, stride {stride:?}, dilation {dil:?}"
                ),
            ));
        }
    }
    Ok([stride, pad, out_pad, dil])
}

/// `F.conv_transpose3d`: `[N, C, D, H, W]` or `[C, D, H, W]` with a weight
/// `[C, out / groups, kd, kh, kw]` and an optional bias `[out]`.
pub fn conv_transpose3d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    opts: &ConvTransposeOptions,
) -> Result<Tensor> {
    const OP: &str = "conv_transpose3d";
    let (x, batched) = five_d(OP, x)?;
    let [n, c, d, h, w] = [0, 1, 2, 3, 4].map(|i| x.shape()[i]);
    let out = check_weight(OP, x.dtype(), c, weight, bias, opts.groups, 5)?;
    let [stride, pad, out_pad, dil] = transposed_options(OP, opts, 3)?;
    let kd = weight.shape()[2];
    let span = arith(OP, "dilated kernel", dilated(kd, dil[0]))?;
    // Output depths before cropping the padding: every tap of every input depth lands inside.
    let full = arith(
        OP,
        "output depth",
        (d - 1)
            .checked_mul(stride[0])
            .and_then(|v| v.checked_add(span + out_pad[0])),
    )?;
    if full <= 2 * pad[0] {
        return Err(Error::shape(
            OP,
            format!(
                "the output depth would be {} (input depth {d}, padding {}), expected at least 1",
                full as i64 - 2 * pad[0] as i64,
                pad[0]
            ),
        ));
    }
    let od = full - 2 * pad[0];
    let opts2d = ConvTransposeOptions::new()
        .stride([stride[1], stride[2]])
        .padding([pad[1], pad[2]])
        .output_padding([out_pad[1], out_pad[2]])
        .dilation([dil[1], dil[2]])
        .groups(opts.groups);
    let slices = x.permute([0, 2, 1, 3, 4])?.reshape([n * d, c, h, w])?;
    let mut taps = Vec::with_capacity(kd);
    let mut at = Vec::with_capacity(kd * d);
    for t in 0..kd {
        let y = slices.conv_transpose2d(&weight.select(2, t as i64)?, None, &opts2d)?;
        let [oh, ow] = [y.shape()[2], y.shape()[3]];
        taps.push(y.reshape([n, d, out, oh, ow])?);
        at.extend((0..d).map(|i| (i * stride[0] + t * dil[0]) as i64));
    }
    let taps: Vec<&Tensor> = taps.iter().collect();
    let all = cat(&taps, 1)?;
    let [oh, ow] = [all.shape()[3], all.shape()[4]];
    let at = Tensor::from_vec(at, [kd * d], x.device())?;
    let y = Tensor::zeros([n, full, out, oh, ow], x.dtype(), x.device())?
        .index_add(1, &at, &all, 1)?
        .narrow(1, pad[0] as i64, od)?
        .permute([0, 2, 1, 3, 4])?;
    finish(y, bias, batched)
}

/// `F.conv_transpose1d`: `[N, C, L]` or `[C, L]` with a weight `[C, out / groups, k]` and an
/// optional bias `[out]`, as the 2-D op over a height of 1.
pub fn conv_transpose1d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    opts: &ConvTransposeOptions,
) -> Result<Tensor> {
    const OP: &str = "conv_transpose1d";
    let batched = match x.rank() {
        3 => true,
        2 => false,
        _ => {
            return Err(Error::shape(
                OP,
                format!(
                    "expected a 2-D [C, L] or 3-D [N, C, L] input, got shape {}",
                    fmt_shape(x.shape())
                ),
            ));
        }
    };
    let x = if batched { x.clone() } else { x.unsqueeze(0)? };
    check_weight(OP, x.dtype(), x.shape()[1], weight, bias, opts.groups, 3)?;
    let [stride, pad, out_pad, dil] = transposed_options(OP, opts, 1)?;
    let opts2d = ConvTransposeOptions::new()
        .stride([1, stride[0]])
        .padding([0, pad[0]])
        .output_padding([0, out_pad[0]])
        .dilation([1, dil[0]])
        .groups(opts.groups);
    let y = x
        .unsqueeze(2)?
        .conv_transpose2d(&weight.unsqueeze(2)?, bias, &opts2d)?
        .squeeze_dim(2)?;
    if batched { Ok(y) } else { y.squeeze_dim(0) }
}
