//! The fused mode's machinery: a dispatch hook that records ops instead of running them, and the
//! pending graph that computes them together when a value is needed.
//!
//! An op dispatched in fused mode gets *deferred* outputs: tensors of the right dtype, shape and
//! device whose storage holds no memory yet ([`tpu_tensor::deferred`]). The op becomes a node of
//! this thread's pending graph; its operands are matched to the graph's values by storage and
//! layout as capture does (a view of a deferred value becomes a [`ViewNode`]), and any other
//! operand is an input, read when the graph runs (its storage is watched, so an in-place write
//! to it runs the graph first).
//!
//! The graph runs (is *flushed*) when a deferred value's bytes are needed (a host read, an
//! in-place write, an op that runs eagerly), when it reaches the node limit, and when a fused
//! scope ends. Its outputs are the deferred values still alive; the graph is optimised and
//! compiled once per program (fingerprint and input signature) and then taken from a cache.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use tpu_ops::tpu_tensor::deferred::Deferred;
use tpu_ops::tpu_tensor::observe::observing;
use tpu_ops::tpu_tensor::{Device, Error, Layout, Result, Storage, Tensor};
use tpu_ops::{DispatchHook, Meta, OpDef};

use crate::compile::Signature;
use crate::exec::Executable;
use crate::ir::{Graph, InputKind, ValueId};
use crate::metrics::{FusedMetrics, count_fused};
use crate::mode::{ExecMode, mode};
use crate::operand::Key;
use crate::passes::optimize;
use crate::view::ViewNode;

/// The default node limit of a pending graph.
pub const DEFAULT_NODE_LIMIT: usize = 1000;

static NODE_LIMIT: AtomicUsize = AtomicUsize::new(DEFAULT_NODE_LIMIT);

/// Sets how many ops a pending graph may hold before it runs by itself (at least 1).
pub fn set_node_limit(limit: usize) {
    NODE_LIMIT.store(limit.max(1), Ordering::Relaxed);
}

/// How many ops a pending graph may hold before it runs by itself.
pub fn node_limit() -> usize {
    NODE_LIMIT.load(Ordering::Relaxed)
}

/// Programs kept in the memory cache before it is emptied (a model has a handful of distinct
/// flush graphs; a long tail of others means the cache would not pay).
const CACHE_CAPACITY: usize = 256;

#[derive(Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    fingerprint: u64,
    sig: Signature,
    checks: bool,
}

fn cache() -> &'static Mutex<HashMap<CacheKey, Arc<Executable>>> {
    static CACHE: OnceLock<Mutex<HashMap<CacheKey, Arc<Executable>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Empties the fused mode's program cache.
pub fn clear_cache() {
    cache().lock().unwrap_or_else(|e| e.into_inner()).clear();
}

thread_local! {
    /// This thread's pending graph.
    static CURRENT: RefCell<Option<Arc<Pending>>> = const { RefCell::new(None) };
}

/// The dispatch hook of the fused mode; it defers ops only where [`mode`] is fused, so a strict
/// scope inside a fused one runs eagerly under the same hook.
pub(crate) struct FusedHook;

impl DispatchHook for FusedHook {
    fn dispatch(
        &self,
        op: &dyn OpDef,
        inputs: &[&Tensor],
        outputs: &[Meta],
    ) -> Option<Result<Vec<Tensor>>> {
        // While a function is traced (its write observer is installed then), ops run so the trace's
        // own hook, further out, records them.
        let defer_here = mode() == ExecMode::Fused && !observing();
        defer_here.then(|| defer(op, inputs, outputs))
    }

    fn nested(&self) -> bool {
        // The ops a kernel dispatches run while the graph runs, eagerly.
        false
    }
}

/// The hook shared by the process-wide mode and the fused scopes.
pub(crate) fn hook() -> Arc<dyn DispatchHook> {
    static HOOK: OnceLock<Arc<dyn DispatchHook>> = OnceLock::new();
    HOOK.get_or_init(|| Arc::new(FusedHook)).clone()
}

/// Runs this thread's pending graph now, if it has one.
pub fn flush() -> Result<()> {
    match CURRENT.with(|c| c.borrow_mut().take()) {
        Some(p) => p.flush(),
        None => Ok(()),
    }
}

/// This thread's pending graph for `device`: the current one, or a new one when there is none,
/// it has run, or it computes on another device (which then runs first).
fn pending_for(device: &Device) -> Result<Arc<Pending>> {
    let current = CURRENT.with(|c| c.borrow().clone());
    if let Some(p) = current {
        if !p.done.load(Ordering::Acquire) && p.device == *device {
            return Ok(p);
        }
        p.flush()?;
    }
    let p = Pending::new(device.clone());
    CURRENT.with(|c| *c.borrow_mut() = Some(p.clone()));
    Ok(p)
}

