//! The CPU kernels of the unary ops: the list's `cpu` and `int` fields made into loops (the
//! vectorised ones through [`Kernel1`]), and the scalar functions the rows name.

use std::marker::PhantomData;

use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::{DType, Element, Error, Result, Scalar, Tensor, with_element};

use super::{GELU_K, Rule, UnaryKind, unary_columns, unary_ops};
use crate::cpu::kernels::{
    Kernel1, Reader, cpu_context, map1, map1_dense, map1_simd, output_overwrite,
};
use crate::cpu::math;
use crate::op::Meta;

/// Runs `kind` on `input` into a tensor of `out`'s shape and dtype.
pub(super) fn unary_cpu(kind: UnaryKind, input: &Tensor, out: &Meta) -> Result<Tensor> {
    let name = kind.name();
    let rule = kind.rule();
    // Inputs are brought to the output dtype first (ints to float for `exp`, ...), except
    // for bool-valued ops, which read their input as is.
    let x = if rule == Rule::Bool {
        input.clone()
    } else {
        input.to_dtype(out.dtype)?
    };
    let (dev, device) = cpu_context(name, &x)?;
    let r = Reader::new(&[&x]);
    Ok(if rule == Rule::Bool {
        let (f64f, intf) = (kind.f64_fn(), kind.int_fn());
        with_element!(x.dtype(), T, {
            let src = r.data::<T>(&x)?;
            output_overwrite::<bool>(out, &device, |o| {
                if let Some(fi) = intf.filter(|_| !T::DTYPE.is_float()) {
                    map1(&dev, (src, &x), x.shape(), o, |v: T| {
                        fi(v.to_i64(), &kind) != 0
                    })
                } else {
                    map1(&dev, (src, &x), x.shape(), o, |v: T| {
                        f64f(v.to_f64(), &kind) != 0.0
                    })
                }
            })?
        })
    } else {
        with_element!(out.dtype, T, {
            let src = r.data::<T>(&x)?;
            output_overwrite::<T>(out, &device, |o| {
                if T::DTYPE.is_float() {
                    float_kernel::<T>(kind, &dev, src, &x, o)
                } else {
                    let fi = kind.int_fn().ok_or_else(|| Error::UnsupportedDType {
                        op: name.into(),
                        given: T::DTYPE.to_string(),
                        supported: kind.dtypes().to_string(),
                    })?;
                    // A bool keeps the low bit (`!1` is -2, which `not true` must not read
                    // as true); the other kinds that accept bool already give 0 or 1.
                    let mask = if T::DTYPE == DType::Bool { 1 } else { -1 };
                    map1(&dev, (src, &x), x.shape(), o, |v: T| {
                        T::from_i64(fi(v.to_i64(), &kind) & mask)
                    })
                }
            })?
        })
    })
}

