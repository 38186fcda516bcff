//! Vectorised kernels of the row-wise neural-network ops on the native CPU: softmax and
//! log-softmax of a row, layer/RMS/group normalisation of a row, and blocks of scaled
//! dot-product attention.
//!
//! The build targets baseline x86-64 (SSE2), so each hot loop is written once, branch-free, as
//! `#[inline(always)]` generic code, and instantiated three times: plainly (the portable version,
//! which the compiler vectorises for the build target and which also serves f64), and inside
//! `#[target_feature]` functions for AVX2+FMA and for AVX-512, where the same loops vectorise
//! to wider registers. [`crate::cpu::isa`] picks the version. The attention
//! blocks multiply through small register-blocked matrix kernels written with intrinsics for
//! AVX2+FMA and AVX-512, with a plain-loop version for the rest.
//!
//! Every `unsafe` block of this module is either a call of a `#[target_feature]` function
//! behind the run-time check, or a SIMD load/store inside a matrix kernel whose bounds were
//! checked on entry.

use std::ops::Add;

use crate::cpu::float::Float;
use crate::cpu::isa::{Level, level};

// ---- the compute types ----------------------------------------------------------------------

/// The row kernels of a compute type, each at the best level the CPU offers (the
/// `#[target_feature]` versions for f32, the portable ones for f64).
pub(crate) trait RowKernels: Float {
    /// Softmax (or log-softmax) of one row (see [`softmax_row`]), at the best level.
    fn softmax_row(x: &[Self], o: &mut [Self], log: bool);
    /// One row of a normalisation (see [`norm_row`]), at the best level.
    fn norm_row(x: &[Self], o: &mut [Self], p: &NormParams<'_, Self>);
    /// One block of query rows of an attention (see [`Attn::block`]), at the best level.
    fn attn_block(a: &Attn<'_, Self>, bq: usize, i0: usize, out: &mut [Self]);
}

/// Runs `$body` at the best level: `$avx512` and `$avx2` name `#[target_feature]` functions
/// taking `$args`.
macro_rules! dispatch {
    ($avx512:ident, $avx2:ident, $portable:expr, ($($arg:expr),*)) => {
        match level() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `level()` reports AVX-512 only when the CPU has AVX-512F, AVX2 and FMA,
            // the features `$avx512` enables.
            Level::Avx512 => unsafe { x86::$avx512($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `level()` reports AVX2 only when the CPU has AVX2 and FMA, the features
            // `$avx2` enables.
            Level::Avx2 => unsafe { x86::$avx2($($arg),*) },
            _ => $portable,
        }
    };
}

impl RowKernels for f32 {
    fn softmax_row(x: &[f32], o: &mut [f32], log: bool) {
        dispatch!(
            softmax_row_avx512,
            softmax_row_avx2,
            softmax_row(x, o, log),
            (x, o, log)
        )
    }
    fn norm_row(x: &[f32], o: &mut [f32], p: &NormParams<'_, f32>) {
        dispatch!(norm_row_avx512, norm_row_avx2, norm_row(x, o, p), (x, o, p))
    }
    fn attn_block(a: &Attn<'_, f32>, bq: usize, i0: usize, out: &mut [f32]) {
        dispatch!(
            attn_block_avx512,
            attn_block_avx2,
            // SAFETY: the portable matrix kernel needs no CPU feature.
            unsafe { attn_block::<f32, Portable>(a, bq, i0, out) },
            (a, bq, i0, out)
        )
    }
}

impl RowKernels for f64 {
    fn softmax_row(x: &[f64], o: &mut [f64], log: bool) {
        softmax_row(x, o, log)
    }
    fn norm_row(x: &[f64], o: &mut [f64], p: &NormParams<'_, f64>) {
        norm_row(x, o, p)
    }
    fn attn_block(a: &Attn<'_, f64>, bq: usize, i0: usize, out: &mut [f64]) {
        // SAFETY: the portable matrix kernel needs no CPU feature.
        unsafe { attn_block::<f64, Portable>(a, bq, i0, out) }
    }
}

// ---- lane-parallel reductions ---------------------------------------------------------------

/// Independent accumulators per reduction: enough for the compiler to fill several vector
/// registers, so that the reductions run at the loads' pace and not the adds' latency.
const LANES: usize = 32;

/// The larger of `m` and `v`, ignoring NaN in `v` (as `maxps`).
#[inline(always)]
fn max<C: Float>(m: C, v: C) -> C {
    if v > m { v } else { m }
}

/// The larger of `m` and `v`, NaN once either is NaN.
#[inline(always)]
#[allow(clippy::eq_op)]
fn nan_max<C: Float>(m: C, v: C) -> C {
    if v > m || v != v { v } else { m }
}

/// The largest element of `x` (NaN ignored; -inf for an empty or all-NaN row).
#[inline(always)]
fn row_max<C: Float>(x: &[C]) -> C {
    let mut acc = [C::NEG_INF; LANES];
    let mut it = x.chunks_exact(LANES);
    for ch in &mut it {
        for (a, &v) in acc.iter_mut().zip(ch) {
            *a = max(*a, v);
        }
    }
    let mut m = C::NEG_INF;
    for &v in it.remainder().iter().chain(&acc) {
        m = max(m, v);
    }
    m
}

/// Sums `acc`'s lanes pairwise (a fixed order).
#[inline(always)]
fn lane_sum<T: Copy + Add<Output = T>>(acc: &mut [T; LANES]) -> T {
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] = acc[i] + acc[i + w];
        }
    }
    acc[0]
}

