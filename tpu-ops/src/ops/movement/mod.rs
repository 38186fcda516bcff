//! Data movement that materialises (cat, stack, pad, gather, scatter, index ops, masks,
//! tril/triu, repeat, flip, roll, topk, sort).
//!
//! Most of these ops only move elements, so their CPU kernels are written once per element size
//! (1, 2, 4 or 8 bytes, carried as `u8`, `f16`, `i32` and `i64`) instead of once per dtype; only
//! the ops that compare or add values (sort, topk, scatter_add, index_add) look at the dtype.
//!
//! Index tensors are i64. Out-of-range indices are errors, naming the index, the dim and the
//! shape: on the native CPU device in the kernels, on PJRT devices through the ops'
//! `lower_checks` while device checks are on (see [`crate::hlo::checks`]); with them off, XLA clamps
//! gather indices and drops out-of-range scatter updates.
//!
//! scatter_add and index_add accumulate f16 and bf16 in f32 and round once per element, as
//! PyTorch's CPU scatter_add does (PyTorch's index_add on a 1-D f16/bf16 tensor rounds after
//! every addition instead). Sorts are always stable, and topk breaks ties by lower index (PyTorch's
//! CPU topk picks among equal values in an order of its own).
//!
//! Backward rules follow PyTorch's formulas and are written with this file's ops (and sums), so
//! they run on the device the forward ran on. Gradients of index tensors and masks are `None`.
//! Where a scatter's `src` is larger than its index, the positions of `src` that no index reads
//! get a zero gradient (PyTorch's rule returns an index-shaped gradient there and fails).

pub mod view;

use std::sync::Arc;

use tpu_tensor::shape::{broadcast_shapes, contiguous_strides, resolve_dim, resolve_dim_in};
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::tpu_runtime::{Buffer, CpuDevice};
use tpu_tensor::{
    DType, Device, Dim, Dims, Element, Error, Generator, Result, Scalar, Tensor, with_element,
};

use crate::TensorOps;
use crate::autograd::Saved;
use crate::cpu::kernels::{Reader, cpu_device, map2, par_row_blocks};
use crate::hlo::checks::{DeviceCheck, index_check};
use crate::hlo::{Cmp, FnBuilder, TensorType, Value, i64_array, list};
use crate::op::promote::promote_types;
use crate::op::{DTypeSet, Meta, OpDef, OpInfo};
use crate::ops::cast::lower_cast;

// ---- shared helpers ----------------------------------------------------------------------------

/// Runs `$body` with `$C` a plain type of the dtype's element size, for kernels that only move
/// elements.
macro_rules! by_size {
    ($dtype:expr, $C:ident, $body:expr) => {
        match $dtype.size_in_bytes() {
            1 => {
                type $C = u8;
                $body
            }
            2 => {
                type $C = tpu_tensor::f16;
                $body
            }
            4 => {
                type $C = i32;
                $body
            }
            _ => {
                type $C = i64;
                $body
            }
        }
    };
}

/// Runs `$body` with `$T` the element type of a dtype that accumulates in itself (16-bit floats
/// are widened to f32 before accumulating, so they never get here).
macro_rules! by_acc_type {
    ($op:expr, $dtype:expr, $T:ident, $body:expr) => {
        match $dtype {
            DType::Bool => {
                type $T = bool;
                $body
            }
            DType::U8 => {
                type $T = u8;
                $body
            }
            DType::I8 => {
                type $T = i8;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            d => return Err(internal($op, format!("no accumulating kernel for {d}"))),
        }
    };
}

fn internal(op: &str, what: impl std::fmt::Display) -> Error {
    Error::internal(op, format!("{what}"))
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A 0-dim shape seen as `[1]`: PyTorch's index ops treat scalars as 1-element vectors.
fn at_least_1d(shape: &[usize]) -> Dims {
    if shape.is_empty() {
        Dims::from_elem(1, 1)
    } else {
        shape.into()
    }
}

/// A 0-dim tensor as a 1-element vector (a view); other tensors unchanged.
fn as_1d(t: &Tensor) -> Result<Tensor> {
    if t.rank() == 0 {
        t.reshape([1])
    } else {
        Ok(t.clone())
    }
}

/// The multi-index of row-major position `lin` in `shape`.
fn unravel(mut lin: usize, shape: &[usize]) -> Dims {
    let mut idx = Dims::from_elem(0, shape.len());
    for (i, &n) in idx.iter_mut().zip(shape).rev() {
        if n > 0 {
            *i = lin % n;
            lin /= n;
        }
    }
    idx
}

/// Advances a multi-index in row-major order (wrapping to zeros after the last).
fn step(idx: &mut [usize], shape: &[usize]) {
    for (i, &n) in idx.iter_mut().zip(shape).rev() {
        *i += 1;
        if *i < n {
            return;
        }
        *i = 0;
    }
}

/// The row-major position of a multi-index.
fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |a, (&i, &n)| a * n + i)
}

/// A fresh dense output of `meta` on `device`, filled through a view of its elements as `C`
/// (a type of the same size as the dtype's elements).
fn out_raw<C: Element>(
    meta: &Meta,
    device: &Device,
    fill: impl FnOnce(&mut [C]) -> Result<()>,
) -> Result<Tensor> {
    let mut buf = Buffer::zeroed(device, meta.dtype, &meta.shape)?;
    let data = buf
        .as_cpu_mut()
        .ok_or_else(|| internal("kernel", "expected a CPU buffer"))?
        .typed_mut::<C>()?;
    if data.len() != meta.numel() {
        return Err(internal("kernel", "element size mismatch"));
    }
    fill(data)?;
    Ok(Tensor::from_buffer(buf))
}

/// Mutates the storage of a freshly copied (dense, unshared) tensor in place.
fn in_place<C: Element>(t: &Tensor, f: impl FnOnce(&mut [C]) -> Result<()>) -> Result<()> {
    let mut g = t.storage().write();
    let data = g
        .as_cpu_mut()
        .ok_or_else(|| internal("kernel", "expected a CPU buffer"))?
        .typed_mut::<C>()?;
    f(data)
}

/// The elements of a contiguous tensor.
fn dense<'r, T: Element>(r: &'r Reader<'_>, t: &Tensor) -> Result<&'r [T]> {
    let data = r.data::<T>(t)?;
    data.get(t.offset()..t.offset() + t.numel())
        .ok_or_else(|| internal("kernel", "view outside its storage"))
}

/// `v` converted to `dtype` with PyTorch's casting rules, as the bits of a carrier type `C`.
fn carrier_value<C: Element>(v: Scalar, dtype: DType) -> Result<C> {
    with_element!(dtype, T, {
        let x: T = v.to_element();
        let bytes = tpu_tensor::tpu_runtime::dtype::as_bytes(std::slice::from_ref(&x));
        let c = tpu_tensor::tpu_runtime::dtype::cast_bytes::<C>(bytes)?;
        c.first()
            .copied()
            .ok_or_else(|| internal("kernel", "empty value"))
    })
}

fn need_dtype(op: &str, m: &Meta, set: DTypeSet) -> Result<()> {
    if set.contains(m.dtype) {
        return Ok(());
    }
    Err(Error::UnsupportedDType {
        op: op.into(),
        given: m.dtype.to_string(),
        supported: set.to_string(),
    })
}

fn need_index(op: &str, what: &str, m: &Meta) -> Result<()> {
    if m.dtype == DType::I64 {
        return Ok(());
    }
    Err(Error::DTypeMismatch {
        context: format!("{op}: {what} of shape {}", fmt_shape(&m.shape)),
        expected: DType::I64,
        given: m.dtype,
    })
}

fn need_same_dtype(op: &str, what: &str, x: &Meta, other: &Meta) -> Result<()> {
    if x.dtype == other.dtype {
        return Ok(());
    }
    Err(Error::DTypeMismatch {
        context: format!(
            "{op}: {what} of shape {} must have the dtype of the input",
            fmt_shape(&other.shape)
        ),
        expected: x.dtype,
        given: other.dtype,
    })
}

/// The first index outside `[0, shape[dim])`, as an error.
fn check_indices(op: &str, ix: &[i64], dim: usize, shape: &[usize]) -> Result<()> {
    let size = shape[dim];
    match ix.iter().find(|&&v| v < 0 || v as u64 >= size as u64) {
        None => Ok(()),
        Some(&bad) => Err(Error::IndexOutOfRange {
            op: op.into(),
            index: bad,
            dim,
            size,
            shape: shape.to_vec(),
        }),
    }
}

/// A fill value must fit the dtype, as PyTorch checks (`-1.5` cannot fill a u8 tensor).
fn check_fill(op: &str, value: Scalar, dtype: DType) -> Result<()> {
    // PyTorch's pad refuses negative u8 values that fill values elsewhere wrap (-1 -> 255).
    value.check_fits(op, dtype, op == "pad")
}

/// A dense zero of the output's type (for empty outputs, which XLA need not compute).
fn zeros(b: &mut FnBuilder, m: &Meta) -> Value {
    b.splat(m.ty(), 0)
}

/// Elements `start..end` along dim `d`.
fn slice_dim(b: &mut FnBuilder, v: &Value, d: usize, start: usize, end: usize) -> Value {
    let r = v.ty.rank();
    let mut lo = vec![0i64; r];
    let mut hi: Vec<i64> = v.dims().iter().map(|&n| n as i64).collect();
    lo[d] = start as i64;
    hi[d] = end as i64;
    b.slice(v, &lo, &hi, &vec![1; r])
}

fn reverse(b: &mut FnBuilder, v: &Value, dims: &[usize]) -> Value {
    let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let attrs = format!("dimensions = {}", i64_array(&dims));
    b.op("stablehlo.reverse", &[v], &attrs, v.ty.clone())
}

fn range_list(n: usize) -> String {
    list(&(0..n as i64).collect::<Vec<_>>())
}

/// Dense table-driven copy: `out[o_0, .., o_n] = src[base + tabs[0][o_0] + .. + tabs[n][o_n]]`,
/// or `fill` where any table entry is negative. Tables hold storage offsets (coordinate times
/// stride), so one kernel serves pad, flip, roll, repeat and index_select over any strides.
fn table_gather<C: Element>(
    dev: &CpuDevice,
    src: &[C],
    base: usize,
    tabs: &[Vec<i64>],
    fill: C,
    out: &mut [C],
) -> Result<()> {
    let Some((inner_tab, outer_tabs)) = tabs.split_last() else {
        if let (Some(o), Some(&s)) = (out.first_mut(), src.get(base)) {
            *o = s;
        }
        return Ok(());
    };
    let inner = inner_tab.len();
    let outer: Dims = outer_tabs.iter().map(|t| t.len()).collect();
    par_row_blocks(dev, out, inner, |first, chunk| {
        let mut m = unravel(first, &outer);
        for row in chunk.chunks_mut(inner) {
            let mut off = base as i64;
            let mut hole = false;
            for (t, &i) in outer_tabs.iter().zip(&m) {
                hole |= t[i] < 0;
                off += t[i];
            }
            if hole {
                row.fill(fill);
            } else {
                for (o, &t) in row.iter_mut().zip(inner_tab) {
                    *o = if t < 0 { fill } else { src[(off + t) as usize] };
                }
            }
            step(&mut m, &outer);
        }
    })
}

/// Runs [`table_gather`] on `x` with the element size of its dtype.
fn cpu_tables(op: &str, x: &Tensor, tabs: &[Vec<i64>], fill: Scalar, out: &Meta) -> Result<Tensor> {
    let dev = cpu_device(op, x)?;
    let device = Device::from_cpu(dev.clone());
    let r = Reader::new(&[x]);
    by_size!(x.dtype(), C, {
        let src = r.data::<C>(x)?;
        let f: C = carrier_value(fill, x.dtype())?;
        out_raw::<C>(out, &device, |o| {
            table_gather(&dev, src, x.offset(), tabs, f, o)
        })
    })
}

/// An empty output, made before building per-dim tables: a dim may be huge when another is 0.
fn empty_output(x: &Tensor, out: &Meta) -> Result<Option<Tensor>> {
    if out.numel() > 0 {
        return Ok(None);
    }
    Tensor::zeros(&out.shape[..], out.dtype, x.device()).map(Some)
}

/// Tables that read `x` unchanged along every dim.
fn identity_tables(x: &Tensor) -> Vec<Vec<i64>> {
    x.shape()
        .iter()
        .zip(x.strides())
        .map(|(&n, &s)| (0..n).map(|o| (o * s) as i64).collect())
        .collect()
}

/// A tensor's index values (dense i64).
fn index_values(t: &Tensor) -> Result<Vec<i64>> {
    t.contiguous()?.to_vec::<i64>()
}

