//! The backward rules of pooling, made of ops so that gradients run where the forward ran: max
//! pooling scatters into the indices of the maxima, average pooling is a transposed convolution
//! with a kernel of ones, adaptive pooling two spreads of the gradient over its windows.

use tpu_tensor::{Device, Error, Result, Tensor};

use crate::TensorOps;
use crate::autograd::Saved;
use crate::op::{Grads, Meta};
use crate::ops::conv::ConvTranspose2d;
use crate::ops::conv::nchw;
use crate::ops::movement::MovementOps;

use super::{AdaptiveAvgPool2d, AvgPool2d, MaxPool2dOp, adaptive_windows};

/// Each window's gradient goes to the element PyTorch reports as its maximum (the first
/// of equal maxima, or a NaN), added up where windows overlap.
pub(super) fn max_pool(op: &MaxPool2dOp, saved: &Saved, g: &Tensor) -> Grads {
    // The indices (a second output) have no gradient; only the values' counts.
    let x = &saved.inputs[0];
    let (geo, _) = op.geom(&Meta::of(x))?;
    let idx = if op.indices {
        saved.output(1)?.clone()
    } else {
        // The forward kept no indices; the same pooling with indices finds them again.
        let with_indices = MaxPool2dOp {
            indices: true,
            ..op.clone()
        };
        let mut out = crate::exec::dispatch::run(&with_indices, &[x])?;
        if out.len() != 2 {
            return Err(Error::internal("max_pool2d", "expected values and indices"));
        }
        out.remove(1)
    };
    let per = geo.oh * geo.ow;
    let g2 = g.reshape([geo.planes, per])?;
    let i2 = idx.reshape([geo.planes, per])?;
    let z = Tensor::zeros([geo.planes, geo.h * geo.w], g.dtype(), g.device())?;
    Ok(vec![Some(z.scatter_add(1, &i2, &g2)?.reshape(x.shape())?)])
}

/// Each window's gradient, divided by the window's divisor, is shared by the input
/// elements the window covers: a transposed convolution with a kernel of ones over the
/// padded input, cut back to the input.
pub(super) fn avg_pool(op: &AvgPool2d, saved: &Saved, g: &Tensor) -> Grads {
    let x = &saved.inputs[0];
    let (geo, _) = op.geom(&Meta::of(x))?;
    // The divisors depend only on the geometry (as in the forward's lowering).
    let div: Vec<f64> = match op.divisor_override {
        Some(d) => vec![d as f64; geo.oh * geo.ow],
        None => {
            let (dh, dw) = (op.divisors(&geo, 0), op.divisors(&geo, 1));
            dh.iter()
                .flat_map(|&a| dw.iter().map(move |&b| (a * b).max(1) as f64))
                .collect()
        }
    };
    let div = Tensor::from_vec(div, [geo.oh, geo.ow], &Device::cpu())?
        .to_dtype(g.dtype())?
        .to_device(g.device())?;
    let share = TensorOps::div(g, &div)?.reshape([geo.planes, 1, geo.oh, geo.ow])?;
    let ones = Tensor::ones([1, 1, geo.k[0], geo.k[1]], g.dtype(), g.device())?;
    let (len, out) = ([geo.h, geo.w], [geo.oh, geo.ow]);
    let mut extra = [0; 2];
    for i in 0..2 {
        let reach = (out[i] - 1) * geo.s[i] + geo.k[i];
        extra[i] = (geo.p[i] + len[i]).saturating_sub(reach);
    }
    let spread = ConvTranspose2d {
        stride: geo.s,
        padding: [0, 0],
        output_padding: extra,
        dilation: [1, 1],
        groups: 1,
    };
    let gx = crate::exec::dispatch::run1(&spread, &[&share, &ones])?
        .narrow(2, geo.p[0] as i64, geo.h)?
        .narrow(3, geo.p[1] as i64, geo.w)?
        .reshape(x.shape())?;
    Ok(vec![Some(gx.contiguous()?)])
}

/// The pooling is `A_h · x · A_wᵀ` for averaging matrices `A` (one row per window, `1 /
/// length` over its span), so the gradient is `A_hᵀ · g · A_w`: each input row (then
/// column) gathers the gradients of the windows covering it, divided by their lengths.
/// Gathered and added at indices rather than multiplied by `A`, so a NaN or infinite
/// gradient reaches only its window's elements (as in PyTorch), not every element through
/// the zeros of `A`.
pub(super) fn adaptive_avg_pool(op: &AdaptiveAvgPool2d, saved: &Saved, g: &Tensor) -> Grads {
    let x = &saved.inputs[0];
    let [_, _, h, w] = nchw(x.shape());
    let rank = g.rank();
    let dev = g.device();
    let spread = |t: &Tensor, dim: usize, len: usize, out: usize| -> Result<Tensor> {
        let (mut src, mut dst, mut share) = (Vec::new(), Vec::new(), Vec::new());
        for (o, (s, e)) in adaptive_windows(len, out).into_iter().enumerate() {
            for i in s..e {
                src.push(o as i64);
                dst.push(i as i64);
                share.push(1.0 / (e - s) as f64);
            }
        }
        let pairs = src.len();
        let mut wshape = vec![1; rank];
        wshape[dim] = pairs;
        let share = Tensor::from_vec(share, &wshape[..], &Device::cpu())?
            .to_dtype(g.dtype())?
            .to_device(dev)?;
        let picked = t.index_select(dim, &Tensor::from_vec(src, [pairs], dev)?)?;
        let picked = TensorOps::mul(&picked, &share)?;
        let mut shape = t.shape().to_vec();
        shape[dim] = len;
        Tensor::zeros(&shape[..], g.dtype(), dev)?.index_add(
            dim,
            &Tensor::from_vec(dst, [pairs], dev)?,
            &picked,
            1.0,
        )
    };
    let t = spread(g, rank - 2, h, op.size[0])?;
    Ok(vec![Some(spread(&t, rank - 1, w, op.size[1])?)])
}
