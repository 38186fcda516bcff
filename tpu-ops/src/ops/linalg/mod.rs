//! Matrix products: `matmul` with PyTorch's rank rules (and `mm`, `bmm`, `dot`), `linear`, and
//! `einsum`.
//!
//! Every product ends in one batched kernel. On the native CPU with AVX-512, f32, f16 and bf16
//! go to [`crate::cpu::simd::gemm`] (operands read in place at any strides, f32 accumulation, one
//! rounding of 16-bit results); otherwise faer for f32 and f64, reading strided operands in
//! place when one of their matrix strides is 1, with the 16-bit floats multiplied in f32 and
//! rounded once at the end (as PyTorch); integers multiply in wrapping i64 arithmetic,
//! which truncates to the same result as arithmetic in the narrow type. In StableHLO: one
//! `dot_general` per product at the precision [`set_matmul_precision`] sets, with 16-bit floats
//! widened to f32 and narrow integers to i32 around it so that XLA agrees with the CPU.
//!
//! Every op here has a backward rule made of the same products (einsum's gradients are einsums
//! of the output's gradient with the other operands), so gradients run where the forward ran.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use faer::linalg::matmul::matmul as faer_matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;
use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Device, Element, Error, Generator, Layout, Result, Tensor, bf16, f16};

use crate::autograd::Saved;
use crate::cpu::kernels::{Reader, cpu_device, map1, output, output_overwrite};
use crate::hlo::view::materialize_view;
use crate::hlo::{FnBuilder, Precision, TensorType, Value};
use crate::op::{DTypeSet, Meta, OpDef, OpInfo};
use tpu_tensor::shape::broadcast_shapes;

// ---- precision -------------------------------------------------------------------------------

static PRECISION: AtomicU8 = AtomicU8::new(0);

/// Sets the precision of the matrix products lowered to StableHLO from now on (TPUs multiply
/// f32 in one bf16 pass at [`Precision::Default`], as PyTorch/XLA does). Ops already recorded
/// keep the precision they were made with. The native CPU kernels always use full precision.
pub fn set_matmul_precision(precision: Precision) {
    let v = match precision {
        Precision::Default => 0,
        Precision::High => 1,
        Precision::Highest => 2,
    };
    PRECISION.store(v, Ordering::Relaxed);
}

/// The precision of matrix products lowered to StableHLO (see [`set_matmul_precision`]).
pub fn matmul_precision() -> Precision {
    match PRECISION.load(Ordering::Relaxed) {
        1 => Precision::High,
        2 => Precision::Highest,
        _ => Precision::Default,
    }
}

// ---- dtype rules -----------------------------------------------------------------------------

/// Dtypes the products accept (PyTorch has no bool matmul).
const DTYPES: DTypeSet = DTypeSet::NUMERIC;

/// Checks that all operands share one supported dtype and returns it. `what` names each
/// operand in errors.
fn common_dtype(op: &str, inputs: &[Meta], what: &[&str]) -> Result<DType> {
    let d = inputs
        .first()
        .map(|m| m.dtype)
        .ok_or_else(|| Error::invalid_argument(op, "expected at least one operand"))?;
    for (i, m) in inputs.iter().enumerate().skip(1) {
        if m.dtype != d {
            return Err(Error::DTypeMismatch {
                context: format!(
                    "{op}: {} (shape {}) must have the dtype of {} (shape {})",
                    what.get(i).copied().unwrap_or("an operand"),
                    fmt_shape(&m.shape),
                    what.first().copied().unwrap_or("the first operand"),
                    fmt_shape(&inputs[0].shape)
                ),
                expected: d,
                given: m.dtype,
            });
        }
    }
    if !DTYPES.contains(d) {
        return Err(Error::UnsupportedDType {
            op: op.into(),
            given: d.to_string(),
            supported: DTYPES.to_string(),
        });
    }
    Ok(d)
}

/// The dtype StableHLO multiplies in: f32 for the 16-bit floats, i32 for the narrow integers
/// (their products wrap to the same low bits), the dtype itself otherwise.
fn acc_dtype(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        DType::U8 | DType::I8 => DType::I32,
        d => d,
    }
}

// ---- matmul shape rule -----------------------------------------------------------------------

/// The products `matmul`, `mm`, `bmm` and `dot` (one op, differing in the ranks they accept).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProductKind {
    /// `torch.matmul`: any ranks >= 1, broadcast batch dims.
    Matmul,
    /// `torch.mm`: two matrices.
    Mm,
    /// `torch.bmm`: two 3-D tensors with equal batch size.
    Bmm,
    /// `torch.dot`: two vectors.
    Dot,
}

impl ProductKind {
    fn name(self) -> &'static str {
        match self {
            ProductKind::Matmul => "matmul",
            ProductKind::Mm => "mm",
            ProductKind::Bmm => "bmm",
            ProductKind::Dot => "dot",
        }
    }
}

/// How `matmul` sees its operands: batch dims broadcast, vectors made matrices.
#[derive(Clone, Debug)]
struct Plan {
    batch: Vec<usize>,
    m: usize,
    k: usize,
    n: usize,
    a_vec: bool,
    b_vec: bool,
    out: Vec<usize>,
}

fn plan(kind: ProductKind, a: &[usize], b: &[usize]) -> Result<Plan> {
    let op = kind.name();
    let shapes = format!("{} and {}", fmt_shape(a), fmt_shape(b));
    let want = |ranks: &str| {
        Error::shape(
            op,
            format!(
                "expected {ranks}, got shapes {shapes} ({}-D and {}-D)",
                a.len(),
                b.len()
            ),
        )
    };
    match kind {
        ProductKind::Matmul if a.is_empty() || b.is_empty() => {
            return Err(want("operands with at least 1 dim each"));
        }
        ProductKind::Mm if a.len() != 2 || b.len() != 2 => return Err(want("two 2-D matrices")),
        ProductKind::Dot if a.len() != 1 || b.len() != 1 => return Err(want("two 1-D vectors")),
        ProductKind::Bmm if a.len() != 3 || b.len() != 3 => return Err(want("two 3-D tensors")),
        ProductKind::Bmm if a[0] != b[0] => {
            return Err(Error::shape(
                op,
                format!(
                    "expected equal batch sizes, got shapes {shapes} (batch {} and {})",
                    a[0], b[0]
                ),
            ));
        }
        _ => {}
    }
    let (a_vec, b_vec) = (a.len() == 1, b.len() == 1);
    let (m, k) = if a_vec {
        (1, a[0])
    } else {
        (a[a.len() - 2], a[a.len() - 1])
    };
    let (k2, n) = if b_vec {
        (b[0], 1)
    } else {
        (b[b.len() - 2], b[b.len() - 1])
    };
    if k != k2 {
        return Err(Error::shape(
            op,
            format!(
                "the contracted dims differ: shapes {shapes} multiply over {k} and {k2} elements"
            ),
        ));
    }
    let a_batch = &a[..a.len().saturating_sub(2)];
    let b_batch = &b[..b.len().saturating_sub(2)];
    let batch = broadcast_shapes(op, a_batch, b_batch)
        .map_err(|_| {
            Error::shape(
                op,
                format!(
                    "the batch dims {} and {} of shapes {shapes} do not broadcast",
                    fmt_shape(a_batch),
                    fmt_shape(b_batch)
                ),
            )
        })?
        .to_vec();
    let mut out = batch.clone();
    if !a_vec {
        out.push(m);
    }
    if !b_vec {
        out.push(n);
    }
    Ok(Plan {
        batch,
        m,
        k,
        n,
        a_vec,
        b_vec,
        out,
    })
}

// ---- the CPU kernel --------------------------------------------------------------------------

/// Multiply-adds below which a product stays on the calling thread.
const PAR_WORK: usize = 1 << 18;

/// Where a matrix sits in its storage: element `(i, j)` is at `offset + i * rs + j * cs`.
/// `row_major` says which of the strides is 1 (faer reads either form in place).
#[derive(Clone, Copy, Debug)]
struct MatLayout {
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
    row_major: bool,
}

