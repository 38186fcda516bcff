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

/// The mean (0 for an RMS norm) of one row of a norm's reference and its variance about that
/// mean, in f64, both over `n` elements: what the references of the norm ops and of their row
/// kernels both start from.
fn row_moments(row: &[f64], n: usize, rms: bool) -> (f64, f64) {
    let mean = if rms {
        0.0
    } else {
        row.iter().sum::<f64>() / n as f64
    };
    let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
    (mean, var)
}
