//! In-place methods (`x.add_(&y)`, `x.clamp_(..)`, `x.index_put_(..)`, `x[mask] = v` as
//! `masked_fill_` or `index_put_`), as PyTorch code writes them.
//!
//! Each computes its result with the out-of-place op and writes it into the tensor with
//! `copy_`, so every device, graph capture and autograd see one kind of in-place write (see
//! `autograd/inplace.rs`). When a gradient is involved, the op reads a recorded copy of the
//! tensor rather than the tensor itself: the backward may need the old values (`mul_`'s
//! does), and the write is about to replace them. Without gradients no copy is made; the
//! result still takes its own buffer before it is written back, which the eager path needs
//! anyway (a kernel does not write into its input).

use tpu_tensor::{DType, Error, Result, Scalar, Tensor};

use crate::autograd::{is_grad_enabled, requires_grad};
use crate::ops::elementwise::binary::BinaryKind;
use crate::ops::elementwise::methods::{Operand, TensorOps, bin};
use crate::ops::movement::MovementOps;

/// PyTorch's `canCast`: an in-place result may not lose its kind (a float result into an
/// integer tensor, or a number into a bool one).
fn can_cast(from: DType, to: DType) -> bool {
    let kind = |d: DType| {
        if d.is_float() {
            2
        } else if d == DType::Bool {
            0
        } else {
            1
        }
    };
    kind(from) <= kind(to)
}

/// True when writing into `this` from an op over `this` and `operands` involves a gradient.
fn tracked(this: &Tensor, operands: &[&Tensor]) -> bool {
    is_grad_enabled() && (requires_grad(this) || operands.iter().any(|t| requires_grad(t)))
}

/// Writes `f(x)` into `this`, where `x` is `this` or, when `copy` (a gradient is involved), a
/// recorded copy of it.
fn write_result(
    op: &str,
    this: &Tensor,
    copy: bool,
    f: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let x = if copy { this.copy()? } else { this.clone() };
    let r = f(&x)?;
    if r.shape() != this.shape() {
        return Err(Error::shape(
            op,
            format!(
                "the result has shape {:?}, which does not fit the tensor written in place, of shape {:?} (only the other operands may broadcast)",
                r.shape(),
                this.shape()
            ),
        ));
    }
    if !can_cast(r.dtype(), this.dtype()) {
        return Err(Error::invalid_argument(
            op,
            format!(
                "the result has dtype {}, which cannot be written in place into a {} tensor; convert the tensor first, or use the out-of-place op",
                r.dtype(),
                this.dtype()
            ),
        ));
    }
    this.copy_(&r)?;
    Ok(this.clone())
}

/// `this op= other` for the arithmetic methods.
fn arithmetic_(op: &str, this: &Tensor, other: Operand, kind: BinaryKind) -> Result<Tensor> {
    let operands: &[&Tensor] = match &other {
        Operand::Tensor(t) => &[*t],
        Operand::Number(_) => &[],
    };
    write_result(op, this, tracked(this, operands), |x| bin(x, other, kind))
}

/// In-place methods. Each returns the tensor itself (another handle to it), so calls chain:
/// `x.mul_(2.0)?.add_(&b)?`. Writing into a leaf that requires grad (or a view of one) is an
/// error while grad mode is on, as in PyTorch; under `no_grad` it is how parameters change.
pub trait InPlaceOps {
    /// Writes `f(self)` into `self`: the in-place form of any op or chain of ops whose result
    /// has `self`'s shape (`x.update_(|t| t.relu())`).
    fn update_(&self, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor>;
    /// `self += other`.
    fn add_<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor>;
    /// `self -= other`.
    fn sub_<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor>;
    /// `self *= other`.
    fn mul_<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor>;
    /// `self /= other` (true division: an integer tensor is an error, as in PyTorch).
    fn div_<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor>;
    /// Clamps to `[min, max]` in place; either bound may be `None`.
    fn clamp_(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor>;
    /// Sets every element to zero.
    fn zero_(&self) -> Result<Tensor>;
    /// Writes `value` where the bool `mask` (broadcast to `self`) is true: `x[mask] = value`.
    fn masked_fill_(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor>;
    /// `x[indices] = values` (or `+=` with `accumulate`), with the indices of
    /// [`MovementOps::index`]: integer tensors broadcast together, bool masks, `None` for a
    /// whole dim.
    fn index_put_(
        &self,
        indices: &[Option<&Tensor>],
        values: &Tensor,
        accumulate: bool,
    ) -> Result<Tensor>;
}

impl InPlaceOps for Tensor {
    fn update_(&self, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        // The closure may read tensors that require grad: copy whenever grad mode is on.
        write_result("update_", self, is_grad_enabled(), f)
    }

    fn add_<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        arithmetic_("add_", self, other.into(), BinaryKind::Add)
    }

    fn sub_<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        arithmetic_("sub_", self, other.into(), BinaryKind::Sub)
    }

    fn mul_<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        arithmetic_("mul_", self, other.into(), BinaryKind::Mul)
    }

    fn div_<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        arithmetic_("div_", self, other.into(), BinaryKind::Div)
    }

    fn clamp_(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        write_result("clamp_", self, tracked(self, &[]), |x| x.clamp(min, max))
    }

    fn zero_(&self) -> Result<Tensor> {
        self.fill_(0)?;
        Ok(self.clone())
    }

    fn masked_fill_(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let value = value.into();
        write_result("masked_fill_", self, tracked(self, &[]), |x| {
            x.masked_fill(mask, value)
        })
    }

    fn index_put_(
        &self,
        indices: &[Option<&Tensor>],
        values: &Tensor,
        accumulate: bool,
    ) -> Result<Tensor> {
        write_result("index_put_", self, tracked(self, &[values]), |x| {
            x.index_put(indices, values, accumulate)
        })
    }
}
