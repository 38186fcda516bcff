//! Errors in OpenAI's JSON shape (`{"error": {"message", "type", "param", "code"}}`) with the
//! status code a client expects for each.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to a request.
#[derive(Clone, Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, …).
    pub kind: &'static str,
    /// The parameter at fault, when one is.
    pub param: Option<String>,
    /// A machine-readable code, when there is one.
    pub code: Option<&'static str>,
    /// Seconds to wait before retrying (429 and 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// A bad request (400), naming the parameter at fault when there is one.
    pub fn bad(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
            retry_after: None,
        }
    }

    /// A model this server does not serve (404).
    pub fn unknown_model(model: &str, served: &[&str]) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "the model '{model}' does not exist here; this server serves {}",
                served
                    .iter()
                    .map(|m| format!("'{m}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
            retry_after: None,
        }
    }

    /// The prompt and the tokens asked for do not fit the context (400).
    pub fn too_long(message: String, param: &str) -> ApiError {
        ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad(message, Some(param))
        }
    }

    /// Too many requests are waiting (429, retry after a second).
    pub fn busy(waiting: usize) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!("the server is at capacity ({waiting} requests waiting); retry later"),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
            retry_after: Some(1),
        }
    }

    /// The server is shutting down (503).
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: Some(1),
        }
    }

    /// The request ran past its time limit (504).
    pub fn timeout(seconds: f64) -> ApiError {
        ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            message: format!("the request took longer than the server's limit of {seconds} s"),
            kind: "timeout_error",
            param: None,
            code: Some("timeout"),
            retry_after: None,
        }
    }

    /// Something failed inside the server (500).
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl From<tpu_rs::prelude::Error> for ApiError {
    fn from(e: tpu_rs::prelude::Error) -> ApiError {
        match e {
            tpu_rs::prelude::Error::InvalidArgument { .. } => ApiError::bad(e.to_string(), None),
            e => ApiError::internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