/// From the list: each kind's float loop, its f64 function (bool-valued ops compute in f64)
/// and its integer function.
macro_rules! unary_kernels {
    (@f64 (simd f32: |$v32:ident| $e32:expr, f64: |$v:ident| $e:expr $(, run: $run:path)?)) => {
        |$v, _| $e
    };
    (@f64 (scalar f32: $f32:expr, f64: $f64:expr)) => {
        $f64
    };
    (@int none) => {
        None
    };
    (@int $f:tt) => {
        Some($f)
    };
    // The common activations get vectorised kernels (a function pointer in the inner loop
    // would stop vectorisation), calling `crate::cpu::math` directly: its functions are
    // `#[inline(always)]`, a wrapper may stay a call. The rest call the row's functions.
    (@k (simd f32: |$v32:ident| $e32:expr, f64: |$v64:ident| $e64:expr $(, run: $run:path)?)) => {
        struct K;
        impl FloatFn for K {
            #[inline(always)]
            fn f32($v32: f32) -> f32 {
                $e32
            }
            #[inline(always)]
            fn f64($v64: f64) -> f64 {
                $e64
            }
            $(
                #[inline(always)]
                fn f32_run(s: &[f32], o: &mut [f32]) -> bool {
                    $run(s, o)
                }
            )?
        }
    };
    (
        @float (simd $($cpu:tt)*),
        $kind:ident, $dev:ident, $src:ident, $x:ident, $out:ident
    ) => {{
        unary_kernels!(@k (simd $($cpu)*));
        float_map::<T, K>($dev, $src, $x, $out)
    }};
    (
        @float (scalar f32: $f32:expr, f64: $f64:expr),
        $kind:ident, $dev:ident, $src:ident, $x:ident, $out:ident
    ) => {
        scalar_map::<T>($dev, $src, $x, $out, $f64, $f32, &$kind)
    };
    // The f32 loop over dense slices: the same kernel as `@float` for f32 (the vectorised
    // loop through the same dispatch, or the row's function per element), so a fused kernel
    // gives the bits of the op's own.
    (@slice (simd $($cpu:tt)*), $kind:ident, $src:ident, $out:ident) => {{
        unary_kernels!(@k (simd $($cpu)*));
        map1_dense(&InPrecision::<f32, K>(PhantomData), $src, $out)
    }};
    (@slice (scalar f32: $f32:expr, f64: $f64:expr), $kind:ident, $src:ident, $out:ident) => {{
        let f: fn(f32, &UnaryKind) -> f32 = $f32;
        for (o, &x) in $out.iter_mut().zip($src) {
            *o = f(x, &$kind);
        }
    }};
    ($(
        $V:ident => { method: $method:tt, cpu: $cpu:tt, int: $int:tt, lower: $lower:tt, grad: $grad:tt }
    )*) => {
        impl UnaryKind {
            /// The op on an f64 value.
            fn f64_fn(&self) -> fn(f64, &UnaryKind) -> f64 {
                match self {
                    $( UnaryKind::$V { .. } => unary_kernels!(@f64 $cpu), )*
                }
            }

            /// The op on integers, for ops defined on them without a float result.
            fn int_fn(&self) -> Option<fn(i64, &UnaryKind) -> i64> {
                match self {
                    $( UnaryKind::$V { .. } => unary_kernels!(@int $int), )*
                }
            }
        }

        /// `kind` on dense f32 slices (the shorter one counts), as the op's f32 kernel
        /// computes it. Bool-valued kinds have no such form (see [`fuses_f32`]).
        pub(crate) fn f32_slice(kind: UnaryKind, src: &[f32], out: &mut [f32]) {
            match kind {
                $( UnaryKind::$V { .. } => unary_kernels!(@slice $cpu, kind, src, out), )*
            }
        }

        /// `kind` on the float tensor `x` (of element `T`), in compute precision.
        fn float_kernel<T: Element>(
            kind: UnaryKind,
            dev: &CpuDevice,
            src: &[T],
            x: &Tensor,
            out: &mut [T],
        ) -> Result<()> {
            match kind {
                $( UnaryKind::$V { .. } => unary_kernels!(@float $cpu, kind, dev, src, x, out), )*
            }
        }
    };
}
unary_ops!(unary_columns, [unary_kernels]);

/// `kind` on a small dense f32 tensor on a CPU device, when no dispatch hook watches and no
/// gradient is to be recorded, without the general path's metas, walk planning and op boxing
/// (several times the work there): the bits of [`f32_slice`], which are the op's f32 kernel's.
/// `None` takes the general path.
pub(super) fn small_dense_f32(x: &Tensor, kind: UnaryKind) -> Option<Result<Tensor>> {
    let n = x.numel();
    let dense = x.dtype() == DType::F32
        && n < crate::cpu::kernels::PAR_THRESHOLD
        && x.is_contiguous()
        && fuses_f32(kind)
        && super::Unary(kind).out_dtype(DType::F32) == DType::F32;
    if !dense || !crate::exec::fast::may_skip_dispatch(&[x]) {
        return None;
    }
    let g = x.storage().read();
    let src = crate::exec::fast::dense_f32(&g, x, n)?;
    Some(Tensor::from_fn_overwrite::<f32>(
        x.shape(),
        x.device(),
        |o| {
            f32_slice(kind, src, o);
            Ok(())
        },
    ))
}

/// True when `kind` on an f32 tensor gives an f32 tensor through [`f32_slice`] (every kind
/// that takes floats but the bool-valued ones).
pub(crate) fn fuses_f32(kind: UnaryKind) -> bool {
    kind.rule() != Rule::Bool && kind.dtypes().contains(DType::F32)
}

