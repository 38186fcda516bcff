//! Serving: an engine that runs a model for many concurrent requests (continuous batching over
//! a paged KV cache with prefix caching, see [`engine`]), the cache's block manager
//! ([`blocks`]) and the engine's metrics ([`metrics`]). It has no HTTP in it: the server
//! package puts OpenAI's API in front of it, and an application can drive it directly.

pub mod blocks;
pub mod engine;
pub mod metrics;

pub use engine::{
    Admission, Engine, EngineConfig, Event, Finish, Request, Sink, TokenLogprob, Usage,
};
pub use metrics::{Metrics, Snapshot};
