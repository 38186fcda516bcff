//! Convolutions, pooling and interpolation over PyTorch's channels-first layouts: `[N, C, L]`
//! for 1-D ops, `[N, C, H, W]` for 2-D ops and `[N, C, D, H, W]` for 3-D ones (the batch dim
//! may be left out, as PyTorch allows).
//!
//! The CPU kernels compute in f32 (f64 for f64 inputs) and round once to the 16-bit floats.
//! Convolutions gather input patches into a matrix (im2col) and multiply it with the weight:
//! with faer's product in f32 and f64, and in bf16 and f16 with the crate's SIMD product
//! ([`crate::cpu::simd::gemm`], f32 accumulation) where AVX-512 or AVX2 runs, else faer's f32 product
//! on widened copies. The transposed convolution multiplies with faer and adds every tap into
//! place (col2im). Pooling and interpolation loop directly over the `(N, C)` planes. The
//! lowerings use `stablehlo.convolution`, `stablehlo.reduce_window`, and gathers whose index
//! tables are computed when the program is built, with the same arithmetic as the CPU kernels.
//!
//! Every op here has a backward rule made of ops, so gradients run where the forward ran:
//! convolutions differentiate into (transposed) convolutions, max pooling scatters into the
//! indices of the maxima, average pooling is a transposed convolution with a kernel of ones,
//! adaptive pooling spreads the gradient over its windows, and interpolation `index_add`s the
//! weighted gradient into its source rows and columns.
//!
//! `col2im` and `im2col` (`fold.rs`) are compositions of indexing ops over one index table;
//! 3-D pooling (`pool3d.rs`) and the 3-D convolutions (`conv3d.rs`) are compositions of the
//! 2-D ops, one per depth tap, and the 1-D transposed convolution is the 2-D one over a height
//! of 1; `grid_sample.rs` composes elementwise ops and one `gather` per tap.
//!
//! Each sub-family has a folder (`convolution/`, `pool/`, `interpolate/`) with its op structs
//! and shape rules in `mod.rs` and its kernels, lowerings and backward rules in `cpu.rs`,
//! `lower.rs` and `grad.rs`; `cpu.rs` and `lower.rs` here hold what the sub-families share,
//! `options.rs` the builders, `table.rs` the op table's rows. This file: the `Tensor` methods.

mod conv3d;
mod convolution;
pub(crate) mod cpu;
mod fold;
mod grid_sample;
mod interpolate;
mod lower;
mod options;
mod pool;
mod pool3d;
mod table;

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{Error, Result, Tensor};

use crate::op::Meta;

pub use conv3d::{conv_transpose1d, conv_transpose3d, conv3d};
pub use convolution::{Conv, ConvTranspose2d};
pub use fold::{col2im, im2col};
pub use grid_sample::{GridMode, GridPadding, GridSampleOptions, grid_sample};
pub use interpolate::Interpolate;
pub use options::{
    AvgPoolOptions, ConvOptions, ConvTransposeOptions, FoldOptions, InterpolateMode, Ints,
    MaxPoolOptions, Padding, Resize,
};
pub use pool::{AdaptiveAvgPool2d, AvgPool2d, MaxPool2dOp};
pub use pool3d::{adaptive_avg_pool3d, avg_pool3d, max_pool3d, max_pool3d_with_indices};
pub use table::table;

// ---- shape helpers the sub-families share -----------------------------------------------------

/// Refuses an operand (`what`) whose dtype differs from the input's.
fn same_dtype(op: &str, what: &str, x: &Meta, other: &Meta) -> Result<()> {
    if x.dtype == other.dtype {
        Ok(())
    } else {
        Err(Error::DTypeMismatch {
            context: format!(
                "{op}: {what} of shape {} must have the input's dtype",
                fmt_shape(&other.shape)
            ),
            expected: x.dtype,
            given: other.dtype,
        })
    }
}

/// The span of a kernel of `k` taps `d` apart, or `None` when it overflows.
fn dilated(k: usize, d: usize) -> Option<usize> {
    k.checked_sub(1)?.checked_mul(d)?.checked_add(1)
}

/// A size computed from user arguments, or a shape error saying which one overflowed.
fn arith(op: &str, what: &str, v: Option<usize>) -> Result<usize> {
    v.ok_or_else(|| {
        Error::shape(
            op,
            format!("the {what} is more than the address space holds"),
        )
    })
}

/// The one input of a pooling or interpolation op.
fn single<'a>(op: &str, inputs: &'a [Meta]) -> Result<&'a Meta> {
    match inputs {
        [x] => Ok(x),
        _ => Err(Error::invalid_argument(
            op,
            format!("expected one input tensor, got {}", inputs.len()),
        )),
    }
}

/// `[N, C, H, W]` of a 3-D (unbatched) or 4-D input.
fn nchw(shape: &[usize]) -> [usize; 4] {
    match shape {
        [c, h, w] => [1, *c, *h, *w],
        [n, c, h, w] => [*n, *c, *h, *w],
        _ => [0; 4],
    }
}

/// The two values of an option resolved for two spatial dims.
fn pair(v: Vec<usize>) -> [usize; 2] {
    [v[0], v[1]]
}

// ---- the public API ---------------------------------------------------------------------------

fn conv_inputs<'a>(x: &'a Tensor, w: &'a Tensor, b: Option<&'a Tensor>) -> Vec<&'a Tensor> {
    let mut v = vec![x, w];
    v.extend(b);
    v
}

