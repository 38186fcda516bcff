//! Views inside a graph. Views do not pass through dispatch (they only change a tensor's
//! layout), so capture meets them as operands whose storage it knows under another layout and
//! records them as [`ViewNode`]s over the value that owns the storage. Writes through views are
//! the op table's [`ViewWrite`].

use tpu_ops::hlo::view::materialize_view;
use tpu_ops::hlo::{FnBuilder, Value};
pub use tpu_ops::ops::movement::view::ViewWrite;
use tpu_ops::ops::movement::view::{ViewOf, inside};
use tpu_ops::tpu_tensor::{Error, Layout, Result, Tensor};
use tpu_ops::{Meta, OpDef};

/// A view of a value: `base` is the layout the value had over its storage when it was
/// recorded, `view` the layout of the view over the same storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewNode {
    /// The viewed value's layout.
    pub base: Layout,
    /// The view's layout.
    pub view: Layout,
}

impl ViewNode {
    /// The view node of `view` over `base`, when every element of the view is an element of
    /// `base` and `base` is dense (so the view can be computed from the value alone, on every
    /// device); `None` otherwise.
    pub fn over(base: &Layout, view: &Layout) -> Option<ViewNode> {
        inside(base, view).then(|| ViewNode {
            base: base.clone(),
            view: view.clone(),
        })
    }
}

impl OpDef for ViewNode {
    fn name(&self) -> &'static str {
        "view"
    }

    fn attrs(&self) -> String {
        format!(
            "shape={:?} strides={:?} offset={}",
            &self.view.shape[..],
            &self.view.strides[..],
            self.view.offset as i64 - self.base.offset as i64
        )
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        match inputs {
            [x] if x.shape[..] == self.base.shape[..] => {
                Ok(vec![Meta::new(&self.view.shape, x.dtype)])
            }
            _ => Err(Error::invalid_argument(
                "view",
                format!(
                    "expected one operand of shape {:?}, got {:?}",
                    &self.base.shape[..],
                    inputs.iter().map(|m| m.shape.to_vec()).collect::<Vec<_>>()
                ),
            )),
        }
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        ViewOf {
            base: self.base.clone(),
            view: self.view.clone(),
        }
        .cpu(inputs, outputs)
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], _outputs: &[Meta]) -> Result<Vec<Value>> {
        // The value is the base's elements in order; the view's positions are relative to
        // the base's first element.
        let numel: usize = self.base.shape.iter().product();
        let flat = b.reshape(&inputs[0], &[numel]);
        let rel = self.view.relative_to(&self.base);
        Ok(vec![materialize_view(b, &flat, &rel, numel)])
    }
}