/// `sum(exp(x - m))`.
#[inline(always)]
fn sum_exp<C: Float>(x: &[C], m: C) -> C {
    let mut acc = [C::ZERO; LANES];
    let mut it = x.chunks_exact(LANES);
    for ch in &mut it {
        for (a, &v) in acc.iter_mut().zip(ch) {
            *a += (v - m).fexp();
        }
    }
    let mut s = lane_sum(&mut acc);
    for &v in it.remainder() {
        s += (v - m).fexp();
    }
    s
}

/// `o = exp(x - m)`, returning `sum(o)`.
#[inline(always)]
fn exp_store_sum<C: Float>(x: &[C], o: &mut [C], m: C) -> C {
    let mut acc = [C::ZERO; LANES];
    let mut xi = x.chunks_exact(LANES);
    let mut oi = o.chunks_exact_mut(LANES);
    for (xc, oc) in (&mut xi).zip(&mut oi) {
        for ((a, &v), o) in acc.iter_mut().zip(xc).zip(oc) {
            let e = (v - m).fexp();
            *o = e;
            *a += e;
        }
    }
    let mut s = lane_sum(&mut acc);
    for (&v, o) in xi.remainder().iter().zip(oi.into_remainder()) {
        let e = (v - m).fexp();
        *o = e;
        s += e;
    }
    s
}

/// Elements per block of [`sum_map_f64`]: each lane sums `STAT_BLOCK / LANES` of them in the
/// compute type before the block's total joins an f64 sum.
const STAT_BLOCK: usize = 512;

/// `sum(f(x))`: lane-parallel in the compute type within blocks of [`STAT_BLOCK`] elements
/// (full-width vectors; f64 lanes would halve them), the blocks' sums added in f64, so the
/// rounding error grows with the block and not the row.
#[inline(always)]
fn sum_map_f64<C: Float>(x: &[C], f: impl Fn(C) -> C) -> f64 {
    let mut total = 0f64;
    let mut blocks = x.chunks_exact(STAT_BLOCK);
    for blk in &mut blocks {
        let mut acc = [C::ZERO; LANES];
        for ch in blk.chunks_exact(LANES) {
            for (a, &v) in acc.iter_mut().zip(ch) {
                *a += f(v);
            }
        }
        total += lane_sum(&mut acc).to_f64();
    }
    let rest = blocks.remainder();
    let mut acc = [C::ZERO; LANES];
    let mut it = rest.chunks_exact(LANES);
    for ch in &mut it {
        for (a, &v) in acc.iter_mut().zip(ch) {
            *a += f(v);
        }
    }
    let mut s = lane_sum(&mut acc);
    for &v in it.remainder() {
        s += f(v);
    }
    total + s.to_f64()
}

// ---- softmax --------------------------------------------------------------------------------

