//! The `Tensor` handle: creation, inspection and reading back.

use std::sync::Arc;

use tpu_runtime::error::{check_rank, fmt_shape};
use tpu_runtime::{Buffer, DType, Device, Element, Error, Result, with_element};

use crate::scalar::Scalar;
use crate::shape::{
    Dim, Dims, IntoShape, checked_numel, contiguous_strides, exact_shape, resolve_dim,
};
use crate::storage::Storage;
use crate::strided::Walk;

/// Where a view sits in its storage: sizes, strides and offset, all in elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Size of each dim.
    pub shape: Dims,
    /// Storage distance between neighbours along each dim (0 for broadcast dims).
    pub strides: Dims,
    /// Storage index of the first element.
    pub offset: usize,
}

impl Layout {
    /// A dense row-major layout at offset 0.
    #[inline]
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout {
            shape: shape.into(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// A layout from its parts (sizes, strides and offset, in elements).
    pub fn strided(shape: &[usize], strides: &[usize], offset: usize) -> Layout {
        Layout {
            shape: shape.into(),
            strides: strides.into(),
            offset,
        }
    }

    /// This layout with its offset counted from `base`'s first element instead of the
    /// storage's (a view of a region, as seen by a program given only the region).
    pub fn relative_to(&self, base: &Layout) -> Layout {
        Layout {
            offset: self.offset - base.offset,
            ..self.clone()
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when the elements are dense and in row-major order (the offset may be non-zero).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// A plan for walking this layout in row-major order.
    pub fn walk(&self) -> Walk {
        Walk::new(&self.shape, &self.strides, self.offset)
    }
}

pub(crate) struct Inner {
    pub(crate) storage: Arc<Storage>,
    pub(crate) layout: Layout,
    /// Autograd's record for this tensor (owned by the op library, opaque here).
    pub(crate) autograd: std::sync::RwLock<Option<Arc<dyn std::any::Any + Send + Sync>>>,
    /// Whether `autograd` holds a record: every op asks of each input, most tensors have none,
    /// and a flag read costs far less than taking the lock.
    pub(crate) has_autograd: std::sync::atomic::AtomicBool,
    /// For a view: the tensor at the root of its chain of views (PyTorch's `_base`), so that a
    /// write through the view can reach the root's autograd history.
    pub(crate) base: Option<Tensor>,
}

/// An n-dimensional array on a device.
///
/// A `Tensor` is a cheap handle (`Clone` copies a pointer) and is `Send + Sync`. Views (reshape,
/// transpose, slicing, ...) share storage with the tensor they come from.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) inner: Arc<Inner>,
}

impl Drop for Tensor {
    #[inline]
    fn drop(&mut self) {
        // The last handle of a small CPU tensor may be kept whole for reuse.
        if Arc::strong_count(&self.inner) == 1 {
            crate::recycle::offer(self);
        }
    }
}

/// Nested arrays and vectors that [`Tensor::new`] accepts: `3.0f32`, `[1, 2]`, `[[1., 2.], [3., 4.]]`.
pub trait TensorData {
    /// The element type.
    type Elem: Element;
    /// The shape of the data.
    fn shape(&self) -> Dims;
    /// Appends the elements in row-major order.
    fn flatten_into(&self, out: &mut Vec<Self::Elem>);
}

macro_rules! tensor_data_impl {
    ($($t:ty),*) => {$(
        impl TensorData for $t {
            type Elem = $t;
            fn shape(&self) -> Dims {
                Dims::new()
            }
            fn flatten_into(&self, out: &mut Vec<$t>) {
                out.push(*self);
            }
        }
        impl TensorData for Vec<$t> {
            type Elem = $t;
            fn shape(&self) -> Dims {
                Dims::from_elem(self.len(), 1)
            }
            fn flatten_into(&self, out: &mut Vec<$t>) {
                out.extend_from_slice(self);
            }
        }
        impl TensorData for &[$t] {
            type Elem = $t;
            fn shape(&self) -> Dims {
                Dims::from_elem(self.len(), 1)
            }
            fn flatten_into(&self, out: &mut Vec<$t>) {
                out.extend_from_slice(self);
            }
        }
    )*};
}
tensor_data_impl!(
    bool,
    u8,
    i8,
    i32,
    i64,
    f32,
    f64,
    tpu_runtime::f16,
    tpu_runtime::bf16
);

impl<D: TensorData, const N: usize> TensorData for [D; N] {
    type Elem = D::Elem;
    fn shape(&self) -> Dims {
        let mut s = Dims::new();
        s.push(N);
        if let Some(first) = self.first() {
            s.extend(first.shape());
        }
        s
    }
    fn flatten_into(&self, out: &mut Vec<D::Elem>) {
        for d in self {
            d.flatten_into(out);
        }
    }
}

impl Tensor {
    // ---- construction from parts -------------------------------------------------------------

    /// A tensor viewing `storage` through `layout`; fails if the view reaches past the storage.
    pub fn from_storage(storage: Arc<Storage>, layout: Layout) -> Result<Tensor> {
        if layout.shape.len() != layout.strides.len() {
            return Err(Error::shape(
                "from_storage",
                format!(
                    "shape {} and strides {:?} differ in rank",
                    fmt_shape(&layout.shape),
                    &layout.strides[..]
                ),
            ));
        }
        // A stride-0 view may cost nothing, but its element count must still be a number.
        checked_numel("from_storage", &layout.shape)?;
        let extent = Walk::extent(&layout.shape, &layout.strides, layout.offset);
        match extent {
            Some(e) if e <= storage.numel() => {}
            _ => {
                return Err(Error::shape(
                    "from_storage",
                    format!(
                        "a view of shape {}, strides {:?}, offset {} reaches past a storage of {} elements",
                        fmt_shape(&layout.shape),
                        &layout.strides[..],
                        layout.offset,
                        storage.numel()
                    ),
                ));
            }
        }
        Ok(Tensor::from_parts(storage, layout))
    }

    #[inline]
    pub(crate) fn from_parts(storage: Arc<Storage>, layout: Layout) -> Tensor {
        Tensor::from_parts_of(storage, layout, None)
    }

    /// [`Tensor::from_parts`] for a view whose root is `base`.
    #[inline]
    fn from_parts_of(storage: Arc<Storage>, mut layout: Layout, base: Option<Tensor>) -> Tensor {
        // Slicing past the end gives an empty view whose offset may lie past the storage (as in
        // PyTorch); nothing reads it, so keep it inside, where every kernel's bounds hold.
        if layout.shape.contains(&0) {
            layout.offset = layout.offset.min(storage.numel());
        }
        Tensor {
            inner: Arc::new(Inner {
                storage,
                layout,
                autograd: std::sync::RwLock::new(None),
                has_autograd: std::sync::atomic::AtomicBool::new(false),
                base,
            }),
        }
    }

    /// A dense tensor owning `buffer`, shaped as the buffer's dims.
    #[inline]
    pub fn from_buffer(buffer: Buffer) -> Tensor {
        let layout = Layout::contiguous(buffer.dims());
        Tensor::from_parts(Storage::new(buffer), layout)
    }

    /// A view of this tensor made by `f`, which maps a layout to the view's layout (view ops
    /// call it). When autograd tracks this tensor, `f` is also applied to the dense layout of
    /// its shape: that places the view over the tensor's elements rather than over storage, so
    /// the backward is right even when several elements share storage (an expanded tensor).
    pub(crate) fn derive(&self, f: impl Fn(&Layout) -> Result<Layout>) -> Result<Tensor> {
        let view = self.view_with(f(self.layout())?);
        if self.tracked() {
            let of_elements = f(&Layout::contiguous(self.shape()))?;
            self.note_view(&view, Some(&of_elements));
        }
        Ok(view)
    }

    /// [`Tensor::derive`] for layout maps that cannot fail.
    pub(crate) fn derive_infallible(&self, f: impl Fn(&Layout) -> Layout) -> Tensor {
        let view = self.view_with(f(self.layout()));
        if self.tracked() {
            let of_elements = f(&Layout::contiguous(self.shape()));
            self.note_view(&view, Some(&of_elements));
        }
        view
    }

    /// A view of this tensor's storage through `layout` (already checked to fit), linked to the
    /// root of this tensor's chain of views.
    pub(crate) fn view_with(&self, layout: Layout) -> Tensor {
        let root = self.view_base().unwrap_or(self).clone();
        Tensor::from_parts_of(Arc::clone(&self.inner.storage), layout, Some(root))
    }

    /// For a view (reshape, slice, transpose, `as_strided` ...): the tensor at the root of its
    /// chain of views, which owns the elements (PyTorch's `_base`). `None` for a tensor that is
    /// not a view; `detach` gives a handle that is not one.
    pub fn view_base(&self) -> Option<&Tensor> {
        self.inner.base.as_ref()
    }

    /// Lets autograd (in the op library) record `view` as a view of `self` when `self` takes part
    /// in a gradient computation, so gradients flow through reshapes, transposes and slices.
    /// `of_elements` is the view's layout over this tensor's elements in row-major order; `None`
    /// means the view addresses the storage directly (`as_strided`).
    pub(crate) fn note_view(&self, view: &Tensor, of_elements: Option<&Layout>) {
        if self.tracked()
            && let Some(h) = crate::ops_hook::ops_hook()
        {
            h.on_view(self, view, of_elements);
        }
    }

    // ---- inspection --------------------------------------------------------------------------

    /// Sizes of the dims.
    pub fn shape(&self) -> &[usize] {
        &self.inner.layout.shape
    }

    /// Size of one dim (negative dims count from the end).
    pub fn size(&self, dim: impl Dim) -> Result<usize> {
        let d = resolve_dim("size", dim, self.shape())?;
        Ok(self.shape()[d])
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.inner.layout.strides
    }

    /// Storage offset in elements.
    pub fn offset(&self) -> usize {
        self.inner.layout.offset
    }

    /// The view's layout.
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    /// Number of dims (PyTorch's name).
    pub fn dim(&self) -> usize {
        self.rank()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.inner.layout.numel()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.inner.storage.dtype()
    }

    /// The device holding the data.
    pub fn device(&self) -> &Device {
        self.inner.storage.device()
    }

    /// The shared storage.
    pub fn storage(&self) -> &Arc<Storage> {
        &self.inner.storage
    }

    /// True when the elements are dense and in row-major order.
    pub fn is_contiguous(&self) -> bool {
        self.inner.layout.is_contiguous()
    }

    /// True when both tensors view the same storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.inner.storage, &other.inner.storage)
    }

    /// The autograd record attached to this tensor, if any (used by the op library).
    #[inline]
    pub fn autograd_meta(&self) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        if !self.has_autograd_meta() {
            return None;
        }
        self.inner
            .autograd
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Attaches (or with `None` removes) the autograd record; every clone of this handle sees it.
    pub fn set_autograd_meta(&self, meta: Option<Arc<dyn std::any::Any + Send + Sync>>) {
        let mut slot = self
            .inner
            .autograd
            .write()
            .unwrap_or_else(|e| e.into_inner());
        // Set under the lock, so the flag and the record change together for every writer;
        // a reader that sees the flag then takes the lock and sees the record.
        self.inner
            .has_autograd
            .store(meta.is_some(), std::sync::atomic::Ordering::Release);
        *slot = meta;
    }

    /// True when an autograd record is attached ([`Tensor::autograd_meta`] without the lock).
    #[inline]
    pub fn has_autograd_meta(&self) -> bool {
        self.inner
            .has_autograd
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// A new handle to the same data with no autograd record (PyTorch's `detach`).
    pub fn detach(&self) -> Tensor {
        Tensor::from_parts(Arc::clone(&self.inner.storage), self.inner.layout.clone())
    }

    /// True when both handles are the same tensor (not merely equal values).
    pub fn is_same(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// True when this handle is the only way to its elements: no clone of it and no other
    /// tensor over its storage exists, so nothing else can write them (a graph may then take
    /// them for constants).
    pub fn is_sole_handle(&self) -> bool {
        Arc::strong_count(&self.inner) == 1
            && Arc::weak_count(&self.inner) == 0
            && Arc::strong_count(&self.inner.storage) == 1
            && Arc::weak_count(&self.inner.storage) == 0
    }

    // ---- creation ----------------------------------------------------------------------------

    /// Allocates a dense tensor and fills it through `fill`, which receives the elements in
    /// row-major order. On the CPU the elements are written in place; elsewhere they are built in
    /// host memory and uploaded.
    pub fn from_fn_typed<T: Element>(
        shape: &[usize],
        device: &Device,
        fill: impl FnOnce(&mut [T]) -> Result<()>,
    ) -> Result<Tensor> {
        let numel = checked_numel("create", shape)?;
        let fill = match device.is_cpu() {
            true => match from_kept(device, shape, numel, true, fill) {
                Ok(made) => return made,
                Err(fill) => fill,
            },
            false => fill,
        };
        let buffer = if device.is_cpu() {
            let mut b = Buffer::zeroed(device, T::DTYPE, shape)?;
            fill_cpu_buffer(&mut b, fill)?;
            b
        } else {
            let mut host = staging::<T>(device, shape, numel)?;
            fill(&mut host)?;
            Buffer::from_bytes(device, T::DTYPE, shape, tpu_runtime::dtype::as_bytes(&host))?
        };
        Ok(Tensor::from_buffer(buffer))
    }

    /// Like [`Tensor::from_fn_typed`], but on the CPU the buffer handed to `fill` holds
    /// unspecified old values (reused memory) instead of zeros: `fill` must write every element.
    /// This skips a pass over memory for outputs that are computed element by element.
    pub fn from_fn_overwrite<T: Element>(
        shape: &[usize],
        device: &Device,
        fill: impl FnOnce(&mut [T]) -> Result<()>,
    ) -> Result<Tensor> {
        // Bools must hold 0 or 1 even before they are written, so they start zeroed.
        if !device.is_cpu() || T::DTYPE == DType::Bool {
            return Tensor::from_fn_typed(shape, device, fill);
        }
        let numel = checked_numel("create", shape)?;
        let fill = match from_kept(device, shape, numel, false, fill) {
            Ok(made) => return made,
            Err(fill) => fill,
        };
        let mut b = Buffer::for_overwrite(device, T::DTYPE, shape)?;
        fill_cpu_buffer(&mut b, fill)?;
        Ok(Tensor::from_buffer(b))
    }

    /// A tensor from nested arrays: `Tensor::new([[1f32, 2.], [3., 4.]], &device)`.
    pub fn new<D: TensorData>(data: D, device: &Device) -> Result<Tensor> {
        let shape = data.shape();
        let mut flat = Vec::with_capacity(shape.iter().product());
        data.flatten_into(&mut flat);
        Tensor::from_slice(&flat, &shape[..], device)
    }

    /// A tensor from a vector and a shape; the lengths must agree.
    pub fn from_vec<T: Element>(
        data: Vec<T>,
        shape: impl IntoShape,
        device: &Device,
    ) -> Result<Tensor> {
        Tensor::from_slice(&data, shape, device)
    }

    /// A tensor from a slice and a shape; the lengths must agree.
    pub fn from_slice<T: Element>(
        data: &[T],
        shape: impl IntoShape,
        device: &Device,
    ) -> Result<Tensor> {
        let shape = exact_shape("from_slice", shape)?;
        let numel: usize = shape.iter().product();
        if numel != data.len() {
            return Err(Error::LengthMismatch {
                context: format!("creating a tensor of shape {}", fmt_shape(&shape)),
                unit: "elements",
                expected: numel,
                given: data.len(),
            });
        }
        if !device.is_cpu() {
            let buffer =
                Buffer::from_bytes(device, T::DTYPE, &shape, tpu_runtime::dtype::as_bytes(data))?;
            return Ok(Tensor::from_buffer(buffer));
        }
        Tensor::from_fn_overwrite::<T>(&shape, device, |out| {
            out.copy_from_slice(data);
            Ok(())
        })
    }

    /// A zero-dimensional tensor holding `value`.
    pub fn scalar<T: Element>(value: T, device: &Device) -> Result<Tensor> {
        Tensor::from_slice(&[value], [0usize; 0], device)
    }

    /// A tensor of zeros.
    pub fn zeros(shape: impl IntoShape, dtype: DType, device: &Device) -> Result<Tensor> {
        let shape = exact_shape("zeros", shape)?;
        if device.is_cpu() {
            // Fresh CPU buffers are already zero.
            return Ok(Tensor::from_buffer(Buffer::zeroed(device, dtype, &shape)?));
        }
        Tensor::full(&shape[..], 0, dtype, device)
    }

    /// A tensor of ones.
    pub fn ones(shape: impl IntoShape, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 1, dtype, device)
    }

    /// A tensor with every element equal to `value` (converted with PyTorch's casting rules).
    pub fn full(
        shape: impl IntoShape,
        value: impl Into<Scalar>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let shape = exact_shape("full", shape)?;
        let value = value.into();
        value.check_fits("full", dtype, false)?;
        with_element!(dtype, T, {
            let v: T = value.to_element();
            Tensor::from_fn_overwrite::<T>(&shape, device, |out| {
                out.fill(v);
                Ok(())
            })
        })
    }

    /// Zeros with this tensor's shape, dtype and device.
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.shape(), self.dtype(), self.device())
    }

    /// Ones with this tensor's shape, dtype and device.
    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::ones(self.shape(), self.dtype(), self.device())
    }

