//! The backward rules of the convolutions, made of ops so that gradients run where the forward
//! ran: a convolution differentiates into a transposed convolution (input) and a convolution
//! (weight), and a transposed convolution the other way round.

use tpu_tensor::{Result, Tensor};

use crate::autograd::Saved;
use crate::op::{Grads, Meta};
use crate::ops::reduce::ReduceOps;

use super::{Conv, ConvGeom, ConvTranspose2d, Pad};

/// The gradients of `conv1d` and `conv2d`'s input, weight and bias.
pub(super) fn conv(op: &Conv, saved: &Saved, g: &Tensor) -> Grads {
    let n_in = saved.inputs.len();
    let metas: Vec<Meta> = saved.inputs.iter().map(Meta::of).collect();
    let (geo, _) = op.geom(&metas)?;
    let (x, w) = (&saved.inputs[0], &saved.inputs[1]);
    // 1-D and unbatched convolutions are 2-D batched ones, as in the forward.
    let x4 = x.reshape([geo.n, geo.c, geo.h, geo.w])?;
    let w4 = w.reshape([geo.o, geo.c / geo.groups, geo.kh, geo.kw])?;
    let g4 = g.reshape([geo.n, geo.o, geo.oh, geo.ow])?;
    let gx = conv_input_grad(&g4, &w4, &geo)?.reshape(x.shape())?;
    let gw = conv_weight_grad(&x4, &g4, &geo)?.reshape(w.shape())?;
    with_bias_grad(gx, gw, &g4, n_in)
}

/// The gradient of a convolution's input `[N, C, H, W]` from the output's gradient `g4`: the
/// transposed convolution of `g4` with the same weight `w4`. It runs without padding, so its
/// result covers the padded input (grown at the end to cover rows no window reached, whose
/// gradient is zero), and is then cut back to the input.
fn conv_input_grad(g4: &Tensor, w4: &Tensor, geo: &ConvGeom) -> Result<Tensor> {
    let (len, out, k) = ([geo.h, geo.w], [geo.oh, geo.ow], [geo.kh, geo.kw]);
    let mut extra = [0; 2];
    for i in 0..2 {
        let reach = (out[i] - 1) * geo.stride[i] + geo.dil[i] * (k[i] - 1) + 1;
        extra[i] = (geo.pad[i][0] + len[i]).saturating_sub(reach);
    }
    // Built directly: the public constructor limits output padding to what PyTorch accepts,
    // while the kernels and the lowering take any amount.
    let op = ConvTranspose2d {
        stride: geo.stride,
        padding: [0, 0],
        output_padding: extra,
        dilation: geo.dil,
        groups: geo.groups,
    };
    crate::exec::dispatch::run1(&op, &[g4, w4])?
        .narrow(2, geo.pad[0][0] as i64, geo.h)?
        .narrow(3, geo.pad[1][0] as i64, geo.w)
}

/// The gradient of a convolution's weight `[O, C / groups, kh, kw]`: for each tap, the sum
/// over the batch and the output positions of the gradient times the input it multiplied.
fn conv_weight_grad(x4: &Tensor, g4: &Tensor, geo: &ConvGeom) -> Result<Tensor> {
    let (cg, og) = (geo.c / geo.groups, geo.o / geo.groups);
    let xs = [cg, geo.h, geo.w];
    let gs = [og, geo.oh, geo.ow];
    batch_correlation(x4, xs, g4, gs, geo, geo.dil, geo.stride)
}

/// Correlates `a` `[N, groups * a[0], a[1], a[2]]` with `b` `[N, groups * b[0], b[1], b[2]]`
/// over the batch, which is the weight's gradient of a convolution (`a` the input, `b` the
/// output's gradient) and of a transposed one (the other way round). That is itself a
/// convolution, with `a`'s channels as the batch, the batch as the channels, `b` as the kernel,
/// and stride and dilation swapped by the caller; its output can reach past the kernel (rows of
/// the padded input no window used), which is cut off. The result is `[groups * b[0], a[0],
/// kh, kw]`.
fn batch_correlation(
    a: &Tensor,
    [pa, ha, wa]: [usize; 3],
    b: &Tensor,
    [pb, hb, wb]: [usize; 3],
    geo: &ConvGeom,
    stride: [usize; 2],
    dilation: [usize; 2],
) -> Result<Tensor> {
    let (gr, n) = (geo.groups, geo.n);
    // Channel `k * n + i` of the rearranged `a` is image `i`'s channel of group `k`, so
    // group `k` of the convolution pairs it with `b`'s channels of group `k`.
    let xin = a
        .reshape([n, gr, pa, ha, wa])?
        .permute([2, 1, 0, 3, 4])?
        .reshape([pa, gr * n, ha, wa])?;
    let ker = b
        .reshape([n, gr, pb, hb, wb])?
        .permute([1, 2, 0, 3, 4])?
        .reshape([gr * pb, n, hb, wb])?;
    let op = Conv {
        spatial: 2,
        stride,
        pad: Pad::Sides(geo.pad),
        dilation,
        groups: gr,
    };
    crate::exec::dispatch::run1(&op, &[&xin, &ker])?
        .narrow(2, 0, geo.kh)?
        .narrow(3, 0, geo.kw)?
        .permute([1, 0, 2, 3])
}

/// The gradients of `conv_transpose2d`'s input, weight and bias.
pub(super) fn conv_transpose(op: &ConvTranspose2d, saved: &Saved, g: &Tensor) -> Grads {
    let n_in = saved.inputs.len();
    let metas: Vec<Meta> = saved.inputs.iter().map(Meta::of).collect();
    let (geo, _) = op.geom(&metas)?;
    let (x, w) = (&saved.inputs[0], &saved.inputs[1]);
    let (gr, n) = (geo.groups, geo.n);
    let (cg, og) = (geo.c / gr, geo.o / gr);
    let x4 = x.reshape([n, geo.c, geo.h, geo.w])?;
    let g4 = g.reshape([n, geo.o, geo.oh, geo.ow])?;
    // The input's gradient is the convolution of `g` with the same weight (a convolution
    // is the adjoint of the transposed one). Output padding can leave it a little larger
    // than the input; the extra rows belong to no input element.
    let conv = Conv {
        spatial: 2,
        stride: op.stride,
        pad: Pad::Sides(geo.pad),
        dilation: op.dilation,
        groups: gr,
    };
    let gx = crate::exec::dispatch::run1(&conv, &[&g4, w])?
        .narrow(2, 0, geo.h)?
        .narrow(3, 0, geo.w)?
        .reshape(x.shape())?;
    // The weight's gradient correlates `g` with the input over the batch, `g`'s channels
    // of a group being the batch of that group.
    let gw = batch_correlation(
        &g4,
        [og, geo.oh, geo.ow],
        &x4,
        [cg, geo.h, geo.w],
        &geo,
        op.dilation,
        op.stride,
    )?;
    with_bias_grad(gx, gw, &g4, n_in)
}

/// The input's and weight's gradients, and the bias's (the output's gradient summed over all
/// but the channels) when the op had a bias.
fn with_bias_grad(gx: Tensor, gw: Tensor, g4: &Tensor, n_in: usize) -> Result<Vec<Option<Tensor>>> {
    let mut res = vec![Some(gx.contiguous()?), Some(gw.contiguous()?)];
    if n_in == 3 {
        res.push(Some(g4.sum(&[0, 2, 3], false)?));
    }
    Ok(res)
}
