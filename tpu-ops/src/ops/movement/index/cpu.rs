//! CPU kernels of the index ops. Index values are checked before any element moves; scatter_add
//! and index_add sum f16/bf16 in f32 and round once per element (as PyTorch's CPU scatter_add).

use tpu_tensor::shape::{contiguous_strides, resolve_dim};
use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::{DType, Dims, Element, Error, Result, Scalar, Tensor};

use super::super::args::{at_least_1d, numel};
use super::super::cpu::{
    as_1d, by_size, check_indices, contiguous_elements, cpu_tables, identity_tables, in_place,
    index_values, out_raw, ravel, step, unravel,
};
use super::{
    Gather, IndexAdd, IndexCopy, IndexSelect, OneHot, Scatter, ScatterReduce, one_hot_error,
};
use crate::cpu::kernels::{Reader, cpu_context, cpu_device, par_row_blocks};
use crate::op::Meta;
use crate::op::promote::compute_dtype;

/// Runs `$body` with `$T` the element type of a dtype that accumulates in itself (16-bit floats
/// are widened to f32 before accumulating, so they never get here).
macro_rules! by_acc_type {
    ($op:expr, $dtype:expr, $T:ident, $body:expr) => {
        by_acc_type!(@arms $op, $dtype, $T, $body,
            [Bool bool, U8 u8, I8 i8, I32 i32, I64 i64, F32 f32, F64 f64])
    };
    (@arms $op:expr, $dtype:expr, $T:ident, $body:expr, [$($D:ident $t:ty),*]) => {
        match $dtype {
            $(DType::$D => {
                type $T = $t;
                $body
            })*
            d => {
                return Err(Error::internal(
                    $op,
                    format!("no accumulating kernel for {d}"),
                ))
            }
        }
    };
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

/// `a * b` in `T` (`and` for bool), wrapping for integers.
fn mul_fn<T: Element>(a: T, b: T) -> T {
    if T::DTYPE == DType::F64 {
        T::from_f64(a.to_f64() * b.to_f64())
    } else if T::DTYPE.is_float() {
        T::from_f64((a.to_f64() as f32 * b.to_f64() as f32) as f64)
    } else if T::DTYPE == DType::Bool {
        T::from_i64((a.to_i64() != 0 && b.to_i64() != 0) as i64)
    } else {
        T::from_i64(a.to_i64().wrapping_mul(b.to_i64()))
    }
}

/// Whether `b` replaces `a` as the max (or min): it is larger (smaller), or NaN while `a` is
/// not (NaN wins, as in PyTorch's scatter_reduce).
fn replaces<T: Element>(a: T, b: T, max: bool) -> bool {
    if T::DTYPE.is_float() {
        let (a, b) = (a.to_f64(), b.to_f64());
        !a.is_nan() && (b.is_nan() || if max { b > a } else { b < a })
    } else if max {
        b.to_i64() > a.to_i64()
    } else {
        b.to_i64() < a.to_i64()
    }
}

/// How a scatter combines the element with an update.
fn reduce_fn<T: Element>(reduce: ScatterReduce) -> impl Fn(T, T) -> T + Sync + Send + Copy {
    let add = add_fn::<T>(Scalar::Int(1));
    move |a: T, b: T| match reduce {
        ScatterReduce::Replace => b,
        ScatterReduce::Add => add(a, b),
        ScatterReduce::Prod => mul_fn(a, b),
        ScatterReduce::Amax => {
            if replaces(a, b, true) {
                b
            } else {
                a
            }
        }
        ScatterReduce::Amin => {
            if replaces(a, b, false) {
                b
            } else {
                a
            }
        }
    }
}

/// Reads `src` (storage offset `base`, strides `strides`) at the positions an index tensor
/// names.
#[derive(Clone, Copy)]
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

pub(super) fn gather(op: &Gather, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let x = as_1d(inputs[0])?;
    let index = inputs[1].contiguous()?;
    let d = resolve_dim("gather", op.dim, x.shape())?;
    let (dev, device) = cpu_context("gather", &x)?;
    let r = Reader::new(&[&x, &index]);
    let ix = contiguous_elements::<i64>(&r, &index)?;
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

/// Scatter on CPU tensors of one dtype (`x` 1-D at least, `src` broadcast already).
fn scatter_same_dtype(
    scatter: &Scatter,
    x: &Tensor,
    index: &Tensor,
    src: &Tensor,
    d: usize,
) -> Result<Tensor> {
    let op = scatter.op_name();
    let dev = cpu_device(op, x)?;
    let out = x.copy()?;
    let r = Reader::new(&[index, src]);
    let ix = contiguous_elements::<i64>(&r, index)?;
    check_indices(op, ix, d, x.shape())?;
    let ishape = at_least_1d(index.shape());
    let reduce = scatter.reduce;
    let include_self = scatter.include_self;
    if reduce == ScatterReduce::Replace {
        by_size!(x.dtype(), C, {
            let s = Strided {
                data: r.data::<C>(src)?,
                base: src.offset(),
                strides: src.strides(),
            };
            in_place::<C>(&out, |o| {
                scatter_kernel(&dev, o, x.shape(), d, ix, &ishape, s, |_, v| v)
            })?
        });
        return Ok(out);
    }
    by_acc_type!(op, x.dtype(), T, {
        let s = Strided {
            data: r.data::<T>(src)?,
            base: src.offset(),
            strides: src.strides(),
        };
        let start = reduce.identity(T::DTYPE).to_element::<T>();
        in_place::<T>(&out, |o| {
            if !include_self {
                scatter_kernel(&dev, o, x.shape(), d, ix, &ishape, s, |_, _| start)?;
            }
            scatter_kernel(
                &dev,
                o,
                x.shape(),
                d,
                ix,
                &ishape,
                s,
                reduce_fn::<T>(reduce),
            )
        })?
    });
    Ok(out)
}

pub(super) fn scatter(op: &Scatter, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let x = as_1d(inputs[0])?;
    let index = as_1d(inputs[1])?;
    let index = index.contiguous()?;
    let src = if op.value {
        inputs[2].expand(index.shape().to_vec())?
    } else {
        as_1d(inputs[2])?
    };
    let d = resolve_dim(op.op_name(), op.dim, x.shape())?;
    let dtype = x.dtype();
    let acc = compute_dtype(dtype);
    let out = if op.accumulates() && acc != dtype {
        let x32 = x.to_dtype(acc)?;
        let s32 = src.to_dtype(acc)?;
        scatter_same_dtype(op, &x32, &index, &s32, d)?.to_dtype(dtype)?
    } else {
        scatter_same_dtype(op, &x, &index, &src, d)?
    };
    Ok(vec![out.reshape(&outputs[0].shape)?])
}

pub(super) fn index_select(
    op: &IndexSelect,
    inputs: &[&Tensor],
    outputs: &[Meta],
) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let d = resolve_dim(op.op_name(), op.dim, x.shape())?;
    let ix = index_values(inputs[1])?;
    check_indices(op.op_name(), &ix, d, x.shape())?;
    let mut tabs = identity_tables(x);
    let st = x.strides()[d] as i64;
    tabs[d] = ix.iter().map(|&i| i * st).collect();
    let flat = Meta::new(&op.flat_shape(x.shape(), d, ix.len()), x.dtype());
    let t = cpu_tables(op.op_name(), x, &tabs, Scalar::Int(0), &flat)?;
    Ok(vec![t.reshape(&outputs[0].shape[..])?])
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

fn index_add_same_dtype(
    op: &IndexAdd,
    x: &Tensor,
    ix: &[i64],
    src: &Tensor,
    d: usize,
) -> Result<Tensor> {
    let dev = cpu_device("index_add", x)?;
    let out = x.copy()?;
    let src = src.contiguous()?;
    let r = Reader::new(&[&src]);
    by_acc_type!("index_add", x.dtype(), T, {
        let s = contiguous_elements::<T>(&r, &src)?;
        let f = add_fn::<T>(op.alpha);
        in_place::<T>(&out, |o| index_add_kernel(&dev, o, x.shape(), d, ix, s, f))?
    });
    Ok(out)
}

pub(super) fn index_add(
    op: &IndexAdd,
    inputs: &[&Tensor],
    _outputs: &[Meta],
) -> Result<Vec<Tensor>> {
    let (x, src) = (inputs[0], inputs[2]);
    let d = resolve_dim("index_add", op.dim, x.shape())?;
    let ix = index_values(inputs[1])?;
    // As PyTorch: an empty source adds nothing, so its index is not checked.
    if src.numel() > 0 {
        check_indices("index_add", &ix, d, x.shape())?;
    }
    let dtype = x.dtype();
    let acc = compute_dtype(dtype);
    let out = if acc != dtype {
        let x32 = x.to_dtype(acc)?;
        let s32 = src.to_dtype(acc)?;
        index_add_same_dtype(op, &x32, &ix, &s32, d)?.to_dtype(dtype)?
    } else {
        index_add_same_dtype(op, x, &ix, src, d)?
    };
    Ok(vec![out])
}

pub(super) fn index_copy(
    op: &IndexCopy,
    inputs: &[&Tensor],
    _outputs: &[Meta],
) -> Result<Vec<Tensor>> {
    let (x, src) = (inputs[0], inputs[2]);
    let d = resolve_dim("index_copy", op.dim, x.shape())?;
    let ix = index_values(inputs[1])?;
    // As PyTorch: an empty source copies nothing, so its index is not checked.
    if src.numel() > 0 {
        check_indices("index_copy", &ix, d, x.shape())?;
    }
    let dev = cpu_device("index_copy", x)?;
    let out = x.copy()?;
    let src = src.contiguous()?;
    let r = Reader::new(&[&src]);
    by_size!(x.dtype(), C, {
        let s = contiguous_elements::<C>(&r, &src)?;
        in_place::<C>(&out, |o| {
            index_add_kernel(&dev, o, x.shape(), d, &ix, s, |_, v| v)
        })?
    });
    Ok(vec![out])
}

pub(super) fn one_hot(op: &OneHot, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let (dev, device) = cpu_context("one_hot", x)?;
    let v = index_values(x)?;
    let c = op.num_classes;
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