fn defer(op: &dyn OpDef, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let device = inputs
        .first()
        .ok_or_else(|| Error::invalid_argument(op.name(), "expected at least one input tensor"))?
        .device()
        .clone();
    // A second try when another thread ran the graph meanwhile (reading one of its values).
    for _ in 0..2 {
        let pending = pending_for(&device)?;
        // Operands deferred by other work (another thread's graph, one this thread left for
        // another device) are computed first: this graph reads them as inputs.
        for t in inputs {
            if t.storage().is_pending() && !pending.owns(t.storage()) {
                t.storage().ready()?;
            }
        }
        let Some((outs, full)) = pending.record(op, inputs, outputs)? else {
            continue;
        };
        if full {
            CURRENT.with(|c| c.borrow_mut().take());
            pending.flush_as(true)?;
        }
        return Ok(outs);
    }
    Err(Error::internal(
        op.name(),
        "the pending graph kept running while the op was deferred",
    ))
}

#[derive(Default)]
struct State {
    graph: Graph,
    values: HashMap<Key, ValueId>,
    /// The value each deferred storage of this graph stands for, with its (dense) layout.
    owners: HashMap<usize, (ValueId, Layout)>,
    /// The deferred storages, weakly: only those alive when the graph runs are its outputs. A
    /// weak handle also keeps the address from being reused for another storage meanwhile.
    made: Vec<(ValueId, Weak<Storage>)>,
    /// The inputs read from outside the graph.
    captured: Vec<Tensor>,
}

/// One pending graph: the ops deferred on one thread for one device since the last flush.
pub(crate) struct Pending {
    me: Weak<Pending>,
    device: Device,
    /// Set once the graph has run (or failed); later ops start a new one.
    done: AtomicBool,
    /// Held while the graph runs, so a flush asked for on another thread waits for the values.
    state: Mutex<State>,
}

