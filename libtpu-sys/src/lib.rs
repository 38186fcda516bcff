//! Raw bindings to the PJRT C API.
//!
//! libtpu.so, and every other PJRT plugin (XLA's CPU plugin, the CUDA and ROCm plugins), exports
//! one symbol, `GetPjrtApi`, that returns a table of C function pointers. This crate holds our
//! own `#[repr(C)]` declarations of that table and of its argument structs ([`types`],
//! [`PJRT_Api`]), the loader that opens a plugin at run time and checks its API version
//! ([`PjrtLibrary`]), and TPU detection that needs no client ([`detect()`]).
//!
//! The declared layouts are those of PJRT C API 0.117, checked field by field against the 0.117
//! header, and the 0.115 CPU plugin accepts every argument struct declared here (it never asks
//! for more bytes than we send); see the layout tests and the plugin size probe in `tests/`.
//! Everything here is raw: callers own every handle the plugin returns and must destroy it
//! with the matching `_Destroy` entry.

#![warn(missing_docs)]
#![allow(non_camel_case_types, non_snake_case)]

pub mod api;
pub mod compile_options;
pub mod detect;
pub mod loader;
pub mod status;
pub mod types;

pub use api::PJRT_Api;
pub use detect::{NoTpuFound, TpuGeneration, TpuInventory, detect, detect_in};
pub use loader::{LoadError, PjrtLibrary};
pub use status::{PjrtError, destroy_error, take_error};
pub use types::*;

/// PJRT C API version whose layouts are declared here, as `(major, minor)`.
pub const DECLARED_API_VERSION: (i32, i32) = (0, 117);