impl MatLayout {
    /// The layout when faer can read it without a copy: one stride 1 (or a dim of size 1) and
    /// no broadcast (stride 0) dim.
    fn of(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<MatLayout> {
        if (cols <= 1 || cs == 1) && (rows <= 1 || rs != 0) {
            Some(MatLayout {
                rows,
                cols,
                rs: if rows <= 1 { cols.max(1) } else { rs },
                cs: 1,
                row_major: true,
            })
        } else if (rows <= 1 || rs == 1) && (cols <= 1 || cs != 0) {
            Some(MatLayout {
                rows,
                cols,
                rs: 1,
                cs: if cols <= 1 { rows.max(1) } else { cs },
                row_major: false,
            })
        } else {
            None
        }
    }

    /// The storage slice from `offset` on, checked to hold the whole matrix.
    fn slice<'a, T>(&self, data: &'a [T], offset: usize) -> Result<&'a [T]> {
        let last = (self.rows.saturating_sub(1))
            .checked_mul(self.rs)
            .and_then(|r| {
                (self.cols.saturating_sub(1))
                    .checked_mul(self.cs)
                    .and_then(|c| r.checked_add(c))
            });
        match (data.get(offset..), last) {
            (Some(s), Some(last)) if last < s.len() => Ok(s),
            _ => Err(Error::internal(
                "matmul",
                format!(
                    "a {}x{} matrix at offset {offset} with strides ({}, {}) leaves its storage of {} elements",
                    self.rows,
                    self.cols,
                    self.rs,
                    self.cs,
                    data.len()
                ),
            )),
        }
    }

    fn faer<'a, T>(&self, data: &'a [T], offset: usize) -> Result<MatRef<'a, T>> {
        let s = self.slice(data, offset)?;
        Ok(if self.row_major {
            MatRef::from_row_major_slice_with_stride(s, self.rows, self.cols, self.rs)
        } else {
            MatRef::from_column_major_slice_with_stride(s, self.rows, self.cols, self.cs)
        })
    }
}

/// Element types with a kernel: `dst (m x n, row-major) (+)= a · b`.
trait Gemm: Element {
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        dst: &mut [Self],
        a: &[Self],
        a_off: usize,
        al: MatLayout,
        b: &[Self],
        b_off: usize,
        bl: MatLayout,
        accumulate: bool,
        par: Par,
    ) -> Result<()>;
}

macro_rules! faer_gemm {
    ($t:ty) => {
        impl Gemm for $t {
            fn gemm(
                dst: &mut [Self],
                a: &[Self],
                a_off: usize,
                al: MatLayout,
                b: &[Self],
                b_off: usize,
                bl: MatLayout,
                accumulate: bool,
                par: Par,
            ) -> Result<()> {
                let lhs = al.faer(a, a_off)?;
                let rhs = bl.faer(b, b_off)?;
                let d = MatMut::from_row_major_slice_mut(dst, al.rows, bl.cols);
                let accum = if accumulate {
                    Accum::Add
                } else {
                    Accum::Replace
                };
                faer_matmul(d, accum, lhs, rhs, 1.0, par);
                Ok(())
            }
        }
    };
}
faer_gemm!(f32);
faer_gemm!(f64);

impl Gemm for i64 {
    fn gemm(
        dst: &mut [Self],
        a: &[Self],
        a_off: usize,
        al: MatLayout,
        b: &[Self],
        b_off: usize,
        bl: MatLayout,
        accumulate: bool,
        par: Par,
    ) -> Result<()> {
        let a = al.slice(a, a_off)?;
        let b = bl.slice(b, b_off)?;
        let n = bl.cols;
        let row = |i: usize, out: &mut [i64]| {
            if !accumulate {
                out.fill(0);
            }
            // Row i of the result is a combination of b's rows: walks b along its rows.
            for p in 0..al.cols {
                let x = a[i * al.rs + p * al.cs];
                if x == 0 {
                    continue;
                }
                let base = p * bl.rs;
                for (j, o) in out.iter_mut().enumerate() {
                    *o = o.wrapping_add(x.wrapping_mul(b[base + j * bl.cs]));
                }
            }
        };
        match par {
            Par::Seq => dst.chunks_mut(n).enumerate().for_each(|(i, o)| row(i, o)),
            _ => dst
                .par_chunks_mut(n)
                .enumerate()
                .for_each(|(i, o)| row(i, o)),
        }
        Ok(())
    }
}

/// `t` itself when faer reads its matrices in place, else a dense copy; with the layout.
fn fit(t: &Tensor) -> Result<(Tensor, MatLayout)> {
    let r = t.rank();
    let at = |t: &Tensor| {
        MatLayout::of(
            t.shape()[r - 2],
            t.shape()[r - 1],
            t.strides()[r - 2],
            t.strides()[r - 1],
        )
    };
    if let Some(l) = at(t) {
        return Ok((t.clone(), l));
    }
    let c = t.copy()?;
    let l = at(&c).ok_or_else(|| Error::internal("matmul", "a dense copy has unusable strides"))?;
    Ok((c, l))
}

/// Storage offsets of `t`'s matrices (its last two dims) for each index of `batch`, over which
/// `t`'s leading dims broadcast.
fn batch_offsets(t: &Tensor, batch: &[usize]) -> Result<Vec<usize>> {
    let tb = t.rank() - 2;
    let lead = batch.len() - tb;
    let strides: Vec<usize> = (0..batch.len())
        .map(|d| {
            if d < lead || t.shape()[d - lead] == 1 {
                0
            } else {
                t.strides()[d - lead]
            }
        })
        .collect();
    let count: usize = batch.iter().product();
    // One word per matrix: up to eight times a batch of 1 x 1 outputs, so checked.
    let mut offs = tpu_tensor::tpu_runtime::memory::try_host_capacity(count, || {
        format!("matmul offsets of a batch {}", fmt_shape(batch))
    })?;
    let mut idx = vec![0usize; batch.len()];
    let mut off = t.offset();
    for _ in 0..count {
        offs.push(off);
        for d in (0..batch.len()).rev() {
            idx[d] += 1;
            off += strides[d];
            if idx[d] < batch[d] {
                break;
            }
            off -= strides[d] * batch[d];
            idx[d] = 0;
        }
    }
    Ok(offs)
}

/// `out = a · b (+ bias)` on the CPU, where `a` is `[..., m, k]` and `b` `[..., k, n]` with
/// leading dims broadcast to `batch`, and `out` has `batch * m * n` elements in that order.
/// `bias` broadcasts to `out`'s shape. Every dtype; 16-bit floats and integers go through
/// f32 and i64.
fn product_cpu(
    op: &str,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    batch: &[usize],
    out: &Meta,
) -> Result<Tensor> {
    let dtype = out.dtype;
    if crate::cpu::simd::gemm_accelerated() {
        match dtype {
            DType::F32 => return product_simd::<f32>(op, a, b, bias, batch, out),
            DType::BF16 => return product_simd::<bf16>(op, a, b, bias, batch, out),
            DType::F16 => return product_simd::<f16>(op, a, b, bias, batch, out),
            _ => {}
        }
    }
    let (round_back, compute) = match dtype {
        DType::F32 | DType::F64 => (false, dtype),
        DType::F16 | DType::BF16 => (true, DType::F32),
        d if d.is_int() => (d != DType::I64, DType::I64),
        d => {
            return Err(Error::UnsupportedDType {
                op: op.into(),
                given: d.to_string(),
                supported: DTYPES.to_string(),
            });
        }
    };
    let a = a.to_dtype(compute)?;
    let b = b.to_dtype(compute)?;
    let bias = bias.map(|t| t.to_dtype(compute)).transpose()?;
    let meta = Meta::new(&out.shape, compute);
    let r = match compute {
        DType::F32 => product_typed::<f32>(op, &a, &b, bias.as_ref(), batch, &meta)?,
        DType::F64 => product_typed::<f64>(op, &a, &b, bias.as_ref(), batch, &meta)?,
        _ => product_typed::<i64>(op, &a, &b, bias.as_ref(), batch, &meta)?,
    };
    if round_back { r.to_dtype(dtype) } else { Ok(r) }
}