/// `f64f` (for f64) or `f32f` (for f32 and the 16-bit floats) through a function pointer.
fn scalar_map<T: Element>(
    dev: &CpuDevice,
    src: &[T],
    x: &Tensor,
    out: &mut [T],
    f64f: fn(f64, &UnaryKind) -> f64,
    f32f: fn(f32, &UnaryKind) -> f32,
    kind: &UnaryKind,
) -> Result<()> {
    if T::DTYPE == DType::F64 {
        map1(dev, (src, x), x.shape(), out, |v: T| {
            T::from_f64(f64f(v.to_f64(), kind))
        })
    } else {
        map1(dev, (src, x), x.shape(), out, |v: T| {
            T::from_f64(f32f(v.to_f64() as f32, kind) as f64)
        })
    }
}

/// One function in f32 and in f64, for [`float_map`]: a kernel, not a number type (the two
/// bodies differ, e.g. `exp` is [`math::exp_f32`] in f32). Implementations mark both
/// `#[inline(always)]` (see [`Kernel1`]).
trait FloatFn {
    fn f32(x: f32) -> f32;
    fn f64(x: f64) -> f64;
    /// `out[i] = f32(src[i])` by a hand-vectorised kernel with the same bits (see
    /// [`Kernel1::apply_run`]); `false`, with `out` untouched, where there is none.
    #[inline(always)]
    fn f32_run(_src: &[f32], _out: &mut [f32]) -> bool {
        false
    }
}

/// `F` on `T` in compute precision: f64 for f64, f32 for f32 and the 16-bit floats.
struct InPrecision<T, F>(PhantomData<fn() -> (T, F)>);

impl<T: Element, F: FloatFn> Kernel1<T, T> for InPrecision<T, F> {
    #[inline(always)]
    fn apply(&self, v: T) -> T {
        if T::DTYPE == DType::F64 {
            T::from_f64(F::f64(v.to_f64()))
        } else {
            T::from_f64(F::f32(v.to_f64() as f32) as f64)
        }
    }

    #[inline(always)]
    fn apply_run(&self, src: &[T], start: usize, step: usize, out: &mut [T]) -> bool {
        if T::DTYPE == DType::F64 {
            return false;
        }
        // Dense f32 straight through; strided or 16-bit runs through an f32 block.
        if step == 1
            && let (Some(s), Some(o)) = (T::as_f32s(&src[start..]), T::as_f32s_mut(out))
        {
            return F::f32_run(s, o);
        }
        const BLOCK: usize = 256;
        let (mut xs, mut ys) = ([0f32; BLOCK], [0f32; BLOCK]);
        for (c, o) in out.chunks_mut(BLOCK).enumerate() {
            let base = start + c * BLOCK * step;
            let (x, y) = (&mut xs[..o.len()], &mut ys[..o.len()]);
            for (j, x) in x.iter_mut().enumerate() {
                *x = src[base + j * step].to_f64() as f32;
            }
            if !F::f32_run(x, y) {
                // Below AVX2 (a test may lower the level mid-run: the loop then redoes it).
                return false;
            }
            for (o, &y) in o.iter_mut().zip(y.iter()) {
                *o = T::from_f64(y as f64);
            }
        }
        true
    }
}

/// Runs `F` on `x` with the loop compiled for the widest instruction set available.
fn float_map<T: Element, F: FloatFn>(
    dev: &CpuDevice,
    src: &[T],
    x: &Tensor,
    out: &mut [T],
) -> Result<()> {
    map1_simd(
        dev,
        (src, x),
        x.shape(),
        out,
        InPrecision::<T, F>(PhantomData),
    )
}

fn erf64(x: f64) -> f64 {
    libm::erf(x)
}

fn gelu64(x: f64) -> f64 {
    0.5 * x * (1.0 + erf64(x * std::f64::consts::FRAC_1_SQRT_2))
}

fn gelu_tanh64(x: f64) -> f64 {
    0.5 * x * (1.0 + (GELU_K * (x + 0.044715 * x * x * x)).tanh())
}

fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn sign64(x: f64) -> f64 {
    // PyTorch: (0 < x) - (x < 0), so NaN gives 0.
    ((0.0 < x) as i32 - (x < 0.0) as i32) as f64
}

