//! Llama decoders (grouped-query attention, rotary embeddings, SwiGLU, RMSNorm, tied or separate
//! output embeddings) with a KV cache that holds batches of prompts of different lengths
//! (left-padded).
//!
//! On the native CPU the matrices stay in their quantised blocks (Q4_0, Q4_1, Q8_0) and are
//! multiplied by [`crate::ops::quant`]'s kernels, which read 4-bit weights instead of f32 ones;
//! the activations stay f32, so the logits are those of the dequantised model up to rounding.
//! On other devices (or with [`WeightFormat::F32`]) every weight is dequantised to f32 on load;
//! [`WeightFormat::Bf16`] and [`WeightFormat::F16`] round them further, and the model computes
//! in that dtype.
//! llama.cpp's converter permutes the rows of the query and key projections of each head
//! (interleaving the two rotary halves); they are put back in Hugging Face's order here, so the
//! rotate-half rotary op and transformers' numbers apply unchanged.
//!
//! Loading lives in [`gguf`] (GGUF files) and [`hf`] (Hugging Face folders); generation in
//! [`crate::models::generate`].

mod gguf;
mod hf;
mod paged;
mod paged_compiled;
mod preallocated;

pub use paged::{PagedCache, PagedChunk};
pub use paged_compiled::PagedBuckets;

pub(crate) use preallocated::bucket;

use std::sync::{Arc, OnceLock};

use tpu_runtime::{DType, Device, Error, Result};
use tpu_tensor::Tensor;

use crate::nn::RmsNorm;
use crate::nn::functional as F;
use crate::ops::linalg::{PackedWeight, packed_linear};
use crate::ops::quant::{QuantMatrix, quant_embedding, quant_linear};
use crate::prelude::*;

/// The hyper-parameters of a Llama decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key and value heads (they divide `num_heads`).
    pub num_kv_heads: usize,
    /// Width of the SwiGLU block.
    pub intermediate_size: usize,
    /// The RMSNorms' epsilon.
    pub rms_norm_eps: f64,
    /// The rotary embeddings' base.
    pub rope_theta: f64,
    /// Longest context the model was trained for.
    pub max_positions: usize,
    /// How the rotary frequencies are scaled (`None`: they are not).
    pub rope_scaling: Option<RopeScaling>,
}

/// How a decoder's rotary frequencies are scaled to reach past its original context.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Every frequency divided by `factor` (positions interpolated).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3.1's: wavelengths longer than `original_max_positions / low_freq_factor` are
    /// divided by `factor`, shorter than `original_max_positions / high_freq_factor` kept, and
    /// blended smoothly between.
    Llama3 {
        /// The divisor of the low frequencies.
        factor: f64,
        /// Sets the wavelength above which frequencies are divided.
        low_freq_factor: f64,
        /// Sets the wavelength below which frequencies are kept.
        high_freq_factor: f64,
        /// The context the model was first trained for.
        original_max_positions: usize,
    },
}

impl LlamaConfig {
    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// The rotary embeddings' inverse frequencies (`head_dim / 2` of them), scaled as
    /// `rope_scaling` says (as transformers computes them, in f64 here).
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.head_dim();
        let base: Vec<f64> = (0..d / 2)
            .map(|i| self.rope_theta.powf(-((2 * i) as f64) / d as f64))
            .collect();
        match &self.rope_scaling {
            None => base,
            Some(RopeScaling::Linear { factor }) => base.iter().map(|f| f / factor).collect(),
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_positions,
            }) => {
                let old = *original_max_positions as f64;
                let (long, short) = (old / low, old / high);
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < short {
                            f
                        } else if wavelen > long {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low) / (high - low);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        }
    }

    /// Why the heads do not fit the width, if they do not.
    fn check(&self) -> std::result::Result<(), String> {
        let fit = self.num_heads > 0
            && self.num_kv_heads > 0
            && self.hidden_size.is_multiple_of(self.num_heads)
            && self.num_heads.is_multiple_of(self.num_kv_heads)
            && self.head_dim().is_multiple_of(2);
        if fit {
            Ok(())
        } else {
            Err(format!(
                "{} query heads and {} key/value heads do not split a width of {} into even \
                 heads",
                self.num_heads, self.num_kv_heads, self.hidden_size
            ))
        }
    }
}

