//! Elementwise unary ops. Each kind is one row of [`UnaryKind::spec`]: its name, result dtype
//! rule, supported dtypes, CPU functions and StableHLO lowering.

use std::marker::PhantomData;
use std::sync::Arc;

use tpu_tensor::{DType, Device, Element, Error, Generator, Result, Scalar, Tensor, with_element};

use crate::autograd::Saved;
use crate::cpu::kernels::{Kernel1, Reader, cpu_device, map1, map1_simd, output_overwrite};
use crate::hlo::{Cmp, FnBuilder, Value};
use crate::op::promote::{float_result, result_type};
use crate::op::{DTypeSet, Meta, OpDef, OpInfo};
use crate::ops::elementwise::methods::TensorOps;
use crate::ops::movement::MovementOps;

/// How a unary op's output dtype follows its input's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// Same dtype.
    Same,
    /// Floats keep theirs; integers and bool give f32 (`exp`, `sqrt`, ...).
    Float,
    /// Always bool (`isnan`, `logical_not`).
    Bool,
}

/// The unary ops.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum UnaryKind {
    Neg,
    Abs,
    Sign,
    Exp,
    Exp2,
    Log,
    Log2,
    Log1p,
    Expm1,
    Sqrt,
    Rsqrt,
    Square,
    Reciprocal,
    Sin,
    Cos,
    Tan,
    Tanh,
    Sigmoid,
    Relu,
    /// GELU with the exact erf form.
    Gelu,
    /// GELU with the tanh approximation.
    GeluTanh,
    Silu,
    /// `log(1 + exp(beta x)) / beta`, linear above `threshold`.
    Softplus {
        beta: f64,
        threshold: f64,
    },
    Erf,
    Floor,
    Ceil,
    /// Round half to even.
    Round,
    Trunc,
    /// Clamp to `[min, max]` (either may be absent).
    Clamp {
        min: Option<Scalar>,
        max: Option<Scalar>,
    },
    /// `x ** exponent` with a Rust number exponent.
    PowScalar(Scalar),
    LogicalNot,
    IsNan,
    IsInf,
    IsFinite,
}

/// The row of the op table for one unary kind.
struct Spec {
    name: &'static str,
    rule: Rule,
    dtypes: DTypeSet,
    /// The f64 function (f32, f16 and bf16 compute in f32 through `f32f`).
    f64f: fn(f64, &UnaryKind) -> f64,
    f32f: fn(f32, &UnaryKind) -> f32,
    /// The function on integers, for ops defined on them without a float result.
    intf: Option<fn(i64, &UnaryKind) -> i64>,
    lower: fn(&mut FnBuilder, &Value, &UnaryKind) -> Value,
    tolerance: f64,
}

fn erf64(x: f64) -> f64 {
    libm::erf(x)
}

fn erf32(x: f32) -> f32 {
    crate::cpu::math::erf_f32(x)
}

fn gelu64(x: f64) -> f64 {
    0.5 * x * (1.0 + erf64(x * std::f64::consts::FRAC_1_SQRT_2))
}

fn gelu32(x: f32) -> f32 {
    crate::cpu::math::gelu_f32(x)
}

const GELU_K: f64 = 0.797_884_560_802_865_4; // sqrt(2 / pi)

fn gelu_tanh64(x: f64) -> f64 {
    0.5 * x * (1.0 + (GELU_K * (x + 0.044715 * x * x * x)).tanh())
}

fn gelu_tanh32(x: f32) -> f32 {
    crate::cpu::math::gelu_tanh_f32(x)
}

fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn sigmoid32(x: f32) -> f32 {
    crate::cpu::math::sigmoid_f32(x)
}

fn sign64(x: f64) -> f64 {
    // PyTorch: (0 < x) - (x < 0), so NaN gives 0.
    ((0.0 < x) as i32 - (x < 0.0) as i32) as f64
}

fn round_even64(x: f64) -> f64 {
    x.round_ties_even()
}

fn softplus_params(k: &UnaryKind) -> (f64, f64) {
    match k {
        UnaryKind::Softplus { beta, threshold } => (*beta, *threshold),
        _ => (1.0, 20.0),
    }
}

fn clamp_f64(x: f64, k: &UnaryKind) -> f64 {
    let UnaryKind::Clamp { min, max } = k else {
        return x;
    };
    // min(max(x, lo), hi) with NaN propagating, as PyTorch.
    let mut v = x;
    if let Some(lo) = min {
        let lo = lo.to_f64();
        v = if v.is_nan() || lo.is_nan() {
            f64::NAN
        } else {
            v.max(lo)
        };
    }
    if let Some(hi) = max {
        let hi = hi.to_f64();
        v = if v.is_nan() || hi.is_nan() {
            f64::NAN
        } else {
            v.min(hi)
        };
    }
    v
}

