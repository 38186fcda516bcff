//! Matrix products: `matmul` with PyTorch's rank rules (and `mm`, `bmm`, `dot`), `linear`, and
//! `einsum`; and the pairwise distances `cdist` and `pdist`.
//!
//! Every product ends in one batched kernel. On the native CPU with AVX-512 or AVX2, f32, f16 and bf16
//! go to [`crate::cpu::simd::gemm`] (operands read in place at any strides, f32 accumulation, one
//! rounding of 16-bit results); otherwise faer for f32 and f64, reading strided operands in
//! place when one of their matrix strides is 1, with the 16-bit floats multiplied in f32 and
//! rounded once at the end (as PyTorch); integers multiply in wrapping i64 arithmetic,
//! which truncates to the same result as arithmetic in the narrow type. In StableHLO: one
//! `dot_general` per product at the precision [`set_matmul_precision`] sets, with 16-bit floats
//! widened to f32 and narrow integers to i32 around it so that XLA agrees with the CPU.
//!
//! Every op here has a backward rule made of the same products (einsum's gradients are
//! einsums).
//!
//! Files: `shape.rs` (shape and dtype rules), `cpu.rs` (the batched CPU kernel), `lower.rs`
//! (StableHLO), `grad.rs` (backward rules), `einsum/` (the einsum op, its equations and its
//! evaluation on either backend), `packed.rs` (weights packed once for repeated `linear`s on
//! the native CPU), `distance.rs` (cdist and pdist, compositions of differences and norms),
//! `table.rs` (the op table's rows).

mod cpu;
mod distance;
mod einsum;
mod grad;
mod lower;
mod packed;
mod shape;
mod table;

pub use cpu::{sub_scaled_product, sub_scaled_product_};
pub use distance::{cdist, pdist};
pub use einsum::{Einsum, einsum};
pub use packed::{PackedWeight, packed_linear};
pub use table::table;

use std::sync::atomic::{AtomicU8, Ordering};

use tpu_tensor::shape::broadcast_shapes;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{Error, Result, Tensor};

use self::shape::{common_dtype, expect_inputs, plan};
use crate::hlo::Precision;
use crate::op::{Meta, OpDef, op_parts};

// ---- precision -------------------------------------------------------------------------------

static PRECISION: AtomicU8 = AtomicU8::new(0);

/// Sets the precision of the matrix products lowered to StableHLO from now on (TPUs multiply
/// f32 in one bf16 pass at [`Precision::Default`], as PyTorch/XLA does). Ops already recorded
/// keep the precision they were made with. The native CPU kernels always use full precision.
pub fn set_matmul_precision(precision: Precision) {
    let v = match precision {
        Precision::Default => 0,
        Precision::High => 1,
        Precision::Highest => 2,
    };
    PRECISION.store(v, Ordering::Relaxed);
}

/// The precision of matrix products lowered to StableHLO (see [`set_matmul_precision`]).
pub fn matmul_precision() -> Precision {
    match PRECISION.load(Ordering::Relaxed) {
        1 => Precision::High,
        2 => Precision::Highest,
        _ => Precision::Default,
    }
}

// ---- the products --------------------------------------------------------------------------

/// The products `matmul`, `mm`, `bmm` and `dot` (one op, differing in the ranks they accept).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProductKind {
    /// `torch.matmul`: any ranks >= 1, broadcast batch dims.
    Matmul,
    /// `torch.mm`: two matrices.
    Mm,
    /// `torch.bmm`: two 3-D tensors with equal batch size.
    Bmm,
    /// `torch.dot`: two vectors.
    Dot,
}

impl ProductKind {
    fn name(self) -> &'static str {
        match self {
            ProductKind::Matmul => "matmul",
            ProductKind::Mm => "mm",
            ProductKind::Bmm => "bmm",
            ProductKind::Dot => "dot",
        }
    }
}

// ---- matmul, mm, bmm, dot --------------------------------------------------------------------

/// A matrix product with PyTorch's rules for `kind`.
#[derive(Clone, Debug)]
pub struct Matmul {
    /// Which product (the ranks it accepts).
    pub kind: ProductKind,
    /// Precision of the StableHLO `dot_general`.
    pub precision: Precision,
}

impl Matmul {
    /// The op of `kind` at the current [`matmul_precision`].
    pub fn new(kind: ProductKind) -> Matmul {
        Matmul {
            kind,
            precision: matmul_precision(),
        }
    }
}

impl OpDef for Matmul {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn attrs(&self) -> String {
        format!("{:?}", self.precision)
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.name();
        expect_inputs(op, inputs, &[2])?;
        let d = common_dtype(op, inputs, &["the first operand", "the second operand"])?;
        let p = plan(self.kind, &inputs[0].shape, &inputs[1].shape)?;
        Ok(vec![Meta::new(&p.out, d)])
    }

