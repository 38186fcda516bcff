//! The StableHLO lowerings of the unary ops: the list's `lower` field behind the dtype
//! conversions every unary op shares, and the lowerings too long for a row.

use tpu_tensor::{DType, Scalar};

use super::cpu::{elu_params, leaky_slope, pow_exponent, softplus_params};
use super::{GELU_K, Rule, UnaryKind, unary_columns, unary_ops};
use crate::hlo::{Cmp, FnBuilder, Value};
use crate::op::Meta;

/// `kind` of `input` as a value of `out`'s dtype.
pub(super) fn lower_unary(b: &mut FnBuilder, kind: &UnaryKind, input: &Value, out: &Meta) -> Value {
    let rule = kind.rule();
    let x = if rule == Rule::Bool {
        input.clone()
    } else {
        b.convert(input, out.dtype)
    };
    // 16-bit floats compute in f32, as on the CPU.
    let compute = crate::op::promote::compute_dtype(x.dtype());
    let xc = b.convert(&x, compute);
    let y = kind.lower_fn()(b, &xc, kind);
    if rule == Rule::Bool {
        y
    } else {
        b.convert(&y, out.dtype)
    }
}

/// From the list: each kind's lowering.
macro_rules! unary_lowerings {
    ($(
        $V:ident => { method: $method:tt, cpu: $cpu:tt, int: $int:tt, lower: $lower:tt, grad: $grad:tt }
    )*) => {
        impl UnaryKind {
            /// The op on a value in compute precision.
            fn lower_fn(&self) -> fn(&mut FnBuilder, &Value, &UnaryKind) -> Value {
                match self {
                    $( UnaryKind::$V { .. } => $lower, )*
                }
            }
        }
    };
}
unary_ops!(unary_columns, [unary_lowerings]);

/// `log(x) / ln_base`: the logarithm to a base whose natural log is `ln_base`.
fn log_base(b: &mut FnBuilder, x: &Value, ln_base: f64) -> Value {
    let l = b.ew("stablehlo.log", &[x]);
    let ln = b.splat(x.ty.clone(), ln_base);
    b.ew("stablehlo.divide", &[&l, &ln])
}

/// `chlo.erf`.
fn erf(b: &mut FnBuilder, x: &Value) -> Value {
    b.ew("chlo.erf", &[x])
}

/// Toward zero, for a float value: `x < 0 ? ceil(x) : floor(x)`.
pub(crate) fn trunc_float(b: &mut FnBuilder, x: &Value) -> Value {
    let zero = b.splat(x.ty.clone(), 0);
    let neg = b.compare(Cmp::Lt, x, &zero);
    let c = b.ew("stablehlo.ceil", &[x]);
    let f = b.ew("stablehlo.floor", &[x]);
    b.select(&neg, &c, &f)
}

fn sign(b: &mut FnBuilder, x: &Value, _: &UnaryKind) -> Value {
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
}

fn relu(b: &mut FnBuilder, x: &Value, _: &UnaryKind) -> Value {
    // x < 0 ? 0 : x keeps NaN and -0.0 as PyTorch does.
    let zero = b.splat(x.ty.clone(), 0);
    let neg = b.compare(Cmp::Lt, x, &zero);
    b.select(&neg, &zero, x)
}

fn gelu(b: &mut FnBuilder, x: &Value, _: &UnaryKind) -> Value {
    let half = b.splat(x.ty.clone(), 0.5);
    let one = b.splat(x.ty.clone(), 1.0);
    let k = b.splat(x.ty.clone(), std::f64::consts::FRAC_1_SQRT_2);
    let xs = b.ew("stablehlo.multiply", &[x, &k]);
    let e = erf(b, &xs);
    let s = b.ew("stablehlo.add", &[&one, &e]);
    let hx = b.ew("stablehlo.multiply", &[&half, x]);
    b.ew("stablehlo.multiply", &[&hx, &s])
}

fn gelu_tanh(b: &mut FnBuilder, x: &Value, _: &UnaryKind) -> Value {
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
}

fn softplus(b: &mut FnBuilder, x: &Value, k: &UnaryKind) -> Value {
    let (beta, th) = softplus_params(k);
    let bv = b.splat(x.ty.clone(), beta);
    let tv = b.splat(x.ty.clone(), th);
    let bx = b.ew("stablehlo.multiply", &[x, &bv]);
    let e = b.ew("stablehlo.exponential", &[&bx]);
    let l = b.ew("stablehlo.log_plus_one", &[&e]);
    let soft = b.ew("stablehlo.divide", &[&l, &bv]);
    let big = b.compare(Cmp::Gt, &bx, &tv);
    b.select(&big, x, &soft)
}

fn leaky_relu(b: &mut FnBuilder, x: &Value, k: &UnaryKind) -> Value {
    let zero = b.splat(x.ty.clone(), 0);
    let slope = b.splat(x.ty.clone(), leaky_slope(k));
    let pos = b.compare(Cmp::Gt, x, &zero);
    let neg = b.ew("stablehlo.multiply", &[x, &slope]);
    b.select(&pos, x, &neg)
}

fn elu(b: &mut FnBuilder, x: &Value, k: &UnaryKind) -> Value {
    let (alpha, scale, input_scale) = elu_params(k);
    let zero = b.splat(x.ty.clone(), 0);
    let is = b.splat(x.ty.clone(), input_scale);
    let neg_coef = b.splat(x.ty.clone(), alpha * scale);
    let pos_coef = b.splat(x.ty.clone(), scale);
    let xi = b.ew("stablehlo.multiply", &[x, &is]);
    let e = b.ew("stablehlo.exponential_minus_one", &[&xi]);
    let neg = b.ew("stablehlo.multiply", &[&e, &neg_coef]);
    let pos = b.ew("stablehlo.multiply", &[x, &pos_coef]);
    let le = b.compare(Cmp::Le, x, &zero);
    b.select(&le, &neg, &pos)
}

fn clamp(b: &mut FnBuilder, x: &Value, k: &UnaryKind) -> Value {
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
}

fn pow(b: &mut FnBuilder, x: &Value, k: &UnaryKind) -> Value {
    let e = pow_exponent(k);
    if x.dtype() == DType::Bool {
        // Only a bool exponent keeps a bool result: x ** true is x, x ** false is true.
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
}

fn isnan(b: &mut FnBuilder, x: &Value, _: &UnaryKind) -> Value {
    if x.dtype().is_float() {
        b.compare(Cmp::Ne, x, x)
    } else {
        b.splat(x.ty.with_dtype(DType::Bool), false)
    }
}

fn isinf(b: &mut FnBuilder, x: &Value, _: &UnaryKind) -> Value {
    if x.dtype().is_float() {
        let a = b.ew("stablehlo.abs", &[x]);
        let inf = b.splat(x.ty.clone(), f64::INFINITY);
        b.compare(Cmp::Eq, &a, &inf)
    } else {
        b.splat(x.ty.with_dtype(DType::Bool), false)
    }
}

fn isfinite(b: &mut FnBuilder, x: &Value, _: &UnaryKind) -> Value {
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
}