/// How a decoder loaded from GGUF keeps its matrices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightFormat {
    /// Quantised on the native CPU, f32 elsewhere.
    #[default]
    Auto,
    /// Quantised matrices stay quantised (native CPU only); other tensors become f32.
    Quantized,
    /// Every tensor dequantised to f32.
    F32,
    /// Every tensor dequantised, then rounded to bf16: the model computes in bf16 (as
    /// transformers does with `dtype=torch.bfloat16`), its products through the bf16 dot
    /// instruction where the processor has one.
    Bf16,
    /// Every tensor dequantised, then rounded to f16: the model computes in f16.
    F16,
}

impl WeightFormat {
    /// The dtype of the tensors that are not kept quantised (the one the model computes in).
    pub fn dtype(self) -> DType {
        match self {
            WeightFormat::Bf16 => DType::BF16,
            WeightFormat::F16 => DType::F16,
            WeightFormat::Auto | WeightFormat::Quantized | WeightFormat::F32 => DType::F32,
        }
    }
}

/// A weight matrix `[out, in]`: a float tensor (with its panels packed once on the native
/// CPU, so prefill does not repack every weight on every pass), or quantised blocks.
enum Matrix {
    Dense(PackedWeight),
    Quant(QuantMatrix),
}

impl Matrix {
    /// A float weight, packed where its device runs packed products.
    fn dense(w: Tensor) -> Result<Matrix> {
        PackedWeight::new(&w).map(Matrix::Dense)
    }

    /// `x · selfᵀ`.
    fn linear(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Matrix::Dense(w) => packed_linear(x, w, None),
            Matrix::Quant(w) => quant_linear(x, w),
        }
    }

    /// Rows `ids` (an embedding lookup).
    fn rows(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            Matrix::Dense(w) => crate::ops::movement::embedding(ids, w.weight()),
            Matrix::Quant(w) => quant_embedding(ids, w),
        }
    }

    /// Bytes the weights take, packed panels included.
    fn nbytes(&self) -> usize {
        match self {
            Matrix::Dense(w) => {
                let t = w.weight();
                t.numel() * t.dtype().size_in_bytes() + w.packed_nbytes()
            }
            Matrix::Quant(w) => w.nbytes(),
        }
    }
}

/// Several projections of one input: stacked into one matrix (outputs split by the row
/// counts), or separate when they are stored differently.
enum Projections {
    Stacked(Matrix, Vec<usize>),
    Separate(Vec<Matrix>),
}

impl Projections {
    /// Each projection of `x`.
    fn apply(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match self {
            Projections::Stacked(m, sizes) => {
                let y = m.linear(x)?;
                let mut at = 0;
                sizes
                    .iter()
                    .map(|&n| {
                        let part = y.narrow(-1, at as i64, n);
                        at += n;
                        part
                    })
                    .collect()
            }
            Projections::Separate(ms) => ms.iter().map(|m| m.linear(x)).collect(),
        }
    }

    fn matrices(&self) -> Vec<&Matrix> {
        match self {
            Projections::Stacked(m, _) => vec![m],
            Projections::Separate(ms) => ms.iter().collect(),
        }
    }
}

struct Layer {
    attn_norm: RmsNorm,
    /// Query, key and value.
    qkv: Projections,
    o: Matrix,
    ffn_norm: RmsNorm,
    /// SwiGLU's gate and up projections.
    gate_up: Projections,
    down: Matrix,
}

