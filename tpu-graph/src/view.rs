//! Views inside a graph. Views do not pass through dispatch (they only change a tensor's
//! layout), so capture meets them as operands whose storage it knows under another layout and
//! records them as [`ViewNode`]s over the value that owns the storage.

use tpu_ops::hlo::view::{layout_offsets, materialize_view};
use tpu_ops::hlo::{FnBuilder, TensorType, Value};
use tpu_ops::ops::movement::view::ViewOf;
use tpu_ops::tpu_tensor::strided::Walk;
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
        if !base.is_contiguous() {
            return None;
        }
        let numel: usize = view.shape.iter().product();
        let end = base.offset + base.shape.iter().product::<usize>();
        if numel > 0 {
            let reach = Walk::extent(&view.shape, &view.strides, view.offset)?;
            if view.offset < base.offset || reach > end {
                return None;
            }
        }
        Some(ViewNode {
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
        let rel = Layout {
            shape: self.view.shape.clone(),
            strides: self.view.strides.clone(),
            offset: self.view.offset - self.base.offset,
        };
        Ok(vec![materialize_view(b, &flat, &rel, numel)])
    }
}

/// A write through a view: the value of a storage region after `copy_` wrote the view's
/// elements. Inputs are the region's value before the write (of `base`'s shape) and the
/// written values (of the view's shape); the output is the region's value after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewWrite {
    /// The region's layout over its storage (dense).
    pub base: Layout,
    /// The written view's layout over the same storage.
    pub view: Layout,
}

impl ViewWrite {
    /// The write of `view` into the dense region `base`, when the view lies inside it.
    pub fn over(base: &Layout, view: &Layout) -> Option<ViewWrite> {
        ViewNode::over(base, view).map(|v| ViewWrite {
            base: v.base,
            view: v.view,
        })
    }

    /// The view's layout relative to the region's first element.
    fn relative(&self) -> Layout {
        Layout {
            shape: self.view.shape.clone(),
            strides: self.view.strides.clone(),
            offset: self.view.offset - self.base.offset,
        }
    }
}

impl OpDef for ViewWrite {
    fn name(&self) -> &'static str {
        "view_write"
    }

    fn attrs(&self) -> String {
        let rel = self.relative();
        format!(
            "shape={:?} strides={:?} offset={}",
            &rel.shape[..],
            &rel.strides[..],
            rel.offset
        )
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        match inputs {
            [x, v]
                if x.shape[..] == self.base.shape[..]
                    && v.shape[..] == self.view.shape[..]
                    && x.dtype == v.dtype =>
            {
                Ok(vec![Meta::new(&self.base.shape, x.dtype)])
            }
            _ => Err(Error::invalid_argument(
                "view_write",
                format!(
                    "expected a region of shape {:?} and values of shape {:?} of one dtype, got {}",
                    &self.base.shape[..],
                    &self.view.shape[..],
                    inputs
                        .iter()
                        .map(|m| format!("{}{:?}", m.dtype, &m.shape[..]))
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            )),
        }
    }

    fn cpu(&self, inputs: &[&Tensor], _outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let out = inputs[0].copy_untracked()?;
        Tensor::from_storage(out.storage().clone(), self.relative())?.copy_(inputs[1])?;
        Ok(vec![out])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], _outputs: &[Meta]) -> Result<Vec<Value>> {
        let numel: usize = self.base.shape.iter().product();
        let n: usize = self.view.shape.iter().product();
        if n == 0 || numel == 0 {
            return Ok(vec![inputs[0].clone()]);
        }
        let flat = b.reshape(&inputs[0], &[numel]);
        let updates = b.reshape(&inputs[1], &[n]);
        let idx = layout_offsets(b, &self.relative());
        let idx = b.reshape(&idx, &[n, 1]);
        let dtype = inputs[0].dtype();
        // The written value replaces the old one.
        let region = b.region(&[TensorType::scalar(dtype)], 2, |_, a| vec![a[1].clone()]);
        let attrs = "indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false";
        let out = b
            .op_n(
                "stablehlo.scatter",
                &[&flat, &idx, &updates],
                attrs,
                &region,
                &[TensorType::new(&[numel], dtype)],
            )
            .remove(0);
        Ok(vec![b.reshape(&out, &self.base.shape)])
    }
}