/// `t` with `lo` zeros before and `hi` zeros after it along dim `d` (a constant [`Pad`]): how
/// the backward rules place a slice of the gradient at its position in a larger one.
fn zero_pad_dim(t: &Tensor, d: usize, lo: usize, hi: usize) -> Result<Tensor> {
    if lo + hi == 0 {
        return Ok(t.clone());
    }
    let r = t.rank();
    let mut pads = vec![0; 2 * (r - d)];
    pads[2 * (r - 1 - d)] = lo;
    pads[2 * (r - 1 - d) + 1] = hi;
    t.pad(&pads, PadMode::Constant(Scalar::Int(0)))
}

/// `t` (shaped like an index) padded with zeros at the end of every dim to `shape` (a scatter's
/// `src`, which may be larger than the index): `src` elements no index reads get no gradient.
fn zero_pad_to(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if t.shape() == shape {
        return Ok(t.clone());
    }
    // Index ops treat 0-dim tensors as 1-element vectors, so the ranks agree after this.
    let mut v = t.reshape(&at_least_1d(t.shape())[..])?;
    let want = at_least_1d(shape);
    if v.rank() != want.len() {
        return Err(internal("scatter backward", "index and src ranks differ"));
    }
    for (d, &n) in want.iter().enumerate() {
        let have = v.shape()[d];
        v = zero_pad_dim(&v, d, 0, n.saturating_sub(have))?;
    }
    v.reshape(shape)
}

/// A dense copy of a slice of the gradient, so a leaf's `.grad` never aliases the gradient of
/// another input (optimizers update `.grad` in place).
fn own(t: Tensor) -> Result<Tensor> {
    if t.is_contiguous() && t.offset() == 0 && t.numel() == t.storage().numel() {
        Ok(t)
    } else {
        t.copy()
    }
}

// ---- cat ---------------------------------------------------------------------------------------

/// Concatenation along a dim with PyTorch's type promotion; 1-D empty inputs are skipped, as
/// PyTorch does for backward compatibility.
#[derive(Clone, Debug)]
pub struct Cat {
    /// The dim (negative counts from the end).
    pub dim: i64,
}

struct CatPlan {
    dim: usize,
    keep: Vec<usize>,
    shape: Dims,
    dtype: DType,
}

fn cat_plan(dim: i64, inputs: &[Meta]) -> Result<CatPlan> {
    let first = inputs
        .first()
        .ok_or_else(|| Error::invalid_argument("cat", "expected a non-empty list of tensors"))?;
    let dtype = inputs[1..]
        .iter()
        .fold(first.dtype, |a, m| promote_types(a, m.dtype));
    if let Some(i) = inputs.iter().position(|m| m.rank() == 0) {
        return Err(Error::shape(
            "cat",
            format!("tensor {i} is zero-dimensional (shape []) and cannot be concatenated"),
        ));
    }
    let keep: Vec<usize> = (0..inputs.len())
        .filter(|&i| !(inputs[i].rank() == 1 && inputs[i].shape[0] == 0))
        .collect();
    let Some(&r0) = keep.first() else {
        return Ok(CatPlan {
            dim: 0,
            keep,
            shape: Dims::from_elem(0, 1),
            dtype,
        });
    };
    let reference = &inputs[r0];
    let d = resolve_dim("cat", dim, &reference.shape)?;
    let mut shape = reference.shape.clone();
    shape[d] = 0;
    for &i in &keep {
        let m = &inputs[i];
        let fits = m.rank() == reference.rank()
            && m.shape
                .iter()
                .zip(&reference.shape)
                .enumerate()
                .all(|(k, (a, b))| k == d || a == b);
        if !fits {
            return Err(Error::shape(
                "cat",
                format!(
                    "expected every tensor to match tensor {r0} (shape {}) except in dim {d}, but tensor {i} has shape {}",
                    fmt_shape(&reference.shape),
                    fmt_shape(&m.shape)
                ),
            ));
        }
        shape[d] = shape[d].checked_add(m.shape[d]).ok_or_else(|| {
            Error::shape(
                "cat",
                "the result has more elements than the address space holds",
            )
        })?;
    }
    Ok(CatPlan {
        dim: d,
        keep,
        shape,
        dtype,
    })
}

