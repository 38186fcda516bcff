//! Graph capture and compilation for tpu-rs.
//!
//! This crate will own the compiled path: capturing a computation into a graph, optimising it
//! (fusion, constant folding), running it natively on the CPU or as one StableHLO module through
//! PJRT, the compilation cache, and export.

#![warn(missing_docs)]
