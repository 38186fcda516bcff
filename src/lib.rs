//! tpu-rs: PyTorch-style tensor programs on TPUs through libtpu, on the native CPU, and on any
//! other PJRT device, with the same code.
//!
//! This crate is a facade: it exposes the layers by role ([`nn`], [`optim`], [`autograd`],
//! [`ops`], [`graph`], ...) and [`prelude`] brings every name the examples use into scope with one
//! `use tpu_rs::prelude::*`. The layers themselves stay reachable as [`tpu_ops`], [`tpu_tensor`],
//! [`tpu_runtime`], [`tpu_graph`] and [`libtpu_sys`].

#![warn(missing_docs)]
// The README's examples are compiled and run as doc tests, so they stay true.
#![doc = include_str!("../README.md")]

pub mod datasets;
pub mod models;
pub mod serve;

pub use libtpu_sys;
pub use tpu_graph;
pub use tpu_ops;
pub use tpu_runtime;
pub use tpu_tensor;

/// Neural-network building blocks: modules (`Linear`, `Conv2d`, `Mlp`, ...), parameter
/// initialisation, and [`nn::functional`] (PyTorch's `torch.nn.functional`, imported by the
/// prelude as `F`).
pub mod nn {
    pub use tpu_ops::nn::*;
    pub use tpu_ops::ops::nn::functional;
}

/// Optimizers (`Sgd`, `Adam`/AdamW) and learning-rate schedules.
pub mod optim {
    pub use tpu_ops::optim::*;
}

/// Reverse-mode automatic differentiation: `backward`, gradients, `no_grad`.
pub mod autograd {
    pub use tpu_ops::autograd::*;
}

/// The op library by family, with each family's options (convolution, pooling, reductions,
/// losses ...), the op table and its Core ATen coverage.
pub mod ops {
    pub use tpu_ops::op::core_aten;
    pub use tpu_ops::ops::*;
    pub use tpu_ops::{DTypeSet, OpDef, OpInfo, op_table, op_table_parts};
}

/// The compiled path: [`graph::compile`] traces a function over tensors into a graph, optimises
/// it and runs it natively on the CPU or as one program on a PJRT device.
pub mod graph {
    pub use tpu_graph::*;
}

/// Devices and memory: the native CPU device, PJRT devices, TPU detection.
pub mod device {
    pub use tpu_runtime::{CpuOptions, Device, DeviceKind, MemoryStats};
}

/// Every name the examples need: `use tpu_rs::prelude::*;` brings tensors, devices, dtypes,
/// generators, the op traits (`x.exp()`, `a.matmul(&b)`, `x.conv2d(..)`, `loss.backward()`),
/// `nn`, `optim`, `F` (the functional API), `graph` (the compiled path) and the `Module` and
/// `Optimizer` traits.
pub mod prelude {
    pub use crate::graph;
    pub use crate::nn::functional as F;
    pub use crate::nn::{self, Module};
    pub use crate::optim::{self, LrSchedule, Optimizer};
    pub use tpu_ops::prelude::*;
    pub use tpu_runtime::{DType, Device, DeviceKind, Error, MemoryStats, Result, bf16, f16};
    pub use tpu_tensor::{Generator, Tensor};
}
