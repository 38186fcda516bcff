//! Real models, built from the `nn` blocks: loaders for Hugging Face model folders
//! ([`weights`], [`tokenizer`]), the model cache ([`hub`]), and the models themselves.
//!
//! - [`bert`]: BERT encoders and sentence embeddings (all-MiniLM-L6-v2).
//! - [`llama`]: Llama decoders from GGUF files (SmolLM2) or Hugging Face folders, with a KV
//!   cache, quantised matrices kept quantised on the CPU; [`generate`]: generation from one
//!   prompt or a batch (stop tokens and strings, streaming, `generation_config.json` defaults).
//! - [`sample`]: how the next token is chosen; [`chat`]: the checkpoints' chat templates.
//!
//! Models take a device and run unchanged on the native CPU and on PJRT devices.

pub mod bert;
pub mod chat;
pub mod generate;
pub mod hub;
pub mod llama;
pub mod sample;
pub mod tokenizer;
pub mod weights;

pub use bert::{Bert, BertConfig, SentenceEncoder};
pub use chat::{ChatMessage, ChatTemplate};
pub use generate::{FinishReason, GenerateOptions, Generation, GenerationConfig};
pub use hub::{MINILM, ModelPackage, SMOLLM2, locate};
pub use llama::{KvCache, Llama, LlamaConfig, RopeScaling, WeightFormat};
pub use sample::{Sampler, Sampling};
pub use tokenizer::{Batch, TextTokenizer};
pub use weights::Weights;

/// A model folder's JSON file (`config.json`, an index, generation defaults), and the error to
/// give for anything wrong in it: a format error naming the file and what it is.
fn read_json<'a>(
    path: &'a std::path::Path,
    format: &'static str,
) -> tpu_runtime::Result<(
    serde_json::Value,
    impl Fn(String) -> tpu_runtime::Error + Copy + 'a,
)> {
    let bad = move |reason: String| tpu_runtime::Error::Format {
        path: path.display().to_string(),
        format,
        reason,
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| tpu_runtime::Error::io(format!("reading {}", path.display()), e))?;
    let v = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    Ok((v, bad))
}
