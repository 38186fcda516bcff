//! The tpu-rs op library.
//!
//! This crate will own every op: its shape and dtype rule, its native CPU kernel, its StableHLO
//! lowering and its backward rule, side by side in one op table, so that an op runs eagerly on the
//! native CPU device and on any PJRT device. Autograd, `nn` building blocks and optimizers will
//! live here too.

#![warn(missing_docs)]