/// Checks the operands of a batched product against `batch` and the output; returns
/// `(m, k, n, count)`.
fn check_product(
    op: &str,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    batch: &[usize],
    out: &Meta,
) -> Result<(usize, usize, usize, usize)> {
    let (ra, rb) = (a.rank(), b.rank());
    let internal = |why: String| Error::internal(op, format!("{why}"));
    if ra < 2 || rb < 2 || ra - 2 > batch.len() || rb - 2 > batch.len() {
        return Err(internal(format!(
            "operands {} and {} for batch {}",
            fmt_shape(a.shape()),
            fmt_shape(b.shape()),
            fmt_shape(batch)
        )));
    }
    let (m, k, n) = (a.shape()[ra - 2], a.shape()[ra - 1], b.shape()[rb - 1]);
    let count: usize = batch.iter().product();
    if b.shape()[rb - 2] != k || count * m * n != out.numel() {
        return Err(internal(format!(
            "operands {} and {} for output {}",
            fmt_shape(a.shape()),
            fmt_shape(b.shape()),
            fmt_shape(&out.shape)
        )));
    }
    if let Some(t) = bias
        && broadcast_shapes(op, &out.shape, t.shape())?.as_slice() != &out.shape[..]
    {
        return Err(internal(format!(
            "bias {} for output {}",
            fmt_shape(t.shape()),
            fmt_shape(&out.shape)
        )));
    }
    Ok((m, k, n, count))
}

/// How a batch of `count` products of `each` multiply-adds runs on `threads` threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Split {
    /// All on the calling thread.
    Seq,
    /// One product per task.
    Batch,
    /// One product after the other, each split across the threads.
    Each,
}

fn split_work(count: usize, each: usize, threads: usize, many_small: bool) -> Split {
    if each.saturating_mul(count) < PAR_WORK || threads <= 1 {
        Split::Seq
    } else if count >= threads && many_small {
        Split::Batch
    } else {
        Split::Each
    }
}

/// A product with nothing to multiply (an empty output or `k == 0`): the bias broadcast to
/// the output, or zeros.
fn empty_product<T: Element>(
    dev: &CpuDevice,
    device: &Device,
    bias: Option<&Tensor>,
    out: &Meta,
) -> Result<Tensor> {
    output::<T>(out, device, |o| match bias {
        Some(t) => map1(
            dev,
            (Reader::new(&[t]).data::<T>(t)?, t),
            &out.shape,
            o,
            |x: T| x,
        ),
        None => Ok(()),
    })
}

/// [`product_cpu`] with the SIMD kernels, for f32, f16 and bf16: operands read in place at
/// any strides, f32 accumulation, one rounding of 16-bit results.
fn product_simd<T: Element + crate::cpu::simd::Elem>(
    op: &str,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    batch: &[usize],
    out: &Meta,
) -> Result<Tensor> {
    let (m, k, n, count) = check_product(op, a, b, bias, batch, out)?;
    let dev = cpu_device(op, a)?;
    let device = Device::from_cpu(dev.clone());
    if out.numel() == 0 || k == 0 {
        // Nothing to multiply (and empty operands may have any strides).
        return empty_product::<T>(&dev, &device, bias, out);
    }
    let (ra, rb) = (a.rank(), b.rank());
    let (ars, acs) = (a.strides()[ra - 2], a.strides()[ra - 1]);
    let (brs, bcs) = (b.strides()[rb - 2], b.strides()[rb - 1]);
    let a_offs = batch_offsets(a, batch)?;
    let b_offs = batch_offsets(b, batch)?;
    let mut locked = vec![a, b];
    locked.extend(bias);
    let r = Reader::new(&locked);
    let (da, db) = (r.data::<T>(a)?, r.data::<T>(b)?);
    let fill = |o: &mut [T]| {
        if let Some(t) = bias {
            map1(&dev, (r.data::<T>(t)?, t), &out.shape, o, |x: T| x)?;
        }
        let acc = bias.is_some();
        let run = |i: usize, dst: &mut [T], threads: usize| {
            let av = crate::cpu::simd::MatView {
                data: da,
                offset: a_offs[i],
                rows: m,
                cols: k,
                rs: ars,
                cs: acs,
            };
            let bv = crate::cpu::simd::MatView {
                data: db,
                offset: b_offs[i],
                rows: k,
                cols: n,
                rs: brs,
                cs: bcs,
            };
            crate::cpu::simd::gemm(av, bv, dst, acc, threads)
        };
        let each = m.saturating_mul(n).saturating_mul(k);
        let threads = dev.num_threads();
        // Whole products per task when they share the threads evenly or are small.
        let many_small = count % threads == 0 || count >= 4 * threads || each < 4 * PAR_WORK;
        match split_work(count, each, threads, many_small) {
            Split::Seq => o
                .chunks_mut(m * n)
                .enumerate()
                .try_for_each(|(i, dst)| run(i, dst, 1)),
            Split::Batch => dev.install(|| {
                o.par_chunks_mut(m * n)
                    .enumerate()
                    .try_for_each(|(i, dst)| run(i, dst, 1))
            })?,
            Split::Each => dev.install(|| {
                o.chunks_mut(m * n)
                    .enumerate()
                    .try_for_each(|(i, dst)| run(i, dst, threads))
            })?,
        }
    };
    if bias.is_some() {
        output::<T>(out, &device, fill)
    } else {
        output_overwrite::<T>(out, &device, fill)
    }
}

fn product_typed<T: Gemm>(
    op: &str,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    batch: &[usize],
    out: &Meta,
) -> Result<Tensor> {
    let (m, k, n, count) = check_product(op, a, b, bias, batch, out)?;
    let dev = cpu_device(op, a)?;
    let device = Device::from_cpu(dev.clone());
    if out.numel() == 0 || k == 0 {
        // Nothing to multiply (and empty operands may have any strides).
        return empty_product::<T>(&dev, &device, bias, out);
    }
    let (a, al) = fit(a)?;
    let (b, bl) = fit(b)?;
    let a_offs = batch_offsets(&a, batch)?;
    let b_offs = batch_offsets(&b, batch)?;
    let mut locked = vec![&a, &b];
    locked.extend(bias);
    let r = Reader::new(&locked);
    let (da, db) = (r.data::<T>(&a)?, r.data::<T>(&b)?);
    output::<T>(out, &device, |o| {
        if let Some(t) = bias {
            map1(&dev, (r.data::<T>(t)?, t), &out.shape, o, |x: T| x)?;
        }
        let acc = bias.is_some();
        let run = |i: usize, dst: &mut [T], par: Par| {
            T::gemm(dst, da, a_offs[i], al, db, b_offs[i], bl, acc, par)
        };
        let each = m.saturating_mul(n).saturating_mul(k);
        let threads = dev.num_threads();
        match split_work(count, each, threads, each < 4 * PAR_WORK) {
            Split::Seq => {
                for (i, dst) in o.chunks_mut(m * n).enumerate() {
                    run(i, dst, Par::Seq)?;
                }
                Ok(())
            }
            // Many small products: one per task.
            Split::Batch => dev.install(|| {
                o.par_chunks_mut(m * n)
                    .enumerate()
                    .try_for_each(|(i, dst)| run(i, dst, Par::Seq))
            })?,
            Split::Each => dev.install(|| {
                for (i, dst) in o.chunks_mut(m * n).enumerate() {
                    run(i, dst, Par::rayon(threads))?;
                }
                Ok(())
            })?,
        }
    })
}

// ---- the StableHLO lowering ------------------------------------------------------------------

/// `dot_general` in the accumulation dtype; the result stays in it.
fn lower_dot_acc(
    b: &mut FnBuilder,
    x: &Value,
    y: &Value,
    batch: (&[i64], &[i64]),
    contract: (&[i64], &[i64]),
    dims: &[usize],
    precision: Precision,
) -> Value {
    let acc = acc_dtype(x.dtype());
    let xc = b.convert(x, acc);
    let yc = b.convert(y, acc);
    b.dot_general(
        &xc,
        &yc,
        batch,
        contract,
        TensorType::new(dims, acc),
        precision,
    )
}

/// `dot_general` rounded back to the operands' dtype.
fn lower_dot(
    b: &mut FnBuilder,
    x: &Value,
    y: &Value,
    batch: (&[i64], &[i64]),
    contract: (&[i64], &[i64]),
    dims: &[usize],
    precision: Precision,
) -> Value {
    let r = lower_dot_acc(b, x, y, batch, contract, dims, precision);
    b.convert(&r, x.dtype())
}

fn iota(range: std::ops::Range<usize>) -> Vec<i64> {
    range.map(|d| d as i64).collect()
}

