//! Views under autograd: a view of a tracked tensor is recorded so gradients flow back to the
//! base through any layout (reshape, transpose, slice, select, expand, as_strided).
//!
//! The backward of a view is [`ViewBackward`]: it adds each gradient element into the position
//! the view element occupies, then reads the base's elements back from those positions. This
//! one rule covers every view; expanded (stride-0) dims of the view sum as they should.
//!
//! Positions are the base's own elements for the view ops (`tpu-tensor` gives the view's
//! layout over them), so a base whose elements share storage (an expanded tensor) gets one
//! gradient per element. `as_strided` addresses storage, as in PyTorch: there the positions
//! are storage positions, and where the base's layout reaches one storage position from
//! several elements, the sum there is divided among them (PyTorch's rule for `as_strided`).

use std::sync::Arc;

use tpu_tensor::strided::Walk;
use tpu_tensor::{DType, Device, Element, Error, Generator, Layout, Result, Tensor};

use crate::autograd::Saved;
use crate::cpu::kernels::{Reader, cpu_device, output};
use crate::hlo::{FnBuilder, TensorType, Value};
use crate::op::{DTypeSet, Meta, OpDef, OpInfo, input_grad};

fn extent(l: &Layout) -> usize {
    Walk::extent(&l.shape, &l.strides, l.offset).unwrap_or(0)
}

/// True unless the layout surely reaches every storage position from at most one element.
/// (Sorting the dims by stride, each stride must pass the reach of all smaller ones; this
/// misses some interleavings that do not overlap, which then only cost a count.)
pub fn may_overlap(l: &Layout) -> bool {
    let mut dims: Vec<(usize, usize)> = l
        .shape
        .iter()
        .zip(&l.strides)
        .filter(|(n, _)| **n > 1)
        .map(|(&n, &s)| (s, n))
        .collect();
    dims.sort_unstable();
    let mut reach = 0usize;
    for (stride, n) in dims {
        if stride <= reach {
            return true;
        }
        reach = match (n - 1)
            .checked_mul(stride)
            .and_then(|r| r.checked_add(reach))
        {
            Some(r) => r,
            None => return true,
        };
    }
    false
}

/// `base` seen through the layout of a view (recorded by autograd, not dispatched).
#[derive(Clone, Debug)]
pub struct ViewOf {
    /// The base tensor's layout.
    pub base: Layout,
    /// The view's layout over the same storage.
    pub view: Layout,
}

impl OpDef for ViewOf {
    fn name(&self) -> &'static str {
        "view"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        Ok(vec![Meta::new(&self.view.shape, inputs[0].dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], _outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let (x, v) = (inputs[0], &self.view);
        if x.layout() == &self.base {
            return Ok(vec![x.as_strided(&v.shape, &v.strides, v.offset)?]);
        }
        if self.base == Layout::contiguous(&self.base.shape) && x.shape() == &self.base.shape[..] {
            // The view is over the base's elements: lay them out densely first.
            let x = x.contiguous()?;
            return Ok(vec![x.as_strided(
                &v.shape,
                &v.strides,
                x.offset() + v.offset,
            )?]);
        }
        Err(Error::internal(
            "view",
            format!(
                "a view recorded over storage layout {:?} replayed on layout {:?}",
                self.base,
                x.layout()
            ),
        ))
    }

    fn lower(
        &self,
        _b: &mut FnBuilder,
        _inputs: &[Value],
        _outputs: &[Meta],
    ) -> Result<Vec<Value>> {
        Err(Error::UnsupportedOp {
            op: "view".into(),
            dtype: String::new(),
            device: "a compiled graph".into(),
            detail: "views are recorded for autograd only; they are not lowered".into(),
        })
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        input_grad(saved, grads, |g, _| {
            let op = ViewBackward {
                base: self.base.clone(),
                view: self.view.clone(),
            };
            crate::exec::dispatch::run1(&op, &[g])
        })
    }
}

/// What running an [`InPlaceWrite`] gives: it is never run.
fn recorded_only() -> Error {
    Error::internal(
        "copy_",
        "an in-place write is recorded for autograd only; copy_ performs it",
    )
}

/// An in-place write, as autograd records it (never dispatched: `copy_` wrote the values).
/// Inputs are the base's value before the write and the written values (of the view's shape);
/// the output is the base after it. Both layouts address the same storage, as [`ViewOf`]'s do.
#[derive(Clone, Debug)]
pub struct InPlaceWrite {
    /// The written tensor's root (the base of its views).
    pub base: Layout,
    /// The written elements' layout.
    pub view: Layout,
}

impl OpDef for InPlaceWrite {
    fn name(&self) -> &'static str {
        "copy_"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        Ok(vec![Meta::new(&self.base.shape, inputs[0].dtype)])
    }

    fn cpu(&self, _inputs: &[&Tensor], _outputs: &[Meta]) -> Result<Vec<Tensor>> {
        Err(recorded_only())
    }

