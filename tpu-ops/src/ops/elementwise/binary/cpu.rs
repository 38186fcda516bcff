//! The CPU kernels of the binary ops and `where`: float arithmetic and comparisons in compute
//! precision, integer arithmetic in i64, and the small dense f32 path that skips dispatch.

use std::ops::Rem;
use std::sync::Arc;

use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::{DType, Device, Element, Error, Result, Scalar, Tensor, with_element};

use super::{Binary, BinaryKind, Out, division_by_zero};
use crate::cpu::float::Float;
use crate::cpu::kernels::{
    Closure2, Kernel1, Kernel2, Reader, cpu_context, map1_dense, map2, map2_dense, map3,
    output_overwrite,
};
use crate::op::Meta;
use crate::op::promote::{compute_dtype, float_result};
use crate::ops::elementwise::fused::Operand;
use crate::ops::elementwise::unary::powi;

/// Evaluates `$body` with `$c` bound to the comparison of `$kind` on `$T`: one closure per
/// kind, inlined into its loop (a function pointer there keeps the loop scalar and branchy).
macro_rules! with_cmp {
    ($kind:expr, $T:ty, $c:ident => $body:expr) => {{
        use BinaryKind::*;
        match $kind {
            Eq => {
                let $c = |a: $T, b: $T| a == b;
                $body
            }
            Ne => {
                let $c = |a: $T, b: $T| a != b;
                $body
            }
            Lt => {
                let $c = |a: $T, b: $T| a < b;
                $body
            }
            Le => {
                let $c = |a: $T, b: $T| a <= b;
                $body
            }
            Gt => {
                let $c = |a: $T, b: $T| a > b;
                $body
            }
            _ => {
                let $c = |a: $T, b: $T| a >= b;
                $body
            }
        }
    }};
}

/// Runs `op` on `inputs` into `outputs[0]`'s shape and dtype.
pub(super) fn binary_cpu(op: &Binary, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let metas: Vec<Meta> = inputs.iter().map(|t| Meta::of(t)).collect();
    let common = op.common_dtype(&metas);
    // Operands computed in: the promoted dtype, or its float for true division.
    let operand = match op.kind.out() {
        Out::Float => float_result(common),
        _ => common,
    };
    let out = &outputs[0];
    let kind = op.kind;
    let (dev, device) = cpu_context(kind.name(), inputs[0])?;
    let is_logical = matches!(
        kind,
        BinaryKind::LogicalAnd | BinaryKind::LogicalOr | BinaryKind::LogicalXor
    );
    // A Rust number keeps full precision in the compute dtype (f32 for 16-bit floats) rather
    // than being rounded to the tensor's dtype first, as PyTorch's opmath does.
    let cast_operand = |t: &Tensor, number: bool| -> Result<Tensor> {
        if is_logical {
            Ok(t.clone())
        } else if number && operand.is_float() {
            t.to_dtype(compute_dtype(operand))
        } else {
            t.to_dtype(operand)
        }
    };
    let a = cast_operand(inputs[0], op.numbers[0])?;
    let b = cast_operand(inputs[1], op.numbers[1])?;
    let r = Reader::new(&[&a, &b]);
    let shape = &out.shape;
    let t = if is_logical {
        let f: fn(bool, bool) -> bool = match kind {
            BinaryKind::LogicalAnd => |x, y| x && y,
            BinaryKind::LogicalOr => |x, y| x || y,
            _ => |x, y| x != y,
        };
        with_element!(a.dtype(), A, {
            with_element!(b.dtype(), B, {
                let (da, db) = (r.data::<A>(&a)?, r.data::<B>(&b)?);
                output_overwrite::<bool>(out, &device, |o| {
                    map2(&dev, (da, &a), (db, &b), shape, o, |x: A, y: B| {
                        f(x.to_f64() != 0.0, y.to_f64() != 0.0)
                    })
                })?
            })
        })
    } else if operand.is_float() {
        macro_rules! go {
            ($A:ty, $B:ty, $O:ty) => {{
                let (da, db) = (r.data::<$A>(&a)?, r.data::<$B>(&b)?);
                float_binary::<$A, $B, $O>(&dev, &device, (da, &a), (db, &b), out, kind)?
            }};
        }
        use tpu_tensor::{bf16, f16};
        match (a.dtype(), b.dtype()) {
            (DType::F32, DType::F32) => go!(f32, f32, f32),
            (DType::F64, DType::F64) => go!(f64, f64, f64),
            (DType::F16, DType::F16) => go!(f16, f16, f16),
            (DType::BF16, DType::BF16) => go!(bf16, bf16, bf16),
            (DType::F16, DType::F32) => go!(f16, f32, f16),
            (DType::F32, DType::F16) => go!(f32, f16, f16),
            (DType::BF16, DType::F32) => go!(bf16, f32, bf16),
            (DType::F32, DType::BF16) => go!(f32, bf16, bf16),
            (x, y) => {
                return Err(Error::internal(
                    kind.name(),
                    format!("no float kernel for operands {x} and {y}"),
                ));
            }
        }
    } else {
        with_element!(operand, T, {
            let (da, db) = (r.data::<T>(&a)?, r.data::<T>(&b)?);
            // As PyTorch: an empty output divides nothing, so it cannot fail.
            if matches!(
                kind,
                BinaryKind::DivFloor
                    | BinaryKind::DivTrunc
                    | BinaryKind::Remainder
                    | BinaryKind::Fmod
            ) && (out.numel() > 0 && crate::cpu::kernels::any_zero(db, &b))
            {
                return Err(division_by_zero(kind.name(), operand));
            }
            if kind.out() == Out::Bool {
                with_cmp!(kind, i64, c => output_overwrite::<bool>(out, &device, |o| {
                    map2(&dev, (da, &a), (db, &b), shape, o, |x: T, y: T| {
                        c(x.to_i64(), y.to_i64())
                    })
                })?)
            } else {
                let f = int_fn(kind);
                output_overwrite::<T>(out, &device, |o| {
                    map2(&dev, (da, &a), (db, &b), shape, o, |x: T, y: T| {
                        T::from_i64(f(x.to_i64(), y.to_i64()))
                    })
                })?
            }
        })
    };
    Ok(vec![t])
}

