//! `POST /v1/embeddings`: sentence embeddings from the served encoder (MiniLM), computed on
//! tokio's blocking threads.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tpu_rs::prelude::*;

use crate::error::ApiError;
use crate::params::{Body, wrong};
use crate::state::AppState;

/// Inputs one request may embed at most.
const MAX_INPUTS: usize = 2048;

/// `POST /v1/embeddings`.
pub async fn embeddings(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    match embed(s, &body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn embed(s: Arc<AppState>, bytes: &[u8]) -> Result<Response, ApiError> {
    if s.shutting_down() {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    let b = Body::parse(bytes)?;
    let model = b.string("model")?;
    let Some((name, encoder)) = s.embedder.as_ref().filter(|(n, _)| *n == model) else {
        return Err(ApiError::unknown_model(&model, &s.served()));
    };
    let inputs: Vec<String> = match b.get("input") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(t) => Ok(t.clone()),
                v => Err(wrong(&format!("input[{i}]"), "a string", v)),
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Array(_)) => return Err(ApiError::bad("'input' is empty", Some("input"))),
        Some(v) => return Err(wrong("input", "a string or a list of strings", v)),
        None => return Err(ApiError::bad("'input' is required", Some("input"))),
    };
    if inputs.len() > MAX_INPUTS {
        return Err(ApiError::bad(
            format!(
                "'input' has {} texts, at most {MAX_INPUTS} are allowed",
                inputs.len()
            ),
            Some("input"),
        ));
    }
    // base64: the little-endian f32 bytes, as OpenAI's clients ask for by default.
    let base64 = match b.get("encoding_format") {
        None => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(v) => return Err(wrong("encoding_format", "\"float\" or \"base64\"", v)),
    };
    let enc = encoder.clone();
    let (vectors, tokens) =
        tokio::task::spawn_blocking(move || -> Result<(Vec<Vec<f32>>, usize)> {
            let texts: Vec<&str> = inputs.iter().map(String::as_str).collect();
            let tokens = enc
                .tokenize(&texts)?
                .mask
                .iter()
                .map(|m| m.iter().filter(|&&b| b).count())
                .sum();
            let e = enc.embed(&texts)?.to_device(&Device::cpu())?;
            let dim = e.shape()[1];
            let flat = e.to_vec::<f32>()?;
            Ok((flat.chunks(dim).map(<[f32]>::to_vec).collect(), tokens))
        })
        .await
        .map_err(|e| ApiError::internal(format!("the embedding task failed: {e}")))??;
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let e = match base64 {
                true => {
                    use base64::Engine as _;
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
                false => json!(v),
            };
            json!({ "object": "embedding", "index": i, "embedding": e })
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": name,
        "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
    }))
    .into_response())
}