fn pow_exponent(k: &UnaryKind) -> Scalar {
    match k {
        UnaryKind::PowScalar(e) => *e,
        _ => Scalar::Int(1),
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

macro_rules! f {
    ($x:ident, $body:expr) => {
        |$x, _k| $body
    };
}

fn erf_hlo(b: &mut FnBuilder, x: &Value) -> Value {
    b.ew("chlo.erf", &[x])
}

impl UnaryKind {
    fn spec(&self) -> Spec {
        use UnaryKind::*;
        let ff = DTypeSet::FLOAT;
        let num = DTypeSet::NUMERIC;
        let all = DTypeSet::ALL;
        macro_rules! spec {
            ($name:expr, $rule:expr, $dt:expr, $f64:expr, $f32:expr, $int:expr, $lower:expr, $tol:expr) => {
                Spec {
                    name: $name,
                    rule: $rule,
                    dtypes: $dt,
                    f64f: $f64,
                    f32f: $f32,
                    intf: $int,
                    lower: $lower,
                    tolerance: $tol,
                }
            };
        }
        match self {
            Neg => spec!(
                "neg",
                Rule::Same,
                num,
                f!(x, -x),
                f!(x, -x),
                Some(|x, _| x.wrapping_neg()),
                |b, x, _| b.ew("stablehlo.negate", &[x]),
                0.0
            ),
            Abs => spec!(
                "abs",
                Rule::Same,
                num,
                f!(x, x.abs()),
                f!(x, x.abs()),
                Some(|x, _| x.wrapping_abs()),
                |b, x, _| if x.dtype() == DType::U8 {
                    x.clone()
                } else {
                    b.ew("stablehlo.abs", &[x])
                },
                0.0
            ),
            Sign => spec!(
                "sign",
                Rule::Same,
                num,
                f!(x, sign64(x)),
                f!(x, sign64(x as f64) as f32),
                Some(|x, _| x.signum()),
                |b, x, _| {
                    if x.dtype().is_float() {
                        // XLA's sign keeps NaN; PyTorch gives 0 for NaN.
                        let s = b.ew("stablehlo.sign", &[x]);
                        let nan = b.compare(Cmp::Ne, x, x);
                        let zero = b.splat(x.ty.clone(), 0);
                        b.select(&nan, &zero, &s)
                    } else if x.dtype() == DType::U8 {
                        let zero = b.splat(x.ty.clone(), 0);
                        let one = b.splat(x.ty.clone(), 1);
                        let nz = b.compare(Cmp::Ne, x, &zero);
                        b.select(&nz, &one, &zero)
                    } else {
                        b.ew("stablehlo.sign", &[x])
                    }
                },
                0.0
            ),
            Exp => spec!(
                "exp",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, x.exp()),
                f!(x, x.exp()),
                None,
                |b, x, _| b.ew("stablehlo.exponential", &[x]),
                1e-6
            ),
            Exp2 => spec!(
                "exp2",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, x.exp2()),
                f!(x, x.exp2()),
                None,
                |b, x, _| {
                    let two = b.splat(x.ty.clone(), 2.0);
                    b.ew("stablehlo.power", &[&two, x])
                },
                1e-6
            ),
            Log => spec!(
                "log",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, x.ln()),
                f!(x, x.ln()),
                None,
                |b, x, _| b.ew("stablehlo.log", &[x]),
                1e-6
            ),
            Log2 => spec!(
                "log2",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, x.log2()),
                f!(x, x.log2()),
                None,
                |b, x, _| {
                    let l = b.ew("stablehlo.log", &[x]);
                    let ln2 = b.splat(x.ty.clone(), std::f64::consts::LN_2);
                    b.ew("stablehlo.divide", &[&l, &ln2])
                },
                1e-6
            ),
            Log1p => spec!(
                "log1p",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, x.ln_1p()),
                f!(x, x.ln_1p()),
                None,
                |b, x, _| b.ew("stablehlo.log_plus_one", &[x]),
                1e-6
            ),
            Expm1 => spec!(
                "expm1",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, x.exp_m1()),
                f!(x, x.exp_m1()),
                None,
                |b, x, _| b.ew("stablehlo.exponential_minus_one", &[x]),
                1e-6
            ),
            Sqrt => spec!(
                "sqrt",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, x.sqrt()),
                f!(x, x.sqrt()),
                None,
                |b, x, _| b.ew("stablehlo.sqrt", &[x]),
                1e-6
            ),
            Rsqrt => spec!(
                "rsqrt",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, 1.0 / x.sqrt()),
                f!(x, 1.0 / x.sqrt()),
                None,
                |b, x, _| b.ew("stablehlo.rsqrt", &[x]),
                1e-6
            ),
            Square => spec!(
                "square",
                Rule::Same,
                num,
                f!(x, x * x),
                f!(x, x * x),
                Some(|x, _| x.wrapping_mul(x)),
                |b, x, _| b.ew("stablehlo.multiply", &[x, x]),
                0.0
            ),
            Reciprocal => spec!(
                "reciprocal",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, 1.0 / x),
                f!(x, 1.0 / x),
                None,
                |b, x, _| {
                    let one = b.splat(x.ty.clone(), 1.0);
                    b.ew("stablehlo.divide", &[&one, x])
                },
                0.0
            ),
            Sin => spec!(
                "sin",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, x.sin()),
                f!(x, x.sin()),
                None,
                |b, x, _| b.ew("stablehlo.sine", &[x]),
                1e-6
            ),
            Cos => spec!(
                "cos",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, x.cos()),
                f!(x, x.cos()),
                None,
                |b, x, _| b.ew("stablehlo.cosine", &[x]),
                1e-6
            ),
            Tan => spec!(
                "tan",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, x.tan()),
                f!(x, x.tan()),
                None,
                |b, x, _| b.ew("stablehlo.tan", &[x]),
                1e-5
            ),
            Tanh => spec!(
                "tanh",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, x.tanh()),
                f!(x, crate::cpu::math::tanh_f32(x)),
                None,
                |b, x, _| b.ew("stablehlo.tanh", &[x]),
                1e-6
            ),
            Sigmoid => spec!(
                "sigmoid",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, sigmoid64(x)),
                f!(x, sigmoid32(x)),
                None,
                |b, x, _| b.ew("stablehlo.logistic", &[x]),
                1e-6
            ),
            Relu => spec!(
                "relu",
                Rule::Same,
                num,
                f!(x, if x < 0.0 { 0.0 } else { x }),
                f!(x, if x < 0.0 { 0.0 } else { x }),
                Some(|x, _| x.max(0)),
                |b, x, _| {
                    // x < 0 ? 0 : x keeps NaN and -0.0 as PyTorch does.
                    let zero = b.splat(x.ty.clone(), 0);
                    let neg = b.compare(Cmp::Lt, x, &zero);
                    b.select(&neg, &zero, x)
                },
                0.0
            ),
            Gelu => spec!(
                "gelu",
                Rule::Same,
                ff,
                f!(x, gelu64(x)),
                f!(x, gelu32(x)),
                None,
                |b, x, _| {
                    let half = b.splat(x.ty.clone(), 0.5);
                    let one = b.splat(x.ty.clone(), 1.0);
                    let k = b.splat(x.ty.clone(), std::f64::consts::FRAC_1_SQRT_2);
                    let xs = b.ew("stablehlo.multiply", &[x, &k]);
                    let e = erf_hlo(b, &xs);
                    let s = b.ew("stablehlo.add", &[&one, &e]);
                    let hx = b.ew("stablehlo.multiply", &[&half, x]);
                    b.ew("stablehlo.multiply", &[&hx, &s])
                },
                1e-6
            ),
            GeluTanh => spec!(
                "gelu_tanh",
                Rule::Same,
                ff,
                f!(x, gelu_tanh64(x)),
                f!(x, gelu_tanh32(x)),
                None,
                |b, x, _| {
                    let half = b.splat(x.ty.clone(), 0.5);
                    let one = b.splat(x.ty.clone(), 1.0);
                    let k = b.splat(x.ty.clone(), GELU_K);
                    let c = b.splat(x.ty.clone(), 0.044715);
                    let x2 = b.ew("stablehlo.multiply", &[x, x]);
                    let x3 = b.ew("stablehlo.multiply", &[&x2, x]);
                    let cx3 = b.ew("stablehlo.multiply", &[&c, &x3]);
                    let inner = b.ew("stablehlo.add", &[x, &cx3]);
                    let kin = b.ew("stablehlo.multiply", &[&k, &inner]);
                    let t = b.ew("stablehlo.tanh", &[&kin]);
                    let s = b.ew("stablehlo.add", &[&one, &t]);
                    let hx = b.ew("stablehlo.multiply", &[&half, x]);
                    b.ew("stablehlo.multiply", &[&hx, &s])
                },
                1e-6
            ),
            Silu => spec!(
                "silu",
                Rule::Same,
                ff,
                f!(x, x * sigmoid64(x)),
                f!(x, crate::cpu::math::silu_f32(x)),
                None,
                |b, x, _| {
                    let s = b.ew("stablehlo.logistic", &[x]);
                    b.ew("stablehlo.multiply", &[x, &s])
                },
                1e-6
            ),
            Softplus { .. } => spec!(
                "softplus",
                Rule::Same,
                ff,
                |x, k| {
                    let (beta, th) = softplus_params(k);
                    if x * beta > th {
                        x
                    } else {
                        (x * beta).exp().ln_1p() / beta
                    }
                },
                |x, k| {
                    let (beta, th) = softplus_params(k);
                    let (beta, th) = (beta as f32, th as f32);
                    if x * beta > th {
                        x
                    } else {
                        (x * beta).exp().ln_1p() / beta
                    }
                },
                None,
                |b, x, k| {
                    let (beta, th) = softplus_params(k);
                    let bv = b.splat(x.ty.clone(), beta);
                    let tv = b.splat(x.ty.clone(), th);
                    let bx = b.ew("stablehlo.multiply", &[x, &bv]);
                    let e = b.ew("stablehlo.exponential", &[&bx]);
                    let l = b.ew("stablehlo.log_plus_one", &[&e]);
                    let soft = b.ew("stablehlo.divide", &[&l, &bv]);
                    let big = b.compare(Cmp::Gt, &bx, &tv);
                    b.select(&big, x, &soft)
                },
                1e-6
            ),
            Erf => spec!(
                "erf",
                Rule::Float,
                ff.union(DTypeSet::INT_BOOL),
                f!(x, erf64(x)),
                f!(x, erf32(x)),
                None,
                |b, x, _| erf_hlo(b, x),
                1e-6
            ),
            Floor => spec!(
                "floor",
                Rule::Same,
                num,
                f!(x, x.floor()),
                f!(x, x.floor()),
                Some(|x, _| x),
                |b, x, _| if x.dtype().is_float() {
                    b.ew("stablehlo.floor", &[x])
                } else {
                    x.clone()
                },
                0.0
            ),
            Ceil => spec!(
                "ceil",
                Rule::Same,
                num,
                f!(x, x.ceil()),
                f!(x, x.ceil()),
                Some(|x, _| x),
                |b, x, _| if x.dtype().is_float() {
                    b.ew("stablehlo.ceil", &[x])
                } else {
                    x.clone()
                },
                0.0
            ),
            Round => spec!(
                "round",
                Rule::Same,
                num,
                f!(x, round_even64(x)),
                f!(x, x.round_ties_even()),
                Some(|x, _| x),
                |b, x, _| if x.dtype().is_float() {
                    b.ew("stablehlo.round_nearest_even", &[x])
                } else {
                    x.clone()
                },
                0.0
            ),
            Trunc => spec!(
                "trunc",
                Rule::Same,
                num,
                f!(x, x.trunc()),
                f!(x, x.trunc()),
                Some(|x, _| x),
                |b, x, _| {
                    if !x.dtype().is_float() {
                        return x.clone();
                    }
                    let zero = b.splat(x.ty.clone(), 0);
                    let neg = b.compare(Cmp::Lt, x, &zero);
                    let c = b.ew("stablehlo.ceil", &[x]);
                    let f = b.ew("stablehlo.floor", &[x]);
                    b.select(&neg, &c, &f)
                },
                0.0
            ),
            Clamp { .. } => spec!(
                "clamp",
                Rule::Same,
                num,
                clamp_f64,
                |x, k| clamp_f64(x as f64, k) as f32,
                Some(|x, k| {
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
                }),
                |b, x, k| {
                    let UnaryKind::Clamp { min, max } = k else {
                        return x.clone();
                    };
                    let mut v = x.clone();
                    if let Some(lo) = min {
                        let l = b.splat(x.ty.clone(), *lo);
                        v = b.extreme(&v, &l, true);
                    }
                    if let Some(hi) = max {
                        let h = b.splat(x.ty.clone(), *hi);
                        v = b.extreme(&v, &h, false);
                    }
                    v
                },
                0.0
            ),
            PowScalar(_) => spec!(
                "pow",
                Rule::Same,
                num,
                |x, k| x.powf(pow_exponent(k).to_f64()),
                |x, k| {
                    let e = pow_exponent(k);
                    match e {
                        // Small integer powers are exact products in PyTorch.
                        Scalar::Int(2) => x * x,
                        Scalar::Int(3) => x * x * x,
                        _ => x.powf(e.to_f64() as f32),
                    }
                },
                Some(|x, k| powi(x, pow_exponent(k).to_i64())),
                |b, x, k| {
                    let e = pow_exponent(k);
                    if x.dtype() == DType::Bool {
                        // Only a bool exponent keeps a bool result: x ** true is x, x ** false
                        // is true.
                        return if e.to_f64() != 0.0 {
                            x.clone()
                        } else {
                            b.splat(x.ty.clone(), true)
                        };
                    }
                    match e {
                        Scalar::Int(2) => b.ew("stablehlo.multiply", &[x, x]),
                        Scalar::Int(3) => {
                            let x2 = b.ew("stablehlo.multiply", &[x, x]);
                            b.ew("stablehlo.multiply", &[&x2, x])
                        }
                        _ => {
                            let ev = b.splat(x.ty.clone(), e);
                            b.ew("stablehlo.power", &[x, &ev])
                        }
                    }
                },
                1e-6
            ),
            LogicalNot => spec!(
                "logical_not",
                Rule::Bool,
                all,
                f!(x, (x == 0.0) as u8 as f64),
                f!(x, (x == 0.0) as u8 as f32),
                Some(|x, _| (x == 0) as i64),
                |b, x, _| {
                    let zero = b.splat(x.ty.clone(), 0);
                    b.compare(Cmp::Eq, x, &zero)
                },
                0.0
            ),
            IsNan => spec!(
                "isnan",
                Rule::Bool,
                all,
                f!(x, x.is_nan() as u8 as f64),
                f!(x, x.is_nan() as u8 as f32),
                Some(|_, _| 0),
                |b, x, _| {
                    if x.dtype().is_float() {
                        b.compare(Cmp::Ne, x, x)
                    } else {
                        b.splat(x.ty.with_dtype(DType::Bool), false)
                    }
                },
                0.0
            ),
            IsInf => spec!(
                "isinf",
                Rule::Bool,
                all,
                f!(x, x.is_infinite() as u8 as f64),
                f!(x, x.is_infinite() as u8 as f32),
                Some(|_, _| 0),
                |b, x, _| {
                    if x.dtype().is_float() {
                        let a = b.ew("stablehlo.abs", &[x]);
                        let inf = b.splat(x.ty.clone(), f64::INFINITY);
                        b.compare(Cmp::Eq, &a, &inf)
                    } else {
                        b.splat(x.ty.with_dtype(DType::Bool), false)
                    }
                },
                0.0
            ),
            IsFinite => spec!(
                "isfinite",
                Rule::Bool,
                all,
                f!(x, x.is_finite() as u8 as f64),
                f!(x, x.is_finite() as u8 as f32),
                Some(|_, _| 1),
                |b, x, _| {
                    if x.dtype().is_float() {
                        b.op(
                            "stablehlo.is_finite",
                            &[x],
                            "",
                            x.ty.with_dtype(DType::Bool),
                        )
                    } else {
                        b.splat(x.ty.with_dtype(DType::Bool), true)
                    }
                },
                0.0
            ),
        }
    }

    /// Every kind, with default parameters, for the op table.
    pub fn all() -> Vec<UnaryKind> {
        use UnaryKind::*;
        vec![
            Neg,
            Abs,
            Sign,
            Exp,
            Exp2,
            Log,
            Log2,
            Log1p,
            Expm1,
            Sqrt,
            Rsqrt,
            Square,
            Reciprocal,
            Sin,
            Cos,
            Tan,
            Tanh,
            Sigmoid,
            Relu,
            Gelu,
            GeluTanh,
            Silu,
            Softplus {
                beta: 1.0,
                threshold: 20.0,
            },
            Erf,
            Floor,
            Ceil,
            Round,
            Trunc,
            Clamp {
                min: Some(Scalar::Float(-0.5)),
                max: Some(Scalar::Float(0.5)),
            },
            PowScalar(Scalar::Int(2)),
            LogicalNot,
            IsNan,
            IsInf,
            IsFinite,
        ]
    }
}

