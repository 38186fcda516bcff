//! Llama decoders (grouped-query attention, rotary embeddings, SwiGLU, RMSNorm, tied or separate
//! output embeddings) with a KV cache, loaded from GGUF files, and generation (greedy or
//! sampled).
//!
//! On the native CPU the matrices stay in their quantised blocks (Q4_0, Q4_1, Q8_0) and are
//! multiplied by [`crate::ops::quant`]'s kernels, which read 4-bit weights instead of f32 ones;
//! the activations stay f32, so the logits are those of the dequantised model up to rounding.
//! On other devices (or with [`WeightFormat::F32`]) every weight is dequantised to f32 on load.
//! llama.cpp's converter permutes the rows of the query and key projections of each head
//! (interleaving the two rotary halves); they are put back in Hugging Face's order here, so the
//! rotate-half rotary op and transformers' numbers apply unchanged.

use std::path::Path;

use tpu_runtime::{DType, Device, Error, Result};
use tpu_tensor::{GgmlType, GgufFile, Tensor};

use super::chat::{ChatMessage, ChatTemplate};
use super::sample::{Sampler, Sampling};
use super::tokenizer::TextTokenizer;
use crate::nn::RmsNorm;
use crate::nn::functional as F;
use crate::ops::quant::{QuantFormat, QuantMatrix, quant_embedding, quant_linear};
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
}

impl LlamaConfig {
    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// The configuration in a GGUF file's metadata (`llama.*` keys).
    pub fn from_gguf(f: &GgufFile) -> Result<LlamaConfig> {
        let path = f.path();
        let bad = |why: String| Error::Format {
            path: path.display().to_string(),
            format: "GGUF",
            reason: why,
        };
        let arch = f
            .meta("general.architecture")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        if arch != "llama" {
            return Err(bad(format!(
                "general.architecture is {arch:?}, this loader reads \"llama\""
            )));
        }
        let u = |k: &str| -> Result<usize> {
            f.meta(&format!("llama.{k}"))
                .and_then(|v| v.as_u64())
                .map(|v| v as usize)
                .ok_or_else(|| bad(format!("no integer llama.{k} in the metadata")))
        };
        let fl = |k: &str, default: f64| -> f64 {
            f.meta(&format!("llama.{k}"))
                .and_then(|v| v.as_f64())
                .unwrap_or(default)
        };
        let vocab_size = f
            .info("token_embd.weight")
            .map(|t| t.shape[0])
            .ok_or_else(|| bad("no token_embd.weight tensor".into()))?;
        let num_heads = u("attention.head_count")?;
        let c = LlamaConfig {
            vocab_size,
            hidden_size: u("embedding_length")?,
            num_layers: u("block_count")?,
            num_heads,
            num_kv_heads: u("attention.head_count_kv").unwrap_or(num_heads),
            intermediate_size: u("feed_forward_length")?,
            // Stored as f32 in the file: the f64 of that f32, as transformers reads it.
            rms_norm_eps: fl("attention.layer_norm_rms_epsilon", 1e-5) as f32 as f64,
            rope_theta: fl("rope.freq_base", 10000.0),
            max_positions: u("context_length")?,
        };
        let heads_fit = c.num_heads > 0
            && c.num_kv_heads > 0
            && c.hidden_size.is_multiple_of(c.num_heads)
            && c.num_heads.is_multiple_of(c.num_kv_heads)
            && c.head_dim().is_multiple_of(2);
        if !heads_fit {
            return Err(bad(format!(
                "{} query heads and {} key/value heads do not split a width of {} into even \
                 heads",
                c.num_heads, c.num_kv_heads, c.hidden_size
            )));
        }
        Ok(c)
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
}

/// A weight matrix `[out, in]`: f32, or quantised blocks on the native CPU.
enum Matrix {
    Dense(Tensor),
    Quant(QuantMatrix),
}

impl Matrix {
    /// `x · selfᵀ`.
    fn linear(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Matrix::Dense(w) => crate::ops::linalg::linear(x, w, None),
            Matrix::Quant(w) => quant_linear(x, w),
        }
    }

