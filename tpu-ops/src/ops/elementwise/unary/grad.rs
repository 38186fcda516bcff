//! The backward rules of the unary ops: the list's `grad` field (PyTorch's formulas, written
//! with ops), and the formulas too long for a row.

use tpu_tensor::{Result, Scalar, Tensor};

use super::{GELU_K, UnaryKind, unary_columns, unary_ops};
use crate::ops::elementwise::methods::TensorOps;
use crate::ops::movement::MovementOps;

/// From the list: which kinds have a backward rule, and d(op)/dx times the incoming gradient.
macro_rules! unary_grads {
    (@has none) => {
        false
    };
    (@has $grad:tt) => {
        true
    };
    // A kind without a rule is never asked for one; its gradient would be zero.
    (@grad none, $g:ident, $x:ident, $y:ident, $kind:ident) => {
        $g.zeros_like()?
    };
    (
        @grad (|$pg:pat_param, $px:pat_param, $py:tt, $pk:pat_param| $e:expr),
        $g:ident, $x:ident, $y:ident, $kind:ident
    ) => {{
        let ($pg, $px, $py, $pk) = ($g, $x, unary_grads!(@output $py, $y), $kind);
        $e
    }};
    // The output is read only by the rules that name it, so the others allow writing it in
    // place before the backward.
    (@output _, $y:ident) => {
        ()
    };
    (@output $py:ident, $y:ident) => {
        &$y()?
    };
    ($(
        $V:ident => { method: $method:tt, cpu: $cpu:tt, int: $int:tt, lower: $lower:tt, grad: $grad:tt }
    )*) => {
        impl UnaryKind {
            /// Whether the op has a backward rule.
            pub(super) fn has_backward(&self) -> bool {
                match self {
                    $( UnaryKind::$V { .. } => unary_grads!(@has $grad), )*
                }
            }
        }

        /// d(op)/dx at `x` (output `y()`, read only when the rule needs it) times the incoming
        /// gradient `g`.
        pub(super) fn unary_backward(
            kind: &UnaryKind,
            x: &Tensor,
            y: &dyn Fn() -> Result<Tensor>,
            g: &Tensor,
        ) -> Result<Tensor> {
            let x = &x.to(g.dtype())?;
            Ok(match kind {
                $( UnaryKind::$V { .. } => unary_grads!(@grad $grad, g, x, y, kind), )*
            })
        }
    };
}
unary_ops!(unary_columns, [unary_grads]);

/// PyTorch selects (`y <= 0 ? 0 : g`) rather than multiplying by a mask, so a NaN or infinite
/// gradient does not leak into the zeros, and a NaN input passes it on.
fn relu(g: &Tensor, y: &Tensor) -> Result<Tensor> {
    g.relu_backward(y)
}

/// Phi(x) + x * phi(x).
fn gelu(g: &Tensor, x: &Tensor) -> Result<Tensor> {
    let cdf = x
        .mul(std::f64::consts::FRAC_1_SQRT_2)?
        .erf()?
        .add(1.0)?
        .mul(0.5)?;
    let pdf = x.square()?.mul(-0.5)?.exp()?.mul(0.398_942_280_401_432_7)?;
    g.mul(&cdf.add(&x.mul(&pdf)?)?)
}

fn gelu_tanh(g: &Tensor, x: &Tensor) -> Result<Tensor> {
    let k = GELU_K;
    let x2 = x.square()?;
    let inner = x.add(&x2.mul(x)?.mul(0.044715)?)?.mul(k)?;
    let t = inner.tanh()?;
    let left = t.add(1.0)?.mul(0.5)?;
    let right = x
        .mul(0.5)?
        .mul(&t.square()?.rsub(1.0)?)?
        .mul(&x2.mul(3.0 * 0.044715)?.add(1.0)?.mul(k)?)?;
    g.mul(&left.add(&right)?)
}

fn softplus(g: &Tensor, x: &Tensor, kind: &UnaryKind) -> Result<Tensor> {
    let UnaryKind::Softplus { beta, threshold } = kind else {
        return Err(tpu_tensor::Error::internal(
            "softplus",
            "not a softplus kind",
        ));
    };
    let bx = x.mul(*beta)?;
    let d = bx.sigmoid()?;
    let linear = bx.gt(*threshold)?;
    g.mul(&crate::where_(&linear, &d.ones_like()?, &d)?)
}

/// PyTorch's `leaky_relu_backward`: `x > 0 ? g : g * slope`.
fn leaky_relu(g: &Tensor, x: &Tensor, kind: &UnaryKind) -> Result<Tensor> {
    let slope = super::cpu::leaky_slope(kind);
    crate::where_(&x.gt(0.0)?, g, &g.mul(slope)?)
}

/// PyTorch's `elu_backward` from the input: `x <= 0 ? g * input_scale * alpha * scale *
/// e^(input_scale x) : g * scale`.
fn elu(g: &Tensor, x: &Tensor, kind: &UnaryKind) -> Result<Tensor> {
    let (alpha, scale, input_scale) = super::cpu::elu_params(kind);
    let neg = g.mul(
        &x.mul(input_scale)?
            .exp()?
            .mul(input_scale * alpha * scale)?,
    )?;
    crate::where_(&x.le(0.0)?, &neg, &g.mul(scale)?)
}

fn erf(g: &Tensor, x: &Tensor) -> Result<Tensor> {
    g.mul(
        &x.square()?
            .neg()?
            .exp()?
            .mul(std::f64::consts::FRAC_2_SQRT_PI)?,
    )
}

/// The gradient passes strictly inside the bounds, as PyTorch's (0 at a bound and at NaN),
/// and is selected rather than multiplied by a mask, so a NaN or infinite gradient does not
/// leak into the zeros.
fn clamp(g: &Tensor, x: &Tensor, kind: &UnaryKind) -> Result<Tensor> {
    let UnaryKind::Clamp { min, max } = kind else {
        return Err(tpu_tensor::Error::internal("clamp", "not a clamp kind"));
    };
    let keep = match (min, max) {
        (Some(lo), Some(hi)) => x.gt(*lo)?.logical_and(&x.lt(*hi)?)?,
        (Some(lo), None) => x.gt(*lo)?,
        (None, Some(hi)) => x.lt(*hi)?,
        (None, None) => x.eq(x)?,
    };
    g.masked_fill(&keep.logical_not()?, 0.0)
}

fn pow(g: &Tensor, x: &Tensor, kind: &UnaryKind) -> Result<Tensor> {
    let UnaryKind::PowScalar(e) = kind else {
        return Err(tpu_tensor::Error::internal("pow", "not a pow kind"));
    };
    if e.to_f64() == 0.0 {
        g.zeros_like()
    } else {
        g.mul(
            &x.pow_scalar(Scalar::Float(e.to_f64() - 1.0))?
                .mul(e.to_f64())?,
        )
    }
}
