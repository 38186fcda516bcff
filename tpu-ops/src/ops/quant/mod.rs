//! Quantised matrices (GGML's Q4_0, Q4_1 and Q8_0 blocks) and the two ops that read them as
//! they are: [`quant_linear`] (`x · Wᵀ`, `linear` without a bias) and [`quant_embedding`] (rows
//! by index).
//!
//! They serve inference of quantised checkpoints on the native CPU, where reading 4-bit weights
//! instead of f32 ones is what makes decoding fast (see [`crate::cpu::simd::quant`]). They are
//! not rows of the op table: there is no StableHLO lowering (other devices dequantise the matrix
//! once, with [`QuantMatrix::dequantize`], and use `linear` and `embedding`), and no backward
//! rule (the weights are frozen; an input that requires a gradient is an error, never a
//! silently missing gradient). Their results equal the dequantised matrix's products up to f32
//! rounding.

use std::sync::Arc;

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Device, Error, Result, Tensor};

use crate::cpu::kernels::{Reader, cpu_context};
use crate::cpu::simd::quant::PackedQuant;
pub use crate::cpu::simd::quant::QuantFormat;

/// A `rows × cols` matrix of quantised blocks on the native CPU, packed for the kernels. Cheap
/// to clone (shared), `Send + Sync`.
#[derive(Clone, Debug)]
pub struct QuantMatrix {
    packed: Arc<PackedQuant>,
}

impl QuantMatrix {
    /// The matrix whose rows are stored, one after another, as GGML blocks of `format` in
    /// `bytes` (as a GGUF file holds a 2-D tensor of shape `[rows, cols]`).
    pub fn from_blocks(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<QuantMatrix> {
        Ok(QuantMatrix {
            packed: Arc::new(PackedQuant::pack(format, rows, cols, bytes)?),
        })
    }

    /// The block format.
    pub fn format(&self) -> QuantFormat {
        self.packed.format()
    }

    /// `[rows, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.packed.rows(), self.packed.cols()]
    }

    /// Bytes the packed matrix takes in memory.
    pub fn nbytes(&self) -> usize {
        self.packed.nbytes()
    }

    /// The matrix as f32 `[rows, cols]` on `device`, each value as GGML dequantises it.
    pub fn dequantize(&self, device: &Device) -> Result<Tensor> {
        let [rows, cols] = self.shape();
        let t = Tensor::from_fn_overwrite::<f32>(&[rows, cols], &Device::cpu(), |o| {
            for (r, row) in o.chunks_exact_mut(cols).enumerate() {
                self.packed.row(r, row)?;
            }
            Ok(())
        })?;
        t.to_device(device)
    }
}

/// Refuses inputs that would need a gradient: these ops have no backward rule.
fn no_grad(op: &str, x: &Tensor) -> Result<()> {
    if crate::autograd::is_grad_enabled() && crate::autograd::requires_grad(x) {
        return Err(Error::invalid_argument(
            op,
            "the input requires a gradient, and quantised weights have no backward rule; run \
             it under no_grad, or dequantise the matrix (QuantMatrix::dequantize) and use linear",
        ));
    }
    Ok(())
}

/// `x · wᵀ` for f32 `x` of shape `[..., cols]` on the native CPU: `[..., rows]`, as `linear`
/// with `w` dequantised would give (up to f32 rounding).
pub fn quant_linear(x: &Tensor, w: &QuantMatrix) -> Result<Tensor> {
    const OP: &str = "quant_linear";
    let [rows, cols] = w.shape();
    if x.dtype() != DType::F32 || x.shape().last() != Some(&cols) {
        return Err(Error::shape(
            OP,
            format!(
                "expected f32 input [..., {cols}] for a {} matrix [{rows}, {cols}], got {} {}",
                w.format().name(),
                x.dtype(),
                fmt_shape(x.shape())
            ),
        ));
    }
    no_grad(OP, x)?;
    let (dev, device) = cpu_context(OP, x)?;
    let x = x.contiguous()?;
    let m = x.numel() / cols;
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank >= 1, checked above") = rows;
    let r = Reader::new(&[&x]);
    let xs = &r.data::<f32>(&x)?[x.offset()..x.offset() + x.numel()];
    let threads = dev.num_threads();
    Tensor::from_fn_overwrite::<f32>(&shape, &device, |o| {
        dev.install(|| w.packed.matmul(xs, m, o, threads))?
    })
}

/// Rows of `w` picked by integer `ids` (any shape) on the native CPU, dequantised: f32
/// `[...ids, cols]`, as `embedding` over the dequantised matrix.
pub fn quant_embedding(ids: &Tensor, w: &QuantMatrix) -> Result<Tensor> {
    const OP: &str = "quant_embedding";
    let [rows, cols] = w.shape();
    let (_, device) = cpu_context(OP, ids)?;
    let idx: Vec<i64> = match ids.dtype() {
        DType::I64 => ids.to_vec::<i64>()?,
        DType::I32 => ids.to_vec::<i32>()?.into_iter().map(i64::from).collect(),
        d => {
            return Err(Error::invalid_argument(
                OP,
                format!("expected i64 or i32 ids, got {d}"),
            ));
        }
    };
    let mut shape = ids.shape().to_vec();
    shape.push(cols);
    Tensor::from_fn_overwrite::<f32>(&shape, &device, |o| {
        for (&i, row) in idx.iter().zip(o.chunks_exact_mut(cols)) {
            if i < 0 || i as usize >= rows {
                return Err(Error::IndexOutOfRange {
                    op: OP.into(),
                    index: i,
                    dim: 0,
                    size: rows,
                    shape: vec![rows, cols],
                });
            }
            w.packed.row(i as usize, row)?;
        }
        Ok(())
    })
}
