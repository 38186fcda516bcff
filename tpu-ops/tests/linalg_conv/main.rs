//! Matrix products, einsum and convolutions: values, the GEMM kernels against naive loops, and
//! gradients.
//!
//! One test binary per family, so CI links the whole stack once per family rather than once per
//! file; `cargo test --test linalg_conv <module>::` runs one part.

#[path = "../common/mod.rs"]
mod common;

mod conv;
mod gemm;
mod grad;
mod linalg;
