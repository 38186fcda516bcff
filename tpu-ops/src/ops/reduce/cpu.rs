//! The CPU kernels of the reductions and scans: each op brings its input to the type it reads
//! or computes in and picks the reduction the loops of [`crate::cpu::simd::reduce`] run; the
//! layout and the split over the pool are [`super::cpu_fold`]'s.

use std::marker::PhantomData;
use std::sync::Arc;

use tpu_tensor::shape::resolve_dim_in;
use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::{DType, Device, Element, Error, Result, Tensor, bf16, f16};

use super::cpu_fold::{COLS, Plan, arg_fold, block, fold};
use super::shape::{one_to_one, reduce_mask, reduced_count, reduced_shape, single_mask, wide};
use super::{ArgReduce, Reduce, ReduceKind, Scan};
use crate::cpu::float::Float;
use crate::cpu::kernels::{
    PAR_THRESHOLD, Reader, cpu_context, cpu_device, launch, par_chunks, par_rows,
};
use crate::cpu::simd::reduce::{
    self as simd, Acc, ArgAcc, ExpDeviation, FloatAcc, Load, Magnitude, NonZero, PowMagnitude,
    RedOp, Square, SquaredDeviation, Truthy,
};
use crate::op::{Meta, OpDef};

/// Expands to `$go!(X, A)` for the stored type `X` of `$dtype` and the type `A` a reduction
/// reads it as: f32 for the 16-bit floats, i64 for integers and bool, the type itself otherwise.
macro_rules! with_stored {
    ($dtype:expr, $go:ident) => {
        match $dtype {
            DType::F32 => $go!(f32, f32),
            DType::BF16 => $go!(bf16, f32),
            DType::F16 => $go!(f16, f32),
            DType::F64 => $go!(f64, f64),
            DType::I64 => $go!(i64, i64),
            DType::I32 => $go!(i32, i64),
            DType::I8 => $go!(i8, i64),
            DType::U8 => $go!(u8, i64),
            DType::Bool => $go!(bool, i64),
        }
    };
}

/// [`Reduce`] on the CPU.
pub(super) fn reduce(op: &Reduce, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    use ReduceKind::*;
    let name = op.name();
    let (&x, out) = one_to_one(name, inputs, outputs)?;
    let dev = cpu_device(name, x)?;
    let mask = reduce_mask(name, &op.dims, x.shape())?;
    if x.numel() == 0 {
        let device = Device::from_cpu(dev);
        return Ok(vec![Tensor::full(
            &out.shape[..],
            op.kind.empty_value(),
            out.dtype,
            &device,
        )?]);
    }
    let n = reduced_count(x.shape(), &mask);
    let k = op.kind;
    // Sum, mean, prod, the extremes and the logic reductions read the stored type directly
    // (16-bit floats widen to f32 and integers to i64 in the loop, with no converted copy); the
    // float-only ones read a copy in their compute type.
    let basic = matches!(k, Sum | Mean | Prod | Amax | Amin);
    let logic = matches!(k, All | Any);
    let xc = if basic || logic {
        x.clone()
    } else {
        x.to_dtype(k.compute(x.dtype()))?
    };
    let plan = Plan::new(&xc, &mask, false)?;
    let r = Reader::new(&[&plan.x]);
    let job = Job {
        kind: k,
        dev: &dev,
        plan: &plan,
        n,
        shape: &out.shape,
    };
    let t = if basic {
        macro_rules! go {
            ($x:ty, $a:ty) => {
                basic_reduce::<$x, $a>(job, block(&r, &plan.x)?)?
            };
        }
        match x.dtype() {
            DType::F32 => f32_reduce(job, block(&r, &plan.x)?)?,
            d => with_stored!(d, go),
        }
    } else if logic {
        macro_rules! go {
            ($x:ty, $a:ty) => {
                logic_reduce::<$x>(job, block(&r, &plan.x)?)?
            };
        }
        with_stored!(x.dtype(), go)
    } else {
        match xc.dtype() {
            DType::F32 => float_reduce::<f32>(job, block(&r, &plan.x)?)?,
            DType::F64 => float_reduce::<f64>(job, block(&r, &plan.x)?)?,
            d => return Err(Error::internal(name, format!("no kernel computing in {d}"))),
        }
    };
    Ok(vec![t.to_dtype(out.dtype)?])
}

