//! Branch-free f32 elementary functions that the compiler can vectorise.
//!
//! `f32::exp` and friends call the system's libm one element at a time, which keeps every loop
//! scalar. These versions use only arithmetic, comparisons, conversions and selects, so a loop
//! over a slice becomes SIMD code (4 lanes on baseline x86-64, 8 or 16 where the kernels of
//! `crate::cpu::kernels` compile the loop for AVX2 or AVX-512). Accuracy against the exact
//! function (computed in f64 and rounded to f32; measured by the tests below over every 97th
//! f32 bit pattern in the range shown plus dense sweeps, ~10^7 inputs per function), in ulp of
//! the f32 result:
//!
//! | function | max error | range tested |
//! |---|---|---|
//! | `exp_f32` | 1 ulp | results in the normal range |
//! | `tanh_f32` | 1 ulp | all finite `x` |
//! | `sigmoid_f32` | 2 ulp | all finite `x` (subnormal results too) |
//! | `silu_f32` | 2 ulp | all finite `x` (subnormal results too) |
//! | `erf_f32` | 1 ulp | all finite `x` |
//! | `gelu_f32` (erf form) | 2 ulp (1 but for about one input in 10^7) | all finite `x` |
//! | `gelu_tanh_f32` | 2 ulp | all finite `x` |
//!
//! (`tanh` through `gelu_tanh` are also within 2 ulp of libm's `tanhf`, `erff` and of the f32
//! formulas that use them wherever those are themselves accurate; the f32 formulas lose all
//! relative accuracy where `1 + erf` or `1 + tanh` cancels, e.g. `gelu(-5)`, and these don't.)
//!
//! How: `sigmoid_f32`, `silu_f32` and `tanh_f32` are all f32: one exponential (for sigmoid
//! and silu its argument is chosen first; tanh uses `e^(-2|x|)`, so nothing overflows), one
//! addition, one division; the errors add up to at most 2 ulp. `e^x` is scaled by `2^64` in
//! sigmoid's and silu's far tail so that subnormal results round correctly. The two GELUs
//! are f32 too, with fused multiply-adds, and the steps that f32 would round visibly are
//! carried as two f32 words, each product made exact by one fused multiply-add: the
//! exponential's argument (`-x²/2` or `2k(x + 0.044715x³)`, which near -100 would lose
//! `|argument|` ulps) and the last steps before the one final rounding. The erf form needs no
//! division: `Phi(-|x|) = e^(-x²/2) G(|x|)` with `G` a polynomial on 16 pieces, its
//! coefficients read from tables by piece (see `gelu_steps`). Compiled scalar code turns
//! those lookups into gathers, so the kernels run it through hand-vectorised AVX-512 and
//! AVX2 versions in `crate::cpu::simd` (one permute per table), which give the same bits.
//! `erf_f32` does its exponential's steps in f64 (an f64 step costs two f32 lanes, so it runs
//! at about a quarter of `exp_f32`'s throughput). [`exp_wide`] returns an f64, so
//! intermediate values far outside f32's range cause no overflow, and results that are
//! subnormal in f32 come out correctly rounded rather than flushed.
//!
//! Special values follow libm: NaN propagates; `tanh(±inf) = ±1`, `sigmoid(-inf) = 0`,
//! `erf(±inf) = ±1`, `gelu(inf) = inf`; at `-inf`, `silu`, `gelu` and `gelu_tanh` give NaN
//! (`-inf * 0`), as the f32 formulas `x * sigmoid(x)` and `0.5x(1 + erf(..))` they replace do.
//! `exp_f32`'s results below the normal range flush to zero, as PyTorch's vectorised CPU
//! kernels do.
//!
//! Only the GELUs use `mul_add`. It rounds once on every path, so every level gives the same
//! bits, but without FMA in the build it is a library call, which stops vectorisation: the
//! kernels compile their loops for AVX2/AVX-512 (with FMA), and on x86-64 processors without
//! FMA the GELUs run scalar. The other functions use plain multiply-adds, which round
//! identically with or without FMA, so they vectorise on baseline x86-64 too.

const LOG2E: f32 = std::f32::consts::LOG2_E;
// ln 2 split so that n * LN2_HI is exact for |n| < 2^9.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// `p * r + c` in two roundings: plain steps, which round alike with or without FMA.
#[inline(always)]
fn madd(p: f32, r: f32, c: f32) -> f32 {
    p * r + c
}