/// An elementwise unary op.
#[derive(Clone, Debug)]
pub struct Unary(pub UnaryKind);

impl Unary {
    fn out_dtype(&self, input: DType) -> DType {
        let spec = self.0.spec();
        match (&self.0, spec.rule) {
            (UnaryKind::Clamp { min, max }, _) => {
                let mut metas = vec![Meta::new(&[1], input)];
                for s in [min, max].into_iter().flatten() {
                    metas.push(Meta {
                        number: true,
                        ..Meta::new(&[], s.default_dtype())
                    });
                }
                result_type(&metas)
            }
            (UnaryKind::PowScalar(e), _) => result_type(&[
                Meta::new(&[1], input),
                Meta {
                    number: true,
                    ..Meta::new(&[], e.default_dtype())
                },
            ]),
            (_, Rule::Same) => input,
            (_, Rule::Float) => float_result(input),
            (_, Rule::Bool) => DType::Bool,
        }
    }
}

/// One function in f32 and in f64, for [`float_map`]; implementations mark both
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
    dev: &tpu_tensor::tpu_runtime::CpuDevice,
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

impl OpDef for Unary {
    fn name(&self) -> &'static str {
        self.0.spec().name
    }

    fn attrs(&self) -> String {
        format!("{:?}", self.0)
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let spec = self.0.spec();
        let x = &inputs[0];
        let out = self.out_dtype(x.dtype);
        // clamp and pow with a number promote first (a bool tensor clamped to 0.5 is f32), so
        // the dtype they compute in is the one to check. pow of bool by bool is PyTorch's
        // copy (exponent true) or ones (false).
        let (checked, ok) = match self.0 {
            UnaryKind::Clamp { .. } => (out, spec.dtypes.contains(out)),
            UnaryKind::PowScalar(_) => (out, spec.dtypes.contains(out) || out == DType::Bool),
            _ => (x.dtype, spec.dtypes.contains(x.dtype)),
        };
        if !ok {
            let given = if checked == x.dtype {
                x.dtype.to_string()
            } else {
                format!("{} (promoted to {checked})", x.dtype)
            };
            let supported = if self.0 == UnaryKind::Neg && x.dtype == DType::Bool {
                format!(
                    "{} (negation of a bool tensor is not supported: to invert a mask, use logical_not())",
                    spec.dtypes
                )
            } else {
                spec.dtypes.to_string()
            };
            return Err(Error::UnsupportedDType {
                op: spec.name.into(),
                given,
                supported,
            });
        }
        if let UnaryKind::PowScalar(e) = self.0
            && !x.dtype.is_float()
            && !e.is_float()
            && e.to_i64() < 0
        {
            return Err(Error::invalid_argument(
                "pow",
                format!(
                    "integers to negative integer powers are not allowed (tensor of {}, exponent {e})",
                    x.dtype
                ),
            ));
        }
        Ok(vec![Meta::new(&x.shape, out)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let spec = self.0.spec();
        let out_meta = &outputs[0];
        // Inputs are brought to the output dtype first (ints to float for `exp`, ...), except
        // for bool-valued ops, which read their input as is.
        let x = if spec.rule == Rule::Bool {
            inputs[0].clone()
        } else {
            inputs[0].to_dtype(out_meta.dtype)?
        };
        let dev = cpu_device(spec.name, &x)?;
        let device = Device::from_cpu(dev.clone());
        let kind = self.0;
        let r = Reader::new(&[&x]);
        let t = if spec.rule == Rule::Bool {
            with_element!(x.dtype(), T, {
                let src = r.data::<T>(&x)?;
                output_overwrite::<bool>(out_meta, &device, |out| {
                    if let Some(fi) = spec.intf.filter(|_| !T::DTYPE.is_float()) {
                        map1(&dev, (src, &x), x.shape(), out, |v: T| {
                            fi(v.to_i64(), &kind) != 0
                        })
                    } else {
                        map1(&dev, (src, &x), x.shape(), out, |v: T| {
                            (spec.f64f)(v.to_f64(), &kind) != 0.0
                        })
                    }
                })?
            })
        } else {
            with_element!(out_meta.dtype, T, {
                let src = r.data::<T>(&x)?;
                output_overwrite::<T>(out_meta, &device, |out| {
                    if T::DTYPE.is_float() {
                        // The common activations get vectorised kernels (a function pointer
                        // in the inner loop would stop vectorisation), calling `crate::cpu::math`
                        // directly: its functions are `#[inline(always)]`, a wrapper may stay
                        // a call. The rest go through the table's functions.
                        macro_rules! inl {
                            ($x:ident => $e32:expr, $e64:expr $(, run: $run:path)?) => {{
                                struct K;
                                impl FloatFn for K {
                                    #[inline(always)]
                                    fn f32($x: f32) -> f32 {
                                        $e32
                                    }
                                    #[inline(always)]
                                    fn f64($x: f64) -> f64 {
                                        $e64
                                    }
                                    $(
                                        #[inline(always)]
                                        fn f32_run(s: &[f32], o: &mut [f32]) -> bool {
                                            $run(s, o)
                                        }
                                    )?
                                }
                                float_map::<T, K>(&dev, src, &x, out)
                            }};
                        }
                        match kind {
                            UnaryKind::Neg => inl!(v => -v, -v),
                            UnaryKind::Abs => inl!(v => v.abs(), v.abs()),
                            UnaryKind::Square => inl!(v => v * v, v * v),
                            UnaryKind::Sqrt => inl!(v => v.sqrt(), v.sqrt()),
                            UnaryKind::Exp => inl!(v => crate::cpu::math::exp_f32(v), v.exp()),
                            UnaryKind::Relu => {
                                inl!(v => if v < 0.0 { 0.0 } else { v }, if v < 0.0 { 0.0 } else { v })
                            }
                            UnaryKind::Sigmoid => {
                                inl!(v => crate::cpu::math::sigmoid_f32(v), sigmoid64(v))
                            }
                            UnaryKind::Tanh => inl!(v => crate::cpu::math::tanh_f32(v), v.tanh()),
                            UnaryKind::Silu => {
                                inl!(v => crate::cpu::math::silu_f32(v), v * sigmoid64(v))
                            }
                            UnaryKind::Gelu => inl!(
                                v => crate::cpu::math::gelu_f32(v),
                                gelu64(v),
                                run: crate::cpu::simd::gelu_f32
                            ),
                            UnaryKind::GeluTanh => {
                                inl!(v => crate::cpu::math::gelu_tanh_f32(v), gelu_tanh64(v))
                            }
                            UnaryKind::Erf => inl!(v => crate::cpu::math::erf_f32(v), erf64(v)),
                            _ if T::DTYPE == DType::F64 => {
                                map1(&dev, (src, &x), x.shape(), out, |v: T| {
                                    T::from_f64((spec.f64f)(v.to_f64(), &kind))
                                })
                            }
                            _ => map1(&dev, (src, &x), x.shape(), out, |v: T| {
                                T::from_f64((spec.f32f)(v.to_f64() as f32, &kind) as f64)
                            }),
                        }
                    } else {
                        let fi = spec.intf.ok_or_else(|| Error::UnsupportedDType {
                            op: spec.name.into(),
                            given: T::DTYPE.to_string(),
                            supported: spec.dtypes.to_string(),
                        })?;
                        map1(&dev, (src, &x), x.shape(), out, |v: T| {
                            T::from_i64(fi(v.to_i64(), &kind))
                        })
                    }
                })?
            })
        };
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let spec = self.0.spec();
        let out = outputs[0].dtype;
        let x = if spec.rule == Rule::Bool {
            inputs[0].clone()
        } else {
            b.convert(&inputs[0], out)
        };
        // 16-bit floats compute in f32, as on the CPU.
        let compute = crate::op::promote::compute_dtype(x.dtype());
        let xc = b.convert(&x, compute);
        let y = (spec.lower)(b, &xc, &self.0);
        let y = if spec.rule == Rule::Bool {
            y
        } else {
            b.convert(&y, out)
        };
        Ok(vec![y])
    }

    fn has_backward(&self) -> bool {
        !matches!(
            self.0,
            UnaryKind::LogicalNot | UnaryKind::IsNan | UnaryKind::IsInf | UnaryKind::IsFinite
        )
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None]);
        };
        let x = &saved.inputs[0];
        let y = &saved.outputs[0];
        Ok(vec![Some(unary_backward(&self.0, x, y, g)?)])
    }
}