/// Softmax (or log-softmax) of the row `x` into `o`, max-shifted: three passes over a row that
/// stays in cache after the first. A row with NaN, or with nothing but -inf, gives NaN.
#[inline(always)]
pub(crate) fn softmax_row<C: Float>(x: &[C], o: &mut [C], log: bool) {
    let o = &mut o[..x.len()];
    let m = row_max(x);
    if log {
        let ls = C::from_f64(sum_exp(x, m).to_f64().ln());
        for (o, &v) in o.iter_mut().zip(x) {
            *o = (v - m) - ls;
        }
    } else {
        let inv = C::ONE / exp_store_sum(x, o, m);
        for o in o.iter_mut() {
            *o *= inv;
        }
    }
}

// ---- layer, RMS and group norm ---------------------------------------------------------------

/// What a normalised row is made of. `w` and `b` hold one value per `seg` consecutive elements
/// of the row.
pub(crate) struct NormParams<'a, C> {
    /// Root mean square instead of mean and variance.
    pub rms: bool,
    /// Added to the variance.
    pub eps: f64,
    /// Elementwise weight.
    pub w: Option<&'a [C]>,
    /// Elementwise bias.
    pub b: Option<&'a [C]>,
    /// Elements per weight (1 for layer and RMS norm, the spatial size for group norm).
    pub seg: usize,
}

/// `o = ((x - mean) * rstd) * w + b` with `w` and `b` given per element (`Some`) or absent.
#[inline(always)]
fn affine<C: Float>(x: &[C], o: &mut [C], mean: C, rstd: C, w: Option<&[C]>, b: Option<&[C]>) {
    let o = &mut o[..x.len()];
    match (w, b) {
        (Some(w), Some(b)) => {
            for (((o, &v), &w), &b) in o.iter_mut().zip(x).zip(w).zip(b) {
                *o = ((v - mean) * rstd) * w + b;
            }
        }
        (Some(w), None) => {
            for ((o, &v), &w) in o.iter_mut().zip(x).zip(w) {
                *o = ((v - mean) * rstd) * w;
            }
        }
        (None, Some(b)) => {
            for ((o, &v), &b) in o.iter_mut().zip(x).zip(b) {
                *o = ((v - mean) * rstd) + b;
            }
        }
        (None, None) => {
            for (o, &v) in o.iter_mut().zip(x) {
                *o = (v - mean) * rstd;
            }
        }
    }
}

/// Normalises the row `x` into `o`: the mean, then the centred variance (over a row that stays
/// in cache), each totalled in f64 (see [`sum_map_f64`]); the affine step in the compute type.
#[inline(always)]
pub(crate) fn norm_row<C: Float>(x: &[C], o: &mut [C], p: &NormParams<'_, C>) {
    let n = x.len() as f64;
    let (mean, var) = if p.rms {
        (0.0, sum_map_f64(x, |v| v * v) / n)
    } else {
        let mean = C::from_f64(sum_map_f64(x, |v| v) / n);
        let var = sum_map_f64(x, |v| (v - mean) * (v - mean)) / n;
        (mean.to_f64(), var)
    };
    let rstd = C::from_f64(1.0 / (var + p.eps).sqrt());
    let mean = C::from_f64(mean);
    if p.seg <= 1 {
        return affine(x, o, mean, rstd, p.w, p.b);
    }
    for (s, (xs, os)) in x.chunks(p.seg).zip(o.chunks_mut(p.seg)).enumerate() {
        let (wv, bv) = (p.w.map(|w| w[s]), p.b.map(|b| b[s]));
        match (wv, bv) {
            (Some(wv), Some(bv)) => {
                for (o, &v) in os.iter_mut().zip(xs) {
                    *o = ((v - mean) * rstd) * wv + bv;
                }
            }
            _ => {
                let (wv, bv) = (wv.unwrap_or(C::ONE), bv.unwrap_or(C::ZERO));
                let (has_w, has_b) = (p.w.is_some(), p.b.is_some());
                for (o, &v) in os.iter_mut().zip(xs) {
                    let mut y = (v - mean) * rstd;
                    if has_w {
                        y *= wv;
                    }
                    if has_b {
                        y += bv;
                    }
                    *o = y;
                }
            }
        }
    }
}

