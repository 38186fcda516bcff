//! Llama decoders (grouped-query attention, rotary embeddings, SwiGLU, RMSNorm, tied or separate
//! output embeddings) with a KV cache, loaded from GGUF files, and generation (greedy or
//! sampled).
//!
//! GGUF weights are dequantised to f32 on load. llama.cpp's converter permutes the rows of the
//! query and key projections of each head (interleaving the two rotary halves); they are put
//! back in Hugging Face's order here, so the rotate-half rotary op and transformers' numbers
//! apply unchanged.

use std::path::Path;

use tpu_runtime::{DType, Device, Error, Result};
use tpu_tensor::{GgufFile, Tensor};

use super::sample::{Sampler, Sampling};
use super::tokenizer::TextTokenizer;
use crate::nn::RmsNorm;
use crate::nn::functional as F;
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

struct Layer {
    attn_norm: RmsNorm,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    ffn_norm: RmsNorm,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// A Llama decoder.
pub struct Llama {
    /// Its configuration.
    pub config: LlamaConfig,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: RmsNorm,
    /// The output projection; `None` when it is the token embedding (tied).
    output: Option<Tensor>,
}

/// The keys and values of the positions a sequence has seen, per layer: `[batch, kv heads,
/// positions, head dim]`.
#[derive(Default)]
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

/// Rows `[out, in]` of a query or key projection back in Hugging Face's order: llama.cpp
/// stores each head's rows with the two rotary halves interleaved.
fn unpermute(w: &Tensor, heads: usize) -> Result<Tensor> {
    let (out, inp) = (w.shape()[0], w.shape()[1]);
    let half = out / heads / 2;
    w.reshape([heads, half, 2, inp])?
        .transpose(1, 2)?
        .contiguous()?
        .reshape([out, inp])
}

impl Llama {
    /// The decoder in a GGUF file, its weights dequantised to f32 on `device`.
    pub fn from_gguf(path: &Path, device: &Device) -> Result<Llama> {
        let f = GgufFile::open(path)?;
        let config = LlamaConfig::from_gguf(&f)?;
        let c = &config;
        let (h, kvw, ff) = (
            c.hidden_size,
            c.num_kv_heads * c.head_dim(),
            c.intermediate_size,
        );
        let cpu = Device::cpu();
        let get = |name: &str, shape: &[usize]| -> Result<Tensor> {
            let info = f.info(name).ok_or_else(|| Error::Format {
                path: path.display().to_string(),
                format: "GGUF",
                reason: format!("no tensor {name:?}"),
            })?;
            if info.shape != shape {
                return Err(Error::Format {
                    path: path.display().to_string(),
                    format: "GGUF",
                    reason: format!(
                        "tensor {name:?} has shape {:?}, the model expects {shape:?}",
                        info.shape
                    ),
                });
            }
            f.dequantize(name, &cpu)
        };
        let to = |t: Tensor| t.to_device(device);
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
                    q: to(unpermute(&get(&b("attn_q"), &[h, h])?, c.num_heads)?)?,
                    k: to(unpermute(&get(&b("attn_k"), &[kvw, h])?, c.num_kv_heads)?)?,
                    v: to(get(&b("attn_v"), &[kvw, h])?)?,
                    o: to(get(&b("attn_output"), &[h, h])?)?,
                    ffn_norm: norm(&b("ffn_norm"))?,
                    gate: to(get(&b("ffn_gate"), &[ff, h])?)?,
                    up: to(get(&b("ffn_up"), &[ff, h])?)?,
                    down: to(get(&b("ffn_down"), &[h, ff])?)?,
                })
            })
            .collect::<Result<Vec<Layer>>>()?;
        let output = match f.info("output.weight") {
            Some(_) => Some(to(get("output.weight", &[c.vocab_size, h])?)?),
            None => None,
        };
        Ok(Llama {
            embed: to(get("token_embd.weight", &[c.vocab_size, h])?)?,
            norm: norm("output_norm.weight")?,
            layers,
            output,
            config,
        })
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        self.embed.device()
    }

    /// Logits `[batch, len, vocab]` for token ids `[batch, len]` (i64) that follow the positions
    /// `cache` holds; their keys and values are appended to it. With `last_only`, the logits
    /// of the last position alone (`[batch, 1, vocab]`), as generation needs.
    pub fn forward(&self, ids: &Tensor, cache: &mut KvCache, last_only: bool) -> Result<Tensor> {
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
        let mut x = crate::ops::movement::embedding(ids, &self.embed)?;
        for (layer, slot) in self.layers.iter().zip(&mut cache.layers) {
            let xn = layer.attn_norm.forward(&x)?;
            let heads = |t: Tensor, n: usize| t.reshape([b, l, n, hd])?.transpose(1, 2);
            let q = heads(crate::ops::linalg::linear(&xn, &layer.q, None)?, nh)?
                .apply_rotary_emb(&cos, &sin)?;
            let k = heads(crate::ops::linalg::linear(&xn, &layer.k, None)?, nkv)?
                .apply_rotary_emb(&cos, &sin)?;
            let v = heads(crate::ops::linalg::linear(&xn, &layer.v, None)?, nkv)?;
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
            x = x.add(&crate::ops::linalg::linear(&a, &layer.o, None)?)?;
            let xn = layer.ffn_norm.forward(&x)?;
            let g = crate::ops::linalg::linear(&xn, &layer.gate, None)?.silu()?;
            let u = crate::ops::linalg::linear(&xn, &layer.up, None)?;
            x = x.add(&crate::ops::linalg::linear(&g.mul(&u)?, &layer.down, None)?)?;
        }
        cache.len = past + l;
        let x = if last_only {
            x.narrow(1, l as i64 - 1, 1)?
        } else {
            x
        };
        let x = self.norm.forward(&x)?;
        crate::ops::linalg::linear(&x, self.output.as_ref().unwrap_or(&self.embed), None)
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
        mut on_token: impl FnMut(&str),
    ) -> Result<Generation> {
        let mut sampler = Sampler::new(sampling.clone())?;
        let ids = tokenizer.encode(prompt, true)?;
        if ids.is_empty() {
            return Err(Error::invalid_argument(
                "generate",
                "the prompt has no tokens",
            ));
        }
        let dev = self.device().clone();
        let mut cache = KvCache::new();
        let mut input: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        let mut out: Vec<u32> = Vec::new();
        // The prompt and the tokens so far, for the repetition penalty.
        let mut history = ids.clone();
        let mut printed = String::new();
        let (mut prefill, start) = (None, std::time::Instant::now());
        for _ in 0..max_new {
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
            let text = tokenizer.decode(&out, true)?;
            if text.len() > printed.len() && !text.ends_with('\u{fffd}') {
                on_token(&text[printed.len()..]);
                printed = text;
            }
            if stop.contains(&next) {
                break;
            }
            input.push(next as i64);
        }
        let prefill = prefill.unwrap_or_default();
        Ok(Generation {
            prompt_tokens: ids.len(),
            decode: start.elapsed().saturating_sub(prefill),
            ids: out,
            prefill,
        })
    }
}

/// What a generation produced, and how long it took.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The new tokens' ids.
    pub ids: Vec<u32>,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// The prompt's forward pass and the first new token.
    pub prefill: std::time::Duration,
    /// Every later token.
    pub decode: std::time::Duration,
}
