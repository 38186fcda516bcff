//! Branch-free f32 elementary functions that the compiler can vectorise.
//!
//! `f32::exp` and friends call the system's libm one element at a time, which keeps every loop
//! scalar. These versions use only arithmetic, comparisons, conversions and selects, so a loop
//! over a slice becomes SIMD code (4 lanes on baseline x86-64, 8 or 16 where the kernels in
//! `kernels.rs` compile the loop for AVX2 or AVX-512). Accuracy against the exact function
//! (computed in f64 and rounded to f32; measured by the tests below over every 97th f32 bit
//! pattern in the range shown plus dense sweeps, ~10^7 inputs per function), in ulp of the f32
//! result:
//!
//! | function | max error | range tested |
//! |---|---|---|
//! | `exp_f32` | 1 ulp | results in the normal range |
//! | `tanh_f32` | 1 ulp | all finite `x` |
//! | `sigmoid_f32` | 2 ulp | all finite `x` (subnormal results too) |
//! | `silu_f32` | 2 ulp | all finite `x` (subnormal results too) |
//! | `erf_f32` | 1 ulp | all finite `x` |
//! | `gelu_f32` (erf form) | 2 ulp | all finite `x` |
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
//! are f32 too, with fused multiply-adds: the steps that f32 would round visibly (the
//! exponential's argument, `-x²/2` or `2k(x + 0.044715x³)`, which near -100 would lose
//! `|argument|` ulps; erfc's `t`, whose error the result amplifies; the final products) are
//! carried as two f32 words, each product made exact by one fused multiply-add. `erf_f32`
//! does those steps in f64 (an f64 step costs two f32 lanes, so it runs at about a quarter
//! of `exp_f32`'s throughput). [`exp_wide`] returns an f64, so intermediate values far
//! outside f32's range cause no overflow, and results that are subnormal in f32 come out
//! correctly rounded rather than flushed.
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