impl OpDef for Cat {
    fn name(&self) -> &'static str {
        "cat"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let p = cat_plan(self.dim, inputs)?;
        Ok(vec![Meta::new(&p.shape, p.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let metas: Vec<Meta> = inputs.iter().map(|t| Meta::of(t)).collect();
        let p = cat_plan(self.dim, &metas)?;
        let out = &outputs[0];
        let dev = cpu_device("cat", inputs[0])?;
        let device = Device::from_cpu(dev.clone());
        let parts = p
            .keep
            .iter()
            .map(|&i| inputs[i].to_dtype(out.dtype)?.contiguous())
            .collect::<Result<Vec<Tensor>>>()?;
        let inner = numel(&out.shape[p.dim + 1..]);
        let row_len = out.shape[p.dim] * inner;
        let blocks: Vec<usize> = parts.iter().map(|t| t.shape()[p.dim] * inner).collect();
        let refs: Vec<&Tensor> = parts.iter().collect();
        let r = Reader::new(&refs);
        let t = by_size!(out.dtype, C, {
            let srcs = parts
                .iter()
                .map(|t| dense::<C>(&r, t))
                .collect::<Result<Vec<&[C]>>>()?;
            out_raw::<C>(out, &device, |o| {
                par_row_blocks(&dev, o, row_len, |first, chunk| {
                    for (k, row) in chunk.chunks_mut(row_len).enumerate() {
                        let ob = first + k;
                        let mut pos = 0;
                        for (s, &bl) in srcs.iter().zip(&blocks) {
                            row[pos..pos + bl].copy_from_slice(&s[ob * bl..(ob + 1) * bl]);
                            pos += bl;
                        }
                    }
                })
            })?
        });
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let metas: Vec<Meta> = inputs
            .iter()
            .map(|v| Meta::new(v.dims(), v.dtype()))
            .collect();
        let p = cat_plan(self.dim, &metas)?;
        if outputs[0].numel() == 0 {
            return Ok(vec![zeros(b, &outputs[0])]);
        }
        let parts: Vec<Value> = p
            .keep
            .iter()
            .filter(|&&i| inputs[i].dims()[p.dim] > 0)
            .map(|&i| lower_cast(b, &inputs[i], p.dtype))
            .collect();
        if parts.len() == 1 {
            return Ok(parts);
        }
        let refs: Vec<&Value> = parts.iter().collect();
        Ok(vec![b.concatenate(&refs, p.dim)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// Each input gets its slice of the gradient; skipped 1-D empty inputs get an empty one.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let n = saved.inputs.len();
        let Some(g) = &grads[0] else {
            return Ok(vec![None; n]);
        };
        let metas: Vec<Meta> = saved.inputs.iter().map(Meta::of).collect();
        let p = cat_plan(self.dim, &metas)?;
        let mut out = vec![None; n];
        for (i, slot) in out.iter_mut().enumerate() {
            if !p.keep.contains(&i) {
                *slot = Some(Tensor::zeros([0], g.dtype(), g.device())?);
            }
        }
        let mut start = 0;
        for &i in &p.keep {
            let len = metas[i].shape[p.dim];
            out[i] = Some(own(g.narrow(p.dim, start as i64, len)?)?);
            start += len;
        }
        Ok(out)
    }
}

/// `torch.cat`: concatenates tensors along `dim`, promoting their dtypes as PyTorch does.
/// One-dimensional empty tensors are skipped (PyTorch's legacy rule).
pub fn cat(tensors: &[&Tensor], dim: impl Dim) -> Result<Tensor> {
    if tensors.is_empty() {
        return Err(Error::invalid_argument(
            "cat",
            "expected a non-empty list of tensors",
        ));
    }
    crate::exec::dispatch::run1(&Cat { dim: dim.to_i64() }, tensors)
}

/// `torch.stack`: [`Cat`] of the inputs each given a new dim `dim` of size 1. It is an op of
/// its own, rather than `cat` of unsqueezed views, so that autograd records it: views carry no
/// autograd record.
#[derive(Clone, Debug)]
pub struct Stack {
    /// The new dim (negative counts from the end of the result's dims).
    pub dim: i64,
}

impl Stack {
    /// The resolved new dim, after checking that every input has the first one's shape.
    fn plan(&self, inputs: &[Meta]) -> Result<usize> {
        let first = inputs.first().ok_or_else(|| {
            Error::invalid_argument("stack", "expected a non-empty list of tensors")
        })?;
        for (i, m) in inputs.iter().enumerate() {
            if m.shape != first.shape {
                return Err(Error::shape(
                    "stack",
                    format!(
                        "expected every tensor to have the shape of tensor 0 ({}), but tensor {i} has shape {}",
                        fmt_shape(&first.shape),
                        fmt_shape(&m.shape)
                    ),
                ));
            }
        }
        resolve_dim_in("stack", self.dim, first.rank() + 1, &first.shape)
    }

    /// The shape of an input with the new dim inserted.
    fn unsqueezed(shape: &[usize], d: usize) -> Dims {
        let mut s: Dims = shape.into();
        s.insert(d, 1);
        s
    }
}

impl OpDef for Stack {
    fn name(&self) -> &'static str {
        "stack"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let d = self.plan(inputs)?;
        let metas: Vec<Meta> = inputs
            .iter()
            .map(|m| Meta::new(&Stack::unsqueezed(&m.shape, d), m.dtype))
            .collect();
        Cat { dim: d as i64 }.infer(&metas)
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let metas: Vec<Meta> = inputs.iter().map(|t| Meta::of(t)).collect();
        let d = self.plan(&metas)?;
        let views = inputs
            .iter()
            .map(|t| t.unsqueeze(d))
            .collect::<Result<Vec<Tensor>>>()?;
        let refs: Vec<&Tensor> = views.iter().collect();
        Cat { dim: d as i64 }.cpu(&refs, outputs)
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let metas: Vec<Meta> = inputs
            .iter()
            .map(|v| Meta::new(v.dims(), v.dtype()))
            .collect();
        let d = self.plan(&metas)?;
        let parts: Vec<Value> = inputs
            .iter()
            .map(|v| b.reshape(v, &Stack::unsqueezed(v.dims(), d)))
            .collect();
        Cat { dim: d as i64 }.lower(b, &parts, outputs)
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// Input `i` gets index `i` of the gradient along the new dim.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let n = saved.inputs.len();
        let Some(g) = &grads[0] else {
            return Ok(vec![None; n]);
        };
        let metas: Vec<Meta> = saved.inputs.iter().map(Meta::of).collect();
        let d = self.plan(&metas)?;
        (0..n)
            .map(|i| Ok(Some(own(g.select(d, i as i64)?)?)))
            .collect()
    }
}

/// `torch.stack`: joins tensors of one shape along a new dim `dim`.
pub fn stack(tensors: &[&Tensor], dim: impl Dim) -> Result<Tensor> {
    if tensors.is_empty() {
        return Err(Error::invalid_argument(
            "stack",
            "expected a non-empty list of tensors",
        ));
    }
    crate::exec::dispatch::run1(&Stack { dim: dim.to_i64() }, tensors)
}

// ---- pad ---------------------------------------------------------------------------------------

/// How [`MovementOps::pad`] fills the border.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PadMode {
    /// A constant value (converted to the tensor's dtype).
    Constant(Scalar),
    /// The mirror image of the tensor, without repeating the edge element.
    Reflect,
    /// Copies of the edge element.
    Replicate,
}

/// `F.pad`: pads the last `pads.len() / 2` dims; `pads` lists (before, after) pairs starting
/// from the last dim, as PyTorch's.
#[derive(Clone, Debug)]
pub struct Pad {
    /// (before, after) pairs, last dim first.
    pub pads: Vec<usize>,
    /// How the border is filled.
    pub mode: PadMode,
}

impl Pad {
    fn pair(&self, d: usize, rank: usize) -> (usize, usize) {
        let p = rank - 1 - d;
        match (self.pads.get(2 * p), self.pads.get(2 * p + 1)) {
            (Some(&lo), Some(&hi)) => (lo, hi),
            _ => (0, 0),
        }
    }
}

impl OpDef for Pad {
    fn name(&self) -> &'static str {
        "pad"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = &inputs[0];
        let r = x.rank();
        if !self.pads.len().is_multiple_of(2) {
            return Err(Error::invalid_argument(
                "pad",
                format!(
                    "expected (before, after) pairs, got {} values {:?}",
                    self.pads.len(),
                    self.pads
                ),
            ));
        }
        if self.pads.len() > 2 * r {
            return Err(Error::shape(
                "pad",
                format!(
                    "{} pairs of padding {:?} for a tensor of shape {} with {r} dims",
                    self.pads.len() / 2,
                    self.pads,
                    fmt_shape(&x.shape)
                ),
            ));
        }
        match self.mode {
            PadMode::Constant(v) => check_fill("pad", v, x.dtype)?,
            PadMode::Reflect | PadMode::Replicate => need_dtype("pad", x, DTypeSet::NUMERIC)?,
        }
        let mut shape = x.shape.clone();
        for (d, s) in shape.iter_mut().enumerate() {
            let (lo, hi) = self.pair(d, r);
            let n = *s;
            let bad = match self.mode {
                PadMode::Reflect => (lo > 0 || hi > 0) && (lo >= n || hi >= n),
                PadMode::Replicate => n == 0 && (lo > 0 || hi > 0),
                PadMode::Constant(_) => false,
            };
            if bad {
                let why = if self.mode == PadMode::Reflect {
                    "reflect padding must be smaller than the dim's size"
                } else {
                    "replicate padding needs a non-empty dim"
                };
                return Err(Error::shape(
                    "pad",
                    format!(
                        "{why}: padding ({lo}, {hi}) for dim {d} of size {n} (tensor shape {})",
                        fmt_shape(&x.shape)
                    ),
                ));
            }
            *s = n
                .checked_add(lo)
                .and_then(|v| v.checked_add(hi))
                .ok_or_else(|| {
                    Error::shape("pad", format!("padding {:?} is too large", self.pads))
                })?;
        }
        tpu_tensor::shape::checked_numel("pad", &shape)?;
        Ok(vec![Meta::new(&shape, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0];
        if let Some(t) = empty_output(x, &outputs[0])? {
            return Ok(vec![t]);
        }
        let r = x.rank();
        let tabs: Vec<Vec<i64>> = (0..r)
            .map(|d| {
                let (lo, hi) = self.pair(d, r);
                let (n, st) = (x.shape()[d] as i64, x.strides()[d] as i64);
                (0..n + (lo + hi) as i64)
                    .map(|o| {
                        let i = o - lo as i64;
                        let s = match self.mode {
                            PadMode::Constant(_) if i < 0 || i >= n => return -1,
                            PadMode::Constant(_) => i,
                            PadMode::Reflect if i < 0 => -i,
                            PadMode::Reflect if i >= n => 2 * (n - 1) - i,
                            PadMode::Reflect => i,
                            PadMode::Replicate => i.clamp(0, n - 1),
                        };
                        s * st
                    })
                    .collect()
            })
            .collect();
        let fill = match self.mode {
            PadMode::Constant(v) => v,
            _ => Scalar::Int(0),
        };
        Ok(vec![cpu_tables("pad", x, &tabs, fill, &outputs[0])?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let x = &inputs[0];
        let r = x.ty.rank();
        if outputs[0].numel() == 0 {
            return Ok(vec![zeros(b, &outputs[0])]);
        }
        if let PadMode::Constant(v) = self.mode {
            let pv = b.scalar(x.dtype(), v);
            let (lo, hi): (Vec<i64>, Vec<i64>) = (0..r)
                .map(|d| {
                    let (l, h) = self.pair(d, r);
                    (l as i64, h as i64)
                })
                .unzip();
            let attrs = format!(
                "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
                i64_array(&lo),
                i64_array(&hi),
                i64_array(&vec![0; r])
            );
            return Ok(vec![b.op(
                "stablehlo.pad",
                &[x, &pv],
                &attrs,
                outputs[0].ty(),
            )]);
        }
        let mut v = x.clone();
        for d in 0..r {
            let (lo, hi) = self.pair(d, r);
            if lo + hi == 0 {
                continue;
            }
            let n = v.dims()[d];
            let mut parts = Vec::new();
            let edge = |b: &mut FnBuilder, v: &Value, start: usize, count: usize, at_end: bool| {
                if self.mode == PadMode::Reflect {
                    let s = slice_dim(b, v, d, start, start + count);
                    reverse(b, &s, &[d])
                } else {
                    let at = if at_end { n - 1 } else { 0 };
                    let s = slice_dim(b, v, d, at, at + 1);
                    let mut dims = s.dims().to_vec();
                    dims[d] = count;
                    let map: Vec<i64> = (0..r as i64).collect();
                    b.broadcast_in_dim(&s, &map, &dims)
                }
            };
            if lo > 0 {
                parts.push(edge(b, &v, 1, lo, false));
            }
            parts.push(v.clone());
            if hi > 0 {
                parts.push(edge(b, &v, n.saturating_sub(1 + hi), hi, true));
            }
            let refs: Vec<&Value> = parts.iter().collect();
            v = b.concatenate(&refs, d);
        }
        Ok(vec![v])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The gradient's middle slice, plus (reflect, replicate) the border's gradient added back
    /// to the elements it copied; one dim at a time, as the padding of each dim is separate.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None]);
        };
        let x = &saved.inputs[0];
        let r = x.rank();
        let mut g = g.clone();
        for d in 0..r {
            let (lo, hi) = self.pair(d, r);
            if lo + hi == 0 {
                continue;
            }
            let n = x.shape()[d];
            let mut acc = g.narrow(d, lo as i64, n)?;
            match self.mode {
                PadMode::Constant(_) => {}
                PadMode::Reflect => {
                    // Output position lo - k copies element k (k = 1..=lo), so the left border
                    // reversed lands on elements 1..=lo.
                    if lo > 0 {
                        let left = g.narrow(d, 0, lo)?.flip(&[d as i64])?;
                        acc = acc.add(&zero_pad_dim(&left, d, 1, n - 1 - lo)?)?;
                    }
                    // Position lo + n - 1 + k copies element n - 1 - k (k = 1..=hi): the right
                    // border reversed lands on elements n - 1 - hi..n - 1.
                    if hi > 0 {
                        let right = g.narrow(d, (lo + n) as i64, hi)?.flip(&[d as i64])?;
                        acc = acc.add(&zero_pad_dim(&right, d, n - 1 - hi, 1)?)?;
                    }
                }
                PadMode::Replicate => {
                    // Every border position copies the edge element: their sum goes there.
                    if lo > 0 {
                        let left =
                            crate::ops::reduce_sum_dims(&g.narrow(d, 0, lo)?, &[d as i64], true)?;
                        acc = acc.add(&zero_pad_dim(&left, d, 0, n - 1)?)?;
                    }
                    if hi > 0 {
                        let right = crate::ops::reduce_sum_dims(
                            &g.narrow(d, (lo + n) as i64, hi)?,
                            &[d as i64],
                            true,
                        )?;
                        acc = acc.add(&zero_pad_dim(&right, d, n - 1, 0)?)?;
                    }
                }
            }
            g = acc;
        }
        Ok(vec![Some(own(g)?)])
    }
}

// ---- gather ------------------------------------------------------------------------------------

/// `torch.gather`: `out[i][j] = x[index[i][j]][j]` along `dim` (for dim 0 of a 2-D input).
#[derive(Clone, Debug)]
pub struct Gather {
    /// The dim indexed (negative counts from the end).
    pub dim: i64,
}

/// Checks that `index` fits `x` (same rank; no larger except along `dim`, and no larger than
/// `src` anywhere when given); returns the resolved dim.
fn check_index_shape(
    op: &str,
    dim: i64,
    x: &Meta,
    index: &Meta,
    src: Option<&Meta>,
) -> Result<usize> {
    let d = resolve_dim(op, dim, &x.shape)?;
    let (xs, is) = (at_least_1d(&x.shape), at_least_1d(&index.shape));
    if xs.len() != is.len() {
        return Err(Error::shape(
            op,
            format!(
                "index of shape {} must have as many dims as the input of shape {}",
                fmt_shape(&index.shape),
                fmt_shape(&x.shape)
            ),
        ));
    }
    if let Some(k) = (0..xs.len()).find(|&k| k != d && is[k] > xs[k]) {
        return Err(Error::shape(
            op,
            format!(
                "index of shape {} is larger than the input of shape {} in dim {k} (only dim {d} may be larger)",
                fmt_shape(&index.shape),
                fmt_shape(&x.shape)
            ),
        ));
    }
    if let Some(s) = src {
        let ss = at_least_1d(&s.shape);
        if ss.len() != is.len() || is.iter().zip(&ss).any(|(i, s)| i > s) {
            return Err(Error::shape(
                op,
                format!(
                    "index of shape {} is larger than src of shape {}",
                    fmt_shape(&index.shape),
                    fmt_shape(&s.shape)
                ),
            ));
        }
    }
    Ok(d)
}

/// Index tensor and dim as full coordinates for `stablehlo.gather`/`scatter`: shape
/// `index.dims + [rank]`, with iotas for the other dims.
fn full_coords(b: &mut FnBuilder, index: &Value, dim: usize) -> Value {
    let s = index.dims().to_vec();
    let r = s.len();
    let mut s1 = s.clone();
    s1.push(1);
    let parts: Vec<Value> = (0..r)
        .map(|d| {
            let v = if d == dim {
                index.clone()
            } else {
                b.iota(&s, d, DType::I64)
            };
            b.reshape(&v, &s1)
        })
        .collect();
    let refs: Vec<&Value> = parts.iter().collect();
    if r == 1 {
        parts[0].clone()
    } else {
        b.concatenate(&refs, r)
    }
}

/// Reads `src` (storage offset `base`, strides `strides`) at the positions an index tensor
/// names.
struct Strided<'a, C> {
    data: &'a [C],
    base: usize,
    strides: &'a [usize],
}

fn gather_kernel<C: Element>(
    dev: &CpuDevice,
    src: Strided<'_, C>,
    ishape: &[usize],
    dim: usize,
    ix: &[i64],
    out: &mut [C],
) -> Result<()> {
    let Some((&inner, outer)) = ishape.split_last() else {
        return Ok(());
    };
    let last = ishape.len() - 1;
    let xs = src.strides;
    let inner_step = if dim == last { 0 } else { xs[last] };
    par_row_blocks(dev, out, inner, |first, chunk| {
        let mut m = unravel(first, outer);
        for (k, row) in chunk.chunks_mut(inner).enumerate() {
            let mut off = src.base;
            for (d, (&i, &s)) in m.iter().zip(xs).enumerate() {
                if d != dim {
                    off += i * s;
                }
            }
            let p0 = (first + k) * inner;
            for (j, o) in row.iter_mut().enumerate() {
                *o = src.data[off + j * inner_step + ix[p0 + j] as usize * xs[dim]];
            }
            step(&mut m, outer);
        }
    })
}

impl OpDef for Gather {
    fn name(&self) -> &'static str {
        "gather"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let (x, index) = (&inputs[0], &inputs[1]);
        need_index("gather", "index", index)?;
        check_index_shape("gather", self.dim, x, index, None)?;
        Ok(vec![Meta::new(&index.shape, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = as_1d(inputs[0])?;
        let index = inputs[1].contiguous()?;
        let d = resolve_dim("gather", self.dim, x.shape())?;
        let dev = cpu_device("gather", &x)?;
        let device = Device::from_cpu(dev.clone());
        let r = Reader::new(&[&x, &index]);
        let ix = dense::<i64>(&r, &index)?;
        check_indices("gather", ix, d, x.shape())?;
        let ishape = at_least_1d(index.shape());
        let t = by_size!(x.dtype(), C, {
            let src = Strided {
                data: r.data::<C>(&x)?,
                base: x.offset(),
                strides: x.strides(),
            };
            out_raw::<C>(&outputs[0], &device, |o| {
                gather_kernel(&dev, src, &ishape, d, ix, o)
            })?
        });
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let out = &outputs[0];
        if out.numel() == 0 {
            return Ok(vec![zeros(b, out)]);
        }
        let x = b.reshape(&inputs[0], &at_least_1d(inputs[0].dims()));
        let index = b.reshape(&inputs[1], &at_least_1d(inputs[1].dims()));
        let d = resolve_dim("gather", self.dim, x.dims())?;
        let r = x.ty.rank();
        let coords = full_coords(b, &index, d);
        let attrs = format!(
            "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = {all}, start_index_map = {all}, index_vector_dim = {r}>, slice_sizes = {}, indices_are_sorted = false",
            i64_array(&vec![1; r]),
            all = range_list(r),
        );
        let g = b.op(
            "stablehlo.gather",
            &[&x, &coords],
            &attrs,
            TensorType::new(index.dims(), x.dtype()),
        );
        Ok(vec![b.reshape(&g, &out.shape)])
    }

    fn lower_checks(
        &self,
        b: &mut FnBuilder,
        inputs: &[Value],
        _outputs: &[Meta],
    ) -> Result<Vec<DeviceCheck>> {
        index_check(
            b,
            "gather",
            &inputs[1],
            self.dim,
            &at_least_1d(inputs[0].dims()),
        )
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The gradient added at the positions the index read (duplicates accumulate).
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None, None]);
        };
        let (x, index) = (&saved.inputs[0], &saved.inputs[1]);
        let z = Tensor::zeros(x.shape(), g.dtype(), g.device())?;
        Ok(vec![Some(z.scatter_add(self.dim, index, g)?), None])
    }
}

// ---- scatter -----------------------------------------------------------------------------------

/// What a scatter does where an index points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScatterReduce {
    /// Replace the element (duplicates: the last update in row-major index order wins on the
    /// CPU; PyTorch leaves it unspecified).
    Replace,
    /// Add to the element.
    Add,
}

/// `torch.scatter` / `scatter_add`: inputs `(x, index, src)`; `x[index[i][j]][j] = src[i][j]`
/// along `dim` (for dim 0 of a 2-D input). With `value`, `src` is a 0-dim tensor used for every
/// position.
#[derive(Clone, Debug)]
pub struct Scatter {
    /// The dim indexed (negative counts from the end).
    pub dim: i64,
    /// Replace or add.
    pub reduce: ScatterReduce,
    /// `src` is a 0-dim value rather than a tensor of updates.
    pub value: bool,
}

/// The dtype sums are kept in: f32 for the 16-bit floats (as PyTorch's CPU scatter_add).
fn acc_dtype(d: DType) -> DType {
    if matches!(d, DType::F16 | DType::BF16) {
        DType::F32
    } else {
        d
    }
}

/// `a + alpha * b` in `T` (or for bool, `a or (b and alpha)`), wrapping for integers.
fn add_fn<T: Element>(alpha: Scalar) -> impl Fn(T, T) -> T + Sync + Send + Copy {
    let (af, ai) = (alpha.to_f64(), alpha.to_i64());
    let a32 = af as f32;
    move |a: T, b: T| -> T {
        if T::DTYPE == DType::Bool {
            T::from_i64((a.to_i64() != 0 || (b.to_i64() != 0 && af != 0.0)) as i64)
        } else if T::DTYPE == DType::F64 {
            T::from_f64(a.to_f64() + af * b.to_f64())
        } else if T::DTYPE.is_float() {
            T::from_f64((a.to_f64() as f32 + a32 * b.to_f64() as f32) as f64)
        } else {
            T::from_i64(a.to_i64().wrapping_add(ai.wrapping_mul(b.to_i64())))
        }
    }
}

/// Applies `f(out, src)` at every index position; `out` is a dense copy of the input. Runs in
/// parallel over the input's blocks of dims before `dim`: updates never cross them.
#[allow(clippy::too_many_arguments)]
fn scatter_kernel<T: Element>(
    dev: &CpuDevice,
    out: &mut [T],
    xshape: &[usize],
    dim: usize,
    ix: &[i64],
    ishape: &[usize],
    src: Strided<'_, T>,
    f: impl Fn(T, T) -> T + Sync + Send,
) -> Result<()> {
    let xd = contiguous_strides(xshape);
    let blk = numel(&xshape[dim..]);
    let (outer_x, outer_i, tail_i) = (&xshape[..dim], &ishape[..dim], &ishape[dim..]);
    let tail_n = numel(tail_i);
    if tail_n == 0 {
        return Ok(());
    }
    par_row_blocks(dev, out, blk, |first, chunk| {
        let mut m = unravel(first, outer_x);
        for block in chunk.chunks_mut(blk) {
            if m.iter().zip(outer_i).all(|(a, b)| a < b) {
                let ibase = ravel(&m, outer_i) * tail_n;
                let sbase = src.base
                    + m.iter()
                        .zip(src.strides)
                        .map(|(&i, &s)| i * s)
                        .sum::<usize>();
                let mut q = Dims::from_elem(0, tail_i.len());
                for t in 0..tail_n {
                    let mut so = sbase;
                    let mut oo = ix[ibase + t] as usize * xd[dim];
                    for (e, &qe) in q.iter().enumerate() {
                        so += qe * src.strides[dim + e];
                        if e > 0 {
                            oo += qe * xd[dim + e];
                        }
                    }
                    block[oo] = f(block[oo], src.data[so]);
                    step(&mut q, tail_i);
                }
            }
            step(&mut m, outer_x);
        }
    })
}

impl Scatter {
    fn op_name(&self) -> &'static str {
        match self.reduce {
            ScatterReduce::Replace => "scatter",
            ScatterReduce::Add => "scatter_add",
        }
    }