// ---- attention --------------------------------------------------------------------------------

/// Query rows per attention task: the width of the transposed score block.
pub(crate) const ATTN_ROWS: usize = 32;
/// Keys per score block: the scores held at once are `ATTN_ROWS x ATTN_KEYS`.
const ATTN_KEYS: usize = 128;

/// An attention mask's values.
pub(crate) enum MaskVals<'a, C> {
    /// Attend where true.
    Keep(&'a [bool]),
    /// Added to the scores.
    Add(&'a [C]),
}

/// An attention mask broadcast to `[..., L, S]`: `row(batch, i)` is the storage index of
/// element `(batch, i, 0)`, and keys step by `sj`.
pub(crate) struct AttnMask<'a, C> {
    pub vals: MaskVals<'a, C>,
    pub row: &'a (dyn Fn(usize, usize) -> usize + Sync),
    pub sj: usize,
}

/// A scaled dot-product attention over dense `q` (`[B, L, E]`), `k` (`[Bk, S, E]`) and `v`
/// (`[Bk, S, Ev]`), where the `B` query batches are `hq` heads per outer batch and read key
/// head `h / (hq / hk)` of the same outer batch.
pub(crate) struct Attn<'a, C> {
    pub q: &'a [C],
    pub k: &'a [C],
    pub v: &'a [C],
    pub l: usize,
    pub s: usize,
    pub e: usize,
    pub ev: usize,
    pub hq: usize,
    pub hk: usize,
    pub scale: C,
    pub causal: bool,
    pub mask: Option<AttnMask<'a, C>>,
}

impl<C: RowKernels> Attn<'_, C> {
    /// Query rows `i0..i0 + out.len() / ev` of query batch `bq`, into `out`.
    pub(crate) fn block(&self, bq: usize, i0: usize, out: &mut [C]) {
        if self.ev > 0 && !out.is_empty() {
            C::attn_block(self, bq, i0, out)
        }
    }
}

/// `c (+)= a · b` for an `m x k` matrix `a` and a `k x n` row-major `b` (row stride `ldb`),
/// into the row-major `c` (row stride `ldc`). `a` is row-major with row stride `lda`, or, when
/// `COLA`, column-major with column stride `lda`.
trait Gemm<C> {
    /// `n` comes in multiples of this.
    const PAD: usize;
    /// # Safety
    /// The CPU has the features of the kernel.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm<const COLA: bool>(
        m: usize,
        n: usize,
        k: usize,
        a: &[C],
        lda: usize,
        b: &[C],
        ldb: usize,
        c: &mut [C],
        ldc: usize,
        acc: bool,
    );
}

/// Whether a matrix of `rows` lines of `cols` elements `ld` apart fits in `len` elements.
fn fits(len: usize, rows: usize, ld: usize, cols: usize) -> bool {
    rows == 0 || cols == 0 || (rows - 1) * ld + cols <= len
}

/// The bounds every matrix kernel checks before it runs.
#[allow(clippy::too_many_arguments)]
fn check_gemm<const COLA: bool>(
    m: usize,
    n: usize,
    k: usize,
    la: usize,
    lda: usize,
    lb: usize,
    ldb: usize,
    lc: usize,
    ldc: usize,
    pad: usize,
) {
    let a_ok = if COLA {
        fits(la, k, lda, m)
    } else {
        fits(la, m, lda, k)
    };
    assert!(
        a_ok && fits(lb, k, ldb, n) && fits(lc, m, ldc, n) && n.is_multiple_of(pad),
        "matrix kernel bounds"
    );
}

/// Plain loops (vectorised over `n` by the compiler).
struct Portable;

impl<C: Float> Gemm<C> for Portable {
    const PAD: usize = 1;

    unsafe fn gemm<const COLA: bool>(
        m: usize,
        n: usize,
        k: usize,
        a: &[C],
        lda: usize,
        b: &[C],
        ldb: usize,
        c: &mut [C],
        ldc: usize,
        acc: bool,
    ) {
        for i in 0..m {
            let crow = &mut c[i * ldc..i * ldc + n];
            if !acc {
                crow.fill(C::ZERO);
            }
            for kk in 0..k {
                let av = if COLA {
                    a[kk * lda + i]
                } else {
                    a[i * lda + kk]
                };
                for (x, &y) in crow.iter_mut().zip(&b[kk * ldb..kk * ldb + n]) {
                    *x += av * y;
                }
            }
        }
    }
}

