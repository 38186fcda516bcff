//! The CPU kernel of every product: a batched `dst (+)= a · b` over strided operands, on the
//! SIMD kernels of [`crate::cpu::simd::gemm`] where they serve the dtype and on faer (floats)
//! or a wrapping i64 loop (integers) otherwise, split over the batch or within each product.

use faer::linalg::matmul::matmul as faer_matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;
use tpu_tensor::shape::broadcast_shapes;
use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Device, Element, Error, Result, Tensor, bf16, f16};

use super::Matmul;
use super::shape::{DTYPES, plan};
use crate::cpu::kernels::{Reader, cpu_context, map1, output, output_overwrite};
use crate::op::args::unsupported;
use crate::op::{Meta, OpDef};

/// [`Matmul`] on the CPU.
pub(super) fn matmul(op: &Matmul, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let name = op.name();
    let (a, b) = (inputs[0], inputs[1]);
    let p = plan(op.kind, a.shape(), b.shape())?;
    let a = if p.a_vec { a.unsqueeze(0)? } else { a.clone() };
    let b = if p.b_vec { b.unsqueeze(1)? } else { b.clone() };
    // One tall product instead of a batch of small ones sharing `b`, when `a`'s batch
    // folds into its rows without a copy (else the batched kernel reads `a` in place).
    let tall = match b.rank() == 2 && a.rank() > 2 {
        true => a.view([p.batch.iter().product::<usize>() * p.m, p.k]).ok(),
        false => None,
    };
    let t = match tall {
        Some(a) => product_cpu(name, &a, &b, None, &[], &outputs[0])?,
        None => product_cpu(name, &a, &b, None, &p.batch, &outputs[0])?,
    };
    Ok(vec![t])
}