/// Sum, mean, amax or amin of a small dense f32 tensor over its last dim or over every dim,
/// without dispatch when [`crate::exec::fast::may_skip_dispatch`] allows: the general path
/// folds such rows serially (below [`PAR_THRESHOLD`]) with these same row loops and divides a
/// mean's sums by the same count, so the bits are its bits. `None` takes the general path.
pub(super) fn small_dense_f32(
    x: &Tensor,
    kind: ReduceKind,
    dims: &[i64],
    keepdim: bool,
) -> Option<Result<Tensor>> {
    use ReduceKind::*;
    let (n, rank) = (x.numel(), x.rank());
    let dense = x.dtype() == DType::F32
        && matches!(kind, Sum | Mean | Amax | Amin)
        && n > 0
        && n < PAR_THRESHOLD
        && x.is_contiguous();
    let last = match dims {
        [] => false,
        [d] if rank > 0 && (*d == -1 || *d == rank as i64 - 1) => true,
        _ => return None,
    };
    if !dense || !crate::exec::fast::may_skip_dispatch(&[x]) {
        return None;
    }
    let red = if last { x.shape()[rank - 1] } else { n };
    let outer = n / red;
    let mut shape: smallvec::SmallVec<[usize; 6]> = match last {
        true => x.shape()[..rank - 1].iter().copied().collect(),
        false => smallvec::SmallVec::new(),
    };
    if keepdim {
        shape.resize(rank, 1);
    }
    let g = x.storage().read();
    let ps = vec![(); outer];
    let src = crate::exec::fast::dense_f32(&g, x, n)?;
    Some(Tensor::from_fn_overwrite::<f32>(
        &shape,
        x.device(),
        |out| {
            match kind {
                Amax => fold_small(&simd::ExtremeF32::<true>, src, red, &ps, out),
                Amin => fold_small(&simd::ExtremeF32::<false>, src, red, &ps, out),
                _ => fold_small(&simd::SumF32, src, red, &ps, out),
            }
            if kind == Mean {
                out.iter_mut().for_each(|s| *s = s.per(red));
            }
            Ok(())
        },
    ))
}

/// `op`'s row loops over `x` into `out`, which starts at the identity as the general path's
/// accumulators do.
fn fold_small<O: RedOp<X = f32, A = f32, P = ()>>(
    op: &O,
    x: &[f32],
    red: usize,
    ps: &[()],
    out: &mut [f32],
) {
    out.fill(op.identity());
    op.rows(x, red, ps, out);
}

/// [`ArgReduce`] on the CPU.
pub(super) fn arg_reduce(
    op: &ArgReduce,
    inputs: &[&Tensor],
    outputs: &[Meta],
) -> Result<Vec<Tensor>> {
    let x = match inputs {
        [x] => *x,
        _ => return Err(Error::internal(op.name(), "expected one input")),
    };
    let (name, dev, device) = launch(op, x)?;
    if x.numel() == 0 {
        // The shape rule refused empty reductions, so the outputs are empty too.
        return outputs
            .iter()
            .map(|m| Tensor::zeros(&m.shape[..], m.dtype, &device))
            .collect();
    }
    let mask = single_mask(name, op.dim, x.shape())?;
    let shape = reduced_shape(x.shape(), &mask, op.keepdim);
    // The flattened index of argmax(dim=None) is in logical order, not memory order.
    let plan = Plan::new(x, &mask, op.dim.is_none())?;
    let r = Reader::new(&[&plan.x]);
    macro_rules! go {
        ($x:ty, $a:ty) => {
            arg_kernel::<$x, $a>(op.max, &dev, &plan, block(&r, &plan.x)?, &shape)?
        };
    }
    // 16-bit floats compare as f32, integers and bool as i64 (exact either way).
    let (values, indices) = with_stored!(x.dtype(), go);
    Ok(if op.with_values {
        vec![values.to_dtype(x.dtype())?, indices]
    } else {
        vec![indices]
    })
}

