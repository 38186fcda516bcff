//! Llama decoders from Hugging Face model folders: `config.json` and safetensors (one file or
//! shards), weights read as f32 on the model's device.

use std::path::Path;

use tpu_runtime::{DType, Device, Error, Result};

use super::{Layer, Llama, LlamaConfig, Matrix, Projections};
use crate::models::weights::Weights;
use crate::nn::RmsNorm;

impl LlamaConfig {
    /// The configuration in a Hugging Face `config.json` (`model_type` "llama"). Settings this
    /// decoder does not implement (biases, rotary scaling, another activation) are errors
    /// naming them.
    pub fn from_hf_file(path: &Path) -> Result<LlamaConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        let bad = |why: String| Error::Format {
            path: path.display().to_string(),
            format: "Llama config.json",
            reason: why,
        };
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let model_type = v["model_type"].as_str().unwrap_or("");
        if model_type != "llama" {
            return Err(bad(format!(
                "model_type is {model_type:?}, this loader reads \"llama\""
            )));
        }
        let u = |k: &str| -> Result<usize> {
            v[k].as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| bad(format!("no integer {k:?}")))
        };
        let f = |k: &str, default: f64| -> Result<f64> {
            match &v[k] {
                serde_json::Value::Null => Ok(default),
                x => x
                    .as_f64()
                    .ok_or_else(|| bad(format!("{k:?} is {x}, not a number"))),
            }
        };
        let act = v["hidden_act"].as_str().unwrap_or("silu");
        if act != "silu" {
            return Err(bad(format!(
                "hidden_act {act:?} is not supported (expected \"silu\")"
            )));
        }
        for k in ["attention_bias", "mlp_bias"] {
            if v[k].as_bool() == Some(true) {
                return Err(bad(format!("{k} is true; this decoder has no biases")));
            }
        }
        if !v["rope_scaling"].is_null() {
            return Err(bad(format!(
                "rope_scaling {} is not supported yet (only unscaled rotary embeddings)",
                v["rope_scaling"]
            )));
        }
        let num_heads = u("num_attention_heads")?;
        let c = LlamaConfig {
            vocab_size: u("vocab_size")?,
            hidden_size: u("hidden_size")?,
            num_layers: u("num_hidden_layers")?,
            num_heads,
            num_kv_heads: u("num_key_value_heads").unwrap_or(num_heads),
            intermediate_size: u("intermediate_size")?,
            rms_norm_eps: f("rms_norm_eps", 1e-6)?,
            rope_theta: f("rope_theta", 10000.0)?,
            max_positions: u("max_position_embeddings")?,
        };
        c.check().map_err(bad)?;
        if let Some(hd) = v["head_dim"].as_u64()
            && hd as usize != c.head_dim()
        {
            return Err(bad(format!(
                "head_dim {hd} is not hidden_size / num_attention_heads = {}",
                c.head_dim()
            )));
        }
        Ok(c)
    }
}

impl Llama {
    /// The decoder of a Hugging Face model folder (`config.json`, `model.safetensors` or its
    /// shards, as `LlamaForCausalLM` saves them), on `device` in f32 (bf16 and f16 checkpoints
    /// are converted on load). The tokenizer is `tokenizer.json` beside it
    /// ([`TextTokenizer::from_file`](crate::models::TextTokenizer::from_file)); the generation
    /// defaults are [`GenerationConfig::from_folder`](crate::models::GenerationConfig::from_folder).
    pub fn from_folder(folder: &Path, device: &Device) -> Result<Llama> {
        let config = LlamaConfig::from_hf_file(&folder.join("config.json"))?;
        let tied = {
            let text = std::fs::read_to_string(folder.join("config.json"))
                .map_err(|e| Error::io(format!("reading {}/config.json", folder.display()), e))?;
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            v["tie_word_embeddings"].as_bool().unwrap_or(false)
        };
        let w = Weights::from_folder(folder, device, DType::F32)?;
        Llama::from_weights(config, &w, tied)
    }

    /// The decoder from its configuration and checkpoint (names as `LlamaForCausalLM` saves
    /// them); `tied` when the output projection is the token embedding (then `lm_head.weight`
    /// may be absent).
    pub fn from_weights(config: LlamaConfig, w: &Weights, tied: bool) -> Result<Llama> {
        let c = &config;
        let (h, kvw, ff) = (
            c.hidden_size,
            c.num_kv_heads * c.head_dim(),
            c.intermediate_size,
        );
        let norm = |name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm {
                shape: vec![h],
                weight: w.get(name, &[h])?,
                eps: Some(c.rms_norm_eps),
            })
        };
        let stacked = |parts: &[(String, usize)]| -> Result<Projections> {
            let ws = parts
                .iter()
                .map(|(name, rows)| w.get(name, &[*rows, h]))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&_> = ws.iter().collect();
            Ok(Projections::Stacked(
                Matrix::Dense(crate::ops::movement::cat(&refs, 0)?),
                parts.iter().map(|p| p.1).collect(),
            ))
        };
        let layers = (0..c.num_layers)
            .map(|i| {
                let p = |s: &str| format!("model.layers.{i}.{s}.weight");
                Ok(Layer {
                    attn_norm: norm(&p("input_layernorm"))?,
                    qkv: stacked(&[
                        (p("self_attn.q_proj"), h),
                        (p("self_attn.k_proj"), kvw),
                        (p("self_attn.v_proj"), kvw),
                    ])?,
                    o: Matrix::Dense(w.get(&p("self_attn.o_proj"), &[h, h])?),
                    ffn_norm: norm(&p("post_attention_layernorm"))?,
                    gate_up: stacked(&[(p("mlp.gate_proj"), ff), (p("mlp.up_proj"), ff)])?,
                    down: Matrix::Dense(w.get(&p("mlp.down_proj"), &[h, ff])?),
                })
            })
            .collect::<Result<Vec<Layer>>>()?;
        let embed = w.get("model.embed_tokens.weight", &[c.vocab_size, h])?;
        let output = if tied && !w.contains("lm_head.weight") {
            None
        } else {
            Some(Matrix::Dense(w.get("lm_head.weight", &[c.vocab_size, h])?))
        };
        Ok(Llama {
            device: embed.device().clone(),
            embed: Matrix::Dense(embed),
            norm: norm("model.norm.weight")?,
            layers,
            output,
            config,
        })
    }
}