/// The weights of a decoder: shared between the model and its compiled steps.
struct Parts {
    config: LlamaConfig,
    embed: Matrix,
    layers: Vec<Layer>,
    norm: RmsNorm,
    /// The output projection; `None` when it is the token embedding (tied).
    output: Option<Matrix>,
}

/// A Llama decoder.
pub struct Llama {
    /// Its configuration.
    pub config: LlamaConfig,
    device: Device,
    parts: Arc<Parts>,
    /// The forward pass over a preallocated cache compiled for a PJRT device, made on first
    /// use: the decode of one token, the last logits of several, all their logits.
    steps: OnceLock<[tpu_graph::CompiledFn; 3]>,
    /// The paged passes compiled for a PJRT device, made on first use: the decodes, a longer
    /// chunk.
    paged_steps: OnceLock<[tpu_graph::CompiledFn; 2]>,
}

/// The keys and values of the positions a batch of sequences has seen, per layer: `[batch, kv
/// heads, positions, head dim]`. Cloning is cheap (the tensors are shared; new positions make
/// new tensors, or, in a preallocated cache, a clone copies its tensors before its first
/// write), so a clone is a snapshot to continue from, as a prefix cache needs.
///
/// Prompts of different lengths share a batch left-padded ([`KvCache::left_padded`]): row `r`
/// starts with `pad[r]` positions that no query attends to, and its first real token has
/// position 0, so each row computes what it would alone.
#[derive(Clone, Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
    /// Padding positions at the start of each row (empty: none).
    pad: Vec<usize>,
    /// Slots allocated in every layer, when preallocated ([`KvCache::with_capacity`]).
    capacity: Option<usize>,
    /// Shared by the clones of a cache: a preallocated cache is written in place, so a clone
    /// that is still shared copies its tensors before its first write.
    clones: Arc<()>,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// An empty cache for a batch whose row `r` starts with `pad[r]` padding positions (the
    /// first forward pass brings them, whatever ids they hold).
    pub fn left_padded(pad: Vec<usize>) -> KvCache {
        KvCache {
            pad,
            ..KvCache::default()
        }
    }

    /// Positions cached (padding included).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Padding positions at the start of each row (empty when the rows are not padded).
    pub fn padding(&self) -> &[usize] {
        &self.pad
    }

    /// The cache of rows `rows` of the batch, in that order (say, the sequences still
    /// generating).
    pub fn select_rows(&self, rows: &[usize]) -> Result<KvCache> {
        if self.pad.is_empty() && self.layers.iter().all(Option::is_none) {
            // Nothing cached and no rows known yet: any rows of it are as empty.
            return Ok(KvCache {
                capacity: self.capacity,
                ..KvCache::new()
            });
        }
        let batch = self
            .layers
            .iter()
            .flatten()
            .map(|(k, _)| k.shape()[0])
            .next()
            .unwrap_or(self.pad.len());
        if let Some(&r) = rows.iter().find(|&&r| r >= batch) {
            return Err(Error::invalid_argument(
                "kv_cache",
                format!("row {r} of a batch of {batch}"),
            ));
        }
        let pad = if self.pad.is_empty() {
            Vec::new()
        } else {
            rows.iter().map(|&r| self.pad[r]).collect()
        };
        let layers = match self.layers.iter().flatten().next() {
            None => self.layers.clone(),
            Some((k, _)) => {
                let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
                let idx =
                    Tensor::from_vec(idx, [rows.len()], &Device::cpu())?.to_device(k.device())?;
                self.layers
                    .iter()
                    .map(|l| match l {
                        Some((k, v)) => {
                            Ok(Some((k.index_select(0, &idx)?, v.index_select(0, &idx)?)))
                        }
                        None => Ok(None),
                    })
                    .collect::<Result<Vec<_>>>()?
            }
        };
        Ok(KvCache {
            layers,
            len: self.len,
            pad,
            capacity: self.capacity,
            clones: Arc::default(),
        })
    }
}