    /// Rows `ids` (an embedding lookup).
    fn rows(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            Matrix::Dense(w) => crate::ops::movement::embedding(ids, w),
            Matrix::Quant(w) => quant_embedding(ids, w),
        }
    }

    /// Bytes the weights take.
    fn nbytes(&self) -> usize {
        match self {
            Matrix::Dense(w) => w.numel() * w.dtype().size_in_bytes(),
            Matrix::Quant(w) => w.nbytes(),
        }
    }
}

/// A matrix on its way to the model: GGML blocks kept as they are (with the tensor's name, for
/// errors), or f32 on the CPU.
enum Part {
    Blocks(String, QuantFormat, [usize; 2], Vec<u8>),
    F32(Tensor),
}

impl Part {
    fn rows(&self) -> usize {
        match self {
            Part::Blocks(_, _, shape, _) => shape[0],
            Part::F32(w) => w.shape()[0],
        }
    }

    fn cols(&self) -> usize {
        match self {
            Part::Blocks(_, _, shape, _) => shape[1],
            Part::F32(w) => w.shape()[1],
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

/// A Llama decoder.
pub struct Llama {
    /// Its configuration.
    pub config: LlamaConfig,
    device: Device,
    embed: Matrix,
    layers: Vec<Layer>,
    norm: RmsNorm,
    /// The output projection; `None` when it is the token embedding (tied).
    output: Option<Matrix>,
}

/// The keys and values of the positions a sequence has seen, per layer: `[batch, kv heads,
/// positions, head dim]`. Cloning is cheap (the tensors are shared; new positions make new
/// tensors), so a clone is a snapshot to continue from, as a prefix cache needs.
#[derive(Clone, Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// For each row of a query or key projection in Hugging Face's order, the row llama.cpp stored
/// it as: each head's rows with the two rotary halves interleaved.
fn unpermuted_rows(out: usize, heads: usize) -> Vec<usize> {
    let half = out / heads / 2;
    (0..out)
        .map(|r| {
            let (h, t, i) = (r / (2 * half), (r / half) % 2, r % half);
            h * 2 * half + i * 2 + t
        })
        .collect()
}

/// Rows `[out, in]` of a query or key projection back in Hugging Face's order (see
/// [`unpermuted_rows`]).
fn unpermute(w: &Tensor, heads: usize) -> Result<Tensor> {
    let (out, inp) = (w.shape()[0], w.shape()[1]);
    let half = out / heads / 2;
    w.reshape([heads, half, 2, inp])?
        .transpose(1, 2)?
        .contiguous()?
        .reshape([out, inp])
}

impl Llama {
    /// The decoder in a GGUF file on `device`: quantised matrices stay quantised on the native
    /// CPU, everything is dequantised to f32 elsewhere ([`WeightFormat::Auto`]).
    pub fn from_gguf(path: &Path, device: &Device) -> Result<Llama> {
        Llama::from_gguf_with(path, device, WeightFormat::Auto)
    }

    /// The decoder in a GGUF file on `device`, its matrices kept as `format` says.
    pub fn from_gguf_with(path: &Path, device: &Device, format: WeightFormat) -> Result<Llama> {
        let quantized = match format {
            WeightFormat::Auto => device.is_cpu(),
            WeightFormat::F32 => false,
            WeightFormat::Quantized if device.is_cpu() => true,
            WeightFormat::Quantized => {
                return Err(Error::invalid_argument(
                    "llama",
                    format!(
                        "quantised weights run on the native CPU, not on {device}; load with \
                         WeightFormat::F32 (or Auto) there"
                    ),
                ));
            }
        };
        let f = GgufFile::open(path)?;
        let config = LlamaConfig::from_gguf(&f)?;
        let c = &config;
        let (h, kvw, ff) = (
            c.hidden_size,
            c.num_kv_heads * c.head_dim(),
            c.intermediate_size,
        );
        let cpu = Device::cpu();
        let bad = |reason: String| Error::Format {
            path: path.display().to_string(),
            format: "GGUF",
            reason,
        };
        let checked = |name: &str, shape: &[usize]| -> Result<GgmlType> {
            let info = f
                .info(name)
                .ok_or_else(|| bad(format!("no tensor {name:?}")))?;
            if info.shape != shape {
                return Err(bad(format!(
                    "tensor {name:?} has shape {:?}, the model expects {shape:?}",
                    info.shape
                )));
            }
            Ok(info.ggml_type)
        };
        let get = |name: &str, shape: &[usize]| -> Result<Tensor> {
            checked(name, shape)?;
            f.dequantize(name, &cpu)
        };
        let to = |t: Tensor| t.to_device(device);
        // A matrix `[out, in]`, its rows put back in Hugging Face's order for `heads` heads.
        // A matrix `[out, in]` as stored (quantised blocks, kept when `quantized`) or as f32
        // on the CPU, its rows put back in Hugging Face's order for `heads` heads.
        let part = |name: &str, shape: [usize; 2], heads: Option<usize>| -> Result<Part> {
            let qf = match checked(name, &shape)? {
                GgmlType::Q4_0 => Some(QuantFormat::Q4_0),
                GgmlType::Q4_1 => Some(QuantFormat::Q4_1),
                GgmlType::Q8_0 => Some(QuantFormat::Q8_0),
                _ => None,
            };
            match qf {
                Some(qf) if quantized => {
                    let raw = f.raw(name)?;
                    let raw = match heads {
                        Some(n) => {
                            let row = raw.len() / shape[0];
                            unpermuted_rows(shape[0], n)
                                .iter()
                                .flat_map(|&r| &raw[r * row..(r + 1) * row])
                                .copied()
                                .collect()
                        }
                        None => raw.to_vec(),
                    };
                    Ok(Part::Blocks(name.to_string(), qf, shape, raw))
                }
                _ => {
                    let w = get(name, &shape)?;
                    Ok(Part::F32(match heads {
                        Some(n) => unpermute(&w, n)?,
                        None => w,
                    }))
                }
            }
        };
        let quant = |name: &str, qf, shape: [usize; 2], raw: &[u8]| -> Result<Matrix> {
            QuantMatrix::from_blocks(qf, shape[0], shape[1], raw)
                .map(Matrix::Quant)
                .map_err(|e| bad(format!("tensor {name:?}: {e}")))
        };
        let matrix = |p: Part| -> Result<Matrix> {
            match p {
                Part::Blocks(name, qf, shape, raw) => quant(&name, qf, shape, &raw),
                Part::F32(w) => Ok(Matrix::Dense(to(w)?)),
            }
        };
        // Projections of the same input stacked into one matrix (one product instead of
        // several), when they are stored alike.
        let fused = |parts: Vec<Part>| -> Result<Projections> {
            let sizes: Vec<usize> = parts.iter().map(Part::rows).collect();
            let cols = parts[0].cols();
            let raws: Option<Vec<&[u8]>> = parts
                .iter()
                .map(|p| match (p, &parts[0]) {
                    (Part::Blocks(_, f, _, raw), Part::Blocks(_, f0, ..)) if f == f0 => {
                        Some(raw.as_slice())
                    }
                    _ => None,
                })
                .collect();
            let dense: Option<Vec<&Tensor>> = parts
                .iter()
                .map(|p| match p {
                    Part::F32(w) => Some(w),
                    Part::Blocks(..) => None,
                })
                .collect();
            let stacked = match (&parts[0], raws, dense) {
                (Part::Blocks(name, qf, ..), Some(raws), _) => {
                    let shape = [sizes.iter().sum(), cols];
                    Some(quant(name, *qf, shape, &raws.concat())?)
                }
                (_, _, Some(ws)) => Some(Matrix::Dense(to(crate::ops::movement::cat(&ws, 0)?)?)),
                _ => None,
            };
            Ok(match stacked {
                Some(m) => Projections::Stacked(m, sizes),
                None => Projections::Separate(
                    parts.into_iter().map(matrix).collect::<Result<Vec<_>>>()?,
                ),
            })
        };
        let norm = |name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm {
                shape: vec![h],
                weight: to(get(name, &[h])?)?,
                eps: Some(c.rms_norm_eps),
            })
        };
        let layers = (0..c.num_layers)
            .map(|i| {
                let b = |s: &str| format!("blk.{i}.{s}.weight");
                Ok(Layer {
                    attn_norm: norm(&b("attn_norm"))?,
                    qkv: fused(vec![
                        part(&b("attn_q"), [h, h], Some(c.num_heads))?,
                        part(&b("attn_k"), [kvw, h], Some(c.num_kv_heads))?,
                        part(&b("attn_v"), [kvw, h], None)?,
                    ])?,
                    o: matrix(part(&b("attn_output"), [h, h], None)?)?,
                    ffn_norm: norm(&b("ffn_norm"))?,
                    gate_up: fused(vec![
                        part(&b("ffn_gate"), [ff, h], None)?,
                        part(&b("ffn_up"), [ff, h], None)?,
                    ])?,
                    down: matrix(part(&b("ffn_down"), [h, ff], None)?)?,
                })
            })
            .collect::<Result<Vec<Layer>>>()?;
        let output = match f.info("output.weight") {
            Some(_) => Some(matrix(part("output.weight", [c.vocab_size, h], None)?)?),
            None => None,
        };
        Ok(Llama {
            device: device.clone(),
            embed: matrix(part("token_embd.weight", [c.vocab_size, h], None)?)?,
            norm: norm("output_norm.weight")?,
            layers,
            output,
            config,
        })
    }

    /// Whether the matrices are kept quantised (see [`WeightFormat`]).
    pub fn is_quantized(&self) -> bool {
        matches!(self.embed, Matrix::Quant(_))
            || self
                .layers
                .iter()
                .any(|l| matches!(l.down, Matrix::Quant(_)))
    }

    /// Bytes the weights take on their device.
    pub fn nbytes(&self) -> usize {
        let norms = |n: &RmsNorm| n.weight.numel() * 4;
        let layers: usize = self
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
        layers
            + self.embed.nbytes()
            + self.output.as_ref().map_or(0, Matrix::nbytes)
            + norms(&self.norm)
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Logits `[batch, len, vocab]` for token ids `[batch, len]` (i64) that follow the positions
    /// `cache` holds; their keys and values are appended to it. With `last_only`, the logits
    /// of the last position alone (`[batch, 1, vocab]`), as generation needs.
    pub fn forward(&self, ids: &Tensor, cache: &mut KvCache, last_only: bool) -> Result<Tensor> {
        // Hundreds of small ops per decoded token: one hand-off to the CPU's threads, not one
        // per op.
        crate::tpu_ops::cpu::on_device_threads(&self.device, || {
            self.forward_here(ids, cache, last_only)
        })
    }

    fn forward_here(&self, ids: &Tensor, cache: &mut KvCache, last_only: bool) -> Result<Tensor> {
        let c = &self.config;
        let [b, l] = ids.shape() else {
            return Err(Error::shape(
                "llama",
                format!("expected token ids [batch, len], got {:?}", ids.shape()),
            ));
        };
        let (b, l) = (*b, *l);
        let past = cache.len;
        if past + l > c.max_positions {
            return Err(Error::invalid_argument(
                "llama",
                format!(
                    "{} positions ({past} cached and {l} new), the model takes at most {}",
                    past + l,
                    c.max_positions
                ),
            ));
        }
        if cache.layers.is_empty() {
            cache.layers = (0..c.num_layers).map(|_| None).collect();
        }
        let dev = self.device();
        let (hd, nh, nkv) = (c.head_dim(), c.num_heads, c.num_kv_heads);
        let positions: Vec<usize> = (past..past + l).collect();
        let (cos, sin) = F::rotary_cos_sin(&positions, hd, c.rope_theta, DType::F32, dev)?;
        // Causal over the cached positions too: query i sees keys 0..=past + i.
        let mask = if l > 1 && past > 0 {
            let m: Vec<bool> = (0..l)
                .flat_map(|i| (0..past + l).map(move |j| j <= past + i))
                .collect();
            Some(Tensor::from_vec(m, [l, past + l], &Device::cpu())?.to_device(dev)?)
        } else {
            None
        };
        let mut x = self.embed.rows(ids)?;
        for (layer, slot) in self.layers.iter().zip(&mut cache.layers) {
            let xn = layer.attn_norm.forward(&x)?;
            let heads = |t: Tensor, n: usize| t.reshape([b, l, n, hd])?.transpose(1, 2);
            let [q, k, v]: [Tensor; 3] = layer
                .qkv
                .apply(&xn)?
                .try_into()
                .map_err(|_| Error::internal("llama", "three projections"))?;
            let q = heads(q, nh)?.apply_rotary_emb(&cos, &sin)?;
            let k = heads(k, nkv)?.apply_rotary_emb(&cos, &sin)?;
            let v = heads(v, nkv)?;
            let (k, v) = match slot.take() {
                Some((pk, pv)) => (
                    crate::ops::movement::cat(&[&pk, &k], 2)?,
                    crate::ops::movement::cat(&[&pv, &v], 2)?,
                ),
                None => (k.contiguous()?, v.contiguous()?),
            };
            let opts = F::AttentionOptions::new().enable_gqa(nkv != nh);
            let opts = match &mask {
                Some(m) => opts.attn_mask(m),
                None => opts.is_causal(l > 1),
            };
            let a = F::scaled_dot_product_attention_with(&q, &k, &v, &opts)?
                .transpose(1, 2)?
                .reshape([b, l, c.hidden_size])?;
            *slot = Some((k, v));
            x = x.add(&layer.o.linear(&a)?)?;
            let xn = layer.ffn_norm.forward(&x)?;
            let [g, u]: [Tensor; 2] = layer
                .gate_up
                .apply(&xn)?
                .try_into()
                .map_err(|_| Error::internal("llama", "two projections"))?;
            let g = g.silu()?;
            x = x.add(&layer.down.linear(&g.mul(&u)?)?)?;
        }
        cache.len = past + l;
        let x = if last_only {
            x.narrow(1, l as i64 - 1, 1)?
        } else {
            x
        };
        let x = self.norm.forward(&x)?;
        self.output.as_ref().unwrap_or(&self.embed).linear(&x)
    }

    /// Greedy generation: [`Llama::generate`] with [`Sampling::greedy`].
    pub fn generate_greedy(
        &self,
        tokenizer: &TextTokenizer,
        prompt: &str,
        max_new: usize,
        stop: &[u32],
        on_token: impl FnMut(&str),
    ) -> Result<Generation> {
        let greedy = Sampling::greedy();
        self.generate(tokenizer, prompt, max_new, stop, &greedy, on_token)
    }

    /// `prompt`'s tokens, then up to `max_new` tokens chosen as `sampling` says, stopping
    /// after a token of `stop`; `on_token` receives each new token's text as it is produced.
    pub fn generate(
        &self,
        tokenizer: &TextTokenizer,
        prompt: &str,
        max_new: usize,
        stop: &[u32],
        sampling: &Sampling,
        on_token: impl FnMut(&str),
    ) -> Result<Generation> {
        let opts = GenerateOptions {
            max_new,
            stop_tokens: stop.to_vec(),
            sampling: sampling.clone(),
            ..GenerateOptions::default()
        };
        let ids = tokenizer.encode(prompt, true)?;
        self.generate_with(tokenizer, &ids, &opts, on_token)
    }

    /// The assistant's answer to `messages`, rendered with the model's chat `template` (with
    /// the generation prompt) and tokenised as it is (the template writes any special tokens).
    pub fn generate_chat(
        &self,
        tokenizer: &TextTokenizer,
        template: &ChatTemplate,
        messages: &[ChatMessage],
        opts: &GenerateOptions,
        on_token: impl FnMut(&str),
    ) -> Result<Generation> {
        let text = template.render(messages, true)?;
        let ids = tokenizer.encode(&text, false)?;
        self.generate_with(tokenizer, &ids, opts, on_token)
    }

    /// Tokens after the prompt `ids`, as `opts` says; `on_token` receives the new text as it is
    /// produced (held back while it could still be the start of a stop string, and never
    /// including one).
    pub fn generate_with(
        &self,
        tokenizer: &TextTokenizer,
        ids: &[u32],
        opts: &GenerateOptions,
        mut on_token: impl FnMut(&str),
    ) -> Result<Generation> {
        let mut sampler = Sampler::new(opts.sampling.clone())?;
        if ids.is_empty() {
            return Err(Error::invalid_argument(
                "generate",
                "the prompt has no tokens",
            ));
        }
        if opts.stop_strings.iter().any(String::is_empty) {
            return Err(Error::invalid_argument(
                "generate",
                "a stop string is empty",
            ));
        }
        let dev = self.device().clone();
        let mut cache = KvCache::new();
        let mut input: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        let mut out: Vec<u32> = Vec::new();
        // The prompt and the tokens so far, for the repetition penalty.
        let mut history = ids.to_vec();
        let mut printed = 0;
        let mut text = String::new();
        let mut finish = FinishReason::Length;
        // Text that could still grow into a stop string is held back this many bytes.
        let hold = opts.stop_strings.iter().map(String::len).max().unwrap_or(1) - 1;
        let (mut prefill, start) = (None, std::time::Instant::now());
        for _ in 0..opts.max_new {
            let n = input.len();
            let t = Tensor::from_vec(std::mem::take(&mut input), [1, n], &dev)?;
            let logits = self.forward(&t, &mut cache, true)?;
            let logits = logits.to_device(&Device::cpu())?.to_vec::<f32>()?;
            let next = sampler.next(&logits, &history)?;
            history.push(next);
            prefill.get_or_insert_with(|| start.elapsed());
            out.push(next);
            // Decode the whole continuation, so multi-byte characters split across tokens
            // print once complete.
            text = tokenizer.decode(&out, true)?;
            if let Some(at) = opts
                .stop_strings
                .iter()
                .filter_map(|s| text.find(s.as_str()))
                .min()
            {
                text.truncate(at);
                finish = FinishReason::Stop;
                break;
            }
            if opts.stop_tokens.contains(&next) {
                finish = FinishReason::Stop;
                break;
            }
            let mut safe = text.len().saturating_sub(hold);
            while !text.is_char_boundary(safe) {
                safe -= 1;
            }
            if safe > printed && !text[..safe].ends_with('\u{fffd}') {
                on_token(&text[printed..safe]);
                printed = safe;
            }
            input.push(next as i64);
        }
        if text.len() > printed && !text.ends_with('\u{fffd}') {
            on_token(&text[printed..]);
        }
        let prefill = prefill.unwrap_or_default();
        Ok(Generation {
            prompt_tokens: ids.len(),
            decode: start.elapsed().saturating_sub(prefill),
            ids: out,
            text,
            finish,
            prefill,
        })
    }
}

/// What [`Llama::generate_with`] does: how many tokens at most, where to stop, how to choose.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// New tokens at most.
    pub max_new: usize,
    /// Tokens that end the generation (kept in [`Generation::ids`], not in its text).
    pub stop_tokens: Vec<u32>,
    /// Texts that end the generation; the text is cut before the first one found.
    pub stop_strings: Vec<String>,
    /// How each token is chosen.
    pub sampling: Sampling,
}

impl Default for GenerateOptions {
    fn default() -> GenerateOptions {
        GenerateOptions {
            max_new: 32,
            stop_tokens: Vec::new(),
            stop_strings: Vec::new(),
            sampling: Sampling::greedy(),
        }
    }
}

/// Why a generation ended (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_new` tokens were generated.
    Length,
    /// A stop token or stop string came.
    Stop,
}

/// What a generation produced, and how long it took.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The new tokens' ids.
    pub ids: Vec<u32>,
    /// Their text, special tokens skipped, cut before a stop string.
    pub text: String,
    /// Why it ended.
    pub finish: FinishReason,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// The prompt's forward pass and the first new token.
    pub prefill: std::time::Duration,
    /// Every later token.
    pub decode: std::time::Duration,
}