    /// `value` everywhere, with this tensor's shape, dtype and device.
    pub fn full_like(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        Tensor::full(self.shape(), value, self.dtype(), self.device())
    }

    /// Values from `start` up to (not including) `end`, `step` apart, as PyTorch's `arange`.
    pub fn arange(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        step: impl Into<Scalar>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let (start, end, step) = (start.into(), end.into(), step.into());
        let exact_ints =
            !dtype.is_float() && !start.is_float() && !end.is_float() && !step.is_float();
        let (s, e, st) = (start.to_f64(), end.to_f64(), step.to_f64());
        if !(s.is_finite() && e.is_finite() && st.is_finite()) {
            return Err(Error::invalid_argument(
                "arange",
                format!("expected finite start, end and step, got {start}, {end}, {step}"),
            ));
        }
        if st == 0.0 {
            return Err(Error::invalid_argument(
                "arange",
                "step must be non-zero, got 0",
            ));
        }
        if (st > 0.0 && e < s) || (st < 0.0 && e > s) {
            return Err(Error::invalid_argument(
                "arange",
                format!("end {end} cannot be reached from start {start} with step {step}"),
            ));
        }
        let n = if exact_ints {
            let (s, e, st) = (
                start.to_i64() as i128,
                end.to_i64() as i128,
                step.to_i64() as i128,
            );
            ((e - s).abs() + st.abs() - 1) / st.abs()
        } else {
            ((e - s) / st).ceil() as i128
        };
        if n < 0 || n > isize::MAX as i128 {
            return Err(Error::invalid_argument(
                "arange",
                format!("{n} elements are more than a tensor can hold"),
            ));
        }
        let n = n as usize;
        with_element!(dtype, T, {
            Tensor::from_fn_overwrite::<T>(&[n], device, |out| {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = if exact_ints {
                        // Every value lies between start and end, but `i * step` alone may
                        // not fit an i64 when start is negative: two's complement sums it right.
                        T::from_i64(
                            start
                                .to_i64()
                                .wrapping_add((i as i64).wrapping_mul(step.to_i64())),
                        )
                    } else {
                        T::from_f64(s + i as f64 * st)
                    };
                }
                Ok(())
            })
        })
    }

    /// `steps` values evenly spaced from `start` to `end` inclusive, as PyTorch's `linspace`
    /// (the second half is computed from the end, so both ends are exact).
    pub fn linspace(
        start: f64,
        end: f64,
        steps: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        // PyTorch checks the values it will write: start from one step on, end from two.
        for (v, from) in [(start, 1), (end, 2)] {
            if steps >= from {
                Scalar::Float(v).check_fits("linspace", dtype, false)?;
            }
        }
        let half_way = steps / 2;
        let step = if steps > 1 {
            (end - start) / (steps - 1) as f64
        } else {
            0.0
        };
        // PyTorch computes in the tensor's own float precision; f32 for the 16-bit floats too.
        let narrow = matches!(dtype, DType::F32 | DType::F16 | DType::BF16);
        with_element!(dtype, T, {
            Tensor::from_fn_overwrite::<T>(&[steps], device, |out| {
                for (i, o) in out.iter_mut().enumerate() {
                    let v = if steps == 1 {
                        // One step is the start, as in PyTorch (the end is never written).
                        if narrow { start as f32 as f64 } else { start }
                    } else if narrow {
                        let (s32, e32, st32) = (start as f32, end as f32, step as f32);
                        let st32 = if steps > 1 {
                            (e32 - s32) / (steps - 1) as f32
                        } else {
                            st32
                        };
                        (if i < half_way {
                            s32 + st32 * i as f32
                        } else {
                            e32 - st32 * (steps - i - 1) as f32
                        }) as f64
                    } else if i < half_way {
                        start + step * i as f64
                    } else {
                        end - step * (steps - i - 1) as f64
                    };
                    *o = T::from_f64(v);
                }
                Ok(())
            })
        })
    }

    /// A 2-D tensor with ones on the diagonal: `n` rows and `m` columns (`m = n` when `None`).
    pub fn eye(n: usize, m: Option<usize>, dtype: DType, device: &Device) -> Result<Tensor> {
        let m = m.unwrap_or(n);
        with_element!(dtype, T, {
            let one = T::from_i64(1);
            Tensor::from_fn_typed::<T>(&[n, m], device, |out| {
                for i in 0..n.min(m) {
                    out[i * m + i] = one;
                }
                Ok(())
            })
        })
    }

    // ---- reading back ------------------------------------------------------------------------

    fn check_dtype<T: Element>(&self, context: &str) -> Result<()> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DTypeMismatch {
                context: format!("{context} of a tensor of shape {}", fmt_shape(self.shape())),
                expected: self.dtype(),
                given: T::DTYPE,
            });
        }
        Ok(())
    }

    /// The elements in row-major order. `T` must match the dtype.
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_dtype::<T>("to_vec")?;
        let walk = self.layout().walk();
        self.storage().with_host_bytes(|bytes| {
            let src = tpu_runtime::dtype::cast_bytes::<T>(bytes)?;
            let mut out = self.host_vec::<T>("to_vec", self.numel())?;
            walk.gather(&src, &mut out);
            Ok(out)
        })
    }

    /// The rows of a 2-D tensor.
    #[track_caller]
    pub fn to_vec2<T: Element>(&self) -> Result<Vec<Vec<T>>> {
        check_rank("to_vec2", "tensor", self.shape(), 2)?;
        let cols = self.shape()[1];
        let flat = self.to_vec::<T>()?;
        Ok((0..self.shape()[0])
            .map(|r| flat[r * cols..(r + 1) * cols].to_vec())
            .collect())
    }

    /// The value of a one-element tensor.
    #[track_caller]
    pub fn to_scalar<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::shape(
                "to_scalar",
                format!(
                    "expected a tensor with one element, got shape {} ({} elements)",
                    fmt_shape(self.shape()),
                    self.numel()
                ),
            ));
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// The elements as dense row-major bytes in host memory.
    #[track_caller]
    pub fn to_host_bytes(&self) -> Result<Vec<u8>> {
        let mut out = self.host_vec::<u8>("to_host_bytes", self.byte_len("to_host_bytes")?)?;
        self.gather_bytes_into(&mut out)?;
        Ok(out)
    }

    /// A host vector of `n` zeroed `T`s to read this tensor into, its size checked against the
    /// host memory the system can provide and allocated fallibly: a view may be far larger
    /// than its storage.
    fn host_vec<T: Clone + Default>(&self, op: &str, n: usize) -> Result<Vec<T>> {
        tpu_runtime::memory::try_host_vec(n, T::default(), || {
            format!(
                "{op} of {}",
                tpu_runtime::buffer::describe(self.dtype(), self.shape())
            )
        })
    }

    /// Bytes of this view's elements, or a shape error when they overflow.
    fn byte_len(&self, op: &str) -> Result<usize> {
        self.numel()
            .checked_mul(self.dtype().size_in_bytes())
            .ok_or_else(|| {
                Error::shape(
                    op,
                    format!(
                        "{} {} elements are more bytes than the address space holds",
                        fmt_shape(self.shape()),
                        self.dtype()
                    ),
                )
            })
    }

    /// Gathers the elements as dense row-major bytes into `out` (exactly the view's size).
    #[track_caller]
    fn gather_bytes_into(&self, out: &mut [u8]) -> Result<()> {
        let walk = self.layout().walk();
        let dtype = self.dtype();
        self.storage().with_host_bytes(|bytes| {
            macro_rules! gather_as {
                ($t:ty) => {{
                    let src = tpu_runtime::dtype::cast_bytes::<$t>(bytes)?;
                    match bytemuck::try_cast_slice_mut::<u8, $t>(out) {
                        Ok(dst) => walk.gather(&src, dst),
                        // `out` not aligned for the element: gather element by element.
                        Err(_) => {
                            let size = std::mem::size_of::<$t>();
                            let (inner, is) = (walk.inner(), walk.inner_stride());
                            walk.for_rows(0, walk.rows(), |row, off| {
                                for j in 0..inner {
                                    let at = (row * inner + j) * size;
                                    out[at..at + size]
                                        .copy_from_slice(bytemuck::bytes_of(&src[off + j * is]));
                                }
                            });
                        }
                    }
                    Ok(())
                }};
            }
            match dtype.size_in_bytes() {
                1 => gather_as!(u8),
                2 => gather_as!(tpu_runtime::f16),
                4 => gather_as!(i32),
                _ => gather_as!(i64),
            }
        })
    }

    /// A dense copy on the same device, or this tensor itself when it is already contiguous.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.copy()
    }

    /// True when autograd may track this tensor: it has a record, or it is a view of a root
    /// that has one (an in-place write may have given the root a history the view has not
    /// picked up yet; the op library decides).
    fn tracked(&self) -> bool {
        self.has_autograd_meta() || self.view_base().is_some_and(Tensor::has_autograd_meta)
    }

    /// A dense copy with its own storage. Runs as an op on PJRT devices, when autograd tracks
    /// the tensor (so gradients flow through it), and while a function is captured (so the
    /// graph has it).
    pub fn copy(&self) -> Result<Tensor> {
        if (!self.device().is_cpu() || self.tracked() || crate::observe::observing())
            && let Some(h) = crate::ops_hook::ops_hook()
        {
            return h.copy(self);
        }
        self.copy_untracked()
    }

    /// A dense copy made by this crate directly, never recorded by autograd (for kernels).
    pub fn copy_untracked(&self) -> Result<Tensor> {
        if let Some(t) = self.try_on_cpu(|src, walk, dtype, shape, device| {
            with_element!(dtype, T, {
                let src = src.typed::<T>()?;
                Tensor::from_fn_overwrite::<T>(shape, device, |out| {
                    walk.gather(src, out);
                    Ok(())
                })
            })
        })? {
            return Ok(t);
        }
        self.gather_to(self.device())
    }

    /// A dense copy of this view on another device than its storage's (or on a PJRT device):
    /// the destination is asked first whether it could hold the copy, so that a huge view (an
    /// expanded one costs nothing) is an error before any host memory is spent on it.
    fn gather_to(&self, device: &Device) -> Result<Tensor> {
        let (dtype, shape) = (self.dtype(), self.shape());
        if device.is_cpu() {
            // Straight into the destination's accounted buffer.
            let mut b = Buffer::for_overwrite(device, dtype, shape)?;
            let out = b
                .host_bytes_mut()
                .ok_or_else(|| Error::invalid_argument("to_device", "expected a CPU buffer"))?;
            self.gather_bytes_into(out)?;
            return Ok(Tensor::from_buffer(b));
        }
        let bytes = self.byte_len("to_device")?;
        let mut host = tpu_runtime::buffer::staging_bytes(device, dtype, shape, bytes)?;
        self.gather_bytes_into(&mut host)?;
        Ok(Tensor::from_buffer(Buffer::from_bytes(
            device, dtype, shape, &host,
        )?))
    }

    /// Runs `f` on the CPU buffer when the tensor lives on a native CPU device.
    fn try_on_cpu(
        &self,
        f: impl FnOnce(&tpu_runtime::CpuBuffer, &Walk, DType, &[usize], &Device) -> Result<Tensor>,
    ) -> Result<Option<Tensor>> {
        if !self.device().is_cpu() {
            return Ok(None);
        }
        let guard = self.storage().read();
        let cpu = guard
            .as_cpu()
            .ok_or_else(|| Error::invalid_argument("copy", "expected a CPU buffer"))?;
        f(
            cpu,
            &self.layout().walk(),
            self.dtype(),
            self.shape(),
            self.device(),
        )
        .map(Some)
    }

    /// A copy converted to `dtype` with PyTorch's casting rules (f32 -> bf16 rounds to nearest
    /// even; floats to integers truncate toward zero; anything non-zero becomes `true`). Returns
    /// this tensor itself when the dtype already matches.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        if (!self.device().is_cpu() || self.tracked() || crate::observe::observing())
            && let Some(h) = crate::ops_hook::ops_hook()
        {
            return h.to_dtype(self, dtype);
        }
        self.to_dtype_untracked(dtype)
    }

    /// A cast made by this crate directly, never recorded by autograd (for kernels).
    pub fn to_dtype_untracked(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let walk = self.layout().walk();
        let src_dtype = self.dtype();
        let shape: Dims = self.shape().into();
        let target = if self.device().is_cpu() {
            self.device().clone()
        } else {
            Device::cpu()
        };
        let host = self.storage().with_host_bytes(|bytes| {
            with_element!(src_dtype, S, {
                let src = tpu_runtime::dtype::cast_bytes::<S>(bytes)?;
                with_element!(dtype, D, {
                    Tensor::from_fn_overwrite::<D>(&shape, &target, |out| {
                        walk.map(&src, out, cast_value::<S, D>);
                        Ok(())
                    })
                })
            })
        })?;
        if self.device().is_cpu() {
            Ok(host)
        } else {
            host.to_device(self.device())
        }
    }

    /// A copy on `device` (bit-exact), or this tensor itself when it is already there.
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        if self.is_contiguous() && self.offset() == 0 && self.numel() == self.storage().numel() {
            let copied = self.storage().read().copy_to(device)?;
            let layout = Layout::contiguous(self.shape());
            return Tensor::from_storage(Storage::new(copied), layout);
        }
        self.gather_to(device)
    }
}