impl Layer {
    /// The layer over hidden states `x` `[b, l, hidden]` whose rotary tables are `rope`;
    /// `attend(k, v)` takes the new positions' keys and values `[b, kv heads, l, head dim]`
    /// and gives those to attend over (the cached ones with them). Without `mask`, attention
    /// is causal over the new positions alone.
    fn forward(
        &self,
        c: &LlamaConfig,
        x: &Tensor,
        rope: (&Tensor, &Tensor),
        mask: Option<&Tensor>,
        attend: impl FnOnce(Tensor, Tensor) -> Result<(Tensor, Tensor)>,
    ) -> Result<Tensor> {
        let (l, nkv, nh) = (x.shape()[1], c.num_kv_heads, c.num_heads);
        self.forward_with(c, x, rope, |q, k, v| {
            let (k, v) = attend(k, v)?;
            let opts = F::AttentionOptions::new().enable_gqa(nkv != nh);
            let opts = match mask {
                Some(m) => opts.attn_mask(m),
                None => opts.is_causal(l > 1),
            };
            F::scaled_dot_product_attention_with(&q, &k, &v, &opts)
        })
    }

    /// The layer over hidden states `x` `[b, l, hidden]` whose rotary tables are `rope`, with
    /// `attention(q, k, v)` given the new positions' queries `[b, heads, l, head dim]`, keys
    /// and values `[b, kv heads, l, head dim]` (rotated) and giving the attention's output
    /// `[b, heads, l, head dim]`.
    fn forward_with(
        &self,
        c: &LlamaConfig,
        x: &Tensor,
        rope: (&Tensor, &Tensor),
        attention: impl FnOnce(Tensor, Tensor, Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let (hd, nh, nkv) = (c.head_dim(), c.num_heads, c.num_kv_heads);
        let xn = self.attn_norm.forward(x)?;
        let heads = |t: Tensor, n: usize| t.reshape([b, l, n, hd])?.transpose(1, 2);
        let [q, k, v]: [Tensor; 3] = self
            .qkv
            .apply(&xn)?
            .try_into()
            .map_err(|_| Error::internal("llama", "three projections"))?;
        let q = heads(q, nh)?.apply_rotary_emb(rope.0, rope.1)?;
        let k = heads(k, nkv)?.apply_rotary_emb(rope.0, rope.1)?;
        let a = attention(q, k, heads(v, nkv)?)?
            .transpose(1, 2)?
            .reshape([b, l, c.hidden_size])?;
        let x = x.add(&self.o.linear(&a)?)?;
        let xn = self.ffn_norm.forward(&x)?;
        let [g, u]: [Tensor; 2] = self
            .gate_up
            .apply(&xn)?
            .try_into()
            .map_err(|_| Error::internal("llama", "two projections"))?;
        x.add(&self.down.linear(&g.silu()?.mul(&u)?)?)
    }
}

impl Parts {
    /// Logits of hidden states `x` `[b, l, hidden]`: of the last position alone with
    /// `last_only`.
    fn head(&self, x: Tensor, last_only: bool) -> Result<Tensor> {
        let l = x.shape()[1];
        let x = if last_only {
            x.narrow(1, l as i64 - 1, 1)?
        } else {
            x
        };
        let x = self.norm.forward(&x)?;
        self.output.as_ref().unwrap_or(&self.embed).linear(&x)
    }
}

/// `[batch, len]` of token ids, or the error naming the shape given.
fn batch_and_len(ids: &Tensor) -> Result<(usize, usize)> {
    match ids.shape() {
        &[b, l] => Ok((b, l)),
        s => Err(Error::shape(
            "llama",
            format!("expected token ids [batch, len], got {s:?}"),
        )),
    }
}

impl Llama {
    /// The model of these weights.
    fn assemble(
        config: LlamaConfig,
        device: Device,
        embed: Matrix,
        layers: Vec<Layer>,
        norm: RmsNorm,
        output: Option<Matrix>,
    ) -> Llama {
        Llama {
            parts: Arc::new(Parts {
                config: config.clone(),
                embed,
                layers,
                norm,
                output,
            }),
            config,
            device,
            steps: OnceLock::new(),
            paged_steps: OnceLock::new(),
        }
    }

