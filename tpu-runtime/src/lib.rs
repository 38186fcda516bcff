//! Devices, memory and transfers for tpu-rs.
//!
//! The native CPU device lives here (accounted, aligned host memory and one thread pool), and so
//! do PJRT devices (TPUs through libtpu, and any other PJRT plugin: clients, buffers,
//! executables, events). Every layer above reports failures with this crate's [`Error`].

#![warn(missing_docs)]

pub mod buffer;
pub mod cpu;
pub mod device;
pub mod dtype;
pub mod error;
pub mod mapped;
pub mod memory;
pub mod pjrt;
pub mod switch;

pub use buffer::Buffer;
pub use cpu::{CpuBuffer, CpuDevice, CpuOptions};
pub use device::{Device, DeviceKind};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use half::{bf16, f16};
pub use mapped::MappedFile;
pub use memory::{MemorySource, MemoryStats, parse_memory_size};
pub use pjrt::{Client, Executable, PjrtBuffer};
pub use switch::EnvSwitch;