    op_parts! {
        cpu: cpu::matmul,
        lower: lower::matmul,
        grad: grad::matmul,
    }
}

/// `torch.matmul(a, b)`: vector-vector (0-dim result), matrix-vector, vector-matrix,
/// matrix-matrix, and batched products whose leading dims broadcast.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    crate::exec::dispatch::run1(&Matmul::new(ProductKind::Matmul), &[a, b])
}

/// `torch.mm(a, b)` of two matrices.
pub fn mm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    crate::exec::dispatch::run1(&Matmul::new(ProductKind::Mm), &[a, b])
}

/// `torch.bmm(a, b)` of `[B, m, k]` and `[B, k, n]`.
pub fn bmm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    crate::exec::dispatch::run1(&Matmul::new(ProductKind::Bmm), &[a, b])
}

/// `torch.dot(a, b)` of two vectors: a 0-dim tensor.
pub fn dot(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    crate::exec::dispatch::run1(&Matmul::new(ProductKind::Dot), &[a, b])
}

// ---- linear ----------------------------------------------------------------------------------

/// `torch.nn.functional.linear`: `x · weightᵀ + bias`, with inputs `[x, weight]` or
/// `[x, weight, bias]`. The bias is added before the single rounding of 16-bit floats.
#[derive(Clone, Debug)]
pub struct Linear {
    /// Precision of the StableHLO `dot_general`.
    pub precision: Precision,
}

impl OpDef for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn attrs(&self) -> String {
        format!("{:?}", self.precision)
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        expect_inputs("linear", inputs, &[2, 3])?;
        let d = common_dtype("linear", inputs, &["the input", "the weight", "the bias"])?;
        let (x, w) = (&inputs[0].shape, &inputs[1].shape);
        if x.is_empty() || w.len() != 2 {
            return Err(Error::shape(
                "linear",
                format!(
                    "expected an input with at least 1 dim and a 2-D weight [out, in], got input {} and weight {}",
                    fmt_shape(x),
                    fmt_shape(w)
                ),
            ));
        }
        if x[x.len() - 1] != w[1] {
            return Err(Error::shape(
                "linear",
                format!(
                    "the input's last dim must equal the weight's in-features: input {} and weight {} ({} != {})",
                    fmt_shape(x),
                    fmt_shape(w),
                    x[x.len() - 1],
                    w[1]
                ),
            ));
        }
        let mut out = x[..x.len() - 1].to_vec();
        out.push(w[0]);
        if let Some(bias) = inputs.get(2) {
            let s = broadcast_shapes("linear", &out, &bias.shape).ok();
            if s.as_deref() != Some(&out[..]) {
                return Err(Error::shape(
                    "linear",
                    format!(
                        "the bias {} does not broadcast to the output {} (input {}, weight {})",
                        fmt_shape(&bias.shape),
                        fmt_shape(&out),
                        fmt_shape(x),
                        fmt_shape(w)
                    ),
                ));
            }
        }
        Ok(vec![Meta::new(&out, d)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        cpu::linear(inputs, outputs)
    }

    op_parts! {
        lower: lower::linear,
        grad: grad::linear,
    }
}

/// `torch.nn.functional.linear(x, weight, bias)`: `x · weightᵀ + bias` for `x` of shape
/// `[..., in]`, `weight` `[out, in]` and `bias` broadcasting to `[..., out]`.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let op = Linear {
        precision: matmul_precision(),
    };
    match bias {
        Some(bias) => crate::exec::dispatch::run1(&op, &[x, weight, bias]),
        None => crate::exec::dispatch::run1(&op, &[x, weight]),
    }
}

// ---- methods ---------------------------------------------------------------------------------

/// This file's ops as methods on `Tensor`.
pub trait LinalgOps {
    /// `torch.matmul(self, other)`.
    fn matmul(&self, other: &Tensor) -> Result<Tensor>;
    /// `torch.mm(self, other)` of two matrices.
    fn mm(&self, other: &Tensor) -> Result<Tensor>;
    /// `torch.bmm(self, other)` of two 3-D tensors.
    fn bmm(&self, other: &Tensor) -> Result<Tensor>;
    /// `torch.dot(self, other)` of two vectors.
    fn dot(&self, other: &Tensor) -> Result<Tensor>;
    /// `torch.nn.functional.linear(self, weight, bias)`.
    fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor>;
}

impl LinalgOps for Tensor {
    fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        matmul(self, other)
    }

    fn mm(&self, other: &Tensor) -> Result<Tensor> {
        mm(self, other)
    }

    fn bmm(&self, other: &Tensor) -> Result<Tensor> {
        bmm(self, other)
    }

    fn dot(&self, other: &Tensor) -> Result<Tensor> {
        dot(self, other)
    }

    fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        linear(self, weight, bias)
    }
}
