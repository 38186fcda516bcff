//! What the handlers share: the engine, the tokenizer and chat template, the embedding model,
//! and the server's settings.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tpu_rs::models::{ChatTemplate, Llama, SentenceEncoder, TextTokenizer, WeightFormat};
use tpu_rs::prelude::*;
use tpu_rs::serve::{Engine, EngineConfig};
use tpu_rs::tpu_tensor::GgufFile;

/// The server's settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The name clients give as `model`.
    pub model_name: String,
    /// The engine's sizing.
    pub engine: EngineConfig,
    /// A request running longer is ended (504, or an error event when streaming).
    pub request_timeout: Option<Duration>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            model_name: "smollm2".into(),
            engine: EngineConfig::default(),
            request_timeout: Some(Duration::from_secs(600)),
        }
    }
}

/// The handlers' shared state.
pub struct AppState {
    /// The generation engine.
    pub engine: Engine,
    /// The model's tokenizer.
    pub tokenizer: Arc<TextTokenizer>,
    /// The model's chat template, when it has one.
    pub template: Option<ChatTemplate>,
    /// Tokens that end a generation (the model's end tokens).
    pub stop_tokens: Vec<u32>,
    /// The generation model's name.
    pub model_name: String,
    /// The embedding model and its name, when one is served.
    pub embedder: Option<(String, Arc<SentenceEncoder>)>,
    /// Positions the model takes (prompt and completion).
    pub context: usize,
    /// Unix time the server started (the models' `created`).
    pub created: u64,
    /// The settings.
    pub config: ServerConfig,
    shutting_down: AtomicBool,
}

impl AppState {
    /// The state for a GGUF Llama model at `gguf` (kept quantised on the native CPU, f32 elsewhere) on
    /// `device`, its engine started; with an embedding model folder when `embedder` names one.
    pub fn load(
        gguf: &Path,
        device: &Device,
        config: ServerConfig,
        embedder: Option<(String, &Path)>,
    ) -> Result<AppState> {
        let file = GgufFile::open(gguf)?;
        let model = Llama::from_gguf_with(gguf, device, WeightFormat::Auto)?;
        let tokenizer = TextTokenizer::from_gguf(&file)?;
        let template = ChatTemplate::from_gguf(&file)?;
        let embedder = match embedder {
            Some((name, folder)) => Some((
                name,
                Arc::new(SentenceEncoder::from_folder(folder, device)?),
            )),
            None => None,
        };
        AppState::new(
            Arc::new(model),
            Arc::new(tokenizer),
            template,
            config,
            embedder,
        )
    }

    /// The state for a loaded model (shareable with other servers), its engine started.
    pub fn new(
        model: Arc<Llama>,
        tokenizer: Arc<TextTokenizer>,
        template: Option<ChatTemplate>,
        config: ServerConfig,
        embedder: Option<(String, Arc<SentenceEncoder>)>,
    ) -> Result<AppState> {
        let stop_tokens: Vec<u32> = ["<|endoftext|>", "<|im_end|>", "<|eot_id|>", "</s>"]
            .iter()
            .filter_map(|t| tokenizer.token_id(t))
            .collect();
        let context = model.config.max_positions;
        let engine = Engine::start(model, tokenizer.clone(), config.engine.clone())?;
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(AppState {
            engine,
            tokenizer,
            template,
            stop_tokens,
            model_name: config.model_name.clone(),
            embedder,
            context,
            created,
            config,
            shutting_down: AtomicBool::new(false),
        })
    }

    /// Marks the server as shutting down: `/health` answers 503, new requests are refused.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Whether the server is shutting down.
    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// The names of the models served.
    pub fn served(&self) -> Vec<&str> {
        std::iter::once(self.model_name.as_str())
            .chain(self.embedder.as_ref().map(|(n, _)| n.as_str()))
            .collect()
    }
}
