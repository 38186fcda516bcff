//! The inner loops of the CPU reductions, written once and compiled three times: for the build
//! target (portable: plain x86-64 means SSE2), for AVX2 + FMA and for AVX-512 (F, BW, DQ, VL).
//! [`crate::cpu::isa::level`] picks the build (capped to the portable one by the tests).
//!
//! Every generic loop is plain scalar code over fixed-size lane arrays, which the compiler turns
//! into vector code of the width the build allows. The order of every float operation is fixed
//! by the code, not by the width (Rust never fuses or reorders float arithmetic), so all three
//! builds give bit-identical results. The f32 sum, max and min, which the compiler vectorises
//! poorly, have AVX-512 loops written out ([`SumF32`], [`ExtremeF32`]) in the same order.
//!
//! Summation order of one contiguous run of elements ([`rows`]): blocks of [`BLOCK`] elements
//! from the run's start; within a block element `i` goes to lane `i % LANES` of [`LANES`]
//! accumulators, each folded in order, and the lanes are combined by a fixed halving tree
//! (lane `l` with lane `l + w` for `w = LANES / 2, LANES / 4, ..., 1`); a block shorter than
//! `LANES` is folded sequentially. Block results are combined pairwise as a binary counter
//! ([`Counter`]), so float error grows with `LANES` plus the log of the number of blocks.
//! Columns ([`cols`]) fold whole rows into a vector of accumulators, each in row order.

use std::marker::PhantomData;

use tpu_tensor::{bf16, f16};

use crate::cpu::float::Float;
use crate::cpu::isa::{self, Level};

// ---- element types ---------------------------------------------------------------------------

/// The types the kernels accumulate in (f32, f64, i64).
pub(crate) trait Acc: Copy + Send + Sync + PartialOrd + 'static {
    const ZERO: Self;
    const ONE: Self;
    /// The identity of max (-inf, or the smallest integer).
    const LOWEST: Self;
    /// The identity of min.
    const HIGHEST: Self;
    /// `+`, wrapping for integers.
    fn add(self, o: Self) -> Self;
    /// `*`, wrapping for integers.
    fn mul(self, o: Self) -> Self;
    fn nan(self) -> bool;
    fn abs(self) -> Self;
}

/// The float accumulators: their arithmetic is [`Float`]'s (`e^x` is [`Float::fexp`], for f32
/// the vectorisable [`crate::cpu::math::exp_f32`]).
pub(crate) trait FloatAcc: Acc + Load<Self> + Float {
    /// True for ±∞.
    fn infinite(self) -> bool;
}

impl Acc for i64 {
    const ZERO: Self = 0;
    const ONE: Self = 1;
    const LOWEST: Self = i64::MIN;
    const HIGHEST: Self = i64::MAX;
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self.wrapping_mul(o)
    }
    #[inline(always)]
    fn nan(self) -> bool {
        false
    }
    #[inline(always)]
    fn abs(self) -> Self {
        self.wrapping_abs()
    }
}

macro_rules! float_acc {
    ($t:ident) => {
        impl Acc for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const LOWEST: Self = $t::NEG_INFINITY;
            const HIGHEST: Self = $t::INFINITY;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            #[allow(clippy::eq_op)]
            fn nan(self) -> bool {
                self != self
            }
            #[inline(always)]
            fn abs(self) -> Self {
                $t::abs(self)
            }
        }

        impl FloatAcc for $t {
            #[inline(always)]
            fn infinite(self) -> bool {
                $t::is_infinite(self)
            }
        }
    };
}
float_acc!(f32);
float_acc!(f64);

/// A stored element read as the type it accumulates in (exactly: 16-bit floats widen to f32,
/// integers and bool to i64).
pub(crate) trait Load<A>: Copy + Send + Sync + 'static {
    fn load(self) -> A;
}

macro_rules! load_as {
    ($a:ty: $($x:ty),*) => {$(
        impl Load<$a> for $x {
            #[inline(always)]
            fn load(self) -> $a {
                self as $a
            }
        }
    )*};
}
load_as!(f32: f32);
load_as!(f64: f64);
load_as!(i64: i64, i32, i8, u8);

impl Load<i64> for bool {
    #[inline(always)]
    fn load(self) -> i64 {
        self as i64
    }
}

impl Load<f32> for bf16 {
    #[inline(always)]
    fn load(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

impl Load<f32> for f16 {
    #[inline(always)]
    fn load(self) -> f32 {
        f16_to_f32(self.to_bits())
    }
}

/// IEEE half to single precision, exactly and without branches (so loops over it vectorise;
/// the `half` crate's software path branches).
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    // Normal numbers: rebias the exponent from 15 to 127.
    let normal = (em << 13) + (112 << 23);
    // Infinities and NaNs keep their payload under an all-ones exponent.
    let special = (em << 13) | 0x7f80_0000;
    // Zeros and subnormals are `em * 2^-24`, exact in f32.
    let small = ((em as f32) * f32::from_bits(0x3380_0000)).to_bits();
    let bits = if em >= 0x7c00 {
        special
    } else if em < 0x0400 {
        small
    } else {
        normal
    };
    f32::from_bits(bits | sign)
}

/// True for non-zero elements (NaN included), as a cast to bool.
pub(crate) trait Truthy: Copy + Send + Sync + 'static {
    fn truthy(self) -> bool;
}