/// Minimax polynomial for `(e^r - 1 - r) / r^2` on `|r| <= ln2 / 2`, with Horner steps `step`
/// ([`madd`], or `f32::mul_add` where the function may fuse).
#[inline(always)]
fn exp_poly_by(r: f32, step: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let mut p = 1.987_569_1e-4f32;
    p = step(p, r, 1.398_2e-3);
    p = step(p, r, 8.333_452e-3);
    p = step(p, r, 4.166_579_6e-2);
    p = step(p, r, 1.666_666_5e-1);
    step(p, r, 0.5)
}

#[inline(always)]
fn exp_poly(r: f32) -> f32 {
    exp_poly_by(r, madd)
}

/// `2^(n + bias)` for the `n` held in the low mantissa bits of `kf = n + 1.5 * 2^23`, clamped
/// to the normal range. `n as i32` would be a saturating conversion, which compiles to scalar
/// code per lane.
#[inline(always)]
fn pow2_from_shifted(kf: f32, bias: i32) -> f32 {
    let biased = (kf.to_bits() as i32).wrapping_sub(0x4B40_0000 - 127 - bias);
    f32::from_bits((biased.clamp(1, 254) as u32) << 23)
}

/// `e^x`, within 1 ulp of libm for results in the normal range.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    // Range reduction: x = n ln2 + r, |r| <= ln2 / 2.
    let xc = x.clamp(-87.5, 88.72);
    // Round to nearest even by adding and subtracting 1.5 * 2^23: `round_ties_even` is a
    // library call on baseline x86-64 (no SSE4.1), and a call stops vectorisation.
    const SHIFT: f32 = 12_582_912.0;
    let kf = xc * LOG2E + SHIFT;
    let n = kf - SHIFT;
    // Plain multiply-adds: `mul_add` is a library call (not an instruction) unless the build
    // targets FMA, which would stop vectorisation. n * LN2_HI is exact, so the first step is.
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let y = (exp_poly(r) * (r * r) + r) + 1.0;
    // Scale by 2^n through the exponent bits (n is in [-126, 128] after the clamp).
    let scale = pow2_from_shifted(kf, 0);
    let mut out = y * scale;
    // n = 128 only happens just below overflow: finish with one more doubling.
    out = if n > 127.0 {
        y * f32::from_bits(254 << 23) * 2.0
    } else {
        out
    };
    out = if x > 88.72 { f32::INFINITY } else { out };
    out = if x < -87.5 { 0.0 } else { out };
    if x.is_nan() { x } else { out }
}

/// `e^w` for an f64 argument, as an f64 with f32-level accuracy (relative error below 2^-25
/// plus the polynomial's 2^-26 or so): the building block of the functions below, which round
/// their f64 result to f32 once. `inf` above 709, `0` below -708.
#[inline(always)]
pub fn exp_wide(w: f64) -> f64 {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    const LN2: f64 = std::f64::consts::LN_2;
    // 1.5 * 2^52: adding it rounds to an integer held in the low mantissa bits.
    const SHIFT: f64 = 6_755_399_441_055_744.0;
    let wc = w.clamp(-708.0, 709.0);
    let kd = wc * LOG2E + SHIFT;
    let n = kd - SHIFT;
    // |n| <= 1023, so n * LN2 is within 2^-43 of exact: r is exact to f32 precision.
    let r = (wc - n * LN2) as f32;
    let y = 1.0 + ((exp_poly(r) * (r * r) + r) as f64);
    // 2^n from the integer in kd's low bits (n + 1023 is in [2, 2046]).
    let scale = f64::from_bits(kd.to_bits().wrapping_add(1023) << 52);
    let mut out = y * scale;
    out = if w > 709.0 { f64::INFINITY } else { out };
    out = if w < -708.0 { 0.0 } else { out };
    out
}

/// `erfc(z)` for `z >= 0` (or NaN), as an f64 with f32-level relative accuracy over the whole
/// range where it is a normal f32 after the gelu's factor, `z <= 9.5`, and beyond.
///
/// `erfc(z) = e^(-z^2) t P(t - T0)` with `t = 1 / (1 + z/2)`; `P` is a degree-10 minimax fit of
/// `erfc(z) e^(z^2) / t` for relative error on `z` in `[0, 9.5]` (f32 coefficients, centred at
/// the middle of t's range so the terms shrink and the f32 Horner steps lose little).
#[inline(always)]
fn erfc_wide(z: f64, neg_z2: f64) -> f64 {
    const T0: f64 = 0.586_956_501_007_080_1;
    let t = 1.0 / (1.0 + 0.5 * z);
    let s = (t - T0) as f32;
    let mut q = 0.030_724_857_f32;
    for c in [
        0.021_153_321,
        -0.070_590_93,
        -0.000_804_152_9,
        0.113_639_586,
        -0.046_760_64,
        -0.205_023_51,
        0.079_460_12,
        0.588_570_54,
    ] {
        q = madd(q, s, c);
    }
    // The last two steps carry the most weight: f64.
    let s = s as f64;
    let q = (q as f64 * s + 0.787_195_861_339_569_1) * s + 0.574_856_400_489_807_1;
    exp_wide(neg_z2) * t * q
}