/// [`super::Linear`] on the CPU.
pub(super) fn linear(inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
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

/// Multiply-adds below which a product stays on the calling thread.
pub(super) const PAR_WORK: usize = 1 << 18;

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

    /// The layout of `t`'s matrices as its strides give it, for kernels that read any strides.
    fn strided(t: &Tensor) -> MatLayout {
        let r = t.rank();
        let (cs, rs) = (t.strides()[r - 1], t.strides()[r - 2]);
        MatLayout {
            rows: t.shape()[r - 2],
            cols: t.shape()[r - 1],
            rs,
            cs,
            row_major: cs == 1,
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

/// One matrix of a batched operand: its storage, where it starts, and its layout.
#[derive(Clone, Copy)]
struct Operand<'a, T> {
    data: &'a [T],
    off: usize,
    layout: MatLayout,
}

impl<'a, T> Operand<'a, T> {
    /// The matrix as the SIMD product reads it.
    fn view(self) -> crate::cpu::simd::MatView<'a, T> {
        let l = self.layout;
        crate::cpu::simd::MatView {
            data: self.data,
            offset: self.off,
            rows: l.rows,
            cols: l.cols,
            rs: l.rs,
            cs: l.cs,
        }
    }
}

/// Element types with a kernel: `dst (m x n, row-major) (+)= a · b`.
trait Gemm: Element {
    /// `dst = a · b`, or `dst += a · b` when `accumulate`.
    fn gemm(
        dst: &mut [Self],
        a: Operand<'_, Self>,
        b: Operand<'_, Self>,
        accumulate: bool,
        par: Par,
    ) -> Result<()>;
}

macro_rules! faer_gemm {
    ($t:ty) => {
        impl Gemm for $t {
            fn gemm(
                dst: &mut [Self],
                a: Operand<'_, Self>,
                b: Operand<'_, Self>,
                accumulate: bool,
                par: Par,
            ) -> Result<()> {
                let lhs = a.layout.faer(a.data, a.off)?;
                let rhs = b.layout.faer(b.data, b.off)?;
                let d = MatMut::from_row_major_slice_mut(dst, a.layout.rows, b.layout.cols);
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
        a: Operand<'_, Self>,
        b: Operand<'_, Self>,
        accumulate: bool,
        par: Par,
    ) -> Result<()> {
        let (al, bl) = (a.layout, b.layout);
        let a = al.slice(a.data, a.off)?;
        let b = bl.slice(b.data, b.off)?;
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

/// `w - (a · b) * s` for f32 matrices `a` (`m x k`), `b` (`k x n`) and `w` (`m x n`) and a
/// one-element f32 `s`, on the native CPU device: the bits of `matmul`, then `mul` by `s`,
/// then `sub` from `w`, with the product's sums scaled and subtracted as they are stored where
/// its kernel allows it ([`crate::cpu::simd::gemm_update_f32`]), so the product is never
/// written out and read back. This is an SGD step fused into its weight gradient's product;
/// the graph layer's CPU passes build it. Elsewhere the product is written, then updated in
/// place, with the same bits.
pub fn sub_scaled_product(w: &Tensor, a: &Tensor, b: &Tensor, s: &Tensor) -> Result<Tensor> {
    check_scaled_product(w, a, b, s)?;
    let (dev, device) = cpu_context(SCALED, a)?;
    let w = if w.is_contiguous() {
        w.clone()
    } else {
        w.copy_untracked()?
    };
    let r = Reader::new(&[a, b, &w, s]);
    let dw = r.data::<f32>(&w)?;
    let wv = &dw[w.offset()..w.offset() + w.numel()];
    let meta = Meta::new(w.shape(), DType::F32);
    output_overwrite::<f32>(&meta, &device, |o| {
        scaled_product(&r, a, b, s, Some(wv), o, &dev)
    })
}

/// [`sub_scaled_product`] written into `w`'s own elements (`w -= (a · b) * s`, the same
/// bits), for a weight nothing else reads afterwards: the graph layer's native executor runs
/// it on a parameter it writes back whole. Returns false, with `w` untouched, where `w` is not
/// contiguous or shares its storage with `a`, `b` or `s` (each would be read while written).
pub fn sub_scaled_product_(w: &Tensor, a: &Tensor, b: &Tensor, s: &Tensor) -> Result<bool> {
    check_scaled_product(w, a, b, s)?;
    let (dev, _) = cpu_context(SCALED, a)?;
    let shares = [a, b, s]
        .iter()
        .any(|t| std::sync::Arc::ptr_eq(t.storage(), w.storage()));
    if !w.is_contiguous() || shares || !w.device().is_cpu() {
        return Ok(false);
    }
    let r = Reader::new(&[a, b, s]);
    let mut g = w.storage().write();
    let data = g
        .as_cpu_mut()
        .ok_or_else(|| Error::internal(SCALED, "expected a CPU buffer"))?
        .typed_mut::<f32>()?;
    let o = data
        .get_mut(w.offset()..w.offset() + w.numel())
        .ok_or_else(|| Error::internal(SCALED, "w outside its storage"))?;
    scaled_product(&r, a, b, s, None, o, &dev)?;
    Ok(true)
}

const SCALED: &str = "sub_scaled_product";

/// Checks the operands of [`sub_scaled_product`].
fn check_scaled_product(w: &Tensor, a: &Tensor, b: &Tensor, s: &Tensor) -> Result<()> {
    let f32s = [w, a, b, s].iter().all(|t| t.dtype() == DType::F32);
    let (m, n) = (a.shape().first().copied(), b.shape().get(1).copied());
    if !f32s
        || a.rank() != 2
        || b.rank() != 2
        || a.shape()[1] != b.shape()[0]
        || [m, n].iter().any(Option::is_none)
        || w.shape() != [a.shape()[0], b.shape()[1]]
        || s.numel() != 1
    {
        return Err(Error::invalid_argument(
            SCALED,
            format!(
                "expected f32 w [m, n], a [m, k], b [k, n] and one-element s; got w {} {}, a {} \
                 {}, b {} {}, s {} {}",
                w.dtype(),
                fmt_shape(w.shape()),
                a.dtype(),
                fmt_shape(a.shape()),
                b.dtype(),
                fmt_shape(b.shape()),
                s.dtype(),
                fmt_shape(s.shape())
            ),
        ));
    }
    Ok(())
}

/// `o = w - (a · b) * s` with `w` the slice given, or `o`'s own elements when `None`.
fn scaled_product(
    r: &Reader<'_>,
    a: &Tensor,
    b: &Tensor,
    s: &Tensor,
    w: Option<&[f32]>,
    o: &mut [f32],
    dev: &CpuDevice,
) -> Result<()> {
    let (da, db) = (r.data::<f32>(a)?, r.data::<f32>(b)?);
    let scale = r.data::<f32>(s)?[s.offset()];
    let view = |t: &Tensor, data| {
        Operand {
            data,
            off: t.offset(),
            layout: MatLayout::strided(t),
        }
        .view()
    };
    let (av, bv) = (view(a, da), view(b, db));
    let threads = dev.num_threads();
    dev.install(|| {
        let fused = match w {
            Some(w) => crate::cpu::simd::gemm_update_f32(av, bv, w, -scale, o, threads)?,
            None => crate::cpu::simd::gemm_update_f32_in_place(av, bv, -scale, o, threads)?,
        };
        if fused {
            return Ok(());
        }
        match w {
            Some(w) => {
                crate::cpu::simd::gemm(av, bv, o, false, threads)?;
                for (o, &w) in o.iter_mut().zip(w) {
                    *o = w - *o * scale;
                }
            }
            None => {
                let mut p = tpu_tensor::tpu_runtime::memory::try_host_capacity(o.len(), || {
                    "the product of an in-place update".to_string()
                })?;
                p.resize(o.len(), 0f32);
                crate::cpu::simd::gemm(av, bv, &mut p, false, threads)?;
                for (o, &p) in o.iter_mut().zip(&p) {
                    *o -= p * scale;
                }
            }
        }
        Ok(())
    })?
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
pub(super) fn product_cpu(
    op: &str,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    batch: &[usize],
    out: &Meta,
) -> Result<Tensor> {
    let p = Product {
        op,
        a,
        b,
        bias,
        batch,
        out,
    };
    let dtype = out.dtype;
    if crate::cpu::simd::gemm_accelerated() {
        match dtype {
            DType::F32 => return p.simd::<f32>(),
            DType::BF16 => return p.simd::<bf16>(),
            DType::F16 => return p.simd::<f16>(),
            _ => {}
        }
    }
    let (round_back, compute) = match dtype {
        DType::F32 | DType::F64 => (false, dtype),
        DType::F16 | DType::BF16 => (true, DType::F32),
        d if d.is_int() => (d != DType::I64, DType::I64),
        d => return Err(unsupported(op, d, DTYPES)),
    };
    let a = a.to_dtype(compute)?;
    let b = b.to_dtype(compute)?;
    let bias = bias.map(|t| t.to_dtype(compute)).transpose()?;
    let meta = Meta::new(&out.shape, compute);
    let p = Product {
        a: &a,
        b: &b,
        bias: bias.as_ref(),
        out: &meta,
        ..p
    };
    let r = match compute {
        DType::F32 => p.typed::<f32>()?,
        DType::F64 => p.typed::<f64>()?,
        _ => p.typed::<i64>()?,
    };
    if round_back { r.to_dtype(dtype) } else { Ok(r) }
}

/// The arguments of [`product_cpu`], for the kernels behind it.
#[derive(Clone, Copy)]
struct Product<'a> {
    op: &'a str,
    a: &'a Tensor,
    b: &'a Tensor,
    bias: Option<&'a Tensor>,
    batch: &'a [usize],
    out: &'a Meta,
}

impl Product<'_> {
    /// Checks the operands against `batch` and the output; returns `(m, k, n, count)`.
    fn check(&self) -> Result<(usize, usize, usize, usize)> {
        let (op, a, b, batch, out) = (self.op, self.a, self.b, self.batch, self.out);
        let (ra, rb) = (a.rank(), b.rank());
        let internal = |why: String| Error::internal(op, why);
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
        if let Some(t) = self.bias
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

    /// The product with the SIMD kernels, for f32, f16 and bf16: operands read in place at
    /// any strides, f32 accumulation, one rounding of 16-bit results.
    fn simd<T: Element + crate::cpu::simd::Elem>(&self) -> Result<Tensor> {
        let fill = Fill {
            // Whole products per task when they share the threads evenly or are small.
            many_small: |count: usize, each: usize, threads: usize| {
                count.is_multiple_of(threads) || count >= 4 * threads || each < 4 * PAR_WORK
            },
            zeroed: false,
        };
        self.run(
            |t| Ok((t.clone(), MatLayout::strided(t))),
            fill,
            |a: Operand<'_, T>, b, dst, start, threads| match start {
                Start::Row(r) => crate::cpu::simd::gemm_bias(a.view(), b.view(), r, dst, threads),
                Start::Zero => crate::cpu::simd::gemm(a.view(), b.view(), dst, false, threads),
                Start::Output => crate::cpu::simd::gemm(a.view(), b.view(), dst, true, threads),
            },
        )
    }

    /// The product with faer (f32, f64) or the i64 loop.
    fn typed<T: Gemm>(&self) -> Result<Tensor> {
        let fill = Fill {
            many_small: |_: usize, each: usize, _: usize| each < 4 * PAR_WORK,
            zeroed: true,
        };
        self.run(fit, fill, |a: Operand<'_, T>, b, dst, start, threads| {
            let par = if threads > 1 {
                Par::rayon(threads)
            } else {
                Par::Seq
            };
            let acc = match start {
                Start::Zero => false,
                Start::Output => true,
                Start::Row(r) => {
                    // faer adds nothing as it stores: the product accumulates onto the bias.
                    for row in dst.chunks_exact_mut(r.len()) {
                        row.copy_from_slice(r);
                    }
                    true
                }
            };
            T::gemm(dst, a, b, acc, par)
        })
    }

    /// What both kernels share: the checks, the product with nothing to multiply, the operands
    /// as `prepare` gives them (the tensor to read, its matrices' layout), the bias (written
    /// first, or handed to a kernel that adds it itself), and the batch's products split over
    /// the pool. `gemm(a, b, dst, start, threads)` runs one product on `threads` threads.
    fn run<T: Element>(
        &self,
        prepare: impl Fn(&Tensor) -> Result<(Tensor, MatLayout)>,
        fill: Fill<impl Fn(usize, usize, usize) -> bool>,
        gemm: impl Fn(Operand<'_, T>, Operand<'_, T>, &mut [T], Start<'_, T>, usize) -> Result<()>
        + Sync,
    ) -> Result<Tensor> {
        let (op, bias, batch, out) = (self.op, self.bias, self.batch, self.out);
        let (m, k, n, count) = self.check()?;
        let (dev, device) = cpu_context(op, self.a)?;
        if out.numel() == 0 || k == 0 {
            // Nothing to multiply (and empty operands may have any strides).
            return empty_product::<T>(&dev, &device, bias, out);
        }
        let (a, al) = prepare(self.a)?;
        let (b, bl) = prepare(self.b)?;
        let a_offs = batch_offsets(&a, batch)?;
        let b_offs = batch_offsets(&b, batch)?;
        let mut locked = vec![&a, &b];
        locked.extend(bias);
        let r = Reader::new(&locked);
        let (da, db) = (r.data::<T>(&a)?, r.data::<T>(&b)?);
        let row = match bias {
            Some(t) => bias_row::<T>(&r, t, n)?,
            None => None,
        };
        let body = |o: &mut [T]| {
            let start = match (bias, row) {
                (_, Some(r)) => Start::Row(r),
                (Some(t), None) => {
                    map1(&dev, (r.data::<T>(t)?, t), &out.shape, o, |x: T| x)?;
                    Start::Output
                }
                (None, None) => Start::Zero,
            };
            let run = |i: usize, dst: &mut [T], threads: usize| {
                let av = Operand {
                    data: da,
                    off: a_offs[i],
                    layout: al,
                };
                let bv = Operand {
                    data: db,
                    off: b_offs[i],
                    layout: bl,
                };
                gemm(av, bv, dst, start, threads)
            };
            let each = m.saturating_mul(n).saturating_mul(k);
            let threads = dev.num_threads();
            let many_small = (fill.many_small)(count, each, threads);
            match split_work(count, each, threads, many_small) {
                Split::Seq => o
                    .chunks_mut(m * n)
                    .enumerate()
                    .try_for_each(|(i, dst)| run(i, dst, 1)),
                // Many small products: one per task.
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
        if (bias.is_some() && row.is_none()) || fill.zeroed {
            output::<T>(out, &device, body)
        } else {
            output_overwrite::<T>(out, &device, body)
        }
    }
}

/// `bias`'s `n` values when it holds one value per column of an `n`-column product (shapes
/// `[n]`, `[1, n]`, ...) and lies dense in its storage: the kernels then add it as they store
/// the tiles ([`crate::cpu::simd::gemm_bias`]); `None` for a bias to broadcast into the output
/// first.
pub(super) fn bias_row<'r, T: Element>(
    r: &'r Reader<'_>,
    bias: &Tensor,
    n: usize,
) -> Result<Option<&'r [T]>> {
    let row =
        bias.is_contiguous() && bias.numel() == n && bias.shape().last().is_none_or(|&d| d == n);
    if !row {
        return Ok(None);
    }
    Ok(r.data::<T>(bias)?.get(bias.offset()..bias.offset() + n))
}

/// What one product of [`Product::run`] starts its sums from.
#[derive(Clone, Copy)]
enum Start<'a, T> {
    /// Nothing: the output is overwritten.
    Zero,
    /// The output's values (the bias broadcast into it).
    Output,
    /// One value per column, which the kernel adds (or starts from).
    Row(&'a [T]),
}

/// How [`Product::run`] fills the output: `many_small(count, each, threads)` says whether
/// `count` products of `each` multiply-adds run one per task; `zeroed` asks for a zeroed
/// output even without a bias.
struct Fill<M> {
    many_small: M,
    zeroed: bool,
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
