//! What the server tests share: one server on a loopback port per test binary (started on
//! first use, on a thread of its own so it outlives each test's runtime), and a client.

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use tpu_rs::models::hub::find;
use tpu_rs::models::{
    ChatTemplate, Llama, MINILM, ModelPackage, SMOLLM2, SentenceEncoder, TextTokenizer,
    WeightFormat,
};
use tpu_rs::prelude::*;
use tpu_rs::serve::EngineConfig;
use tpu_rs::tpu_tensor::GgufFile;
use tpu_serve::{AppState, ServerConfig};

/// A running server and a client for it.
pub struct Server {
    pub client: reqwest::Client,
    base: String,
}

impl Server {
    /// The URL of `path` on the server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `/metrics`' text.
    pub async fn metrics(&self) -> String {
        let r = self.client.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap()
    }

    /// The value of metric `name` (labelled with the model only).
    pub async fn metric(&self, name: &str) -> f64 {
        self.value(&format!("{name}{{model_name=\"smollm2\"}} "))
            .await
    }

    /// The value of metric `name` for finish reason `reason`.
    pub async fn metric_with(&self, name: &str, reason: &str) -> f64 {
        let labels = format!("model_name=\"smollm2\",finished_reason=\"{reason}\"");
        self.value(&format!("{name}{{{labels}}} ")).await
    }

    /// The value on the `/metrics` line that starts with `prefix`.
    async fn value(&self, prefix: &str) -> f64 {
        let text = self.metrics().await;
        let line = text.lines().find_map(|l| l.strip_prefix(prefix));
        line.unwrap_or_else(|| panic!("no {prefix:?} in\n{text}"))
            .parse()
            .unwrap()
    }
}

/// The model's path in the model cache, or `None` after a line saying the test is skipped;
/// with `TPU_RS_REQUIRE_MODELS=1` (CI) a missing model fails the test.
pub fn model_or_skip(pkg: &ModelPackage) -> Option<std::path::PathBuf> {
    if let Some(p) = find(pkg).unwrap() {
        return Some(p);
    }
    let msg = format!(
        "model {} is not in the model cache: install it with `scripts/install-models.sh`",
        pkg.name
    );
    if std::env::var_os("TPU_RS_REQUIRE_MODELS").is_some_and(|v| v == "1") {
        panic!("{msg}");
    }
    eprintln!("skipped: {msg}");
    None
}

type Loaded = (Arc<Llama>, Arc<TextTokenizer>, Option<ChatTemplate>);

/// SmolLM2, loaded once.
fn smollm2() -> Option<&'static Loaded> {
    static M: OnceLock<Option<Loaded>> = OnceLock::new();
    M.get_or_init(|| {
        let path = model_or_skip(&SMOLLM2)?;
        let f = GgufFile::open(&path).unwrap();
        let m = Llama::from_gguf_with(&path, &Device::cpu(), WeightFormat::Quantized).unwrap();
        let t = TextTokenizer::from_gguf(&f).unwrap();
        Some((
            Arc::new(m),
            Arc::new(t),
            ChatTemplate::from_gguf(&f).unwrap(),
        ))
    })
    .as_ref()
}

/// Starts a server for `state` on a free loopback port, until `stop` resolves; its base URL,
/// and a receiver that hears when it has stopped.
fn start_until(
    state: AppState,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (String, tokio::sync::oneshot::Receiver<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (done_tx, done) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            listener.set_nonblocking(true).unwrap();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            tpu_serve::serve(listener, Arc::new(state), stop)
                .await
                .unwrap();
        });
        let _ = done_tx.send(());
    });
    (base, done)
}

/// Starts a server for `state` on a free loopback port, for good; its base URL.
fn start(state: AppState) -> String {
    start_until(state, std::future::pending()).0
}

/// A server of its own that stops when told: its client, the trigger, and a receiver that
/// hears when it has stopped.
pub async fn stoppable_server() -> Option<(
    &'static Server,
    tokio::sync::oneshot::Sender<()>,
    tokio::sync::oneshot::Receiver<()>,
)> {
    let (m, t, template) = smollm2()?.clone();
    let state = AppState::new(m, t, template, ServerConfig::default(), None).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (base, done) = start_until(state, async move {
        let _ = rx.await;
    });
    Some((client(&base), tx, done))
}

fn client(base: &str) -> &'static Server {
    Box::leak(Box::new(Server {
        client: reqwest::Client::new(),
        base: base.to_string(),
    }))
}

/// The shared server (SmolLM2 and MiniLM), with a client of this test's own.
pub async fn server() -> Option<&'static Server> {
    static BASE: OnceLock<Option<String>> = OnceLock::new();
    let base = BASE.get_or_init(|| {
        let (m, t, template) = smollm2()?.clone();
        let folder = model_or_skip(&MINILM)?;
        let enc = SentenceEncoder::from_folder(&folder, &Device::cpu()).unwrap();
        let state = AppState::new(
            m,
            t,
            template,
            ServerConfig::default(),
            Some(("all-minilm-l6-v2".into(), Arc::new(enc))),
        )
        .unwrap();
        Some(start(state))
    });
    base.as_deref().map(client)
}

/// A server that runs one request at a time and queues one more.
pub async fn small_server() -> Option<&'static Server> {
    static BASE: OnceLock<Option<String>> = OnceLock::new();
    let base = BASE.get_or_init(|| {
        let (m, t, template) = smollm2()?.clone();
        let config = ServerConfig {
            engine: EngineConfig {
                max_running: 1,
                max_waiting: 1,
                ..EngineConfig::default()
            },
            ..ServerConfig::default()
        };
        Some(start(AppState::new(m, t, template, config, None).unwrap()))
    });
    base.as_deref().map(client)
}