/// Float arithmetic, with operands converted to the compute precision (f64 for f64, else
/// f32), and float comparisons, in f64 (exact for every float dtype).
fn float_binary<A: Element, B: Element, O: Element>(
    dev: &CpuDevice,
    device: &Device,
    a: (&[A], &Tensor),
    b: (&[B], &Tensor),
    out: &Meta,
    kind: BinaryKind,
) -> Result<Tensor> {
    if kind.out() == Out::Bool {
        // Every float dtype but f64 converts to f32 exactly, so comparing there is exact too.
        return if A::DTYPE == DType::F64 || B::DTYPE == DType::F64 {
            with_cmp!(kind, f64, c => output_overwrite::<bool>(out, device, |o| {
                map2(dev, a, b, &out.shape, o, |x: A, y: B| c(x.to_f64(), y.to_f64()))
            }))
        } else {
            with_cmp!(kind, f32, c => output_overwrite::<bool>(out, device, |o| {
                map2(dev, a, b, &out.shape, o, |x: A, y: B| {
                    c(x.to_f64() as f32, y.to_f64() as f32)
                })
            }))
        };
    }
    // One inlined closure per kind: a function pointer in the inner loop would stop the
    // compiler from vectorising it.
    macro_rules! run {
        ($F:ty, $f:expr) => {
            output_overwrite::<O>(out, device, |o| {
                map2(dev, a, b, &out.shape, o, |x: A, y: B| {
                    O::from_f64($f(x.to_f64() as $F, y.to_f64() as $F) as f64)
                })
            })
        };
    }
    macro_rules! per_kind {
        ($F:ty) => {{
            use BinaryKind::*;
            match kind {
                Add => run!($F, add::<$F>),
                Sub => run!($F, sub::<$F>),
                Mul => run!($F, mul::<$F>),
                Div => run!($F, div::<$F>),
                Maximum => run!($F, maximum::<$F>),
                Minimum => run!($F, minimum::<$F>),
                ReluBackward => run!($F, relu_backward::<$F>),
                _ => {
                    let f = float_fn::<$F>(kind);
                    output_overwrite::<O>(out, device, |o| {
                        map2(dev, a, b, &out.shape, o, |x: A, y: B| {
                            O::from_f64(f(x.to_f64() as $F, y.to_f64() as $F) as f64)
                        })
                    })
                }
            }
        }};
    }
    if O::DTYPE == DType::F64 {
        per_kind!(f64)
    } else {
        per_kind!(f32)
    }
}

