//! The reductions and scans: values, gradients, and the SIMD reduction kernels at every
//! instruction-set level.
//!
//! One test binary per family, so CI links the whole stack once per family rather than once per
//! file; `cargo test --test reduce <module>::` runs one part.

#[path = "../common/mod.rs"]
mod common;

mod forward;
mod grad;
mod kernels;
