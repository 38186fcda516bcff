//! Execution modes for eager code, process-wide ([`set_mode`], or `TPU_RS_MODE`) and per scope
//! ([`with_mode`]; the innermost scope wins):
//!
//! - [`ExecMode::Strict`]: each op runs when called, asynchronously on PJRT devices (the
//!   default).
//! - [`ExecMode::Blocking`]: the same, but each PJRT launch waits for its results, so a device
//!   error surfaces at the call that caused it (for debugging; the native CPU device is
//!   synchronous anyway).
//! - [`ExecMode::Fused`]: ops are deferred, not run: they return tensors whose values are not
//!   computed yet, and are recorded into a graph that runs as one program when a value is
//!   needed (read on the host, written in place, used by an op that runs eagerly), when the
//!   graph reaches [`fused::node_limit`](crate::fused::node_limit) ops, and when a fused scope
//!   ends. Programs are cached like compiled functions, so a training loop compiles its step
//!   once. Autograd records deferred ops like computed ones, so `backward` works unchanged.
//!
//! One model's code gives the same results in all three modes: on the native CPU the same
//! kernels run, so the bits agree; on PJRT devices the fused program may round differently
//! (XLA fuses across ops).
//!
//! While a compiled function is traced ([`crate::compile`]), the trace's own hook records its
//! ops (it is the innermost one); the compiled program is already one graph.
//!
//! A kernel error of a deferred op (an index out of range, say) surfaces where the graph runs,
//! naming the op; the values of that graph then report the error when read.

use std::cell::RefCell;
use std::sync::Once;
use std::sync::atomic::{AtomicU8, Ordering};

use tpu_ops::exec::dispatch::set_default_dispatch_hook;
use tpu_ops::tpu_tensor::observe::observing;
use tpu_ops::tpu_tensor::scoped::with_pushed;
use tpu_ops::tpu_tensor::tpu_runtime::pjrt::{launch_blocking, set_launch_blocking};
use tpu_ops::tpu_tensor::{Error, Result};
use tpu_ops::with_dispatch_hook;

use crate::fused;

/// Environment variable: `strict`, `blocking` or `fused`, the process-wide mode applied by
/// [`init`] (and by the first call of [`mode`], [`set_mode`] or [`with_mode`]).
pub const ENV_MODE: &str = "TPU_RS_MODE";

/// How eager ops run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ExecMode {
    /// Op by op, asynchronously on PJRT devices.
    #[default]
    Strict,
    /// Op by op, each waiting for its results (errors surface at their call).
    Blocking,
    /// Deferred and run as one compiled graph when a value is needed.
    Fused,
}

impl ExecMode {
    fn code(self) -> u8 {
        match self {
            ExecMode::Strict => 0,
            ExecMode::Blocking => 1,
            ExecMode::Fused => 2,
        }
    }

    fn from_code(c: u8) -> ExecMode {
        match c {
            1 => ExecMode::Blocking,
            2 => ExecMode::Fused,
            _ => ExecMode::Strict,
        }
    }
}

impl std::str::FromStr for ExecMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<ExecMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "strict" | "" => Ok(ExecMode::Strict),
            "blocking" => Ok(ExecMode::Blocking),
            "fused" => Ok(ExecMode::Fused),
            other => Err(Error::invalid_argument(
                ENV_MODE,
                format!("unknown execution mode {other:?}: expected strict, blocking or fused"),
            )),
        }
    }
}

impl std::fmt::Display for ExecMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ExecMode::Strict => "strict",
            ExecMode::Blocking => "blocking",
            ExecMode::Fused => "fused",
        })
    }
}

static DEFAULT: AtomicU8 = AtomicU8::new(0);
/// Whether launch blocking was on before the process-wide mode became blocking.
static BLOCKING_BEFORE: AtomicU8 = AtomicU8::new(0);
static ENV: Once = Once::new();

thread_local! {
    static SCOPES: RefCell<Vec<ExecMode>> = const { RefCell::new(Vec::new()) };
}

/// Applies `TPU_RS_MODE` once per process: call it at the start of a program that should
/// follow the variable before running any op. An unknown value is reported (and leaves the
/// mode strict).
pub fn init() -> Result<()> {
    let mut result = Ok(());
    ENV.call_once(|| {
        if let Ok(v) = std::env::var(ENV_MODE) {
            match v.parse() {
                Ok(m) => apply_default(m),
                Err(e) => result = Err(e),
            }
        }
    });
    result
}

fn apply_default(m: ExecMode) {
    let old = ExecMode::from_code(DEFAULT.swap(m.code(), Ordering::AcqRel));
    if old == m {
        return;
    }
    if old == ExecMode::Blocking {
        set_launch_blocking(BLOCKING_BEFORE.load(Ordering::Acquire) != 0);
    }
    if m == ExecMode::Blocking {
        BLOCKING_BEFORE.store(launch_blocking() as u8, Ordering::Release);
        set_launch_blocking(true);
    }
    // Only the fused mode needs to see ops; the others leave dispatch's hot path untouched.
    set_default_dispatch_hook((m == ExecMode::Fused).then(fused::hook));
}

/// Sets the process-wide mode (what threads use outside [`with_mode`] scopes). Ops already
/// deferred still run when their values are needed.
pub fn set_mode(m: ExecMode) {
    let _ = init();
    apply_default(m);
}

/// The process-wide mode.
pub fn default_mode() -> ExecMode {
    let _ = init();
    ExecMode::from_code(DEFAULT.load(Ordering::Acquire))
}

/// The mode of this thread now: the innermost [`with_mode`] scope's, else the process-wide one.
pub fn mode() -> ExecMode {
    SCOPES
        .with(|s| s.borrow().last().copied())
        .unwrap_or_else(default_mode)
}

/// Runs `f` in mode `m` on this thread. A fused scope runs what it deferred when it ends (and
/// returns that error if `f` succeeded); a blocking scope makes PJRT launches wait while it
/// lasts (a process-wide switch, so other threads' launches wait too meanwhile).
pub fn with_mode<R>(m: ExecMode, f: impl FnOnce() -> Result<R>) -> Result<R> {
    let _ = init();
    match m {
        ExecMode::Strict => with_pushed(&SCOPES, m, f),
        ExecMode::Blocking => {
            struct Restore(bool);
            impl Drop for Restore {
                fn drop(&mut self) {
                    set_launch_blocking(self.0);
                }
            }
            let _restore = Restore(launch_blocking());
            set_launch_blocking(true);
            with_pushed(&SCOPES, m, f)
        }
        ExecMode::Fused if observing() => {
            // A compiled function is being traced: its ops must reach the trace's hook, which
            // only the innermost hook would, so nothing is deferred.
            with_pushed(&SCOPES, m, f)
        }
        ExecMode::Fused => {
            let r = with_pushed(&SCOPES, m, || with_dispatch_hook(fused::hook(), f));
            let flushed = flush();
            let r = r?;
            flushed?;
            Ok(r)
        }
    }
}

/// Runs the ops this thread has deferred now, and returns their error if they fail.
pub fn flush() -> Result<()> {
    fused::flush()
}
