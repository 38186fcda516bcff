//! Capture: running a function once with a dispatch hook that records every op the function
//! asks for into a graph instead of computing it. Each op returns *placeholders*: tensors of the
//! right dtype, shape and device whose storage holds no memory ([`tpu_tensor::deferred`]), so a
//! trace costs the shape rules and the bookkeeping, not the arithmetic, and the first call of
//! a compiled function runs the compiled program like every later one. A placeholder that is
//! read (by code that reaches its bytes outside an op) is an error naming the op that made it;
//! one that outlives the trace (a gradient left in `.grad`) reports, when read, that its value
//! exists only inside the compiled program.
//!
//! When graph breaks are allowed ([`trace_with`]), the function runs eagerly instead, since it
//! may read values on the host; the hook records the ops as they run (the ops a kernel
//! dispatches internally are not recorded; see `DispatchHook::nested`).
//!
//! Operands are matched to values by their storage and layout. An operand the trace has not
//! produced is either a view of a value it has (recorded as a [`ViewNode`]) or a tensor the
//! function read from its environment: a parameter, a buffer, or a number turned into a tensor.
//! Those become *captured* inputs, read again on every call, so a parameter updated between
//! calls is seen.
//!
//! Reading a value on the host while tracing (`to_vec`, `to_scalar`, printing) is an error that
//! names the line: the program could not depend on it.
//!
//! In-place writes (`copy_`, `fill_`, optimizer steps, writes through views) are reported by
//! `tpu_tensor::observe` (and, with placeholders, recorded without being made): after one, the written storage's region has a new value (the written
//! values, or a [`ViewWrite`] of them into the old value), and every later read of the storage
//! sees it. A storage the function did not create (an argument, a parameter, optimizer state)
//! that was written has its final value as an extra output of the graph, written back into the
//! same storage after every call ([`WriteBack`]). A write that bypassed both (none should) is
//! an error rather than a graph that would silently leave it out.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use std::sync::Weak;
use std::sync::atomic::{AtomicBool, Ordering};
use tpu_ops::tpu_tensor::host_reads::{forbid_host_reads, watch_host_reads};
use tpu_ops::tpu_tensor::observe::{WriteObserver, inside_write, observe_writes};

use tpu_ops::tpu_tensor::deferred::Deferred;
use tpu_ops::tpu_tensor::{Device, Error, Layout, Result, Storage, Tensor};
use tpu_ops::{DispatchHook, Meta, OpDef, in_kernel, with_dispatch_hook};

use crate::ir::{Graph, InputKind, ValueId};
use crate::operand::{Key, is_whole, storage_id};
use crate::view::{ViewNode, ViewWrite};

/// Where a written value goes after each call.
#[derive(Clone, Debug)]
pub enum WriteTarget {
    /// Into the storage of the `n`-th argument.
    Arg(usize),
    /// Into this tensor's storage (a parameter, a buffer, optimizer state).
    Tensor(Tensor),
}

/// One storage region the function writes in place: after each call, the graph output
/// `output` is written into `layout` over the target's storage.
#[derive(Clone, Debug)]
pub struct WriteBack {
    /// Whose storage.
    pub target: WriteTarget,
    /// The region written, over the target's storage.
    pub layout: Layout,
    /// The graph output holding the region's final value.
    pub output: usize,
}

/// What a trace produced: the graph, the tensors it captured (in the order of
/// [`InputKind::Captured`]), and what the function returned.
#[derive(Debug)]
pub struct Trace {
    /// The recorded graph.
    pub graph: Graph,
    /// The captured tensors.
    pub captured: Vec<Tensor>,
    /// What the function returned while it was traced: placeholders, or computed values when
    /// the function ran eagerly (graph breaks allowed; see [`Trace::eager`]).
    pub outputs: Vec<Tensor>,
    /// True when the function ran eagerly while it was traced: its outputs hold values and
    /// its in-place writes were made. False when the ops returned placeholders.
    pub eager: bool,
    /// The in-place writes to storages the function did not create, written back after each
    /// call; their values are the graph outputs after the function's own.
    pub writes: Vec<WriteBack>,
    /// The device every operand lived on (`None` when the function ran no op).
    pub device: Option<Device>,
    /// Where the function read values on the host, when graph breaks were allowed; when there
    /// are any, the graph is empty (the function has to run in segments).
    pub breaks: Vec<String>,
}