    /// Scatter on CPU tensors of one dtype (`x` 1-D at least, `src` broadcast already).
    fn run_cpu(&self, x: &Tensor, index: &Tensor, src: &Tensor, d: usize) -> Result<Tensor> {
        let op = self.op_name();
        let dev = cpu_device(op, x)?;
        let out = x.copy()?;
        let r = Reader::new(&[index, src]);
        let ix = dense::<i64>(&r, index)?;
        check_indices(op, ix, d, x.shape())?;
        let ishape = at_least_1d(index.shape());
        match self.reduce {
            ScatterReduce::Replace => by_size!(x.dtype(), C, {
                let s = Strided {
                    data: r.data::<C>(src)?,
                    base: src.offset(),
                    strides: src.strides(),
                };
                in_place::<C>(&out, |o| {
                    scatter_kernel(&dev, o, x.shape(), d, ix, &ishape, s, |_, v| v)
                })?
            }),
            ScatterReduce::Add => by_acc_type!(op, x.dtype(), T, {
                let s = Strided {
                    data: r.data::<T>(src)?,
                    base: src.offset(),
                    strides: src.strides(),
                };
                let f = add_fn::<T>(Scalar::Int(1));
                in_place::<T>(&out, |o| {
                    scatter_kernel(&dev, o, x.shape(), d, ix, &ishape, s, f)
                })?
            }),
        }
        Ok(out)
    }
}

impl OpDef for Scatter {
    fn name(&self) -> &'static str {
        self.op_name()
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.op_name();
        let (x, index, src) = (&inputs[0], &inputs[1], &inputs[2]);
        need_index(op, "index", index)?;
        need_same_dtype(op, "src", x, src)?;
        let src = if self.value { None } else { Some(src) };
        check_index_shape(op, self.dim, x, index, src)?;
        Ok(vec![x.clone()])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = as_1d(inputs[0])?;
        let index = as_1d(inputs[1])?;
        let index = index.contiguous()?;
        let src = if self.value {
            inputs[2].expand(index.shape().to_vec())?
        } else {
            as_1d(inputs[2])?
        };
        let d = resolve_dim(self.op_name(), self.dim, x.shape())?;
        let dtype = x.dtype();
        let acc = acc_dtype(dtype);
        let out = if self.reduce == ScatterReduce::Add && acc != dtype {
            let x32 = x.to_dtype(acc)?;
            let s32 = src.to_dtype(acc)?;
            self.run_cpu(&x32, &index, &s32, d)?.to_dtype(dtype)?
        } else {
            self.run_cpu(&x, &index, &src, d)?
        };
        Ok(vec![out.reshape(&outputs[0].shape)?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let x = b.reshape(&inputs[0], &at_least_1d(inputs[0].dims()));
        let index = b.reshape(&inputs[1], &at_least_1d(inputs[1].dims()));
        if index.ty.numel() == 0 || x.ty.numel() == 0 {
            return Ok(vec![inputs[0].clone()]);
        }
        let d = resolve_dim(self.op_name(), self.dim, x.dims())?;
        let r = x.ty.rank();
        let upd = if self.value {
            b.broadcast_in_dim(&inputs[2], &[], index.dims())
        } else {
            let s = b.reshape(&inputs[2], &at_least_1d(inputs[2].dims()));
            let zero = vec![0i64; r];
            let lim: Vec<i64> = index.dims().iter().map(|&n| n as i64).collect();
            b.slice(&s, &zero, &lim, &vec![1; r])
        };
        let dtype = x.dtype();
        let add = self.reduce == ScatterReduce::Add;
        let comp = if add { acc_dtype(dtype) } else { dtype };
        let xc = b.convert(&x, comp);
        let upd = b.convert(&upd, comp);
        let coords = full_coords(b, &index, d);
        let region = b.region(&[TensorType::scalar(comp)], 2, |b, a| {
            if !add {
                vec![a[1].clone()]
            } else if comp == DType::Bool {
                vec![b.ew("stablehlo.or", &[&a[0], &a[1]])]
            } else {
                vec![b.ew("stablehlo.add", &[&a[0], &a[1]])]
            }
        });
        let attrs = format!(
            "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = {all}, scatter_dims_to_operand_dims = {all}, index_vector_dim = {r}>, indices_are_sorted = false, unique_indices = false",
            all = range_list(r)
        );
        let s = b
            .op_n(
                "stablehlo.scatter",
                &[&xc, &coords, &upd],
                &attrs,
                &region,
                std::slice::from_ref(&xc.ty),
            )
            .remove(0);
        let s = b.convert(&s, dtype);
        Ok(vec![b.reshape(&s, &outputs[0].shape)])
    }

    fn lower_checks(
        &self,
        b: &mut FnBuilder,
        inputs: &[Value],
        _outputs: &[Meta],
    ) -> Result<Vec<DeviceCheck>> {
        let shape = at_least_1d(inputs[0].dims());
        index_check(b, self.op_name(), &inputs[1], self.dim, &shape)
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// Input: the gradient, with the overwritten positions zeroed (replace) or as is (add).
    /// Src: the gradient read back at the index positions. A value and the index get none.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None, None, None]);
        };
        let (index, src) = (&saved.inputs[1], &saved.inputs[2]);
        let gx = match self.reduce {
            ScatterReduce::Replace => g.scatter_value(self.dim, index, 0)?,
            ScatterReduce::Add => g.clone(),
        };
        let gs = if self.value {
            None
        } else {
            Some(zero_pad_to(&g.gather(self.dim, index)?, src.shape())?)
        };
        Ok(vec![Some(gx), None, gs])
    }
}

// ---- index_select / embedding ------------------------------------------------------------------

/// `torch.index_select`: the slices of `x` along `dim` named by a 1-D index, in its order.
/// `embedding` is this op along dim 0 of the weight, under its own name, with an index of any
/// shape replacing that dim (so the result needs no reshape, which autograd would not see).
#[derive(Clone, Debug)]
pub struct IndexSelect {
    /// The dim indexed (negative counts from the end).
    pub dim: i64,
    /// Report errors as `embedding`, and take an index of any shape.
    pub embedding: bool,
}

/// Checks a 1-D (or 0-dim) index for `x` along `dim`; returns the resolved dim.
fn check_vector_index(op: &str, dim: i64, x: &Meta, index: &Meta) -> Result<usize> {
    need_index(op, "index", index)?;
    if x.rank() == 0 {
        return Err(Error::shape(
            op,
            "expected an input with at least 1 dim, got shape []",
        ));
    }
    if index.rank() > 1 {
        return Err(Error::shape(
            op,
            format!(
                "expected a 1-D index, got shape {}",
                fmt_shape(&index.shape)
            ),
        ));
    }
    resolve_dim(op, dim, &x.shape)
}

impl IndexSelect {
    fn op_name(&self) -> &'static str {
        if self.embedding {
            "embedding"
        } else {
            "index_select"
        }
    }

    /// The result's shape with the index flattened to `n` elements: `x`'s with dim `d` set to
    /// `n`.
    fn flat_shape(&self, x: &[usize], d: usize, n: usize) -> Dims {
        let mut shape: Dims = x.into();
        shape[d] = n;
        shape
    }
}

