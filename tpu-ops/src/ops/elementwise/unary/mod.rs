//! Elementwise unary ops: the one list of them (`unary_ops!`, from which their enum, kernels,
//! lowerings, backward rules, `Tensor` methods and table rows are all generated), the op
//! struct and its `OpDef`, and the table rows.

use std::sync::Arc;

use tpu_tensor::{DType, Device, Error, Generator, Result, Scalar, Tensor};

use crate::autograd::Saved;
use crate::hlo::{FnBuilder, Value};
use crate::op::promote::{float_result, result_type};
use crate::op::{DTypeSet, Meta, OpDef, OpInfo, input_grad};

mod cpu;
mod grad;
pub(crate) mod lower;

pub use cpu::powi;
pub(crate) use cpu::{f32_slice, fuses_f32};

/// Every unary op, one row each. Adding an op is adding a row (and, at most, the functions it
/// names). The list hands its rows to the macro `$cb` (with `$arg`s first); each file expands
/// the fields it owns, so a name in a field is looked up in that file: `cpu` and `int` in
/// `cpu.rs`, `lower` in `lower.rs`, `grad` in `grad.rs`, `method` in `methods.rs`.
///
/// A row: the variant (its fields with the values the op table uses), then
/// - `name`: the op's name; `out`: its output dtype's `Rule`; `dtypes`: the `DTypeSet` it
///   accepts; `tol`: the table's tolerance; `sample`: `any`, `positive`, `unit` or
///   `above_one` (inputs kept in the function's domain: `log`'s, `asin`'s, `acosh`'s);
/// - `method`: the `TensorOps` method (`=> kind` builds the kind from its arguments; without
///   it, the method is the fieldless variant);
/// - `cpu`: `(simd f32: |v| .., f64: |v| .. [, run: f])`, functions inlined into a loop compiled
///   for the widest instruction set (with `f`, a hand-vectorised f32 kernel of the same bits),
///   or `(scalar f32: .., f64: ..)`, functions of the value and the kind called per element;
///   16-bit floats compute in f32;
/// - `int`: the function on integers (`none` where integers are refused or promoted to float);
/// - `lower`: the StableHLO lowering of the value in compute precision;
/// - `grad`: `(|g, x, y, kind| dx)`, the gradient from the incoming gradient `g`, the input `x`
///   (in `g`'s dtype) and the output `y`, or `none` for no backward rule.
///
/// A row may instead be `Variant => group { .. }` with only the fields its group leaves open
/// (`float_fn`, `rounding`, `predicate`: see `unary_columns!`).
macro_rules! unary_ops {
    ($cb:ident $(, $arg:tt)*) => {
        $cb! { $($arg)*
            Neg => {
                name: "neg", out: Same, dtypes: NUMERIC, tol: 0.0, sample: any,
                method: { /// `-x`.
                          fn neg() },
                cpu: (simd f32: |v| -v, f64: |v| -v),
                int: (|x, _| x.wrapping_neg()),
                lower: (|b, x, _| b.ew("stablehlo.negate", &[x])),
                grad: (|g, _, _, _| g.neg()?),
            }
            Abs => {
                name: "abs", out: Same, dtypes: NUMERIC, tol: 0.0, sample: any,
                method: { /// `|x|`.
                          fn abs() },
                cpu: (simd f32: |v| v.abs(), f64: |v| v.abs()),
                int: (|x, _| x.wrapping_abs()),
                lower: (|b, x, _| if x.dtype() == DType::U8 {
                    x.clone()
                } else {
                    b.ew("stablehlo.abs", &[x])
                }),
                grad: (|g, x, _, _| g.mul(&x.sign()?)?),
            }
            Sign => {
                name: "sign", out: Same, dtypes: NUMERIC, tol: 0.0, sample: any,
                method: { /// -1, 0 or 1 (0 for NaN).
                          fn sign() },
                cpu: (scalar f32: |x, _| sign64(x as f64) as f32, f64: |x, _| sign64(x)),
                int: (|x, _| x.signum()),
                lower: sign,
                grad: (|g, _, _, _| g.zeros_like()?),
            }
            Exp => {
                name: "exp", out: Float, dtypes: ALL, tol: 1e-6, sample: any,
                method: { /// `e^x`.
                          fn exp() },
                cpu: (simd f32: |v| math::exp_f32(v), f64: |v| v.exp()),
                int: none,
                lower: (|b, x, _| b.ew("stablehlo.exponential", &[x])),
                grad: (|g, _, y, _| g.mul(y)?),
            }
            Exp2 => {
                name: "exp2", out: Float, dtypes: ALL, tol: 1e-6, sample: any,
                method: { /// `2^x`.
                          fn exp2() },
                cpu: (scalar f32: |x, _| x.exp2(), f64: |x, _| x.exp2()),
                int: none,
                lower: (|b, x, _| {
                    let two = b.splat(x.ty.clone(), 2.0);
                    b.ew("stablehlo.power", &[&two, x])
                }),
                grad: (|g, _, y, _| g.mul(y)?.mul(std::f64::consts::LN_2)?),
            }
            Log => float_fn {
                name: "log", tol: 1e-6, sample: positive, f: ln, hlo: "stablehlo.log",
                method: { /// Natural logarithm.
                          fn log() },
                grad: (|g, x, _, _| g.div(x)?),
            }
            Log2 => {
                name: "log2", out: Float, dtypes: ALL, tol: 1e-6, sample: positive,
                method: { /// Base-2 logarithm.
                          fn log2() },
                cpu: (scalar f32: |x, _| x.log2(), f64: |x, _| x.log2()),
                int: none,
                lower: (|b, x, _| log_base(b, x, std::f64::consts::LN_2)),
                grad: (|g, x, _, _| g.div(&x.mul(std::f64::consts::LN_2)?)?),
            }
            Log10 => {
                name: "log10", out: Float, dtypes: ALL, tol: 1e-6, sample: positive,
                method: { /// Base-10 logarithm.
                          fn log10() },
                cpu: (scalar f32: |x, _| x.log10(), f64: |x, _| x.log10()),
                int: none,
                lower: (|b, x, _| log_base(b, x, std::f64::consts::LN_10)),
                grad: (|g, x, _, _| g.div(&x.mul(std::f64::consts::LN_10)?)?),
            }
            Log1p => float_fn {
                name: "log1p", tol: 1e-6, sample: positive, f: ln_1p, hlo: "stablehlo.log_plus_one",
                method: { /// `log(1 + x)`.
                          fn log1p() },
                grad: (|g, x, _, _| g.div(&x.add(1.0)?)?),
            }
            Expm1 => float_fn {
                name: "expm1", tol: 1e-6, sample: any, f: exp_m1,
                hlo: "stablehlo.exponential_minus_one",
                method: { /// `e^x - 1`.
                          fn expm1() },
                grad: (|g, _, y, _| g.mul(&y.add(1.0)?)?),
            }
            Sqrt => {
                name: "sqrt", out: Float, dtypes: ALL, tol: 1e-6, sample: positive,
                method: { /// Square root.
                          fn sqrt() },
                cpu: (simd f32: |v| v.sqrt(), f64: |v| v.sqrt()),
                int: none,
                lower: (|b, x, _| b.ew("stablehlo.sqrt", &[x])),
                grad: (|g, _, y, _| g.div(&y.mul(2.0)?)?),
            }
            Rsqrt => {
                name: "rsqrt", out: Float, dtypes: ALL, tol: 1e-6, sample: positive,
                method: { /// `1 / sqrt(x)`.
                          fn rsqrt() },
                cpu: (scalar f32: |x, _| 1.0 / x.sqrt(), f64: |x, _| 1.0 / x.sqrt()),
                int: none,
                lower: (|b, x, _| b.ew("stablehlo.rsqrt", &[x])),
                grad: (|g, x, y, _| g.mul(&y.div(x)?)?.mul(-0.5)?),
            }
            Square => {
                name: "square", out: Same, dtypes: NUMERIC, tol: 0.0, sample: any,
                method: { /// `x * x`.
                          fn square() },
                cpu: (simd f32: |v| v * v, f64: |v| v * v),
                int: (|x, _| x.wrapping_mul(x)),
                lower: (|b, x, _| b.ew("stablehlo.multiply", &[x, x])),
                grad: (|g, x, _, _| g.mul(&x.mul(2.0)?)?),
            }
            Reciprocal => {
                name: "reciprocal", out: Float, dtypes: ALL, tol: 0.0, sample: any,
                method: { /// `1 / x`.
                          fn reciprocal() },
                cpu: (scalar f32: |x, _| 1.0 / x, f64: |x, _| 1.0 / x),
                int: none,
                lower: (|b, x, _| {
                    let one = b.splat(x.ty.clone(), 1.0);
                    b.ew("stablehlo.divide", &[&one, x])
                }),
                grad: (|g, _, y, _| g.mul(&y.square()?)?.neg()?),
            }
            Sin => float_fn {
                name: "sin", tol: 1e-6, sample: any, f: sin, hlo: "stablehlo.sine",
                method: { /// Sine.
                          fn sin() },
                grad: (|g, x, _, _| g.mul(&x.cos()?)?),
            }
            Cos => float_fn {
                name: "cos", tol: 1e-6, sample: any, f: cos, hlo: "stablehlo.cosine",
                method: { /// Cosine.
                          fn cos() },
                grad: (|g, x, _, _| g.mul(&x.sin()?)?.neg()?),
            }
            Tan => float_fn {
                name: "tan", tol: 1e-5, sample: any, f: tan, hlo: "stablehlo.tan",
                method: { /// Tangent.
                          fn tan() },
                grad: (|g, _, y, _| g.mul(&y.square()?.add(1.0)?)?),
            }
            Asin => float_fn {
                name: "asin", tol: 1e-5, sample: unit, f: asin, hlo: "chlo.asin",
                method: { /// Arcsine (NaN outside `[-1, 1]`).
                          fn asin() },
                grad: (|g, x, _, _| g.div(&x.square()?.rsub(1.0)?.sqrt()?)?),
            }
            Acos => float_fn {
                name: "acos", tol: 1e-5, sample: unit, f: acos, hlo: "chlo.acos",
                method: { /// Arccosine (NaN outside `[-1, 1]`).
                          fn acos() },
                grad: (|g, x, _, _| g.div(&x.square()?.rsub(1.0)?.sqrt()?)?.neg()?),
            }
            Atan => float_fn {
                name: "atan", tol: 1e-5, sample: any, f: atan, hlo: "chlo.atan",
                method: { /// Arctangent.
                          fn atan() },
                grad: (|g, x, _, _| g.div(&x.square()?.add(1.0)?)?),
            }
            Sinh => float_fn {
                name: "sinh", tol: 1e-5, sample: any, f: sinh, hlo: "chlo.sinh",
                method: { /// Hyperbolic sine.
                          fn sinh() },
                grad: (|g, x, _, _| g.mul(&x.cosh()?)?),
            }
            Cosh => float_fn {
                name: "cosh", tol: 1e-5, sample: any, f: cosh, hlo: "chlo.cosh",
                method: { /// Hyperbolic cosine.
                          fn cosh() },
                grad: (|g, x, _, _| g.mul(&x.sinh()?)?),
            }
            Asinh => float_fn {
                name: "asinh", tol: 1e-5, sample: any, f: asinh, hlo: "chlo.asinh",
                method: { /// Inverse hyperbolic sine.
                          fn asinh() },
                grad: (|g, x, _, _| g.div(&x.square()?.add(1.0)?.sqrt()?)?),
            }
            Acosh => float_fn {
                name: "acosh", tol: 1e-5, sample: above_one, f: acosh, hlo: "chlo.acosh",
                method: { /// Inverse hyperbolic cosine (NaN below 1).
                          fn acosh() },
                grad: (|g, x, _, _| g.div(&x.square()?.add(-1.0)?.sqrt()?)?),
            }
            Atanh => float_fn {
                name: "atanh", tol: 1e-5, sample: unit, f: atanh, hlo: "chlo.atanh",
                method: { /// Inverse hyperbolic tangent (±inf at ±1, NaN beyond).
                          fn atanh() },
                grad: (|g, x, _, _| g.div(&x.square()?.rsub(1.0)?)?),
            }
            Tanh => {
                name: "tanh", out: Float, dtypes: ALL, tol: 1e-6, sample: any,
                method: { /// Hyperbolic tangent.
                          fn tanh() },
                cpu: (simd f32: |v| math::tanh_f32(v), f64: |v| v.tanh()),
                int: none,
                lower: (|b, x, _| b.ew("stablehlo.tanh", &[x])),
                grad: (|g, _, y, _| g.mul(&y.square()?.rsub(1.0)?)?),
            }
            Sigmoid => {
                name: "sigmoid", out: Float, dtypes: ALL, tol: 1e-6, sample: any,
                method: { /// `1 / (1 + e^-x)`.
                          fn sigmoid() },
                cpu: (simd f32: |v| math::sigmoid_f32(v), f64: |v| sigmoid64(v)),
                int: none,
                lower: (|b, x, _| b.ew("stablehlo.logistic", &[x])),
                grad: (|g, _, y, _| g.mul(&y.mul(&y.rsub(1.0)?)?)?),
            }
            Relu => {
                name: "relu", out: Same, dtypes: NUMERIC, tol: 0.0, sample: any,
                method: { /// `max(x, 0)`.
                          fn relu() },
                cpu: (simd f32: |v| if v < 0.0 { 0.0 } else { v },
                      f64: |v| if v < 0.0 { 0.0 } else { v }),
                int: (|x, _| x.max(0)),
                lower: relu,
                grad: (|g, _, y, _| relu(g, y)?),
            }
            /// GELU with the exact erf form.
            Gelu => {
                name: "gelu", out: Same, dtypes: FLOAT, tol: 1e-6, sample: any,
                method: { /// GELU, exact (erf) form.
                          fn gelu() },
                cpu: (simd f32: |v| math::gelu_f32(v), f64: |v| gelu64(v),
                      run: crate::cpu::simd::gelu_f32),
                int: none,
                lower: gelu,
                grad: (|g, x, _, _| gelu(g, x)?),
            }
            /// GELU with the tanh approximation.
            GeluTanh => {
                name: "gelu_tanh", out: Same, dtypes: FLOAT, tol: 1e-6, sample: any,
                method: { /// GELU, tanh approximation (PyTorch's `approximate='tanh'`).
                          fn gelu_tanh() },
                cpu: (simd f32: |v| math::gelu_tanh_f32(v), f64: |v| gelu_tanh64(v)),
                int: none,
                lower: gelu_tanh,
                grad: (|g, x, _, _| gelu_tanh(g, x)?),
            }
            Silu => {
                name: "silu", out: Same, dtypes: FLOAT, tol: 1e-6, sample: any,
                method: { /// `x * sigmoid(x)`.
                          fn silu() },
                cpu: (simd f32: |v| math::silu_f32(v), f64: |v| v * sigmoid64(v)),
                int: none,
                lower: (|b, x, _| {
                    let s = b.ew("stablehlo.logistic", &[x]);
                    b.ew("stablehlo.multiply", &[x, &s])
                }),
                grad: (|g, x, _, _| {
                    let s = x.sigmoid()?;
                    g.mul(&s.mul(&x.mul(&s.rsub(1.0)?)?.add(1.0)?)?)?
                }),
            }
            /// `log(1 + exp(beta x)) / beta`, linear above `threshold`.
            Softplus { beta: f64 = 1.0, threshold: f64 = 20.0 } => {
                name: "softplus", out: Same, dtypes: FLOAT, tol: 1e-6, sample: any,
                method: { /// `log(1 + exp(beta x)) / beta`, linear where `beta x > threshold`.
                          fn softplus(beta: f64, threshold: f64)
                              => UnaryKind::Softplus { beta, threshold } },
                cpu: (scalar f32: softplus_f32, f64: softplus_f64),
                int: none,
                lower: softplus,
                grad: (|g, x, _, kind| softplus(g, x, kind)?),
            }
            /// `x` where positive, `negative_slope * x` elsewhere.
            LeakyRelu(f64 = 0.01) => {
                name: "leaky_relu", out: Same, dtypes: FLOAT, tol: 1e-6, sample: any,
                method: { /// `x > 0 ? x : negative_slope * x` (PyTorch's default slope: 0.01).
                          fn leaky_relu(negative_slope: f64) => UnaryKind::LeakyRelu(negative_slope) },
                cpu: (scalar f32: leaky_relu_f32, f64: leaky_relu_f64),
                int: none,
                lower: leaky_relu,
                grad: (|g, x, _, kind| leaky_relu(g, x, kind)?),
            }
            /// `scale * x` where positive, `scale * alpha * (e^(input_scale x) - 1)` elsewhere
            /// (ATen's `elu`; `torch.nn.functional.elu` sets only `alpha`).
            Elu { alpha: f64 = 1.0, scale: f64 = 1.0, input_scale: f64 = 1.0 } => {
                name: "elu", out: Same, dtypes: FLOAT, tol: 1e-6, sample: any,
                method: { /// ELU: `x` where positive, `alpha * (e^x - 1)` elsewhere.
                          fn elu(alpha: f64)
                              => UnaryKind::Elu { alpha, scale: 1.0, input_scale: 1.0 } },
                cpu: (scalar f32: elu_f32, f64: elu_f64),
                int: none,
                lower: elu,
                grad: (|g, x, _, kind| elu(g, x, kind)?),
            }
            Erf => {
                name: "erf", out: Float, dtypes: ALL, tol: 1e-6, sample: any,
                method: { /// The error function.
                          fn erf() },
                cpu: (simd f32: |v| math::erf_f32(v), f64: |v| erf64(v)),
                int: none,
                lower: (|b, x, _| erf(b, x)),
                grad: (|g, x, _, _| erf(g, x)?),
            }
            Floor => rounding {
                name: "floor", f: floor, hlo: "stablehlo.floor",
                method: { /// Round down.
                          fn floor() },
            }
            Ceil => rounding {
                name: "ceil", f: ceil, hlo: "stablehlo.ceil",
                method: { /// Round up.
                          fn ceil() },
            }
            /// Round half to even.
            Round => rounding {
                name: "round", f: round_ties_even, hlo: "stablehlo.round_nearest_even",
                method: { /// Round half to even.
                          fn round() },
            }
            Trunc => {
                name: "trunc", out: Same, dtypes: NUMERIC, tol: 0.0, sample: any,
                method: { /// Round toward zero.
                          fn trunc() },
                cpu: (scalar f32: |x, _| x.trunc(), f64: |x, _| x.trunc()),
                int: (|x, _| x),
                lower: (|b, x, _| if x.dtype().is_float() { trunc_float(b, x) } else { x.clone() }),
                grad: (|g, _, _, _| g.zeros_like()?),
            }
            /// Clamp to `[min, max]` (either may be absent).
            Clamp {
                min: Option<Scalar> = Some(Scalar::Float(-0.5)),
                max: Option<Scalar> = Some(Scalar::Float(0.5))
            } => {
                name: "clamp", out: Same, dtypes: NUMERIC, tol: 0.0, sample: any,
                method: { /// Clamps to `[min, max]`; either bound may be `None`.
                          fn clamp(min: Option<f64>, max: Option<f64>) => UnaryKind::Clamp {
                              min: min.map(Scalar::Float),
                              max: max.map(Scalar::Float),
                          } },
                cpu: (scalar f32: |x, kind| clamp_f64(x as f64, kind) as f32, f64: clamp_f64),
                int: clamp_int,
                lower: clamp,
                grad: (|g, x, _, kind| clamp(g, x, kind)?),
            }
            /// `x ** exponent` with a Rust number exponent.
            PowScalar(Scalar = Scalar::Int(2)) => {
                name: "pow", out: Same, dtypes: NUMERIC, tol: 1e-6, sample: any,
                method: { /// `x ** exponent` for a number exponent.
                          fn pow_scalar(exponent: impl Into<Scalar>)
                              => UnaryKind::PowScalar(exponent.into()) },
                cpu: (scalar f32: pow_f32,
                      f64: |x, kind| x.powf(pow_exponent(kind).to_f64())),
                int: (|x, kind| powi(x, pow_exponent(kind).to_i64())),
                lower: pow,
                grad: (|g, x, _, kind| pow(g, x, kind)?),
            }
            /// `~x`: every bit flipped (integers), `not x` (bool).
            BitwiseNot => {
                name: "bitwise_not", out: Same, dtypes: INT_BOOL, tol: 0.0, sample: any,
                method: { /// `~x`: the bits flipped on integers, logical not on bool.
                          fn bitwise_not() },
                // Never called: `dtypes` refuses floats before a kernel runs.
                cpu: (scalar f32: |x, _| x, f64: |x, _| x),
                int: (|x, _| !x),
                lower: (|b, x, _| b.ew("stablehlo.not", &[x])),
                grad: none,
            }
            LogicalNot => {
                name: "logical_not", out: Bool, dtypes: ALL, tol: 0.0, sample: any,
                method: { /// `x == 0`, as bool.
                          fn logical_not() },
                cpu: (scalar f32: |x, _| (x == 0.0) as u8 as f32,
                      f64: |x, _| (x == 0.0) as u8 as f64),
                int: (|x, _| (x == 0) as i64),
                lower: (|b, x, _| {
                    let zero = b.splat(x.ty.clone(), 0);
                    b.compare(Cmp::Eq, x, &zero)
                }),
                grad: none,
            }
            IsNan => predicate {
                name: "isnan", test: is_nan, int: 0, lower: isnan,
                method: { /// NaN test.
                          fn isnan() },
            }
            IsInf => predicate {
                name: "isinf", test: is_infinite, int: 0, lower: isinf,
                method: { /// Infinity test.
                          fn isinf() },
            }
            IsFinite => predicate {
                name: "isfinite", test: is_finite, int: 1, lower: isfinite,
                method: { /// Finite test.
                          fn isfinite() },
            }
        }
    };
}
pub(crate) use unary_ops;

