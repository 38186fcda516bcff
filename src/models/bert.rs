//! BERT encoders (Hugging Face's `BertModel`) and sentence embeddings on top of them, as the
//! sentence-transformers pipeline of a model folder computes them: token embeddings, the
//! encoder's last hidden state, a mean over the tokens the attention mask keeps, then L2
//! normalisation.

use std::path::Path;

use serde::Deserialize;
use tpu_runtime::{DType, Device, Error, Result};
use tpu_tensor::Tensor;

use super::tokenizer::{Batch, TextTokenizer};
use super::weights::Weights;
use crate::nn::LayerNorm;
use crate::nn::functional as F;
use crate::ops::linalg::{PackedWeight, packed_linear};
use crate::prelude::*;

/// The fields of a BERT `config.json` the encoder uses.
#[derive(Clone, Debug, Deserialize)]
pub struct BertConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Width of every hidden state.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer (they split `hidden_size`).
    pub num_attention_heads: usize,
    /// Width of the feed-forward block.
    pub intermediate_size: usize,
    /// Longest input, in tokens.
    pub max_position_embeddings: usize,
    /// Token types (segments).
    #[serde(default = "two")]
    pub type_vocab_size: usize,
    /// The layer norms' epsilon.
    #[serde(default = "eps")]
    pub layer_norm_eps: f64,
    /// The feed-forward activation (`gelu` is the exact, erf form).
    #[serde(default = "gelu")]
    pub hidden_act: String,
}

fn two() -> usize {
    2
}
fn eps() -> f64 {
    1e-12
}
fn gelu() -> String {
    "gelu".into()
}

impl BertConfig {
    /// Reads `config.json`; a missing field or another model type is an error naming the file.
    pub fn from_file(path: &Path) -> Result<BertConfig> {
        let (v, bad) = super::read_json(path, "BERT config.json")?;
        if let Some(t) = v.get("model_type").and_then(|t| t.as_str())
            && t != "bert"
        {
            return Err(bad(format!("model_type is {t:?}, not \"bert\"")));
        }
        let c: BertConfig = serde_json::from_value(v).map_err(|e| bad(e.to_string()))?;
        if c.num_attention_heads == 0 || !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            return Err(bad(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                c.hidden_size, c.num_attention_heads
            )));
        }
        if c.hidden_act != "gelu" {
            return Err(bad(format!(
                "hidden_act {:?} is not supported (expected \"gelu\")",
                c.hidden_act
            )));
        }
        Ok(c)
    }
}

/// One encoder layer: self-attention and a feed-forward block, each followed by a residual
/// connection and a layer norm (post-LN, as BERT has it).
struct Layer {
    query: Dense,
    key: Dense,
    value: Dense,
    attn_out: Dense,
    attn_norm: LayerNorm,
    up: Dense,
    down: Dense,
    out_norm: LayerNorm,
}

/// A BERT encoder.
pub struct Bert {
    /// Its configuration.
    pub config: BertConfig,
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
}

/// A frozen `nn.Linear` whose weight is packed once for the native CPU's products (see
/// [`PackedWeight`]); the same values as `Linear`.
struct Dense {
    weight: PackedWeight,
    bias: Tensor,
}

impl Dense {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        packed_linear(x, &self.weight, Some(&self.bias))
    }
}

fn linear(w: &Weights, name: &str, out: usize, inp: usize) -> Result<Dense> {
    Ok(Dense {
        weight: PackedWeight::new(&w.get(&format!("{name}.weight"), &[out, inp])?)?,
        bias: w.get(&format!("{name}.bias"), &[out])?,
    })
}

fn layer_norm(w: &Weights, name: &str, dim: usize, eps: f64) -> Result<LayerNorm> {
    Ok(LayerNorm {
        shape: vec![dim],
        weight: w.get(&format!("{name}.weight"), &[dim])?,
        bias: w.get(&format!("{name}.bias"), &[dim])?,
        eps,
    })
}

impl Bert {
    /// The encoder of a Hugging Face BERT folder (`config.json`, safetensors), on `device`.
    pub fn from_folder(folder: &Path, device: &Device) -> Result<Bert> {
        let config = BertConfig::from_file(&folder.join("config.json"))?;
        let w = Weights::from_folder(folder, device, DType::F32)?;
        Bert::from_weights(config, &w)
    }

