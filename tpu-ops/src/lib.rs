//! The tpu-rs op library.
//!
//! Every op is defined once (see [`op::OpDef`]): its shape and dtype rule (with PyTorch's
//! broadcasting and type promotion), its native CPU kernel, its StableHLO lowering and its
//! backward rule. The modules are the library's layers, each using only those before it:
//!
//! - [`op`]: the contract every op implements, type promotion, the op table;
//! - [`hlo`]: the StableHLO builder and lowering helpers (one op or a whole graph alike);
//! - [`cpu`]: the native CPU backend (walks, the parallel split, compute types, SIMD kernels);
//! - [`exec`]: dispatch (the CPU kernel, or one cached program per op on a PJRT device), the
//!   interception hook the graph layer uses ([`exec::dispatch::DispatchHook`]), fast paths;
//! - [`ops`]: the op families, one folder each;
//! - [`autograd`], [`nn`], [`optim`]: training.

#![warn(missing_docs)]

pub mod autograd;
pub mod cpu;
pub mod exec;
pub mod hlo;
pub mod inplace;
pub mod nn;
pub mod op;
pub mod ops;
pub mod optim;
pub mod testing;

pub use exec::dispatch::{DispatchHook, in_kernel, run, run_kernel, run1, with_dispatch_hook};
pub use exec::pjrt::{CacheStats, cache_stats, clear_cache};
pub use hlo::checks::{ENV_DEVICE_CHECKS, device_checks, set_device_checks};
pub use op::{DTypeSet, Meta, OpDef, OpInfo, op_table, op_table_parts};
pub use ops::elementwise::binary::where_;
pub use ops::elementwise::methods::TensorOps;
/// The tensor layer below, for layers above that reach it through this crate.
pub use tpu_tensor;
pub use tpu_tensor::tpu_runtime::pjrt::{launch_blocking, set_launch_blocking};

/// Connects the op library to `tpu-tensor` (operators such as `&a + &b`, and casts and copies
/// of tensors on PJRT devices). Every op calls it; call it yourself before using operators
/// first thing in a program.
pub fn init() {
    exec::hook::register();
}

/// The names most programs need.
pub mod prelude {
    pub use crate::TensorOps;
    pub use crate::autograd::{AutogradOps, no_grad};
    pub use crate::inplace::InPlaceOps;
    pub use crate::ops::conv::ConvOps;
    pub use crate::ops::elementwise::methods::Operand;
    pub use crate::ops::linalg::LinalgOps;
    pub use crate::ops::movement::MovementOps;
    pub use crate::ops::nn::NnOps;
    pub use crate::ops::reduce::ReduceOps;
    pub use crate::where_;
}