/// [`Scan`] on the CPU.
pub(super) fn scan(op: &Scan, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let name = op.name();
    let (&x, out) = one_to_one(name, inputs, outputs)?;
    let (dev, device) = cpu_context(name, x)?;
    if x.numel() == 0 {
        return Ok(vec![Tensor::zeros(&out.shape[..], out.dtype, &device)?]);
    }
    let d = resolve_dim_in(name, op.dim, x.rank(), x.shape())?;
    let shape = x.shape();
    let (outer, n, inner) = if shape.is_empty() {
        (1, 1, 1)
    } else {
        (
            shape[..d].iter().product(),
            shape[d],
            shape[d + 1..].iter().product(),
        )
    };
    let geo = (outer, n, inner);
    let xc = x.to_dtype(wide(x.dtype()))?.contiguous()?;
    let r = Reader::new(&[&xc]);
    let prod = op.prod;
    // One instantiation per (type, step): the step must inline for the column loop to
    // vectorise. `Acc`'s steps wrap for i64.
    macro_rules! go {
        ($x:ty, $to:expr, $back:expr) => {{
            let src = block::<$x>(&r, &xc)?;
            if prod {
                scan_tensor(&dev, src, geo, shape, prod, $to, $back, Acc::mul)?
            } else {
                scan_tensor(&dev, src, geo, shape, prod, $to, $back, Acc::add)?
            }
        }};
    }
    let t = match (x.dtype(), xc.dtype()) {
        // f32 accumulates in f64, as PyTorch's CPU scans do; the 16-bit floats in f32.
        (DType::F32, _) => go!(f32, |v: f32| v as f64, |a: f64| a as f32),
        (_, DType::F32) => go!(f32, |v: f32| v, |a: f32| a),
        (_, DType::F64) => go!(f64, |v: f64| v, |a: f64| a),
        (_, DType::I64) => go!(i64, |v: i64| v, |a: i64| a),
        (_, c) => return Err(Error::internal(name, format!("no kernel computing in {c}"))),
    };
    Ok(vec![t.to_dtype(out.dtype)?])
}

/// A tensor of `f(acc)` for every accumulator, in logical order, shaped `shape`.
fn emit<A: Copy + Sync, O: Element>(
    dev: &Arc<CpuDevice>,
    plan: &Plan,
    accs: &[A],
    shape: &[usize],
    f: impl Fn(A) -> O + Sync + Send,
) -> Result<Tensor> {
    let device = Device::from_cpu(dev.clone());
    let t = Tensor::from_fn_overwrite::<O>(&[accs.len()], &device, |out| {
        par_chunks(dev, out, |chunk, base| {
            for (o, &a) in chunk.iter_mut().zip(&accs[base..]) {
                *o = f(a);
            }
        })
    })?;
    plan.restore(t, shape)
}

/// What every reduction kernel is given besides its input: the reduction, the pool, the layout,
/// the count of reduced elements and the output shape.
#[derive(Clone, Copy)]
struct Job<'a> {
    kind: ReduceKind,
    dev: &'a Arc<CpuDevice>,
    plan: &'a Plan,
    n: usize,
    shape: &'a [usize],
}

impl Job<'_> {
    /// [`fold`] of `x` by `op` over this job's layout, with parameters `ps`, one per output.
    fn fold<O: RedOp>(&self, op: &O, x: &[O::X], ps: &[O::P]) -> Result<Vec<O::A>> {
        fold(self.dev, op, x, self.plan.geometry(), ps)
    }

    /// [`Job::fold`] for the ops without parameters.
    fn fold_plain<O: RedOp<P = ()>>(&self, op: &O, x: &[O::X]) -> Result<Vec<O::A>> {
        self.fold(op, x, &vec![(); self.plan.outer * self.plan.inner])
    }

    /// [`emit`] into this job's output shape.
    fn emit<A: Copy + Sync, O: Element>(
        &self,
        accs: &[A],
        f: impl Fn(A) -> O + Sync + Send,
    ) -> Result<Tensor> {
        emit(self.dev, self.plan, accs, self.shape, f)
    }
}

