//! An OpenAI-compatible inference server for tpu-rs models: `POST /v1/chat/completions`,
//! `/v1/completions` (streamed as server-sent events or not) and `/v1/embeddings`, `GET
//! /v1/models`, `/health` and `/metrics` (Prometheus text, vLLM's names).
//!
//! The HTTP side runs on tokio (axum); generation runs in the library's serving engine
//! ([`tpu_rs::serve::Engine`]) on its own thread, fed through a channel: each request hands the
//! engine a sink that forwards its tokens to the request's handler. When the client goes away
//! the handler's receiver is dropped, and the engine cancels the request at its next pass.
//! Embeddings run on tokio's blocking threads.
//!
//! [`bench`] is a load generator for any OpenAI-compatible server (`tpu-rs bench-serve`).
//!
//! This package is separate from `tpu-rs` so that an application embedding the library does
//! not compile an HTTP stack.

pub mod bench;
pub mod completions;
pub mod embeddings;
pub mod error;
pub mod params;
pub mod state;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

pub use error::ApiError;
pub use state::{AppState, ServerConfig};

/// The server's routes over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(completions::chat))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

/// Serves `state` on `listener` until `shutdown` resolves; then stops taking connections, lets
/// the requests in flight finish, and stops the engine (ending whatever is left).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let s = state.clone();
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            s.begin_shutdown();
        })
        .await;
    let engine = state.engine.clone();
    let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
    result
}

async fn models(State(s): State<Arc<AppState>>) -> Response {
    let mut data = vec![json!({
        "id": s.model_name,
        "object": "model",
        "created": s.created,
        "owned_by": "tpu-rs",
        "max_model_len": s.context,
    })];
    if let Some((name, _)) = &s.embedder {
        data.push(json!({
            "id": name,
            "object": "model",
            "created": s.created,
            "owned_by": "tpu-rs",
        }));
    }
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    if s.shutting_down() {
        return ApiError::unavailable("the server is shutting down").into_response();
    }
    StatusCode::OK.into_response()
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let text = s.engine.metrics().snapshot().prometheus(&s.model_name);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError {
        status: StatusCode::NOT_FOUND,
        ..ApiError::bad(format!("no route {uri}"), None)
    }
    .into_response()
}