fn expect_inputs<T>(op: &str, inputs: &[T], counts: &[usize]) -> Result<()> {
    if counts.contains(&inputs.len()) {
        Ok(())
    } else {
        Err(Error::invalid_argument(
            op,
            format!(
                "expected {} operands, got {}",
                counts
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(" or "),
                inputs.len()
            ),
        ))
    }
}

// ---- matmul, mm, bmm, dot --------------------------------------------------------------------

/// A matrix product with PyTorch's rules for `kind`.
#[derive(Clone, Debug)]
pub struct Matmul {
    /// Which product (the ranks it accepts).
    pub kind: ProductKind,
    /// Precision of the StableHLO `dot_general`.
    pub precision: Precision,
}

impl Matmul {
    /// The op of `kind` at the current [`matmul_precision`].
    pub fn new(kind: ProductKind) -> Matmul {
        Matmul {
            kind,
            precision: matmul_precision(),
        }
    }
}

impl OpDef for Matmul {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn attrs(&self) -> String {
        format!("{:?}", self.precision)
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.name();
        expect_inputs(op, inputs, &[2])?;
        let d = common_dtype(op, inputs, &["the first operand", "the second operand"])?;
        let p = plan(self.kind, &inputs[0].shape, &inputs[1].shape)?;
        Ok(vec![Meta::new(&p.out, d)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let op = self.name();
        let (a, b) = (inputs[0], inputs[1]);
        let p = plan(self.kind, a.shape(), b.shape())?;
        let a = if p.a_vec { a.unsqueeze(0)? } else { a.clone() };
        let b = if p.b_vec { b.unsqueeze(1)? } else { b.clone() };
        // One tall product instead of a batch of small ones sharing `b`, when `a`'s batch
        // folds into its rows without a copy (else the batched kernel reads `a` in place).
        let tall = match b.rank() == 2 && a.rank() > 2 {
            true => a.view([p.batch.iter().product::<usize>() * p.m, p.k]).ok(),
            false => None,
        };
        let t = match tall {
            Some(a) => product_cpu(op, &a, &b, None, &[], &outputs[0])?,
            None => product_cpu(op, &a, &b, None, &p.batch, &outputs[0])?,
        };
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let p = plan(self.kind, inputs[0].dims(), inputs[1].dims())?;
        let x = if p.a_vec {
            b.reshape(&inputs[0], &[1, p.k])
        } else {
            inputs[0].clone()
        };
        let y = if p.b_vec {
            b.reshape(&inputs[1], &[p.k, 1])
        } else {
            inputs[1].clone()
        };
        let r = if y.ty.rank() == 2 {
            // x's batch dims are free dims of the product, already in the output's order.
            let xr = x.ty.rank() as i64;
            let mut dims = x.dims()[..x.ty.rank() - 1].to_vec();
            dims.push(p.n);
            lower_dot(
                b,
                &x,
                &y,
                (&[], &[]),
                (&[xr - 1], &[0]),
                &dims,
                self.precision,
            )
        } else {
            let nb = p.batch.len();
            let mut xd = p.batch.clone();
            xd.extend([p.m, p.k]);
            let mut yd = p.batch.clone();
            yd.extend([p.k, p.n]);
            let x = b.broadcast_to(&x, &xd);
            let y = b.broadcast_to(&y, &yd);
            let bd = iota(0..nb);
            let mut dims = p.batch.clone();
            dims.extend([p.m, p.n]);
            let nb = nb as i64;
            lower_dot(
                b,
                &x,
                &y,
                (&bd, &bd),
                (&[nb + 1], &[nb]),
                &dims,
                self.precision,
            )
        };
        Ok(vec![b.reshape(&r, &outputs[0].shape)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// With `a` and `b` seen as (batched) matrices, `da = g · bᵀ` and `db = aᵀ · g`. A vector
    /// operand is a one-row (`a`) or one-column (`b`) matrix whose extra dim is dropped again;
    /// gradients keep the broadcast batch dims, which autograd sums down to each operand.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None, None]);
        };
        let (a, b) = (&saved.inputs[0], &saved.inputs[1]);
        let p = plan(self.kind, a.shape(), b.shape())?;
        let am = if p.a_vec { a.unsqueeze(0)? } else { a.clone() };
        let bm = if p.b_vec { b.unsqueeze(1)? } else { b.clone() };
        let mut gshape = p.batch.clone();
        gshape.extend([p.m, p.n]);
        let gm = g.reshape(&gshape)?;
        // The general product accepts every rank combination the gradients need.
        let prod = Matmul {
            kind: ProductKind::Matmul,
            precision: self.precision,
        };
        let ga = crate::exec::dispatch::run1(&prod, &[&gm, &bm.transpose(-2, -1)?])?;
        let ga = if p.a_vec { ga.squeeze_dim(-2)? } else { ga };
        let gb = crate::exec::dispatch::run1(&prod, &[&am.transpose(-2, -1)?, &gm])?;
        let gb = if p.b_vec { gb.squeeze_dim(-1)? } else { gb };
        Ok(vec![Some(ga), Some(gb)])
    }
}

/// `torch.matmul(a, b)`: vector-vector (0-dim result), matrix-vector, vector-matrix,
/// matrix-matrix, and batched products whose leading dims broadcast.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    crate::exec::dispatch::run1(&Matmul::new(ProductKind::Matmul), &[a, b])
}

/// `torch.mm(a, b)` of two matrices.
pub fn mm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    crate::exec::dispatch::run1(&Matmul::new(ProductKind::Mm), &[a, b])
}

/// `torch.bmm(a, b)` of `[B, m, k]` and `[B, k, n]`.
pub fn bmm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    crate::exec::dispatch::run1(&Matmul::new(ProductKind::Bmm), &[a, b])
}

/// `torch.dot(a, b)` of two vectors: a 0-dim tensor.
pub fn dot(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    crate::exec::dispatch::run1(&Matmul::new(ProductKind::Dot), &[a, b])
}

// ---- linear ----------------------------------------------------------------------------------

/// `torch.nn.functional.linear`: `x · weightᵀ + bias`, with inputs `[x, weight]` or
/// `[x, weight, bias]`. The bias is added before the single rounding of 16-bit floats.
#[derive(Clone, Debug)]
pub struct Linear {
    /// Precision of the StableHLO `dot_general`.
    pub precision: Precision,
}