/// d(op)/dx times the incoming gradient `g`, written with ops (PyTorch's formulas).
fn unary_backward(kind: &UnaryKind, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Tensor> {
    use UnaryKind::*;
    let x = &x.to(g.dtype())?;
    Ok(match kind {
        Neg => g.neg()?,
        Abs => g.mul(&x.sign()?)?,
        Sign | Floor | Ceil | Round | Trunc => g.zeros_like()?,
        Exp => g.mul(y)?,
        Exp2 => g.mul(y)?.mul(std::f64::consts::LN_2)?,
        Log => g.div(x)?,
        Log2 => g.div(&x.mul(std::f64::consts::LN_2)?)?,
        Log1p => g.div(&x.add(1.0)?)?,
        Expm1 => g.mul(&y.add(1.0)?)?,
        Sqrt => g.div(&y.mul(2.0)?)?,
        Rsqrt => g.mul(&y.div(x)?)?.mul(-0.5)?,
        Square => g.mul(&x.mul(2.0)?)?,
        Reciprocal => g.mul(&y.square()?)?.neg()?,
        Sin => g.mul(&x.cos()?)?,
        Cos => g.mul(&x.sin()?)?.neg()?,
        Tan => g.mul(&y.square()?.add(1.0)?)?,
        Tanh => g.mul(&y.square()?.rsub(1.0)?)?,
        Sigmoid => g.mul(&y.mul(&y.rsub(1.0)?)?)?,
        // PyTorch selects (`y <= 0 ? 0 : g`) rather than multiplying by a mask, so a NaN or
        // infinite gradient does not leak into the zeros, and a NaN input passes it on.
        Relu => g.masked_fill(&y.le(0.0)?, 0.0)?,
        Gelu => {
            // Phi(x) + x * phi(x)
            let cdf = x
                .mul(std::f64::consts::FRAC_1_SQRT_2)?
                .erf()?
                .add(1.0)?
                .mul(0.5)?;
            let pdf = x.square()?.mul(-0.5)?.exp()?.mul(0.398_942_280_401_432_7)?;
            g.mul(&cdf.add(&x.mul(&pdf)?)?)?
        }
        GeluTanh => {
            let k = GELU_K;
            let x2 = x.square()?;
            let inner = x.add(&x2.mul(x)?.mul(0.044715)?)?.mul(k)?;
            let t = inner.tanh()?;
            let left = t.add(1.0)?.mul(0.5)?;
            let right = x
                .mul(0.5)?
                .mul(&t.square()?.rsub(1.0)?)?
                .mul(&x2.mul(3.0 * 0.044715)?.add(1.0)?.mul(k)?)?;
            g.mul(&left.add(&right)?)?
        }
        Silu => {
            let s = x.sigmoid()?;
            g.mul(&s.mul(&x.mul(&s.rsub(1.0)?)?.add(1.0)?)?)?
        }
        Softplus { beta, threshold } => {
            let bx = x.mul(*beta)?;
            let d = bx.sigmoid()?;
            let linear = bx.gt(*threshold)?;
            g.mul(&crate::where_(&linear, &d.ones_like()?, &d)?)?
        }
        Erf => g.mul(
            &x.square()?
                .neg()?
                .exp()?
                .mul(std::f64::consts::FRAC_2_SQRT_PI)?,
        )?,
        Clamp { min, max } => {
            // The gradient passes strictly inside the bounds, as PyTorch's (0 at a bound and
            // at NaN), and is selected rather than multiplied by a mask, so a NaN or infinite
            // gradient does not leak into the zeros.
            let keep = match (min, max) {
                (Some(lo), Some(hi)) => x.gt(*lo)?.logical_and(&x.lt(*hi)?)?,
                (Some(lo), None) => x.gt(*lo)?,
                (None, Some(hi)) => x.lt(*hi)?,
                (None, None) => x.eq(x)?,
            };
            g.masked_fill(&keep.logical_not()?, 0.0)?
        }
        PowScalar(e) => {
            if e.to_f64() == 0.0 {
                g.zeros_like()?
            } else {
                g.mul(
                    &x.pow_scalar(Scalar::Float(e.to_f64() - 1.0))?
                        .mul(e.to_f64())?,
                )?
            }
        }
        LogicalNot | IsNan | IsInf | IsFinite => g.zeros_like()?,
    })
}

/// Applies a unary op.
pub fn unary(x: &Tensor, kind: UnaryKind) -> Result<Tensor> {
    crate::exec::dispatch::run1(&Unary(kind), &[x])
}

fn sample(kind: UnaryKind, dtype: DType, device: &Device) -> Result<Vec<Tensor>> {
    let base = Generator::new(11).randn([3, 5], DType::F64, &Device::cpu())?;
    let scaled = match kind {
        // Keep inputs in each function's domain.
        UnaryKind::Log
        | UnaryKind::Log2
        | UnaryKind::Sqrt
        | UnaryKind::Rsqrt
        | UnaryKind::Log1p => crate::op::samples::host_map(&base, |v| v.abs() * 3.0 + 0.1)?,
        _ => crate::op::samples::host_map(&base, |v| v * 3.0)?,
    };
    let x = scaled.to_dtype(dtype)?.to_device(device)?;
    // A transposed view exercises strided reads.
    Ok(vec![unary(&x.t()?, kind)?])
}

/// The rows of the op table for unary ops.
pub fn table() -> Vec<OpInfo> {
    UnaryKind::all()
        .into_iter()
        .map(|k| {
            let spec = k.spec();
            // clamp and pow with a number accept bool tensors, promoted by the number (the
            // rows' numbers are not bool).
            let dtypes = match k {
                UnaryKind::Clamp { .. } | UnaryKind::PowScalar(_) => {
                    spec.dtypes.union(DTypeSet::BOOL)
                }
                _ => spec.dtypes,
            };
            OpInfo {
                name: spec.name,
                cpu: dtypes,
                hlo: dtypes,
                sample: Arc::new(move |d, dev| sample(k, d, dev)),
                tolerance: spec.tolerance,
            }
        })
        .collect()
}
