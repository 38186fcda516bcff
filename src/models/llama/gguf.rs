//! Llama decoders from GGUF files: the `llama.*` metadata, and the matrices kept in their
//! quantised blocks on the native CPU or dequantised to f32, the query and key rows put back
//! in Hugging Face's order.

use std::path::Path;

use tpu_runtime::{Device, Error, Result};
use tpu_tensor::{GgmlType, GgufFile, Tensor};

use super::{Layer, Llama, LlamaConfig, Matrix, Projections, RopeScaling, WeightFormat};
use crate::nn::RmsNorm;
use crate::ops::quant::{QuantFormat, QuantMatrix};

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

impl LlamaConfig {
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
            rope_scaling: None,
        };
        if f.info("rope_freqs.weight").is_some() {
            return Err(bad(
                "rope_freqs.weight (per-frequency rotary factors, Llama 3.1 style) is not \
                 supported yet"
                    .into(),
            ));
        }
        let c = match f
            .meta("llama.rope.scaling.type")
            .and_then(|v| v.as_str())
            .unwrap_or("none")
        {
            "none" => c,
            "linear" => LlamaConfig {
                rope_scaling: Some(RopeScaling::Linear {
                    factor: fl("rope.scaling.factor", 1.0),
                }),
                ..c
            },
            other => {
                return Err(bad(format!(
                    "llama.rope.scaling.type {other:?} is not supported (none or linear)"
                )));
            }
        };
        c.check().map_err(bad)?;
        Ok(c)
    }
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
            WeightFormat::F32 | WeightFormat::Bf16 | WeightFormat::F16 => false,
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
        let to = |t: Tensor| t.to_dtype(format.dtype())?.to_device(device);
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
                Part::F32(w) => Matrix::dense(to(w)?),
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
                (_, _, Some(ws)) => Some(Matrix::dense(to(crate::ops::movement::cat(&ws, 0)?)?)?),
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
        let embed = matrix(part("token_embd.weight", [c.vocab_size, h], None)?)?;
        let norm = norm("output_norm.weight")?;
        Ok(Llama::assemble(
            config,
            device.clone(),
            embed,
            layers,
            norm,
            output,
        ))
    }
}