macro_rules! truthy_ne {
    ($($x:ty: $zero:expr),*) => {$(
        impl Truthy for $x {
            #[inline(always)]
            fn truthy(self) -> bool {
                self != $zero
            }
        }
    )*};
}
truthy_ne!(f32: 0.0, f64: 0.0, i64: 0, i32: 0, i8: 0, u8: 0, bool: false);

impl Truthy for bf16 {
    #[inline(always)]
    fn truthy(self) -> bool {
        self.to_bits() & 0x7fff != 0
    }
}

impl Truthy for f16 {
    #[inline(always)]
    fn truthy(self) -> bool {
        self.to_bits() & 0x7fff != 0
    }
}

// ---- what a reduction does to each element ---------------------------------------------------

/// A reduction: accumulators start at `identity`, take elements with `step` (given the output
/// element's parameter `p`: the center of a variance or logsumexp, `()` for most) and combine
/// with `merge`.
pub(crate) trait RedOp: Sync {
    type X: Copy + Send + Sync;
    type A: Copy + Send + Sync;
    type P: Copy + Send + Sync;
    fn identity(&self) -> Self::A;
    fn step(&self, acc: Self::A, x: Self::X, p: Self::P) -> Self::A;
    fn merge(&self, a: Self::A, b: Self::A) -> Self::A;

    /// `out[r]` = the fold of row `r` of `x` (see [`rows`]); ops with hand-written loops
    /// replace it, keeping the order of [`rows`].
    fn rows(&self, x: &[Self::X], len: usize, ps: &[Self::P], out: &mut [Self::A])
    where
        Self: Sized,
    {
        rows(self, x, len, ps, out)
    }

    /// Folds rows of `x` into one accumulator per column (see [`cols`]); ops with
    /// hand-written loops replace it, keeping the order of [`cols`].
    fn cols(&self, x: &[Self::X], stride: usize, rows: usize, acc: &mut [Self::A], ps: &[Self::P])
    where
        Self: Sized,
    {
        cols(self, x, stride, rows, acc, ps)
    }
}

/// The value an element contributes.
pub(crate) trait Map: Sync {
    type X: Copy + Send + Sync;
    type A: Acc;
    type P: Copy + Send + Sync;
    fn map(&self, x: Self::X, p: Self::P) -> Self::A;
}

/// The element itself.
pub(crate) struct Plain<X, A>(PhantomData<fn(X) -> A>);

/// The element itself, read from storage type `X` into accumulator type `A`.
pub(crate) fn plain<X: Load<A>, A: Acc>() -> Plain<X, A> {
    Plain(PhantomData)
}

impl<X: Load<A>, A: Acc> Map for Plain<X, A> {
    type X = X;
    type A = A;
    type P = ();
    #[inline(always)]
    fn map(&self, x: X, _: ()) -> A {
        x.load()
    }
}