impl Pending {
    fn new(device: Device) -> Arc<Pending> {
        Arc::new_cyclic(|me| Pending {
            me: me.clone(),
            device,
            done: AtomicBool::new(false),
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn as_deferred(&self) -> Result<Arc<dyn Deferred>> {
        let me: Arc<dyn Deferred> = self
            .me
            .upgrade()
            .ok_or_else(|| Error::internal("fused", "a pending graph outlived its handle"))?;
        Ok(me)
    }

    fn owns(&self, s: &Arc<Storage>) -> bool {
        self.lock().owners.contains_key(&(Arc::as_ptr(s) as usize))
    }

    /// Adds `op` on `inputs`, returning its deferred outputs and whether the graph is full;
    /// `None` when the graph has already run.
    fn record(
        &self,
        op: &dyn OpDef,
        inputs: &[&Tensor],
        metas: &[Meta],
    ) -> Result<Option<(Vec<Tensor>, bool)>> {
        let me = self.as_deferred()?;
        let mut s = self.lock();
        if self.done.load(Ordering::Acquire) {
            return Ok(None);
        }
        let ins = inputs
            .iter()
            .map(|t| s.value_of(t, &me))
            .collect::<Result<Vec<_>>>()?;
        let mut outs = Vec::with_capacity(metas.len());
        for m in metas {
            let storage = Storage::deferred(m.dtype, &self.device, m.numel(), me.clone())?;
            outs.push(Tensor::from_storage(storage, Layout::contiguous(&m.shape))?);
        }
        let vals = s.graph.add_node(op.boxed(), &ins, metas)?;
        for (t, v) in outs.iter().zip(vals) {
            s.values.insert(Key::of(t), v);
            s.owners
                .insert(Arc::as_ptr(t.storage()) as usize, (v, t.layout().clone()));
            s.made.push((v, Arc::downgrade(t.storage())));
        }
        count_fused(FusedMetrics {
            nodes_deferred: 1,
            ..FusedMetrics::default()
        });
        Ok(Some((outs, s.graph.nodes().len() >= node_limit())))
    }

    fn flush_as(&self, at_limit: bool) -> Result<()> {
        let mut s = self.lock();
        if self.done.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let state = std::mem::take(&mut *s);
        let me = self.as_deferred()?;
        let live: Vec<(ValueId, Arc<Storage>)> = state
            .made
            .iter()
            .filter_map(|(v, w)| w.upgrade().map(|st| (*v, st)))
            .collect();
        let result = if live.is_empty() {
            Ok(())
        } else {
            self.run(state.graph, &state.captured, &live, at_limit)
        };
        for t in &state.captured {
            t.storage().unwatch(&me);
        }
        if let Err(e) = &result {
            count_fused(FusedMetrics {
                failures: 1,
                ..FusedMetrics::default()
            });
            for (_, st) in &live {
                st.fail(e.to_string());
            }
        }
        result
    }

    /// Runs the graph with `live` as its outputs and fills their storages.
    fn run(
        &self,
        mut graph: Graph,
        captured: &[Tensor],
        live: &[(ValueId, Arc<Storage>)],
        at_limit: bool,
    ) -> Result<()> {
        graph.set_outputs(live.iter().map(|(v, _)| *v).collect());
        let key = CacheKey {
            fingerprint: graph.fingerprint(),
            sig: Signature::of(captured),
            checks: tpu_ops::device_checks(),
        };
        let mut delta = FusedMetrics {
            flushes: 1,
            limit_flushes: at_limit as u64,
            ..FusedMetrics::default()
        };
        let cached = cache()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let exe = match cached {
            Some(e) => {
                delta.hits = 1;
                e
            }
            None => {
                let t0 = Instant::now();
                optimize(&mut graph)?;
                if self.device.as_pjrt().is_none() {
                    crate::passes::fuse_for_cpu(&mut graph)?;
                }
                let cache_dir = crate::disk::DiskCache::from_env();
                let (exe, _) = Executable::prepare(
                    graph,
                    &[],
                    captured,
                    &self.device,
                    key.checks,
                    &[],
                    cache_dir.as_ref(),
                )?;
                let exe = Arc::new(exe);
                delta.compiles = 1;
                delta.compile_time = t0.elapsed();
                let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
                if c.len() >= CACHE_CAPACITY {
                    c.clear();
                }
                c.insert(key, exe.clone());
                exe
            }
        };
        let t0 = Instant::now();
        let outs = exe.run(&[], captured, &[]);
        delta.execution_time = t0.elapsed();
        count_fused(delta);
        let outs = outs?;
        if outs.len() != live.len() {
            return Err(Error::internal(
                "fused",
                format!("{} results for {} values", outs.len(), live.len()),
            ));
        }
        for ((_, storage), t) in live.iter().zip(outs) {
            storage.fill(dense_buffer(t)?)?;
        }
        Ok(())
    }
}

impl Deferred for Pending {
    fn flush(&self) -> Result<()> {
        self.flush_as(false)
    }
}

impl State {
    /// The value of an operand: one the graph has, a view of one, or a new input.
    fn value_of(&mut self, t: &Tensor, me: &Arc<dyn Deferred>) -> Result<ValueId> {
        if let Some(&v) = self.values.get(&Key::of(t)) {
            return Ok(v);
        }
        let storage = Arc::as_ptr(t.storage()) as usize;
        if let Some((base, layout)) = self.owners.get(&storage).cloned() {
            let view = ViewNode::over(&layout, t.layout()).ok_or_else(|| {
                Error::internal(
                    "fused",
                    "a view reaches outside the deferred value it views",
                )
            })?;
            let v = self
                .graph
                .add_node(Arc::new(view), &[base], &[Meta::of(t)])?[0];
            self.values.insert(Key::of(t), v);
            return Ok(v);
        }
        // A value whose deferred work failed must not be read as the zeros standing in for it.
        t.storage().ready()?;
        t.storage().watch(me);
        let i = self.captured.len();
        // Without its autograd record: the graph needs the bytes, not the history.
        self.captured.push(t.detach());
        let v = self.graph.add_input(Meta::of(t), InputKind::Captured(i));
        self.values.insert(Key::of(t), v);
        Ok(v)
    }
}

/// The dense buffer of a result, taken over when the result owns it alone, else copied.
fn dense_buffer(t: Tensor) -> Result<tpu_ops::tpu_tensor::tpu_runtime::Buffer> {
    let whole = t.is_contiguous() && t.offset() == 0 && t.numel() == t.storage().numel();
    // A view, or bytes shared with another result or an input, are copied out.
    let t = if whole && Arc::strong_count(t.storage()) == 1 {
        t
    } else {
        t.copy_untracked()?
    };
    let storage = Arc::clone(t.storage());
    drop(t);
    storage
        .into_buffer()
        .ok_or_else(|| Error::internal("fused", "a result's storage is shared"))
}
