//! Building blocks of the native CPU kernels: typed access to inputs, fresh outputs, and
//! elementwise loops over broadcast, strided operands that run on the device's thread pool
//! above a size threshold.

use std::sync::{Arc, RwLockReadGuard};

use rayon::prelude::*;
use tpu_tensor::tpu_runtime::{Buffer, CpuDevice};
use tpu_tensor::{DType, Device, Dims, Element, Error, Result, Storage, Tensor};

use crate::op::{Meta, OpDef};

/// Elements below which kernels stay on the calling thread: dispatching to the pool costs
/// more than the work.
pub const PAR_THRESHOLD: usize = 1 << 15;

/// Elements per parallel work item.
const CHUNK: usize = 1 << 14;

/// The CPU device a tensor lives on, or an error naming the op.
pub fn cpu_device(op: &str, t: &Tensor) -> Result<Arc<CpuDevice>> {
    t.device()
        .as_cpu()
        .cloned()
        .ok_or_else(|| Error::UnsupportedOp {
            op: op.to_string(),
            dtype: t.dtype().to_string(),
            device: t.device().to_string(),
            detail: "this is the native CPU kernel".into(),
        })
}

/// The native CPU device `t` lives on, both as the pool a kernel runs on and as the device its
/// outputs are made on; an error naming `op` when `t` lives elsewhere.
pub fn cpu_context(op: &str, t: &Tensor) -> Result<(Arc<CpuDevice>, Device)> {
    let dev = cpu_device(op, t)?;
    let device = Device::from_cpu(dev.clone());
    Ok((dev, device))
}

/// How an op's kernel starts: the op's name (for its errors) and [`cpu_context`] of its lead
/// input `lead`.
pub fn launch(op: &impl OpDef, lead: &Tensor) -> Result<(&'static str, Arc<CpuDevice>, Device)> {
    let name = op.name();
    let (dev, device) = cpu_context(name, lead)?;
    Ok((name, dev, device))
}

/// Read access to the storages of several tensors at once (each storage locked once, even when
/// tensors share it), typed as `T`.
pub struct Reader<'a> {
    guards: Vec<(*const Storage, RwLockReadGuard<'a, Buffer>)>,
}