impl OpDef for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn attrs(&self) -> String {
        format!("{:?}", self.precision)
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        expect_inputs("linear", inputs, &[2, 3])?;
        let d = common_dtype("linear", inputs, &["the input", "the weight", "the bias"])?;
        let (x, w) = (&inputs[0].shape, &inputs[1].shape);
        if x.is_empty() || w.len() != 2 {
            return Err(Error::shape(
                "linear",
                format!(
                    "expected an input with at least 1 dim and a 2-D weight [out, in], got input {} and weight {}",
                    fmt_shape(x),
                    fmt_shape(w)
                ),
            ));
        }
        if x[x.len() - 1] != w[1] {
            return Err(Error::shape(
                "linear",
                format!(
                    "the input's last dim must equal the weight's in-features: input {} and weight {} ({} != {})",
                    fmt_shape(x),
                    fmt_shape(w),
                    x[x.len() - 1],
                    w[1]
                ),
            ));
        }
        let mut out = x[..x.len() - 1].to_vec();
        out.push(w[0]);
        if let Some(bias) = inputs.get(2) {
            let s = broadcast_shapes("linear", &out, &bias.shape).ok();
            if s.as_deref() != Some(&out[..]) {
                return Err(Error::shape(
                    "linear",
                    format!(
                        "the bias {} does not broadcast to the output {} (input {}, weight {})",
                        fmt_shape(&bias.shape),
                        fmt_shape(&out),
                        fmt_shape(x),
                        fmt_shape(w)
                    ),
                ));
            }
        }
        Ok(vec![Meta::new(&out, d)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let (x, w, bias) = (inputs[0], inputs[1], inputs.get(2).copied());
        let (n, k) = (w.shape()[0], w.shape()[1]);
        let x = if x.rank() == 1 {
            x.unsqueeze(0)?
        } else {
            x.clone()
        };
        let rows = outputs[0].numel().checked_div(n).unwrap_or(0);
        let wt = w.t()?;
        // Rows of every batch as one product when they fold without a copy; else the batched
        // kernel reads `x` in place against the shared weight.
        let t = match x.view([rows, k]) {
            Ok(x2) => product_cpu("linear", &x2, &wt, bias, &[], &outputs[0])?,
            Err(_) => {
                let batch = &x.shape()[..x.rank() - 2];
                product_cpu("linear", &x, &wt, bias, batch, &outputs[0])?
            }
        };
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let (x, w) = (&inputs[0], &inputs[1]);
        let out = &outputs[0];
        let xr = x.ty.rank() as i64;
        let r = lower_dot_acc(
            b,
            x,
            w,
            (&[], &[]),
            (&[xr - 1], &[1]),
            &out.shape,
            self.precision,
        );
        let r = match inputs.get(2) {
            Some(bias) => {
                let bias = b.convert(bias, r.dtype());
                let bias = b.broadcast_to(&bias, &out.shape);
                b.ew("stablehlo.add", &[&r, &bias])
            }
            None => r,
        };
        Ok(vec![b.convert(&r, out.dtype)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// `dx = g · weight`, `dweight = gᵀ · x` over all rows of the batch, and `dbias = g`
    /// (autograd sums it down to the bias's shape).
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let n_in = saved.inputs.len();
        let Some(g) = &grads[0] else {
            return Ok(vec![None; n_in]);
        };
        let (x, w) = (&saved.inputs[0], &saved.inputs[1]);
        let (out_f, in_f) = (w.shape()[0], w.shape()[1]);
        let prod = Matmul {
            kind: ProductKind::Matmul,
            precision: self.precision,
        };
        let gx = crate::exec::dispatch::run1(&prod, &[g, w])?;
        let rows: usize = x.shape()[..x.rank() - 1].iter().product();
        let g2 = g.reshape([rows, out_f])?;
        let x2 = x.reshape([rows, in_f])?;
        let gw = crate::exec::dispatch::run1(&prod, &[&g2.t()?, &x2])?;
        let mut res = vec![Some(gx), Some(gw)];
        if n_in == 3 {
            res.push(Some(g.clone()));
        }
        Ok(res)
    }
}

/// `torch.nn.functional.linear(x, weight, bias)`: `x · weightᵀ + bias` for `x` of shape
/// `[..., in]`, `weight` `[out, in]` and `bias` broadcasting to `[..., out]`.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let op = Linear {
        precision: matmul_precision(),
    };
    match bias {
        Some(bias) => crate::exec::dispatch::run1(&op, &[x, weight, bias]),
        None => crate::exec::dispatch::run1(&op, &[x, weight]),
    }
}

// ---- einsum ----------------------------------------------------------------------------------

/// A subscript: `A`-`Z` are 0-25 and `a`-`z` 26-51 (PyTorch's order for implicit outputs);
/// the dims an ellipsis covers are `ELLIPSIS + i`, right-aligned across operands.
type Label = u16;
const ELLIPSIS: Label = 64;

fn label_name(l: Label) -> String {
    match l {
        0..26 => char::from(b'A' + l as u8).to_string(),
        26..52 => char::from(b'a' + (l - 26) as u8).to_string(),
        _ => format!("...[{}]", l - ELLIPSIS),
    }
}

#[derive(Default, Debug)]
struct Term {
    labels: Vec<Label>,
    /// Where the ellipsis stands among the labels.
    ellipsis: Option<usize>,
}

fn parse_terms(eq: &str) -> Result<(Vec<Term>, Option<Term>)> {
    let bad = |i: usize, why: &str| {
        Error::invalid_argument(
            "einsum",
            format!("malformed equation {eq:?} at index {i}: {why}"),
        )
    };
    let chars: Vec<char> = eq.chars().collect();
    let mut inputs = vec![Term::default()];
    let mut output: Option<Term> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let cur = match output.as_mut() {
            Some(t) => t,
            None => match inputs.last_mut() {
                Some(t) => t,
                None => return Err(bad(i, "no term")),
            },
        };
        match c {
            c if c.is_whitespace() => {}
            'A'..='Z' => cur.labels.push(c as Label - 'A' as Label),
            'a'..='z' => cur.labels.push(26 + c as Label - 'a' as Label),
            '.' => {
                if chars.get(i..i + 3) != Some(&['.', '.', '.'][..]) {
                    return Err(bad(i, "expected '...'"));
                }
                if cur.ellipsis.is_some() {
                    return Err(bad(i, "a term may hold one '...' only"));
                }
                cur.ellipsis = Some(cur.labels.len());
                i += 2;
            }
            ',' if output.is_none() => inputs.push(Term::default()),
            '-' if output.is_none() && chars.get(i + 1) == Some(&'>') => {
                output = Some(Term::default());
                i += 1;
            }
            _ => {
                return Err(bad(
                    i,
                    &format!(
                        "unexpected {c:?}; subscripts are letters a-z and A-Z, with ',', '->' and '...'"
                    ),
                ));
            }
        }
        i += 1;
    }
    Ok((inputs, output))
}

/// An einsum equation resolved against its operands' shapes.
#[derive(Clone, Debug)]
struct Spec {
    shapes: Vec<Vec<usize>>,
    /// One label per dim of each operand.
    inputs: Vec<Vec<Label>>,
    output: Vec<Label>,
    sizes: BTreeMap<Label, usize>,
}

impl Spec {
    fn size(&self, l: Label) -> usize {
        self.sizes.get(&l).copied().unwrap_or(1)
    }

    fn sizes_of(&self, labels: &[Label]) -> Vec<usize> {
        labels.iter().map(|&l| self.size(l)).collect()
    }
}

