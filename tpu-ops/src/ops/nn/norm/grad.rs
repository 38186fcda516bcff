//! The backward rules of the normalisations (PyTorch's formulas), recomputing the statistics
//! from the saved input.

use tpu_tensor::{Error, Result, Tensor};

use super::{BatchNorm, Norm, NormKind};
use crate::TensorOps;
use crate::autograd::Saved;
use crate::ops::nn::args::take;
use crate::ops::nn::grad::{Grads, dims_i64, first, mean_over, sum_over, up};
use crate::ops::reduce::ReduceOps;

/// `(xhat, rstd)` of `x` normalised over its last dim: `xhat = (x - mean) * rstd` (or
/// `x * rstd` for RMS), recomputed from the saved input as PyTorch's kernels do from the
/// saved statistics.
fn normalize_last(x: &Tensor, rms: bool, eps: f64) -> Result<(Tensor, Tensor)> {
    let xc = if rms {
        x.clone()
    } else {
        x.sub(&x.mean(&[-1], true)?)?
    };
    let rstd = xc.square()?.mean(&[-1], true)?.add(eps)?.rsqrt()?;
    Ok((xc.mul(&rstd)?, rstd))
}

/// The input gradient of a normalisation from `gy` (the gradient of `xhat`), `xhat` and
/// `rstd`, with means over `dims`: `rstd * (gy - mean(gy) - xhat * mean(gy * xhat))`; RMS
/// norm has no mean to subtract.
fn norm_input_grad(
    gy: &Tensor,
    xhat: &Tensor,
    rstd: &Tensor,
    dims: &[i64],
    centered: bool,
) -> Result<Tensor> {
    let proj = xhat.mul(&mean_over(&gy.mul(xhat)?, dims)?)?;
    let mut inner = gy.sub(&proj)?;
    if centered {
        inner = inner.sub(&mean_over(gy, dims)?)?;
    }
    inner.mul(rstd)
}

pub(super) fn norm(op: &Norm, saved: &Saved, g: &Tensor) -> Grads {
    let x = up(&saved.inputs[0])?;
    let g = up(g)?;
    let shape = x.shape().to_vec();
    let rank = shape.len();
    let mut i = 1;
    let w = take(&saved.inputs, op.weight, &mut i).map(up).transpose()?;
    let (row_len, _, groups) = op.layout(&shape);
    // Statistics are per row of `stat_shape`'s last dim; the parameters follow `pshape`
    // (the normalised trailing dims, or `[C, 1, ..]` per channel for group norm) and their
    // gradients sum over `pdims`.
    let (stat_shape, pshape, pdims): (Vec<usize>, Vec<usize>, Vec<i64>) = match op.kind {
        NormKind::Group(_) => {
            let mut ps = vec![shape[1]];
            ps.resize(rank - 1, 1);
            let pdims = dims_i64(std::iter::once(0).chain(2..rank));
            (vec![shape[0], groups, row_len], ps, pdims)
        }
        _ => {
            let rows = shape.iter().product::<usize>().checked_div(row_len);
            let lead = rank - op.normalized.len();
            (
                vec![rows.unwrap_or(0), row_len],
                op.normalized.clone(),
                dims_i64(0..lead),
            )
        }
    };
    let (xhat, rstd) = normalize_last(&x.reshape(&stat_shape)?, op.kind == NormKind::Rms, op.eps)?;
    let gy = match &w {
        Some(w) => g.mul(&w.reshape(&pshape)?)?,
        None => g.clone(),
    };
    let gx = norm_input_grad(
        &gy.reshape(&stat_shape)?,
        &xhat,
        &rstd,
        &[-1],
        op.kind != NormKind::Rms,
    )?
    .reshape(&shape)?;
    let xhat = xhat.reshape(&shape)?;
    let param_shape = |t: Tensor| -> Result<Tensor> {
        let s = sum_over(&t, &pdims, false)?;
        match op.kind {
            NormKind::Group(_) => s.reshape([shape[1]]),
            _ => s.reshape(&op.normalized),
        }
    };
    let mut out = vec![Some(gx)];
    if op.weight {
        out.push(Some(param_shape(g.mul(&xhat)?)?));
    }
    if op.bias {
        out.push(Some(param_shape(g.clone())?));
    }
    Ok(out)
}