    /// The encoder from its configuration and checkpoint (names as `BertModel` saves them,
    /// with or without a `bert.` prefix).
    pub fn from_weights(config: BertConfig, w: &Weights) -> Result<Bert> {
        let p = if w.contains("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let (h, ff, eps) = (
            config.hidden_size,
            config.intermediate_size,
            config.layer_norm_eps,
        );
        let e = format!("{p}embeddings");
        let word = w.get(
            &format!("{e}.word_embeddings.weight"),
            &[config.vocab_size, h],
        )?;
        let position = w.get(
            &format!("{e}.position_embeddings.weight"),
            &[config.max_position_embeddings, h],
        )?;
        let token_type = w.get(
            &format!("{e}.token_type_embeddings.weight"),
            &[config.type_vocab_size, h],
        )?;
        let embed_norm = layer_norm(w, &format!("{e}.LayerNorm"), h, eps)?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let l = format!("{p}encoder.layer.{i}");
                Ok(Layer {
                    query: linear(w, &format!("{l}.attention.self.query"), h, h)?,
                    key: linear(w, &format!("{l}.attention.self.key"), h, h)?,
                    value: linear(w, &format!("{l}.attention.self.value"), h, h)?,
                    attn_out: linear(w, &format!("{l}.attention.output.dense"), h, h)?,
                    attn_norm: layer_norm(w, &format!("{l}.attention.output.LayerNorm"), h, eps)?,
                    up: linear(w, &format!("{l}.intermediate.dense"), ff, h)?,
                    down: linear(w, &format!("{l}.output.dense"), h, ff)?,
                    out_norm: layer_norm(w, &format!("{l}.output.LayerNorm"), h, eps)?,
                })
            })
            .collect::<Result<Vec<Layer>>>()?;
        Ok(Bert {
            config,
            word,
            position,
            token_type,
            embed_norm,
            layers,
        })
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        self.word.device()
    }

    /// The last hidden state `[batch, len, hidden]` for token ids `[batch, len]` (i64) and an
    /// attention mask of the same shape (bool, true for real tokens); token types are all 0.
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        // Many small ops: one hand-off to the CPU's threads, not one per op.
        crate::tpu_ops::cpu::on_device_threads(self.device(), || self.forward_here(ids, mask))
    }

    fn forward_here(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let [b, l] = ids.shape() else {
            return Err(Error::shape(
                "bert",
                format!("expected token ids [batch, len], got {:?}", ids.shape()),
            ));
        };
        let (b, l) = (*b, *l);
        if mask.shape() != [b, l] || mask.dtype() != DType::Bool {
            return Err(Error::shape(
                "bert",
                format!(
                    "expected a bool attention mask [{b}, {l}], got {} {:?}",
                    mask.dtype(),
                    mask.shape()
                ),
            ));
        }
        if l > c.max_position_embeddings {
            return Err(Error::invalid_argument(
                "bert",
                format!(
                    "{l} tokens, the model takes at most {}",
                    c.max_position_embeddings
                ),
            ));
        }
        let positions = self.position.narrow(0, 0, l)?;
        let x = crate::ops::movement::embedding(ids, &self.word)?
            .add(&positions)?
            .add(&self.token_type.select(0, 0)?)?;
        let mut x = self.embed_norm.forward(&x)?;
        let (heads, hd) = (c.num_attention_heads, c.hidden_size / c.num_attention_heads);
        // Keys a query may attend to: [batch, 1, 1, len].
        let keys = mask.reshape([b, 1, 1, l])?;
        let split = |t: Tensor| t.reshape([b, l, heads, hd])?.permute([0, 2, 1, 3]);
        for layer in &self.layers {
            let q = split(layer.query.forward(&x)?)?;
            let k = split(layer.key.forward(&x)?)?;
            let v = split(layer.value.forward(&x)?)?;
            let a = F::scaled_dot_product_attention_with(
                &q,
                &k,
                &v,
                &F::AttentionOptions::new().attn_mask(&keys),
            )?
            .permute([0, 2, 1, 3])?
            .reshape([b, l, c.hidden_size])?;
            let x1 = layer
                .attn_norm
                .forward(&x.add(&layer.attn_out.forward(&a)?)?)?;
            let f = layer.down.forward(&layer.up.forward(&x1)?.gelu()?)?;
            x = layer.out_norm.forward(&x1.add(&f)?)?;
        }
        Ok(x)
    }
}

/// Sentence embeddings: a BERT encoder and its tokenizer, with mean pooling over the real
/// tokens and L2 normalisation (the pipeline of all-MiniLM-L6-v2 and its kin).
pub struct SentenceEncoder {
    /// The encoder.
    pub bert: Bert,
    /// Its tokenizer.
    pub tokenizer: TextTokenizer,
}

impl SentenceEncoder {
    /// The encoder of a sentence-transformers folder (`config.json`, safetensors,
    /// `tokenizer.json`), on `device`.
    pub fn from_folder(folder: &Path, device: &Device) -> Result<SentenceEncoder> {
        Ok(SentenceEncoder {
            bert: Bert::from_folder(folder, device)?,
            tokenizer: TextTokenizer::from_file(&folder.join("tokenizer.json"))?,
        })
    }

    /// The token ids and mask of `sentences`, padded to the longest (and cut at the model's
    /// longest input).
    pub fn tokenize(&self, sentences: &[&str]) -> Result<Batch> {
        let max = self.bert.config.max_position_embeddings;
        self.tokenizer.batch(sentences, true, Some(max))
    }

    /// One unit-length embedding per sentence: `[sentences, hidden]` f32.
    pub fn embed(&self, sentences: &[&str]) -> Result<Tensor> {
        let batch = self.tokenize(sentences)?;
        let dev = self.bert.device();
        let (ids, mask) = batch.tensors(dev)?;
        let hidden = self.bert.forward(&ids, &mask)?;
        let m = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let summed = hidden.mul(&m)?.sum(&[1], false)?;
        let counts = m.sum(&[1], false)?.clamp(Some(1e-9), None)?;
        let mean = summed.div(&counts)?;
        let norms = mean.norm(2.0, &[1], true)?.clamp(Some(1e-12), None)?;
        mean.div(&norms)
    }
}