fn resolve(eq: &str, shapes: &[&[usize]]) -> Result<Spec> {
    let (terms, out) = parse_terms(eq)?;
    let all_shapes = || {
        shapes
            .iter()
            .map(|s| fmt_shape(s))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if terms.len() != shapes.len() {
        return Err(Error::invalid_argument(
            "einsum",
            format!(
                "the equation {eq:?} has {} operand terms, but {} operands were given (shapes {})",
                terms.len(),
                shapes.len(),
                all_shapes()
            ),
        ));
    }
    let mut ell_lens = Vec::with_capacity(terms.len());
    for (i, (t, s)) in terms.iter().zip(shapes).enumerate() {
        let n = t.labels.len();
        let ok = if t.ellipsis.is_some() {
            s.len() >= n
        } else {
            s.len() == n
        };
        if !ok {
            return Err(Error::shape(
                "einsum",
                format!(
                    "operand {i} has shape {} ({} dims) but its term in {eq:?} names {n} subscripts{}",
                    fmt_shape(s),
                    s.len(),
                    if t.ellipsis.is_some() {
                        " and an ellipsis"
                    } else {
                        ""
                    }
                ),
            ));
        }
        ell_lens.push(s.len() - n);
    }
    let ell_rank = ell_lens.iter().copied().max().unwrap_or(0);
    let mut inputs = Vec::with_capacity(terms.len());
    let mut sizes: BTreeMap<Label, usize> = BTreeMap::new();
    // Where each label's size was first fixed, for error messages.
    let mut seen_at: BTreeMap<Label, usize> = BTreeMap::new();
    for (i, t) in terms.iter().enumerate() {
        let mut labels = t.labels.clone();
        if let Some(pos) = t.ellipsis {
            let ell = (0..ell_lens[i]).map(|j| ELLIPSIS + (ell_rank - ell_lens[i] + j) as Label);
            labels.splice(pos..pos, ell);
        }
        let shape = shapes[i];
        for (d, &l) in labels.iter().enumerate() {
            if let Some(e) = labels[..d].iter().position(|&x| x == l) {
                if shape[e] != shape[d] {
                    return Err(Error::shape(
                        "einsum",
                        format!(
                            "subscript {} is repeated in operand {i} (shape {}) with sizes {} and {}",
                            label_name(l),
                            fmt_shape(shape),
                            shape[e],
                            shape[d]
                        ),
                    ));
                }
                continue;
            }
            match sizes.get(&l).copied() {
                None => {
                    sizes.insert(l, shape[d]);
                    seen_at.insert(l, i);
                }
                Some(s) if s == shape[d] || shape[d] == 1 => {}
                Some(1) => {
                    sizes.insert(l, shape[d]);
                    seen_at.insert(l, i);
                }
                Some(s) => {
                    let j = seen_at.get(&l).copied().unwrap_or(0);
                    return Err(Error::shape(
                        "einsum",
                        format!(
                            "subscript {} has size {} in operand {i} (shape {}) but size {s} in operand {j} (shape {}); sizes must match or be 1",
                            label_name(l),
                            shape[d],
                            fmt_shape(shape),
                            fmt_shape(shapes[j])
                        ),
                    ));
                }
            }
        }
        inputs.push(labels);
    }
    let output = match out {
        Some(t) => {
            if t.ellipsis.is_some() && terms.iter().all(|t| t.ellipsis.is_none()) {
                return Err(Error::invalid_argument(
                    "einsum",
                    format!("the output of {eq:?} has '...' but no operand term does"),
                ));
            }
            let mut labels = t.labels.clone();
            if let Some(pos) = t.ellipsis {
                labels.splice(pos..pos, (0..ell_rank).map(|j| ELLIPSIS + j as Label));
            }
            for (d, &l) in t.labels.iter().enumerate() {
                if t.labels[..d].contains(&l) {
                    return Err(Error::invalid_argument(
                        "einsum",
                        format!(
                            "output subscript {} appears more than once in {eq:?}",
                            label_name(l)
                        ),
                    ));
                }
                if !sizes.contains_key(&l) {
                    return Err(Error::invalid_argument(
                        "einsum",
                        format!(
                            "output subscript {} of {eq:?} names no dim of any operand",
                            label_name(l)
                        ),
                    ));
                }
            }
            labels
        }
        None => {
            // Ellipsis dims first, then the subscripts that occur once, in label order.
            let mut count: BTreeMap<Label, usize> = BTreeMap::new();
            for l in inputs.iter().flatten() {
                *count.entry(*l).or_default() += 1;
            }
            let mut labels: Vec<Label> = (0..ell_rank).map(|j| ELLIPSIS + j as Label).collect();
            labels.extend(
                count
                    .iter()
                    .filter(|&(&l, &c)| c == 1 && l < ELLIPSIS)
                    .map(|(&l, _)| l),
            );
            labels
        }
    };
    Ok(Spec {
        shapes: shapes.iter().map(|s| s.to_vec()).collect(),
        inputs,
        output,
        sizes,
    })
}

/// The few tensor operations einsum is made of, on the CPU or in StableHLO.
trait Backend {
    type V: Clone;
    /// The generalised diagonal: result dim `j` walks the input dims `groups[j]` together.
    fn diagonal(&mut self, v: &Self::V, dims: &[usize], groups: &[Vec<usize>]) -> Result<Self::V>;
    /// Broadcasts size-1 dims to `to`.
    fn expand(&mut self, v: &Self::V, to: &[usize]) -> Result<Self::V>;
    /// A tensor of ones.
    fn ones(&mut self, dims: &[usize]) -> Result<Self::V>;
    /// `dot_general`: result dims are batch, then `a`'s free dims, then `b`'s.
    fn dot(
        &mut self,
        a: &Self::V,
        b: &Self::V,
        batch: (&[usize], &[usize]),
        contract: (&[usize], &[usize]),
        out: &[usize],
    ) -> Result<Self::V>;
    /// Result dim `i` is input dim `perm[i]`.
    fn permute(&mut self, v: &Self::V, perm: &[usize], out: &[usize]) -> Result<Self::V>;
}

struct Labeled<V> {
    v: V,
    labels: Vec<Label>,
}

/// Sums out the labels `keep` rejects, as a product with ones (so sums round like products).
fn sum_out<B: Backend>(
    be: &mut B,
    spec: &Spec,
    x: Labeled<B::V>,
    keep: impl Fn(Label) -> bool,
) -> Result<Labeled<B::V>> {
    let drop: Vec<usize> = (0..x.labels.len())
        .filter(|&d| !keep(x.labels[d]))
        .collect();
    if drop.is_empty() {
        return Ok(x);
    }
    let dropped: Vec<Label> = drop.iter().map(|&d| x.labels[d]).collect();
    let labels: Vec<Label> = x.labels.iter().copied().filter(|&l| keep(l)).collect();
    let ones = be.ones(&spec.sizes_of(&dropped))?;
    let rhs: Vec<usize> = (0..drop.len()).collect();
    let v = be.dot(
        &x.v,
        &ones,
        (&[], &[]),
        (&drop, &rhs),
        &spec.sizes_of(&labels),
    )?;
    Ok(Labeled { v, labels })
}

/// Contracts two operands, keeping the labels `keep` accepts (and any label only one of them
/// has that `keep` accepts).
fn pair<B: Backend>(
    be: &mut B,
    spec: &Spec,
    a: Labeled<B::V>,
    b: Labeled<B::V>,
    keep: &dyn Fn(Label) -> bool,
) -> Result<Labeled<B::V>> {
    let (la, lb) = (a.labels.clone(), b.labels.clone());
    let a = sum_out(be, spec, a, |l| keep(l) || lb.contains(&l))?;
    let b = sum_out(be, spec, b, |l| keep(l) || la.contains(&l))?;
    let pos = |labels: &[Label], l: Label| labels.iter().position(|&x| x == l).unwrap_or(0);
    let shared: Vec<Label> = a
        .labels
        .iter()
        .copied()
        .filter(|l| b.labels.contains(l))
        .collect();
    let (batch, contracted): (Vec<Label>, Vec<Label>) = shared.iter().partition(|&&l| keep(l));
    let dims =
        |ls: &[Label], of: &[Label]| -> Vec<usize> { ls.iter().map(|&l| pos(of, l)).collect() };
    let (ba, bb) = (dims(&batch, &a.labels), dims(&batch, &b.labels));
    let (ca, cb) = (dims(&contracted, &a.labels), dims(&contracted, &b.labels));
    let mut labels = batch.clone();
    labels.extend(a.labels.iter().filter(|l| !b.labels.contains(l)));
    labels.extend(b.labels.iter().filter(|l| !a.labels.contains(l)));
    let v = be.dot(&a.v, &b.v, (&ba, &bb), (&ca, &cb), &spec.sizes_of(&labels))?;
    Ok(Labeled { v, labels })
}

/// Einsum as PyTorch evaluates it: diagonals first, then operands contracted left to right,
/// each summing out what no later operand or the output needs.
fn run_einsum<B: Backend>(be: &mut B, spec: &Spec, inputs: &[B::V]) -> Result<B::V> {
    let mut cur: Option<Labeled<B::V>> = None;
    for (i, v) in inputs.iter().enumerate() {
        let labels = &spec.inputs[i];
        let mut uniq: Vec<Label> = Vec::new();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (d, &l) in labels.iter().enumerate() {
            match uniq.iter().position(|&u| u == l) {
                Some(p) => groups[p].push(d),
                None => {
                    uniq.push(l);
                    groups.push(vec![d]);
                }
            }
        }
        let mut v = v.clone();
        if uniq.len() != labels.len() {
            v = be.diagonal(&v, &spec.shapes[i], &groups)?;
        }
        let own: Vec<usize> = groups.iter().map(|g| spec.shapes[i][g[0]]).collect();
        let full = spec.sizes_of(&uniq);
        if own != full {
            v = be.expand(&v, &full)?;
        }
        let next = Labeled { v, labels: uniq };
        cur = Some(match cur {
            None => next,
            Some(prev) => {
                let later: Vec<Label> = spec.inputs[i + 1..]
                    .iter()
                    .flatten()
                    .chain(&spec.output)
                    .copied()
                    .collect();
                pair(be, spec, prev, next, &|l| later.contains(&l))?
            }
        });
    }
    let cur =
        cur.ok_or_else(|| Error::invalid_argument("einsum", "expected at least one operand"))?;
    let cur = sum_out(be, spec, cur, |l| spec.output.contains(&l))?;
    let perm: Vec<usize> = spec
        .output
        .iter()
        .map(|l| cur.labels.iter().position(|x| x == l).unwrap_or(0))
        .collect();
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        Ok(cur.v)
    } else {
        be.permute(&cur.v, &perm, &spec.sizes_of(&spec.output))
    }
}

struct CpuBackend {
    dtype: DType,
    device: Device,
}

impl Backend for CpuBackend {
    type V = Tensor;

