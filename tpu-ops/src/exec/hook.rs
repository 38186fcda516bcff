//! The hook that connects the op library to `tpu-tensor`: its operators (`&a + &b`), casts
//! and copies run as ops, so they reach every device, and views are recorded for autograd.

use tpu_tensor::{ArithOp, DType, Layout, OpsHook, Result, Scalar, Tensor};

use crate::ops::cast::{Cast, Copy};
use crate::ops::elementwise::binary::{BinaryKind, binary, binary_scalar, scalar_binary};
use crate::ops::elementwise::unary::{UnaryKind, unary};

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

    fn write_view(&self, region: &Tensor, view: &Layout, src: &Tensor) -> Result<Tensor> {
        let op = crate::ops::movement::view::ViewWrite::over(region.layout(), view).ok_or_else(
            || {
                tpu_tensor::Error::invalid_argument(
                    "copy_",
                    "the written view reaches outside the tensor's storage region",
                )
            },
        )?;
        crate::exec::dispatch::run1(&op, &[region, src])
    }

    fn on_view(&self, base: &Tensor, view: &Tensor, of_elements: Option<&Layout>) {
        crate::autograd::record_view(base, view, of_elements);
    }

    fn before_write(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
        crate::autograd::check_write(dst, src)
    }

    fn after_write(&self, dst: &Tensor, src: &Tensor) {
        crate::autograd::record_write(dst, src);
    }
}

static HOOK: Hook = Hook;

/// Registers the hook with `tpu-tensor`.
pub(crate) fn register() {
    tpu_tensor::register_ops_hook(&HOOK);
}