fn add<F: Float>(a: F, b: F) -> F {
    a + b
}

fn sub<F: Float>(a: F, b: F) -> F {
    a - b
}

fn mul<F: Float>(a: F, b: F) -> F {
    a * b
}

fn div<F: Float>(a: F, b: F) -> F {
    a / b
}

/// PyTorch's float floor division (`div_floor_floating`), exact at the edges.
fn div_floor<F: Float + Rem<Output = F>>(a: F, b: F) -> F {
    if b == F::ZERO {
        return a / b;
    }
    let m = a % b;
    let mut div = (a - m) / b;
    if m != F::ZERO && ((b < F::ZERO) != (m < F::ZERO)) {
        div -= F::ONE;
    }
    if div != F::ZERO {
        let mut fd = div.floor();
        if div - fd > F::of(0.5) {
            fd += F::ONE;
        }
        fd
    } else {
        F::ZERO.copysign(a / b)
    }
}

fn div_trunc<F: Float>(a: F, b: F) -> F {
    (a / b).trunc()
}

/// Remainder with the divisor's sign (Python's `%`).
fn remainder<F: Float + Rem<Output = F>>(a: F, b: F) -> F {
    let m = a % b;
    if m != F::ZERO && ((b < F::ZERO) != (m < F::ZERO)) {
        m + b
    } else {
        m
    }
}

/// Remainder with the dividend's sign (C's `fmod`, which Rust's `%` is on floats).
fn fmod<F: Float + Rem<Output = F>>(a: F, b: F) -> F {
    a % b
}

fn pow<F: Float>(a: F, b: F) -> F {
    a.powf(b)
}

/// The larger, NaN if either is (compared in f64, exact for f32).
fn maximum<F: Float>(a: F, b: F) -> F {
    F::from_f64(max_nan(a.to_f64(), b.to_f64()))
}

/// The smaller, NaN if either is (compared in f64, exact for f32).
fn minimum<F: Float>(a: F, b: F) -> F {
    F::from_f64(min_nan(a.to_f64(), b.to_f64()))
}

fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn min_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

fn atan2<F: Float>(a: F, b: F) -> F {
    a.atan2(b)
}

/// `g` where `y > 0`, else +0 (a NaN `y` keeps `g`, as `masked_fill(g, y <= 0, 0)` does).
fn relu_backward<F: Float>(g: F, y: F) -> F {
    if y <= F::from_f64(0.0) {
        F::from_f64(0.0)
    } else {
        g
    }
}

/// The float function of an arithmetic kind, in compute precision `F`.
fn float_fn<F: Float + Rem<Output = F>>(k: BinaryKind) -> fn(F, F) -> F {
    use BinaryKind::*;
    match k {
        Add => add,
        Sub => sub,
        Mul => mul,
        Div => div,
        DivFloor => div_floor,
        DivTrunc => div_trunc,
        Remainder => remainder,
        Fmod => fmod,
        Pow => pow,
        Maximum => maximum,
        Minimum => minimum,
        Atan2 => atan2,
        ReluBackward => relu_backward,
        _ => add,
    }
}

/// Integer arithmetic in i64, wrapped to the dtype by the store. Division by zero is reported
/// before this runs.
fn int_fn(k: BinaryKind) -> fn(i64, i64) -> i64 {
    use BinaryKind::*;
    match k {
        Add => |a, b| a.wrapping_add(b),
        Sub => |a, b| a.wrapping_sub(b),
        Mul => |a, b| a.wrapping_mul(b),
        DivTrunc => |a, b| a.wrapping_div(b),
        DivFloor => |a, b| {
            let q = a.wrapping_div(b);
            if (a % b != 0) && ((a < 0) != (b < 0)) {
                q - 1
            } else {
                q
            }
        },
        Remainder => |a, b| {
            let r = a.wrapping_rem(b);
            if r != 0 && ((r < 0) != (b < 0)) {
                r + b
            } else {
                r
            }
        },
        Fmod => |a, b| a.wrapping_rem(b),
        Pow => powi,
        Maximum => |a, b| a.max(b),
        Minimum => |a, b| a.min(b),
        ReluBackward => |g, y| if y <= 0 { 0 } else { g },
        BitwiseAnd => |a, b| a & b,
        BitwiseOr => |a, b| a | b,
        BitwiseXor => |a, b| a ^ b,
        _ => |a, _| a,
    }
}