/// `(beta, threshold)` of a softplus kind.
pub(super) fn softplus_params(k: &UnaryKind) -> (f64, f64) {
    match k {
        UnaryKind::Softplus { beta, threshold } => (*beta, *threshold),
        _ => (1.0, 20.0),
    }
}

fn softplus_f64(x: f64, k: &UnaryKind) -> f64 {
    let (beta, th) = softplus_params(k);
    if x * beta > th {
        x
    } else {
        (x * beta).exp().ln_1p() / beta
    }
}

fn softplus_f32(x: f32, k: &UnaryKind) -> f32 {
    let (beta, th) = softplus_params(k);
    let (beta, th) = (beta as f32, th as f32);
    if x * beta > th {
        x
    } else {
        (x * beta).exp().ln_1p() / beta
    }
}

/// The slope of a leaky ReLU kind.
pub(super) fn leaky_slope(k: &UnaryKind) -> f64 {
    match k {
        UnaryKind::LeakyRelu(s) => *s,
        _ => 0.01,
    }
}

fn leaky_relu_f64(x: f64, k: &UnaryKind) -> f64 {
    if x > 0.0 { x } else { x * leaky_slope(k) }
}

/// With the slope rounded to f32 first, as PyTorch's f32 kernel and the lowering multiply.
fn leaky_relu_f32(x: f32, k: &UnaryKind) -> f32 {
    if x > 0.0 {
        x
    } else {
        x * leaky_slope(k) as f32
    }
}

/// `(alpha, scale, input_scale)` of an ELU kind.
pub(super) fn elu_params(k: &UnaryKind) -> (f64, f64, f64) {
    match k {
        UnaryKind::Elu {
            alpha,
            scale,
            input_scale,
        } => (*alpha, *scale, *input_scale),
        _ => (1.0, 1.0, 1.0),
    }
}

fn elu_f64(x: f64, k: &UnaryKind) -> f64 {
    let (alpha, scale, input_scale) = elu_params(k);
    if x <= 0.0 {
        (x * input_scale).exp_m1() * (alpha * scale)
    } else {
        x * scale
    }
}

fn elu_f32(x: f32, k: &UnaryKind) -> f32 {
    let (alpha, scale, input_scale) = elu_params(k);
    if x <= 0.0 {
        (x * input_scale as f32).exp_m1() * (alpha * scale) as f32
    } else {
        x * scale as f32
    }
}

fn clamp_f64(x: f64, k: &UnaryKind) -> f64 {
    let UnaryKind::Clamp { min, max } = k else {
        return x;
    };
    // min(max(x, lo), hi) with NaN propagating, as PyTorch.
    let bound = |v: f64, b: &Option<Scalar>, pick: fn(f64, f64) -> f64| match b {
        Some(b) if v.is_nan() || b.to_f64().is_nan() => f64::NAN,
        Some(b) => pick(v, b.to_f64()),
        None => v,
    };
    bound(bound(x, min, f64::max), max, f64::min)
}

fn clamp_int(x: i64, k: &UnaryKind) -> i64 {
    let UnaryKind::Clamp { min, max } = k else {
        return x;
    };
    let mut v = x;
    if let Some(lo) = min {
        v = v.max(lo.to_i64());
    }
    if let Some(hi) = max {
        v = v.min(hi.to_i64());
    }
    v
}

/// The exponent of a `PowScalar` kind.
pub(super) fn pow_exponent(k: &UnaryKind) -> Scalar {
    match k {
        UnaryKind::PowScalar(e) => *e,
        _ => Scalar::Int(1),
    }
}

fn pow_f32(x: f32, k: &UnaryKind) -> f32 {
    let e = pow_exponent(k);
    match e {
        // Small integer powers are exact products in PyTorch.
        Scalar::Int(2) => x * x,
        Scalar::Int(3) => x * x * x,
        _ => x.powf(e.to_f64() as f32),
    }
}

/// Integer power with PyTorch's rules for negative exponents (only 1 and -1 survive).
pub fn powi(a: i64, b: i64) -> i64 {
    if b < 0 {
        return match a {
            1 => 1,
            -1 => {
                if b % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut base, mut exp, mut acc) = (a, b as u64, 1i64);
    while exp > 0 {
        if exp & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        exp >>= 1;
    }
    acc
}
