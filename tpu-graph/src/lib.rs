//! Graph capture and compilation for tpu-rs: our `torch.compile`.
//!
//! [`compile`] wraps a function over tensors. The first call with a given input signature
//! traces it ([`capture`]): it runs once while a dispatch hook records the ops it asks for into
//! a [`Graph`] (SSA values with shapes and dtypes, nodes that are ops of the op table), each op
//! returning a placeholder instead of computing.
//! In-place writes it makes (`copy_`, optimizer steps) are recorded too and written back after
//! every call, so a whole training step compiles. The [`passes`] then shrink the graph
//! (constant folding, algebraic simplification, transposes folded into products, common
//! subexpressions, dead code), and the program runs
//! on the arguments' device: natively on the CPU ([`exec::native`], each node's kernel without
//! dispatch), or lowered to one StableHLO module and compiled once on a PJRT device
//! ([`exec::pjrt`], each node through the lowering the eager path uses). Later calls with the
//! same signature run the program; a new signature compiles again and says why
//! ("arg 0 dim 1: 1920 → 1280"), and [`metrics`] reports compiles, hits and times. PJRT
//! executables are also kept on disk ([`disk`]), so a new process loads them instead of
//! compiling again. Dims whose size varies can be padded up to buckets ([`bucket`]), so they
//! compile once per bucket.
//!
//! ```
//! use tpu_graph::compile;
//! use tpu_ops::prelude::*;
//! use tpu_ops::tpu_tensor::{Device, Tensor};
//!
//! let f = compile(|a: &[Tensor]| Ok(vec![a[0].mul(&a[1])?.add(&a[0])?.relu()?]));
//! let dev = Device::cpu();
//! let x = Tensor::new([1.0f32, -2.0, 3.0], &dev)?;
//! let y = Tensor::new([2.0f32, 2.0, 2.0], &dev)?;
//! let out = f.call(&[x, y])?;
//! assert_eq!(out[0].to_vec::<f32>()?, vec![3.0, 0.0, 9.0]);
//! # Ok::<(), tpu_ops::tpu_tensor::Error>(())
//! ```
//!
//! A function that reads values on the host while it is traced is an error naming the line,
//! unless it allows graph breaks (`CompileOptions::allow_graph_breaks`): it then runs as fused
//! segments ([`mode`]), one cached graph between reads.
//!
//! On the CPU, chains of f32 elementwise nodes run as one kernel ([`passes::fuse_for_cpu`],
//! [`fusion`]), plain SGD's update of a weight runs in the store of its gradient's product
//! ([`epilogue`]), and [`Graph::memory_plan`] reports what an arena for the intermediates would
//! hold ([`memory`]).
//!
//! [`mode`] runs eager code in other execution modes: blocking for debugging, and fused, where
//! ops are deferred into a graph that runs as one cached program when a value is needed.
//!
//! Not yet here (see the project's issue on the compiled path): fusion into the prologues and
//! epilogues of reductions, products and norms beyond SGD's update, and an arena the native
//! executor allocates from.

#![warn(missing_docs)]

pub mod bucket;
pub mod capture;
pub mod compile;
pub mod disk;
pub mod epilogue;
pub mod exec;
pub mod fused;
pub mod fusion;
pub mod ir;
pub mod memory;
pub mod metrics;
pub mod mode;
mod operand;
pub mod passes;
pub mod view;

pub use bucket::Buckets;
pub use capture::{Trace, trace};
pub use compile::{CompileOptions, CompiledFn, OnRecompileLimit, Signature, compile, compile_with};
pub use ir::{Graph, InputKind, Node, ValueId};
pub use metrics::{FnMetrics, FusedMetrics, Metrics, metrics};
pub use mode::{ExecMode, set_mode, with_mode};
