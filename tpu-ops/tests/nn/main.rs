//! The neural-network ops, modules and optimizers: values against references and PyTorch,
//! gradients, the row kernels, and a training step against PyTorch.
//!
//! One test binary per family, so CI links the whole stack once per family rather than once per
//! file; `cargo test --test nn <module>::` runs one part.

#[path = "../common/mod.rs"]
mod common;

mod forward;
mod grad;
mod kernels;
mod modules;
mod optim;
mod pytorch_step;
