//! The backward rules of the losses (PyTorch's formulas).

use tpu_tensor::{DType, Result, Tensor};

use super::{ClassLoss, PointKind, PointLoss, Reduction, class_layout};
use crate::TensorOps;
use crate::autograd::Saved;
use crate::ops::movement::MovementOps;
use crate::ops::nn::args::take;
use crate::ops::nn::grad::{Grads, up};
use crate::ops::reduce::ReduceOps;

pub(super) fn class_loss(op: &ClassLoss, saved: &Saved, g: &Tensor) -> Grads {
    let n_in = saved.inputs.len();
    let g = up(g)?;
    let xshape = saved.inputs[0].shape().to_vec();
    let (n, classes, inner) = class_layout(&xshape);
    let x = up(&saved.inputs[0])?.reshape([n, classes, inner])?;
    let dt = x.dtype();
    let t = saved.inputs[1].reshape([n, 1, inner])?;
    let ignored = t.eq(op.ignore_index)?;
    let cls = Tensor::arange(0i64, classes as i64, 1i64, DType::I64, x.device())?
        .reshape([1, classes, 1])?;
    let is_target = cls.eq(&t)?;
    let hot = is_target.to(dt)?;
    let w = saved
        .inputs
        .get(2)
        .map(|w| up(w)?.reshape([1, classes, 1]))
        .transpose()?;
    let eps = if op.logits { op.label_smoothing } else { 0.0 };
    // d(loss at a position) / d(log-probability of class c), before the reduction:
    // -(1 - eps) w[t] [c == t] - (eps / C) w[c].
    let target_w = match &w {
        Some(w) => hot.mul(w)?,
        None => hot,
    };
    let mut coef = target_w.mul(-(1.0 - eps))?;
    if eps > 0.0 {
        let k = -eps / classes as f64;
        coef = match &w {
            Some(w) => coef.add(&w.mul(k)?)?,
            None => coef.add(k)?,
        };
    }
    let factor = match op.reduction {
        Reduction::None => g.reshape([n, 1, inner])?,
        Reduction::Sum => g,
        Reduction::Mean => {
            // The mean divides by the summed weights of the targets not ignored.
            let total = target_w
                .sum(&[1], true)?
                .masked_fill(&ignored, 0.0)?
                .sum_all()?;
            g.div(&total)?
        }
    };
    // Zeroing ignored positions after scaling keeps them 0 even when every target is
    // ignored (the mean's factor is then infinite), as PyTorch.
    let dlp = coef.mul(&factor)?.masked_fill(&ignored, 0.0)?;
    let dx = if op.logits {
        // Through log_softmax: dx = dlp - softmax(x) * sum_c(dlp).
        let sm = crate::ops::nn::functional::softmax(&x, 1)?;
        dlp.sub(&sm.mul(&dlp.sum(&[1], true)?)?)?
    } else {
        // NLL: only the targets' log-probabilities have a gradient. Selected, as PyTorch
        // scatters it, so a NaN or infinite output gradient does not reach other classes
        // through the zeros of the one-hot factor.
        dlp.masked_fill(&is_target.logical_not()?, 0.0)?
    };
    let mut out = vec![Some(dx.reshape(&xshape)?), None];
    // Class weights get no gradient (PyTorch does not differentiate them either).
    out.resize(n_in, None);
    Ok(out)
}

pub(super) fn point_loss(op: &PointLoss, saved: &Saved, g: &Tensor) -> Grads {
    let x = up(&saved.inputs[0])?;
    let t = up(&saved.inputs[1])?;
    let g = up(g)?;
    let factor = match op.reduction {
        Reduction::Mean => g.div(x.numel() as f64)?,
        _ => g,
    };
    match op.kind {
        PointKind::Mse => {
            let gx = x.sub(&t)?.mul(&factor)?.mul(2.0)?;
            let gt = gx.neg()?;
            Ok(vec![Some(gx), Some(gt)])
        }
        PointKind::BceWithLogits => {
            let mut i = 2;
            let w = take(&saved.inputs, op.weight, &mut i).map(up).transpose()?;
            let pw = take(&saved.inputs, op.pos_weight, &mut i)
                .map(up)
                .transpose()?;
            // loss = w [(1 - t) x - lw log σ(x)] with lw = (pw - 1) t + 1.
            // log σ(x) = min(x, 0) - log1p(exp(-|x|)), stable for large |x|.
            let log_sig = x.minimum(0.0)?.sub(&x.abs()?.neg()?.exp()?.log1p()?)?;
            let one_minus_t = t.rsub(1.0)?;
            let lw = match &pw {
                Some(pw) => Some(pw.sub(1.0)?.mul(&t)?.add(1.0)?),
                None => None,
            };
            let weighted = |v: Tensor| -> Result<Tensor> {
                let v = v.mul(&factor)?;
                match &w {
                    Some(w) => v.mul(w),
                    None => Ok(v),
                }
            };
            // d/dx = w [(1 - t) - lw (1 - σ(x))].
            let one_minus_sig = x.sigmoid()?.rsub(1.0)?;
            let gx = match &lw {
                Some(lw) => one_minus_t.sub(&lw.mul(&one_minus_sig)?)?,
                None => one_minus_t.sub(&one_minus_sig)?,
            };
            // d/dt = w [-x - (pw - 1) log σ(x)].
            let gt = match &pw {
                Some(pw) => x.neg()?.sub(&pw.sub(1.0)?.mul(&log_sig)?)?,
                None => x.neg()?,
            };
            let mut out = vec![Some(weighted(gx)?), Some(weighted(gt)?)];
            // PyTorch does not differentiate weight and pos_weight; their gradients are
            // simple, so they get them: d/dw is the unweighted loss, d/dpw = -w t log σ(x).
            // Autograd sums both down to their broadcast shapes.
            if op.weight {
                let unweighted = match &lw {
                    Some(lw) => one_minus_t.mul(&x)?.sub(&lw.mul(&log_sig)?)?,
                    None => one_minus_t.mul(&x)?.sub(&log_sig)?,
                };
                out.push(Some(unweighted.mul(&factor)?));
            }
            if op.pos_weight {
                out.push(Some(weighted(t.mul(&log_sig)?.neg()?)?));
            }
            Ok(out)
        }
    }
}