impl<'a> Reader<'a> {
    /// Locks the storages of `ts` for reading.
    pub fn new(ts: &[&'a Tensor]) -> Reader<'a> {
        let mut guards: Vec<(*const Storage, RwLockReadGuard<'a, Buffer>)> =
            Vec::with_capacity(ts.len());
        for t in ts {
            let p = Arc::as_ptr(t.storage());
            if !guards.iter().any(|(q, _)| *q == p) {
                guards.push((p, t.storage().read()));
            }
        }
        Reader { guards }
    }

    /// The elements of `t`'s storage (not only its view) as `T`.
    pub fn data<T: Element>(&self, t: &Tensor) -> Result<&[T]> {
        let p = Arc::as_ptr(t.storage());
        let g = self
            .guards
            .iter()
            .find(|(q, _)| *q == p)
            .map(|(_, g)| g)
            .ok_or_else(|| {
                Error::invalid_argument("kernel", "tensor was not locked for reading")
            })?;
        let buf = g
            .as_cpu()
            .ok_or_else(|| Error::invalid_argument("kernel", "expected a CPU buffer"))?;
        if T::DTYPE == DType::Bool {
            return bools(buf.typed::<u8>()?);
        }
        buf.typed::<T>()
    }
}

/// Bytes as bools (`T` is `bool`), after one check that every byte is 0 or 1. The check is an
/// OR over all bytes, which vectorises; the generic checked cast stops at the first bad byte,
/// a scalar loop that cost a comparison kernel a third of its time.
fn bools<T: Element>(bytes: &[u8]) -> Result<&[T]> {
    check_bool_repr::<T>()?;
    if bytes.iter().fold(0u8, |acc, &b| acc | b) > 1 {
        return Err(Error::InvalidData {
            context: "reading a bool buffer".into(),
            reason: "a byte other than 0 or 1".into(),
        });
    }
    // SAFETY: `T` is `bool` (one byte, alignment 1, checked above) and every byte is 0 or 1,
    // the two valid bit patterns of `bool`; the slice borrows `bytes` for its lifetime.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len()) })
}

/// Zeroed bytes as writable bools (`T` is `bool`): zero is `false`, and whatever is written
/// through the result is a valid bool, so the bytes stay valid after it.
fn zeroed_bools_mut<T: Element>(bytes: &mut [u8]) -> Result<&mut [T]> {
    check_bool_repr::<T>()?;
    if bytes.iter().fold(0u8, |acc, &b| acc | b) != 0 {
        return Err(Error::internal(
            "kernel",
            "a fresh bool output is not zeroed",
        ));
    }
    // SAFETY: as in `bools` (all bytes are 0, `false`), and the result borrows `bytes`
    // mutably for its lifetime, so nothing else reads them meanwhile.
    Ok(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<T>(), bytes.len()) })
}

fn check_bool_repr<T: Element>() -> Result<()> {
    if T::DTYPE != DType::Bool || std::mem::size_of::<T>() != 1 || std::mem::align_of::<T>() != 1 {
        return Err(Error::internal(
            "kernel",
            format!("{} is not bool", T::DTYPE),
        ));
    }
    Ok(())
}

/// A zeroed bool output on the native CPU device, filled by `fill` (see [`zeroed_bools_mut`]).
fn bool_output<T: Element>(
    meta: &Meta,
    device: &Device,
    fill: impl FnOnce(&mut [T]) -> Result<()>,
) -> Result<Tensor> {
    let mut b = Buffer::zeroed(device, DType::Bool, &meta.shape)?;
    let bytes = b
        .as_cpu_mut()
        .ok_or_else(|| Error::internal("kernel", "expected a CPU buffer"))?
        .typed_mut::<u8>()?;
    fill(zeroed_bools_mut(bytes)?)?;
    Ok(Tensor::from_buffer(b))
}

/// The output's element type must be the dtype the op's rule gave.
fn check_output_dtype<T: Element>(meta: &Meta) -> Result<()> {
    if T::DTYPE != meta.dtype {
        return Err(Error::DTypeMismatch {
            context: "kernel output".into(),
            expected: meta.dtype,
            given: T::DTYPE,
        });
    }
    Ok(())
}

/// Allocates a dense output on the native CPU device `device` and fills it with `fill`.
pub fn output<T: Element>(
    meta: &Meta,
    device: &Device,
    fill: impl FnOnce(&mut [T]) -> Result<()>,
) -> Result<Tensor> {
    check_output_dtype::<T>(meta)?;
    if T::DTYPE == DType::Bool && device.is_cpu() {
        return bool_output(meta, device, fill);
    }
    Tensor::from_fn_typed::<T>(&meta.shape, device, fill)
}

/// Like [`output`], but the memory handed to `fill` holds unspecified old values: `fill` must
/// write every element. Saves a zeroing pass for elementwise kernels.
pub fn output_overwrite<T: Element>(
    meta: &Meta,
    device: &Device,
    fill: impl FnOnce(&mut [T]) -> Result<()>,
) -> Result<Tensor> {
    check_output_dtype::<T>(meta)?;
    if T::DTYPE == DType::Bool && device.is_cpu() {
        return bool_output(meta, device, fill);
    }
    Tensor::from_fn_overwrite::<T>(&meta.shape, device, fill)
}

/// Strides that read `t` broadcast to `shape` (stride 0 on broadcast dims).
pub fn broadcast_strides(t: &Tensor, shape: &[usize]) -> Dims {
    let lead = shape.len() - t.rank();
    let mut s = Dims::from_elem(0, shape.len());
    for i in 0..t.rank() {
        s[lead + i] = if t.shape()[i] == 1 { 0 } else { t.strides()[i] };
    }
    s
}

/// A joint walk of `N` operands over one output shape: dims are merged only where every
/// operand allows it, so contiguous operands give one long run.
#[derive(Clone, Debug)]
pub struct MultiWalk<const N: usize> {
    outer: Dims,
    outer_strides: [Dims; N],
    inner: usize,
    inner_strides: [usize; N],
    offsets: [usize; N],
    numel: usize,
}

impl<const N: usize> MultiWalk<N> {
    /// Plans a walk over `shape` for operands with `strides` and `offsets`.
    pub fn new(shape: &[usize], strides: [&[usize]; N], offsets: [usize; N]) -> MultiWalk<N> {
        let numel = shape.iter().product();
        // Innermost first.
        let mut dims: Vec<usize> = Vec::new();
        let mut st: Vec<[usize; N]> = Vec::new();
        for i in (0..shape.len()).rev() {
            let d = shape[i];
            if d == 1 {
                continue;
            }
            let s: [usize; N] = std::array::from_fn(|k| strides[k][i]);
            if let (Some(ld), Some(ls)) = (dims.last_mut(), st.last())
                && (0..N).all(|k| s[k] == ls[k] * *ld)
            {
                *ld *= d;
                continue;
            }
            dims.push(d);
            st.push(s);
        }
        let (inner, inner_strides) = match (dims.first(), st.first()) {
            (Some(&d), Some(&s)) => (d, s),
            _ => (1, [1; N]),
        };
        let outer: Dims = dims.iter().skip(1).rev().copied().collect();
        let outer_strides: [Dims; N] =
            std::array::from_fn(|k| st.iter().skip(1).rev().map(|s| s[k]).collect());
        MultiWalk {
            outer,
            outer_strides,
            inner: if numel == 0 { 0 } else { inner },
            inner_strides,
            offsets,
            numel,
        }
    }

