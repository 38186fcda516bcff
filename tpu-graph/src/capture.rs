//! Capture: running a function once, eagerly, with a dispatch hook that records every op the
//! function asks for (the ops a kernel dispatches internally are not recorded; see
//! `DispatchHook::nested`).
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
//! In-place writes do not pass through dispatch yet, so capture cannot record them: a trace in
//! which a tensor it saw was written in place (`copy_`, an optimizer step) is an error rather
//! than a graph that would silently leave the write out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tpu_ops::tpu_tensor::host_reads::forbid_host_reads;
use tpu_ops::tpu_tensor::{Device, Error, Layout, Result, Tensor};
use tpu_ops::{DispatchHook, Meta, OpDef, with_dispatch_hook};

use crate::ir::{Graph, InputKind, ValueId};
use crate::view::ViewNode;

/// What a trace produced: the graph, the tensors it captured (in the order of
/// [`InputKind::Captured`]), and the outputs of the eager run.
#[derive(Debug)]
pub struct Trace {
    /// The recorded graph.
    pub graph: Graph,
    /// The captured tensors.
    pub captured: Vec<Tensor>,
    /// What the function returned while it was traced.
    pub outputs: Vec<Tensor>,
    /// The device every operand lived on (`None` when the function ran no op).
    pub device: Option<Device>,
}

/// A storage and a layout: how capture recognises a tensor it has seen.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    storage: usize,
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

impl Key {
    fn of(t: &Tensor) -> Key {
        let l = t.layout();
        Key {
            storage: Arc::as_ptr(t.storage()) as usize,
            shape: l.shape.to_vec(),
            strides: l.strides.to_vec(),
            offset: l.offset,
        }
    }
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
}

impl State {
    fn remember(&mut self, t: &Tensor, v: ValueId, what: String, owner: bool) {
        self.values.insert(Key::of(t), v);
        if owner {
            self.owners
                .entry(Arc::as_ptr(t.storage()) as usize)
                .or_insert((v, t.layout().clone()));
        }
        self.seen.push((t.clone(), t.storage().version(), what));
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
        let i = self.captured.len();
        self.captured.push(t.clone());
        let v = self.graph.add_input(Meta::of(t), InputKind::Captured(i));
        self.remember(t, v, format!("captured tensor {i}"), false);
        Ok(v)
    }

    fn record(&mut self, op: &dyn OpDef, inputs: &[&Tensor], outputs: &[Tensor]) -> Result<()> {
        let ins = inputs
            .iter()
            .map(|t| self.value_of(t))
            .collect::<Result<Vec<_>>>()?;
        let metas: Vec<Meta> = outputs.iter().map(Meta::of).collect();
        let outs = self.graph.add_node(op.boxed(), &ins, &metas)?;
        for (t, v) in outputs.iter().zip(outs) {
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
                        "{what} was written in place while the function was traced (by copy_, \
                         an optimizer step or another write that does not pass through \
                         dispatch); compiled functions cannot record in-place writes yet, so \
                         return the new value instead, or run this function eagerly"
                    ),
                ));
            }
        }
        Ok(())
    }
}

struct Recorder {
    state: Mutex<State>,
}

impl DispatchHook for Recorder {
    fn dispatch(&self, _: &dyn OpDef, _: &[&Tensor], _: &[Meta]) -> Option<Result<Vec<Tensor>>> {
        None
    }

    fn after(&self, op: &dyn OpDef, inputs: &[&Tensor], outputs: &[Tensor]) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.error.is_none()
            && let Err(e) = s.record(op, inputs, outputs)
        {
            s.error = Some(e);
        }
    }

    fn nested(&self) -> bool {
        false
    }
}

/// Runs `f` on `args` once, eagerly, and records the ops it dispatched into a graph whose
/// inputs are the arguments (in order) and then the tensors it captured, and whose outputs are
/// what `f` returned.
pub fn trace(f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>, args: &[Tensor]) -> Result<Trace> {
    let mut state = State::default();
    for (i, a) in args.iter().enumerate() {
        state.check_device(a)?;
        let v = state.graph.add_input(Meta::of(a), InputKind::Arg(i));
        state.remember(a, v, format!("argument {i}"), true);
    }
    let recorder = Arc::new(Recorder {
        state: Mutex::new(state),
    });
    let refuse = |at: &'static std::panic::Location<'static>| {
        Error::invalid_argument(
            "compile",
            format!(
                "a tensor's values were read on the host at {at} while the function was traced \
                 (to_vec, to_scalar, printing, or a move to another device): a compiled program \
                 cannot depend on values it has not computed. Return the tensor and read it after \
                 the call, or read it outside the compiled function"
            ),
        )
    };
    let outputs = forbid_host_reads(refuse, || with_dispatch_hook(recorder.clone(), || f(args)))?;
    let mut s = recorder.state.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = s.error.take() {
        return Err(e);
    }
    let outs = outputs
        .iter()
        .map(|t| s.value_of(t))
        .collect::<Result<Vec<_>>>()?;
    s.check_writes()?;
    let mut graph = std::mem::take(&mut s.graph);
    graph.set_outputs(outs);
    graph.validate()?;
    Ok(Trace {
        graph,
        captured: std::mem::take(&mut s.captured),
        outputs,
        device: s.device.clone(),
    })
}
