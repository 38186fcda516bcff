//! The backward rules of the reductions and scans: PyTorch's formulas, written with ops so they
//! run on the device the forward ran on. `g` is the gradient of the output; each rule first
//! views it (and the saved output) with the reduced dims kept as size 1, so it broadcasts.

use tpu_tensor::shape::resolve_dim_in;
use tpu_tensor::{Result, Tensor};

use super::shape::{reduce_mask, reduced_count, reduced_shape};
use super::{ArgReduce, Reduce, ReduceKind, Scan};
use crate::autograd::Saved;
use crate::op::{Grads, OpDef};
use crate::ops::movement::MovementOps;
use crate::ops::reduce::ReduceOps;
use crate::{TensorOps, where_};

/// [`Reduce`]'s backward: the input's gradient, `None` where the kind has none.
pub(super) fn reduce(op: &Reduce, saved: &Saved, g: &Tensor) -> Grads {
    let [x] = &saved.inputs[..] else {
        return Ok(vec![None; saved.inputs.len()]);
    };
    let mask = reduce_mask(op.name(), &op.dims, x.shape())?;
    Ok(vec![reduce_backward(
        op.kind,
        x,
        &|| saved.output(0).cloned(),
        g,
        &mask,
    )?])
}

/// [`ArgReduce`]'s backward: max/min with values route the gradient to the returned index.
pub(super) fn arg_reduce(op: &ArgReduce, saved: &Saved, g: &Tensor) -> Grads {
    let (true, [x]) = (op.with_values, &saved.inputs[..]) else {
        return Ok(vec![None; saved.inputs.len()]);
    };
    Ok(vec![Some(arg_backward(op.dim, x, saved.output(1)?, g)?)])
}

/// [`super::ExtremeAll`]'s backward.
pub(super) fn extreme_all(saved: &Saved, grads: &[Option<Tensor>]) -> Grads {
    let (Some(Some(g)), [x]) = (grads.first(), &saved.inputs[..]) else {
        return Ok(vec![None; saved.inputs.len()]);
    };
    Ok(vec![Some(extreme_all_backward(x, saved.output(0)?, g)?)])
}

/// [`Scan`]'s backward.
pub(super) fn scan(op: &Scan, saved: &Saved, g: &Tensor) -> Grads {
    let [x] = &saved.inputs[..] else {
        return Ok(vec![None; saved.inputs.len()]);
    };
    Ok(vec![Some(scan_backward(
        op,
        x,
        &|| saved.output(0).cloned(),
        g,
    )?)])
}

/// The dims `mask` marks, as the `dims` argument of a reduction. For a 0-dim input the mask is
/// empty, which reduces "every dim" of a one-element tensor: the identity, as wanted.
fn mask_dims(mask: &[bool]) -> Vec<i64> {
    (0..mask.len())
        .filter(|&d| mask[d])
        .map(|d| d as i64)
        .collect()
}

/// `t` (the shape of a reduction's output, with or without keepdim) viewed with the reduced
/// dims kept as size 1.
fn keep_reduced(t: &Tensor, shape: &[usize], mask: &[bool]) -> Result<Tensor> {
    t.reshape(reduced_shape(shape, mask, true))
}

/// `t` broadcast to `shape` and copied: the gradient a leaf accumulates must own its storage,
/// since optimizers update gradients in place and a stride-0 view would write one element
/// many times.
fn expand_dense(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    t.broadcast_to(shape)?.contiguous()
}

/// `where(cond, 0, v)`: PyTorch's `masked_fill(cond, 0)`.
fn zero_where(cond: &Tensor, v: &Tensor) -> Result<Tensor> {
    where_(cond, &v.zeros_like()?, v)
}

/// `g / count(hit) * hit` over the reduced dims: the gradient of a max or min split evenly
/// among the elements that attain it, as PyTorch's amax, amin and inf-norm do.
fn split_among(g: &Tensor, hit: &Tensor, dims: &[i64]) -> Result<Tensor> {
    let count = hit.sum(dims, true)?;
    g.div(&count)?.mul(hit)
}