    fn diagonal(&mut self, v: &Tensor, _dims: &[usize], groups: &[Vec<usize>]) -> Result<Tensor> {
        let shape: Vec<usize> = groups.iter().map(|g| v.shape()[g[0]]).collect();
        let strides: Vec<usize> = groups
            .iter()
            .map(|g| g.iter().map(|&d| v.strides()[d]).sum())
            .collect();
        v.as_strided(&shape, &strides, v.offset())
    }

    fn expand(&mut self, v: &Tensor, to: &[usize]) -> Result<Tensor> {
        v.expand(to)
    }

    fn ones(&mut self, dims: &[usize]) -> Result<Tensor> {
        Tensor::ones(dims, self.dtype, &self.device)
    }

    fn dot(
        &mut self,
        a: &Tensor,
        b: &Tensor,
        batch: (&[usize], &[usize]),
        contract: (&[usize], &[usize]),
        out: &[usize],
    ) -> Result<Tensor> {
        let free = |t: &Tensor, x: &[usize], y: &[usize]| -> Vec<usize> {
            (0..t.rank())
                .filter(|d| !x.contains(d) && !y.contains(d))
                .collect()
        };
        let af = free(a, batch.0, contract.0);
        let bf = free(b, batch.1, contract.1);
        let size =
            |t: &Tensor, ds: &[usize]| -> usize { ds.iter().map(|&d| t.shape()[d]).product() };
        let (nb, m, k, n) = (
            size(a, batch.0),
            size(a, &af),
            size(a, contract.0),
            size(b, &bf),
        );
        let pa: Vec<usize> = batch
            .0
            .iter()
            .chain(&af)
            .chain(contract.0)
            .copied()
            .collect();
        let pb: Vec<usize> = batch
            .1
            .iter()
            .chain(contract.1)
            .chain(&bf)
            .copied()
            .collect();
        let a3 = a.permute(pa)?.reshape([nb, m, k])?;
        let b3 = b.permute(pb)?.reshape([nb, k, n])?;
        product_cpu("einsum", &a3, &b3, None, &[nb], &Meta::new(out, self.dtype))
    }

    fn permute(&mut self, v: &Tensor, perm: &[usize], _out: &[usize]) -> Result<Tensor> {
        v.permute(perm)
    }
}

struct HloBackend<'a> {
    b: &'a mut FnBuilder,
    dtype: DType,
    precision: Precision,
}

impl Backend for HloBackend<'_> {
    type V = Value;

    fn diagonal(&mut self, v: &Value, dims: &[usize], groups: &[Vec<usize>]) -> Result<Value> {
        // Gathers the diagonal from the dense value, as a strided view of it would read.
        let dense = Layout::contiguous(dims);
        let layout = Layout {
            shape: groups.iter().map(|g| dims[g[0]]).collect(),
            strides: groups
                .iter()
                .map(|g| g.iter().map(|&d| dense.strides[d]).sum())
                .collect(),
            offset: 0,
        };
        Ok(materialize_view(self.b, v, &layout, dense.numel()))
    }

    fn expand(&mut self, v: &Value, to: &[usize]) -> Result<Value> {
        Ok(self.b.broadcast_to(v, to))
    }

    fn ones(&mut self, dims: &[usize]) -> Result<Value> {
        Ok(self.b.splat(TensorType::new(dims, self.dtype), 1))
    }

    fn dot(
        &mut self,
        a: &Value,
        b: &Value,
        batch: (&[usize], &[usize]),
        contract: (&[usize], &[usize]),
        out: &[usize],
    ) -> Result<Value> {
        let l = |d: &[usize]| -> Vec<i64> { d.iter().map(|&x| x as i64).collect() };
        Ok(lower_dot(
            self.b,
            a,
            b,
            (&l(batch.0), &l(batch.1)),
            (&l(contract.0), &l(contract.1)),
            out,
            self.precision,
        ))
    }

    fn permute(&mut self, v: &Value, perm: &[usize], _out: &[usize]) -> Result<Value> {
        let p: Vec<i64> = perm.iter().map(|&x| x as i64).collect();
        Ok(self.b.transpose(v, &p))
    }
}

/// `torch.einsum(equation, *operands)`: explicit (`ij,jk->ik`) and implicit (`ij,jk`) outputs,
/// `...` for broadcast leading dims, repeated subscripts for diagonals, any number of operands
/// (contracted left to right). Sizes of one subscript must match or be 1.
#[derive(Clone, Debug)]
pub struct Einsum {
    /// The equation, as given.
    pub equation: String,
    /// Precision of the StableHLO `dot_general`s.
    pub precision: Precision,
}

impl OpDef for Einsum {
    fn name(&self) -> &'static str {
        "einsum"
    }

    fn attrs(&self) -> String {
        format!("{}|{:?}", self.equation, self.precision)
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let shapes: Vec<&[usize]> = inputs.iter().map(|m| &m.shape[..]).collect();
        let spec = resolve(&self.equation, &shapes)?;
        let names: Vec<String> = (0..inputs.len()).map(|i| format!("operand {i}")).collect();
        let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        let d = common_dtype("einsum", inputs, &names)?;
        Ok(vec![Meta::new(&spec.sizes_of(&spec.output), d)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
        let spec = resolve(&self.equation, &shapes)?;
        let mut be = CpuBackend {
            dtype: outputs[0].dtype,
            device: inputs[0].device().clone(),
        };
        let vals: Vec<Tensor> = inputs.iter().map(|&t| t.clone()).collect();
        let r = run_einsum(&mut be, &spec, &vals)?;
        // A result that is still a view of an operand (a permutation, a diagonal) gets its own
        // storage, as a product's would.
        let r = if inputs.iter().any(|t| t.shares_storage(&r)) {
            r.copy()?
        } else {
            r.contiguous()?
        };
        Ok(vec![r])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let shapes: Vec<&[usize]> = inputs.iter().map(|v| v.dims()).collect();
        let spec = resolve(&self.equation, &shapes)?;
        let mut be = HloBackend {
            b,
            dtype: outputs[0].dtype,
            precision: self.precision,
        };
        Ok(vec![run_einsum(&mut be, &spec, inputs)?])
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let n = saved.inputs.len();
        let Some(g) = &grads[0] else {
            return Ok(vec![None; n]);
        };
        let shapes: Vec<&[usize]> = saved.inputs.iter().map(|t| t.shape()).collect();
        let spec = resolve(&self.equation, &shapes)?;
        let names = letters(&spec, &self.equation)?;
        (0..n)
            .map(|i| einsum_grad(&spec, &names, i, g, &saved.inputs, self.precision).map(Some))
            .collect()
    }
}

/// A letter for every label of `spec`, for writing the equations of the gradients: letters
/// name themselves, and the dims an ellipsis covers get letters the equation does not use, so
/// the gradients' equations need no ellipsis.
fn letters(spec: &Spec, equation: &str) -> Result<BTreeMap<Label, char>> {
    let name = |l: Label| match l {
        0..26 => Some(char::from(b'A' + l as u8)),
        26..52 => Some(char::from(b'a' + (l - 26) as u8)),
        _ => None,
    };
    let mut map = BTreeMap::new();
    let mut free = (0..52).filter(|&l| !spec.sizes.contains_key(&l)).map(name);
    for &l in spec.sizes.keys() {
        let c = match name(l) {
            Some(c) => c,
            None => free.next().flatten().ok_or_else(|| {
                Error::invalid_argument(
                    "einsum",
                    format!(
                        "backward of {equation:?}: its subscripts and ellipsis dims need more than 52 letters"
                    ),
                )
            })?,
        };
        map.insert(l, c);
    }
    Ok(map)
}

/// The gradient of einsum operand `i`: the einsum of the output's gradient with the other
/// operands, producing operand `i`'s subscripts. Subscripts only operand `i` has were summed
/// in the forward, so the gradient is broadcast along them; a subscript repeated in operand
/// `i` (a diagonal) gets the gradient on the diagonal and zeros elsewhere. The result has the
/// subscripts' full sizes; autograd sums it down where the operand was broadcast (size 1).
fn einsum_grad(
    spec: &Spec,
    names: &BTreeMap<Label, char>,
    i: usize,
    g: &Tensor,
    inputs: &[Tensor],
    precision: Precision,
) -> Result<Tensor> {
    let term = |ls: &[Label]| -> String { ls.iter().filter_map(|l| names.get(l)).collect() };
    let labels = &spec.inputs[i];
    let mut uniq: Vec<Label> = Vec::new();
    for &l in labels {
        if !uniq.contains(&l) {
            uniq.push(l);
        }
    }
    let elsewhere = |l: Label| {
        spec.output.contains(&l)
            || spec
                .inputs
                .iter()
                .enumerate()
                .any(|(j, t)| j != i && t.contains(&l))
    };
    let avail: Vec<Label> = uniq.iter().copied().filter(|&l| elsewhere(l)).collect();
    let mut terms = vec![term(&spec.output)];
    let mut ops = vec![g];
    for (j, t) in inputs.iter().enumerate() {
        if j != i {
            terms.push(term(&spec.inputs[j]));
            ops.push(t);
        }
    }
    let mut t = if ops.len() == 1 && spec.output == avail {
        g.clone()
    } else {
        let op = Einsum {
            equation: format!("{}->{}", terms.join(","), term(&avail)),
            precision,
        };
        crate::exec::dispatch::run1(&op, &ops)?
    };
    // Subscripts missing from the product become size-1 dims at the end, then every dim moves
    // to its place in `uniq` and takes the subscript's full size.
    let mut have = avail.clone();
    for &l in &uniq {
        if !avail.contains(&l) {
            t = t.unsqueeze(t.rank() as i64)?;
            have.push(l);
        }
    }
    let pos = |ls: &[Label], l: Label| ls.iter().position(|&x| x == l).unwrap_or(0);
    let perm: Vec<usize> = uniq.iter().map(|&l| pos(&have, l)).collect();
    let mut t = t.permute(perm)?.expand(spec.sizes_of(&uniq))?;
    if uniq.len() != labels.len() {
        // Each repeat of a subscript becomes a further broadcast dim, masked to the diagonal
        // by an identity matrix over the repeat and the subscript's first dim.
        let mut dims: Vec<usize> = Vec::with_capacity(labels.len());
        let mut extra = uniq.len();
        let mut sizes = spec.sizes_of(&uniq);
        let mut masks = Vec::new();
        for (d, &l) in labels.iter().enumerate() {
            let first = labels.iter().position(|&x| x == l).unwrap_or(d);
            if first == d {
                dims.push(pos(&uniq, l));
            } else {
                t = t.unsqueeze(t.rank() as i64)?;
                sizes.push(spec.size(l));
                dims.push(extra);
                extra += 1;
                masks.push((first, d, spec.size(l)));
            }
        }
        t = t.expand(&sizes)?.permute(dims)?;
        for (first, d, size) in masks {
            let mut shape = vec![1usize; labels.len()];
            shape[first] = size;
            shape[d] = size;
            let eye = Tensor::eye(size, None, t.dtype(), t.device())?.reshape(shape)?;
            t = crate::ops::elementwise::binary::binary(
                &t,
                &eye,
                crate::ops::elementwise::binary::BinaryKind::Mul,
            )?;
        }
    }
    if !t.is_contiguous() {
        t = t.contiguous()?;
    }
    Ok(t)
}

/// `torch.einsum(equation, operands)`.
pub fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
    crate::exec::dispatch::run1(
        &Einsum {
            equation: equation.to_string(),
            precision: matmul_precision(),
        },
        operands,
    )
}