impl Tensor {
    /// Copies `src` into this tensor's elements in place (PyTorch's `copy_`): `src` is
    /// broadcast to this shape, converted to this dtype and moved to this device. Every view of
    /// the same storage sees the new values.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        let hook = crate::ops_hook::ops_hook();
        if let Some(h) = hook {
            h.before_write(self, src)?;
        }
        let src = src.to_device(self.device())?.to_dtype(self.dtype())?;
        let src = src.expand(self.shape()).map_err(|_| {
            Error::shape(
                "copy_",
                format!(
                    "source of shape {} cannot be broadcast to the destination's shape {}",
                    fmt_shape(src.shape()),
                    fmt_shape(self.shape())
                ),
            )
        })?;
        if crate::observe::records_only() {
            // A trace with placeholder values: the write happens when the traced program runs.
            // It still counts as one, so autograd's checks of saved tensors see it.
            self.storage().count_write();
        } else {
            crate::observe::writing(|| self.write_from(&src))?;
        }
        crate::observe::notify(self, &src);
        if let Some(h) = hook {
            h.after_write(self, &src);
        }
        Ok(())
    }

    /// `copy_` once `src` has this tensor's shape, dtype and device.
    fn write_from(&self, src: &Tensor) -> Result<()> {
        if self.device().is_cpu() {
            if !Arc::ptr_eq(self.storage(), src.storage()) {
                return self.copy_from_other_storage(src);
            }
            // Same storage: materialise the source first, since it may overlap the destination.
            let fresh = src.copy_untracked()?;
            return self.copy_from_other_storage(&fresh);
        }
        let whole =
            self.is_contiguous() && self.offset() == 0 && self.numel() == self.storage().numel();
        let fresh = if whole {
            src.copy()?
        } else {
            // A view of a larger storage: the whole storage with the view's elements replaced
            // becomes the storage's buffer. The op library computes it on the device; without
            // it, the storage makes a round trip through host memory.
            let numel = self.storage().numel();
            let region =
                Tensor::from_storage(self.storage().clone(), Layout::contiguous(&[numel]))?;
            match crate::ops_hook::ops_hook() {
                Some(hook) => hook.write_view(&region, self.layout(), src)?,
                None => {
                    let host = region.to_device(&Device::cpu())?;
                    let view = Tensor::from_storage(host.storage().clone(), self.layout().clone())?;
                    view.copy_(&src.to_device(&Device::cpu())?)?;
                    host.to_device(self.device())?
                }
            }
        };
        let buffer = Arc::clone(&fresh.inner.storage);
        drop(fresh);
        let buffer = buffer
            .into_buffer()
            .ok_or_else(|| Error::internal("copy_", "the fresh copy's storage is shared"))?;
        self.storage().replace(buffer)?;
        // The replacement counts as a write for autograd's version checks.
        drop(self.storage().write());
        Ok(())
    }

    /// `copy_` on the CPU when `src` (same shape and dtype) lives in another storage: one pass,
    /// typed by element size, a straight memory copy when both are dense.
    fn copy_from_other_storage(&self, src: &Tensor) -> Result<()> {
        let size = self.dtype().size_in_bytes();
        let n = self.numel();
        let sg = src.storage().read();
        let mut dg = self.storage().write();
        let sb = sg
            .host_bytes()
            .ok_or_else(|| Error::invalid_argument("copy_", "expected host memory"))?;
        let db = dg
            .host_bytes_mut()
            .ok_or_else(|| Error::invalid_argument("copy_", "expected host memory"))?;
        let dense = self.is_contiguous() && src.is_contiguous();
        let (so, doff) = (src.offset(), self.offset());
        macro_rules! go {
            ($t:ty) => {{
                let s: &[$t] = bytemuck::cast_slice(sb);
                let d: &mut [$t] = bytemuck::cast_slice_mut(db);
                if dense {
                    d[doff..doff + n].copy_from_slice(&s[so..so + n]);
                } else {
                    // Gather the source densely, then scatter into the destination's layout.
                    let mut tmp = tpu_runtime::memory::try_host_vec(n, <$t>::default(), || {
                        format!(
                            "copy_ into {}",
                            tpu_runtime::buffer::describe(self.dtype(), self.shape())
                        )
                    })?;
                    src.layout().walk().gather(s, &mut tmp);
                    let w = self.layout().walk();
                    let (inner, stride) = (w.inner(), w.inner_stride());
                    w.for_rows(0, w.rows(), |row, off| {
                        for j in 0..inner {
                            d[off + j * stride] = tmp[row * inner + j];
                        }
                    });
                }
            }};
        }
        match size {
            1 => go!(u8),
            2 => go!(u16),
            4 => go!(u32),
            _ => go!(u64),
        }
        Ok(())
    }

    /// Sets every element to `value` in place.
    pub fn fill_(&self, value: impl Into<Scalar>) -> Result<()> {
        let v = Tensor::full([0usize; 0], value, self.dtype(), self.device())?;
        self.copy_(&v)
    }
}