    /// Elements in the walk.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Storage offsets of the element at output index `i`.
    fn offsets_at(&self, i: usize) -> [usize; N] {
        let mut off = self.offsets;
        let col = i % self.inner;
        let mut row = i / self.inner;
        for (o, s) in off.iter_mut().zip(&self.inner_strides) {
            *o += col * s;
        }
        for d in (0..self.outer.len()).rev() {
            let idx = row % self.outer[d];
            row /= self.outer[d];
            for (o, s) in off.iter_mut().zip(&self.outer_strides) {
                *o += idx * s[d];
            }
        }
        off
    }

    /// Calls `f(out_start, len, offsets, inner_strides)` for the runs covering output indices
    /// `lo..hi`; within a run operand `k` advances by `inner_strides[k]`.
    pub fn spans(
        &self,
        lo: usize,
        hi: usize,
        mut f: impl FnMut(usize, usize, [usize; N], [usize; N]),
    ) {
        if lo >= hi || self.inner == 0 {
            return;
        }
        let mut i = lo;
        let mut off = self.offsets_at(lo);
        while i < hi {
            let col = i % self.inner;
            let len = (self.inner - col).min(hi - i);
            f(i, len, off, self.inner_strides);
            i += len;
            if i >= hi {
                break;
            }
            if i.is_multiple_of(self.inner) {
                // Next row: recompute (cheap relative to a row's work).
                off = self.offsets_at(i);
            } else {
                for (o, s) in off.iter_mut().zip(&self.inner_strides) {
                    *o += len * s;
                }
            }
        }
    }
}

/// Runs `body(out_chunk, chunk_start)` over `out` in chunks, on `device`'s pool when `out` is
/// large enough.
pub fn par_chunks<O: Send>(
    device: &CpuDevice,
    out: &mut [O],
    body: impl Fn(&mut [O], usize) + Sync + Send,
) -> Result<()> {
    if out.len() < PAR_THRESHOLD || device.num_threads() <= 1 {
        body(out, 0);
        return Ok(());
    }
    on_pool(device, out, CHUNK, &|chunk, c| body(chunk, c * CHUNK))
}

// The pool entry points below take the task as `&dyn Fn`, so rayon's machinery (jobs, joins,
// producers) is compiled once per element type rather than once per kernel closure: that was
// half of this crate's generated code and of its build time. One indirect call per task of
// thousands of elements costs nothing measurable.

/// Runs `task(chunk, chunk_index)` over `out` cut into `chunk`-element pieces, on the pool.
pub(crate) fn on_pool<O: Send>(
    dev: &CpuDevice,
    out: &mut [O],
    chunk: usize,
    task: &(dyn Fn(&mut [O], usize) + Sync),
) -> Result<()> {
    dev.install(|| {
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(c, piece)| task(piece, c));
    })
}

/// `(0..n).map(item)` on the pool, at least `min_len` items per task, in order.
pub(crate) fn map_on_pool<R: Send>(
    dev: &CpuDevice,
    n: usize,
    min_len: usize,
    item: &(dyn Fn(usize) -> R + Sync),
) -> Result<Vec<R>> {
    dev.install(|| {
        (0..n)
            .into_par_iter()
            .with_min_len(min_len.max(1))
            .map(item)
            .collect()
    })
}