/// True when `kind` on f32 operands gives an f32 result through [`f32_operands`]: the float
/// arithmetic kinds (not comparisons, logical or bitwise ones).
pub(crate) fn fuses_f32(kind: BinaryKind) -> bool {
    kind.is_arithmetic()
}

/// `f` with its second operand fixed, as a one-operand kernel.
struct WithB<K>(K, f32);

impl<K: Kernel2<f32, f32, f32>> Kernel1<f32, f32> for WithB<K> {
    #[inline(always)]
    fn apply(&self, a: f32) -> f32 {
        self.0.apply(a, self.1)
    }
}

/// `f` with its first operand fixed, as a one-operand kernel.
struct WithA<K>(K, f32);

impl<K: Kernel2<f32, f32, f32>> Kernel1<f32, f32> for WithA<K> {
    #[inline(always)]
    fn apply(&self, b: f32) -> f32 {
        self.0.apply(self.1, b)
    }
}

/// Runs the kernel `k` over operands that are slices or numbers.
fn operands_with<K: Kernel2<f32, f32, f32>>(k: K, a: Operand<'_>, b: Operand<'_>, out: &mut [f32]) {
    match (a, b) {
        (Operand::Slice(a), Operand::Slice(b)) => map2_dense(&k, a, b, out),
        (Operand::Slice(a), Operand::Scalar(b)) => map1_dense(&WithB(k, b), a, out),
        (Operand::Scalar(a), Operand::Slice(b)) => map1_dense(&WithA(k, a), b, out),
        (Operand::Scalar(a), Operand::Scalar(b)) => out.fill(k.apply(a, b)),
    }
}

/// `kind` (one of [`fuses_f32`]) on f32 operands into `out`, with the f32 functions the op's
/// kernel uses (so the same bits): a fused kernel's step.
pub(crate) fn f32_operands(kind: BinaryKind, a: Operand<'_>, b: Operand<'_>, out: &mut [f32]) {
    // One kernel per common kind, so its loop vectorises; the rest call their function through
    // a pointer, as their eager kernel does.
    macro_rules! kernel {
        ($f:path) => {{
            struct K;
            impl Kernel2<f32, f32, f32> for K {
                #[inline(always)]
                fn apply(&self, a: f32, b: f32) -> f32 {
                    $f(a, b)
                }
            }
            operands_with(K, a, b, out)
        }};
    }
    use BinaryKind::*;
    match kind {
        Add => kernel!(add::<f32>),
        Sub => kernel!(sub::<f32>),
        Mul => kernel!(mul::<f32>),
        Div => kernel!(div::<f32>),
        Maximum => kernel!(maximum::<f32>),
        Minimum => kernel!(minimum::<f32>),
        ReluBackward => kernel!(relu_backward::<f32>),
        _ => operands_with(Closure2(float_fn::<f32>(kind)), a, b, out),
    }
}

/// One side of a small dense f32 op: a tensor's elements or a Rust number.
#[derive(Clone, Copy)]
pub(super) enum Small<'a> {
    /// A tensor (f32, dense, of the op's shape).
    Tensor(&'a Tensor),
    /// A Rust number, as the general path makes it: cast to f32 the way `to_dtype` casts it.
    Number(f32),
}

/// The f32 a Rust number becomes in arithmetic with an f32 tensor (the general path casts the
/// number's 0-dim tensor to f32 with [`tpu_tensor::cast_value`]); `None` for a bool, which
/// some ops refuse (`x - true`), left to the general path's checks.
pub(super) fn number_f32(v: Scalar) -> Option<f32> {
    match v {
        Scalar::Float(x) => Some(tpu_tensor::cast_value::<f64, f32>(x)),
        Scalar::Int(i) => Some(tpu_tensor::cast_value::<i64, f32>(i)),
        Scalar::Bool(_) => None,
    }
}

