//! Llama decoders from Hugging Face model folders: `config.json` and safetensors (one file or
//! shards), weights read as f32 on the model's device.

use std::path::Path;

use tpu_runtime::{DType, Device, Error, Result};

use super::{Layer, Llama, LlamaConfig, Matrix, Projections, RopeScaling};
use crate::models::weights::Weights;
use crate::nn::RmsNorm;

impl LlamaConfig {
    /// The configuration in a Hugging Face `config.json` (`model_type` "llama"). Settings this
    /// decoder does not implement (biases, rotary scaling other than linear and Llama 3's,
    /// another activation) are errors naming them.
    pub fn from_hf_file(path: &Path) -> Result<LlamaConfig> {
        read_config(path).map(|(c, _)| c)
    }
}

/// `config.json`'s configuration, and whether the output projection is tied to the token
/// embedding (`tie_word_embeddings`).
fn read_config(path: &Path) -> Result<(LlamaConfig, bool)> {
    let (v, bad) = crate::models::read_json(path, "Llama config.json")?;
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
    let rope_scaling = rope_scaling(&v["rope_scaling"]).map_err(bad)?;
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
        rope_scaling,
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
    Ok((c, v["tie_word_embeddings"].as_bool().unwrap_or(false)))
}

/// `config.json`'s `rope_scaling`: null, or an object whose `rope_type` (or older `type`) is
/// `default`, `linear` or `llama3`; another type is an error naming it.
fn rope_scaling(v: &serde_json::Value) -> std::result::Result<Option<RopeScaling>, String> {
    if v.is_null() {
        return Ok(None);
    }
    let kind = v["rope_type"].as_str().or(v["type"].as_str()).unwrap_or("");
    let num = |k: &str| {
        v[k].as_f64()
            .ok_or_else(|| format!("rope_scaling {kind:?} has no number {k:?}"))
    };
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: num("factor")?,
        })),
        "llama3" => {
            let (low, high) = (num("low_freq_factor")?, num("high_freq_factor")?);
            if high <= low {
                return Err(format!(
                    "rope_scaling llama3: high_freq_factor {high} must exceed low_freq_factor \
                     {low}"
                ));
            }
            Ok(Some(RopeScaling::Llama3 {
                factor: num("factor")?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_positions: num("original_max_position_embeddings")? as usize,
            }))
        }
        other => Err(format!(
            "rope_scaling type {other:?} is not supported (default, linear or llama3)"
        )),
    }
}

impl Llama {
    /// The decoder of a Hugging Face model folder (`config.json`, `model.safetensors` or its
    /// shards, as `LlamaForCausalLM` saves them), on `device` in f32 (bf16 and f16 checkpoints
    /// are converted on load). The tokenizer is `tokenizer.json` beside it
    /// ([`TextTokenizer::from_file`](crate::models::TextTokenizer::from_file)); the generation
    /// defaults are [`GenerationConfig::from_folder`](crate::models::GenerationConfig::from_folder).
    pub fn from_folder(folder: &Path, device: &Device) -> Result<Llama> {
        Llama::from_folder_with(folder, device, DType::F32)
    }

