//! The elementwise ops as methods on `Tensor` (`x.exp()`, `a.add(&b)`, `a.add(2.0)`): the
//! unary ones from their list, the binary ones from the list below.

use tpu_tensor::{DType, Result, Scalar, Tensor};

use crate::ops::cast::Cast;
use crate::ops::elementwise::binary::{BinaryKind, binary, binary_scalar, scalar_binary};
use crate::ops::elementwise::unary::{UnaryKind, unary, unary_columns, unary_ops};

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

/// `a op b` for a tensor or number `b`.
pub(crate) fn bin<'a>(a: &Tensor, b: impl Into<Operand<'a>>, kind: BinaryKind) -> Result<Tensor> {
    match b.into() {
        Operand::Tensor(t) => binary(a, t, kind),
        Operand::Number(v) => binary_scalar(a, v, kind),
    }
}

/// From the unary list: each op's method, declared (`decls`) or defined (`impls`).
macro_rules! unary_methods {
    (@kind [] $V:ident) => {
        UnaryKind::$V
    };
    (@kind [$make:expr] $V:ident) => {
        $make
    };
    ($mode:ident $(
        $V:ident => {
            method: {
                $(#[$m:meta])*
                fn $method:ident($($arg:ident : $aty:ty),*) $(=> $make:expr)?
            },
            cpu: $cpu:tt, int: $int:tt, lower: $lower:tt, grad: $grad:tt
        }
    )*) => {
        unary_methods!(@$mode $(
            [$(#[$m])*] $method($($arg: $aty),*) => unary_methods!(@kind [$($make)?] $V);
        )*);
    };
    (@decls $([$(#[$m:meta])*] $method:ident($($arg:ident : $aty:ty),*) => $kind:expr;)*) => {
        $( $(#[$m])* fn $method(&self, $($arg: $aty),*) -> Result<Tensor>; )*
    };
    (@impls $([$(#[$m:meta])*] $method:ident($($arg:ident : $aty:ty),*) => $kind:expr;)*) => {
        $( fn $method(&self, $($arg: $aty),*) -> Result<Tensor> { unary(self, $kind) } )*
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

/// The binary ops' methods: a name and the kind it applies.
macro_rules! binary_ops {
    ($cb:ident) => {
        $cb! {
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
            /// Remainder with the dividend's sign (`torch.fmod`).
            fmod => BinaryKind::Fmod;
            /// `a ** b`.
            pow => BinaryKind::Pow;
            /// Elementwise maximum (NaN propagates).
            maximum => BinaryKind::Maximum;
            /// Elementwise minimum (NaN propagates).
            minimum => BinaryKind::Minimum;
            /// `atan2(a, b)`.
            atan2 => BinaryKind::Atan2;
            /// ReLU's backward: this gradient where `y` (the ReLU's output) is above 0, else 0.
            relu_backward => BinaryKind::ReluBackward;
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
    };
}

/// Elementwise ops as methods, with PyTorch's names and semantics. Binary ops take a tensor
/// (broadcast) or a Rust number: `a.add(&b)`, `a.mul(2.0)`.
pub trait TensorOps {
    unary_ops!(unary_columns, [unary_methods decls]);
    binary_ops!(binary_methods);
    /// `exponent ** x`, elementwise.
    fn rpow(&self, base: impl Into<Scalar>) -> Result<Tensor>;
    /// `v - x`.
    fn rsub(&self, v: impl Into<Scalar>) -> Result<Tensor>;
    /// A copy converted to `dtype` on the tensor's device.
    fn to(&self, dtype: DType) -> Result<Tensor>;
}

impl TensorOps for Tensor {
    unary_ops!(unary_columns, [unary_methods impls]);
    binary_ops!(binary_impls);
    fn rpow(&self, base: impl Into<Scalar>) -> Result<Tensor> {
        scalar_binary(base, self, BinaryKind::Pow)
    }
    fn rsub(&self, v: impl Into<Scalar>) -> Result<Tensor> {
        scalar_binary(v, self, BinaryKind::Sub)
    }
    fn to(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        crate::exec::dispatch::run1(&Cast(dtype), &[self])
    }
}