/// The gradient of a `Reduce` of `x` (output `y`, output gradient `g`) over the dims `mask`
/// marks; `None` where PyTorch gives none (the 0-norm).
fn reduce_backward(
    kind: ReduceKind,
    x: &Tensor,
    y: &dyn Fn() -> Result<Tensor>,
    g: &Tensor,
    mask: &[bool],
) -> Result<Option<Tensor>> {
    use ReduceKind::*;
    let shape = x.shape();
    let dims = mask_dims(mask);
    let n = reduced_count(shape, mask) as f64;
    let x = &x.to(g.dtype())?;
    let gk = &keep_reduced(g, shape, mask)?;
    // The output, read only by the kinds that need it (a sum's may be written in place).
    let yk = || keep_reduced(&y()?.to(g.dtype())?, shape, mask);
    let grad = match kind {
        Sum => expand_dense(gk, shape)?,
        Mean => expand_dense(&gk.div(n)?, shape)?,
        Prod => {
            // y / x fails where x is 0. With one zero in a group the zero's gradient is the
            // product of the others and the rest get 0; with two or more, every element gets 0
            // (each partial product still holds a zero). Counting zeros per group covers all
            // three cases without reading anything back to the host.
            let zero = x.eq(0.0)?;
            let zeros_in_group = zero.sum(&dims, true)?;
            let safe = where_(&zero, &x.ones_like()?, x)?;
            let others = safe.prod(&dims, true)?;
            let no_zero = zeros_in_group.eq(0)?;
            let lone_zero = zeros_in_group.eq(1)?.logical_and(&zero)?;
            let at_zero = where_(&lone_zero, &others, &x.zeros_like()?)?;
            let d = where_(&no_zero, &others.div(&safe)?, &at_zero)?;
            gk.mul(&d)?
        }
        Amax | Amin => split_among(gk, &x.eq(&yk()?)?, &dims)?,
        Var { correction } | Std { correction } => {
            // d var / dx = 2 (x - mean) / (n - correction). PyTorch divides by
            // n - correction itself here even where the forward clamps it at 0
            // (n <= correction), so a negative divisor gives finite gradients of an infinite
            // variance; we follow it.
            let gv = if matches!(kind, Std { .. }) {
                // d std = d var / (2 std), taken as 0 where std is 0.
                let yk = yk()?;
                zero_where(&yk.eq(0.0)?, &gk.div(&yk.mul(2.0)?)?)?
            } else {
                gk.clone()
            };
            let centered = x.sub(&x.mean(&dims, true)?)?;
            gv.mul(&centered)?.mul(2.0 / (n - correction))?
        }
        // exp(x - y) is softmax(x): 0 at -inf elements; NaN where y is infinite, as PyTorch.
        LogSumExp => gk.mul(&x.sub(&yk()?)?.exp()?)?,
        Norm { p } => {
            if p == 0.0 {
                // Counting non-zeros is piecewise constant; PyTorch leaves no gradient.
                return Ok(None);
            }
            norm_backward(p, x, &yk()?, gk, &dims)?
        }
        All | Any => return Ok(None),
    };
    Ok(Some(grad))
}

/// The gradient of the vector `p`-norm (`p != 0`) of `x`, `yk` the norm and `gk` its gradient
/// with the reduced dims kept.
fn norm_backward(p: f64, x: &Tensor, yk: &Tensor, gk: &Tensor, dims: &[i64]) -> Result<Tensor> {
    let sign = x.sign()?;
    if p == 1.0 {
        return gk.mul(&sign);
    }
    if p == 2.0 {
        // x / |x|, with gradient 0 at a zero norm (the subgradient PyTorch picks).
        return gk.mul(&zero_where(&yk.eq(0.0)?, &x.div(yk)?)?);
    }
    let a = x.abs()?;
    if p.is_infinite() {
        // The max (or min) of |x|: split among the elements that attain it; NaN elements
        // count as attaining it, as PyTorch.
        let hit = a.eq(yk)?.logical_or(&a.isnan()?)?;
        return sign.mul(&split_among(gk, &hit, dims)?);
    }
    // d/dx_i (sum |x|^p)^(1/p) = sign(x_i) |x_i|^(p-1) / norm^(p-1).
    if p < 1.0 {
        // |x|^(p-1) is infinite at 0; PyTorch takes 0 there, and multiplies by norm^(1-p)
        // rather than dividing by norm^(p-1), so a zero norm gives 0 instead of NaN.
        let scaled = zero_where(&x.eq(0.0)?, &sign.mul(&a.pow_scalar(p - 1.0)?)?)?;
        return scaled.mul(gk)?.mul(&yk.pow_scalar(1.0 - p)?);
    }
    // 1 < p: the gradient is 0 where the norm is 0 (every element of the group is 0).
    let scaled = if p < 2.0 {
        sign.mul(&a.pow_scalar(p - 1.0)?)?
    } else {
        x.mul(&a.pow_scalar(p - 2.0)?)?
    };
    let scale = zero_where(&yk.eq(0.0)?, &gk.div(&yk.pow_scalar(p - 1.0)?)?)?;
    scaled.mul(&scale)
}