/// Query rows `i0..` of query batch `bq` (see [`Attn`]): flash-attention style, over blocks
/// of keys with an online softmax, holding one block of scores. The scores are computed
/// transposed (`keys x queries`, as `K · (scale Q)^T`) so that the softmax statistics of the
/// block's queries sit in vector lanes, and the block's output is `P · V`. Rows with no key to
/// attend to give zeros, rows with a NaN score NaN.
///
/// # Safety
/// The CPU has the features of `G`.
#[inline(always)]
unsafe fn attn_block<C: Float, G: Gemm<C>>(a: &Attn<'_, C>, bq: usize, i0: usize, out: &mut [C]) {
    let (l, s, e, ev) = (a.l, a.s, a.e, a.ev);
    let rows = out.len() / ev;
    let rep = a.hq.checked_div(a.hk).unwrap_or(1).max(1);
    let hq = a.hq.max(1);
    let kvh = (bq / hq) * a.hk + (bq % hq) / rep;
    let qr = &a.q[(bq * l + i0) * e..][..rows * e];
    let kh = &a.k[kvh * s * e..][..s * e];
    let vh = &a.v[kvh * s * ev..][..s * ev];
    // Keys the last row may attend to.
    let keys = if a.causal { s.min(i0 + rows) } else { s };
    let w = rows.next_multiple_of(G::PAD);
    let evp = ev.next_multiple_of(G::PAD);
    // The scaled queries, transposed (`e x w`, zero-padded).
    let mut qt = vec![C::ZERO; e * w];
    for (r, q) in qr.chunks_exact(e.max(1)).enumerate() {
        for (t, &x) in q.iter().enumerate() {
            qt[t * w + r] = x * a.scale;
        }
    }
    // Values with rows padded to the kernel's width, when they are not already.
    let vpad;
    let (vs, ldv) = if evp == ev {
        (vh, ev)
    } else {
        let mut p = vec![C::ZERO; keys * evp];
        for (d, s) in p.chunks_exact_mut(evp).zip(vh.chunks_exact(ev)) {
            d[..ev].copy_from_slice(s);
        }
        vpad = p;
        (&vpad[..], evp)
    };
    let mut sc = vec![C::ZERO; ATTN_KEYS.min(keys) * w];
    let mut o = vec![C::ZERO; rows * evp];
    // Per query (lane): running max, running sum, and this block's max, shift and sum.
    let mut m = vec![C::NEG_INF; w];
    let mut lsum = vec![C::ZERO; w];
    let mut bm = vec![C::NEG_INF; w];
    let mut shift = vec![C::ZERO; w];
    let mut corr = vec![C::ONE; w];
    let mut psum = vec![C::ZERO; w];
    let mut j0 = 0;
    while j0 < keys {
        let kb = ATTN_KEYS.min(keys - j0);
        let sc = &mut sc[..kb * w];
        // SAFETY: forwarded from the caller.
        unsafe { G::gemm::<false>(kb, w, e, &kh[j0 * e..], e, &qt, w, sc, w, false) };
        if let Some(mk) = &a.mask {
            for r in 0..rows {
                let base = (mk.row)(bq, i0 + r) + j0 * mk.sj;
                match mk.vals {
                    MaskVals::Keep(keep) => {
                        for j in 0..kb {
                            if !keep[base + j * mk.sj] {
                                sc[j * w + r] = C::NEG_INF;
                            }
                        }
                    }
                    MaskVals::Add(add) => {
                        for j in 0..kb {
                            sc[j * w + r] += add[base + j * mk.sj];
                        }
                    }
                }
            }
        }
        if a.causal && j0 + kb > i0 + 1 {
            // Query i0 + r sees key j only when j <= i0 + r.
            for (j, srow) in sc.chunks_exact_mut(w).enumerate() {
                let lim = (j0 + j).saturating_sub(i0).min(w);
                srow[..lim].fill(C::NEG_INF);
            }
        }
        bm.fill(C::NEG_INF);
        for srow in sc.chunks_exact(w) {
            for (b, &x) in bm.iter_mut().zip(srow) {
                *b = nan_max(*b, x);
            }
        }
        for r in 0..w {
            let mn = nan_max(m[r], bm[r]);
            let dead = mn == C::NEG_INF;
            // Nothing attended yet: scores shift by +inf to give zeros.
            shift[r] = if dead { C::INF } else { mn };
            corr[r] = if dead { C::ONE } else { (m[r] - mn).fexp() };
            m[r] = mn;
        }
        psum.fill(C::ZERO);
        for srow in sc.chunks_exact_mut(w) {
            for ((x, p), &sh) in srow.iter_mut().zip(psum.iter_mut()).zip(&shift) {
                let e = (*x - sh).fexp();
                *x = e;
                *p += e;
            }
        }
        for r in 0..w {
            lsum[r] = lsum[r] * corr[r] + psum[r];
        }
        for (orow, &c) in o.chunks_exact_mut(evp).zip(&corr) {
            if c != C::ONE {
                for x in orow {
                    *x *= c;
                }
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe {
            G::gemm::<true>(
                rows,
                evp,
                kb,
                sc,
                w,
                &vs[j0 * ldv..],
                ldv,
                &mut o,
                evp,
                true,
            )
        };
        j0 += kb;
    }
    for ((dst, src), (&mr, &lr)) in out
        .chunks_exact_mut(ev)
        .zip(o.chunks_exact(evp))
        .zip(m.iter().zip(&lsum))
    {
        #[allow(clippy::eq_op)]
        if mr != mr {
            dst.fill(C::NAN);
        } else if lr == C::ZERO {
            dst.fill(C::ZERO);
        } else {
            let inv = C::ONE / lr;
            for (d, &x) in dst.iter_mut().zip(src) {
                *d = x * inv;
            }
        }
    }
}

// ---- x86 versions -----------------------------------------------------------------------------

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Attn, Gemm, NormParams, check_gemm};

    /// The `#[target_feature]` instantiations of a generic kernel.
    macro_rules! instantiate {
        ($name:ident, $feat:literal, $body:path, ($($arg:ident: $ty:ty),*)) => {
            #[target_feature(enable = $feat)]
            pub(super) fn $name($($arg: $ty),*) {
                $body($($arg),*)
            }
        };
    }

    instantiate!(softmax_row_avx512, "avx512f,avx2,fma", super::softmax_row, (x: &[f32], o: &mut [f32], log: bool));
    instantiate!(softmax_row_avx2, "avx2,fma", super::softmax_row, (x: &[f32], o: &mut [f32], log: bool));
    instantiate!(norm_row_avx512, "avx512f,avx2,fma", super::norm_row, (x: &[f32], o: &mut [f32], p: &NormParams<'_, f32>));
    instantiate!(norm_row_avx2, "avx2,fma", super::norm_row, (x: &[f32], o: &mut [f32], p: &NormParams<'_, f32>));

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) fn attn_block_avx512(a: &Attn<'_, f32>, bq: usize, i0: usize, out: &mut [f32]) {
        // SAFETY: this function is only reached when the CPU has AVX-512F (see `dispatch!`).
        unsafe { super::attn_block::<f32, Avx512>(a, bq, i0, out) }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn attn_block_avx2(a: &Attn<'_, f32>, bq: usize, i0: usize, out: &mut [f32]) {
        // SAFETY: this function is only reached when the CPU has AVX2 and FMA.
        unsafe { super::attn_block::<f32, Avx2>(a, bq, i0, out) }
    }

    /// A register-blocked matrix kernel: `MR` rows by `NV` vectors of `c` per tile, held in
    /// registers over the whole `k` loop.
    macro_rules! gemm_kernel {
        ($kern:ident, $tile:ident, $run:ident, $feat:literal, $w:literal, $mr:literal,
         $zero:ident, $load:ident, $store:ident, $splat:ident, $fma:ident, $add:ident) => {
            /// One tile.
            ///
            /// # Safety
            /// The CPU has the features; `a`, `b` and `c` reach the tile's elements (see
            /// `check_gemm`).
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn $tile<const MR: usize, const NV: usize, const COLA: bool>(
                k: usize,
                a: *const f32,
                lda: usize,
                b: *const f32,
                ldb: usize,
                c: *mut f32,
                ldc: usize,
                acc: bool,
            ) {
                // SAFETY: the caller guarantees the features and that every offset below is
                // inside the matrices.
                unsafe {
                    let mut t = [[$zero(); NV]; MR];
                    let (rs, cs) = if COLA { (1, lda) } else { (lda, 1) };
                    for kk in 0..k {
                        let bp = b.add(kk * ldb);
                        let mut bv = [$zero(); NV];
                        for (v, x) in bv.iter_mut().enumerate() {
                            *x = $load(bp.add(v * $w));
                        }
                        let ap = a.add(kk * cs);
                        for (i, ti) in t.iter_mut().enumerate() {
                            let av = $splat(*ap.add(i * rs));
                            for (x, &y) in ti.iter_mut().zip(&bv) {
                                *x = $fma(av, y, *x);
                            }
                        }
                    }
                    for (i, ti) in t.iter().enumerate() {
                        for (v, &x) in ti.iter().enumerate() {
                            let p = c.add(i * ldc + v * $w);
                            let r = if acc { $add($load(p), x) } else { x };
                            $store(p, r);
                        }
                    }
                }
            }

            /// Every tile of `c`.
            ///
            /// # Safety
            /// As `Gemm::gemm`, with the bounds checked.
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn $run<const COLA: bool>(
                m: usize,
                n: usize,
                k: usize,
                a: *const f32,
                lda: usize,
                b: *const f32,
                ldb: usize,
                c: *mut f32,
                ldc: usize,
                acc: bool,
            ) {
                let rs = if COLA { 1 } else { lda };
                let mut i = 0;
                while i < m {
                    let mr = (m - i).min($mr);
                    let mut j = 0;
                    while j < n {
                        let nv = if n - j >= 2 * $w { 2 } else { 1 };
                        // SAFETY: tile (i, j) lies inside the checked bounds.
                        unsafe {
                            let (ap, bp, cp) = (a.add(i * rs), b.add(j), c.add(i * ldc + j));
                            macro_rules! go {
                                ($r:literal) => {
                                    if nv == 2 {
                                        $tile::<$r, 2, COLA>(k, ap, lda, bp, ldb, cp, ldc, acc)
                                    } else {
                                        $tile::<$r, 1, COLA>(k, ap, lda, bp, ldb, cp, ldc, acc)
                                    }
                                };
                            }
                            match mr {
                                8 => go!(8),
                                7 => go!(7),
                                6 => go!(6),
                                5 => go!(5),
                                4 => go!(4),
                                3 => go!(3),
                                2 => go!(2),
                                _ => go!(1),
                            }
                        }
                        j += nv * $w;
                    }
                    i += mr;
                }
            }

            pub(super) struct $kern;

            impl Gemm<f32> for $kern {
                const PAD: usize = $w;

                #[inline(always)]
                unsafe fn gemm<const COLA: bool>(
                    m: usize,
                    n: usize,
                    k: usize,
                    a: &[f32],
                    lda: usize,
                    b: &[f32],
                    ldb: usize,
                    c: &mut [f32],
                    ldc: usize,
                    acc: bool,
                ) {
                    check_gemm::<COLA>(m, n, k, a.len(), lda, b.len(), ldb, c.len(), ldc, $w);
                    // SAFETY: the bounds are checked just above; the caller guarantees the
                    // features.
                    unsafe {
                        $run::<COLA>(
                            m,
                            n,
                            k,
                            a.as_ptr(),
                            lda,
                            b.as_ptr(),
                            ldb,
                            c.as_mut_ptr(),
                            ldc,
                            acc,
                        )
                    }
                }
            }
        };
    }

    gemm_kernel!(
        Avx512,
        tile512,
        run512,
        "avx512f",
        16,
        8,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_add_ps
    );

    gemm_kernel!(
        Avx2,
        tile256,
        run256,
        "avx2,fma",
        8,
        6,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_add_ps
    );
}
