//! The backward rules of the binary ops and `where` (PyTorch's formulas, written with ops).

use tpu_tensor::{Result, Tensor};

use super::{BinaryKind, where_};
use crate::autograd::Saved;
use crate::ops::elementwise::methods::TensorOps;
use crate::ops::movement::MovementOps;

/// Whether `kind` has a backward rule.
pub(super) fn has_backward(kind: BinaryKind) -> bool {
    kind.is_arithmetic()
}

/// Whether [`binary_backward`] reads operand `input` for the gradients `needs_grad` asks for,
/// as PyTorch saves an operand only for a formula that uses it.
pub(super) fn reads(kind: BinaryKind, input: usize, needs_grad: &[bool]) -> bool {
    use BinaryKind::*;
    let other_needs = needs_grad.get(1 - input.min(1)).copied().unwrap_or(true);
    match kind {
        Add | Sub | DivFloor | DivTrunc => false,
        // Each operand appears only in the other's gradient.
        Mul => other_needs,
        // a / b: both gradients divide by b; b's reads the output, not a.
        Div => input == 1,
        // Only the divisor's gradient reads the operands.
        Remainder | Fmod => needs_grad.get(1).copied().unwrap_or(true),
        // Only the gradient's gradient, which reads `y`.
        ReluBackward => input == 1 && needs_grad.first().copied().unwrap_or(true),
        _ => true,
    }
}

/// The gradients of both operands (PyTorch's formulas, written with ops).
pub(super) fn binary_backward(
    kind: BinaryKind,
    saved: &Saved,
    grads: &[Option<Tensor>],
) -> Result<Vec<Option<Tensor>>> {
    let Some(g) = &grads[0] else {
        return Ok(vec![None, None]);
    };
    let (a, b) = (&saved.inputs[0], &saved.inputs[1]);
    // Read only by the rules that need it: the others allow writing it in place.
    let y = || saved.output(0);
    let a = &a.to(g.dtype())?;
    let b = &b.to(g.dtype())?;
    use BinaryKind::*;
    let (ga, gb) = match kind {
        Add => (g.clone(), g.clone()),
        Sub => (g.clone(), g.neg()?),
        Mul => (g.mul(b)?, g.mul(a)?),
        Div => {
            // The divisor's gradient reads the output: only computed when asked for, so the
            // output of `x / 2` may be written in place.
            let gb = if saved.needs_grad(1) {
                Some(g.mul(y()?)?.div(b)?.neg()?)
            } else {
                None
            };
            return Ok(vec![Some(g.div(b)?), gb]);
        }
        // Piecewise constant: PyTorch's zero gradients (not none, so backward runs).
        DivFloor | DivTrunc => (g.zeros_like()?, g.zeros_like()?),
        Remainder => (g.clone(), g.mul(&a.div_floor(b)?)?.neg()?),
        // PyTorch's: the divisor's gradient is -g * trunc(a / b).
        Fmod => (g.clone(), g.mul(&a.div_trunc(b)?)?.neg()?),
        Pow => {
            // PyTorch's formulas: d/da = b a^(b-1), selected as 0 where b == 0 (so 0^0
            // gives 0, not 0 * inf); d/db = a^b ln a, selected as 0 where a == 0 and
            // b >= 0, then multiplied by the gradient (a NaN gradient stays NaN there).
            let ga = g
                .mul(&b.mul(&a.pow(&b.sub(1.0)?)?)?)?
                .masked_fill(&b.eq(0.0)?, 0.0)?;
            if !saved.needs_grad(1) {
                return Ok(vec![Some(ga), None]);
            }
            let zero_base = a.eq(0.0)?.logical_and(&b.ge(0.0)?)?;
            let gb = g.mul(&y()?.mul(&a.log()?)?.masked_fill(&zero_base, 0.0)?)?;
            (ga, gb)
        }
        Maximum | Minimum => {
            // Equal elements split the gradient in half, as PyTorch.
            let (win_a, win_b) = if kind == Maximum {
                (a.gt(b)?, b.gt(a)?)
            } else {
                (a.lt(b)?, b.lt(a)?)
            };
            let tie = a.eq(b)?;
            let half = g.mul(0.5)?;
            let zero = g.zeros_like()?;
            let ga = where_(&win_a, g, &where_(&tie, &half, &zero)?)?;
            let gb = where_(&win_b, g, &where_(&tie, &half, &zero)?)?;
            (ga, gb)
        }
        Atan2 => {
            let r2 = a.square()?.add(&b.square()?)?;
            (g.mul(b)?.div(&r2)?, g.mul(a)?.div(&r2)?.neg()?)
        }
        // Constant in `y` wherever it has a derivative, as PyTorch's `threshold_backward`.
        ReluBackward => return Ok(vec![Some(g.relu_backward(b)?), None]),
        _ => return Ok(vec![None, None]),
    };
    Ok(vec![Some(ga), Some(gb)])
}

/// `where`'s gradients: the incoming one routed to the operand each element came from.
pub(super) fn where_backward(
    saved: &Saved,
    grads: &[Option<Tensor>],
) -> Result<Vec<Option<Tensor>>> {
    let Some(g) = &grads[0] else {
        return Ok(vec![None, None, None]);
    };
    let c = &saved.inputs[0];
    let zero = g.zeros_like()?;
    Ok(vec![
        None,
        Some(where_(c, g, &zero)?),
        Some(where_(c, &zero, g)?),
    ])
}