/// Defines each float [`Map`] `$name` over `A`, with parameter `$c` of type `$p` (the unit,
/// or `A` for a per-output value) and value `$body`.
macro_rules! float_map {
    ($($(#[$doc:meta])* $name:ident = |$x:ident, $c:tt: $p:ty| $body:expr;)*) => {
        $(
            $(#[$doc])*
            pub(crate) struct $name<A>(pub PhantomData<fn(A) -> A>);

            impl<A: FloatAcc> Map for $name<A> {
                type X = A;
                type A = A;
                type P = $p;
                #[inline(always)]
                fn map(&self, $x: A, $c: $p) -> A {
                    $body
                }
            }
        )*
    };
}

float_map! {
    /// `x * x`.
    Square = |x, _: ()| Acc::mul(x, x);
    /// `|x|`.
    Magnitude = |x, _: ()| Acc::abs(x);
    /// 1 for non-zero elements (NaN included), else 0.
    NonZero = |x, _: ()| {
        if x != <A as Acc>::ZERO {
            <A as Acc>::ONE
        } else {
            <A as Acc>::ZERO
        }
    };
    /// `(x - c)^2`, `c` the output element's mean.
    SquaredDeviation = |x, c: A| {
        let d = x - c;
        Acc::mul(d, d)
    };
    /// `e^(x - c)`, `c` the output element's center.
    ExpDeviation = |x, c: A| (x - c).fexp();
}

/// `|x|^p` (a library call per element: not vectorised).
pub(crate) struct PowMagnitude<A>(pub A);

impl<A: FloatAcc> Map for PowMagnitude<A> {
    type X = A;
    type A = A;
    type P = ();
    #[inline(always)]
    fn map(&self, x: A, _: ()) -> A {
        Acc::abs(x).powf(self.0)
    }
}

/// Defines each [`RedOp`] `$name` folding `M`'s values from `$identity` with `$combine`.
macro_rules! map_fold {
    ($($(#[$doc:meta])* $name:ident = ($identity:ident, $combine:ident);)*) => {
        $(
            $(#[$doc])*
            pub(crate) struct $name<M>(pub M);

            impl<M: Map> RedOp for $name<M> {
                type X = M::X;
                type A = M::A;
                type P = M::P;
                #[inline(always)]
                fn identity(&self) -> M::A {
                    M::A::$identity
                }
                #[inline(always)]
                fn step(&self, acc: M::A, x: M::X, p: M::P) -> M::A {
                    acc.$combine(self.0.map(x, p))
                }
                #[inline(always)]
                fn merge(&self, a: M::A, b: M::A) -> M::A {
                    a.$combine(b)
                }
            }
        )*
    };
}

map_fold! {
    /// The sum of `M`'s values.
    Sum = (ZERO, add);
    /// The product of `M`'s values.
    Prod = (ONE, mul);
}

/// The maximum (`MAX`) or minimum of `M`'s values; NaN propagates.
pub(crate) struct Extreme<M, const MAX: bool>(pub M);

/// `b` if it beats `a` or is NaN, else `a`: NaN, once in, stays (nothing beats it and a NaN
/// replacing a NaN is still NaN).
#[inline(always)]
fn extreme<A: Acc, const MAX: bool>(a: A, b: A) -> A {
    let beats = if MAX { b > a } else { b < a };
    if beats | b.nan() { b } else { a }
}

impl<M: Map, const MAX: bool> RedOp for Extreme<M, MAX> {
    type X = M::X;
    type A = M::A;
    type P = M::P;
    #[inline(always)]
    fn identity(&self) -> M::A {
        if MAX { M::A::LOWEST } else { M::A::HIGHEST }
    }
    #[inline(always)]
    fn step(&self, acc: M::A, x: M::X, p: M::P) -> M::A {
        extreme::<M::A, MAX>(acc, self.0.map(x, p))
    }
    #[inline(always)]
    fn merge(&self, a: M::A, b: M::A) -> M::A {
        extreme::<M::A, MAX>(a, b)
    }
}

/// All (`ALL`) or any of the elements non-zero.
pub(crate) struct Logic<X, const ALL: bool>(pub PhantomData<fn(X)>);

impl<X: Truthy, const ALL: bool> RedOp for Logic<X, ALL> {
    type X = X;
    type A = bool;
    type P = ();
    #[inline(always)]
    fn identity(&self) -> bool {
        ALL
    }
    #[inline(always)]
    fn step(&self, acc: bool, x: X, _: ()) -> bool {
        self.merge(acc, x.truthy())
    }
    #[inline(always)]
    fn merge(&self, a: bool, b: bool) -> bool {
        if ALL { a & b } else { a | b }
    }
}

// ---- the generic loops -----------------------------------------------------------------------

/// Accumulators per contiguous run (the compiler maps them onto vector registers).
pub(crate) const LANES: usize = 32;
/// Elements per block of a contiguous run; block results combine pairwise.
pub(crate) const BLOCK: usize = 1024;

/// Pairwise combination of a sequence of partial results, as a binary counter: slot `k` holds
/// the combination of `2^k` consecutive values while bit `k` of the count is set. Combining
/// is always `merge(older, newer)`, so the result depends only on the sequence, and a sequence
/// cut into runs of `2^k` values (the last may be shorter) combines to the same result when
/// each run's own result is pushed in turn.
pub(crate) struct Counter<A> {
    slots: [A; 48],
    n: u64,
}

impl<A: Copy> Counter<A> {
    #[inline(always)]
    pub(crate) fn new(fill: A) -> Counter<A> {
        Counter {
            slots: [fill; 48],
            n: 0,
        }
    }

    #[inline(always)]
    pub(crate) fn push(&mut self, mut v: A, merge: impl Fn(A, A) -> A) {
        let mut k = 0;
        while self.n >> k & 1 == 1 {
            v = merge(self.slots[k], v);
            k += 1;
        }
        self.slots[k] = v;
        self.n += 1;
    }

    /// The combination of everything pushed (newest runs first), or `None`.
    #[inline(always)]
    pub(crate) fn finish(&self, merge: impl Fn(A, A) -> A) -> Option<A> {
        let mut acc: Option<A> = None;
        for k in 0..48 {
            if self.n >> k & 1 == 1 {
                acc = Some(match acc {
                    None => self.slots[k],
                    Some(a) => merge(self.slots[k], a),
                });
            }
        }
        acc
    }
}

/// One block: `LANES` accumulators and the halving tree, or a sequential fold when the block
/// is shorter than `LANES`.
#[inline(always)]
fn fold_block<O: RedOp>(op: &O, blk: &[O::X], p: O::P) -> O::A {
    if blk.len() < LANES {
        let mut a = op.identity();
        for &v in blk {
            a = op.step(a, v, p);
        }
        return a;
    }
    let mut acc = [op.identity(); LANES];
    let (chunks, rest) = blk.as_chunks::<LANES>();
    for c in chunks {
        for l in 0..LANES {
            acc[l] = op.step(acc[l], c[l], p);
        }
    }
    for (a, &v) in acc.iter_mut().zip(rest) {
        *a = op.step(*a, v, p);
    }
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            acc[l] = op.merge(acc[l], acc[l + w]);
        }
    }
    acc[0]
}

#[inline(always)]
fn fold_run<O: RedOp>(op: &O, x: &[O::X], p: O::P) -> O::A {
    blocks_pairwise(
        x,
        op.identity(),
        |a, b| op.merge(a, b),
        |blk| fold_block(op, blk, p),
    )
}

/// Folds `x` block by block (blocks of [`BLOCK`]) with `block`, combining the block results
/// pairwise with `merge`.
#[inline(always)]
fn blocks_pairwise<X, A: Copy>(
    x: &[X],
    identity: A,
    merge: impl Fn(A, A) -> A,
    block: impl Fn(&[X]) -> A,
) -> A {
    if x.len() <= BLOCK {
        return block(x);
    }
    let mut c = Counter::new(identity);
    for blk in x.chunks(BLOCK) {
        c.push(block(blk), &merge);
    }
    c.finish(&merge).unwrap_or(identity)
}

#[inline(always)]
fn rows_body<O: RedOp>(op: &O, x: &[O::X], len: usize, ps: &[O::P], out: &mut [O::A]) {
    for ((o, row), &p) in out.iter_mut().zip(x.chunks_exact(len)).zip(ps) {
        *o = fold_run(op, row, p);
    }
}

#[inline(always)]
fn cols_body<O: RedOp>(
    op: &O,
    x: &[O::X],
    stride: usize,
    rows: usize,
    acc: &mut [O::A],
    ps: &[O::P],
) {
    let w = acc.len();
    let ps = &ps[..w];
    let row = |r: usize| &x[r * stride..r * stride + w];
    let mut r = 0;
    while r + 4 <= rows {
        let (x0, x1, x2, x3) = (row(r), row(r + 1), row(r + 2), row(r + 3));
        for (((((a, &v0), &v1), &v2), &v3), &p) in
            acc.iter_mut().zip(x0).zip(x1).zip(x2).zip(x3).zip(ps)
        {
            let mut s = *a;
            s = op.step(s, v0, p);
            s = op.step(s, v1, p);
            s = op.step(s, v2, p);
            s = op.step(s, v3, p);
            *a = s;
        }
        r += 4;
    }
    while r < rows {
        for ((a, &v), &p) in acc.iter_mut().zip(row(r)).zip(ps) {
            *a = op.step(*a, v, p);
        }
        r += 1;
    }
}

// ---- hand-vectorised f32 sums and extremes ---------------------------------------------------
//
// The compiler turns the generic lane loops above into narrow vector code for these, so the
// contiguous f32 sum, max and min have AVX-512 loops of their own. They keep the generic order
// exactly (the [`LANES`] lanes, the same tail lanes and halving tree), so every build gives the
// same sums; a max or min gives the same value too, except that a NaN comes out as the
// canonical NaN.

/// The sum of f32 elements, with hand-written AVX-512 row loops.
pub(crate) struct SumF32;

impl RedOp for SumF32 {
    type X = f32;
    type A = f32;
    type P = ();
    #[inline(always)]
    fn identity(&self) -> f32 {
        0.0
    }
    #[inline(always)]
    fn step(&self, acc: f32, x: f32, _: ()) -> f32 {
        acc + x
    }
    #[inline(always)]
    fn merge(&self, a: f32, b: f32) -> f32 {
        a + b
    }
    fn rows(&self, x: &[f32], len: usize, ps: &[()], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if isa::level() == Level::Avx512 {
            // SAFETY: `isa::level` returns `Avx512` only when the CPU has AVX-512 F, BW, DQ,
            // VL, AVX2 and FMA, every feature `f32_rows_avx512` enables.
            unsafe { f32_rows_avx512::<0>(x, len, out) };
            return;
        }
        rows(self, x, len, ps, out)
    }
}

/// The maximum (`MAX`) or minimum of f32 elements, NaN propagating, with hand-written AVX-512
/// row loops.
pub(crate) struct ExtremeF32<const MAX: bool>;

impl<const MAX: bool> RedOp for ExtremeF32<MAX> {
    type X = f32;
    type A = f32;
    type P = ();
    #[inline(always)]
    fn identity(&self) -> f32 {
        if MAX {
            f32::NEG_INFINITY
        } else {
            f32::INFINITY
        }
    }
    #[inline(always)]
    fn step(&self, acc: f32, x: f32, _: ()) -> f32 {
        extreme::<f32, MAX>(acc, x)
    }
    #[inline(always)]
    fn merge(&self, a: f32, b: f32) -> f32 {
        extreme::<f32, MAX>(a, b)
    }
    fn rows(&self, x: &[f32], len: usize, ps: &[()], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if isa::level() == Level::Avx512 {
            // SAFETY: as for `SumF32::rows`.
            unsafe {
                if MAX {
                    f32_rows_avx512::<1>(x, len, out)
                } else {
                    f32_rows_avx512::<2>(x, len, out)
                }
            };
            return;
        }
        rows(self, x, len, ps, out)
    }
    fn cols(&self, x: &[f32], stride: usize, rows: usize, acc: &mut [f32], ps: &[()]) {
        #[cfg(target_arch = "x86_64")]
        if isa::level() == Level::Avx512 {
            // SAFETY: as for `SumF32::rows`.
            unsafe { extreme_cols_avx512::<MAX>(x, stride, rows, acc) };
            return;
        }
        cols(self, x, stride, rows, acc, ps)
    }
}

/// [`cols`] for [`ExtremeF32`]: the same step, `x > a || x is NaN ? x : a`, per column.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn extreme_cols_avx512<const MAX: bool>(x: &[f32], stride: usize, rows: usize, acc: &mut [f32]) {
    use std::arch::x86_64::*;
    let w = acc.len();
    let step = |a: __m512, v: __m512| {
        let m = if MAX {
            _mm512_max_ps(v, a)
        } else {
            _mm512_min_ps(v, a)
        };
        _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v), v)
    };
    let mut r = 0;
    while r < rows {
        // Four rows a pass; a short last pass repeats its last row, which changes nothing (the
        // step is idempotent).
        let n = (rows - r).min(4);
        let row = |i: usize| {
            let at = (r + i.min(n - 1)) * stride;
            &x[at..at + w]
        };
        let (x0, x1, x2, x3) = (row(0), row(1), row(2), row(3));
        let mut c = 0;
        while c + 16 <= w {
            // SAFETY: lanes `c..c + 16` lie inside `acc` and each row (all `w` long).
            unsafe {
                let mut a = _mm512_loadu_ps(acc.as_ptr().add(c));
                a = step(a, _mm512_loadu_ps(x0.as_ptr().add(c)));
                a = step(a, _mm512_loadu_ps(x1.as_ptr().add(c)));
                a = step(a, _mm512_loadu_ps(x2.as_ptr().add(c)));
                a = step(a, _mm512_loadu_ps(x3.as_ptr().add(c)));
                _mm512_storeu_ps(acc.as_mut_ptr().add(c), a);
            }
            c += 16;
        }
        if c < w {
            let k = mask16(w - c);
            // SAFETY: the masked loads and store touch only lanes `c..w`, inside `acc` and
            // each row (all `w` long); other lanes are neither read nor written.
            unsafe {
                let mut a = _mm512_maskz_loadu_ps(k, acc.as_ptr().add(c));
                a = step(a, _mm512_maskz_loadu_ps(k, x0.as_ptr().add(c)));
                a = step(a, _mm512_maskz_loadu_ps(k, x1.as_ptr().add(c)));
                a = step(a, _mm512_maskz_loadu_ps(k, x2.as_ptr().add(c)));
                a = step(a, _mm512_maskz_loadu_ps(k, x3.as_ptr().add(c)));
                _mm512_mask_storeu_ps(acc.as_mut_ptr().add(c), k, a);
            }
        }
        r += n;
    }
}

/// Rows of f32: `KIND` 0 sums, 1 takes the maximum, 2 the minimum.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn f32_rows_avx512<const KIND: u8>(x: &[f32], len: usize, out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(x.chunks_exact(len)) {
        *o = match KIND {
            0 => blocks_pairwise(row, 0.0, |a, b| a + b, |b| f32_block_avx512::<0>(b)),
            1 => blocks_pairwise(row, f32::NEG_INFINITY, extreme::<f32, true>, |b| {
                f32_block_avx512::<1>(b)
            }),
            _ => blocks_pairwise(row, f32::INFINITY, extreme::<f32, false>, |b| {
                f32_block_avx512::<2>(b)
            }),
        };
    }
}

