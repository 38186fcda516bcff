//! Operators (`&a + &b`, `x * 2.0`, `-x`) and on-device casts and copies, supplied by the op
//! library one layer up.
//!
//! `Tensor` lives here but its ops live in `tpu-ops`; so this crate defines [`OpsHook`] and the
//! op library registers itself (on first use of any op, on `requires_grad_`, or through
//! `tpu_ops::init()`).
//! Each operator returns `Result<Tensor>`, like the named method it stands for. Numbers are
//! `f64`, `i64` or `bool`, so that literals (`x * 2.0`, `x + 1`) need no annotation.

use std::ops::{Add, BitAnd, BitOr, BitXor, Div, Mul, Neg, Rem, Sub};
use std::sync::OnceLock;

use tpu_runtime::{DType, Error, Result};

use crate::scalar::Scalar;
use crate::tensor::{Layout, Tensor};

/// The arithmetic operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/` (true division)
    Div,
    /// `%` (Python's remainder, with the divisor's sign)
    Rem,
    /// `&`
    BitAnd,
    /// `|`
    BitOr,
    /// `^`
    BitXor,
}

/// What the op library provides to this crate.
pub trait OpsHook: Send + Sync {
    /// `a op b`, broadcasting.
    fn binary(&self, op: ArithOp, a: &Tensor, b: &Tensor) -> Result<Tensor>;
    /// `a op v` (or `v op a` when `number_first`).
    fn binary_number(
        &self,
        op: ArithOp,
        a: &Tensor,
        v: Scalar,
        number_first: bool,
    ) -> Result<Tensor>;
    /// `-a`.
    fn neg(&self, a: &Tensor) -> Result<Tensor>;
    /// A cast that runs on the tensor's own device.
    fn to_dtype(&self, t: &Tensor, dtype: DType) -> Result<Tensor>;
    /// A dense copy made on the tensor's own device.
    fn copy(&self, t: &Tensor) -> Result<Tensor>;
    /// The values of `region` (a dense tensor) after writing `src` into the elements of
    /// `view`, a layout over the same storage inside the region; computed on the tensors' own
    /// device.
    fn write_view(&self, region: &Tensor, view: &Layout, src: &Tensor) -> Result<Tensor>;
    /// Called when `view` was made from `base`, which autograd tracks, so the view can be
    /// recorded and gradients flow back through it. `of_elements` is the view's layout over
    /// `base`'s elements taken in row-major order (as if `base` were dense at offset 0); `None`
    /// when the view addresses `base`'s storage directly, as `as_strided` does.
    fn on_view(&self, base: &Tensor, view: &Tensor, of_elements: Option<&Layout>) {
        let _ = (base, view, of_elements);
    }
    /// Called before `copy_` writes `src` (as given: it is then moved, converted and broadcast
    /// to `dst`) into `dst`'s elements: an error here stops the write (autograd refuses writes
    /// into a leaf that requires grad, or a view of one).
    fn before_write(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
        let _ = (dst, src);
        Ok(())
    }
    /// Called after `copy_` wrote `src` into `dst`'s elements, so autograd can give `dst` (and
    /// the root it views) the history of the new values.
    fn after_write(&self, dst: &Tensor, src: &Tensor) {
        let _ = (dst, src);
    }
}

static HOOK: OnceLock<&'static dyn OpsHook> = OnceLock::new();

/// Registers the op library (once; later calls are ignored).
pub fn register_ops_hook(hook: &'static dyn OpsHook) {
    let _ = HOOK.set(hook);
}

/// The registered op library, if any.
pub fn ops_hook() -> Option<&'static dyn OpsHook> {
    HOOK.get().copied()
}

fn hook(what: &str) -> Result<&'static dyn OpsHook> {
    ops_hook().ok_or_else(|| {
        Error::invalid_argument(
            what,
            "the op library is not connected yet: call tpu_ops::init() once (any tpu-ops function does it)",
        )
    })
}

macro_rules! tensor_ops {
    ($trait:ident, $method:ident, $op:expr) => {
        impl $trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                hook(stringify!($method))?.binary($op, self, rhs)
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                hook(stringify!($method))?.binary($op, self, &rhs)
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                hook(stringify!($method))?.binary($op, &self, rhs)
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                hook(stringify!($method))?.binary($op, &self, &rhs)
            }
        }
        tensor_ops!(@num $trait, $method, $op, f64, i64, bool);
    };
    (@num $trait:ident, $method:ident, $op:expr, $($n:ty),*) => {$(
        impl $trait<$n> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: $n) -> Result<Tensor> {
                hook(stringify!($method))?.binary_number($op, self, Scalar::from(rhs), false)
            }
        }
        impl $trait<$n> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: $n) -> Result<Tensor> {
                hook(stringify!($method))?.binary_number($op, &self, Scalar::from(rhs), false)
            }
        }
        impl $trait<&Tensor> for $n {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                hook(stringify!($method))?.binary_number($op, rhs, Scalar::from(self), true)
            }
        }
        impl $trait<Tensor> for $n {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                hook(stringify!($method))?.binary_number($op, &rhs, Scalar::from(self), true)
            }
        }
    )*};
}

tensor_ops!(Add, add, ArithOp::Add);
tensor_ops!(Sub, sub, ArithOp::Sub);
tensor_ops!(Mul, mul, ArithOp::Mul);
tensor_ops!(Div, div, ArithOp::Div);
tensor_ops!(Rem, rem, ArithOp::Rem);
tensor_ops!(BitAnd, bitand, ArithOp::BitAnd);
tensor_ops!(BitOr, bitor, ArithOp::BitOr);
tensor_ops!(BitXor, bitxor, ArithOp::BitXor);

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        hook("neg")?.neg(self)
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        hook("neg")?.neg(&self)
    }
}
