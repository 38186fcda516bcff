//! Ops as methods on `Tensor` (`x.exp()`, `a.add(&b)`, `a.add(2.0)`), and the hook that gives
//! `tpu-tensor` its operators.

use tpu_tensor::{ArithOp, DType, Layout, OpsHook, Result, Scalar, Tensor};

use crate::ops::cast::{Cast, Copy};
use crate::ops::elementwise::binary::{BinaryKind, binary, binary_scalar, scalar_binary};
use crate::ops::elementwise::unary::{UnaryKind, unary};

/// The other operand of a binary op: a tensor or a Rust number.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    /// A tensor.
    Tensor(&'a Tensor),
    /// A number.
    Number(Scalar),
}

impl<'a> From<&'a Tensor> for Operand<'a> {
    fn from(t: &'a Tensor) -> Self {
        Operand::Tensor(t)
    }
}

macro_rules! operand_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Operand<'_> {
            fn from(v: $t) -> Self {
                Operand::Number(Scalar::from(v))
            }
        }
    )*};
}
operand_from!(f64, f32, i64, i32, u8, bool, usize);

impl From<Scalar> for Operand<'_> {
    fn from(v: Scalar) -> Self {
        Operand::Number(v)
    }
}

fn bin<'a>(a: &Tensor, b: impl Into<Operand<'a>>, kind: BinaryKind) -> Result<Tensor> {
    match b.into() {
        Operand::Tensor(t) => binary(a, t, kind),
        Operand::Number(v) => binary_scalar(a, v, kind),
    }
}