#[derive(Default)]
struct State {
    graph: Graph,
    values: HashMap<Key, ValueId>,
    /// The value that owns each storage the trace produced, with its layout.
    owners: HashMap<usize, (ValueId, Layout)>,
    /// Every tensor seen, with its storage's version then: they are held so no storage is
    /// freed and its address reused during the trace, and checked for in-place writes.
    seen: Vec<(Tensor, u64, String)>,
    captured: Vec<Tensor>,
    device: Option<Device>,
    error: Option<Error>,
    /// Storages produced by recorded ops (temporaries: written without a write-back).
    produced: HashSet<usize>,
    /// The argument each argument storage first belongs to.
    arg_storage: HashMap<usize, usize>,
    /// Storages from outside the trace that were written, in the order of their first write,
    /// with a handle to each.
    written: Vec<(usize, Arc<Storage>)>,
}

impl State {
    fn remember(&mut self, t: &Tensor, v: ValueId, what: String, owner: bool) {
        self.values.insert(Key::of(t), v);
        if owner {
            self.owners
                .entry(storage_id(t))
                .or_insert((v, t.layout().clone()));
        }
        self.seen.push((t.clone(), t.storage().version(), what));
    }

    /// Records that `dst` now holds `src`'s values.
    fn wrote(&mut self, dst: &Tensor, src: &Tensor) -> Result<()> {
        let v_src = self.value_of(src)?;
        let sid = storage_id(dst);
        let (value, layout) = if is_whole(dst) {
            (v_src, dst.layout().clone())
        } else {
            let (base, layout) = match self.owners.get(&sid).cloned() {
                Some((base, layout)) if ViewWrite::over(&layout, dst.layout()).is_some() => {
                    (base, layout)
                }
                _ => {
                    // The region around the view is not known: read the whole storage.
                    let whole = Tensor::from_storage(
                        dst.storage().clone(),
                        Layout::contiguous(&[dst.storage().numel()]),
                    )?;
                    let v = self.capture(&whole);
                    (v, whole.layout().clone())
                }
            };
            let op = ViewWrite::over(&layout, dst.layout())
                .ok_or_else(|| Error::internal("compile", "a write outside its region"))?;
            let meta = Meta::new(&layout.shape, dst.dtype());
            let v = self.graph.add_node(Arc::new(op), &[base, v_src], &[meta])?[0];
            (v, layout)
        };
        // Every earlier reading of this storage is stale now.
        self.values.retain(|k, _| k.storage != sid);
        self.owners.insert(sid, (value, layout.clone()));
        self.values.insert(Key::at(sid, &layout), value);
        let version = dst.storage().version();
        for (t, v, _) in &mut self.seen {
            if storage_id(t) == sid {
                *v = version;
            }
        }
        if !self.produced.contains(&sid) && !self.written.iter().any(|(s, _)| *s == sid) {
            self.written.push((sid, dst.storage().clone()));
        }
        Ok(())
    }

    /// A new captured input for `t`.
    fn capture(&mut self, t: &Tensor) -> ValueId {
        let i = self.captured.len();
        self.captured.push(t.clone());
        let v = self.graph.add_input(Meta::of(t), InputKind::Captured(i));
        self.remember(t, v, format!("captured tensor {i}"), is_whole(t));
        v
    }

