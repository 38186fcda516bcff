//! Raw bindings to the PJRT C API.
//!
//! libtpu.so, and every other PJRT plugin (XLA's CPU plugin, the CUDA and ROCm plugins), exports
//! one symbol, `GetPjrtApi`, that returns a table of C function pointers. This crate will own our
//! `#[repr(C)]` declarations of that table and of its argument structs, the loader that opens a
//! plugin at run time and checks its API version, and TPU detection that needs no client.
