//! The machinery under every op: autograd, the eager PJRT path and its cache, the op table run on
//! every device, and sizes near and past the memory limit.
//!
//! One test binary per family, so CI links the whole stack once per family rather than once per
//! file; `cargo test --test engine <module>::` runs one part.

#[path = "../common/mod.rs"]
mod common;

mod autograd;
mod eager_pjrt;
mod huge_sizes;
mod inplace;
mod op_table;