/// `out[i] = f(a[i])` over `a` broadcast to `out`'s shape.
pub fn map1<A: Element, O: Element>(
    device: &CpuDevice,
    a: (&[A], &Tensor),
    shape: &[usize],
    out: &mut [O],
    f: impl Fn(A) -> O + Sync + Send,
) -> Result<()> {
    let sa = broadcast_strides(a.1, shape);
    let w = MultiWalk::<1>::new(shape, [&sa], [a.1.offset()]);
    let src = a.0;
    par_chunks(device, out, |chunk, base| {
        w.spans(base, base + chunk.len(), |start, len, [oa], [ia]| {
            let o = &mut chunk[start - base..start - base + len];
            if ia == 1 {
                for (o, &x) in o.iter_mut().zip(&src[oa..oa + len]) {
                    *o = f(x);
                }
            } else {
                for (j, o) in o.iter_mut().enumerate() {
                    *o = f(src[oa + j * ia]);
                }
            }
        });
    })
}

/// An elementwise function for [`map1_simd`]. Implementations mark `apply` `#[inline(always)]`:
/// it is then compiled into each instruction-set version of the loop (a closure called from
/// three loops may stay a call, which keeps every loop scalar).
pub trait Kernel1<A, O>: Sync {
    /// The function.
    fn apply(&self, a: A) -> O;
    /// `out[j] = apply(src[start + j * step])` through a hand-vectorised kernel that gives the
    /// same bits, where the kernel has one at the processor's level; `false` (the default),
    /// with `out` untouched, sends the run through the compiled loop instead.
    #[inline(always)]
    fn apply_run(&self, _src: &[A], _start: usize, _step: usize, _out: &mut [O]) -> bool {
        false
    }
}

/// [`map1`] for a branch-free [`Kernel1`], with its contiguous runs compiled for the widest
/// instruction set [`crate::cpu::isa::level`] allows: the functions of `crate::cpu::math` then
/// run 16 lanes wide under AVX-512 and 8 under AVX2, instead of the 4 of baseline x86-64.
pub fn map1_simd<A: Element, O: Element, K: Kernel1<A, O>>(
    device: &CpuDevice,
    a: (&[A], &Tensor),
    shape: &[usize],
    out: &mut [O],
    k: K,
) -> Result<()> {
    let src = a.0;
    // Dense input: no walk to plan, one run per chunk.
    if a.1.is_contiguous() && a.1.shape() == shape {
        let src = src
            .get(a.1.offset()..a.1.offset() + out.len())
            .ok_or_else(|| Error::invalid_argument("kernel", "input view exceeds its storage"))?;
        return par_chunks(device, out, |chunk, base| {
            map1_run(&k, &src[base..base + chunk.len()], 0, 1, chunk)
        });
    }
    let sa = broadcast_strides(a.1, shape);
    let w = MultiWalk::<1>::new(shape, [&sa], [a.1.offset()]);
    par_chunks(device, out, |chunk, base| {
        w.spans(base, base + chunk.len(), |start, len, [oa], [ia]| {
            let o = &mut chunk[start - base..start - base + len];
            map1_run(&k, src, oa, ia, o);
        });
    })
}

/// `out[j] = k(src[start + j * step])`, compiled for the widest level available: dense runs
/// vectorise there, and the kernels' functions may use fused multiply-adds, which are a
/// library call in code compiled for baseline x86-64 (so strided runs come here too).
fn map1_run<A: Copy, O, K: Kernel1<A, O>>(
    k: &K,
    src: &[A],
    start: usize,
    step: usize,
    out: &mut [O],
) {
    #[cfg(target_arch = "x86_64")]
    match crate::cpu::isa::level() {
        // SAFETY: `level()` reports AVX-512 F/BW/DQ/VL with AVX2, FMA and F16C only when the
        // processor has them (tests can lower it, never raise it).
        crate::cpu::isa::Level::Avx512 => return unsafe { map1_avx512(k, src, start, step, out) },
        // SAFETY: as above, for AVX2, FMA and F16C.
        crate::cpu::isa::Level::Avx2 => return unsafe { map1_avx2(k, src, start, step, out) },
        crate::cpu::isa::Level::Portable => {}
    }
    map1_loop(k, src, start, step, out)
}