/// One block of [`f32_rows_avx512`], in the order of [`fold_block`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn f32_block_avx512<const KIND: u8>(blk: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    if blk.len() < LANES {
        return match KIND {
            0 => fold_block(&SumF32, blk, ()),
            1 => fold_block(&ExtremeF32::<true>, blk, ()),
            _ => fold_block(&ExtremeF32::<false>, blk, ()),
        };
    }
    // `_mm512_max_ps(x, a)` is `x > a ? x : a` (and min likewise), the generic step except
    // that a NaN `x` is dropped; `nan` notes those lanes instead.
    let step = |a: __m512, v: __m512| match KIND {
        0 => _mm512_add_ps(a, v),
        1 => _mm512_max_ps(v, a),
        _ => _mm512_min_ps(v, a),
    };
    let masked_step = |a: __m512, k: __mmask16, v: __m512| match KIND {
        0 => _mm512_mask_add_ps(a, k, a, v),
        1 => _mm512_mask_max_ps(a, k, v, a),
        _ => _mm512_mask_min_ps(a, k, v, a),
    };
    let id = match KIND {
        0 => 0.0,
        1 => f32::NEG_INFINITY,
        _ => f32::INFINITY,
    };
    // The main loop keeps the 32 lanes in four 256-bit registers, the tail and the tree in two
    // 512-bit ones. On a Zen 4 VM, 256-bit loads and adds stream from memory faster: a sum over
    // 4096 rows of 4096 ran 25-30 % faster on one thread (5-10 % on two, where both threads
    // share the memory's bandwidth). Each lane's chain of steps is unchanged, so the bits are.
    let step8 = |a: __m256, v: __m256| match KIND {
        0 => _mm256_add_ps(a, v),
        1 => _mm256_max_ps(v, a),
        _ => _mm256_min_ps(v, a),
    };
    let mut q = [_mm256_set1_ps(id); 4];
    let mut nan8: __mmask8 = 0;
    let (chunks, rest) = blk.as_chunks::<LANES>();
    for c in chunks {
        let (lo, hi) = c.split_at(16);
        let ((l0, l1), (h0, h1)) = (lo.split_at(8), hi.split_at(8));
        // SAFETY: each of `l0`, `l1`, `h0`, `h1` holds 8 f32, the width of an unaligned
        // 256-bit load.
        let v = unsafe {
            [
                _mm256_loadu_ps(l0.as_ptr()),
                _mm256_loadu_ps(l1.as_ptr()),
                _mm256_loadu_ps(h0.as_ptr()),
                _mm256_loadu_ps(h1.as_ptr()),
            ]
        };
        for (a, v) in q.iter_mut().zip(v) {
            *a = step8(*a, v);
        }
        if KIND != 0 {
            nan8 |= _mm256_cmp_ps_mask::<_CMP_UNORD_Q>(v[0], v[2])
                | _mm256_cmp_ps_mask::<_CMP_UNORD_Q>(v[1], v[3]);
        }
    }
    let join = |lo: __m256, hi: __m256| _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi);
    let (mut a0, mut a1) = (join(q[0], q[1]), join(q[2], q[3]));
    let mut nan = __mmask16::from(nan8);
    // The tail goes to the first lanes, as in the generic loop.
    let (r0, r1) = rest.split_at(rest.len().min(16));
    let (k0, k1) = (mask16(r0.len()), mask16(r1.len()));
    // SAFETY: masked loads touch only the first `len` elements of each slice (lanes outside
    // the mask are neither read nor faulted on).
    let (v0, v1) = unsafe {
        (
            _mm512_maskz_loadu_ps(k0, r0.as_ptr()),
            _mm512_maskz_loadu_ps(k1, r1.as_ptr()),
        )
    };
    a0 = masked_step(a0, k0, v0);
    a1 = masked_step(a1, k1, v1);
    if KIND != 0 {
        nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v0, v1);
        if nan != 0 {
            return f32::NAN;
        }
    }
    // The halving tree: lane `l` with lane `l + w`, `merge(low, high)`.
    let s = step(a0, a1);
    let s8 = {
        let (lo, hi) = (_mm512_castps512_ps256(s), _mm512_extractf32x8_ps::<1>(s));
        match KIND {
            0 => _mm256_add_ps(lo, hi),
            1 => _mm256_max_ps(hi, lo),
            _ => _mm256_min_ps(hi, lo),
        }
    };
    let s4 = {
        let (lo, hi) = (_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        match KIND {
            0 => _mm_add_ps(lo, hi),
            1 => _mm_max_ps(hi, lo),
            _ => _mm_min_ps(hi, lo),
        }
    };
    let hi2 = _mm_movehl_ps(s4, s4);
    let s2 = match KIND {
        0 => _mm_add_ps(s4, hi2),
        1 => _mm_max_ps(hi2, s4),
        _ => _mm_min_ps(hi2, s4),
    };
    let hi1 = _mm_movehdup_ps(s2);
    let s1 = match KIND {
        0 => _mm_add_ss(s2, hi1),
        1 => _mm_max_ss(hi1, s2),
        _ => _mm_min_ss(hi1, s2),
    };
    _mm_cvtss_f32(s1)
}

