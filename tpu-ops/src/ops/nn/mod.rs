//! Neural-network functions: softmax and log-softmax, layer/RMS/group/batch normalisation,
//! dropout, scaled dot-product attention, rotary position embeddings and losses.
//!
//! Every op here is float-only (f16, bf16, f32, f64). The 16-bit floats compute in f32 and round
//! once at the end, in the CPU kernels and in the lowerings alike. The CPU kernels are fused: each
//! makes its passes over a row in one place and builds no intermediate tensors (the attention
//! kernel never holds more than one block of scores per query row). Sums of many terms (norm
//! statistics, loss reductions) accumulate in f64 on the CPU.
//!
//! Every op has a backward rule with PyTorch's formulas, written with ops (so it runs on the
//! device the forward ran on).
//!
//! One file or folder per sub-family (`softmax`, `norm`, `attention`, `loss`, `dropout`,
//! `rotary`), each with its ops, kernels, lowerings and backward rules; `args`, `cpu`, `lower`
//! and `grad` hold what the sub-families share. The free functions with PyTorch's
//! `torch.nn.functional` names live in [`functional`]; functions with many optional arguments
//! take an options value with PyTorch's keyword defaults. The per-tensor ones are also methods
//! through [`NnOps`].

mod args;
mod attention;
mod cpu;
mod dropout;
mod grad;
mod loss;
mod lower;
mod norm;
mod rotary;
mod softmax;
mod table;

use tpu_tensor::{Dim, Generator, Result, Tensor};

pub use attention::{Attention, AttentionOptions};
pub use dropout::DropoutOp;
pub use loss::{
    BceWithLogitsOptions, ClassLoss, CrossEntropyOptions, DEFAULT_IGNORE_INDEX, NllLossOptions,
    PointKind, PointLoss, Reduction,
};
pub use norm::{BatchNorm, BatchNormOptions, Norm, NormKind, NormOptions, RmsNormOptions};
pub use rotary::Rotary;
pub use softmax::Softmax;
pub use table::table;

/// The ops of this family as free functions with `torch.nn.functional`'s names and semantics.
pub mod functional {
    pub use super::attention::{
        AttentionOptions, scaled_dot_product_attention, scaled_dot_product_attention_with,
    };
    pub use super::dropout::{dropout, dropout_seeded};
    pub use super::loss::{
        BceWithLogitsOptions, CrossEntropyOptions, DEFAULT_IGNORE_INDEX, NllLossOptions, Reduction,
        binary_cross_entropy_with_logits, binary_cross_entropy_with_logits_with, cross_entropy,
        cross_entropy_with, mse_loss, nll_loss, nll_loss_with,
    };
    pub use super::norm::{
        BatchNormOptions, BatchNormOutput, NormOptions, RmsNormOptions, batch_norm, group_norm,
        group_norm_with, layer_norm, layer_norm_with, rms_norm, rms_norm_with,
    };
    pub use super::rotary::{apply_rotary_emb, rotary_cos_sin, rotary_cos_sin_freqs};
    pub use super::softmax::{log_softmax, softmax};
}

/// This family's per-tensor ops as methods on `Tensor` (see [`functional`] for the others).
pub trait NnOps {
    /// `softmax` along `dim`.
    fn softmax(&self, dim: impl Dim) -> Result<Tensor>;
    /// `log_softmax` along `dim`.
    fn log_softmax(&self, dim: impl Dim) -> Result<Tensor>;
    /// Layer normalisation over the trailing `normalized_shape` dims, with PyTorch's defaults.
    fn layer_norm(&self, normalized_shape: &[usize]) -> Result<Tensor>;
    /// Layer normalisation over the trailing `normalized_shape` dims.
    fn layer_norm_with(&self, normalized_shape: &[usize], opts: &NormOptions) -> Result<Tensor>;
    /// RMS normalisation over the trailing `normalized_shape` dims, with PyTorch's defaults.
    fn rms_norm(&self, normalized_shape: &[usize]) -> Result<Tensor>;
    /// RMS normalisation over the trailing `normalized_shape` dims.
    fn rms_norm_with(&self, normalized_shape: &[usize], opts: &RmsNormOptions) -> Result<Tensor>;
    /// Group normalisation of an `[N, C, *]` tensor, with PyTorch's defaults.
    fn group_norm(&self, num_groups: usize) -> Result<Tensor>;
    /// Group normalisation of an `[N, C, *]` tensor.
    fn group_norm_with(&self, num_groups: usize, opts: &NormOptions) -> Result<Tensor>;
    /// Dropout with a mask drawn from `generator`.
    fn dropout(&self, p: f64, training: bool, generator: &mut Generator) -> Result<Tensor>;
    /// Rotary position embedding (rotate-half convention).
    fn apply_rotary_emb(&self, cos: &Tensor, sin: &Tensor) -> Result<Tensor>;
}

impl NnOps for Tensor {
    fn softmax(&self, dim: impl Dim) -> Result<Tensor> {
        functional::softmax(self, dim)
    }

    fn log_softmax(&self, dim: impl Dim) -> Result<Tensor> {
        functional::log_softmax(self, dim)
    }

    fn layer_norm(&self, normalized_shape: &[usize]) -> Result<Tensor> {
        functional::layer_norm(self, normalized_shape)
    }

    fn layer_norm_with(&self, normalized_shape: &[usize], opts: &NormOptions) -> Result<Tensor> {
        functional::layer_norm_with(self, normalized_shape, opts)
    }

    fn rms_norm(&self, normalized_shape: &[usize]) -> Result<Tensor> {
        functional::rms_norm(self, normalized_shape)
    }

    fn rms_norm_with(&self, normalized_shape: &[usize], opts: &RmsNormOptions) -> Result<Tensor> {
        functional::rms_norm_with(self, normalized_shape, opts)
    }

    fn group_norm(&self, num_groups: usize) -> Result<Tensor> {
        functional::group_norm(self, num_groups)
    }

    fn group_norm_with(&self, num_groups: usize, opts: &NormOptions) -> Result<Tensor> {
        functional::group_norm_with(self, num_groups, opts)
    }

    fn dropout(&self, p: f64, training: bool, generator: &mut Generator) -> Result<Tensor> {
        functional::dropout(self, p, training, generator)
    }

    fn apply_rotary_emb(&self, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        functional::apply_rotary_emb(self, cos, sin)
    }
}