/// Host memory for the `numel` elements of a tensor of `shape` to be uploaded to `device`:
/// the device is asked first whether the tensor could fit, then host memory is checked and
/// allocated fallibly, so a huge shape is an error before anything is allocated.
fn staging<T: Element>(device: &Device, shape: &[usize], numel: usize) -> Result<Vec<T>> {
    let describe = || tpu_runtime::buffer::describe(T::DTYPE, shape);
    let bytes = numel.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
        Error::shape(
            "create",
            format!("{} elements overflow the address space", describe()),
        )
    })?;
    device.check_alloc(bytes, describe)?;
    tpu_runtime::memory::try_host_vec(numel, T::default(), || {
        format!("staging {} for {device}", describe())
    })
}

/// Converts one value between element types with PyTorch's rules.
#[inline]
pub fn cast_value<S: Element, D: Element>(s: S) -> D {
    if S::DTYPE.is_float() {
        D::from_f64(s.to_f64())
    } else {
        D::from_i64(s.to_i64())
    }
}

/// A tensor kept for reuse ([`crate::recycle`]) as a new one of `shape`, filled by `fill`
/// (zeroed first when `zero`): `Ok` with the tensor or `fill`'s error, `Err(fill)` when none is
/// kept. The error comes back through a slot because a `Result` through `take` would carry the
/// 96-byte error through memory on every call.
#[inline]
fn from_kept<T: Element, F: FnOnce(&mut [T]) -> Result<()>>(
    device: &Device,
    shape: &[usize],
    numel: usize,
    zero: bool,
    fill: F,
) -> std::result::Result<Result<Tensor>, F> {
    let mut fill = Some(fill);
    let mut failed = None;
    let kept = crate::recycle::take(device, T::DTYPE, shape, numel, |b| {
        if zero && let Some(bytes) = b.host_bytes_mut() {
            bytes.fill(0);
        }
        let Some(f) = fill.take() else {
            return false;
        };
        fill_cpu_buffer(b, f).map_err(|e| failed = Some(e)).is_ok()
    });
    match (kept, failed, fill) {
        (Some(t), _, _) => Ok(Ok(t)),
        (None, Some(e), _) => Ok(Err(e)),
        (None, None, Some(fill)) => Err(fill),
        // `take` calls its closure at most once and reports a failed fill as `None`.
        (None, None, None) => Ok(Err(Error::internal(
            "create",
            "a kept tensor took the fill function and reported nothing",
        ))),
    }
}