// ---- methods ---------------------------------------------------------------------------------

/// This file's ops as methods on `Tensor`.
pub trait LinalgOps {
    /// `torch.matmul(self, other)`.
    fn matmul(&self, other: &Tensor) -> Result<Tensor>;
    /// `torch.mm(self, other)` of two matrices.
    fn mm(&self, other: &Tensor) -> Result<Tensor>;
    /// `torch.bmm(self, other)` of two 3-D tensors.
    fn bmm(&self, other: &Tensor) -> Result<Tensor>;
    /// `torch.dot(self, other)` of two vectors.
    fn dot(&self, other: &Tensor) -> Result<Tensor>;
    /// `torch.nn.functional.linear(self, weight, bias)`.
    fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor>;
}

impl LinalgOps for Tensor {
    fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        matmul(self, other)
    }

    fn mm(&self, other: &Tensor) -> Result<Tensor> {
        mm(self, other)
    }

    fn bmm(&self, other: &Tensor) -> Result<Tensor> {
        bmm(self, other)
    }

    fn dot(&self, other: &Tensor) -> Result<Tensor> {
        dot(self, other)
    }

    fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        linear(self, weight, bias)
    }
}

// ---- the op table ----------------------------------------------------------------------------

/// A seeded sample of `shape` in `dtype` on `device`: normal floats, small integers.
fn sample_input(
    g: &mut Generator,
    shape: &[usize],
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let cpu = Device::cpu();
    let t = if dtype.is_float() {
        g.randn(shape, DType::F64, &cpu)?
    } else {
        g.randint(-4, 5, shape, DType::I64, &cpu)?
    };
    t.to_dtype(dtype)?.to_device(device)
}

fn sample_matmul(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(11);
    let mut s = |shape: &[usize]| sample_input(&mut g, shape, d, dev);
    let (a, b) = (s(&[3, 4])?, s(&[4, 5])?);
    let (u, v) = (s(&[4])?, s(&[4])?);
    let bt = s(&[5, 4])?.t()?;
    let x = s(&[2, 1, 3, 4])?;
    let y = s(&[5, 4, 2])?;
    let z = s(&[2, 4, 3])?.transpose(1, 2)?;
    Ok(vec![
        matmul(&u, &v)?,
        matmul(&u, &b)?,
        matmul(&a, &u)?,
        matmul(&a, &bt)?,
        matmul(&x, &y)?,
        matmul(&z, &u)?,
        matmul(&x, &b)?,
    ])
}

fn sample_linear(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(12);
    let mut s = |shape: &[usize]| sample_input(&mut g, shape, d, dev);
    let (x, w, bias) = (s(&[2, 3, 4])?, s(&[5, 4])?, s(&[5])?);
    let xt = s(&[4, 3])?.t()?;
    Ok(vec![
        linear(&x, &w, Some(&bias))?,
        linear(&xt, &w, None)?,
        linear(&s(&[4])?, &w, Some(&bias))?,
    ])
}

fn sample_einsum(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(13);
    let mut s = |shape: &[usize]| sample_input(&mut g, shape, d, dev);
    let (a, b) = (s(&[2, 3, 4])?, s(&[2, 4, 5])?);
    let sq = s(&[3, 3])?;
    let (u, v) = (s(&[3])?, s(&[4])?);
    Ok(vec![
        einsum("bij,bjk->kbi", &[&a, &b])?,
        einsum("i,j", &[&u, &v])?,
        einsum("ii", &[&sq.t()?])?,
        einsum("...ij->...ji", &[&a])?,
        einsum("bij,j->i", &[&a, &v])?,
    ])
}

/// The rows of the op table for this file's ops.
pub fn table() -> Vec<OpInfo> {
    fn row(
        name: &'static str,
        f: impl Fn(DType, &Device) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    ) -> OpInfo {
        OpInfo {
            name,
            cpu: DTYPES,
            hlo: DTYPES,
            sample: Arc::new(f),
            // Summation order differs between faer and XLA; 16-bit results are compared to
            // within two units in their last place (see `testing::assert_close`).
            tolerance: 1e-5,
            // Every product here has a backward rule.
        }
    }
    vec![
        row("matmul", sample_matmul),
        row("mm", |d, dev| {
            let mut g = Generator::new(14);
            let a = sample_input(&mut g, &[3, 4], d, dev)?;
            let b = sample_input(&mut g, &[2, 4], d, dev)?;
            Ok(vec![mm(&a, &b.t()?)?])
        }),
        row("bmm", |d, dev| {
            let mut g = Generator::new(15);
            let a = sample_input(&mut g, &[2, 3, 4], d, dev)?;
            let b = sample_input(&mut g, &[2, 5, 4], d, dev)?;
            Ok(vec![bmm(&a, &b.transpose(1, 2)?)?])
        }),
        row("dot", |d, dev| {
            let mut g = Generator::new(16);
            let a = sample_input(&mut g, &[7], d, dev)?;
            let b = sample_input(&mut g, &[14], d, dev)?;
            Ok(vec![dot(&a, &b.slice(0, .., 2)?)?])
        }),
        row("linear", sample_linear),
        row("einsum", sample_einsum),
    ]
}
