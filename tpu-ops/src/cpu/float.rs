//! The compute types of the CPU kernels: every float kernel computes in f32 (for f32, f16 and
//! bf16 tensors) or f64, through the one trait [`Float`]; `with_compute!` picks the type from
//! a dtype. Families add what only they need as functions over `F: Float` in their own `cpu.rs`,
//! not as traits of their own, so one vocabulary serves every kernel.

use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

use tpu_tensor::{DType, Element, Error};

/// f32 and f64 as the kernels compute with them. Each method is the standard library's
/// function of the same name, except [`Float::fexp`].
pub trait Float:
    Element
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// +∞.
    const INF: Self;
    /// −∞.
    const NEG_INF: Self;
    /// A quiet NaN.
    const NAN: Self;

    /// `v` rounded to this type.
    #[inline(always)]
    fn of(v: f64) -> Self {
        Self::from_f64(v)
    }
    /// `n` rounded to this type.
    #[inline(always)]
    fn of_usize(n: usize) -> Self {
        Self::from_f64(n as f64)
    }
    /// `e^self` through the vectorisable kernels' exp: [`crate::cpu::math::exp_f32`] for f32,
    /// the standard library's for f64.
    fn fexp(self) -> Self;
    /// `e^self`.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// `ln(1 + self)`.
    fn ln_1p(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Largest integer not above.
    fn floor(self) -> Self;
    /// Toward zero.
    fn trunc(self) -> Self;
    /// `self^e`.
    fn powf(self, e: Self) -> Self;
    /// True for NaN.
    fn is_nan(self) -> bool;
    /// The angle of the point `(other, self)`, in `[-pi, pi]`.
    fn atan2(self, other: Self) -> Self;
    /// `self`'s magnitude with `sign`'s sign.
    fn copysign(self, sign: Self) -> Self;
}

/// Implements [`Float`] for a primitive float, every method but `fexp` forwarding to the
/// type's own method of that name.
macro_rules! float {
    ($t:ty, $fexp:expr) => {
        impl Float for $t {
            const ZERO: $t = 0.0;
            const ONE: $t = 1.0;
            const INF: $t = <$t>::INFINITY;
            const NEG_INF: $t = <$t>::NEG_INFINITY;
            const NAN: $t = <$t>::NAN;
            #[inline(always)]
            fn fexp(self) -> $t {
                $fexp(self)
            }
            float!(@unary $t, $t: exp, ln, ln_1p, abs, sqrt, floor, trunc);
            float!(@unary $t, bool: is_nan);
            float!(@binary $t: powf, atan2, copysign);
        }
    };
    (@unary $t:ty, $r:ty: $($f:ident),*) => {
        $(
            #[inline(always)]
            fn $f(self) -> $r {
                <$t>::$f(self)
            }
        )*
    };
    (@binary $t:ty: $($f:ident),*) => {
        $(
            #[inline(always)]
            fn $f(self, other: $t) -> $t {
                <$t>::$f(self, other)
            }
        )*
    };
}
float!(f32, crate::cpu::math::exp_f32);
float!(f64, f64::exp);

/// The error of a float kernel given another dtype.
pub fn not_float(op: &str, dtype: DType) -> Error {
    Error::UnsupportedDType {
        op: op.into(),
        given: dtype.to_string(),
        supported: crate::op::DTypeSet::FLOAT.to_string(),
    }
}

/// Runs `$body` with the type `$C` bound to the compute type of the float dtype `$dtype` (f64,
/// or f32 for f32, f16 and bf16); any other dtype returns [`not_float`]'s error for `$op`.
macro_rules! with_compute {
    ($op:expr, $dtype:expr, |$C:ident| $body:block) => {
        match $dtype {
            tpu_tensor::DType::F64 => {
                type $C = f64;
                $body
            }
            tpu_tensor::DType::F32 | tpu_tensor::DType::F16 | tpu_tensor::DType::BF16 => {
                type $C = f32;
                $body
            }
            d => Err($crate::cpu::float::not_float($op, d)),
        }
    };
}
pub(crate) use with_compute;
