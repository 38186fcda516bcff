//! Reverse-mode automatic differentiation.
//!
//! Dispatch records a node for every op that has a backward rule when grad mode is on and an
//! input requires a gradient. A node keeps the op, detached copies of its inputs and outputs
//! (with their storages' versions, to catch in-place changes), and an edge per input to the node
//! (or leaf) that produced it. `backward` walks the nodes from the output in reverse topological
//! order, calls each op's backward rule (itself written with ops, so it runs on the device the
//! forward ran on), reduces gradients of broadcast inputs to the input's shape, and accumulates
//! into leaves' `.grad`.
//!
//! In-place writes (`copy_` and every method built on it) give the written tensor, or the root
//! of the view written through, a new history; views pick it up when next used (`inplace.rs`).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tpu_tensor::tpu_runtime::error::check_shape;
use tpu_tensor::{Error, Layout, Result, Storage, Tensor};

use crate::op::OpDef;

mod inplace;

pub(crate) use inplace::{check_write, record_write};

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// True when ops on this thread are recorded for backward.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Turns recording on or off for this thread until the guard is dropped.
pub struct GradModeGuard {
    previous: bool,
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.previous));
    }
}

/// Stops recording ops on this thread until the returned guard is dropped (PyTorch's
/// `torch.no_grad()`).
pub fn no_grad() -> GradModeGuard {
    let previous = GRAD_ENABLED.with(|g| g.replace(false));
    GradModeGuard { previous }
}

/// Turns recording back on inside a `no_grad` scope, until the guard is dropped.
pub fn enable_grad() -> GradModeGuard {
    let previous = GRAD_ENABLED.with(|g| g.replace(true));
    GradModeGuard { previous }
}

/// The gradient accumulator of a leaf tensor.
#[derive(Default)]
pub struct LeafGrad {
    grad: Mutex<Option<Tensor>>,
}

/// What autograd attaches to a tensor.
pub(crate) struct GradMeta {
    /// Set for leaves created by the user with `requires_grad_(true)`.
    leaf: Option<Arc<LeafGrad>>,
    /// Set for tensors produced by a recorded op: the node and the output index.
    grad_fn: Option<(Arc<Node>, usize)>,
    /// For a view: the record its root had when this one was made. An in-place write that
    /// has since given the root a new record makes this one stale (see `inplace.rs`).
    root_seen: Option<Arc<GradMeta>>,
}

/// An edge from a node's input back to what produced it.
#[derive(Clone)]
enum Edge {
    None,
    Leaf(Arc<LeafGrad>),
    Node(Arc<Node>, usize),
}

/// Tensors a backward rule may read: the op's inputs and outputs, detached.
pub struct Saved {
    /// The op's inputs.
    pub inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
    /// The outputs' storage versions when the op ran: reading an output the program has
    /// since written in place is an error, and only reading it (most rules never do).
    output_versions: Vec<u64>,
    /// The op's name, for that error.
    op: &'static str,
    /// Which inputs get a gradient (all, when unknown).
    needs_grad: Vec<bool>,
}

impl Saved {
    /// The inputs and outputs of an op that just ran.
    pub fn new(inputs: Vec<Tensor>, outputs: Vec<Tensor>) -> Saved {
        let output_versions = outputs.iter().map(|t| t.storage().version()).collect();
        Saved {
            inputs,
            outputs,
            output_versions,
            op: "the op",
            needs_grad: Vec::new(),
        }
    }

    /// False when input `i` gets no gradient, so a rule may skip computing it (and reading
    /// what only that gradient needs).
    pub fn needs_grad(&self, i: usize) -> bool {
        self.needs_grad.get(i).copied().unwrap_or(true)
    }

    /// How many outputs the op had.
    pub fn num_outputs(&self) -> usize {
        self.outputs.len()
    }