/// `tanh(x)`, within 1 ulp (measured). All f32.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    // |x| < 0.625: x + x^3 P(x^2), P a minimax fit (relative error) of (tanh x - x) / x^3.
    let y = x * x;
    let mut p = -0.005_716_203_f32;
    p = p * y + 0.020_649_709;
    p = p * y - 0.053_743_172;
    p = p * y + 0.133_314_86;
    p = p * y - 0.333_332_84;
    let small = x + (x * y) * p;
    // Otherwise 1 - 2E / (1 + E) with E = e^(-2|x|) <= e^-1.25, with the sign of x: the
    // quotient is below 0.45, so its error of about 2 of its own ulps is at most 1 ulp of the
    // result, which lies in (0.55, 1]; the test measures 1 ulp. E underflows to 0 where tanh
    // rounds to 1.
    // `exp_scaled` skips `exp_f32`'s overflow and NaN selects: 13% faster here (measured).
    let (m, s) = exp_scaled(-2.0 * x.abs());
    let e = m * s;
    let big = 1.0 - (2.0 * e) / (1.0 + e);
    // tanh is odd: the sign of x (also for -0.0, where `small` would give +0.0).
    let r = (if x.abs() < 0.625 { small } else { big }).copysign(x);
    if x.is_nan() { x } else { r }
}

/// `e^x 2^64` and the factor `2^-64` that brings it back, for `x <= 20` (0 below -110, where
/// `e^x` and `x e^x` round to zero): `exp_f32`'s steps with the scale split in two, so that
/// results far below -87, where `exp_f32` flushes to zero, round once, to a subnormal if need
/// be. The scaled value stays normal: 2^(n + 64) with n in [-159, 29].
#[inline(always)]
fn exp_scaled(x: f32) -> (f32, f32) {
    const SHIFT: f32 = 12_582_912.0;
    let xc = x.max(-110.0);
    let kf = xc * LOG2E + SHIFT;
    let n = kf - SHIFT;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let y = (exp_poly(r) * (r * r) + r) + 1.0;
    // 2^(n + 64), n in [-159, -28]: a normal number.
    let scale = pow2_from_shifted(kf, 64);
    let m = if x < -110.0 { 0.0 } else { y * scale };
    (m, f32::from_bits(63 << 23))
}

/// Below this, `1 + e^x` rounds to 1 to well under an ulp, and `e^x` is the sigmoid.
const SIGMOID_TAIL: f32 = -20.0;

/// The one exponential that [`sigmoid_f32`] and [`silu_f32`] need, as `(m, s)` with the
/// value `m * s`: `e^x` in the tail (below [`SIGMOID_TAIL`]), else `e^-x`. Choosing the
/// argument first, instead of computing both and selecting, halves the work; the scaled form
/// keeps tail results exact down into the subnormal range.
#[inline(always)]
fn sigmoid_exp(x: f32) -> (f32, f32) {
    exp_scaled(if x < SIGMOID_TAIL { x } else { -x })
}

/// `1 / (1 + e^-x)`, within 2 ulp (subnormal results included). All f32, branch-free, one
/// exponential.
#[inline(always)]
pub fn sigmoid_f32(x: f32) -> f32 {
    let (m, s) = sigmoid_exp(x);
    let r = if x < SIGMOID_TAIL {
        m * s
    } else {
        1.0 / (1.0 + m * s)
    };
    // `exp_scaled` clamps its argument with `max`, which drops a NaN.
    if x.is_nan() { x } else { r }
}

/// `x / (1 + e^-x)` (SiLU, swish), within 2 ulp. All f32, one exponential, as [`sigmoid_f32`].
#[inline(always)]
pub fn silu_f32(x: f32) -> f32 {
    let (m, s) = sigmoid_exp(x);
    // Below the tail x e^x is still a normal number down to x = -103, where e^x is not.
    let r = if x < SIGMOID_TAIL {
        (x * m) * s
    } else {
        x / (1.0 + m * s)
    };
    if x.is_nan() { x } else { r }
}