// ---- batch norm ---------------------------------------------------------------------------------

pub(super) fn batch_norm(op: &BatchNorm, saved: &Saved, grads: &[Option<Tensor>]) -> Grads {
    let n_in = saved.inputs.len();
    let g = first(grads).map(up).transpose()?;
    // In training with running stats, outputs 1 and 2 are the updated running mean and
    // variance; gradients reaching them (nothing does in PyTorch, where the update is an
    // in-place buffer write) flow back exactly.
    let g_rm = grads.get(1).and_then(Option::as_ref).map(up).transpose()?;
    let g_rv = grads.get(2).and_then(Option::as_ref).map(up).transpose()?;
    if g.is_none() && g_rm.is_none() && g_rv.is_none() {
        return Ok(vec![None; n_in]);
    }
    let x = up(&saved.inputs[0])?;
    let shape = x.shape().to_vec();
    let rank = shape.len();
    let ch = shape[1];
    let count = x.numel() / ch.max(1);
    let red = dims_i64(std::iter::once(0).chain(2..rank));
    let mut pshape = vec![1, ch];
    pshape.resize(rank, 1);
    let mut i = 1;
    let per_channel = |t: &Tensor| up(t)?.reshape(&pshape);
    let rm = take(&saved.inputs, op.running, &mut i);
    let rv = take(&saved.inputs, op.running, &mut i);
    let w = take(&saved.inputs, op.weight, &mut i)
        .map(per_channel)
        .transpose()?;
    let (xc, rstd) = if op.training {
        let xc = x.sub(&x.mean(&red, true)?)?;
        let var = xc.square()?.mean(&red, true)?;
        (xc, var.add(op.eps)?.rsqrt()?)
    } else {
        let (rm, rv) = rm.zip(rv).ok_or_else(|| {
            Error::invalid_argument(
                "batch_norm backward",
                "running stats are required in evaluation mode",
            )
        })?;
        let rstd = per_channel(rv)?.add(op.eps)?.rsqrt()?;
        (x.sub(&per_channel(rm)?)?, rstd)
    };
    let xhat = xc.mul(&rstd)?;
    let to_c = |t: &Tensor| t.sum(&red, false)?.reshape([ch]);
    let mut gx: Option<Tensor> = None;
    let mut gw = None;
    let mut gb = None;
    if let Some(g) = &g {
        let gy = match &w {
            Some(w) => g.mul(w)?,
            None => g.clone(),
        };
        gx = Some(if op.training {
            // Through the batch statistics too.
            norm_input_grad(&gy, &xhat, &rstd, &red, true)?
        } else {
            // The running statistics are constants here.
            gy.mul(&rstd)?
        });
        if op.weight {
            gw = Some(to_c(&g.mul(&xhat)?)?);
        }
        if op.bias {
            gb = Some(to_c(g)?);
        }
    }
    // new_mean = m * mean + (1 - m) * running_mean, new_var = m * var * n / (n - 1) +
    // (1 - m) * running_var, with the batch's biased `var`.
    let m = op.momentum;
    let mut grm = None;
    let mut grv = None;
    let add_to = |acc: Option<Tensor>, t: Tensor| -> Result<Option<Tensor>> {
        Ok(Some(match acc {
            Some(a) => a.add(&t)?,
            None => t,
        }))
    };
    if let Some(gm) = &g_rm {
        let part = gm.reshape(&pshape)?.mul(m / count as f64)?;
        // Materialised at the input's shape: autograd only sums gradients down.
        let full = Tensor::zeros(&shape[..], x.dtype(), x.device())?.add(&part)?;
        gx = add_to(gx, full)?;
        grm = Some(gm.mul(1.0 - m)?);
    }
    if let Some(gv) = &g_rv {
        let unbias = count as f64 / (count as f64 - 1.0);
        let k = 2.0 * m * unbias / count as f64;
        gx = add_to(gx, xc.mul(&gv.reshape(&pshape)?)?.mul(k)?)?;
        grv = Some(gv.mul(1.0 - m)?);
    }
    let mut out = vec![gx];
    if op.running {
        out.push(grm);
        out.push(grv);
    }
    if op.weight {
        out.push(gw);
    }
    if op.bias {
        out.push(gb);
    }
    Ok(out)
}