/// The mask of the first `n` (at most 16) lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn mask16(n: usize) -> u16 {
    ((1u32 << n) - 1) as u16
}

// ---- arg max / arg min -----------------------------------------------------------------------

/// Accumulators that also track where their value came from, in an index type of their own
/// width (so value and index lanes vectorise together).
pub(crate) trait ArgAcc: Acc {
    type I: Copy + Send + Sync + PartialEq + 'static;
    fn index(i: usize) -> Self::I;
    fn position(i: Self::I) -> usize;
}

/// Implements [`ArgAcc`] for each accumulator `$t`, with positions kept as `$i`: 32 bits
/// for f32, whose lanes are 32 bits wide, 64 otherwise.
macro_rules! arg_acc {
    ($($t:ty: $i:ty),*) => {$(
        impl ArgAcc for $t {
            type I = $i;
            #[inline(always)]
            fn index(i: usize) -> $i {
                i as $i
            }
            #[inline(always)]
            fn position(i: $i) -> usize {
                i as usize
            }
        }
    )*};
}
arg_acc!(f32: u32, f64: u64, i64: u64);

/// True when `b` (seen after `a` in its lane) replaces `a`: it beats it, or it is the first NaN.
#[inline(always)]
fn takes<A: Acc, const MAX: bool>(a: A, b: A) -> bool {
    let beats = if MAX { b > a } else { b < a };
    beats | (b.nan() & !a.nan())
}