/// `erf(x)`, within 1 ulp.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    // |x| < 0.5: x + x P(x^2), P a minimax fit of erf(x) / x - 1.
    let y = x * x;
    let mut p = 0.004_718_215_7_f32;
    p = p * y - 0.026_757_954;
    p = p * y + 0.112_828_486;
    p = p * y - 0.376_126_1;
    p = p * y + 0.128_379_17;
    let small = x + x * p;
    // Otherwise 1 - erfc(|x|), with the sign of x.
    let a = x.abs() as f64;
    let big = (1.0 - erfc_wide(a, -(a * a))) as f32;
    (if x.abs() < 0.5 { small } else { big }).copysign(x)
}

// The two GELUs are written with fused multiply-adds. `mul_add` rounds once, exactly as
// specified, on every path (an instruction under FMA, a libm call without it), so every level
// still gives the same bits; the libm call is slow, which matters only on x86-64 processors
// without FMA (before 2013). With FMA, the error-free products `a*b = p + fma(a, b, -p)` cost
// one instruction each, and they are what make these functions accurate without f64 steps.

/// `(p, e)` with `p + e = a * b` exactly.
#[inline(always)]
fn two_prod(a: f32, b: f32) -> (f32, f32) {
    let p = a * b;
    (p, a.mul_add(b, -p))
}

/// `e^(hi + lo) 2^64` as the unevaluated sum `mh + ml` (within about 2^-24 ulp of `mh`,
/// plus the polynomial's error), and the factor `2^-64`, for `hi <= 20`, `|lo| <= ulp(hi)`;
/// 0 below -110. [`exp_scaled`] with fused steps and its last addition kept exact, so
/// arguments near -100 keep their accuracy and the result carries no rounding of its own.
#[inline(always)]
fn exp_fma(hi: f32, lo: f32) -> (f32, f32, f32) {
    const SHIFT: f32 = 12_582_912.0;
    let xc = hi.max(-110.0);
    let kf = xc.mul_add(LOG2E, SHIFT);
    let n = kf - SHIFT;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, xc)) + lo;
    let u = exp_poly_by(r, f32::mul_add).mul_add(r * r, r);
    // |u| < 1: the rounding error of 1 + u is exact.
    let yh = 1.0 + u;
    let yl = (1.0 - yh) + u;
    let scale = pow2_from_shifted(kf, 64);
    let zero = hi < -110.0;
    let mh = if zero { 0.0 } else { yh * scale };
    let ml = if zero { 0.0 } else { yl * scale };
    (mh, ml, f32::from_bits(63 << 23))
}