#[inline(always)]
fn map1_loop<A: Copy, O, K: Kernel1<A, O>>(
    k: &K,
    src: &[A],
    start: usize,
    step: usize,
    out: &mut [O],
) {
    if k.apply_run(src, start, step, out) {
        return;
    }
    if step == 1 {
        for (o, &x) in out.iter_mut().zip(&src[start..]) {
            *o = k.apply(x);
        }
    } else {
        for (j, o) in out.iter_mut().enumerate() {
            *o = k.apply(src[start + j * step]);
        }
    }
}

/// Defines each `$name` as [`map1_loop`] compiled with the target features `$features`.
macro_rules! map1_at {
    ($($name:ident: $features:literal),*) => {
        $(
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = $features)]
            unsafe fn $name<A: Copy, O, K: Kernel1<A, O>>(
                k: &K,
                src: &[A],
                start: usize,
                step: usize,
                out: &mut [O],
            ) {
                map1_loop(k, src, start, step, out)
            }
        )*
    };
}
map1_at!(
    map1_avx512: "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c",
    map1_avx2: "avx2,fma,f16c"
);

/// `out[j] = k(src[j])` over dense slices (the shorter one counts), through the same
/// instruction-set dispatch as [`map1_simd`]: a caller that cuts its own blocks (a fused
/// kernel) gets the bits the elementwise kernel gives.
pub fn map1_dense<A: Copy, O, K: Kernel1<A, O>>(k: &K, src: &[A], out: &mut [O]) {
    let n = src.len().min(out.len());
    map1_run(k, &src[..n], 0, 1, &mut out[..n])
}

/// A two-operand elementwise function for [`map2_dense`]; implementations mark `apply`
/// `#[inline(always)]` (see [`Kernel1`]).
pub trait Kernel2<A, B, O>: Sync {
    /// The function.
    fn apply(&self, a: A, b: B) -> O;
}

/// `out[j] = k(a[j], b[j])` over dense slices (the shortest one counts), compiled for the
/// widest instruction set [`crate::cpu::isa::level`] allows.
pub fn map2_dense<A: Copy, B: Copy, O, K: Kernel2<A, B, O>>(
    k: &K,
    a: &[A],
    b: &[B],
    out: &mut [O],
) {
    let n = a.len().min(b.len()).min(out.len());
    span2_run(k, &mut out[..n], (&a[..n], 0, 1), (&b[..n], 0, 1))
}

/// `v` where `m`, else `a`, without a branch: with a mask that is true at random (a ReLU's
/// backward through `masked_fill`) a branch mispredicts on half the elements, measured ten
/// times slower than this indexed pick.
#[inline(always)]
pub fn pick<T: Copy>(m: bool, v: T, a: T) -> T {
    [a, v][usize::from(m)]
}

/// `out[i] = f(a[i], b[i])` over `a` and `b` broadcast to `out`'s shape.
pub fn map2<A: Element, B: Element, O: Element>(
    device: &CpuDevice,
    a: (&[A], &Tensor),
    b: (&[B], &Tensor),
    shape: &[usize],
    out: &mut [O],
    f: impl Fn(A, B) -> O + Sync + Send,
) -> Result<()> {
    let (da, db) = (a.0, b.0);
    // Both dense in the output's shape: no walk to plan, one run per chunk.
    if a.1.is_contiguous() && b.1.is_contiguous() && a.1.shape() == shape && b.1.shape() == shape {
        let n = out.len();
        let bad = || Error::invalid_argument("kernel", "input view exceeds its storage");
        let da = da.get(a.1.offset()..a.1.offset() + n).ok_or_else(bad)?;
        let db = db.get(b.1.offset()..b.1.offset() + n).ok_or_else(bad)?;
        let k = Closure2(f);
        return par_chunks(device, out, |chunk, base| {
            let end = base + chunk.len();
            span2_run(&k, chunk, (&da[base..end], 0, 1), (&db[base..end], 0, 1));
        });
    }
    let sa = broadcast_strides(a.1, shape);
    let sb = broadcast_strides(b.1, shape);
    let w = MultiWalk::<2>::new(shape, [&sa, &sb], [a.1.offset(), b.1.offset()]);
    let k = Closure2(f);
    par_chunks(device, out, |chunk, base| {
        w.spans(
            base,
            base + chunk.len(),
            |start, len, [oa, ob], [ia, ib]| {
                let o = &mut chunk[start - base..start - base + len];
                span2_run(&k, o, (da, oa, ia), (db, ob, ib));
            },
        );
    })
}