/// The mean of a sum of `n` elements (unused for integers, which have no mean). Kept apart from
/// [`Float`]: it also covers the i64 accumulator, and divides by `n` converted straight to the
/// accumulator type.
trait PerCount: Copy {
    fn per(self, n: usize) -> Self;
}

impl PerCount for f32 {
    fn per(self, n: usize) -> f32 {
        self / n as f32
    }
}

impl PerCount for f64 {
    fn per(self, n: usize) -> f64 {
        self / n as f64
    }
}

impl PerCount for i64 {
    fn per(self, n: usize) -> i64 {
        self / n as i64
    }
}

/// Sum, mean, prod, amax and amin, reading the stored type `X` and accumulating in `A`.
fn basic_reduce<X: Load<A>, A: Acc + PerCount + Element>(job: Job, x: &[X]) -> Result<Tensor> {
    use ReduceKind::*;
    let map = simd::plain::<X, A>();
    let accs = match job.kind {
        Sum | Mean => job.fold_plain(&simd::Sum(map), x)?,
        Prod => job.fold_plain(&simd::Prod(map), x)?,
        Amax => job.fold_plain(&simd::Extreme::<_, true>(map), x)?,
        Amin => job.fold_plain(&simd::Extreme::<_, false>(map), x)?,
        k => return Err(Error::internal(k.name(), "not a basic reduction")),
    };
    emit_sums(job, &accs)
}

/// [`basic_reduce`] for f32, whose sums and extremes have hand-vectorised loops.
fn f32_reduce(job: Job, x: &[f32]) -> Result<Tensor> {
    let accs = match job.kind {
        ReduceKind::Sum | ReduceKind::Mean => job.fold_plain(&simd::SumF32, x)?,
        ReduceKind::Amax => job.fold_plain(&simd::ExtremeF32::<true>, x)?,
        ReduceKind::Amin => job.fold_plain(&simd::ExtremeF32::<false>, x)?,
        _ => return basic_reduce::<f32, f32>(job, x),
    };
    emit_sums(job, &accs)
}

/// The accumulators of a basic reduction, divided by the count for the mean.
fn emit_sums<A: PerCount + Element>(job: Job, accs: &[A]) -> Result<Tensor> {
    let n = job.n;
    if job.kind == ReduceKind::Mean {
        job.emit(accs, |s: A| s.per(n))
    } else {
        job.emit(accs, |s| s)
    }
}

/// all and any over the stored type `X` (non-zero is true).
fn logic_reduce<X: Truthy>(job: Job, x: &[X]) -> Result<Tensor> {
    let accs = if job.kind == ReduceKind::All {
        job.fold_plain(&simd::Logic::<X, true>(PhantomData), x)?
    } else {
        job.fold_plain(&simd::Logic::<X, false>(PhantomData), x)?
    };
    job.emit(&accs, |v| v)
}

