//! tpu-rs: PyTorch-style tensor programs on TPUs through libtpu, on the native CPU, and on any
//! other PJRT device, with the same code.
//!
//! This crate is a facade: it re-exports the layers, and [`prelude`] brings the everyday names
//! into scope with one `use`.

#![warn(missing_docs)]
// The README's examples are compiled and run as doc tests, so they stay true.
#![doc = include_str!("../README.md")]

pub mod datasets;
pub mod mnist;

pub use libtpu_sys;
pub use tpu_graph;
pub use tpu_ops;
pub use tpu_runtime;
pub use tpu_tensor;

/// The names most programs need: `use tpu_rs::prelude::*;`.
pub mod prelude {
    pub use tpu_runtime::{DType, Device, DeviceKind, Error, MemoryStats, Result, bf16, f16};
    pub use tpu_tensor::{Generator, Tensor};
}