/// A closure as a [`Kernel2`], so the loops of [`map2`] are compiled per instruction set with
/// the closure inlined into them (branches on a mask become blends, not jumps).
pub(crate) struct Closure2<F>(pub(crate) F);

impl<A, B, O, F: Fn(A, B) -> O + Sync> Kernel2<A, B, O> for Closure2<F> {
    #[inline(always)]
    fn apply(&self, a: A, b: B) -> O {
        (self.0)(a, b)
    }
}

/// `out[j] = k(a[oa + j * ia], b[ob + j * ib])`, compiled for the widest level available.
fn span2_run<A: Copy, B: Copy, O, K: Kernel2<A, B, O>>(
    k: &K,
    out: &mut [O],
    a: (&[A], usize, usize),
    b: (&[B], usize, usize),
) {
    #[cfg(target_arch = "x86_64")]
    match crate::cpu::isa::level() {
        // SAFETY: `level()` reports AVX-512 F/BW/DQ/VL with AVX2, FMA and F16C only when the
        // processor has them (tests can lower it, never raise it).
        crate::cpu::isa::Level::Avx512 => return unsafe { span2_avx512(k, out, a, b) },
        // SAFETY: as above, for AVX2, FMA and F16C.
        crate::cpu::isa::Level::Avx2 => return unsafe { span2_avx2(k, out, a, b) },
        crate::cpu::isa::Level::Portable => {}
    }
    span2_loop(k, out, a, b)
}

#[inline(always)]
fn span2_loop<A: Copy, B: Copy, O, K: Kernel2<A, B, O>>(
    k: &K,
    out: &mut [O],
    (da, oa, ia): (&[A], usize, usize),
    (db, ob, ib): (&[B], usize, usize),
) {
    let len = out.len();
    match (ia, ib) {
        (1, 1) => {
            for ((o, &x), &y) in out.iter_mut().zip(&da[oa..oa + len]).zip(&db[ob..ob + len]) {
                *o = k.apply(x, y);
            }
        }
        (1, 0) => {
            let y = db[ob];
            for (o, &x) in out.iter_mut().zip(&da[oa..oa + len]) {
                *o = k.apply(x, y);
            }
        }
        (0, 1) => {
            let x = da[oa];
            for (o, &y) in out.iter_mut().zip(&db[ob..ob + len]) {
                *o = k.apply(x, y);
            }
        }
        _ => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = k.apply(da[oa + j * ia], db[ob + j * ib]);
            }
        }
    }
}

/// Defines each `$name` as [`span2_loop`] compiled with the target features `$features`.
macro_rules! span2_at {
    ($($name:ident: $features:literal),*) => {
        $(
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = $features)]
            unsafe fn $name<A: Copy, B: Copy, O, K: Kernel2<A, B, O>>(
                k: &K,
                out: &mut [O],
                a: (&[A], usize, usize),
                b: (&[B], usize, usize),
            ) {
                span2_loop(k, out, a, b)
            }
        )*
    };
}
span2_at!(
    span2_avx512: "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c",
    span2_avx2: "avx2,fma,f16c"
);

/// `out[i] = f(a[i], b[i], c[i])` over three operands broadcast to `out`'s shape.
pub fn map3<A: Element, B: Element, C: Element, O: Element>(
    device: &CpuDevice,
    a: (&[A], &Tensor),
    b: (&[B], &Tensor),
    c: (&[C], &Tensor),
    shape: &[usize],
    out: &mut [O],
    f: impl Fn(A, B, C) -> O + Sync + Send,
) -> Result<()> {
    let sa = broadcast_strides(a.1, shape);
    let sb = broadcast_strides(b.1, shape);
    let sc = broadcast_strides(c.1, shape);
    let w = MultiWalk::<3>::new(
        shape,
        [&sa, &sb, &sc],
        [a.1.offset(), b.1.offset(), c.1.offset()],
    );
    let (da, db, dc) = (a.0, b.0, c.0);
    par_chunks(device, out, |chunk, base| {
        w.spans(
            base,
            base + chunk.len(),
            |start, len, [oa, ob, oc], [ia, ib, ic]| {
                let o = &mut chunk[start - base..start - base + len];
                for (j, o) in o.iter_mut().enumerate() {
                    *o = f(da[oa + j * ia], db[ob + j * ib], dc[oc + j * ic]);
                }
            },
        );
    })
}

