//! CPU kernel pieces the movement sub-families share: element-size dispatch (most of these ops
//! only move bytes), fresh outputs, multi-index walks, index checks, and the table-driven copy
//! that pad, repeat, flip, roll and index_select all run on.

use tpu_tensor::tpu_runtime::{Buffer, CpuDevice};
use tpu_tensor::{DType, Device, Dims, Element, Error, Result, Scalar, Tensor, with_element};

use crate::cpu::kernels::{Reader, cpu_context, par_row_blocks};
use crate::op::Meta;

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
pub(super) use by_size;

/// A 0-dim tensor as a 1-element vector (a view); other tensors unchanged.
pub(super) fn as_1d(t: &Tensor) -> Result<Tensor> {
    if t.rank() == 0 {
        t.reshape([1])
    } else {
        Ok(t.clone())
    }
}

/// The multi-index of row-major position `lin` in `shape`.
pub(super) fn unravel(mut lin: usize, shape: &[usize]) -> Dims {
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
pub(super) fn step(idx: &mut [usize], shape: &[usize]) {
    for (i, &n) in idx.iter_mut().zip(shape).rev() {
        *i += 1;
        if *i < n {
            return;
        }
        *i = 0;
    }
}

/// The row-major position of a multi-index.
pub(super) fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |a, (&i, &n)| a * n + i)
}

/// A fresh dense output of `meta` on `device`, filled through a view of its elements as `C`
/// (a type of the same size as the dtype's elements).
pub(super) fn out_raw<C: Element>(
    meta: &Meta,
    device: &Device,
    fill: impl FnOnce(&mut [C]) -> Result<()>,
) -> Result<Tensor> {
    let mut buf = Buffer::zeroed(device, meta.dtype, &meta.shape)?;
    let data = buf
        .as_cpu_mut()
        .ok_or_else(|| Error::internal("kernel", "expected a CPU buffer"))?
        .typed_mut::<C>()?;
    if data.len() != meta.numel() {
        return Err(Error::internal("kernel", "element size mismatch"));
    }
    fill(data)?;
    Ok(Tensor::from_buffer(buf))
}

/// Mutates the storage of a freshly copied (dense, unshared) tensor in place.
pub(super) fn in_place<C: Element>(
    t: &Tensor,
    f: impl FnOnce(&mut [C]) -> Result<()>,
) -> Result<()> {
    let mut g = t.storage().write();
    let data = g
        .as_cpu_mut()
        .ok_or_else(|| Error::internal("kernel", "expected a CPU buffer"))?
        .typed_mut::<C>()?;
    f(data)
}

/// The elements of a contiguous tensor.
pub(super) fn contiguous_elements<'r, T: Element>(
    r: &'r Reader<'_>,
    t: &Tensor,
) -> Result<&'r [T]> {
    let data = r.data::<T>(t)?;
    data.get(t.offset()..t.offset() + t.numel())
        .ok_or_else(|| Error::internal("kernel", "view outside its storage"))
}

/// `v` converted to `dtype` with PyTorch's casting rules, as the bits of a carrier type `C`.
pub(super) fn carrier_value<C: Element>(v: Scalar, dtype: DType) -> Result<C> {
    with_element!(dtype, T, {
        let x: T = v.to_element();
        let bytes = tpu_tensor::tpu_runtime::dtype::as_bytes(std::slice::from_ref(&x));
        let c = tpu_tensor::tpu_runtime::dtype::cast_bytes::<C>(bytes)?;
        c.first()
            .copied()
            .ok_or_else(|| Error::internal("kernel", "empty value"))
    })
}

/// The first index outside `[0, shape[dim])`, as an error.
pub(super) fn check_indices(op: &str, ix: &[i64], dim: usize, shape: &[usize]) -> Result<()> {
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
pub(super) fn cpu_tables(
    op: &str,
    x: &Tensor,
    tabs: &[Vec<i64>],
    fill: Scalar,
    out: &Meta,
) -> Result<Tensor> {
    let (dev, device) = cpu_context(op, x)?;
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
pub(super) fn empty_output(x: &Tensor, out: &Meta) -> Result<Option<Tensor>> {
    if out.numel() > 0 {
        return Ok(None);
    }
    Tensor::zeros(&out.shape[..], out.dtype, x.device()).map(Some)
}

/// Tables that read `x` unchanged along every dim.
pub(super) fn identity_tables(x: &Tensor) -> Vec<Vec<i64>> {
    x.shape()
        .iter()
        .zip(x.strides())
        .map(|(&n, &s)| (0..n).map(|o| (o * s) as i64).collect())
        .collect()
}

/// A tensor's index values (dense i64).
pub(super) fn index_values(t: &Tensor) -> Result<Vec<i64>> {
    t.contiguous()?.to_vec::<i64>()
}