/// Centres of the 16 pieces of [`gelu_f32`]'s fit, by piece: `k / 2` below 4, then `k - 4`.
/// Pieces are 1/2 wide below 3.75 and 1 wide above, the last running to 15.
pub(crate) const GELU_CENTRE: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0,
];
/// Constant terms of the pieces' polynomials as two words (value, then remainder): each
/// polynomial fits `G(a) = e^(a^2/2) erfc(a / sqrt 2) / 2` in `a - centre` to 0.09 ulp of
/// relative error (minimax, degree 6, fitted with mpmath in 30 digits; beyond 13.2 the fit
/// only keeps the absolute accuracy of the subnormal results there).
pub(crate) const GELU_G0: [f32; 16] = [
    0.5,
    0.34961882,
    0.2615783,
    0.20578067,
    0.168102,
    0.14133133,
    0.12151395,
    0.106345154,
    0.09441064,
    0.0769193,
    0.06477931,
    0.05589348,
    0.049122546,
    0.04379879,
    0.039506692,
    0.03597489,
];
pub(crate) const GELU_G0_LO: [f32; 16] = [
    -1.3894166e-09,
    1.2544669e-08,
    2.759249e-10,
    -3.0948863e-09,
    4.970648e-09,
    1.4196255e-09,
    5.3855953e-10,
    -7.056327e-10,
    -1.7647902e-09,
    2.604124e-09,
    2.8956832e-09,
    1.6636184e-09,
    3.497929e-10,
    -5.009137e-10,
    1.6645947e-09,
    -4.9682786e-10,
];
/// The pieces' coefficients of `(a - centre)^1 ..= (a - centre)^6`, rounded to f32 one degree
/// at a time from the highest, the lower ones refitted after each rounding.
pub(crate) const GELU_GC: [[f32; 16]; 6] = [
    [
        -0.39894226,
        -0.2241329,
        -0.137364,
        -0.09027128,
        -0.06273828,
        -0.045613952,
        -0.034400437,
        -0.026734242,
        -0.021299714,
        -0.014345756,
        -0.010266394,
        -0.0076879035,
        -0.005961911,
        -0.004753181,
        -0.0038753394,
        -0.0032184946,
    ],
    [
        0.24999943,
        0.11877619,
        0.06210715,
        0.035186872,
        0.021312723,
        0.013648226,
        0.009156321,
        0.006387652,
        0.0046058875,
        0.0025952638,
        0.0015904738,
        0.0010390796,
        0.0007136303,
        0.0005100819,
        0.0003766501,
        0.0002857272,
    ],
    [
        -0.13296722,
        -0.05491129,
        -0.025084522,
        -0.012496628,
        -0.0067041465,
        -0.0038310778,
        -0.002310469,
        -0.0014591437,
        -0.00095873204,
        -0.00045645988,
        -0.000241178,
        -0.00013811329,
        -8.428863e-05,
        -5.4147476e-05,
        -3.627926e-05,
        -2.5176272e-05,
    ],
    [
        0.06234498,
        0.022829568,
        0.009255294,
        0.004110306,
        0.0019760246,
        0.0010175935,
        0.00055620924,
        0.0003201524,
        0.000192855,
        7.821459e-05,
        3.5841902e-05,
        1.8067805e-05,
        9.828614e-06,
        5.687838e-06,
        3.4639647e-06,
        2.1949338e-06,
    ],
    [
        -0.025672134,
        -0.008814381,
        -0.0032003834,
        -0.0012776768,
        -0.00055456336,
        -0.000259044,
        -0.00012905269,
        -6.802924e-05,
        -3.7466005e-05,
        -1.3230562e-05,
        -5.272333e-06,
        -2.344215e-06,
        -1.1383886e-06,
        -5.9414333e-07,
        -3.2919394e-07,
        -1.8006274e-07,
    ],
    [
        0.007595974,
        0.0031050765,
        0.0010224278,
        0.00037092256,
        0.00014671018,
        6.2657135e-05,
        2.8643577e-05,
        1.39077165e-05,
        6.0969796e-06,
        2.1597305e-06,
        7.543212e-07,
        2.9750515e-07,
        1.2951236e-07,
        6.115419e-08,
        3.0900928e-08,
        1.0289735e-08,
    ],
];