    /// Output `i`, for rules that read it (`exp`'s gradient is its output): an error when the
    /// program has written it in place since the op ran, as PyTorch's version check.
    pub fn output(&self, i: usize) -> Result<&Tensor> {
        let t = self.outputs.get(i).ok_or_else(|| {
            Error::internal(
                "backward",
                format!("output {i} asked of an op with {}", self.outputs.len()),
            )
        })?;
        let (now, then) = (t.storage().version(), self.output_versions[i]);
        if now != then {
            return Err(modified_in_place(
                &format!("an output of {}", self.op),
                now,
                then,
            ));
        }
        Ok(t)
    }
}

/// The error for a tensor a backward rule needs that was written in place after the op ran.
fn modified_in_place(what: &str, now: u64, then: u64) -> Error {
    Error::invalid_argument(
        "backward",
        format!(
            "{what} was modified by an in-place operation after the op ran (its version is {now}, it was {then}), and the backward needs its old values; clone it before writing to it, or write to it before using it"
        ),
    )
}

/// A recorded op.
pub struct Node {
    op: Arc<dyn OpDef>,
    edges: Vec<Edge>,
    /// Shapes and dtypes of the inputs: gradients are reduced to the shape and cast to the
    /// dtype of the input they belong to.
    input_shapes: Vec<Vec<usize>>,
    input_dtypes: Vec<tpu_tensor::DType>,
    saved: Mutex<Option<Saved>>,
    versions: Vec<(Weak<Storage>, u64)>,
}

/// The record stored on `t`, as it is.
fn raw_meta(t: &Tensor) -> Option<Arc<GradMeta>> {
    t.autograd_meta()
        .and_then(|m| m.downcast::<GradMeta>().ok())
}

/// False when neither `t` nor the root of its views has an autograd record, so [`meta_of`]
/// is `None` (most tensors: the check every op makes of each input, without a lock).
fn may_have_meta(t: &Tensor) -> bool {
    t.has_autograd_meta() || t.view_base().is_some_and(Tensor::has_autograd_meta)
}

/// The record of `t` when it requires a gradient, brought up to date when `t` is a view whose
/// root an in-place write has given a new history since.
fn meta_of(t: &Tensor) -> Option<Arc<GradMeta>> {
    let own = raw_meta(t);
    let Some(root) = t.view_base() else {
        return own;
    };
    let root_meta = raw_meta(root);
    let fresh = match &own {
        // A leaf made of a view stays one.
        Some(m) if m.leaf.is_some() => true,
        Some(m) => match (&m.root_seen, &root_meta) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        },
        None => root_meta.is_none(),
    };
    if fresh {
        own.filter(|m| m.grad_fn.is_some() || m.leaf.is_some())
    } else {
        inplace::view_history(t, root, root_meta)
    }
}

/// The edge to whatever made a tensor with record `m`.
fn edge_of(m: Option<&Arc<GradMeta>>) -> Edge {
    match m {
        None => Edge::None,
        Some(m) => match (&m.grad_fn, &m.leaf) {
            (Some((n, i)), _) => Edge::Node(Arc::clone(n), *i),
            (None, Some(l)) => Edge::Leaf(Arc::clone(l)),
            (None, None) => Edge::None,
        },
    }
}

/// True when `t` requires a gradient (a leaf marked so, or a recorded op's output).
pub fn requires_grad(t: &Tensor) -> bool {
    meta_of(t).is_some()
}

/// Marks a tensor as a leaf that accumulates a gradient (or removes the mark). Only tensors
/// with a float dtype can require gradients, and only leaves can be marked.
pub fn set_requires_grad(t: &Tensor, on: bool) -> Result<()> {
    // Views of this tensor reach autograd through the hook: it must be there before any view
    // is made, whatever the program ran first.
    crate::init();
    if let Some(m) = meta_of(t)
        && m.grad_fn.is_some()
    {
        return Err(Error::invalid_argument(
            "requires_grad_",
            "only leaf tensors can change requires_grad; use detach() to get a leaf",
        ));
    }
    if on {
        if !t.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op: "requires_grad_".into(),
                given: t.dtype().to_string(),
                supported: "f16, bf16, f32, f64 (only floats have gradients)".into(),
            });
        }
        if meta_of(t).is_none() {
            t.set_autograd_meta(Some(Arc::new(GradMeta {
                leaf: Some(Arc::new(LeafGrad::default())),
                grad_fn: None,
                root_seen: t.view_base().and_then(raw_meta),
            })));
        }
    } else {
        t.set_autograd_meta(None);
    }
    Ok(())
}

