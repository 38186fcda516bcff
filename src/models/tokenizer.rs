//! Text to token ids and back, through the `tokenizers` crate (Hugging Face's own
//! implementation, so ids match transformers'), and batches of token ids padded into tensors.

use std::path::Path;

use tpu_runtime::{DType, Device, Error, Result};
use tpu_tensor::Tensor;

/// A tokenizer read from a `tokenizer.json`, with the padding and truncation a file may carry
/// turned off (all-MiniLM-L6-v2's pads every input to 128 tokens): batches are padded here, to
/// their longest member.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    pad_id: u32,
}

/// Token ids of several texts, padded to the longest: `ids` and `mask` are `len` per row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Ids per text, each padded to `len` with the pad id.
    pub ids: Vec<Vec<u32>>,
    /// True for the real tokens of each text.
    pub mask: Vec<Vec<bool>>,
    /// The padded length.
    pub len: usize,
}

impl Batch {
    /// The ids as an i64 tensor `[texts, len]` and the mask as a bool one, on `device`.
    pub fn tensors(&self, device: &Device) -> Result<(Tensor, Tensor)> {
        let n = self.ids.len();
        let ids: Vec<i64> = self.ids.iter().flatten().map(|&i| i as i64).collect();
        let mask: Vec<bool> = self.mask.iter().flatten().copied().collect();
        Ok((
            Tensor::from_vec(ids, [n, self.len], device)?,
            Tensor::from_vec(mask, [n, self.len], device)?.to_dtype(DType::Bool)?,
        ))
    }
}

fn tok_err(what: String, e: impl std::fmt::Display) -> Error {
    Error::invalid_argument("tokenizer", format!("{what}: {e}"))
}

impl TextTokenizer {
    /// Reads `path` (a `tokenizer.json`).
    pub fn from_file(path: &Path) -> Result<TextTokenizer> {
        let mut inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| tok_err(format!("reading {}", path.display()), e))?;
        let pad_id = inner.get_padding().map_or(0, |p| p.pad_id);
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| tok_err(format!("{}", path.display()), e))?;
        Ok(TextTokenizer { inner, pad_id })
    }

    /// The byte-level BPE tokenizer a GGUF file carries (`tokenizer.ggml.model` "gpt2":
    /// tokens, merges, and control tokens as special tokens), as transformers builds it from the
    /// same metadata.
    pub fn from_gguf(f: &tpu_tensor::GgufFile) -> Result<TextTokenizer> {
        let path = f.path();
        let bad = |why: String| Error::Format {
            path: path.display().to_string(),
            format: "GGUF tokenizer",
            reason: why,
        };
        let model = f.meta("tokenizer.ggml.model").and_then(|v| v.as_str());
        if model != Some("gpt2") {
            return Err(bad(format!(
                "tokenizer.ggml.model is {model:?}; tpu-rs reads byte-level BPE (\"gpt2\")"
            )));
        }
        let strings = |key: &str| -> Result<Vec<&str>> {
            f.meta(key)
                .and_then(|v| v.as_array())
                .ok_or_else(|| bad(format!("no {key} array")))?
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| bad(format!("{key} holds a non-string")))
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let types: Vec<u64> = match f
            .meta("tokenizer.ggml.token_type")
            .and_then(|v| v.as_array())
        {
            Some(a) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
            None => vec![1; tokens.len()],
        };
        let vocab: serde_json::Map<String, serde_json::Value> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), serde_json::Value::from(i)))
            .collect();
        // Control tokens (type 3) are matched whole and kept out of the BPE.
        let added: Vec<serde_json::Value> = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (_, ty))| **ty == 3)
            .map(|(i, (t, _))| {
                serde_json::json!({
                    "id": i, "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true
                })
            })
            .collect();
        let byte_level = |prefix: bool| {
            serde_json::json!({
                "type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": true,
                "use_regex": true
            })
        };
        let json = serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": byte_level(false),
            "post_processor": null,
            "decoder": byte_level(true),
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": merges
            }
        });
        let inner: tokenizers::Tokenizer = json
            .to_string()
            .parse()
            .map_err(|e| bad(format!("building its tokenizer: {e}")))?;
        let pad_id = f
            .meta("tokenizer.ggml.padding_token_id")
            .and_then(|v| v.as_u64())
            .map_or(0, |v| v as u32);
        Ok(TextTokenizer { inner, pad_id })
    }

    /// The ids of `text`, with the model's special tokens (`[CLS]`, `[SEP]`, a BOS) when
    /// `special`.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        let e = self
            .inner
            .encode(text, special)
            .map_err(|e| tok_err(format!("encoding {text:?}"), e))?;
        Ok(e.get_ids().to_vec())
    }

    /// The text of `ids` (special tokens left out when `skip_special`).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| tok_err("decoding".into(), e))
    }

    /// The id of a token of the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// `texts` encoded and padded to the longest, each cut to `max_len` tokens first when
    /// given (keeping its last token, the closing special token of an encoder's input).
    pub fn batch(&self, texts: &[&str], special: bool, max_len: Option<usize>) -> Result<Batch> {
        if texts.is_empty() {
            return Err(Error::invalid_argument(
                "tokenizer",
                "expected at least one text",
            ));
        }
        let mut ids = texts
            .iter()
            .map(|t| self.encode(t, special))
            .collect::<Result<Vec<Vec<u32>>>>()?;
        if let Some(max) = max_len.filter(|&m| m > 0) {
            for row in &mut ids {
                if row.len() > max {
                    let last = row[row.len() - 1];
                    row.truncate(max);
                    if special {
                        row[max - 1] = last;
                    }
                }
            }
        }
        let len = ids.iter().map(Vec::len).max().unwrap_or(0);
        let mask = ids
            .iter()
            .map(|r| (0..len).map(|i| i < r.len()).collect())
            .collect();
        for r in &mut ids {
            r.resize(len, self.pad_id);
        }
        Ok(Batch { ids, mask, len })
    }
}