/// The winner of two (value, index) candidates in any order: NaN first, then the extreme
/// value, then the lower index.
#[inline(always)]
pub(crate) fn arg_merge<A: Acc, const MAX: bool>(a: (A, usize), b: (A, usize)) -> (A, usize) {
    let (an, bn) = (a.0.nan(), b.0.nan());
    let b_wins = if an || bn {
        bn && (!an || b.1 < a.1)
    } else {
        let better = if MAX { b.0 > a.0 } else { b.0 < a.0 };
        better || (b.0 == a.0 && b.1 < a.1)
    };
    if b_wins { b } else { a }
}

/// Segments of a run short enough for the lane indices.
const ARG_SEGMENT: usize = 1 << 30;

#[inline(always)]
fn arg_run<X: Load<A>, A: ArgAcc, const MAX: bool>(x: &[X]) -> (A, usize) {
    let mut best: Option<(A, usize)> = None;
    for (s, seg) in x.chunks(ARG_SEGMENT).enumerate() {
        let (v, i) = arg_segment::<X, A, MAX>(seg);
        let c = (v, i + s * ARG_SEGMENT);
        best = Some(match best {
            None => c,
            Some(b) => arg_merge::<A, MAX>(b, c),
        });
    }
    best.unwrap_or((A::ZERO, 0))
}