/// This family's ops as methods on `Tensor`, with PyTorch's names, layouts and semantics.
pub trait ConvOps {
    /// 1-D convolution (cross-correlation) of `[N, C, L]` or `[C, L]` with a weight
    /// `[out, C / groups, k]` and an optional bias `[out]`.
    fn conv1d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor>;
    /// 2-D convolution (cross-correlation) of `[N, C, H, W]` or `[C, H, W]` with a weight
    /// `[out, C / groups, kh, kw]` and an optional bias `[out]`.
    fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor>;
    /// 2-D transposed convolution of `[N, C, H, W]` or `[C, H, W]` with a weight
    /// `[C, out / groups, kh, kw]` and an optional bias `[out]`.
    fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &ConvTransposeOptions,
    ) -> Result<Tensor>;
    /// 3-D convolution of `[N, C, D, H, W]` or `[C, D, H, W]` with a weight
    /// `[out, C / groups, kd, kh, kw]` and an optional bias `[out]` (see `conv3d.rs`).
    fn conv3d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor>;
    /// 1-D transposed convolution of `[N, C, L]` or `[C, L]` with a weight
    /// `[C, out / groups, k]` and an optional bias `[out]`.
    fn conv_transpose1d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &ConvTransposeOptions,
    ) -> Result<Tensor>;
    /// 3-D transposed convolution of `[N, C, D, H, W]` or `[C, D, H, W]` with a weight
    /// `[C, out / groups, kd, kh, kw]` and an optional bias `[out]`.
    fn conv_transpose3d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &ConvTransposeOptions,
    ) -> Result<Tensor>;
    /// 2-D max pooling of `[N, C, H, W]` or `[C, H, W]` (NaN propagates).
    fn max_pool2d(&self, opts: &MaxPoolOptions) -> Result<Tensor>;
    /// 2-D max pooling, also returning each maximum's index (i64) within its `H x W` plane.
    fn max_pool2d_with_indices(&self, opts: &MaxPoolOptions) -> Result<(Tensor, Tensor)>;
    /// 2-D average pooling of `[N, C, H, W]` or `[C, H, W]`.
    fn avg_pool2d(&self, opts: &AvgPoolOptions) -> Result<Tensor>;
    /// 2-D adaptive average pooling of `[N, C, H, W]` or `[C, H, W]` to `output_size`
    /// (one value for both dims, or height and width).
    fn adaptive_avg_pool2d(&self, output_size: impl Into<Ints>) -> Result<Tensor>;
    /// Resizes `[N, C, H, W]` (PyTorch's `interpolate` with mode `'nearest'` or
    /// `'bilinear'`).
    fn interpolate(&self, to: Resize, mode: InterpolateMode) -> Result<Tensor>;
}

impl ConvOps for Tensor {
    fn conv1d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor> {
        crate::exec::dispatch::run1(&Conv::new(1, opts)?, &conv_inputs(self, weight, bias))
    }

    fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor> {
        crate::exec::dispatch::run1(&Conv::new(2, opts)?, &conv_inputs(self, weight, bias))
    }

    fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &ConvTransposeOptions,
    ) -> Result<Tensor> {
        crate::exec::dispatch::run1(
            &ConvTranspose2d::new(opts)?,
            &conv_inputs(self, weight, bias),
        )
    }

    fn conv3d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor> {
        conv3d(self, weight, bias, opts)
    }

    fn conv_transpose1d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &ConvTransposeOptions,
    ) -> Result<Tensor> {
        conv_transpose1d(self, weight, bias, opts)
    }

    fn conv_transpose3d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &ConvTransposeOptions,
    ) -> Result<Tensor> {
        conv_transpose3d(self, weight, bias, opts)
    }

    fn max_pool2d(&self, opts: &MaxPoolOptions) -> Result<Tensor> {
        crate::exec::dispatch::run1(&MaxPool2dOp::new(opts, false)?, &[self])
    }

    fn max_pool2d_with_indices(&self, opts: &MaxPoolOptions) -> Result<(Tensor, Tensor)> {
        let mut out = crate::exec::dispatch::run(&MaxPool2dOp::new(opts, true)?, &[self])?;
        if out.len() != 2 {
            return Err(Error::internal(
                "max_pool2d",
                format!("expected values and indices, got {} outputs", out.len()),
            ));
        }
        let idx = out.remove(1);
        Ok((out.remove(0), idx))
    }

    fn avg_pool2d(&self, opts: &AvgPoolOptions) -> Result<Tensor> {
        crate::exec::dispatch::run1(&AvgPool2d::new(opts)?, &[self])
    }

    fn adaptive_avg_pool2d(&self, output_size: impl Into<Ints>) -> Result<Tensor> {
        let size = output_size
            .into()
            .resolve("adaptive_avg_pool2d", "output_size", 2)?;
        crate::exec::dispatch::run1(&AdaptiveAvgPool2d { size: pair(size) }, &[self])
    }

    fn interpolate(&self, to: Resize, mode: InterpolateMode) -> Result<Tensor> {
        let op = match mode {
            InterpolateMode::Nearest => "upsample_nearest2d",
            InterpolateMode::Bilinear { .. } => "upsample_bilinear2d",
        };
        let (size, scales) = match to {
            Resize::Size(s) => (s, [None, None]),
            Resize::Scale(f) => {
                if self.rank() != 4 {
                    return Err(Error::shape(
                        op,
                        format!(
                            "expected a 4-D [N, C, H, W] input, got shape {}",
                            fmt_shape(self.shape())
                        ),
                    ));
                }
                if f.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
                    return Err(Error::invalid_argument(
                        op,
                        format!("expected positive finite scale factors, got {f:?}"),
                    ));
                }
                let s = [
                    (self.shape()[2] as f64 * f[0]).floor() as usize,
                    (self.shape()[3] as f64 * f[1]).floor() as usize,
                ];
                (s, [Some(f[0]), Some(f[1])])
            }
        };
        crate::exec::dispatch::run1(&Interpolate { size, scales, mode }, &[self])
    }
}
