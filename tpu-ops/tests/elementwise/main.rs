//! The elementwise ops (unary, binary, where, casts): values against references and PyTorch,
//! gradients, and random chains over special values compared between the CPU and PJRT.
//!
//! One test binary per family, so CI links the whole stack once per family rather than once per
//! file; `cargo test --test elementwise <module>::` runs one part.

#[path = "../common/mod.rs"]
mod common;

mod forward;
mod fused;
mod grad;
mod special_values;