    /// Whether the matrices are kept quantised (see [`WeightFormat`]).
    pub fn is_quantized(&self) -> bool {
        matches!(self.parts.embed, Matrix::Quant(_))
            || self
                .parts
                .layers
                .iter()
                .any(|l| matches!(l.down, Matrix::Quant(_)))
    }

    /// Bytes the weights take on their device (with the panels of dense matrices packed for
    /// the native CPU's products).
    pub fn nbytes(&self) -> usize {
        let norms = |n: &RmsNorm| n.weight.numel() * 4;
        let p = &self.parts;
        let layers: usize = p
            .layers
            .iter()
            .map(|l| {
                l.qkv
                    .matrices()
                    .into_iter()
                    .chain(l.gate_up.matrices())
                    .chain([&l.o, &l.down])
                    .map(Matrix::nbytes)
                    .sum::<usize>()
                    + norms(&l.attn_norm)
                    + norms(&l.ffn_norm)
            })
            .sum();
        layers + p.embed.nbytes() + p.output.as_ref().map_or(0, Matrix::nbytes) + norms(&p.norm)
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The dtype the model computes in (and gives its logits in): its dense weights' (f32
    /// for quantised matrices, whose products take and give f32).
    pub fn dtype(&self) -> DType {
        match &self.parts.embed {
            Matrix::Dense(w) => w.weight().dtype(),
            Matrix::Quant(_) => DType::F32,
        }
    }

    /// Logits `[batch, len, vocab]` for token ids `[batch, len]` (i64) that follow the positions
    /// `cache` holds; their keys and values are appended to it. With `last_only`, the logits
    /// of the last position alone (`[batch, 1, vocab]`), as generation needs.
    ///
    /// With a preallocated cache ([`KvCache::with_capacity`]) the pass has the same shapes at
    /// every position, and on a PJRT device it runs as one compiled program per batch size,
    /// new-token count and capacity (see [`Llama::programs`]).
    pub fn forward(&self, ids: &Tensor, cache: &mut KvCache, last_only: bool) -> Result<Tensor> {
        // Hundreds of small ops per decoded token: one hand-off to the CPU's threads, not one
        // per op.
        crate::tpu_ops::cpu::on_device_threads(&self.device, || {
            if cache.capacity.is_some() {
                self.forward_preallocated(ids, cache, last_only)
            } else {
                self.forward_here(ids, cache, last_only)
            }
        })
    }

    /// Checks `ids` against the cache and the model's context; gives `(batch, len, padded)`.
    fn check_input(&self, ids: &Tensor, cache: &KvCache) -> Result<(usize, usize, bool)> {
        let (b, l) = batch_and_len(ids)?;
        let past = cache.len;
        let max = self.config.max_positions;
        if past + l > max {
            return Err(Error::invalid_argument(
                "llama",
                format!(
                    "{} positions ({past} cached and {l} new), the model takes at most {max}",
                    past + l,
                ),
            ));
        }
        if let Some((k, _)) = cache.layers.iter().flatten().next()
            && k.shape()[0] != b
        {
            return Err(Error::invalid_argument(
                "llama",
                format!("{b} rows of token ids for a cache of {} rows", k.shape()[0]),
            ));
        }
        let padded = cache.pad.iter().any(|&p| p > 0);
        if padded && (cache.pad.len() != b || cache.pad.iter().any(|&p| p >= past + l)) {
            return Err(Error::invalid_argument(
                "llama",
                format!(
                    "left padding {:?} for {b} rows of {} positions: one count per row, each \
                     leaving a real token",
                    cache.pad,
                    past + l
                ),
            ));
        }
        Ok((b, l, padded))
    }

    /// The rotary tables of slots `past..past + l`: `[b, 1, l, head dim]` for rows padded by
    /// `pads` (row r's slot s holds position s - pads[r]), `[l, head dim]` without.
    fn rope(&self, pads: Option<&[usize]>, past: usize, l: usize) -> Result<(Tensor, Tensor)> {
        let inv_freq = self.config.inv_freq();
        let dev = &self.device;
        let Some(pads) = pads else {
            let positions: Vec<usize> = (past..past + l).collect();
            return F::rotary_cos_sin_freqs(&positions, &inv_freq, self.dtype(), dev);
        };
        let positions: Vec<usize> = pads
            .iter()
            .flat_map(|&p| (past..past + l).map(move |s| s.saturating_sub(p)))
            .collect();
        let (cos, sin) = F::rotary_cos_sin_freqs(&positions, &inv_freq, self.dtype(), dev)?;
        let shape = [pads.len(), 1, l, self.config.head_dim()];
        Ok((cos.reshape(shape)?, sin.reshape(shape)?))
    }

    /// Whether query `i` of the new positions in a row padded by `pad` sees slot `j`: its
    /// row's real keys up to itself, and itself (so a padding query's softmax row is never
    /// empty).
    fn sees(pad: usize, past: usize, i: usize, j: usize) -> bool {
        (j >= pad && j <= past + i) || j == past + i
    }

    fn forward_here(&self, ids: &Tensor, cache: &mut KvCache, last_only: bool) -> Result<Tensor> {
        let (b, l, padded) = self.check_input(ids, cache)?;
        let past = cache.len;
        let c = &self.config;
        if cache.layers.is_empty() {
            cache.layers = (0..c.num_layers).map(|_| None).collect();
        }
        let dev = self.device();
        let (cos, sin) = self.rope(padded.then_some(&cache.pad[..]), past, l)?;
        let mask = if padded {
            let m: Vec<bool> = cache
                .pad
                .iter()
                .flat_map(|&p| {
                    (0..l).flat_map(move |i| (0..past + l).map(move |j| Self::sees(p, past, i, j)))
                })
                .collect();
            Some(Tensor::from_vec(m, [b, 1, l, past + l], &Device::cpu())?.to_device(dev)?)
        } else if l > 1 && past > 0 {
            // Causal over the cached positions too: query i sees keys 0..=past + i.
            let m: Vec<bool> = (0..l)
                .flat_map(|i| (0..past + l).map(move |j| j <= past + i))
                .collect();
            Some(Tensor::from_vec(m, [l, past + l], &Device::cpu())?.to_device(dev)?)
        } else {
            None
        };
        let p = &self.parts;
        let mut x = p.embed.rows(ids)?;
        for (layer, slot) in p.layers.iter().zip(&mut cache.layers) {
            x = layer.forward(c, &x, (&cos, &sin), mask.as_ref(), |k, v| {
                let (k, v) = match slot.take() {
                    Some((pk, pv)) => (
                        crate::ops::movement::cat(&[&pk, &k], 2)?,
                        crate::ops::movement::cat(&[&pv, &v], 2)?,
                    ),
                    None => (k.contiguous()?, v.contiguous()?),
                };
                *slot = Some((k.clone(), v.clone()));
                Ok((k, v))
            })?;
        }
        cache.len = past + l;
        p.head(x, last_only)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selecting_rows_of_a_cache_keeps_their_padding_and_checks_them() {
        assert!(KvCache::new().select_rows(&[0, 1]).unwrap().is_empty());
        let c = KvCache::left_padded(vec![3, 0, 1]);
        assert_eq!(c.select_rows(&[2, 0]).unwrap().padding(), [1, 3]);
        let e = c.select_rows(&[3]).err().unwrap();
        assert!(e.to_string().contains("row 3 of a batch of 3"), "{e}");
    }
}