    /// The graph outputs and write-backs of the written outside storages.
    fn write_backs(&mut self, first_output: usize) -> Result<(Vec<ValueId>, Vec<WriteBack>)> {
        let mut outs = Vec::new();
        let mut backs = Vec::new();
        for (sid, storage) in self.written.clone() {
            let (v, layout) = self
                .owners
                .get(&sid)
                .cloned()
                .ok_or_else(|| Error::internal("compile", "a written storage has no value"))?;
            let (v, layout) = self.in_buffer_dims(&storage, v, layout)?;
            let target = match self.arg_storage.get(&sid) {
                Some(&i) => WriteTarget::Arg(i),
                None => WriteTarget::Tensor(Tensor::from_storage(storage.clone(), layout.clone())?),
            };
            backs.push(WriteBack {
                target,
                layout,
                output: first_output + outs.len(),
            });
            outs.push(v);
        }
        Ok((outs, backs))
    }

    /// A value written back over a whole PJRT storage, in the dims of the storage's buffer: its
    /// buffer is handed over after each call, and programs take a storage's buffer as it is, so
    /// a write through a view of other dims (a flat view, say) must not change them.
    fn in_buffer_dims(
        &mut self,
        storage: &Storage,
        v: ValueId,
        layout: Layout,
    ) -> Result<(ValueId, Layout)> {
        let whole = layout.is_contiguous()
            && layout.offset == 0
            && layout.shape.iter().product::<usize>() == storage.numel();
        if storage.device().as_pjrt().is_none() || !whole {
            return Ok((v, layout));
        }
        let dims = storage.read().dims().to_vec();
        if dims[..] == layout.shape[..] {
            return Ok((v, layout));
        }
        let target = Layout::contiguous(&dims);
        let view = ViewNode::over(&layout, &target)
            .ok_or_else(|| Error::internal("compile", "a buffer's dims are not a view"))?;
        let meta = Meta::new(&dims, storage.dtype());
        let out = self.graph.add_node(Arc::new(view), &[v], &[meta])?[0];
        Ok((out, target))
    }