/// Hands the elements of the CPU buffer `b`, as `T`, to `fill` (the creators' in-place path).
fn fill_cpu_buffer<T: Element>(
    b: &mut Buffer,
    fill: impl FnOnce(&mut [T]) -> Result<()>,
) -> Result<()> {
    let data = b
        .as_cpu_mut()
        .ok_or_else(|| Error::invalid_argument("create", "expected a CPU buffer"))?
        .typed_mut::<T>()?;
    fill(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpu_runtime::bf16;

    fn cpu() -> Device {
        Device::cpu()
    }

    #[test]
    fn create_and_read_back() {
        let t = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], [2, 3], &cpu()).unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.strides(), &[3, 1]);
        assert_eq!(
            t.to_vec2::<f32>().unwrap(),
            vec![vec![1., 2., 3.], vec![4., 5., 6.]]
        );
        let e = Tensor::from_vec(vec![1f32, 2., 3.], [2, 2], &cpu()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "creating a tensor of shape [2, 2]: expected 4 elements, got 3"
        );
        let e = t.to_vec::<i64>().unwrap_err().to_string();
        assert!(e.contains("expected dtype f32, got i64"), "{e}");
        assert!(t.to_scalar::<f32>().is_err());
        assert_eq!(
            Tensor::scalar(2.5f64, &cpu())
                .unwrap()
                .to_scalar::<f64>()
                .unwrap(),
            2.5
        );
        let n = Tensor::new([[1i32, 2], [3, 4]], &cpu()).unwrap();
        assert_eq!(n.shape(), &[2, 2]);
        assert_eq!(n.to_vec::<i32>().unwrap(), [1, 2, 3, 4]);
    }

    #[test]
    fn fills() {
        let z = Tensor::zeros([2, 2], DType::BF16, &cpu()).unwrap();
        assert_eq!(z.to_vec::<bf16>().unwrap(), vec![bf16::ZERO; 4]);
        let o = Tensor::ones([3], DType::Bool, &cpu()).unwrap();
        assert_eq!(o.to_vec::<bool>().unwrap(), [true; 3]);
        let f = Tensor::full([2], 7, DType::I64, &cpu()).unwrap();
        assert_eq!(f.to_vec::<i64>().unwrap(), [7, 7]);
        assert_eq!(f.zeros_like().unwrap().to_vec::<i64>().unwrap(), [0, 0]);
        assert_eq!(f.full_like(3).unwrap().to_vec::<i64>().unwrap(), [3, 3]);
        let e = Tensor::eye(2, Some(3), DType::F32, &cpu()).unwrap();
        assert_eq!(e.to_vec::<f32>().unwrap(), [1., 0., 0., 0., 1., 0.]);
    }

    #[test]
    fn arange_and_linspace_match_pytorch() {
        // Values are start + i * step in f64, then rounded once to the dtype.
        let a = Tensor::arange(0, 1, 0.3, DType::F32, &cpu()).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), [0.0, 0.3, 0.6, 0.9]);
        // torch.arange(10, 0, -3) -> tensor([10, 7, 4, 1])
        let a = Tensor::arange(10, 0, -3, DType::I64, &cpu()).unwrap();
        assert_eq!(a.to_vec::<i64>().unwrap(), [10, 7, 4, 1]);
        assert!(Tensor::arange(0, 5, 0, DType::I64, &cpu()).is_err());
        assert!(Tensor::arange(0, 5, -1, DType::I64, &cpu()).is_err());
        // torch.linspace(0, 1, 5) -> tensor([0.0000, 0.2500, 0.5000, 0.7500, 1.0000])
        let l = Tensor::linspace(0.0, 1.0, 5, DType::F32, &cpu()).unwrap();
        assert_eq!(l.to_vec::<f32>().unwrap(), [0.0, 0.25, 0.5, 0.75, 1.0]);
        // Both ends are exact even when the step is not.
        let l = Tensor::linspace(-1.0, 0.7, 7, DType::F32, &cpu())
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!((l[0], l[6]), (-1.0, 0.7));
    }

    #[test]
    fn casts_follow_pytorch() {
        // torch.tensor([1 + 2**-8, -2.7, 300.0]).to(torch.bfloat16) -> [1.0, -2.7031, 300.0]
        let t = Tensor::new([1.0f32 + 1.0 / 256.0, -2.7, 300.0], &cpu()).unwrap();
        let b = t.to_dtype(DType::BF16).unwrap();
        let got: Vec<f32> = b
            .to_vec::<bf16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect();
        assert_eq!(got, [1.0, -2.703125, 300.0]);
        // torch.tensor([-2.7, 2.7, -1.0]).to(torch.int32) -> [-2, 2, -1]; .to(torch.uint8) -> [254, 2, 255]
        let t = Tensor::new([-2.7f32, 2.7, -1.0], &cpu()).unwrap();
        assert_eq!(
            t.to_dtype(DType::I32).unwrap().to_vec::<i32>().unwrap(),
            [-2, 2, -1]
        );
        assert_eq!(
            t.to_dtype(DType::U8).unwrap().to_vec::<u8>().unwrap(),
            [254, 2, 255]
        );
        assert_eq!(
            t.to_dtype(DType::Bool).unwrap().to_vec::<bool>().unwrap(),
            [true; 3]
        );
        let big = Tensor::new([(1i64 << 53) + 1], &cpu()).unwrap();
        assert_eq!(
            big.to_dtype(DType::F64)
                .unwrap()
                .to_dtype(DType::I64)
                .unwrap()
                .to_vec::<i64>()
                .unwrap(),
            [1i64 << 53]
        );
    }

    #[test]
    fn every_dtype_round_trips_through_every_wider_dtype() {
        let vals = [0i64, 1, 5, 100, 127];
        for src in DType::ALL {
            if src == DType::Bool {
                continue;
            }
            let t = Tensor::from_slice(&vals, [5], &cpu())
                .unwrap()
                .to_dtype(src)
                .unwrap();
            for dst in DType::ALL {
                if dst == DType::Bool {
                    continue;
                }
                let back = t.to_dtype(dst).unwrap().to_dtype(DType::I64).unwrap();
                assert_eq!(back.to_vec::<i64>().unwrap(), vals, "{src} -> {dst}");
            }
        }
    }

    #[test]
    fn to_device_between_cpu_devices_is_exact() {
        let other = Device::new_cpu(&Default::default()).unwrap();
        let t = Tensor::new([[1.5f32, -0.0], [f32::NAN, f32::INFINITY]], &cpu()).unwrap();
        let u = t.to_device(&other).unwrap();
        assert_eq!(u.device(), &other);
        let bits = |x: &Tensor| -> Vec<u32> {
            x.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(bits(&t), bits(&u));
        assert_eq!(other.memory_stats().unwrap().bytes_in_use, 64);
        drop(u);
        assert_eq!(other.memory_stats().unwrap().bytes_in_use, 0);
    }

    #[test]
    fn copy_in_place_is_seen_by_views() {
        let t = Tensor::zeros([2, 3], DType::F32, &cpu()).unwrap();
        let view = t.t().unwrap();
        let v0 = t.storage().version();
        t.select(0, 1)
            .unwrap()
            .copy_(&Tensor::new([1i64, 2, 3], &cpu()).unwrap())
            .unwrap();
        assert_eq!(view.to_vec::<f32>().unwrap(), [0., 1., 0., 2., 0., 3.]);
        assert!(t.storage().version() > v0);
        // Broadcast source, and a source overlapping the destination.
        t.narrow(1, 0, 1).unwrap().fill_(7).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [7., 0., 0., 7., 2., 3.]);
        t.copy_(&t.flip_for_test()).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [7., 2., 3., 7., 0., 0.]);
        assert!(
            t.copy_(&Tensor::zeros([4], DType::F32, &cpu()).unwrap())
                .is_err()
        );
    }

    impl Tensor {
        fn flip_for_test(&self) -> Tensor {
            // Rows swapped: a view over the same storage.
            let v = self.to_vec::<f32>().unwrap();
            let n = self.shape()[1];
            let mut out = v[n..].to_vec();
            out.extend_from_slice(&v[..n]);
            Tensor::from_vec(out, self.shape(), self.device()).unwrap()
        }
    }

    #[test]
    fn autograd_slot_and_detach() {
        let t = Tensor::ones([2], DType::F32, &cpu()).unwrap();
        assert!(t.autograd_meta().is_none());
        t.set_autograd_meta(Some(Arc::new(5u32)));
        let c = t.clone();
        assert_eq!(c.autograd_meta().unwrap().downcast_ref::<u32>(), Some(&5));
        let d = t.detach();
        assert!(d.autograd_meta().is_none());
        assert!(d.shares_storage(&t));
    }

    #[test]
    fn from_storage_checks_bounds() {
        let t = Tensor::zeros([4], DType::F32, &cpu()).unwrap();
        let bad = Layout {
            shape: [2, 2].as_slice().into(),
            strides: [2, 2].as_slice().into(),
            offset: 0,
        };
        assert!(Tensor::from_storage(t.storage().clone(), bad).is_err());
    }
}