/// The gradient of [`super::ExtremeAll`] of `x` (output `y`, 0-dim, and its gradient `g`):
/// `g / count` at the elements equal to `y` (the NaN elements when `y` is NaN), selected
/// into zeros elsewhere, as PyTorch's `evenly_distribute_backward`.
fn extreme_all_backward(x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Tensor> {
    let x = &x.to(g.dtype())?;
    let y = &y.to(g.dtype())?;
    let hit = where_(&y.isnan()?, &x.isnan()?, &x.eq(y)?)?;
    let share = g.div(&hit.sum(&[], false)?)?;
    share.masked_fill(&hit.logical_not()?, 0.0)
}

/// The gradient of max/min with values: the output gradient goes to the element whose index
/// was returned, zeros elsewhere (PyTorch's convention: ties are not split).
fn arg_backward(dim: Option<i64>, x: &Tensor, idx: &Tensor, g: &Tensor) -> Result<Tensor> {
    let shape = x.shape();
    let zeros = |s: &[usize]| Tensor::zeros(s, g.dtype(), g.device());
    match dim {
        // A 0-dim input is its own extreme.
        Some(_) if x.rank() == 0 => g.reshape(shape),
        None => {
            // The index counts in the flattened tensor.
            let numel = x.numel();
            zeros(&[numel])?
                .scatter(0, &idx.reshape([1])?, &g.reshape([1])?)?
                .reshape(shape)
        }
        Some(d) => {
            let d = resolve_dim_in("max", d, x.rank(), shape)?;
            let mask: Vec<bool> = (0..x.rank()).map(|i| i == d).collect();
            let gk = keep_reduced(g, shape, &mask)?;
            let ik = keep_reduced(idx, shape, &mask)?;
            zeros(shape)?.scatter(d as i64, &ik, &gk)
        }
    }
}

/// The cumsum of `t` along `d` taken from the end.
fn reverse_cumsum(t: &Tensor, d: i64) -> Result<Tensor> {
    t.flip(&[d])?.cumsum(d)?.flip(&[d])
}

/// The gradient of cumsum (the reversed cumsum of `g`) or cumprod.
fn scan_backward(
    op: &Scan,
    x: &Tensor,
    y: &dyn Fn() -> Result<Tensor>,
    g: &Tensor,
) -> Result<Tensor> {
    // A 0-dim input: the scan is the identity.
    if x.rank() == 0 {
        return g.reshape(x.shape());
    }
    let d = resolve_dim_in(op.name(), op.dim, x.rank(), x.shape())? as i64;
    if !op.prod {
        return reverse_cumsum(g, d);
    }
    // dy_k/dx_i = prod_{j <= k, j != i} x_j for k >= i. Before the first zero of a line this is
    // y_k / x_i, so the gradient is revcumsum(g y) / x. At the first zero z it is the product
    // with x_z replaced by 1, so the gradient is revcumsum(g y') at z with y' = cumprod of that
    // line. After the first zero every product holds it: 0.
    let x = &x.to(g.dtype())?;
    let y = &y()?.to(g.dtype())?;
    let zero = x.eq(0.0)?;
    let zeros_so_far = zero.cumsum(d)?;
    let before = zeros_so_far.eq(0)?;
    let first = zero.logical_and(&zeros_so_far.eq(1)?)?;
    let ones = x.ones_like()?;
    let safe = where_(&zero, &ones, x)?;
    let left = reverse_cumsum(&g.mul(y)?, d)?.div(&safe)?;
    let y1 = where_(&first, &ones, x)?.cumprod(d)?;
    let at_zero = zero_where(&first.logical_not()?, &reverse_cumsum(&g.mul(&y1)?, d)?)?;
    where_(&before, &left, &at_zero)
}