impl OpDef for IndexSelect {
    fn name(&self) -> &'static str {
        self.op_name()
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let (x, index) = (&inputs[0], &inputs[1]);
        if self.embedding {
            // Any index shape: it takes the place of the indexed dim.
            let flat = Meta::new(&[index.numel()], index.dtype);
            let d = check_vector_index(self.op_name(), self.dim, x, &flat)?;
            let mut shape: Dims = x.shape[..d].into();
            shape.extend_from_slice(&index.shape);
            shape.extend_from_slice(&x.shape[d + 1..]);
            return Ok(vec![Meta::new(&shape, x.dtype)]);
        }
        let d = check_vector_index(self.op_name(), self.dim, x, index)?;
        Ok(vec![Meta::new(
            &self.flat_shape(&x.shape, d, index.numel()),
            x.dtype,
        )])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0];
        let d = resolve_dim(self.op_name(), self.dim, x.shape())?;
        let ix = index_values(inputs[1])?;
        check_indices(self.op_name(), &ix, d, x.shape())?;
        let mut tabs = identity_tables(x);
        let st = x.strides()[d] as i64;
        tabs[d] = ix.iter().map(|&i| i * st).collect();
        let flat = Meta::new(&self.flat_shape(x.shape(), d, ix.len()), x.dtype());
        let t = cpu_tables(self.op_name(), x, &tabs, Scalar::Int(0), &flat)?;
        Ok(vec![t.reshape(&outputs[0].shape[..])?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let out = &outputs[0];
        if out.numel() == 0 {
            return Ok(vec![zeros(b, out)]);
        }
        let x = &inputs[0];
        let d = resolve_dim(self.op_name(), self.dim, x.dims())?;
        let n = inputs[1].ty.numel();
        let index = b.reshape(&inputs[1], &[n, 1]);
        let r = x.ty.rank();
        let offs: Vec<i64> = (0..r as i64).filter(|&k| k != d as i64).collect();
        let mut sizes: Vec<i64> = x.dims().iter().map(|&s| s as i64).collect();
        sizes[d] = 1;
        let offset_dims = if offs.is_empty() {
            String::new()
        } else {
            format!("offset_dims = {}, ", list(&offs))
        };
        let attrs = format!(
            "dimension_numbers = #stablehlo.gather<{offset_dims}collapsed_slice_dims = [{d}], start_index_map = [{d}], index_vector_dim = 1>, slice_sizes = {}, indices_are_sorted = false",
            i64_array(&sizes)
        );
        let flat = TensorType::new(&self.flat_shape(x.dims(), d, n), x.dtype());
        let g = b.op("stablehlo.gather", &[x, &index], &attrs, flat);
        Ok(vec![b.reshape(&g, &out.shape)])
    }

    fn lower_checks(
        &self,
        b: &mut FnBuilder,
        inputs: &[Value],
        _outputs: &[Meta],
    ) -> Result<Vec<DeviceCheck>> {
        index_check(b, self.op_name(), &inputs[1], self.dim, inputs[0].dims())
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The gradient's slices added into zeros at the indexed positions (duplicates
    /// accumulate); embedding flattens its index first. The index gets none.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None, None]);
        };
        let (x, index) = (&saved.inputs[0], &saved.inputs[1]);
        let d = resolve_dim(self.op_name(), self.dim, x.shape())?;
        let (index, g) = if self.embedding {
            let n = index.numel();
            (
                index.reshape([n])?,
                g.reshape(&self.flat_shape(x.shape(), d, n)[..])?,
            )
        } else {
            (index.clone(), g.clone())
        };
        let z = Tensor::zeros(x.shape(), g.dtype(), g.device())?;
        Ok(vec![Some(z.index_add(d, &index, &g, 1)?), None])
    }
}

/// `F.embedding`: rows of the 2-D `weight` named by `indices` (any shape, i64); the result has
/// shape `indices.shape + [weight.shape[1]]`.
pub fn embedding(indices: &Tensor, weight: &Tensor) -> Result<Tensor> {
    if weight.rank() != 2 {
        return Err(Error::shape(
            "embedding",
            format!(
                "expected a 2-D weight, got shape {}",
                fmt_shape(weight.shape())
            ),
        ));
    }
    crate::exec::dispatch::run1(
        &IndexSelect {
            dim: 0,
            embedding: true,
        },
        &[weight, indices],
    )
}

// ---- index_add ---------------------------------------------------------------------------------

/// `torch.index_add`: inputs `(x, index, source)`; adds `alpha * source[.., i, ..]` to
/// `x[.., index[i], ..]` along `dim`, accumulating duplicates.
#[derive(Clone, Debug)]
pub struct IndexAdd {
    /// The dim indexed (negative counts from the end).
    pub dim: i64,
    /// The factor applied to `source` (truncated to an integer for integer tensors).
    pub alpha: Scalar,
}

fn index_add_kernel<T: Element>(
    dev: &CpuDevice,
    out: &mut [T],
    xshape: &[usize],
    dim: usize,
    ix: &[i64],
    src: &[T],
    f: impl Fn(T, T) -> T + Sync + Send,
) -> Result<()> {
    let inner = numel(&xshape[dim + 1..]);
    let blk = xshape[dim] * inner;
    let len = ix.len();
    par_row_blocks(dev, out, blk, |first, chunk| {
        for (k, block) in chunk.chunks_mut(blk).enumerate() {
            let sb = (first + k) * len * inner;
            for (i, &t) in ix.iter().enumerate() {
                let dst = &mut block[t as usize * inner..][..inner];
                let s = &src[sb + i * inner..][..inner];
                for (o, &v) in dst.iter_mut().zip(s) {
                    *o = f(*o, v);
                }
            }
        }
    })
}

impl IndexAdd {
    fn run_cpu(&self, x: &Tensor, ix: &[i64], src: &Tensor, d: usize) -> Result<Tensor> {
        let dev = cpu_device("index_add", x)?;
        let out = x.copy()?;
        let src = src.contiguous()?;
        let r = Reader::new(&[&src]);
        by_acc_type!("index_add", x.dtype(), T, {
            let s = dense::<T>(&r, &src)?;
            let f = add_fn::<T>(self.alpha);
            in_place::<T>(&out, |o| index_add_kernel(&dev, o, x.shape(), d, ix, s, f))?
        });
        Ok(out)
    }
}

impl OpDef for IndexAdd {
    fn name(&self) -> &'static str {
        "index_add"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let (x, index, src) = (&inputs[0], &inputs[1], &inputs[2]);
        let d = check_vector_index("index_add", self.dim, x, index)?;
        need_same_dtype("index_add", "source", x, src)?;
        let mut want = x.shape.clone();
        want[d] = index.numel();
        if src.shape != want {
            return Err(Error::shape(
                "index_add",
                format!(
                    "expected source of shape {} (the input's shape {} with dim {d} the index's length {}), got {}",
                    fmt_shape(&want),
                    fmt_shape(&x.shape),
                    index.numel(),
                    fmt_shape(&src.shape)
                ),
            ));
        }
        Ok(vec![x.clone()])
    }

    fn cpu(&self, inputs: &[&Tensor], _outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let (x, src) = (inputs[0], inputs[2]);
        let d = resolve_dim("index_add", self.dim, x.shape())?;
        let ix = index_values(inputs[1])?;
        // As PyTorch: an empty source adds nothing, so its index is not checked.
        if src.numel() > 0 {
            check_indices("index_add", &ix, d, x.shape())?;
        }
        let dtype = x.dtype();
        let acc = acc_dtype(dtype);
        let out = if acc != dtype {
            let x32 = x.to_dtype(acc)?;
            let s32 = src.to_dtype(acc)?;
            self.run_cpu(&x32, &ix, &s32, d)?.to_dtype(dtype)?
        } else {
            self.run_cpu(x, &ix, src, d)?
        };
        Ok(vec![out])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], _outputs: &[Meta]) -> Result<Vec<Value>> {
        let (x, src) = (&inputs[0], &inputs[2]);
        let n = inputs[1].ty.numel();
        let dtype = x.dtype();
        if n == 0 || x.ty.numel() == 0 || (dtype == DType::Bool && self.alpha.to_f64() == 0.0) {
            return Ok(vec![x.clone()]);
        }
        let d = resolve_dim("index_add", self.dim, x.dims())?;
        let r = x.ty.rank();
        let comp = acc_dtype(dtype);
        let xc = b.convert(x, comp);
        let mut upd = b.convert(src, comp);
        let alpha = if comp.is_float() {
            Scalar::Float(self.alpha.to_f64())
        } else {
            Scalar::Int(self.alpha.to_i64())
        };
        if comp != DType::Bool && alpha.to_f64() != 1.0 {
            let a = b.splat(upd.ty.clone(), alpha);
            upd = b.ew("stablehlo.multiply", &[&upd, &a]);
        }
        let index = b.reshape(&inputs[1], &[n, 1]);
        let region = b.region(&[TensorType::scalar(comp)], 2, |b, a| {
            let name = if comp == DType::Bool {
                "stablehlo.or"
            } else {
                "stablehlo.add"
            };
            vec![b.ew(name, &[&a[0], &a[1]])]
        });
        let window: Vec<i64> = (0..r as i64).filter(|&k| k != d as i64).collect();
        let window = if window.is_empty() {
            String::new()
        } else {
            format!("update_window_dims = {}, ", list(&window))
        };
        let attrs = format!(
            "scatter_dimension_numbers = #stablehlo.scatter<{window}inserted_window_dims = [{d}], scatter_dims_to_operand_dims = [{d}], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false"
        );
        let s = b
            .op_n(
                "stablehlo.scatter",
                &[&xc, &index, &upd],
                &attrs,
                &region,
                std::slice::from_ref(&xc.ty),
            )
            .remove(0);
        Ok(vec![b.convert(&s, dtype)])
    }

    fn lower_checks(
        &self,
        b: &mut FnBuilder,
        inputs: &[Value],
        _outputs: &[Meta],
    ) -> Result<Vec<DeviceCheck>> {
        // As PyTorch: an empty source adds nothing, so its index is not checked.
        if inputs[2].ty.numel() == 0 {
            return Ok(Vec::new());
        }
        index_check(b, "index_add", &inputs[1], self.dim, inputs[0].dims())
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// Input: the gradient. Source: alpha times the gradient's slices at the index.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None, None, None]);
        };
        let index = &saved.inputs[1];
        let mut gs = g.index_select(self.dim, index)?;
        let alpha = self.alpha.to_f64();
        if alpha != 1.0 {
            gs = gs.mul(alpha)?;
        }
        Ok(vec![Some(g.clone()), None, Some(gs)])
    }
}

// ---- masked_fill -------------------------------------------------------------------------------

/// `torch.masked_fill`: inputs `(x, mask)`; `value` where the bool mask is true. The two
/// broadcast together, as PyTorch's out-of-place form.
#[derive(Clone, Debug)]
pub struct MaskedFill {
    /// The fill value (converted to the input's dtype).
    pub value: Scalar,
}

impl OpDef for MaskedFill {
    fn name(&self) -> &'static str {
        "masked_fill"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let (x, mask) = (&inputs[0], &inputs[1]);
        if mask.dtype != DType::Bool {
            return Err(Error::DTypeMismatch {
                context: format!("masked_fill: mask of shape {}", fmt_shape(&mask.shape)),
                expected: DType::Bool,
                given: mask.dtype,
            });
        }
        check_fill("masked_fill", self.value, x.dtype)?;
        let shape = broadcast_shapes("masked_fill", &x.shape, &mask.shape)?;
        Ok(vec![Meta::new(&shape, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let (x, mask) = (inputs[0], inputs[1]);
        let out = &outputs[0];
        let dev = cpu_device("masked_fill", x)?;
        let device = Device::from_cpu(dev.clone());
        let r = Reader::new(&[x, mask]);
        let md = r.data::<bool>(mask)?;
        let t = by_size!(x.dtype(), C, {
            let v: C = carrier_value(self.value, x.dtype())?;
            let xd = r.data::<C>(x)?;
            out_raw::<C>(out, &device, |o| {
                map2(&dev, (xd, x), (md, mask), &out.shape, o, |a: C, m: bool| {
                    if m { v } else { a }
                })
            })?
        });
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let out = &outputs[0];
        let x = b.broadcast_to(&inputs[0], &out.shape);
        let m = b.broadcast_to(&inputs[1], &out.shape);
        let v = b.splat(out.ty(), self.value);
        Ok(vec![b.select(&m, &v, &x)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The gradient, zero where the value was filled in. The mask gets none.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None, None]);
        };
        Ok(vec![Some(g.masked_fill(&saved.inputs[1], 0)?), None])
    }
}

// ---- one_hot -----------------------------------------------------------------------------------

/// The error for class `bad` at row-major position `i` of a one_hot input of `shape`.
fn one_hot_error(bad: i64, i: usize, c: usize, shape: &[usize]) -> Error {
    Error::invalid_argument(
        "one_hot",
        format!(
            "class values must lie in [0, {c}), got {bad} at element {i} of the input of shape {}",
            fmt_shape(shape)
        ),
    )
}

/// `F.one_hot`: i64 class indices to i64 rows of `num_classes` with a 1 at the class.
#[derive(Clone, Debug)]
pub struct OneHot {
    /// Row length.
    pub num_classes: usize,
}

impl OpDef for OneHot {
    fn name(&self) -> &'static str {
        "one_hot"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = &inputs[0];
        need_index("one_hot", "input", x)?;
        let mut shape = x.shape.clone();
        shape.push(self.num_classes);
        tpu_tensor::shape::checked_numel("one_hot", &shape)?;
        Ok(vec![Meta::new(&shape, DType::I64)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0];
        let dev = cpu_device("one_hot", x)?;
        let device = Device::from_cpu(dev.clone());
        let v = index_values(x)?;
        let c = self.num_classes;
        if let Some((i, &bad)) = v
            .iter()
            .enumerate()
            .find(|(_, v)| **v < 0 || **v as u64 >= c as u64)
        {
            return Err(one_hot_error(bad, i, c, x.shape()));
        }
        let t = out_raw::<i64>(&outputs[0], &device, |o| {
            par_row_blocks(&dev, o, c, |first, chunk| {
                for (k, row) in chunk.chunks_mut(c).enumerate() {
                    row[v[first + k] as usize] = 1;
                }
            })
        })?;
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let out = &outputs[0];
        if out.numel() == 0 {
            return Ok(vec![zeros(b, out)]);
        }
        let x = &inputs[0];
        let r = x.ty.rank();
        let map: Vec<i64> = (0..r as i64).collect();
        let xb = b.broadcast_in_dim(x, &map, &out.shape);
        let io = b.iota(&out.shape, r, DType::I64);
        let eq = b.compare(Cmp::Eq, &xb, &io);
        Ok(vec![b.convert(&eq, DType::I64)])
    }