/// Float arithmetic and comparisons on small dense f32 tensors of one shape (or one tensor and a
/// Rust number) on one CPU device, when no dispatch hook watches and no gradient is to be recorded: the
/// general path's metas, type promotion, number tensors, walk planning and op boxing cost
/// several times the arithmetic there. Gives exactly what [`crate::exec::dispatch::run1`] would
/// (no promotion, broadcast or error can arise for such operands, and the same f32 functions
/// compute it), or `None` to take that path.
pub(super) fn small_dense_f32(
    a: Small<'_>,
    b: Small<'_>,
    kind: BinaryKind,
) -> Option<Result<Tensor>> {
    use BinaryKind::*;
    if !matches!(
        kind,
        Add | Sub | Mul | Div | Maximum | Minimum | Eq | Ne | Lt | Le | Gt | Ge
    ) {
        return None;
    }
    let (first, second) = match (a, b) {
        (Small::Tensor(x), Small::Tensor(y)) => (x, Some(y)),
        (Small::Tensor(x), Small::Number(_)) | (Small::Number(_), Small::Tensor(x)) => (x, None),
        (Small::Number(_), Small::Number(_)) => return None,
    };
    let n = first.numel();
    let fits = |t: &Tensor| {
        t.dtype() == DType::F32 && t.is_contiguous() && n < crate::cpu::kernels::PAR_THRESHOLD
    };
    let dense = fits(first) && second.is_none_or(|t| fits(t) && t.shape() == first.shape());
    let inputs: &[&Tensor] = match &second {
        Some(t) => &[first, t],
        None => &[first],
    };
    if !dense || !crate::exec::fast::may_skip_dispatch(inputs) {
        return None;
    }
    small_dense_f32_run(a, b, first, n, kind)
}

/// [`small_dense_f32`] once the operands qualify; `None` when an operand cannot be read as
/// dense f32 elements after all (dispatch then reports why).
fn small_dense_f32_run(
    a: Small<'_>,
    b: Small<'_>,
    first: &Tensor,
    n: usize,
    kind: BinaryKind,
) -> Option<Result<Tensor>> {
    let g0 = first.storage().read();
    // One lock when both views share a storage: a second read lock could wait behind a writer.
    let other = match (a, b) {
        (Small::Tensor(x), Small::Tensor(y)) if !Arc::ptr_eq(x.storage(), y.storage()) => {
            Some(y.storage().read())
        }
        _ => None,
    };
    let operand = |s: Small<'_>| -> Option<Operand<'_>> {
        Some(match s {
            Small::Number(v) => Operand::Scalar(v),
            Small::Tensor(t) if Arc::ptr_eq(t.storage(), first.storage()) => {
                Operand::Slice(crate::exec::fast::dense_f32(&g0, t, n)?)
            }
            Small::Tensor(t) => {
                Operand::Slice(crate::exec::fast::dense_f32(other.as_deref()?, t, n)?)
            }
        })
    };
    let (oa, ob) = (operand(a)?, operand(b)?);
    if kind.out() == Out::Bool {
        return Some(Tensor::from_fn_overwrite::<bool>(
            first.shape(),
            first.device(),
            |o| {
                with_cmp!(kind, f32, c => compare_operands(c, oa, ob, o));
                Ok(())
            },
        ));
    }
    Some(Tensor::from_fn_overwrite::<f32>(
        first.shape(),
        first.device(),
        |o| {
            f32_operands(kind, oa, ob, o);
            Ok(())
        },
    ))
}

/// `out[i] = c(a[i], b[i])` for f32 operands, the comparison [`float_binary`] makes of f32
/// elements.
fn compare_operands(
    c: impl Fn(f32, f32) -> bool,
    a: Operand<'_>,
    b: Operand<'_>,
    out: &mut [bool],
) {
    let at = |x: &Operand<'_>, i: usize| match x {
        Operand::Slice(s) => s[i],
        Operand::Scalar(v) => *v,
    };
    for (i, o) in out.iter_mut().enumerate() {
        *o = c(at(&a, i), at(&b, i));
    }
}

/// `where`: elements of `inputs[1]` where `inputs[0]` is true, of `inputs[2]` elsewhere.
pub(super) fn where_cpu(inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let out = &outputs[0];
    let c = inputs[0];
    let a = inputs[1].to_dtype(out.dtype)?;
    let b = inputs[2].to_dtype(out.dtype)?;
    let (dev, device) = cpu_context("where", c)?;
    let r = Reader::new(&[c, &a, &b]);
    let t = with_element!(out.dtype, T, {
        let (dc, da, db) = (r.data::<bool>(c)?, r.data::<T>(&a)?, r.data::<T>(&b)?);
        output_overwrite::<T>(out, &device, |o| {
            map3(
                &dev,
                (dc, c),
                (da, &a),
                (db, &b),
                &out.shape,
                o,
                |k: bool, x: T, y: T| if k { x } else { y },
            )
        })?
    });
    Ok(vec![t])
}