#[inline(always)]
fn arg_segment<X: Load<A>, A: ArgAcc, const MAX: bool>(x: &[X]) -> (A, usize) {
    let (chunks, rest) = x.as_chunks::<LANES>();
    let mut best: Option<(A, usize)> = None;
    if let Some((first, more)) = chunks.split_first() {
        let mut v: [A; LANES] = first.map(|e| e.load());
        let mut at = [A::index(0); LANES];
        for (ci, c) in more.iter().enumerate() {
            let here = A::index(ci + 1);
            for l in 0..LANES {
                let b = c[l].load();
                let t = takes::<A, MAX>(v[l], b);
                v[l] = if t { b } else { v[l] };
                at[l] = if t { here } else { at[l] };
            }
        }
        for l in 0..LANES {
            let c = (v[l], A::position(at[l]) * LANES + l);
            best = Some(match best {
                None => c,
                Some(b) => arg_merge::<A, MAX>(b, c),
            });
        }
    }
    let base = chunks.len() * LANES;
    for (k, &e) in rest.iter().enumerate() {
        let c = (e.load(), base + k);
        best = Some(match best {
            None => c,
            Some(b) => arg_merge::<A, MAX>(b, c),
        });
    }
    best.unwrap_or((A::ZERO, 0))
}

#[inline(always)]
fn arg_rows_body<X: Load<A>, A: ArgAcc, const MAX: bool>(
    x: &[X],
    len: usize,
    vals: &mut [A],
    idx: &mut [i64],
) {
    for ((v, i), row) in vals.iter_mut().zip(idx.iter_mut()).zip(x.chunks_exact(len)) {
        let (bv, bi) = arg_run::<X, A, MAX>(row);
        *v = bv;
        *i = bi as i64;
    }
}

/// Rows `1..rows` (row 0 seeded `vals` and `at`), `at` counting rows from 0.
#[inline(always)]
fn arg_cols_body<X: Load<A>, A: ArgAcc, const MAX: bool>(
    x: &[X],
    stride: usize,
    rows: usize,
    vals: &mut [A],
    at: &mut [A::I],
) {
    let w = vals.len();
    let at = &mut at[..w];
    for r in 1..rows {
        let here = A::index(r);
        let row = &x[r * stride..r * stride + w];
        for ((v, i), &e) in vals.iter_mut().zip(at.iter_mut()).zip(row) {
            let b = e.load();
            let t = takes::<A, MAX>(*v, b);
            *v = if t { b } else { *v };
            *i = if t { here } else { *i };
        }
    }
}

// ---- the entry points, one build per instruction set ------------------------------------------

