//! Running an op: device checks, the shape rule, an optional interception hook, then the native
//! CPU kernel or the eager PJRT path.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use tpu_tensor::{DeviceKind, Error, Result, Tensor};

use crate::op::{Meta, OpDef};

/// Sees every op before it runs and may run it differently, and sees what it produced (the graph
/// layer records ops this way). Returning `None` from `dispatch` lets the op run as usual.
pub trait DispatchHook: Send + Sync {
    /// Called with the op, its inputs and the output metas its shape rule produced.
    fn dispatch(
        &self,
        op: &dyn OpDef,
        inputs: &[&Tensor],
        outputs: &[Meta],
    ) -> Option<Result<Vec<Tensor>>>;

    /// Called after an op that `dispatch` let run, with the tensors it produced.
    fn after(&self, op: &dyn OpDef, inputs: &[&Tensor], outputs: &[Tensor]) {
        let _ = (op, inputs, outputs);
    }

    /// True when the hook also sees the ops a kernel dispatches while it runs (its casts and
    /// copies); false when it sees only the ops the program itself asked for.
    fn nested(&self) -> bool {
        true
    }
}

thread_local! {
    static HOOKS: RefCell<Vec<Arc<dyn DispatchHook>>> = const { RefCell::new(Vec::new()) };
    /// How many kernels of this thread are running now (ops dispatched from inside a kernel
    /// see a depth above zero).
    static DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts a running kernel for [`DispatchHook::nested`], also when it fails.
struct Inside;

impl Inside {
    fn enter() -> Inside {
        DEPTH.with(|d| d.set(d.get() + 1));
        Inside
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Runs `f` with `hook` seeing every op dispatched on this thread (hooks nest; the innermost
/// sees ops first).
pub fn with_dispatch_hook<R>(hook: Arc<dyn DispatchHook>, f: impl FnOnce() -> R) -> R {
    tpu_tensor::scoped::with_pushed(&HOOKS, hook, f)
}

/// True while a kernel runs on this thread: what happens then (its casts, copies and writes
/// into its own outputs) is the kernel's business, not the program's.
pub fn in_kernel() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// True when a dispatch hook sees this thread's ops: fast paths that skip [`run`] must not.
pub fn hooked() -> bool {
    HOOKS.with(|h| !h.borrow().is_empty()) || DEFAULT_SET.load(Ordering::Acquire)
}

/// Whether [`DEFAULT_HOOK`] holds a hook: the hot path reads this flag, not the lock.
static DEFAULT_SET: AtomicBool = AtomicBool::new(false);
static DEFAULT_HOOK: RwLock<Option<Arc<dyn DispatchHook>>> = RwLock::new(None);

/// Sets (or with `None` removes) the hook that sees the ops of every thread whose own hook stack
/// ([`with_dispatch_hook`]) is empty: how a process-wide execution mode reaches all code.
pub fn set_default_dispatch_hook(hook: Option<Arc<dyn DispatchHook>>) {
    let mut g = DEFAULT_HOOK.write().unwrap_or_else(|e| e.into_inner());
    DEFAULT_SET.store(hook.is_some(), Ordering::Release);
    *g = hook;
}

/// The hook that sees this thread's next op: the innermost scoped one, else the default.
fn current_hook() -> Option<Arc<dyn DispatchHook>> {
    HOOKS.with(|h| h.borrow().last().cloned()).or_else(|| {
        if DEFAULT_SET.load(Ordering::Acquire) {
            DEFAULT_HOOK
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        } else {
            None
        }
    })
}

/// Checks that every input lives on one device and returns it.
pub fn common_device<'a>(op: &str, inputs: &[&'a Tensor]) -> Result<&'a tpu_tensor::Device> {
    let first = inputs
        .first()
        .ok_or_else(|| Error::invalid_argument(op, "expected at least one input tensor"))?;
    for t in &inputs[1..] {
        if t.device() != first.device() {
            return Err(Error::DeviceMismatch {
                op: op.to_string(),
                first: first.device().to_string(),
                second: t.device().to_string(),
            });
        }
    }
    Ok(first.device())
}

/// Runs `op` on `inputs` and returns its outputs.
pub fn run(op: &dyn OpDef, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    crate::init();
    let device = common_device(op.name(), inputs)?;
    // On the stack for the common op of up to four inputs: a heap allocation here is a
    // noticeable part of a tiny op's cost.
    let metas: smallvec::SmallVec<[Meta; 4]> = inputs.iter().map(|t| Meta::of(t)).collect();
    let outputs = op.infer(&metas)?;
    let nested = DEPTH.with(|d| d.get()) > 0;
    let hook = current_hook().filter(|h| !nested || h.nested());
    if let Some(h) = &hook
        && let Some(r) = h.dispatch(op, inputs, &outputs)
    {
        // Outputs a hook made (deferred ones, say) take part in autograd like computed ones.
        let results = r?;
        crate::autograd::record(op, inputs, &results);
        return Ok(results);
    }
    let results = run_kernel(op, inputs, &outputs, device)?;
    if let Some(h) = &hook {
        h.after(op, inputs, &results);
    }
    crate::autograd::record(op, inputs, &results);
    Ok(results)
}

/// Runs the kernel of `op` on `device` for the outputs its shape rule gave, without hooks or
/// autograd: the part of [`run`] after the shape rule, which an executor of a recorded graph calls
/// for each node. Ops the kernel dispatches while it runs are nested ones
/// ([`DispatchHook::nested`]).
pub fn run_kernel(
    op: &dyn OpDef,
    inputs: &[&Tensor],
    outputs: &[Meta],
    device: &tpu_tensor::Device,
) -> Result<Vec<Tensor>> {
    crate::init();
    // Deferred inputs are computed here, where their errors can be returned.
    tpu_tensor::deferred::ready_all(inputs.iter().map(|t| &**t.storage()))?;
    check_outputs_fit(op.name(), outputs, device)?;
    let empty = |shape: &[usize]| shape.contains(&0);
    if !outputs.is_empty()
        && outputs.iter().all(|m| empty(&m.shape))
        && inputs.iter().all(|t| empty(t.shape()))
    {
        // Nothing to compute and nothing to check (an op with empty outputs may still refuse
        // its data, as index_select of an empty tensor does an index out of range); and a
        // kernel's tables may be sized by a dim that is huge beside the 0.
        return outputs
            .iter()
            .map(|m| Tensor::zeros(&m.shape[..], m.dtype, device))
            .collect();
    }
    // Casts, copies and views a kernel makes internally are not part of the user's graph, and
    // a kernel reads its inputs on the host by design, also while a graph is being traced.
    let _inside = crate::autograd::no_grad();
    let _depth = Inside::enter();
    tpu_tensor::host_reads::allow_host_reads(|| match device.kind() {
        DeviceKind::Cpu => op.cpu(inputs, outputs),
        DeviceKind::Pjrt => crate::exec::pjrt::run(op, inputs, outputs, device),
    })
}

/// Refuses, before a kernel or a compilation starts, outputs that cannot be allocated: sizes past
/// the address space are shape errors, and sizes the device cannot hold now (its limit, or the
/// host memory behind it) are out-of-memory errors naming the op, dtype and shape. Kernels may
/// then size scratch memory by their outputs, and PJRT devices are never asked for outputs that
/// could not fit.
pub fn check_outputs_fit(op: &str, outputs: &[Meta], device: &tpu_tensor::Device) -> Result<()> {
    let mut total = 0usize;
    for m in outputs {
        let bytes = tpu_tensor::shape::checked_numel(op, &m.shape)?
            .checked_mul(m.dtype.size_in_bytes())
            .and_then(|b| total.checked_add(b))
            .ok_or_else(|| {
                Error::shape(
                    op,
                    format!(
                        "the output {} {} is more bytes than the address space holds",
                        m.dtype,
                        tpu_tensor::tpu_runtime::error::fmt_shape(&m.shape)
                    ),
                )
            })?;
        total = bytes;
    }
    device.check_alloc(total, || {
        let outs: Vec<String> = outputs
            .iter()
            .map(|m| tpu_tensor::tpu_runtime::buffer::describe(m.dtype, &m.shape))
            .collect();
        format!("the output of {op}: {}", outs.join(", "))
    })
}

/// Runs an op with one output.
pub fn run1(op: &dyn OpDef, inputs: &[&Tensor]) -> Result<Tensor> {
    let mut out = run(op, inputs)?;
    if out.len() != 1 {
        return Err(Error::internal(
            op.name(),
            format!("expected one output, the op produced {}", out.len()),
        ));
    }
    Ok(out.remove(0))
}