/// The accumulated gradient of a leaf.
pub fn grad(t: &Tensor) -> Option<Tensor> {
    meta_of(t)?
        .leaf
        .as_ref()?
        .grad
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// Clears the accumulated gradient of a leaf.
pub fn zero_grad(t: &Tensor) {
    if let Some(leaf) = meta_of(t).and_then(|m| m.leaf.clone()) {
        *leaf.grad.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Replaces the accumulated gradient of a leaf (optimizers and clipping use it).
pub fn set_grad(t: &Tensor, g: Option<Tensor>) -> Result<()> {
    let leaf = meta_of(t).and_then(|m| m.leaf.clone()).ok_or_else(|| {
        Error::invalid_argument("set_grad", "the tensor is not a leaf that requires grad")
    })?;
    *leaf.grad.lock().unwrap_or_else(|e| e.into_inner()) = g;
    Ok(())
}

/// True when `t` is a leaf (not produced by a recorded op).
pub fn is_leaf(t: &Tensor) -> bool {
    meta_of(t).is_none_or(|m| m.grad_fn.is_none())
}

/// Records `op` applied to `inputs` producing `outputs`, when grad mode is on and an input
/// requires a gradient. Called by dispatch.
pub(crate) fn record(op: &dyn OpDef, inputs: &[&Tensor], outputs: &[Tensor]) {
    record_with(op, inputs, outputs, true)
}

/// Records `view` as a view of the tracked tensor `base`; `of_elements` places it over the
/// base's elements (see `OpsHook::on_view`), `None` over the base's storage.
pub(crate) fn record_view(base: &Tensor, view: &Tensor, of_elements: Option<&Layout>) {
    if !base.dtype().is_float() {
        return;
    }
    if !is_grad_enabled() {
        // Made under no_grad: the view does not require grad, until an in-place write gives
        // its root a new history.
        if let Some(root) = view.view_base() {
            view.set_autograd_meta(Some(Arc::new(GradMeta {
                leaf: None,
                grad_fn: None,
                root_seen: raw_meta(root),
            })));
        }
        return;
    }
    let op = match of_elements {
        Some(l) => crate::ops::movement::view::ViewOf {
            base: Layout::contiguous(base.shape()),
            view: l.clone(),
        },
        None => crate::ops::movement::view::ViewOf {
            base: base.layout().clone(),
            view: view.layout().clone(),
        },
    };
    // A view's backward needs only the layouts, so in-place changes do not invalidate it.
    record_with(&op, &[base], std::slice::from_ref(view), false);
}

fn record_with(op: &dyn OpDef, inputs: &[&Tensor], outputs: &[Tensor], check_versions: bool) {
    if !is_grad_enabled() || !op.has_backward() || !inputs.iter().any(|t| may_have_meta(t)) {
        return;
    }
    let metas: Vec<Option<Arc<GradMeta>>> = inputs.iter().map(|t| meta_of(t)).collect();
    if metas.iter().all(Option::is_none) {
        return;
    }
    let edges = metas.iter().map(|m| edge_of(m.as_ref())).collect();
    // Outputs are checked when a rule reads them (`Saved::output`).
    let needs_grad: Vec<bool> = metas.iter().map(Option::is_some).collect();
    let versions = if check_versions {
        inputs
            .iter()
            .enumerate()
            .filter(|&(i, _)| op.backward_reads(i, &needs_grad))
            .map(|(_, t)| t.storage())
            .map(|s| (Arc::downgrade(s), s.version()))
            .collect()
    } else {
        Vec::new()
    };
    let node = Arc::new(Node {
        op: op.boxed(),
        edges,
        input_shapes: inputs.iter().map(|t| t.shape().to_vec()).collect(),
        input_dtypes: inputs.iter().map(|t| t.dtype()).collect(),
        saved: Mutex::new(Some(Saved {
            op: op.name(),
            needs_grad,
            ..Saved::new(
                inputs.iter().map(|t| t.detach()).collect(),
                outputs.iter().map(|t| t.detach()).collect(),
            )
        })),
        versions,
    });
    for (i, o) in outputs.iter().enumerate() {
        if o.dtype().is_float() {
            o.set_autograd_meta(Some(Arc::new(GradMeta {
                leaf: None,
                grad_fn: Some((Arc::clone(&node), i)),
                root_seen: o.view_base().and_then(raw_meta),
            })));
        }
    }
}

fn node_key(n: &Arc<Node>) -> usize {
    Arc::as_ptr(n) as usize
}

/// Adds `g` into `slot`.
fn accumulate(slot: &mut Option<Tensor>, g: Tensor) -> Result<()> {
    *slot = Some(match slot.take() {
        None => g,
        Some(prev) => crate::ops::elementwise::binary::binary(
            &prev,
            &g,
            crate::ops::elementwise::binary::BinaryKind::Add,
        )?,
    });
    Ok(())
}

/// Gradients flowing into what `roots` depend on.
struct Run {
    /// Per node, per output: the gradient so far.
    grads: HashMap<usize, Vec<Option<Tensor>>>,
}

/// Nodes reachable from `start`, in reverse topological order (outputs before inputs).
fn order(start: &[Arc<Node>]) -> Vec<Arc<Node>> {
    let mut seen = std::collections::HashSet::new();
    let mut post = Vec::new();
    // Iterative DFS so deep graphs (long training loops) do not overflow the stack.
    let mut stack: Vec<(Arc<Node>, usize)> = start.iter().map(|n| (Arc::clone(n), 0)).collect();
    while let Some((n, i)) = stack.pop() {
        if i == 0 && !seen.insert(node_key(&n)) {
            continue;
        }
        if i < n.edges.len() {
            stack.push((Arc::clone(&n), i + 1));
            if let Edge::Node(m, _) = &n.edges[i]
                && !seen.contains(&node_key(m))
            {
                stack.push((Arc::clone(m), 0));
            }
        } else {
            post.push(n);
        }
    }
    post.reverse();
    post
}

fn check_versions(n: &Node) -> Result<()> {
    for (w, v) in &n.versions {
        if let Some(s) = w.upgrade()
            && s.version() != *v
        {
            return Err(modified_in_place(
                &format!("an input of {}", n.op.name()),
                s.version(),
                *v,
            ));
        }
    }
    Ok(())
}

/// Runs the graph backward from `roots` (each with its incoming gradient). Leaf gradients are
/// passed to `on_leaf`.
fn run_backward(
    roots: Vec<(Arc<Node>, usize, Tensor)>,
    retain_graph: bool,
    mut on_leaf: impl FnMut(&Arc<LeafGrad>, Tensor) -> Result<()>,
) -> Result<()> {
    let _no_grad = no_grad();
    let mut run = Run {
        grads: HashMap::new(),
    };
    let starts: Vec<Arc<Node>> = roots.iter().map(|(n, _, _)| Arc::clone(n)).collect();
    for (n, i, g) in roots {
        let slot = run
            .grads
            .entry(node_key(&n))
            .or_insert_with(|| vec![None; 8.max(i + 1)]);
        if slot.len() <= i {
            slot.resize(i + 1, None);
        }
        accumulate(&mut slot[i], g)?;
    }
    for node in order(&starts) {
        let Some(out_grads) = run.grads.remove(&node_key(&node)) else {
            continue;
        };
        check_versions(&node)?;
        let saved_guard = node.saved.lock().unwrap_or_else(|e| e.into_inner());
        let saved = saved_guard.as_ref().ok_or_else(|| {
            Error::invalid_argument(
                node.op.name(),
                "backward through this part of the graph a second time: its saved tensors were freed; pass retain_graph = true to the first backward",
            )
        })?;
        let n_out = saved.num_outputs();
        let mut g: Vec<Option<Tensor>> = out_grads;
        g.resize(n_out, None);
        g.truncate(n_out);
        let in_grads = node.op.backward(saved, &g)?;
        drop(saved_guard);
        if !retain_graph {
            *node.saved.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        for (k, (edge, ig)) in node.edges.iter().zip(in_grads).enumerate() {
            let Some(ig) = ig else { continue };
            if matches!(edge, Edge::None) {
                continue;
            }
            let mut ig = sum_to_shape(&ig, &node.input_shapes[k])?;
            if ig.dtype() != node.input_dtypes[k] && node.input_dtypes[k].is_float() {
                ig = ig.to_dtype(node.input_dtypes[k])?;
            }
            match edge {
                Edge::None => {}
                Edge::Leaf(l) => on_leaf(l, ig)?,
                Edge::Node(m, i) => {
                    let slot = run
                        .grads
                        .entry(node_key(m))
                        .or_insert_with(|| vec![None; 8.max(i + 1)]);
                    if slot.len() <= *i {
                        slot.resize(i + 1, None);
                    }
                    accumulate(&mut slot[*i], ig)?;
                }
            }
        }
    }
    Ok(())
}

/// Reduces a gradient of a broadcast result to the shape of the input that was broadcast.
pub fn sum_to_shape(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if g.shape() == shape {
        return Ok(g.clone());
    }
    let lead = g.rank().saturating_sub(shape.len());
    let mut dims: Vec<i64> = (0..lead as i64).collect();
    for (i, &s) in shape.iter().enumerate() {
        if s == 1 && g.shape()[lead + i] != 1 {
            dims.push((lead + i) as i64);
        }
    }
    let summed = crate::ops::reduce_sum_dims(g, &dims, true)?;
    summed.reshape(shape)
}

/// Computes gradients of `output` with respect to every leaf it depends on and adds them to
/// the leaves' `.grad` (PyTorch's `backward`). `grad_output` defaults to ones for a scalar
/// output. The graph is freed afterwards unless `retain_graph`.
pub fn backward(output: &Tensor, grad_output: Option<&Tensor>, retain_graph: bool) -> Result<()> {
    let meta = meta_of(output).ok_or_else(|| {
        Error::invalid_argument(
            "backward",
            "the tensor does not require grad: no input of the ops that made it requires grad (or they ran under no_grad)",
        )
    })?;
    let g = match grad_output {
        Some(g) => {
            check_shape("backward", "grad_output", output.shape(), g.shape())?;
            g.clone()
        }
        None => {
            if output.numel() != 1 {
                return Err(Error::shape(
                    "backward",
                    format!(
                        "a gradient can be created implicitly only for outputs with one element, got shape {:?}; pass grad_output",
                        output.shape()
                    ),
                ));
            }
            output.ones_like()?
        }
    };
    match (&meta.grad_fn, &meta.leaf) {
        (Some((n, i)), _) => run_backward(vec![(Arc::clone(n), *i, g)], retain_graph, |leaf, g| {
            let mut slot = leaf.grad.lock().unwrap_or_else(|e| e.into_inner());
            accumulate(&mut slot, g)
        }),
        (None, Some(leaf)) => {
            let mut slot = leaf.grad.lock().unwrap_or_else(|e| e.into_inner());
            accumulate(&mut slot, g)
        }
        (None, None) => Ok(()),
    }
}

/// Gradients of `outputs` (weighted by `grad_outputs`, default ones) with respect to `inputs`,
/// returned rather than accumulated (PyTorch's `torch.autograd.grad`). An input the outputs do
/// not depend on gets `None`.
pub fn grad_of(
    outputs: &[&Tensor],
    inputs: &[&Tensor],
    grad_outputs: Option<&[&Tensor]>,
    retain_graph: bool,
) -> Result<Vec<Option<Tensor>>> {
    let targets: Vec<Option<Arc<LeafGrad>>> = inputs
        .iter()
        .map(|t| meta_of(t).and_then(|m| m.leaf.clone()))
        .collect();
    for (t, tg) in inputs.iter().zip(&targets) {
        if tg.is_none() {
            return Err(Error::invalid_argument(
                "grad",
                format!(
                    "every input must be a leaf that requires grad; one of shape {:?} is not",
                    t.shape()
                ),
            ));
        }
    }
    let mut roots = Vec::new();
    let mut result: Vec<Option<Tensor>> = vec![None; inputs.len()];
    for (k, o) in outputs.iter().enumerate() {
        let g = match grad_outputs {
            Some(gs) => gs[k].clone(),
            None => o.ones_like()?,
        };
        match meta_of(o) {
            Some(m) => match (&m.grad_fn, &m.leaf) {
                (Some((n, i)), _) => roots.push((Arc::clone(n), *i, g)),
                (None, Some(l)) => {
                    for (j, tg) in targets.iter().enumerate() {
                        if tg.as_ref().is_some_and(|t| Arc::ptr_eq(t, l)) {
                            accumulate(&mut result[j], g.clone())?;
                        }
                    }
                }
                _ => {}
            },
            None => {
                return Err(Error::invalid_argument(
                    "grad",
                    "an output does not require grad",
                ));
            }
        }
    }
    run_backward(roots, retain_graph, |leaf, g| {
        for (j, tg) in targets.iter().enumerate() {
            if tg.as_ref().is_some_and(|t| Arc::ptr_eq(t, leaf)) {
                accumulate(&mut result[j], g.clone())?;
            }
        }
        Ok(())
    })?;
    Ok(result)
}

/// Autograd as methods on `Tensor`.
pub trait AutogradOps {
    /// Marks the tensor as a leaf that accumulates a gradient (or unmarks it); returns it, so
    /// `Tensor::randn(..)?.requires_grad_(true)?` reads naturally.
    fn requires_grad_(&self, on: bool) -> Result<Tensor>;
    /// True when the tensor requires a gradient.
    fn requires_grad(&self) -> bool;
    /// True for leaves (tensors not produced by a recorded op).
    fn is_leaf(&self) -> bool;
    /// The accumulated gradient of a leaf.
    fn grad(&self) -> Option<Tensor>;
    /// Clears the accumulated gradient.
    fn zero_grad(&self);
    /// Backpropagates from this one-element tensor into every leaf's `.grad`, freeing the graph.
    fn backward(&self) -> Result<()>;
    /// Backpropagates with an explicit output gradient, optionally keeping the graph for a
    /// second backward.
    fn backward_with(&self, grad_output: Option<&Tensor>, retain_graph: bool) -> Result<()>;
}

impl AutogradOps for Tensor {
    fn requires_grad_(&self, on: bool) -> Result<Tensor> {
        set_requires_grad(self, on)?;
        Ok(self.clone())
    }

    fn requires_grad(&self) -> bool {
        requires_grad(self)
    }

    fn is_leaf(&self) -> bool {
        is_leaf(self)
    }

    fn grad(&self) -> Option<Tensor> {
        grad(self)
    }

    fn zero_grad(&self) {
        zero_grad(self)
    }

    fn backward(&self) -> Result<()> {
        backward(self, None, false)
    }

    fn backward_with(&self, grad_output: Option<&Tensor>, retain_graph: bool) -> Result<()> {
        backward(self, grad_output, retain_graph)
    }
}