/// Declares `$name`, which runs `$body` in the build for the current [`isa::level`].
macro_rules! multiversion {
    (
        $(#[$doc:meta])*
        fn $name:ident / $v512:ident / $v256:ident
            <$($g:ident $(: $b:path)?),* $(; const $c:ident: bool)?>
            ($($a:ident: $t:ty),*) = $body:ident
    ) => {
        $(#[$doc])*
        pub(crate) fn $name<$($g $(: $b)?),* $(, const $c: bool)?>($($a: $t),*) {
            #[cfg(target_arch = "x86_64")]
            match isa::level() {
                Level::Avx512 => {
                    // SAFETY: `isa::level` returns `Avx512` only when the CPU has AVX-512 F,
                    // BW, DQ, VL, AVX2 and FMA, every feature this build enables.
                    return unsafe { $v512::<$($g),* $(, $c)?>($($a),*) };
                }
                Level::Avx2 => {
                    // SAFETY: `isa::level` returns `Avx2` only when the CPU has AVX2
                    // and FMA, the features this build enables.
                    return unsafe { $v256::<$($g),* $(, $c)?>($($a),*) };
                }
                Level::Portable => {}
            }
            $body::<$($g),* $(, $c)?>($($a),*)
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
        fn $v512<$($g $(: $b)?),* $(, const $c: bool)?>($($a: $t),*) {
            $body::<$($g),* $(, $c)?>($($a),*)
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        fn $v256<$($g $(: $b)?),* $(, const $c: bool)?>($($a: $t),*) {
            $body::<$($g),* $(, $c)?>($($a),*)
        }
    };
}

multiversion! {
    /// `out[r]` = the fold of row `r` of `x` (rows of `len` elements, contiguous), given the
    /// row's parameter `ps[r]`.
    fn rows / rows_avx512 / rows_avx2 <O: RedOp>(
        op: &O, x: &[O::X], len: usize, ps: &[O::P], out: &mut [O::A]
    ) = rows_body
}

multiversion! {
    /// Folds rows `0..rows` of `x` (row `r` at `x[r * stride..]`) into `acc`, one accumulator
    /// per column, each in row order; `ps` holds the columns' parameters.
    fn cols / cols_avx512 / cols_avx2 <O: RedOp>(
        op: &O, x: &[O::X], stride: usize, rows: usize, acc: &mut [O::A], ps: &[O::P]
    ) = cols_body
}

multiversion! {
    /// The first extreme element of each row of `x` (NaN first) and its index in the row.
    fn arg_rows / arg_rows_avx512 / arg_rows_avx2 <X: Load<A>, A: ArgAcc; const MAX: bool>(
        x: &[X], len: usize, vals: &mut [A], idx: &mut [i64]
    ) = arg_rows_body
}

multiversion! {
    /// Continues the column extremes in `vals` (row 0 already taken, with `at` = 0) over rows
    /// `1..rows`; `at` gets the row of each column's first extreme.
    fn arg_cols / arg_cols_avx512 / arg_cols_avx2 <X: Load<A>, A: ArgAcc; const MAX: bool>(
        x: &[X], stride: usize, rows: usize, vals: &mut [A], at: &mut [A::I]
    ) = arg_cols_body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact_for_every_value() {
        for bits in 0..=u16::MAX {
            let want = f16::from_bits(bits).to_f32();
            let got = f16_to_f32(bits);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{bits:#06x}: got {got:e}, want {want:e}"
            );
        }
    }

    /// Values whose sums round, so that a changed order changes the bits: full mantissas over
    /// eight binades, both signs.
    fn rounding_values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let m = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                m * (1u32 << ((s >> 20) % 8)) as f32
            })
            .collect()
    }

    #[test]
    fn hand_written_f32_rows_keep_the_generic_order() {
        for len in [
            1, 7, 31, 32, 33, 63, 65, 100, 257, 1023, 1024, 1025, 2049, 4096, 5000,
        ] {
            let rows = 3;
            let x = rounding_values(rows * len, len as u64);
            let ps = vec![(); rows];
            let check = |name: &str, fast: &dyn Fn(&mut [f32]), slow: &dyn Fn(&mut [f32])| {
                let (mut a, mut b) = (vec![0.0; rows], vec![0.0; rows]);
                fast(&mut a);
                slow(&mut b);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "{name}, rows of {len}");
            };
            check("sum", &|o| SumF32.rows(&x, len, &ps, o), &|o| {
                rows_body(&SumF32, &x, len, &ps, o)
            });
            check("max", &|o| ExtremeF32::<true>.rows(&x, len, &ps, o), &|o| {
                rows_body(&ExtremeF32::<true>, &x, len, &ps, o)
            });
            check(
                "min",
                &|o| ExtremeF32::<false>.rows(&x, len, &ps, o),
                &|o| rows_body(&ExtremeF32::<false>, &x, len, &ps, o),
            );
        }
    }

    #[test]
    fn counter_of_runs_matches_counter_of_values() {
        let vals: Vec<f64> = (0..37).map(|i| 1.0 / (i as f64 + 0.7)).collect();
        let merge = |a: f64, b: f64| a + b * 1.0001;
        let mut all = Counter::new(0.0);
        for &v in &vals {
            all.push(v, merge);
        }
        for run in [1, 2, 4, 8, 16] {
            let mut outer = Counter::new(0.0);
            for chunk in vals.chunks(run) {
                let mut c = Counter::new(0.0);
                for &v in chunk {
                    c.push(v, merge);
                }
                outer.push(c.finish(merge).unwrap_or(0.0), merge);
            }
            assert_eq!(outer.finish(merge), all.finish(merge), "runs of {run}");
        }
    }
}