/// The first nine Horner steps of `erfc_wide`'s degree-10 polynomial in `s = t - T0`, with
/// steps `step`; the last two are left to the caller, which does them more precisely.
#[inline(always)]
fn erfc_poly_head(s: f32, step: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let mut q = 0.030_724_857_f32;
    q = step(q, s, 0.021_153_321);
    q = step(q, s, -0.070_590_93);
    q = step(q, s, -0.000_804_152_9);
    q = step(q, s, 0.113_639_586);
    q = step(q, s, -0.046_760_64);
    q = step(q, s, -0.205_023_51);
    q = step(q, s, 0.079_460_12);
    step(q, s, 0.588_570_54)
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
    let q = erfc_poly_head(s, madd);
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

/// GELU, erf form: `x/2 (1 + erf(x / sqrt 2))`, within 2 ulp. All f32 with fused steps.
#[inline(always)]
pub fn gelu_f32(x: f32) -> f32 {
    // c = erfc(|x| / sqrt 2) = e^(-x^2/2) t P(t - T0), t = 1 / (1 + |x| / (2 sqrt 2)) (the fit
    // of `erfc_wide`); x/2 (1 + erf(x/sqrt 2)) is x/2 c below 0, x/2 (2 - c) above, so
    // negative x never subtracts nearly equal numbers. Each step that f32 would round
    // visibly is kept as two words: t (whose error c amplifies 2.3 times near 0), the
    // exponential's argument (exact: -x^2/2 near -80 would otherwise lose 80 ulps), the last
    // polynomial step, the products; one rounding at the end. Capping |x| keeps the steps
    // finite at infinity, where the exponential is 0.
    const K: f32 = (0.5 * std::f64::consts::FRAC_1_SQRT_2) as f32;
    const K_LO: f32 = (0.5 * std::f64::consts::FRAC_1_SQRT_2 - K as f64) as f32;
    const T0: f32 = 0.586_956_5;
    const T0_LO: f32 = (0.586_956_501_007_080_1 - T0 as f64) as f32;
    const C0: f32 = 0.574_856_4;
    const C0_LO: f32 = (0.574_856_400_489_807_1 - C0 as f64) as f32;
    let a = x.abs().min(1e4);
    // d = 1 + aK = dh + dl.
    let (p, pe) = two_prod(a, K);
    let pe = a.mul_add(K_LO, pe);
    let dh = 1.0 + p;
    let dl = (p.min(1.0) - (dh - p.max(1.0))) + pe;
    // t = 1/d = t0 + tl: one Newton step from the f32 quotient, with the exact residual.
    let t0 = 1.0 / dh;
    let e = (-t0).mul_add(dl, (-t0).mul_add(dh, 1.0));
    let tl = t0 * e;
    let s = (t0 - T0) + (tl - T0_LO);
    let q = erfc_poly_head(s, f32::mul_add).mul_add(s, 0.787_195_86);
    // P = C0 + s q = ph + pl (|s q| < C0, so the sum's error is exact), then tP = qh + ql.
    let (sq, sqe) = two_prod(s, q);
    let ph = C0 + sq;
    let pl = ((C0 - ph) + sq) + (sqe + C0_LO);
    let (qh, qe) = two_prod(t0, ph);
    let ql = qe + t0.mul_add(pl, tl * ph);
    let (w, we) = two_prod(a, a);
    let (mh, ml, sc) = exp_fma(-0.5 * w, -0.5 * we);
    // g = e^(-x^2/2) t P 2^64 = gh + gl.
    let (gh, ge) = two_prod(mh, qh);
    let gl = ge + mh.mul_add(ql, ml * qh);
    let h = 0.5 * x;
    let r = if x < 0.0 {
        // Scaled back last, so a subnormal result is rounded once.
        h.mul_add(gh, h * gl) * sc
    } else {
        // 2 - c = v + vl exactly (c <= 1).
        let c = gh * sc;
        let v = 2.0 - c;
        let vl = ((2.0 - v) - c) - gl * sc;
        h.mul_add(v, h * vl)
    };
    // h * vl is inf * 0 at x = inf.
    if x == f32::INFINITY { x } else { r }
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
        let (e, at) = worst(tanh_f32, tanh64, f32::MIN, f32::MAX, 2.0);
        eprintln!("tanh: {e} ulp at {at:e}");
        assert!(e <= 1, "tanh: {e} ulp at {at:e}");
        // Against libm's f32 tanh too.
        let (e, at) = worst(tanh_f32, |x| (x as f32).tanh() as f64, -20.0, 20.0, 2.0);
        eprintln!("tanh vs tanhf: {e} ulp at {at:e}");
        assert!(e <= 2, "tanh vs tanhf: {e} ulp at {at:e}");
    }

    #[test]
    fn sigmoid_and_silu_are_within_two_ulp() {
        let (e, at) = worst(sigmoid_f32, sigmoid64, f32::MIN, f32::MAX, 20.0);
        eprintln!("sigmoid: {e} ulp at {at:e}");
        assert!(e <= 2, "sigmoid: {e} ulp at {at:e}");
        let (e, at) = worst(silu_f32, silu64, f32::MIN, f32::MAX, 20.0);
        eprintln!("silu: {e} ulp at {at:e}");
        assert!(e <= 2, "silu: {e} ulp at {at:e}");
    }

    #[test]
    fn erf_is_within_one_ulp() {
        let (e, at) = worst(erf_f32, libm::erf, f32::MIN, f32::MAX, 5.0);
        eprintln!("erf: {e} ulp at {at:e}");
        assert!(e <= 1, "erf: {e} ulp at {at:e}");
        let (e, at) = worst(erf_f32, |x| libm::erff(x as f32) as f64, -6.0, 6.0, 5.0);
        eprintln!("erf vs erff: {e} ulp at {at:e}");
        assert!(e <= 2, "erf vs erff: {e} ulp at {at:e}");
    }

    #[test]
    fn gelu_is_within_two_ulp() {
        let (e, at) = worst(gelu_f32, gelu64, f32::MIN, f32::MAX, 15.0);
        eprintln!("gelu: {e} ulp at {at:e}");
        assert!(e <= 2, "gelu: {e} ulp at {at:e}");
        let (e, at) = worst(gelu_tanh_f32, gelu_tanh64, f32::MIN, f32::MAX, 15.0);
        eprintln!("gelu_tanh: {e} ulp at {at:e}");
        assert!(e <= 2, "gelu_tanh: {e} ulp at {at:e}");
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
