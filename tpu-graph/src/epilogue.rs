//! Products with the elementwise work that consumes them done as their results are stored (an
//! *epilogue*), so the product is never written out and read back.
//!
//! [`SubScaledProduct`] is `w - (a · b) * s`: the update of plain SGD fused into the product
//! that computes the weight's gradient (`w - lr * (gᵀ · x)`). Its CPU kernel is
//! [`tpu_ops::ops::linalg::sub_scaled_product`], which keeps the bits of the three ops it
//! replaces; it lowers to those three ops' own lowerings, so a graph holding one still compiles
//! for a PJRT device. [`crate::passes::fuse_for_cpu`] builds it.

use tpu_ops::hlo::{FnBuilder, Value};
use tpu_ops::ops::elementwise::binary::Binary;
use tpu_ops::ops::linalg::{Matmul, sub_scaled_product, sub_scaled_product_};
use tpu_ops::tpu_tensor::{DType, Error, Result, Tensor};
use tpu_ops::{Meta, OpDef};

const NAME: &str = "sub_scaled_product";

/// `w - (a · b) * s` for f32 matrices `w` (`m x n`), `a` (`m x k`), `b` (`k x n`) and a
/// one-element `s`; inputs in that order. It keeps the ops it stands for, for its lowering.
#[derive(Clone, Debug)]
pub struct SubScaledProduct {
    /// The product `a · b`.
    pub product: Matmul,
    /// The scaling by `s`.
    pub mul: Binary,
    /// The subtraction from `w`.
    pub sub: Binary,
    /// True when the scaling reads `s` first (`s * (a · b)`).
    pub scale_first: bool,
}

impl SubScaledProduct {
    /// Runs on the native CPU device writing the result over `w` (`inputs[0]`), the same
    /// bits; false, with `w` untouched, where it cannot
    /// ([`tpu_ops::ops::linalg::sub_scaled_product_`]).
    pub fn cpu_in_place(&self, inputs: &[&Tensor]) -> Result<bool> {
        let [w, a, b, s] = inputs else {
            return Err(Error::internal(NAME, "expected 4 inputs"));
        };
        sub_scaled_product_(w, a, b, s)
    }
}

impl OpDef for SubScaledProduct {
    fn name(&self) -> &'static str {
        NAME
    }

    fn attrs(&self) -> String {
        format!(
            "{} {}; {} {}; {} {}; scale first: {}",
            self.product.name(),
            self.product.attrs(),
            self.mul.name(),
            self.mul.attrs(),
            self.sub.name(),
            self.sub.attrs(),
            self.scale_first
        )
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let [w, a, b, s] = inputs else {
            return Err(Error::invalid_argument(
                NAME,
                format!("expected 4 inputs (w, a, b, s), got {}", inputs.len()),
            ));
        };
        let fits = [w, a, b, s].iter().all(|m| m.dtype == DType::F32)
            && a.shape.len() == 2
            && b.shape.len() == 2
            && a.shape[1] == b.shape[0]
            && w.shape[..] == [a.shape[0], b.shape[1]]
            && s.numel() == 1;
        if !fits {
            return Err(Error::invalid_argument(
                NAME,
                format!(
                    "expected f32 w [m, n], a [m, k], b [k, n] and one-element s; got w {}, a \
                     {}, b {}, s {}",
                    crate::ir::meta_text(w),
                    crate::ir::meta_text(a),
                    crate::ir::meta_text(b),
                    crate::ir::meta_text(s)
                ),
            ));
        }
        Ok(vec![w.clone()])
    }

    fn cpu(&self, inputs: &[&Tensor], _outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let [w, a, b, s] = inputs else {
            return Err(Error::internal(NAME, "expected 4 inputs"));
        };
        Ok(vec![sub_scaled_product(w, a, b, s)?])
    }

    fn lower(&self, bld: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let [w, a, b, s] = inputs else {
            return Err(Error::internal(NAME, "expected 4 inputs"));
        };
        let one = |mut vs: Vec<Value>| {
            vs.pop()
                .ok_or_else(|| Error::internal(NAME, "a part lowered to no value"))
        };
        let p = one(self.product.lower(bld, &[a.clone(), b.clone()], outputs)?)?;
        let scaled = if self.scale_first {
            [s.clone(), p]
        } else {
            [p, s.clone()]
        };
        let t = one(self.mul.lower(bld, &scaled, outputs)?)?;
        self.sub.lower(bld, &[w.clone(), t], outputs)
    }
}