/// Casts `t` to `dtype` on its own device when needed (a no-op when it already has it).
pub fn cast(t: &Tensor, dtype: DType) -> Result<Tensor> {
    t.to_dtype(dtype)
}

/// Converts between element types with PyTorch's casting rules.
#[inline(always)]
pub fn cv<S: Element, D: Element>(s: S) -> D {
    tpu_tensor::cast_value::<S, D>(s)
}

/// True when any element of the view `t` (whose storage is `data`) is zero.
pub fn any_zero<T: Element>(data: &[T], t: &Tensor) -> bool {
    let walk = t.layout().walk();
    let mut found = false;
    walk.for_rows(0, walk.rows(), |_, off| {
        for j in 0..walk.inner() {
            if data[off + j * walk.inner_stride()].to_f64() == 0.0 {
                found = true;
            }
        }
    });
    found
}

// ---- the parallel split of rows ----------------------------------------------------------------

/// Calls `f(row_index, row)` for every `len`-element row of `out`, on the device's pool when
/// the rows' total work (`work` per row) is large enough to pay for it.
pub(crate) fn par_rows<O: Send>(
    dev: &CpuDevice,
    out: &mut [O],
    len: usize,
    work: usize,
    f: impl Fn(usize, &mut [O]) + Sync + Send,
) -> Result<()> {
    if len == 0 || out.is_empty() {
        return Ok(());
    }
    let rows = out.len() / len;
    let work = work.max(1);
    let threads = dev.num_threads();
    if rows <= 1 || threads <= 1 || rows.saturating_mul(work) < PAR_THRESHOLD {
        for (i, r) in out.chunks_mut(len).enumerate() {
            f(i, r);
        }
        return Ok(());
    }
    // Tasks big enough to amortise scheduling, yet several per thread for balance.
    let per = (PAR_THRESHOLD / work).clamp(1, rows.div_ceil(threads * 4).max(1));
    on_pool(dev, out, per * len, &|chunk, c| {
        for (j, r) in chunk.chunks_mut(len).enumerate() {
            f(c * per + j, r);
        }
    })
}

/// `(0..n).map(f)`, on the device's pool when the total work is large enough. The result does
/// not depend on the thread count.
pub(crate) fn par_map<R: Send>(
    dev: &CpuDevice,
    n: usize,
    work: usize,
    f: impl Fn(usize) -> R + Sync + Send,
) -> Result<Vec<R>> {
    if n <= 1 || dev.num_threads() <= 1 || n.saturating_mul(work.max(1)) < PAR_THRESHOLD {
        return Ok((0..n).map(f).collect());
    }
    map_on_pool(dev, n, 1, &f)
}

/// Elements per task of [`par_row_blocks`].
const ROW_BLOCK: usize = 1 << 14;

/// Runs `body(first_row, rows)` over `out` cut into whole rows of `row_len` elements, on the
/// device's pool when `out` is large enough to pay for it.
pub(crate) fn par_row_blocks<C: Send>(
    dev: &CpuDevice,
    out: &mut [C],
    row_len: usize,
    body: impl Fn(usize, &mut [C]) + Sync + Send,
) -> Result<()> {
    if out.is_empty() || row_len == 0 {
        return Ok(());
    }
    if out.len() < PAR_THRESHOLD || dev.num_threads() <= 1 {
        body(0, out);
        return Ok(());
    }
    let rows = (ROW_BLOCK / row_len).max(1);
    on_pool(dev, out, rows * row_len, &|chunk, c| body(c * rows, chunk))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiwalk_merges_jointly() {
        // a contiguous [2, 3], b broadcast along dim 0.
        let w = MultiWalk::<2>::new(&[2, 3], [&[3, 1], &[0, 1]], [0, 0]);
        let mut spans = vec![];
        w.spans(0, 6, |s, l, o, st| spans.push((s, l, o, st)));
        assert_eq!(spans, vec![(0, 3, [0, 0], [1, 1]), (3, 3, [3, 0], [1, 1])]);
        // Both contiguous: one run; a partial range starts mid-run.
        let w = MultiWalk::<2>::new(&[2, 3], [&[3, 1], &[3, 1]], [0, 5]);
        let mut spans = vec![];
        w.spans(2, 5, |s, l, o, st| spans.push((s, l, o, st)));
        assert_eq!(spans, vec![(2, 3, [2, 7], [1, 1])]);
    }
}