/// Reads the list a row at a time, writing the grouped rows out in full, and hands it on: with
/// `[cb args..]`, to `cb` (after the `args`) as `Variant => { method, cpu, int, lower, grad }`,
/// the columns the kernels, lowerings, backward rules and methods are built from, so that their
/// macros match this short form; with `kinds`, to `unary_kinds!` as `Variant => (name, out,
/// dtypes, tol, sample)`. Called as `unary_ops!(unary_columns, [cb args..])`.
///
/// Grouped rows state only what differs within their group:
/// - `float_fn { name, tol, sample, f, hlo, method, grad }`: float-valued (integers give f32,
///   none has an integer kernel), `x.f()` on the CPU, the one StableHLO op `hlo`;
/// - `rounding { name, f, hlo, method }`: `x.f()` on floats, `hlo` on float values, integers
///   unchanged, a zero gradient;
/// - `predicate { name, test, int, lower, method }`: bool-valued `x.test()`, the constant `int`
///   on integers, no gradient.
macro_rules! unary_columns {
    (@row kinds $cols:tt [$($kinds:tt)*]) => {
        unary_kinds! { $($kinds)* }
    };
    (@row [$cb:ident $($arg:tt)*] [$($cols:tt)*] $kinds:tt) => {
        $cb! { $($arg)* $($cols)* }
    };
    // A grouped row goes back in, written out in full by its group's arm.
    (@row $mode:tt $cols:tt $kinds:tt
        $(#[$vm:meta])* $V:ident => $group:ident $fields:tt $($rest:tt)*
    ) => {
        unary_columns! { @group $group [$mode $cols $kinds [$(#[$vm])* $V] [$($rest)*]] $fields }
    };
    (@row $mode:tt [$($cols:tt)*] [$($kinds:tt)*]
        $(#[$vm:meta])*
        $V:ident $(($($tf:ty = $tv:expr),*))? $({ $($sf:ident : $sft:ty = $sv:expr),* })? => {
            name: $name:literal, out: $out:ident, dtypes: $dt:ident, tol: $tol:literal,
            sample: $sample:ident,
            method: $method:tt, cpu: $cpu:tt, int: $int:tt, lower: $lower:tt, grad: $grad:tt $(,)?
        }
        $($rest:tt)*
    ) => {
        unary_columns! { @row $mode
            [$($cols)* $V => { method: $method, cpu: $cpu, int: $int, lower: $lower, grad: $grad }]
            [$($kinds)* $(#[$vm])* $V $(($($tf = $tv),*))? $({ $($sf: $sft = $sv),* })?
                => ($name, $out, $dt, $tol, $sample)]
            $($rest)*
        }
    };
    (@group float_fn [$mode:tt $cols:tt $kinds:tt [$($head:tt)*] [$($rest:tt)*]] {
        name: $name:literal, tol: $tol:literal, sample: $sample:ident, f: $f:ident,
        hlo: $hlo:literal, method: $method:tt, grad: $grad:tt $(,)?
    }) => {
        unary_columns! { @row $mode $cols $kinds $($head)* => {
            name: $name, out: Float, dtypes: ALL, tol: $tol, sample: $sample, method: $method,
            cpu: (scalar f32: |x, _| x.$f(), f64: |x, _| x.$f()),
            int: none,
            lower: (|b, x, _| b.ew($hlo, &[x])),
            grad: $grad,
        } $($rest)* }
    };
    (@group rounding [$mode:tt $cols:tt $kinds:tt [$($head:tt)*] [$($rest:tt)*]] {
        name: $name:literal, f: $f:ident, hlo: $hlo:literal, method: $method:tt $(,)?
    }) => {
        unary_columns! { @row $mode $cols $kinds $($head)* => {
            name: $name, out: Same, dtypes: NUMERIC, tol: 0.0, sample: any, method: $method,
            cpu: (scalar f32: |x, _| x.$f(), f64: |x, _| x.$f()),
            int: (|x, _| x),
            lower: (|b, x, _| if x.dtype().is_float() { b.ew($hlo, &[x]) } else { x.clone() }),
            grad: (|g, _, _, _| g.zeros_like()?),
        } $($rest)* }
    };
    (@group predicate [$mode:tt $cols:tt $kinds:tt [$($head:tt)*] [$($rest:tt)*]] {
        name: $name:literal, test: $test:ident, int: $int:literal, lower: $lower:ident,
        method: $method:tt $(,)?
    }) => {
        unary_columns! { @row $mode $cols $kinds $($head)* => {
            name: $name, out: Bool, dtypes: ALL, tol: 0.0, sample: any, method: $method,
            cpu: (scalar f32: |x, _| x.$test() as u8 as f32, f64: |x, _| x.$test() as u8 as f64),
            int: (|_, _| $int),
            lower: $lower,
            grad: none,
        } $($rest)* }
    };
    ($mode:tt $($rows:tt)*) => {
        unary_columns! { @row $mode [] [] $($rows)* }
    };
}
pub(crate) use unary_columns;

/// `sqrt(2 / pi)`, the tanh GELU's scale.
const GELU_K: f64 = 0.797_884_560_802_865_4;

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

/// Where a table sample's input values lie.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Domain {
    /// Standard normal times 3.
    Any,
    /// Positive, for the logarithms and square roots.
    Positive,
    /// Inside `(-1, 1)`, for the arcsine, arccosine and inverse hyperbolic tangent.
    Unit,
    /// Above 1, for the inverse hyperbolic cosine.
    AboveOne,
}

/// From the list (through `unary_columns!`): the enum and the columns of the op table that
/// are not kernels.
macro_rules! unary_kinds {
    (@domain any) => {
        Domain::Any
    };
    (@domain positive) => {
        Domain::Positive
    };
    (@domain unit) => {
        Domain::Unit
    };
    (@domain above_one) => {
        Domain::AboveOne
    };
    ($(
        $(#[$vm:meta])*
        $V:ident $(($($tf:ty = $tv:expr),*))? $({ $($sf:ident : $sft:ty = $sv:expr),* })?
            => ($name:literal, $out:ident, $dt:ident, $tol:literal, $sample:ident)
    )*) => {
        /// The unary ops.
        #[derive(Clone, Copy, Debug, PartialEq)]
        #[allow(missing_docs)]
        pub enum UnaryKind {
            $( $(#[$vm])* $V $(($($tf),*))? $({ $($sf: $sft),* })?, )*
        }

        impl UnaryKind {
            fn name(&self) -> &'static str {
                match self {
                    $( UnaryKind::$V { .. } => $name, )*
                }
            }

            fn rule(&self) -> Rule {
                match self {
                    $( UnaryKind::$V { .. } => Rule::$out, )*
                }
            }

            fn dtypes(&self) -> DTypeSet {
                match self {
                    $( UnaryKind::$V { .. } => DTypeSet::$dt, )*
                }
            }

            fn tolerance(&self) -> f64 {
                match self {
                    $( UnaryKind::$V { .. } => $tol, )*
                }
            }

            fn domain(&self) -> Domain {
                match self {
                    $( UnaryKind::$V { .. } => unary_kinds!(@domain $sample), )*
                }
            }

            /// Every kind, with default parameters, for the op table.
            pub fn all() -> Vec<UnaryKind> {
                vec![ $( UnaryKind::$V $(($($tv),*))? $({ $($sf: $sv),* })?, )* ]
            }
        }
    };
}
unary_ops!(unary_columns, kinds);

/// An elementwise unary op.
#[derive(Clone, Debug)]
pub struct Unary(pub UnaryKind);

impl Unary {
    fn out_dtype(&self, input: DType) -> DType {
        match (&self.0, self.0.rule()) {
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

impl OpDef for Unary {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn attrs(&self) -> String {
        format!("{:?}", self.0)
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let dtypes = self.0.dtypes();
        let x = &inputs[0];
        let out = self.out_dtype(x.dtype);
        // clamp and pow with a number promote first (a bool tensor clamped to 0.5 is f32), so
        // the dtype they compute in is the one to check. pow of bool by bool is PyTorch's
        // copy (exponent true) or ones (false).
        let (checked, ok) = match self.0 {
            UnaryKind::Clamp { .. } => (out, dtypes.contains(out)),
            UnaryKind::PowScalar(_) => (out, dtypes.contains(out) || out == DType::Bool),
            _ => (x.dtype, dtypes.contains(x.dtype)),
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
                    dtypes
                )
            } else {
                dtypes.to_string()
            };
            return Err(Error::UnsupportedDType {
                op: self.0.name().into(),
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
        Ok(vec![cpu::unary_cpu(self.0, inputs[0], &outputs[0])?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        Ok(vec![lower::lower_unary(
            b,
            &self.0,
            &inputs[0],
            &outputs[0],
        )])
    }

    fn has_backward(&self) -> bool {
        self.0.has_backward()
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        input_grad(saved, grads, |g, x| {
            grad::unary_backward(&self.0, x, &|| saved.output(0).cloned(), g)
        })
    }
}

/// Applies a unary op.
pub fn unary(x: &Tensor, kind: UnaryKind) -> Result<Tensor> {
    if let Some(r) = cpu::small_dense_f32(x, kind) {
        return r;
    }
    crate::exec::dispatch::run1(&Unary(kind), &[x])
}

fn sample(kind: UnaryKind, dtype: DType, device: &Device) -> Result<Vec<Tensor>> {
    let base = Generator::new(11).randn([3, 5], DType::F64, &Device::cpu())?;
    let scaled = match kind.domain() {
        // Keep inputs in each function's domain.
        Domain::Positive => crate::op::samples::host_map(&base, |v| v.abs() * 3.0 + 0.1)?,
        Domain::Any => crate::op::samples::host_map(&base, |v| v * 3.0)?,
        Domain::Unit => crate::op::samples::host_map(&base, |v| v.tanh() * 0.95)?,
        Domain::AboveOne => crate::op::samples::host_map(&base, |v| v.abs() * 3.0 + 1.05)?,
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
            // clamp and pow with a number accept bool tensors, promoted by the number (the
            // rows' numbers are not bool).
            let dtypes = match k {
                UnaryKind::Clamp { .. } | UnaryKind::PowScalar(_) => {
                    k.dtypes().union(DTypeSet::BOOL)
                }
                _ => k.dtypes(),
            };
            OpInfo {
                name: k.name(),
                cpu: dtypes,
                hlo: dtypes,
                sample: Arc::new(move |d, dev| sample(k, d, dev)),
                tolerance: k.tolerance(),
            }
        })
        .collect()
}