    fn lower_checks(
        &self,
        b: &mut FnBuilder,
        inputs: &[Value],
        _outputs: &[Meta],
    ) -> Result<Vec<DeviceCheck>> {
        let x = &inputs[0];
        let c = self.num_classes;
        let shape = x.dims().to_vec();
        Ok(crate::hlo::checks::index_in_range(b, x, c, None)
            .map(|value| DeviceCheck {
                value,
                error: Arc::new(move |f: crate::hlo::checks::Found| {
                    one_hot_error(f.value, f.position, c, &shape)
                }),
            })
            .into_iter()
            .collect())
    }
}

// ---- tril / triu -------------------------------------------------------------------------------

/// `torch.tril` / `torch.triu` over the last two dims: keeps elements with `col - row` at most
/// (tril) or at least (triu) `diagonal`, zeroes the rest.
#[derive(Clone, Debug)]
pub struct Tri {
    /// triu rather than tril.
    pub upper: bool,
    /// The diagonal offset (positive is above the main diagonal).
    pub diagonal: i64,
}

impl Tri {
    fn op_name(&self) -> &'static str {
        if self.upper { "triu" } else { "tril" }
    }

    fn keep(&self, row: i64, col: i64) -> bool {
        if self.upper {
            col - row >= self.diagonal
        } else {
            col - row <= self.diagonal
        }
    }
}

impl OpDef for Tri {
    fn name(&self) -> &'static str {
        self.op_name()
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = &inputs[0];
        if x.rank() < 2 {
            return Err(Error::shape(
                self.op_name(),
                format!(
                    "expected a tensor with at least 2 dims, got shape {}",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        Ok(vec![x.clone()])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0].contiguous()?;
        let dev = cpu_device(self.op_name(), &x)?;
        let device = Device::from_cpu(dev.clone());
        let n = x.rank();
        let (rows, cols) = (x.shape()[n - 2], x.shape()[n - 1]);
        let r = Reader::new(&[&x]);
        let t = by_size!(x.dtype(), C, {
            let src = dense::<C>(&r, &x)?;
            out_raw::<C>(&outputs[0], &device, |o| {
                par_row_blocks(&dev, o, cols, |first, chunk| {
                    for (k, row) in chunk.chunks_mut(cols).enumerate() {
                        let rl = first + k;
                        let i = (rl % rows) as i64;
                        let s = &src[rl * cols..][..cols];
                        for (j, (o, &v)) in row.iter_mut().zip(s).enumerate() {
                            if self.keep(i, j as i64) {
                                *o = v;
                            }
                        }
                    }
                })
            })?
        });
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let x = &inputs[0];
        let out = &outputs[0];
        if out.numel() == 0 {
            return Ok(vec![zeros(b, out)]);
        }
        let dims = x.dims().to_vec();
        let n = dims.len();
        let row = b.iota(&dims, n - 2, DType::I64);
        let col = b.iota(&dims, n - 1, DType::I64);
        let diff = b.ew("stablehlo.subtract", &[&col, &row]);
        let k = b.splat(TensorType::new(&dims, DType::I64), self.diagonal);
        let keep = b.compare(if self.upper { Cmp::Ge } else { Cmp::Le }, &diff, &k);
        let z = zeros(b, out);
        Ok(vec![b.select(&keep, x, &z)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The same triangle of the gradient.
    fn backward(&self, _saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None]);
        };
        Ok(vec![Some(crate::exec::dispatch::run1(self, &[g])?)])
    }
}

// ---- repeat / flip / roll ----------------------------------------------------------------------

/// `Tensor.repeat`: tiles the tensor `sizes[i]` times along dim `i`; `sizes` may be longer than
/// the rank (new leading dims).
#[derive(Clone, Debug)]
pub struct Repeat {
    /// Repetitions per dim.
    pub sizes: Vec<usize>,
}

impl OpDef for Repeat {
    fn name(&self) -> &'static str {
        "repeat"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = &inputs[0];
        let m = self.sizes.len();
        if m < x.rank() {
            return Err(Error::shape(
                "repeat",
                format!(
                    "expected at least {} repetition counts for a tensor of shape {}, got {:?}",
                    x.rank(),
                    fmt_shape(&x.shape),
                    self.sizes
                ),
            ));
        }
        let lead = m - x.rank();
        let shape: Vec<usize> = (0..m)
            .map(|d| {
                let n = if d < lead { 1 } else { x.shape[d - lead] };
                n.checked_mul(self.sizes[d])
            })
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| Error::shape("repeat", "the result has too many elements"))?;
        tpu_tensor::shape::checked_numel("repeat", &shape)?;
        Ok(vec![Meta::new(&shape, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0];
        if let Some(t) = empty_output(x, &outputs[0])? {
            return Ok(vec![t]);
        }
        let lead = self.sizes.len() - x.rank();
        let tabs: Vec<Vec<i64>> = self
            .sizes
            .iter()
            .enumerate()
            .map(|(d, &reps)| {
                if d < lead {
                    return vec![0; reps];
                }
                let (n, st) = (x.shape()[d - lead], x.strides()[d - lead]);
                (0..reps * n).map(|o| ((o % n) * st) as i64).collect()
            })
            .collect();
        Ok(vec![cpu_tables(
            "repeat",
            x,
            &tabs,
            Scalar::Int(0),
            &outputs[0],
        )?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let out = &outputs[0];
        if out.numel() == 0 {
            return Ok(vec![zeros(b, out)]);
        }
        let x = &inputs[0];
        let m = self.sizes.len();
        let lead = m - x.ty.rank();
        let padded: Vec<usize> = (0..m)
            .map(|d| if d < lead { 1 } else { x.dims()[d - lead] })
            .collect();
        let xp = b.reshape(x, &padded);
        let wide: Vec<usize> = (0..m).flat_map(|d| [self.sizes[d], padded[d]]).collect();
        let map: Vec<i64> = (0..m as i64).map(|d| 2 * d + 1).collect();
        let w = b.broadcast_in_dim(&xp, &map, &wide);
        Ok(vec![b.reshape(&w, &out.shape)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The gradient seen as `[r0, s0, r1, s1, ..]` (repeats, sizes), summed over the repeats.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None]);
        };
        let x = &saved.inputs[0];
        let m = self.sizes.len();
        let lead = m.saturating_sub(x.rank());
        let wide: Vec<usize> = (0..m)
            .flat_map(|d| {
                let n = if d < lead { 1 } else { x.shape()[d - lead] };
                [self.sizes[d], n]
            })
            .collect();
        let reps: Vec<i64> = (0..m as i64).map(|d| 2 * d).collect();
        let summed = crate::ops::reduce_sum_dims(&g.reshape(&wide[..])?, &reps, false)?;
        Ok(vec![Some(summed.reshape(x.shape())?)])
    }
}

/// Resolves a list of dims, refusing repeats.
fn distinct_dims(op: &str, dims: &[i64], shape: &[usize]) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(dims.len());
    for &d in dims {
        let r = resolve_dim(op, d, shape)?;
        if out.contains(&r) {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "dim {r} appears more than once in {dims:?} (tensor shape {})",
                    fmt_shape(shape)
                ),
            ));
        }
        out.push(r);
    }
    Ok(out)
}

/// `torch.flip`: reverses the order of elements along `dims`.
#[derive(Clone, Debug)]
pub struct Flip {
    /// The dims to reverse (negative count from the end).
    pub dims: Vec<i64>,
}

impl OpDef for Flip {
    fn name(&self) -> &'static str {
        "flip"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        distinct_dims("flip", &self.dims, &inputs[0].shape)?;
        Ok(vec![inputs[0].clone()])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0];
        let dims = distinct_dims("flip", &self.dims, x.shape())?;
        let mut tabs = identity_tables(x);
        for &d in dims.iter().filter(|&&d| d < x.rank()) {
            tabs[d].reverse();
        }
        Ok(vec![cpu_tables(
            "flip",
            x,
            &tabs,
            Scalar::Int(0),
            &outputs[0],
        )?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], _outputs: &[Meta]) -> Result<Vec<Value>> {
        let x = &inputs[0];
        let dims: Vec<usize> = distinct_dims("flip", &self.dims, x.dims())?
            .into_iter()
            .filter(|&d| d < x.ty.rank() && x.dims()[d] > 1)
            .collect();
        if dims.is_empty() || x.ty.numel() == 0 {
            return Ok(vec![x.clone()]);
        }
        Ok(vec![reverse(b, x, &dims)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The gradient flipped back.
    fn backward(&self, _saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None]);
        };
        Ok(vec![Some(g.flip(&self.dims)?)])
    }
}

/// `torch.roll`: rotates elements along `dims` by `shifts` (element `i` moves to `i + shift`).
/// With no dims the tensor is rolled as if flattened, by its one shift.
#[derive(Clone, Debug)]
pub struct Roll {
    /// Shifts, one per dim.
    pub shifts: Vec<i64>,
    /// Dims (negative count from the end); empty rolls the flattened tensor.
    pub dims: Vec<i64>,
}

impl Roll {
    /// The total shift per dim of a tensor of `shape` (of the flattened tensor when `dims` is
    /// empty).
    fn plan(&self, shape: &[usize]) -> Result<Vec<i64>> {
        if self.dims.is_empty() {
            if self.shifts.len() != 1 {
                return Err(Error::invalid_argument(
                    "roll",
                    format!("without dims, expected one shift, got {:?}", self.shifts),
                ));
            }
            return Ok(vec![self.shifts[0]]);
        }
        if self.shifts.len() != self.dims.len() {
            return Err(Error::invalid_argument(
                "roll",
                format!(
                    "expected one shift per dim, got shifts {:?} and dims {:?}",
                    self.shifts, self.dims
                ),
            ));
        }
        if shape.is_empty() {
            return Err(Error::DimOutOfRange {
                op: "roll".into(),
                dim: self.dims[0],
                rank: 0,
                shape: vec![],
            });
        }
        let mut total = vec![0i64; shape.len()];
        for (&s, &d) in self.shifts.iter().zip(&self.dims) {
            let d = resolve_dim("roll", d, shape)?;
            total[d] = total[d].wrapping_add(s);
        }
        Ok(total)
    }
}

impl OpDef for Roll {
    fn name(&self) -> &'static str {
        "roll"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        self.plan(&inputs[0].shape)?;
        Ok(vec![inputs[0].clone()])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let out = &outputs[0];
        let x = if self.dims.is_empty() {
            inputs[0].reshape([inputs[0].numel()])?
        } else {
            inputs[0].clone()
        };
        let shifts = self.plan(x.shape())?;
        let mut tabs = identity_tables(&x);
        for ((t, &s), &n) in tabs.iter_mut().zip(&shifts).zip(x.shape()) {
            if n > 0 {
                t.rotate_right(s.rem_euclid(n as i64) as usize);
            }
        }
        let flat = Meta::new(x.shape(), out.dtype);
        let t = cpu_tables("roll", &x, &tabs, Scalar::Int(0), &flat)?;
        Ok(vec![t.reshape(&out.shape)?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let out = &outputs[0];
        if out.numel() == 0 {
            return Ok(vec![zeros(b, out)]);
        }
        let mut v = if self.dims.is_empty() {
            b.reshape(&inputs[0], &[out.numel()])
        } else {
            inputs[0].clone()
        };
        let shifts = self.plan(v.dims())?;
        for (d, &s) in shifts.iter().enumerate() {
            let n = v.dims()[d];
            let s = s.rem_euclid(n as i64) as usize;
            if s == 0 {
                continue;
            }
            let tail = slice_dim(b, &v, d, n - s, n);
            let head = slice_dim(b, &v, d, 0, n - s);
            v = b.concatenate(&[&tail, &head], d);
        }
        Ok(vec![b.reshape(&v, &out.shape)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The gradient rolled back by the opposite shifts.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None]);
        };
        let x = &saved.inputs[0];
        let flat = [x.numel()];
        let shape = if self.dims.is_empty() {
            &flat[..]
        } else {
            x.shape()
        };
        // Negate each dim's total shift modulo its size: negating the raw shift could overflow.
        let back: Vec<i64> = self
            .plan(shape)?
            .iter()
            .zip(shape)
            .map(|(&s, &n)| match n as i64 {
                0 => 0,
                n => (n - s.rem_euclid(n)) % n,
            })
            .collect();
        let dims: Vec<i64> = if self.dims.is_empty() {
            vec![]
        } else {
            (0..shape.len() as i64).collect()
        };
        Ok(vec![Some(g.roll(&back, &dims)?)])
    }
}

// ---- sort / topk -------------------------------------------------------------------------------