    fn check_device(&mut self, t: &Tensor) -> Result<()> {
        match &self.device {
            None => self.device = Some(t.device().clone()),
            Some(d) if d != t.device() => {
                return Err(Error::DeviceMismatch {
                    op: "compile".into(),
                    first: d.to_string(),
                    second: t.device().to_string(),
                });
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// The value of an operand: one the trace has, a view of one, or a new captured input.
    fn value_of(&mut self, t: &Tensor) -> Result<ValueId> {
        self.check_device(t)?;
        if let Some(&v) = self.values.get(&Key::of(t)) {
            return Ok(v);
        }
        let storage = Arc::as_ptr(t.storage()) as usize;
        if let Some((base, layout)) = self.owners.get(&storage).cloned()
            && let Some(view) = ViewNode::over(&layout, t.layout())
        {
            let meta = Meta::of(t);
            let v = self.graph.add_node(Arc::new(view), &[base], &[meta])?[0];
            self.remember(t, v, format!("a view of {base}"), false);
            return Ok(v);
        }
        Ok(self.capture(t))
    }

    fn record(&mut self, op: &dyn OpDef, inputs: &[&Tensor], outputs: &[Tensor]) -> Result<()> {
        let ins = inputs
            .iter()
            .map(|t| self.value_of(t))
            .collect::<Result<Vec<_>>>()?;
        let metas: Vec<Meta> = outputs.iter().map(Meta::of).collect();
        let outs = self.graph.add_node(op.boxed(), &ins, &metas)?;
        for (t, v) in outputs.iter().zip(outs) {
            self.produced.insert(storage_id(t));
            self.remember(t, v, format!("{v} (output of {})", op.name()), true);
        }
        Ok(())
    }

    /// An error when a tensor the trace saw was written in place after it saw it.
    fn check_writes(&self) -> Result<()> {
        for (t, version, what) in &self.seen {
            if t.storage().version() != *version {
                return Err(Error::invalid_argument(
                    "compile",
                    format!(
                        "{what} was written in place while the function was traced, by a write \
                         that capture could not see (not copy_ or fill_); return the new value \
                         instead, or run this function eagerly"
                    ),
                ));
            }
        }
        Ok(())
    }
}

struct Recorder {
    state: Mutex<State>,
    /// The owner of the placeholders the ops return; `None` when the function runs eagerly.
    placeholders: Option<Arc<Placeholders>>,
}

/// The owner of a trace's placeholders. Nothing computes them: reading one fails it with a
/// message naming the op that made it, and is remembered, so the trace fails too.
struct Placeholders {
    made: Mutex<Vec<(Weak<Storage>, &'static str)>>,
    /// Set once the trace is over: a placeholder read then outlived it.
    finished: AtomicBool,
    /// Set when a placeholder was read while the function was traced.
    read_early: Mutex<Option<String>>,
}

impl Placeholders {
    fn make(
        self: &Arc<Self>,
        op: &dyn OpDef,
        device: &Device,
        metas: &[Meta],
    ) -> Result<Vec<Tensor>> {
        let owner: Arc<dyn Deferred> = self.clone();
        let mut outs = Vec::with_capacity(metas.len());
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        for m in metas {
            let storage = Storage::deferred(m.dtype, device, m.numel(), owner.clone())?;
            made.push((Arc::downgrade(&storage), op.name()));
            outs.push(Tensor::from_storage(storage, Layout::contiguous(&m.shape))?);
        }
        Ok(outs)
    }
}

impl Deferred for Placeholders {
    fn flush(&self) -> Result<()> {
        let finished = self.finished.load(Ordering::Acquire);
        let made = std::mem::take(&mut *self.made.lock().unwrap_or_else(|e| e.into_inner()));
        let mut first = None;
        for (storage, op) in made {
            let Some(s) = storage.upgrade() else { continue };
            if !s.is_pending() {
                continue;
            }
            let why = if finished {
                format!(
                    "it is the output of {op} inside a compiled function's trace: its values \
                     exist only inside the compiled program (a gradient a compiled step left \
                     in .grad, say); return the tensor from the function to read it"
                )
            } else {
                format!(
                    "the output of {op} was read while the function was traced for \
                     compilation, by code that reaches a tensor's bytes outside an op; traced \
                     ops compute nothing until the program runs: compute it with ops, or read \
                     it after the call"
                )
            };
            first.get_or_insert_with(|| why.clone());
            s.fail(why);
        }
        if !finished && let Some(why) = &first {
            *self.read_early.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
        }
        Err(Error::invalid_argument(
            "compile",
            first.unwrap_or_else(|| "a placeholder of a traced function was read".into()),
        ))
    }
}

impl Recorder {
    fn with_state(&self, f: impl FnOnce(&mut State) -> Result<()>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.error.is_none()
            && let Err(e) = f(&mut s)
        {
            s.error = Some(e);
        }
    }
}

impl DispatchHook for Recorder {
    fn dispatch(
        &self,
        op: &dyn OpDef,
        inputs: &[&Tensor],
        outputs: &[Meta],
    ) -> Option<Result<Vec<Tensor>>> {
        let placeholders = self.placeholders.as_ref()?;
        if inside_write() {
            // Not reached with placeholders (writes are only recorded), but a write's own ops
            // are never the program's.
            return None;
        }
        let device = inputs.first()?.device().clone();
        let made = placeholders.make(op, &device, outputs);
        Some(made.inspect(|outs| self.with_state(|s| s.record(op, inputs, outs))))
    }

    fn after(&self, op: &dyn OpDef, inputs: &[&Tensor], outputs: &[Tensor]) {
        // The ops an in-place write runs to move bytes are its own; the write is reported.
        if !inside_write() {
            self.with_state(|s| s.record(op, inputs, outputs));
        }
    }

    fn nested(&self) -> bool {
        false
    }
}

/// The recorder, told about in-place writes (made outside kernels).
struct Writes(Arc<Recorder>);

impl WriteObserver for Writes {
    fn wrote(&self, dst: &Tensor, src: &Tensor) {
        if !in_kernel() {
            self.0.with_state(|s| s.wrote(dst, src));
        }
    }

    fn records_only(&self) -> bool {
        self.0.placeholders.is_some() && !in_kernel()
    }
}

/// Runs `f` on `args` once with its ops returning placeholders, and records them into a graph
/// whose inputs are the arguments (in order) and then the tensors it captured, and whose
/// outputs are what `f` returned and then the values it wrote into outside storages. Nothing
/// is computed and nothing is written.
pub fn trace(f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>, args: &[Tensor]) -> Result<Trace> {
    trace_with(f, args, false)
}

/// [`trace`]; with `breaks`, the function runs eagerly (its ops compute, its writes are made)
/// and host reads are allowed instead of refused: they happen, their locations are returned in
/// [`Trace::breaks`], and the graph is left empty, since what the function does next may
/// depend on the values read.
pub fn trace_with(
    f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    args: &[Tensor],
    breaks: bool,
) -> Result<Trace> {
    let mut state = State::default();
    for (i, a) in args.iter().enumerate() {
        state.check_device(a)?;
        let v = state.graph.add_input(Meta::of(a), InputKind::Arg(i));
        state.arg_storage.entry(storage_id(a)).or_insert(i);
        state.remember(a, v, format!("argument {i}"), true);
    }
    let placeholders = (!breaks).then(|| {
        Arc::new(Placeholders {
            made: Mutex::default(),
            finished: AtomicBool::new(false),
            read_early: Mutex::default(),
        })
    });
    let recorder = Arc::new(Recorder {
        state: Mutex::new(state),
        placeholders: placeholders.clone(),
    });
    let refuse = |at: &'static std::panic::Location<'static>| {
        Error::invalid_argument(
            "compile",
            format!(
                "a tensor's values were read on the host at {at} while the function was traced \
                 (to_vec, to_scalar, printing, or a move to another device): a compiled program \
                 cannot depend on values it has not computed. Return the tensor and read it after \
                 the call, read it outside the compiled function, or allow graph breaks \
                 (CompileOptions::allow_graph_breaks) to run the function as several graphs"
            ),
        )
    };
    let writes: Rc<dyn WriteObserver> = Rc::new(Writes(recorder.clone()));
    let run = || observe_writes(writes, || with_dispatch_hook(recorder.clone(), || f(args)));
    let reads: Rc<RefCell<Vec<String>>> = Rc::default();
    let outputs = if breaks {
        let seen = reads.clone();
        watch_host_reads(move |at| seen.borrow_mut().push(at.to_string()), run)
    } else {
        forbid_host_reads(refuse, run)
    };
    if let Some(p) = &placeholders {
        p.finished.store(true, Ordering::Release);
        let early = p
            .read_early
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(why) = early {
            return Err(Error::invalid_argument("compile", why));
        }
    }
    let outputs = outputs?;
    let mut s = recorder.state.lock().unwrap_or_else(|e| e.into_inner());
    let breaks = reads.take();
    if !breaks.is_empty() {
        return Ok(Trace {
            graph: Graph::new(),
            captured: Vec::new(),
            outputs,
            eager: true,
            writes: Vec::new(),
            device: s.device.clone(),
            breaks,
        });
    }
    if let Some(e) = s.error.take() {
        return Err(e);
    }
    let mut outs = outputs
        .iter()
        .map(|t| s.value_of(t))
        .collect::<Result<Vec<_>>>()?;
    s.check_writes()?;
    let (written, writes) = s.write_backs(outs.len())?;
    outs.extend(written);
    let mut graph = std::mem::take(&mut s.graph);
    graph.set_outputs(outs);
    graph.validate()?;
    Ok(Trace {
        graph,
        captured: std::mem::take(&mut s.captured),
        outputs,
        eager: placeholders.is_none(),
        writes,
        device: s.device.clone(),
        breaks: Vec::new(),
    })
}
