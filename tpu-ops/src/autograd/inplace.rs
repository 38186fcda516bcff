//! Autograd across in-place writes.
//!
//! Every in-place change of a tensor's elements goes through `Tensor::copy_` (the in-place
//! methods compute their result out of place and copy it in), and `copy_` calls
//! [`check_write`] before writing and [`record_write`] after. The new values get a history:
//! an [`InPlaceWrite`] node over the *root* of the written tensor (the tensor a chain of views
//! starts from), whose inputs are the root's old history and the written values. A view keeps
//! the root record it was made from; once the root has a newer one, the view's history is
//! made again from it ([`view_history`]) the next time autograd reads it, as PyTorch
//! regenerates the `grad_fn` of views after an in-place change of their base.

use std::sync::{Arc, Mutex};

use tpu_tensor::{Error, Result, Tensor};

use super::{GradMeta, Node, Saved, edge_of, is_grad_enabled, meta_of, record_with};
use crate::op::BoxedOp;
use crate::ops::movement::view::{InPlaceWrite, ViewOf, may_overlap};

/// `view`'s history as a view of `root` whose current record is `root_meta`, stored on the
/// view. Built whatever the grad mode: it restores what the view is, it does not record a
/// new op.
pub(super) fn view_history(
    view: &Tensor,
    root: &Tensor,
    root_meta: Option<Arc<GradMeta>>,
) -> Option<Arc<GradMeta>> {
    let meta = match root_meta.filter(|m| m.grad_fn.is_some() || m.leaf.is_some()) {
        Some(rm) if view.dtype().is_float() => {
            let op = ViewOf {
                base: root.layout().clone(),
                view: view.layout().clone(),
            };
            let node = Arc::new(Node {
                op: op.boxed(),
                edges: vec![edge_of(Some(&rm))],
                input_shapes: vec![root.shape().to_vec()],
                input_dtypes: vec![root.dtype()],
                saved: Mutex::new(Some(Saved::new(vec![root.detach()], vec![view.detach()]))),
                // A view's backward reads layouts only.
                versions: Vec::new(),
            });
            Some(Arc::new(GradMeta {
                leaf: None,
                grad_fn: Some((node, 0)),
                root_seen: Some(rm),
            }))
        }
        _ => None,
    };
    view.set_autograd_meta(
        meta.clone()
            .map(|m| m as Arc<dyn std::any::Any + Send + Sync>),
    );
    meta
}

/// Refuses, with grad mode on, writes autograd could not follow: into a leaf that requires
/// grad (or a view of one), of values that require grad from another device, and through
/// layouts where several elements share a memory location while a gradient is involved.
/// `src` is the source as given to `copy_`.
pub(crate) fn check_write(dst: &Tensor, src: &Tensor) -> Result<()> {
    if !is_grad_enabled() {
        return Ok(());
    }
    let root = dst.view_base().unwrap_or(dst);
    let root_meta = meta_of(root);
    if let Some(m) = &root_meta
        && m.grad_fn.is_none()
    {
        let what = if dst.view_base().is_some() {
            "a view of a leaf tensor that requires grad"
        } else {
            "a leaf tensor that requires grad"
        };
        return Err(Error::invalid_argument(
            "in-place write",
            format!(
                "{what} cannot be written in place while grad mode is on (its gradient would lose the values it was computed from); write it under no_grad, as optimizers do, or write into a clone"
            ),
        ));
    }
    let src_tracked = meta_of(src).is_some();
    if src_tracked && src.device() != dst.device() {
        // Moving a tensor between devices is not an op autograd records (yet): the gradient
        // would silently stop here.
        return Err(Error::invalid_argument(
            "in-place write",
            format!(
                "the written values require grad and live on {}, the tensor written on {}; a copy between devices does not carry gradients: move the values first under no_grad, or compute them on {}",
                src.device(),
                dst.device(),
                dst.device()
            ),
        ));
    }
    let involved = root_meta.is_some() || src_tracked;
    if involved
        && dst.dtype().is_float()
        && (may_overlap(dst.layout()) || may_overlap(root.layout()))
    {
        return Err(Error::invalid_argument(
            "in-place write",
            format!(
                "more than one element of the written tensor (shape {:?}, strides {:?}) refers to the same memory location, so its gradient is not defined; clone it before writing",
                dst.shape(),
                dst.strides()
            ),
        ));
    }
    Ok(())
}

/// After `src` (of `dst`'s shape and dtype) was written into `dst`: the root of `dst` gets an
/// [`InPlaceWrite`] node, so gradients of the new values reach `src`'s history and, outside
/// the written elements, the root's old one.
pub(crate) fn record_write(dst: &Tensor, src: &Tensor) {
    if !is_grad_enabled() || !dst.dtype().is_float() {
        return;
    }
    let root = dst.view_base().unwrap_or(dst);
    let op = InPlaceWrite {
        base: root.layout().clone(),
        view: dst.layout().clone(),
    };
    // The node's only output is the root itself: the write already made its values.
    record_with(&op, &[root, src], std::slice::from_ref(root), false);
}