/// `torch.sort` (stable), or `torch.topk` when `k` is given: outputs (values, i64 indices)
/// along `dim`. NaN sorts as the largest value; equal values keep their order.
#[derive(Clone, Debug)]
pub struct Sort {
    /// The dim sorted (negative counts from the end).
    pub dim: i64,
    /// Largest first.
    pub descending: bool,
    /// Keep only the first `k` of the sorted order (topk).
    pub k: Option<usize>,
}

/// A key whose integer order is the sort order: floats by value with NaN above everything and
/// -0.0 equal to 0.0, integers and bool by value.
fn sort_key<T: Element>(v: T) -> i64 {
    if !T::DTYPE.is_float() {
        return v.to_i64();
    }
    let f = v.to_f64();
    if f.is_nan() {
        return i64::MAX;
    }
    let bits = (if f == 0.0 { 0.0f64 } else { f }).to_bits() as i64;
    if bits < 0 { bits ^ i64::MAX } else { bits }
}

impl Sort {
    fn op_name(&self) -> &'static str {
        if self.k.is_some() { "topk" } else { "sort" }
    }

    /// The resolved dim, its size and the number of elements kept.
    fn plan(&self, x: &Meta) -> Result<(usize, usize, usize)> {
        let op = self.op_name();
        let d = resolve_dim(op, self.dim, &x.shape)?;
        let n = at_least_1d(&x.shape)[d];
        let k = self.k.unwrap_or(n);
        // A 0-dim tensor's output keeps its (empty) shape, so it holds its one element even
        // for k = 0, as PyTorch's topk returns it.
        let k = if x.shape.is_empty() { k.max(1) } else { k };
        if k > n {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "k = {k} is larger than dim {d} of size {n} (tensor shape {})",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        Ok((d, n, k))
    }
}

impl OpDef for Sort {
    fn name(&self) -> &'static str {
        self.op_name()
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = &inputs[0];
        if self.k.is_some() {
            need_dtype("topk", x, DTypeSet::NUMERIC)?;
        }
        let (d, _, k) = self.plan(x)?;
        let mut shape = x.shape.clone();
        if !shape.is_empty() {
            shape[d] = k;
        }
        Ok(vec![
            Meta::new(&shape, x.dtype),
            Meta::new(&shape, DType::I64),
        ])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        // Planned on the input as given: a 0-dim one keeps its element whatever `k`.
        let (d, n, k) = self.plan(&Meta::of(inputs[0]))?;
        let x = as_1d(inputs[0])?;
        let x = x.contiguous()?;
        let dev = cpu_device(self.op_name(), &x)?;
        let device = Device::from_cpu(dev.clone());
        let outer = numel(&x.shape()[..d]);
        let inner = numel(&x.shape()[d + 1..]);
        let r = Reader::new(&[&x]);
        let keys: Vec<i64> = with_element!(x.dtype(), T, {
            dense::<T>(&r, &x)?.iter().map(|&v| sort_key(v)).collect()
        });
        let mut perm = vec![0i64; outer * k * inner];
        let descending = self.descending;
        par_row_blocks(&dev, &mut perm, k * inner, |first, chunk| {
            let mut order: Vec<usize> = Vec::with_capacity(n);
            for (b, blk) in chunk.chunks_mut(k * inner).enumerate() {
                let base = (first + b) * n * inner;
                for i in 0..inner {
                    let key = |j: usize| keys[base + j * inner + i];
                    order.clear();
                    order.extend(0..n);
                    if descending {
                        order.sort_by_key(|&j| std::cmp::Reverse(key(j)));
                    } else {
                        order.sort_by_key(|&j| key(j));
                    }
                    for (j, &s) in order[..k].iter().enumerate() {
                        blk[j * inner + i] = s as i64;
                    }
                }
            }
        })?;
        let values = by_size!(x.dtype(), C, {
            let src = dense::<C>(&r, &x)?;
            let perm = &perm;
            out_raw::<C>(&outputs[0], &device, |o| {
                par_row_blocks(&dev, o, k * inner, |first, chunk| {
                    for (b, blk) in chunk.chunks_mut(k * inner).enumerate() {
                        let ob = first + b;
                        let base = ob * n * inner;
                        let pb = ob * k * inner;
                        for (p, v) in blk.iter_mut().enumerate() {
                            let i = p % inner;
                            *v = src[base + perm[pb + p] as usize * inner + i];
                        }
                    }
                })
            })?
        });
        let indices = Tensor::from_vec(perm, &outputs[1].shape[..], &device)?;
        Ok(vec![values, indices])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        if outputs[0].numel() == 0 {
            return Ok(vec![zeros(b, &outputs[0]), zeros(b, &outputs[1])]);
        }
        let (d, _, k) = self.plan(&Meta::new(inputs[0].dims(), inputs[0].dtype()))?;
        let x = b.reshape(&inputs[0], &at_least_1d(inputs[0].dims()));
        let dtype = x.dtype();
        let xv = if dtype == DType::Bool {
            b.convert(&x, DType::U8)
        } else {
            x.clone()
        };
        let idx = b.iota(x.dims(), d, DType::I64);
        let st = TensorType::scalar(xv.dtype());
        let it = TensorType::scalar(DType::I64);
        let float = xv.dtype().is_float();
        let descending = self.descending;
        let region = b.region(&[st.clone(), st, it.clone(), it], 1, |b, a| {
            let (l, r) = (&a[0], &a[1]);
            let dir = if descending { Cmp::Gt } else { Cmp::Lt };
            let ordered = b.compare(dir, l, r);
            if !float {
                return vec![ordered];
            }
            // NaN is the largest value: it goes before numbers when descending, after them
            // when ascending.
            let l_nan = b.compare(Cmp::Ne, l, l);
            let r_nan = b.compare(Cmp::Ne, r, r);
            let nan_first = if descending {
                let r_num = b.ew("stablehlo.not", &[&r_nan]);
                b.ew("stablehlo.and", &[&l_nan, &r_num])
            } else {
                let l_num = b.ew("stablehlo.not", &[&l_nan]);
                b.ew("stablehlo.and", &[&l_num, &r_nan])
            };
            vec![b.ew("stablehlo.or", &[&nan_first, &ordered])]
        });
        let attrs = format!("dimension = {d} : i64, is_stable = true");
        let mut outs = b.op_n(
            "stablehlo.sort",
            &[&xv, &idx],
            &attrs,
            &region,
            &[xv.ty.clone(), idx.ty.clone()],
        );
        let (mut vals, mut ids) = (outs.remove(0), outs.remove(0));
        if k < x.dims()[d] {
            vals = slice_dim(b, &vals, d, 0, k);
            ids = slice_dim(b, &ids, d, 0, k);
        }
        let vals = b.convert(&vals, dtype);
        Ok(vec![
            b.reshape(&vals, &outputs[0].shape),
            b.reshape(&ids, &outputs[1].shape),
        ])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The values' gradient written back where the values came from; the indices get none.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None]);
        };
        let (x, indices) = (&saved.inputs[0], &saved.outputs[1]);
        let z = Tensor::zeros(x.shape(), g.dtype(), g.device())?;
        Ok(vec![Some(z.scatter(self.dim, indices, g)?)])
    }
}

fn run2(op: &dyn OpDef, inputs: &[&Tensor]) -> Result<(Tensor, Tensor)> {
    let mut out = crate::exec::dispatch::run(op, inputs)?;
    if out.len() != 2 {
        return Err(internal(op.name(), "expected two outputs"));
    }
    let b = out.remove(1);
    Ok((out.remove(0), b))
}

// ---- methods -----------------------------------------------------------------------------------

/// This file's ops as methods on `Tensor`, with PyTorch's names and semantics. Index tensors
/// are i64.
pub trait MovementOps {
    /// `F.pad`: `pads` are (before, after) pairs starting from the last dim.
    fn pad(&self, pads: &[usize], mode: PadMode) -> Result<Tensor>;
    /// `torch.gather` along `dim` (indices must lie in `[0, size)`).
    fn gather(&self, dim: impl Dim, index: &Tensor) -> Result<Tensor>;
    /// `torch.scatter` of a tensor of updates along `dim`.
    fn scatter(&self, dim: impl Dim, index: &Tensor, src: &Tensor) -> Result<Tensor>;
    /// `torch.scatter` of one value along `dim`.
    fn scatter_value(
        &self,
        dim: impl Dim,
        index: &Tensor,
        value: impl Into<Scalar>,
    ) -> Result<Tensor>;
    /// `torch.scatter_add` along `dim`; duplicate indices accumulate.
    fn scatter_add(&self, dim: impl Dim, index: &Tensor, src: &Tensor) -> Result<Tensor>;
    /// `torch.index_select` with a 1-D index.
    fn index_select(&self, dim: impl Dim, index: &Tensor) -> Result<Tensor>;
    /// `torch.index_add`: adds `alpha * source` at the slices `index` names along `dim`.
    fn index_add(
        &self,
        dim: impl Dim,
        index: &Tensor,
        source: &Tensor,
        alpha: impl Into<Scalar>,
    ) -> Result<Tensor>;
    /// `torch.masked_fill` with a bool mask (broadcast).
    fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor>;
    /// `F.one_hot` of an i64 tensor; `num_classes = -1` uses the largest value plus one (read
    /// back to the host on PJRT devices).
    fn one_hot(&self, num_classes: i64) -> Result<Tensor>;
    /// `torch.tril`: zeroes elements above the `diagonal`-th diagonal.
    fn tril(&self, diagonal: i64) -> Result<Tensor>;
    /// `torch.triu`: zeroes elements below the `diagonal`-th diagonal.
    fn triu(&self, diagonal: i64) -> Result<Tensor>;
    /// `Tensor.repeat`: tiles `sizes[i]` times along dim `i` (at least one size per dim).
    fn repeat(&self, sizes: &[usize]) -> Result<Tensor>;
    /// `torch.tile`: like `repeat`, with missing leading repetitions taken as 1.
    fn tile(&self, reps: &[usize]) -> Result<Tensor>;
    /// `torch.flip`: reverses `dims`.
    fn flip(&self, dims: &[i64]) -> Result<Tensor>;
    /// `torch.roll` by `shifts` along `dims` (empty `dims`: the flattened tensor).
    fn roll(&self, shifts: &[i64], dims: &[i64]) -> Result<Tensor>;
    /// `torch.topk`: the `k` largest (or smallest) along `dim` and their i64 indices, always in
    /// sorted order; ties go to the lower index.
    fn topk(
        &self,
        k: usize,
        dim: impl Dim,
        largest: bool,
        sorted: bool,
    ) -> Result<(Tensor, Tensor)>;
    /// `torch.sort` along `dim`: sorted values and i64 indices. The sort is always stable, which
    /// is a valid result for `stable = false` too; NaN counts as the largest value.
    fn sort(&self, dim: impl Dim, descending: bool, stable: bool) -> Result<(Tensor, Tensor)>;
    /// `torch.argsort`: the indices of [`MovementOps::sort`].
    fn argsort(&self, dim: impl Dim, descending: bool, stable: bool) -> Result<Tensor>;
}

impl MovementOps for Tensor {
    fn pad(&self, pads: &[usize], mode: PadMode) -> Result<Tensor> {
        let op = Pad {
            pads: pads.to_vec(),
            mode,
        };
        crate::exec::dispatch::run1(&op, &[self])
    }

    fn gather(&self, dim: impl Dim, index: &Tensor) -> Result<Tensor> {
        crate::exec::dispatch::run1(&Gather { dim: dim.to_i64() }, &[self, index])
    }

    fn scatter(&self, dim: impl Dim, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let op = Scatter {
            dim: dim.to_i64(),
            reduce: ScatterReduce::Replace,
            value: false,
        };
        crate::exec::dispatch::run1(&op, &[self, index, src])
    }

    fn scatter_value(
        &self,
        dim: impl Dim,
        index: &Tensor,
        value: impl Into<Scalar>,
    ) -> Result<Tensor> {
        let value = value.into();
        check_fill("scatter", value, self.dtype())?;
        let v = Tensor::full([0usize; 0], value, self.dtype(), self.device())?;
        let op = Scatter {
            dim: dim.to_i64(),
            reduce: ScatterReduce::Replace,
            value: true,
        };
        crate::exec::dispatch::run1(&op, &[self, index, &v])
    }

    fn scatter_add(&self, dim: impl Dim, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let op = Scatter {
            dim: dim.to_i64(),
            reduce: ScatterReduce::Add,
            value: false,
        };
        crate::exec::dispatch::run1(&op, &[self, index, src])
    }

    fn index_select(&self, dim: impl Dim, index: &Tensor) -> Result<Tensor> {
        let op = IndexSelect {
            dim: dim.to_i64(),
            embedding: false,
        };
        crate::exec::dispatch::run1(&op, &[self, index])
    }