/// The float-only reductions (var, std, logsumexp, norm), computing in `C`.
fn float_reduce<C: FloatAcc>(job: Job, x: &[C]) -> Result<Tensor> {
    use ReduceKind::*;
    let n = job.n;
    let plain = simd::plain::<C, C>();
    match job.kind {
        Var { correction } | Std { correction } => {
            // Two passes: the mean, then the squared deviations from it.
            let nf = C::from_f64(n as f64);
            let means: Vec<C> = job
                .fold_plain(&simd::Sum(plain), x)?
                .into_iter()
                .map(|s| s / nf)
                .collect();
            let m2 = job.fold(&simd::Sum(SquaredDeviation(PhantomData)), x, &means)?;
            let divisor = C::from_f64((n as f64 - correction).max(0.0));
            let std = matches!(job.kind, Std { .. });
            job.emit(&m2, |a: C| {
                let v = a.div(divisor);
                if std { v.sqrt() } else { v }
            })
        }
        LogSumExp => {
            // Around the maximum, with infinite maxima replaced by 0 as PyTorch does, so rows of
            // -inf give -inf and rows holding +inf give +inf instead of NaN.
            let centers: Vec<C> = job
                .fold_plain(&simd::Extreme::<_, true>(plain), x)?
                .into_iter()
                .map(|m| if m.infinite() { <C as Float>::ZERO } else { m })
                .collect();
            let s = job.fold(&simd::Sum(ExpDeviation(PhantomData)), x, &centers)?;
            let pairs: Vec<(C, C)> = s.into_iter().zip(centers).collect();
            job.emit(&pairs, |(a, c): (C, C)| a.ln() + c)
        }
        Norm { p } => {
            let accs = if p == f64::INFINITY {
                job.fold_plain(&simd::Extreme::<_, true>(Magnitude(PhantomData)), x)?
            } else if p == f64::NEG_INFINITY {
                job.fold_plain(&simd::Extreme::<_, false>(Magnitude(PhantomData)), x)?
            } else if p == 2.0 {
                job.fold_plain(&simd::Sum(Square(PhantomData)), x)?
            } else if p == 1.0 {
                job.fold_plain(&simd::Sum(Magnitude(PhantomData)), x)?
            } else if p == 0.0 {
                job.fold_plain(&simd::Sum(NonZero(PhantomData)), x)?
            } else {
                let pc = C::from_f64(p);
                job.fold_plain(&simd::Sum(PowMagnitude(pc)), x)?
            };
            let root = C::from_f64(1.0 / p);
            job.emit(&accs, move |s: C| {
                if p.is_infinite() || p == 1.0 || p == 0.0 {
                    s
                } else if p == 2.0 {
                    s.sqrt()
                } else {
                    s.powf(root)
                }
            })
        }
        k => Err(Error::internal(k.name(), "not a float-only reduction")),
    }
}

fn arg_kernel<X: Load<A>, A: ArgAcc + Element>(
    max: bool,
    dev: &Arc<CpuDevice>,
    plan: &Plan,
    x: &[X],
    shape: &[usize],
) -> Result<(Tensor, Tensor)> {
    let geo = plan.geometry();
    let accs = if max {
        arg_fold::<X, A, true>(dev, x, geo)?
    } else {
        arg_fold::<X, A, false>(dev, x, geo)?
    };
    Ok((
        emit(dev, plan, &accs, shape, |a| a.0)?,
        emit(dev, plan, &accs, shape, |a| a.1 as i64)?,
    ))
}

/// A scan of a dense `[outer, n, inner]` block: `acc = step(acc, to(x))`, storing `back(acc)`.
#[allow(clippy::too_many_arguments)]
fn scan_tensor<X: Element, A: Copy + Send + Sync>(
    dev: &Arc<CpuDevice>,
    x: &[X],
    (_, n, inner): (usize, usize, usize),
    shape: &[usize],
    prod: bool,
    to: impl Fn(X) -> A + Sync + Send,
    back: impl Fn(A) -> X + Sync + Send,
    step: impl Fn(A, A) -> A + Sync + Send,
) -> Result<Tensor> {
    let init = to(if prod { X::from_i64(1) } else { X::from_i64(0) });
    let len = n * inner;
    let body = |src: &[X], out: &mut [X]| {
        if inner == 1 {
            let mut acc = init;
            for (o, &v) in out.iter_mut().zip(src) {
                acc = step(acc, to(v));
                *o = back(acc);
            }
            return;
        }
        for c0 in (0..inner).step_by(COLS) {
            let c1 = inner.min(c0 + COLS);
            let mut acc = vec![init; c1 - c0];
            for i in 0..n {
                let row = i * inner;
                let dst = &mut out[row + c0..row + c1];
                for ((a, o), &v) in acc.iter_mut().zip(dst).zip(&src[row + c0..row + c1]) {
                    *a = step(*a, to(v));
                    *o = back(*a);
                }
            }
        }
    };
    let device = Device::from_cpu(dev.clone());
    Tensor::from_fn_typed::<X>(shape, &device, |out| {
        par_rows(dev, out, len, len, |i, dst| {
            body(&x[i * len..(i + 1) * len], dst)
        })
    })
}