    /// [`Llama::from_folder`] with every weight converted to `dtype` (f32, bf16 or f16) on
    /// load; the model then computes in `dtype` (its logits too), as transformers does with
    /// `torch_dtype`.
    pub fn from_folder_with(folder: &Path, device: &Device, dtype: DType) -> Result<Llama> {
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(Error::invalid_argument(
                "llama",
                format!("expected weights in f32, bf16 or f16, got {dtype}"),
            ));
        }
        let (config, tied) = read_config(&folder.join("config.json"))?;
        let w = Weights::from_folder(folder, device, dtype)?;
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
                Matrix::dense(crate::ops::movement::cat(&refs, 0)?)?,
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
                    o: Matrix::dense(w.get(&p("self_attn.o_proj"), &[h, h])?)?,
                    ffn_norm: norm(&p("post_attention_layernorm"))?,
                    gate_up: stacked(&[(p("mlp.gate_proj"), ff), (p("mlp.up_proj"), ff)])?,
                    down: Matrix::dense(w.get(&p("mlp.down_proj"), &[h, ff])?)?,
                })
            })
            .collect::<Result<Vec<Layer>>>()?;
        let embed = w.get("model.embed_tokens.weight", &[c.vocab_size, h])?;
        let output = if tied && !w.contains("lm_head.weight") {
            None
        } else {
            Some(Matrix::dense(w.get("lm_head.weight", &[c.vocab_size, h])?)?)
        };
        let device = embed.device().clone();
        let norm = norm("model.norm.weight")?;
        Ok(Llama::assemble(
            config,
            device,
            Matrix::dense(embed)?,
            layers,
            norm,
            output,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rope_scaling: &str) -> Result<LlamaConfig> {
        let path = std::env::temp_dir().join(format!(
            "tpu-rs-llama-config-{}-{}.json",
            std::process::id(),
            rope_scaling.len()
        ));
        let json = format!(
            r#"{{"model_type": "llama", "vocab_size": 100, "hidden_size": 512,
                "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 8,
                "intermediate_size": 64, "max_position_embeddings": 131072,
                "rope_theta": 500000.0, "rope_scaling": {rope_scaling}}}"#
        );
        std::fs::write(&path, json).unwrap();
        let c = LlamaConfig::from_hf_file(&path);
        std::fs::remove_file(&path).unwrap();
        c
    }

    /// transformers 5.24's inverse frequencies for Llama 3.1's scaling (head dim 64):
    ///
    /// ```python
    /// cfg = LlamaConfig(hidden_size=512, num_attention_heads=8, rope_theta=500000.0,
    ///                   max_position_embeddings=131072, rope_scaling={"rope_type": "llama3",
    ///                   "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    ///                   "original_max_position_embeddings": 8192})
    /// ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")[0]          # f32
    /// # and {"rope_type": "linear", "factor": 4.0} with rope_theta 10000: [:4]
    /// ```
    #[test]
    fn scaled_rotary_frequencies_match_transformers() {
        const LLAMA3: [f64; 32] = [
            1.0,
            0.663601279258728,
            0.44036662578582764,
            0.2922278344631195,
            0.193922758102417,
            0.12868738174438477,
            0.08539710193872452,
            0.05666961893439293,
            0.03760603070259094,
            0.02495540864765644,
            0.016560440883040428,
            0.010989529080688953,
            0.00729266507551074,
            0.00483942124992609,
            0.0032114461064338684,
            0.0013718936825171113,
            0.0005248460220173001,
            0.0001785077911335975,
            7.784655463183299e-05,
            5.165906986803748e-05,
            3.428102354519069e-05,
            2.2748929040972143e-05,
            1.5096217794052791e-05,
            1.0017868589784484e-05,
            6.647869668086059e-06,
            4.411534519022098e-06,
            2.927499735960737e-06,
            1.9426925064180978e-06,
            1.289173155782919e-06,
            8.554969213037111e-07,
            5.677088097399974e-07,
            3.76732259610435e-07,
        ];
        let c = config(
            r#"{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}"#,
        )
        .unwrap();
        // transformers works in f32: agreement to its rounding.
        for (i, (got, want)) in c.inv_freq().iter().zip(LLAMA3).enumerate() {
            assert!(
                (got - want).abs() <= 2e-6 * want,
                "{i}: {got} against {want}"
            );
        }
        let mut c = config(r#"{"type": "linear", "factor": 4.0}"#).unwrap();
        c.rope_theta = 10000.0;
        let want = [
            0.25,
            0.18747355043888092,
            0.14058533310890198,
            0.10542412847280502,
        ];
        for (got, want) in c.inv_freq().iter().zip(want) {
            assert!((got - want).abs() <= 2e-6 * want, "{got} against {want}");
        }
        assert_eq!(config("null").unwrap().rope_scaling, None);
        assert_eq!(
            config(r#"{"rope_type": "default"}"#).unwrap().rope_scaling,
            None
        );
        for (bad, why) in [
            (
                r#"{"rope_type": "yarn", "factor": 4.0}"#,
                "\"yarn\" is not supported",
            ),
            (r#"{"rope_type": "linear"}"#, "no number \"factor\""),
            (
                r#"{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                    "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}"#,
                "must exceed",
            ),
        ] {
            let e = config(bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
    }
}