/// The erf GELU's steps, written once over the operations of one lane type, so that the
/// scalar [`gelu_f32`] and the hand-vectorised kernels in `crate::cpu::simd` (AVX-512 and AVX2:
/// a 16-entry table lookup is one permute there, where compiled scalar code would gather)
/// perform the same IEEE operations in the same order and give the same bits.
///
/// The operations, as closures: `add`, `sub`, `mul`, `fma` (`a * b + c`, rounded once),
/// `neg`, `min` (the second argument when the first is NaN), `abs`, `splat` (a constant),
/// `index` (the piece from `y + 1.5 * 2^23`: its low 5 bits, at most 15), `lookup` (a table
/// entry per lane), `scale` (`2^(n + 64)` from `kf`'s bits, `n = kf - 1.5 * 2^23`), `select`
/// (`x < 0 ? neg : pos`) and `nan_at_neg_inf` (NaN where `x` is -inf, else the result).
macro_rules! gelu_steps {
    ($x:expr, $add:expr, $sub:expr, $mul:expr, $fma:expr, $neg:expr, $min:expr, $abs:expr,
     $splat:expr, $index:expr, $lookup:expr, $scale:expr, $select:expr, $nan_at_neg_inf:expr) => {{
        use $crate::cpu::math::{GELU_CENTRE, GELU_G0, GELU_G0_LO, GELU_GC};
        let (add, sub, mul, fma, neg, min, abs) = ($add, $sub, $mul, $fma, $neg, $min, $abs);
        let (splat, index, lookup, scale) = ($splat, $index, $lookup, $scale);
        const SHIFT: f32 = 12_582_912.0;
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        // ln 2 split so that n * LN2_HI is exact for |n| < 2^9.
        const LN2_HI: f32 = 0.693_359_4;
        const LN2_LO: f32 = -2.121_944_4e-4;
        const TINY: f32 = 1.0 / 18_446_744_073_709_551_616.0; // 2^-64
        let x = $x;
        // Beyond 15 the result is 0 or x; capping keeps every step finite.
        let a = min(abs(x), splat(15.0));
        // The piece: round(2a) below 4, round(a + 4) above, at most 15. `a - centre` is exact.
        let k = index(add(min(add(a, a), add(a, splat(4.0))), splat(SHIFT)));
        let v = sub(a, lookup(k, &GELU_CENTRE));
        // G(a) = ph + pl: Estrin's scheme for the high degrees, the last step kept as two
        // words (g0 - ph is exact: ph is within a factor of 2 of g0).
        let v2 = mul(v, v);
        let qa = fma(lookup(k, &GELU_GC[1]), v, lookup(k, &GELU_GC[0]));
        let qb = fma(lookup(k, &GELU_GC[3]), v, lookup(k, &GELU_GC[2]));
        let qc = fma(lookup(k, &GELU_GC[5]), v, lookup(k, &GELU_GC[4]));
        let q = fma(fma(qc, v2, qb), v2, qa);
        let g0 = lookup(k, &GELU_G0);
        let ph = fma(v, q, g0);
        let pl = add(fma(v, q, sub(g0, ph)), lookup(k, &GELU_G0_LO));
        // e^(-a^2/2) = 2^n (1 + u), with a^2/2 = w + we exactly (h = a/2 is exact), so that
        // near -13 the argument loses none of its ~90 ulps' worth of bits.
        let h = mul(splat(0.5), a);
        let w = mul(a, h);
        let we = fma(a, h, neg(w));
        let kf = fma(neg(a), mul(h, splat(LOG2E)), splat(SHIFT));
        let n = sub(kf, splat(SHIFT));
        let r = add(
            fma(neg(n), splat(LN2_HI), neg(w)),
            fma(neg(n), splat(LN2_LO), neg(we)),
        );
        let r2 = mul(r, r);
        let e01 = fma(splat(1.666_666_5e-1), r, splat(0.5));
        let e23 = fma(splat(8.333_452e-3), r, splat(4.166_579_6e-2));
        let e45 = fma(splat(1.987_569_1e-4), r, splat(1.398_2e-3));
        let u = fma(fma(e45, mul(r2, r2), fma(e23, r2, e01)), r2, r);
        // Phi(-a) 2^(-n) = (ph + pl)(1 + u) = ph + tail, never rounded as a whole: the result
        // is rounded once, and a subnormal one once more, exactly, by the power of two.
        let tail = fma(ph, u, fma(pl, u, pl));
        let an = mul(a, scale(kf));
        // x < 0: x Phi(x) = -a Phi(-a); else x - a Phi(-a).
        let neg_side = mul(fma(an, ph, mul(an, tail)), splat(-TINY));
        let pos_side = fma(neg(mul(an, splat(TINY))), add(ph, tail), x);
        ($nan_at_neg_inf)(x, ($select)(x, neg_side, pos_side))
    }};
}
pub(crate) use gelu_steps;

/// GELU, erf form: `x Phi(x) = x/2 (1 + erf(x / sqrt 2))`, within 2 ulp (measured: 1 ulp but
/// for one input in about 10^7). All f32 with fused multiply-adds; see `gelu_steps`.
#[inline(always)]
pub fn gelu_f32(x: f32) -> f32 {
    gelu_steps!(
        x,
        |a: f32, b: f32| a + b,
        |a: f32, b: f32| a - b,
        |a: f32, b: f32| a * b,
        |a: f32, b: f32, c: f32| a.mul_add(b, c),
        |a: f32| -a,
        |a: f32, b: f32| a.min(b),
        |a: f32| a.abs(),
        |c: f32| c,
        |y: f32| ((y.to_bits() & 31) as usize).min(15),
        |k: usize, t: &[f32; 16]| t[k],
        |kf: f32| f32::from_bits(
            ((kf.to_bits() as i32).wrapping_sub(0x4B40_0000 - 127 - 64) as u32) << 23
        ),
        |x: f32, n: f32, p: f32| if x < 0.0 { n } else { p },
        |x: f32, r: f32| if x == f32::NEG_INFINITY { f32::NAN } else { r }
    )
}

/// Below this, `gelu_tanh`'s `x / (1 + e^-v)` is `x e^v` to well under an ulp.
const GELU_TANH_TAIL: f32 = -20.0;