    fn index_add(
        &self,
        dim: impl Dim,
        index: &Tensor,
        source: &Tensor,
        alpha: impl Into<Scalar>,
    ) -> Result<Tensor> {
        let op = IndexAdd {
            dim: dim.to_i64(),
            alpha: alpha.into(),
        };
        crate::exec::dispatch::run1(&op, &[self, index, source])
    }

    fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let op = MaskedFill {
            value: value.into(),
        };
        crate::exec::dispatch::run1(&op, &[self, mask])
    }

    fn one_hot(&self, num_classes: i64) -> Result<Tensor> {
        need_index("one_hot", "input", &Meta::of(self))?;
        let c = match num_classes {
            -1 => {
                let v = self
                    .to_device(&Device::cpu())?
                    .contiguous()?
                    .to_vec::<i64>()?;
                let max = v.iter().copied().max().ok_or_else(|| {
                    Error::invalid_argument(
                        "one_hot",
                        "cannot infer the number of classes (-1) from an empty tensor",
                    )
                })?;
                usize::try_from(max.saturating_add(1)).unwrap_or(0)
            }
            c if c >= 0 => c as usize,
            c => {
                return Err(Error::invalid_argument(
                    "one_hot",
                    format!("num_classes must be -1 or at least 0, got {c}"),
                ));
            }
        };
        crate::exec::dispatch::run1(&OneHot { num_classes: c }, &[self])
    }

    fn tril(&self, diagonal: i64) -> Result<Tensor> {
        let op = Tri {
            upper: false,
            diagonal,
        };
        crate::exec::dispatch::run1(&op, &[self])
    }

    fn triu(&self, diagonal: i64) -> Result<Tensor> {
        let op = Tri {
            upper: true,
            diagonal,
        };
        crate::exec::dispatch::run1(&op, &[self])
    }

    fn repeat(&self, sizes: &[usize]) -> Result<Tensor> {
        let op = Repeat {
            sizes: sizes.to_vec(),
        };
        crate::exec::dispatch::run1(&op, &[self])
    }

    fn tile(&self, reps: &[usize]) -> Result<Tensor> {
        let mut sizes = vec![1; self.rank().saturating_sub(reps.len())];
        sizes.extend_from_slice(reps);
        self.repeat(&sizes)
    }

    fn flip(&self, dims: &[i64]) -> Result<Tensor> {
        let op = Flip {
            dims: dims.to_vec(),
        };
        crate::exec::dispatch::run1(&op, &[self])
    }

    fn roll(&self, shifts: &[i64], dims: &[i64]) -> Result<Tensor> {
        let op = Roll {
            shifts: shifts.to_vec(),
            dims: dims.to_vec(),
        };
        crate::exec::dispatch::run1(&op, &[self])
    }

    fn topk(
        &self,
        k: usize,
        dim: impl Dim,
        largest: bool,
        _sorted: bool,
    ) -> Result<(Tensor, Tensor)> {
        let op = Sort {
            dim: dim.to_i64(),
            descending: largest,
            k: Some(k),
        };
        run2(&op, &[self])
    }

    fn sort(&self, dim: impl Dim, descending: bool, _stable: bool) -> Result<(Tensor, Tensor)> {
        let op = Sort {
            dim: dim.to_i64(),
            descending,
            k: None,
        };
        run2(&op, &[self])
    }

    fn argsort(&self, dim: impl Dim, descending: bool, stable: bool) -> Result<Tensor> {
        Ok(self.sort(dim, descending, stable)?.1)
    }
}

// ---- the op table ------------------------------------------------------------------------------

/// Small integers in `[-6, 6]` (0 or 1 for bool) of `dtype`, on the CPU: exact in every dtype,
/// with ties for the sorts.
fn ints(seed: u64, shape: &[usize], dtype: DType) -> Result<Tensor> {
    let cpu = Device::cpu();
    let mut g = Generator::new(seed);
    if dtype == DType::Bool {
        return g.randint(0, 2, shape, DType::Bool, &cpu);
    }
    g.randint(-6, 7, shape, DType::I64, &cpu)?.to_dtype(dtype)
}

/// Random values with fractions for floats (for the accumulating ops), small integers
/// otherwise.
fn reals(seed: u64, shape: &[usize], dtype: DType) -> Result<Tensor> {
    if !dtype.is_float() {
        return ints(seed, shape, dtype);
    }
    let x = Generator::new(seed).randn(shape, DType::F64, &Device::cpu())?;
    crate::op::samples::host_map(&x, |v| v * 3.0)?.to_dtype(dtype)
}

fn idx_tensor(values: &[i64], shape: &[usize], dev: &Device) -> Result<Tensor> {
    Tensor::from_slice(values, shape, &Device::cpu())?.to_device(dev)
}

type SampleFn = fn(DType, &Device) -> Result<Vec<Tensor>>;

fn row(name: &'static str, cpu: DTypeSet, tolerance: f64, f: SampleFn) -> OpInfo {
    OpInfo {
        name,
        cpu,
        hlo: cpu,
        sample: Arc::new(f),
        tolerance,
    }
}

/// A `[2, 3, 4]` view that is not contiguous.
fn cube(seed: u64, d: DType, dev: &Device) -> Result<Tensor> {
    ints(seed, &[3, 2, 4], d)?
        .to_device(dev)?
        .permute([1, 0, 2])
}

fn sample_cat(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let cpu = Device::cpu();
    let a = ints(1, &[2, 3], d)?.to_device(dev)?;
    let b = ints(2, &[3, 2], d)?.to_device(dev)?.t()?;
    let c = ints(3, &[2, 1], DType::Bool)?.to_device(dev)?;
    let e = Tensor::zeros([0], d, &cpu)?.to_device(dev)?;
    Ok(vec![cat(&[&a, &e, &b, &c], -1)?])
}

fn sample_stack(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let a = ints(4, &[2, 3], d)?.to_device(dev)?;
    let b = ints(5, &[3, 2], d)?.to_device(dev)?.t()?;
    Ok(vec![stack(&[&a, &b], 1)?])
}

fn sample_pad(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = cube(6, d, dev)?;
    Ok(vec![x.pad(
        &[1, 2, 0, 1],
        PadMode::Constant(Scalar::Float(2.5)),
    )?])
}

fn sample_reflect(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = cube(7, d, dev)?;
    Ok(vec![x.pad(&[2, 1, 1, 2], PadMode::Reflect)?])
}

fn sample_replicate(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = cube(8, d, dev)?;
    Ok(vec![x.pad(&[3, 0, 0, 4, 1, 0], PadMode::Replicate)?])
}

fn sample_gather(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = ints(9, &[3, 4], d)?.to_device(dev)?.t()?;
    let i0 = idx_tensor(&[3, 0, 1, 2, 2, 0], &[2, 3], dev)?;
    let i1 = idx_tensor(&[2, 0, 1, 1, 0, 0, 2, 1], &[4, 2], dev)?;
    Ok(vec![x.gather(0, &i0)?, x.gather(-1, &i1)?])
}

fn sample_scatter(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    // scatter_value shares the lowering; the literal tests run it through XLA.
    let x = ints(10, &[3, 4], d)?.to_device(dev)?;
    let src = ints(11, &[4, 3], d)?.to_device(dev)?.t()?;
    let i1 = idx_tensor(&[3, 0, 1, 1, 2, 0], &[2, 3], dev)?;
    Ok(vec![x.scatter(1, &i1, &src)?])
}

fn sample_scatter_add(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = reals(12, &[3, 4], d)?.to_device(dev)?;
    let src = reals(13, &[4, 5], d)?.to_device(dev)?.t()?;
    let i = idx_tensor(
        &[0, 2, 2, 1, 2, 2, 0, 1, 0, 2, 1, 1, 2, 2, 0, 1],
        &[4, 4],
        dev,
    )?;
    Ok(vec![x.scatter_add(0, &i, &src)?])
}

fn sample_index_select(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = ints(14, &[3, 4], d)?.to_device(dev)?.t()?;
    let i = idx_tensor(&[2, 0, 2, 1, 1], &[5], dev)?;
    Ok(vec![x.index_select(-1, &i)?])
}

fn sample_index_add(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = reals(15, &[5, 3], d)?.to_device(dev)?;
    let src = reals(16, &[3, 4], d)?.to_device(dev)?.t()?;
    let i = idx_tensor(&[1, 4, 1, 0], &[4], dev)?;
    Ok(vec![x.index_add(0, &i, &src, 2)?])
}

fn sample_masked_fill(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = ints(17, &[4, 3], d)?.to_device(dev)?.t()?;
    let m = ints(18, &[4], DType::Bool)?.to_device(dev)?;
    Ok(vec![x.masked_fill(&m, 1.5)?])
}

fn sample_embedding(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let w = ints(19, &[3, 5], d)?.to_device(dev)?.t()?;
    let i = idx_tensor(&[4, 0, 2, 4], &[2, 2], dev)?;
    Ok(vec![embedding(&i, &w)?])
}

fn sample_one_hot(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = Tensor::from_slice(&[0i64, 3, 1, 1, 0, 2], [2, 3], &Device::cpu())?
        .to_dtype(d)?
        .to_device(dev)?;
    Ok(vec![x.one_hot(-1)?])
}

fn sample_tril(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    Ok(vec![cube(20, d, dev)?.tril(-1)?])
}

fn sample_triu(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    Ok(vec![cube(21, d, dev)?.triu(1)?])
}

fn sample_repeat(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = ints(22, &[3, 2], d)?.to_device(dev)?.t()?;
    Ok(vec![x.repeat(&[2, 1, 3])?])
}

fn sample_tile(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = ints(23, &[3, 2], d)?.to_device(dev)?.t()?;
    Ok(vec![x.tile(&[2])?])
}

fn sample_flip(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    Ok(vec![cube(24, d, dev)?.flip(&[0, -1])?])
}

fn sample_roll(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    // The flattened roll is one of the literal tests on XLA.
    Ok(vec![cube(25, d, dev)?.roll(&[1, -2], &[0, 2])?])
}

/// A `[3, 5]` non-contiguous view with ties, and NaNs for floats.
fn sort_input(d: DType, dev: &Device) -> Result<Tensor> {
    let mut v = ints(26, &[5, 3], DType::I64)?
        .to_dtype(DType::F64)?
        .to_vec::<f64>()?;
    if d.is_float() {
        v[2] = f64::NAN;
        v[7] = f64::NAN;
        v[8] = -0.0;
    }
    let x = Tensor::from_vec(v, [5, 3], &Device::cpu())?;
    let x = if d == DType::Bool {
        crate::op::samples::host_map(&x, |v| (v > 0.0) as u8 as f64)?
    } else {
        x
    };
    x.to_dtype(d)?.to_device(dev)?.t()
}

fn sample_sort(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    // Descending here; the argsort row sorts ascending.
    let (a, b) = sort_input(d, dev)?.sort(1, true, true)?;
    Ok(vec![a, b])
}

fn sample_argsort(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    Ok(vec![sort_input(d, dev)?.argsort(0, false, true)?])
}

fn sample_topk(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    // Distinct values: which of several equal values topk returns is not specified.
    let v: Vec<i64> = (0..15).map(|i| (i * 7) % 15 - 7).collect();
    let x = Tensor::from_vec(v, [5, 3], &Device::cpu())?
        .to_dtype(d)?
        .to_device(dev)?
        .t()?;
    let (a, b) = x.topk(3, -1, true, true)?;
    Ok(vec![a, b])
}

/// The rows of the op table for this file's ops.
pub fn table() -> Vec<OpInfo> {
    let all = DTypeSet::ALL;
    let num = DTypeSet::NUMERIC;
    let rows = vec![
        row("cat", all, 0.0, sample_cat),
        row("stack", all, 0.0, sample_stack),
        row("pad", all, 0.0, sample_pad),
        row("pad(reflect)", num, 0.0, sample_reflect),
        row("pad(replicate)", num, 0.0, sample_replicate),
        row("gather", all, 0.0, sample_gather),
        row("scatter", all, 0.0, sample_scatter),
        // Additions may happen in another order in XLA.
        row("scatter_add", all, 1e-6, sample_scatter_add),
        row("index_select", all, 0.0, sample_index_select),
        row("index_add", all, 1e-6, sample_index_add),
        row("masked_fill", all, 0.0, sample_masked_fill),
        row("embedding", all, 0.0, sample_embedding),
        row("one_hot", DTypeSet::of(&[DType::I64]), 0.0, sample_one_hot),
        row("tril", all, 0.0, sample_tril),
        row("triu", all, 0.0, sample_triu),
        row("repeat", all, 0.0, sample_repeat),
        row("tile", all, 0.0, sample_tile),
        row("flip", all, 0.0, sample_flip),
        row("roll", all, 0.0, sample_roll),
        row("sort", all, 0.0, sample_sort),
        row("argsort", all, 0.0, sample_argsort),
        row("topk", num, 0.0, sample_topk),
    ];
    rows
}