    fn lower(
        &self,
        _b: &mut FnBuilder,
        _inputs: &[Value],
        _outputs: &[Meta],
    ) -> Result<Vec<Value>> {
        Err(recorded_only())
    }

    fn backward_reads(&self, _: usize, _: &[bool]) -> bool {
        false
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The written values get the gradient at the positions they went to; the old base gets
    /// the rest (the overwritten elements' old values no longer matter).
    fn backward(&self, _saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(Some(g)) = grads.first() else {
            return Ok(vec![None, None]);
        };
        if self.base == self.view {
            return Ok(vec![None, Some(g.clone())]);
        }
        let run = |base: &Layout, view: &Layout, t: &Tensor| {
            let op = ViewBackward {
                base: base.clone(),
                view: view.clone(),
            };
            crate::exec::dispatch::run1(&op, &[t])
        };
        // Read the view's positions out of a gradient laid over the base's.
        let g_values = run(&self.view, &self.base, g)?;
        let ones = Tensor::ones(&self.view.shape[..], g.dtype(), g.device())?;
        let written = run(&self.base, &self.view, &ones)?;
        let g_base = crate::ops::movement::MovementOps::masked_fill(
            g,
            &crate::ops::elementwise::methods::TensorOps::ne(&written, 0.0)?,
            0.0,
        )?;
        Ok(vec![Some(g_base), Some(g_values)])
    }
}

/// The gradient of a view with respect to its base: scatter-add into storage positions, then
/// read the base's positions.
#[derive(Clone, Debug)]
pub struct ViewBackward {
    /// The base's layout.
    pub base: Layout,
    /// The view's layout.
    pub view: Layout,
}

impl OpDef for ViewBackward {
    fn name(&self) -> &'static str {
        "view_backward"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let g = &inputs[0];
        if g.shape[..] != self.view.shape[..] {
            return Err(Error::shape(
                "view_backward",
                format!(
                    "expected a gradient of the view's shape {:?}, got {:?}",
                    &self.view.shape[..],
                    &g.shape[..]
                ),
            ));
        }
        if !g.dtype.is_float() {
            return Err(Error::UnsupportedDType {
                op: "view_backward".into(),
                given: g.dtype.to_string(),
                supported: DTypeSet::FLOAT.to_string(),
            });
        }
        Ok(vec![Meta::new(&self.base.shape, g.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let g = inputs[0].contiguous()?;
        let dev = cpu_device("view_backward", &g)?;
        let device = Device::from_cpu(dev);
        let n = extent(&self.base).max(extent(&self.view));
        let r = Reader::new(&[&g]);
        macro_rules! go {
            ($t:ty) => {{
                let src = r.data::<$t>(&g)?;
                let src = &src[g.offset()..g.offset() + g.numel()];
                // Sized by the storage, which may be far larger than the base: checked.
                let mut acc = tpu_tensor::tpu_runtime::memory::try_host_vec(n, 0f64, || {
                    format!("view_backward scratch of {n} f64")
                })?;
                let wv = self.view.walk();
                let (inner, is) = (wv.inner(), wv.inner_stride());
                wv.for_rows(0, wv.rows(), |row, off| {
                    for j in 0..inner {
                        acc[off + j * is] += src[row * inner + j].to_f64();
                    }
                });
                let wb = self.base.walk();
                let (inner, is) = (wb.inner(), wb.inner_stride());
                if may_overlap(&self.base) {
                    let mut count = vec![0u32; n];
                    wb.for_rows(0, wb.rows(), |_, off| {
                        for j in 0..inner {
                            count[off + j * is] += 1;
                        }
                    });
                    for (a, &c) in acc.iter_mut().zip(&count) {
                        if c > 1 {
                            *a /= c as f64;
                        }
                    }
                }
                output::<$t>(&outputs[0], &device, |out| {
                    wb.for_rows(0, wb.rows(), |row, off| {
                        for j in 0..inner {
                            out[row * inner + j] = <$t>::from_f64(acc[off + j * is]);
                        }
                    });
                    Ok(())
                })?
            }};
        }
        let t = match g.dtype() {
            DType::F32 => go!(f32),
            DType::F64 => go!(f64),
            DType::F16 => go!(tpu_tensor::f16),
            DType::BF16 => go!(tpu_tensor::bf16),
            d => {
                return Err(Error::UnsupportedDType {
                    op: "view_backward".into(),
                    given: d.to_string(),
                    supported: DTypeSet::FLOAT.to_string(),
                });
            }
        };
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let g = &inputs[0];
        let out_dtype = outputs[0].dtype;
        let comp = crate::op::promote::compute_dtype(out_dtype);
        let n = extent(&self.base).max(extent(&self.view));
        let numel: usize = self.view.shape.iter().product();
        let base_numel: usize = self.base.shape.iter().product();
        if numel == 0 || base_numel == 0 || n == 0 {
            return Ok(vec![
                b.splat(TensorType::new(&self.base.shape, out_dtype), 0),
            ]);
        }
        let g = b.convert(g, comp);
        let updates = b.reshape(&g, &[numel]);
        let zeros = b.splat(TensorType::new(&[n], comp), 0);
        let idx = crate::hlo::view::layout_offsets(b, &self.view);
        let idx = b.reshape(&idx, &[numel, 1]);
        let region = b.region(&[TensorType::scalar(comp)], 2, |b, a| {
            vec![b.ew("stablehlo.add", &[&a[0], &a[1]])]
        });
        let attrs = "indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false";
        let acc = b
            .op_n(
                "stablehlo.scatter",
                &[&zeros, &idx, &updates],
                attrs,
                &region,
                &[TensorType::new(&[n], comp)],
            )
            .remove(0);
        let bidx = crate::hlo::view::layout_offsets(b, &self.base);
        let rank = self.base.shape.len();
        let mut bshape: Vec<usize> = self.base.shape.to_vec();
        bshape.push(1);
        let bidx = b.reshape(&bidx, &bshape);
        let acc = if may_overlap(&self.base) {
            let ones = b.splat(TensorType::new(&self.base.shape, comp), 1);
            let count = b
                .op_n(
                    "stablehlo.scatter",
                    &[&zeros, &bidx, &ones],
                    &format!("indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = {rank}>, unique_indices = false"),
                    &region,
                    &[TensorType::new(&[n], comp)],
                )
                .remove(0);
            // Positions no base element reads stay 0 / 0 and are never gathered.
            b.ew("stablehlo.divide", &[&acc, &count])
        } else {
            acc
        };
        let attrs = format!(
            "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = {rank}>, slice_sizes = array<i64: 1>, indices_are_sorted = false"
        );
        let out = b.op(
            "stablehlo.gather",
            &[&acc, &bidx],
            &attrs,
            TensorType::new(&self.base.shape, comp),
        );
        Ok(vec![b.convert(&out, out_dtype)])
    }
}

/// True when `base` is dense and every element of `view` (a layout over the same storage) is
/// one of its elements.
pub fn inside(base: &Layout, view: &Layout) -> bool {
    if !base.is_contiguous() {
        return false;
    }
    let numel: usize = view.shape.iter().product();
    if numel == 0 {
        return true;
    }
    let end = base.offset + base.shape.iter().product::<usize>();
    match Walk::extent(&view.shape, &view.strides, view.offset) {
        Some(reach) => view.offset >= base.offset && reach <= end,
        None => false,
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
        inside(base, view).then(|| ViewWrite {
            base: base.clone(),
            view: view.clone(),
        })
    }

    /// The view's layout relative to the region's first element.
    fn relative(&self) -> Layout {
        self.view.relative_to(&self.base)
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
        let idx = crate::hlo::view::layout_offsets(b, &self.relative());
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

/// The rows of the op table for the view gradient and the write through a view.
pub fn table() -> Vec<OpInfo> {
    vec![
        view_write_row(),
        OpInfo {
            name: "view_backward",
            cpu: DTypeSet::FLOAT,
            hlo: DTypeSet::FLOAT,
            sample: Arc::new(|d, dev| {
                // The base is a transposed [3, 4]; the view expands a slice of it.
                let base = Layout::strided(&[4, 3], &[1, 4], 0);
                let view = Layout::strided(&[2, 2, 3], &[0, 4, 1], 1);
                let g = Generator::new(2)
                    .randn([2, 2, 3], DType::F64, &Device::cpu())?
                    .to_dtype(d)?
                    .to_device(dev)?;
                Ok(vec![crate::exec::dispatch::run1(
                    &ViewBackward { base, view },
                    &[&g],
                )?])
            }),
            tolerance: 1e-6,
        },
    ]
}

fn view_write_row() -> OpInfo {
    OpInfo {
        name: "view_write",
        cpu: DTypeSet::ALL,
        hlo: DTypeSet::ALL,
        sample: Arc::new(|d, dev| {
            // A [3, 4] region at offset 2 of its storage; the view is the transpose of its
            // last two columns.
            let base = Layout::strided(&[3, 4], &[4, 1], 2);
            let view = Layout::strided(&[2, 3], &[1, 4], 4);
            // Values scaled by 4 so integer dtypes get distinct values too.
            let mut g = Generator::new(3);
            let region = crate::op::samples::randn_affine(&mut g, &[3, 4], 4.0, 0.0, d, dev)?;
            let values = crate::op::samples::randn_affine(&mut g, &[2, 3], 4.0, 0.0, d, dev)?;
            Ok(vec![crate::exec::dispatch::run1(
                &ViewWrite { base, view },
                &[&region, &values],
            )?])
        }),
        tolerance: 0.0,
    }
}