macro_rules! unary_methods {
    ($($(#[$m:meta])* $name:ident => $kind:expr;)*) => {
        $( $(#[$m])* fn $name(&self) -> Result<Tensor>; )*
    };
}

macro_rules! unary_impls {
    ($($(#[$m:meta])* $name:ident => $kind:expr;)*) => {
        $( fn $name(&self) -> Result<Tensor> { unary(self, $kind) } )*
    };
}

macro_rules! binary_methods {
    ($($(#[$m:meta])* $name:ident => $kind:expr;)*) => {
        $( $(#[$m])* fn $name<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor>; )*
    };
}

macro_rules! binary_impls {
    ($($(#[$m:meta])* $name:ident => $kind:expr;)*) => {
        $( fn $name<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> { bin(self, other, $kind) } )*
    };
}

macro_rules! define_ops {
    (unary { $($u:tt)* } binary { $($b:tt)* }) => {
        /// Elementwise ops as methods, with PyTorch's names and semantics. Binary ops take a
        /// tensor (broadcast) or a Rust number: `a.add(&b)`, `a.mul(2.0)`.
        pub trait TensorOps {
            unary_methods! { $($u)* }
            binary_methods! { $($b)* }
            /// Clamps to `[min, max]`; either bound may be `None`.
            fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor>;
            /// `x ** exponent` for a number exponent.
            fn pow_scalar(&self, exponent: impl Into<Scalar>) -> Result<Tensor>;
            /// `exponent ** x`, elementwise.
            fn rpow(&self, base: impl Into<Scalar>) -> Result<Tensor>;
            /// `v - x`.
            fn rsub(&self, v: impl Into<Scalar>) -> Result<Tensor>;
            /// `log(1 + exp(beta x)) / beta`, linear where `beta x > threshold`.
            fn softplus(&self, beta: f64, threshold: f64) -> Result<Tensor>;
            /// A copy converted to `dtype` on the tensor's device.
            fn to(&self, dtype: DType) -> Result<Tensor>;
        }

        impl TensorOps for Tensor {
            unary_impls! { $($u)* }
            binary_impls! { $($b)* }
            fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
                unary(self, UnaryKind::Clamp { min: min.map(Scalar::Float), max: max.map(Scalar::Float) })
            }
            fn pow_scalar(&self, exponent: impl Into<Scalar>) -> Result<Tensor> {
                unary(self, UnaryKind::PowScalar(exponent.into()))
            }
            fn rpow(&self, base: impl Into<Scalar>) -> Result<Tensor> {
                scalar_binary(base, self, BinaryKind::Pow)
            }
            fn rsub(&self, v: impl Into<Scalar>) -> Result<Tensor> {
                scalar_binary(v, self, BinaryKind::Sub)
            }
            fn softplus(&self, beta: f64, threshold: f64) -> Result<Tensor> {
                unary(self, UnaryKind::Softplus { beta, threshold })
            }
            fn to(&self, dtype: DType) -> Result<Tensor> {
                if dtype == self.dtype() {
                    return Ok(self.clone());
                }
                crate::exec::dispatch::run1(&Cast(dtype), &[self])
            }
        }
    };
}

define_ops! {
    unary {
        /// `-x`.
        neg => UnaryKind::Neg;
        /// `|x|`.
        abs => UnaryKind::Abs;
        /// -1, 0 or 1 (0 for NaN).
        sign => UnaryKind::Sign;
        /// `e^x`.
        exp => UnaryKind::Exp;
        /// `2^x`.
        exp2 => UnaryKind::Exp2;
        /// Natural logarithm.
        log => UnaryKind::Log;
        /// Base-2 logarithm.
        log2 => UnaryKind::Log2;
        /// `log(1 + x)`.
        log1p => UnaryKind::Log1p;
        /// `e^x - 1`.
        expm1 => UnaryKind::Expm1;
        /// Square root.
        sqrt => UnaryKind::Sqrt;
        /// `1 / sqrt(x)`.
        rsqrt => UnaryKind::Rsqrt;
        /// `x * x`.
        square => UnaryKind::Square;
        /// `1 / x`.
        reciprocal => UnaryKind::Reciprocal;
        /// Sine.
        sin => UnaryKind::Sin;
        /// Cosine.
        cos => UnaryKind::Cos;
        /// Tangent.
        tan => UnaryKind::Tan;
        /// Hyperbolic tangent.
        tanh => UnaryKind::Tanh;
        /// `1 / (1 + e^-x)`.
        sigmoid => UnaryKind::Sigmoid;
        /// `max(x, 0)`.
        relu => UnaryKind::Relu;
        /// GELU, exact (erf) form.
        gelu => UnaryKind::Gelu;
        /// GELU, tanh approximation (PyTorch's `approximate='tanh'`).
        gelu_tanh => UnaryKind::GeluTanh;
        /// `x * sigmoid(x)`.
        silu => UnaryKind::Silu;
        /// The error function.
        erf => UnaryKind::Erf;
        /// Round down.
        floor => UnaryKind::Floor;
        /// Round up.
        ceil => UnaryKind::Ceil;
        /// Round half to even.
        round => UnaryKind::Round;
        /// Round toward zero.
        trunc => UnaryKind::Trunc;
        /// `x == 0`, as bool.
        logical_not => UnaryKind::LogicalNot;
        /// NaN test.
        isnan => UnaryKind::IsNan;
        /// Infinity test.
        isinf => UnaryKind::IsInf;
        /// Finite test.
        isfinite => UnaryKind::IsFinite;
    }
    binary {
        /// `a + b`.
        add => BinaryKind::Add;
        /// `a - b`.
        sub => BinaryKind::Sub;
        /// `a * b`.
        mul => BinaryKind::Mul;
        /// True division (integers give floats).
        div => BinaryKind::Div;
        /// Division rounded down (`torch.div(a, b, rounding_mode='floor')`).
        div_floor => BinaryKind::DivFloor;
        /// `floor_divide` (PyTorch's name for `div_floor`).
        floor_divide => BinaryKind::DivFloor;
        /// Division rounded toward zero (`rounding_mode='trunc'`).
        div_trunc => BinaryKind::DivTrunc;
        /// Remainder with the divisor's sign.
        remainder => BinaryKind::Remainder;
        /// `a ** b`.
        pow => BinaryKind::Pow;
        /// Elementwise maximum (NaN propagates).
        maximum => BinaryKind::Maximum;
        /// Elementwise minimum (NaN propagates).
        minimum => BinaryKind::Minimum;
        /// `atan2(a, b)`.
        atan2 => BinaryKind::Atan2;
        /// `a == b`.
        eq => BinaryKind::Eq;
        /// `a != b`.
        ne => BinaryKind::Ne;
        /// `a < b`.
        lt => BinaryKind::Lt;
        /// `a <= b`.
        le => BinaryKind::Le;
        /// `a > b`.
        gt => BinaryKind::Gt;
        /// `a >= b`.
        ge => BinaryKind::Ge;
        /// Logical and of truth values.
        logical_and => BinaryKind::LogicalAnd;
        /// Logical or of truth values.
        logical_or => BinaryKind::LogicalOr;
        /// Logical xor of truth values.
        logical_xor => BinaryKind::LogicalXor;
        /// Bitwise and (integers, bool).
        bitwise_and => BinaryKind::BitwiseAnd;
        /// Bitwise or (integers, bool).
        bitwise_or => BinaryKind::BitwiseOr;
        /// Bitwise xor (integers, bool).
        bitwise_xor => BinaryKind::BitwiseXor;
    }
}

fn arith(op: ArithOp) -> BinaryKind {
    match op {
        ArithOp::Add => BinaryKind::Add,
        ArithOp::Sub => BinaryKind::Sub,
        ArithOp::Mul => BinaryKind::Mul,
        ArithOp::Div => BinaryKind::Div,
        ArithOp::Rem => BinaryKind::Remainder,
        ArithOp::BitAnd => BinaryKind::BitwiseAnd,
        ArithOp::BitOr => BinaryKind::BitwiseOr,
        ArithOp::BitXor => BinaryKind::BitwiseXor,
    }
}

struct Hook;

impl OpsHook for Hook {
    fn binary(&self, op: ArithOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        binary(a, b, arith(op))
    }

    fn binary_number(
        &self,
        op: ArithOp,
        a: &Tensor,
        v: Scalar,
        number_first: bool,
    ) -> Result<Tensor> {
        if number_first {
            scalar_binary(v, a, arith(op))
        } else {
            binary_scalar(a, v, arith(op))
        }
    }

    fn neg(&self, a: &Tensor) -> Result<Tensor> {
        unary(a, UnaryKind::Neg)
    }

    fn to_dtype(&self, t: &Tensor, dtype: DType) -> Result<Tensor> {
        crate::exec::dispatch::run1(&Cast(dtype), &[t])
    }

    fn copy(&self, t: &Tensor) -> Result<Tensor> {
        crate::exec::dispatch::run1(&Copy, &[t])
    }

    fn on_view(&self, base: &Tensor, view: &Tensor, of_elements: Option<&Layout>) {
        crate::autograd::record_view(base, view, of_elements);
    }
}

static HOOK: Hook = Hook;

pub(crate) fn register() {
    tpu_tensor::register_ops_hook(&HOOK);
}
