//! The tpu-rs `Tensor`: an n-dimensional array on a device.
//!
//! A tensor is a cheap, `Send + Sync` handle to a view (shape, strides, offset) of shared
//! storage on one device. This crate owns creation, views that copy nothing, reading back, casts,
//! device transfers, printing, seeded random numbers and safetensors I/O. Compute ops live in
//! `tpu-ops`, one layer up.

#![warn(missing_docs)]

pub mod deferred;
mod display;
pub mod gguf;
pub mod host_reads;
pub mod io;
pub mod observe;
pub mod ops_hook;
pub mod random;
pub mod recycle;
pub mod scalar;
pub mod scoped;
pub mod shape;
pub mod storage;
pub mod strided;
mod tensor;
mod view;

pub use gguf::{GgmlType, GgufFile, GgufTensorInfo, GgufValue};
pub use io::{SafetensorsFile, load_safetensors, save_safetensors};
pub use ops_hook::{ArithOp, OpsHook, register_ops_hook};
pub use random::Generator;
pub use scalar::Scalar;
pub use shape::{Dim, Dims, IntoShape};
pub use storage::Storage;
pub use tensor::{Layout, Tensor, TensorData, cast_value};
pub use tpu_runtime::{
    self, DType, Device, DeviceKind, Element, Error, Result, bf16, f16, with_element,
};