/// GELU, tanh form: `x/2 (1 + tanh(k (x + 0.044715 x^3)))` with `k = sqrt(2 / pi)`, within
/// 2 ulp. All f32 with fused steps.
#[inline(always)]
pub fn gelu_tanh_f32(x: f32) -> f32 {
    // 1 + tanh(u) = 2 / (1 + e^(-2u)), so the result is x / (1 + e^(-v)), v = 2u, with no
    // cancellation for negative x; in the tail it is x e^v, as `silu_f32` does it. v = Ax +
    // Bx^3 is computed as two words, each product exact: near v = -100 a rounded v would cost
    // up to 100 ulps.
    const A: f32 = 1.595_769;
    const A_LO: f32 = (1.595_769_121_605_730_8 - A as f64) as f32;
    const B: f32 = 0.071_354_816;
    const B_LO: f32 = (0.071_354_816_272_600_25 - B as f64) as f32;
    let (c, ce) = two_prod(x, x);
    // x^3 = d + dl.
    let (d, de) = two_prod(c, x);
    let dl = ce.mul_add(x, de);
    let (bh, be) = two_prod(B, d);
    let bl = be + B.mul_add(dl, B_LO * d);
    let (ah, ae) = two_prod(A, x);
    let al = A_LO.mul_add(x, ae);
    // Ax and Bx^3 have the same sign: their sum's error is exact (two-sum).
    let vh = ah + bh;
    let bv = vh - ah;
    let vl = ((ah - (vh - bv)) + (bh - bv)) + (al + bl);
    let tail = vh < GELU_TANH_TAIL;
    // The argument is v in the tail, else -v: the sign is flipped through the bits because
    // the compiler turns a select between v and -v into two exponentials, one per side.
    // Infinite words (|x| > 1.6e12) give an argument of -inf and m = 0.
    let flip = ((!tail) as u32) << 31;
    let eh = f32::from_bits(vh.to_bits() ^ flip);
    let el = f32::from_bits(vl.to_bits() ^ flip);
    let (m, _, s) = exp_fma(eh, el);
    let r = if tail {
        (x * m) * s
    } else {
        x / m.mul_add(s, 1.0)
    };
    if x.is_nan() { x } else { r }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two f32 values.
    fn ulps(a: f32, b: f32) -> u32 {
        if a == b || (a.is_nan() && b.is_nan()) {
            return 0;
        }
        let key = |v: f32| {
            let bits = v.to_bits() as i32;
            if bits < 0 { i32::MIN - bits } else { bits }
        };
        (key(a) as i64 - key(b) as i64).unsigned_abs() as u32
    }

    /// Asserts that `f` is within `ulps` units in the last place of `want` (see [`worst`]),
    /// printing its worst case.
    fn assert_ulps(
        name: &str,
        ulps: u32,
        f: impl Fn(f32) -> f32,
        want: impl Fn(f64) -> f64,
        lo: f32,
        hi: f32,
        dense: f32,
    ) {
        let (e, at) = worst(f, want, lo, hi, dense);
        eprintln!("{name}: {e} ulp at {at:e}");
        assert!(e <= ulps, "{name}: {e} ulp at {at:e}");
    }

    /// The worst ulp error of `f` against `want` (an f64 reference, rounded to f32) over every
    /// 97th finite f32 bit pattern in `lo..=hi` and a dense sweep of `[-dense, dense]`; returns
    /// the error and the input where it occurs.
    fn worst(
        f: impl Fn(f32) -> f32,
        want: impl Fn(f64) -> f64,
        lo: f32,
        hi: f32,
        dense: f32,
    ) -> (u32, f32) {
        let mut w = (0, 0.0);
        let mut check = |x: f32| {
            let e = ulps(f(x), want(x as f64) as f32);
            if e > w.0 {
                w = (e, x);
            }
        };
        let mut bits = 0u32;
        while bits < u32::MAX - 97 {
            let x = f32::from_bits(bits);
            if x.is_finite() && (lo..=hi).contains(&x) {
                check(x);
            }
            bits += 97;
        }
        for i in -400_000..=400_000 {
            check(i as f32 * (dense / 400_000.0));
        }
        w
    }

    #[test]
    fn exp_is_within_one_ulp_of_libm() {
        let mut worst = 0;
        // Every 97th f32 bit pattern between -87.5 and 88.7, plus a dense sweep near 0.
        let mut bits = 0u32;
        while bits < u32::MAX - 97 {
            let x = f32::from_bits(bits);
            if x.is_finite() && (-87.5..=88.7).contains(&x) {
                let want = (x as f64).exp() as f32;
                worst = worst.max(ulps(exp_f32(x), want));
            }
            bits += 97;
        }
        for i in -200_000..200_000 {
            let x = i as f32 * 1e-5;
            worst = worst.max(ulps(exp_f32(x), (x as f64).exp() as f32));
        }
        assert!(worst <= 1, "worst error {worst} ulp");
    }

    #[test]
    fn exp_special_values() {
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert!(exp_f32(88.7).is_finite() && exp_f32(88.7) > 3.3e38);
    }

    #[test]
    fn exp_wide_is_accurate() {
        let mut worst = 0.0f64;
        for i in -700_000..=700_000 {
            let w = i as f64 * 1e-3 + 0.000_123;
            let rel = (exp_wide(w) / w.exp() - 1.0).abs();
            worst = worst.max(rel);
        }
        assert!(worst < 2f64.powi(-24), "worst relative error {worst:e}");
        assert_eq!(exp_wide(f64::INFINITY), f64::INFINITY);
        assert_eq!(exp_wide(f64::NEG_INFINITY), 0.0);
        assert!(exp_wide(f64::NAN).is_nan());
    }

    fn tanh64(x: f64) -> f64 {
        x.tanh()
    }

    fn sigmoid64(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    fn silu64(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    fn gelu64(x: f64) -> f64 {
        // erfc keeps relative accuracy for negative x where 1 + erf would cancel.
        0.5 * x * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
    }

    fn gelu_tanh64(x: f64) -> f64 {
        let u = 0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x);
        x / (1.0 + (-2.0 * u).exp())
    }

    #[test]
    fn tanh_is_within_one_ulp() {
        assert_ulps("tanh", 1, tanh_f32, tanh64, f32::MIN, f32::MAX, 2.0);
        // Against libm's f32 tanh too.
        assert_ulps(
            "tanh vs tanhf",
            2,
            tanh_f32,
            |x| (x as f32).tanh() as f64,
            -20.0,
            20.0,
            2.0,
        );
    }

    #[test]
    fn sigmoid_and_silu_are_within_two_ulp() {
        assert_ulps(
            "sigmoid",
            2,
            sigmoid_f32,
            sigmoid64,
            f32::MIN,
            f32::MAX,
            20.0,
        );
        assert_ulps("silu", 2, silu_f32, silu64, f32::MIN, f32::MAX, 20.0);
    }

    #[test]
    fn erf_is_within_one_ulp() {
        assert_ulps("erf", 1, erf_f32, libm::erf, f32::MIN, f32::MAX, 5.0);
        assert_ulps(
            "erf vs erff",
            2,
            erf_f32,
            |x| libm::erff(x as f32) as f64,
            -6.0,
            6.0,
            5.0,
        );
    }

    #[test]
    fn gelu_is_within_two_ulp() {
        assert_ulps("gelu", 2, gelu_f32, gelu64, f32::MIN, f32::MAX, 15.0);
        assert_ulps(
            "gelu_tanh",
            2,
            gelu_tanh_f32,
            gelu_tanh64,
            f32::MIN,
            f32::MAX,
            15.0,
        );
    }

    #[test]
    fn special_values() {
        let inf = f32::INFINITY;
        for f in [
            tanh_f32,
            sigmoid_f32,
            silu_f32,
            erf_f32,
            gelu_f32,
            gelu_tanh_f32,
        ] {
            assert!(f(f32::NAN).is_nan());
        }
        for f in [tanh_f32, silu_f32, erf_f32, gelu_f32, gelu_tanh_f32] {
            assert_eq!(f(0.0), 0.0);
        }
        assert_eq!(sigmoid_f32(0.0), 0.5);
        assert_eq!((tanh_f32(inf), tanh_f32(-inf)), (1.0, -1.0));
        assert_eq!((erf_f32(inf), erf_f32(-inf)), (1.0, -1.0));
        assert_eq!((sigmoid_f32(inf), sigmoid_f32(-inf)), (1.0, 0.0));
        assert_eq!(
            (silu_f32(inf), gelu_f32(inf), gelu_tanh_f32(inf)),
            (inf, inf, inf)
        );
        assert!(silu_f32(-inf).is_nan() && gelu_f32(-inf).is_nan() && gelu_tanh_f32(-inf).is_nan());
        // Signed zeros.
        assert!(tanh_f32(-0.0).is_sign_negative() && erf_f32(-0.0).is_sign_negative());
        assert!(silu_f32(-0.0).is_sign_negative());
        // Far tails: exact limits and correctly rounded tiny values.
        assert_eq!(sigmoid_f32(-100.0), (sigmoid64(-100.0)) as f32);
        assert_eq!(tanh_f32(50.0), 1.0);
        assert_eq!(gelu_f32(-20.0), 0.0);
    }
}
