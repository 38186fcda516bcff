//! AVX-512 building blocks of the matrix products: packing routines, the f32 (FMA) and bf16
//! (`vdpbf16ps`) micro-kernels with their epilogue, and matrix-vector kernels.
//!
//! Every function here is `unsafe`: callers (the driver in `gemm.rs`) must have checked that
//! the processor has the features named in its `#[target_feature]` (see
//! [`crate::cpu::isa::level`]) and that every pointer, with the strides and counts passed, stays inside its allocation.

use std::arch::x86_64::*;

use super::{Elem, Kind};

/// Rows of the register tile.
pub(super) const MR: usize = 12;
/// Columns of the register tile (two vectors of 16 f32).
pub(super) const NR: usize = 32;
/// Rows of the bf16 kernels' tiles ([`kernel_bf16`], [`kernel_bf16_taps`]): 28 accumulators,
/// the two vectors of `b` and a broadcast fill the 32 registers, so each step's loads and loop
/// work are shared by more products than 12 rows give (measured: the implicit bf16 convolution
/// 19.0 → 18.6 ms; bf16 products level within this machine's noise).
pub(super) const MR_BF16: usize = 14;

/// Lanes `0..n` of a 16-lane mask.
#[inline(always)]
pub(super) fn mask16(n: usize) -> u16 {
    if n >= 16 { u16::MAX } else { (1u16 << n) - 1 }
}

/// Lanes `0..n` of a 32-lane mask.
#[inline(always)]
fn mask32(n: usize) -> u32 {
    if n >= 32 { u32::MAX } else { (1u32 << n) - 1 }
}

/// Where the epilogue of a micro-kernel reads (to add) or writes a tile: element `(i, j)` at
/// `ptr + i * ld + j`.
#[derive(Clone, Copy, Debug)]
pub(super) enum Io {
    /// Nothing to add.
    None,
    /// f32 elements.
    F32(*mut f32, usize),
    /// bf16 elements (bits).
    Bf16(*mut u16, usize),
    /// f16 elements (bits).
    F16(*mut u16, usize),
    /// f32 elements `w` (read only): the tile becomes `w + alpha * c`, the accumulators
    /// scaled first (a product, then a sum: the bits of the two ops run apart).
    F32Scaled(*mut f32, usize, f32),
    /// f32 elements of a matrix stored transposed: element `(i, j)` of the tile at
    /// `ptr + j * ld + i` (a product computed as `(b^T · a^T)^T`, see `gemm`).
    F32T(*mut f32, usize),
}

impl Io {
    /// The same tile `rows` rows further down.
    pub(super) fn down(self, rows: usize) -> Io {
        match self {
            Io::None => Io::None,
            Io::F32(p, ld) => Io::F32(p.wrapping_add(rows * ld), ld),
            Io::Bf16(p, ld) => Io::Bf16(p.wrapping_add(rows * ld), ld),
            Io::F16(p, ld) => Io::F16(p.wrapping_add(rows * ld), ld),
            Io::F32Scaled(p, ld, alpha) => Io::F32Scaled(p.wrapping_add(rows * ld), ld, alpha),
            Io::F32T(p, ld) => Io::F32T(p.wrapping_add(rows), ld),
        }
    }

    /// Starts loading rows `0..rows`, columns `0..nr` of this tile into L1, so a kernel's
    /// epilogue, a few thousand cycles later, does not wait on the rows of `c` (far apart in
    /// memory, so not prefetched by the hardware). Prefetches are plain SSE, on every x86-64.
    #[target_feature(enable = "sse")]
    #[inline]
    pub(super) fn prefetch(self, rows: usize, nr: usize) {
        let (p, ld, size) = match self {
            Io::None => return,
            Io::F32T(p, ld) => {
                // The tile's columns are the rows in memory: `rows` elements each.
                let last = (rows * 4 - 1) / 64 * 64;
                for j in 0..nr {
                    let col = p.cast::<i8>().wrapping_add(j * ld * 4);
                    _mm_prefetch::<_MM_HINT_T0>(col);
                    if last != 0 {
                        _mm_prefetch::<_MM_HINT_T0>(col.wrapping_add(last));
                    }
                }
                return;
            }
            Io::F32(p, ld) | Io::F32Scaled(p, ld, _) => (p.cast::<i8>(), ld, 4),
            Io::Bf16(p, ld) | Io::F16(p, ld) => (p.cast::<i8>(), ld, 2),
        };
        let last = (nr * size - 1) / 64 * 64;
        for i in 0..rows {
            // `wrapping_add` keeps the address arithmetic safe; a prefetch never faults.
            let row = p.wrapping_add(i * ld * size);
            _mm_prefetch::<_MM_HINT_T0>(row);
            if last != 0 {
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(last));
            }
        }
    }

    /// The tile of an `E` matrix at `ptr` with row stride `ld`.
    pub(super) fn of<E: Elem>(ptr: *mut E, ld: usize) -> Io {
        match E::KIND {
            Kind::F32 => Io::F32(ptr.cast(), ld),
            Kind::Bf16 => Io::Bf16(ptr.cast(), ld),
            Kind::F16 => Io::F16(ptr.cast(), ld),
        }
    }
}

/// 16 elements at `p` (lanes outside `mask` read as 0 and are not touched) as f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
#[inline]
unsafe fn load16<E: Elem>(p: *const E, mask: u16) -> __m512 {
    // SAFETY: the caller guarantees that the lanes in `mask` are readable; masked-off lanes
    // are not accessed.
    unsafe {
        match E::KIND {
            Kind::F32 => _mm512_maskz_loadu_ps(mask, p.cast()),
            Kind::F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p.cast())),
            Kind::Bf16 => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm256_maskz_loadu_epi16(mask, p.cast()),
            ))),
        }
    }
}

/// f32 lanes rounded to bf16 bits (to nearest, ties to even; NaN stays a quiet NaN), as
/// `half::bf16::from_f32` does.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
#[inline]
fn round_bf16(v: __m512) -> __m256i {
    let x = _mm512_castps_si512(v);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(1));
    let bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
    let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(x, bias));
    let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(0x40));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet))
}

/// [`round_bf16`] of two vectors at once, `lo` in words 0..16 and `hi` in words 16..32: one
/// `vcvtne2ps2bf16`, which rounds the same way but reads denormal inputs as zeros, so a pair
/// with a denormal lane takes [`round_bf16`] instead (a class test per vector; the
/// conversion, a bf16 tile's epilogue, took 9 instructions per vector in software).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16")]
#[inline]
pub(super) fn round_bf16x2(lo: __m512, hi: __m512) -> __m512i {
    // Class 0x20: denormal.
    let tiny = _mm512_fpclass_ps_mask::<0x20>(lo) | _mm512_fpclass_ps_mask::<0x20>(hi);
    if tiny == 0 {
        // SAFETY: `__m512bh` and `__m512i` are both 64 bytes of plain bits.
        unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo)) }
    } else {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(round_bf16(lo)), round_bf16(hi))
    }
}

/// Adds the lanes `mask` of `io`'s row `i`, columns `j..j + 16`, to `x`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
#[inline]
unsafe fn add_from(x: __m512, io: Io, i: usize, j: usize, mask: u16) -> __m512 {
    // SAFETY: the caller guarantees the masked lanes of row `i` from column `j` are inside
    // `io`'s matrix.
    unsafe {
        match io {
            Io::None => x,
            Io::F32(p, ld) => _mm512_add_ps(x, load16::<f32>(p.add(i * ld + j), mask)),
            Io::F32Scaled(p, ld, alpha) => _mm512_add_ps(
                load16::<f32>(p.add(i * ld + j), mask),
                _mm512_mul_ps(x, _mm512_set1_ps(alpha)),
            ),
            Io::Bf16(p, ld) => _mm512_add_ps(
                x,
                load16::<tpu_tensor::bf16>(p.add(i * ld + j).cast(), mask),
            ),
            Io::F16(p, ld) => {
                _mm512_add_ps(x, load16::<tpu_tensor::f16>(p.add(i * ld + j).cast(), mask))
            }
            Io::F32T(p, ld) => _mm512_add_ps(x, gather_t(p, ld, i, j, mask)),
        }
    }
}

/// Lanes `mask` of row `i` from column `j` of a transposed tile (`Io::F32T`), element by
/// element: out of line, so the epilogues of the other tiles stay small enough to inline
/// (the transposed tiles take [`epilogue_t`]).
#[cold]
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
unsafe fn gather_t(p: *mut f32, ld: usize, i: usize, j: usize, mask: u16) -> __m512 {
    let mut v = [0f32; 16];
    for (l, v) in v.iter_mut().enumerate() {
        if mask >> l & 1 == 1 {
            // SAFETY: the caller guarantees the masked lanes are inside the matrix.
            *v = unsafe { *p.add((j + l) * ld + i) };
        }
    }
    // SAFETY: `v` holds 16 f32.
    unsafe { _mm512_loadu_ps(v.as_ptr()) }
}

/// Stores lanes `mask` of `x` as row `i` from column `j` of a transposed tile, as
/// [`gather_t`] reads them.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
unsafe fn scatter_t(x: __m512, p: *mut f32, ld: usize, i: usize, j: usize, mask: u16) {
    let mut v = [0f32; 16];
    // SAFETY: `v` holds 16 f32.
    unsafe { _mm512_storeu_ps(v.as_mut_ptr(), x) };
    for (l, v) in v.iter().enumerate() {
        if mask >> l & 1 == 1 {
            // SAFETY: as for `gather_t`, for writing.
            unsafe { *p.add((j + l) * ld + i) = *v };
        }
    }
}

/// Stores the lanes `mask` of `x` at `p`; whole vectors without a mask, because masked
/// stores are several times slower on some processors (AMD Zen).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
#[inline]
unsafe fn store_f32(p: *mut f32, mask: u16, x: __m512) {
    // SAFETY: the caller guarantees the lanes in `mask` are writable.
    unsafe {
        if mask == u16::MAX {
            _mm512_storeu_ps(p, x)
        } else {
            _mm512_mask_storeu_ps(p, mask, x)
        }
    }
}

/// [`store_f32`] for 16 lanes of 16 bits.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
#[inline]
unsafe fn store_u16(p: *mut u16, mask: u16, x: __m256i) {
    // SAFETY: as for `store_f32`.
    unsafe {
        if mask == u16::MAX {
            _mm256_storeu_si256(p.cast(), x)
        } else {
            _mm256_mask_storeu_epi16(p.cast(), mask, x)
        }
    }
}

/// Stores the lanes `mask` of `x` to `io`'s row `i` from column `j`, rounded to its type.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
#[inline]
unsafe fn store_to(x: __m512, io: Io, i: usize, j: usize, mask: u16) {
    // SAFETY: as for `add_from`, for writing.
    unsafe {
        match io {
            Io::None => {}
            Io::F32(p, ld) | Io::F32Scaled(p, ld, _) => store_f32(p.add(i * ld + j), mask, x),
            Io::Bf16(p, ld) => store_u16(p.add(i * ld + j), mask, round_bf16(x)),
            Io::F16(p, ld) => store_u16(
                p.add(i * ld + j),
                mask,
                _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x),
            ),
            Io::F32T(p, ld) => scatter_t(x, p, ld, i, j, mask),
        }
    }
}

/// Writes the accumulators of a tile: rows `0..mr`, columns `0..nr` of `st` receive `c` plus
/// the same elements of `ld`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
#[inline]
pub(super) unsafe fn epilogue<const N: usize>(
    c: &[__m512; N],
    mr: usize,
    nr: usize,
    ld: Io,
    st: Io,
) {
    if let Io::F32T(p, ldt) = st {
        // A transposed tile adds nothing or a transposed tile of its own (the only pairings
        // `gemm` makes); any other goes element by element below.
        let addend = match ld {
            Io::None => Some(None),
            Io::F32T(lp, lld) => Some(Some((lp, lld))),
            _ => None,
        };
        if let Some(addend) = addend {
            // SAFETY: forwarded from the caller.
            unsafe { epilogue_t(c, mr, nr, addend, p, ldt) };
            return;
        }
    }
    let m0 = mask16(nr);
    let m1 = mask16(nr.saturating_sub(16));
    for i in 0..mr.min(N / 2) {
        // SAFETY: the caller guarantees the `mr` x `nr` tiles of `ld` and `st` are in bounds.
        unsafe {
            store_to(add_from(c[2 * i], ld, i, 0, m0), st, i, 0, m0);
            if m1 != 0 {
                store_to(add_from(c[2 * i + 1], ld, i, 16, m1), st, i, 16, m1);
            }
        }
    }
}

/// [`epilogue`] into a transposed f32 tile at `p` (element `(i, j)` at `p + j * ldt + i`),
/// plus the transposed tile `addend` when given: the accumulators are transposed in
/// registers, so each of the tile's columns is one store of `mr` lanes, where element by
/// element it would be `mr * nr` scattered ones.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
#[inline]
unsafe fn epilogue_t<const N: usize>(
    c: &[__m512; N],
    mr: usize,
    nr: usize,
    addend: Option<(*mut f32, usize)>,
    p: *mut f32,
    ldt: usize,
) {
    let m = mask16(mr);
    columns(c, nr, |j, x| {
        // SAFETY: the caller guarantees the `mr` x `nr` tiles at `p` and `addend` are in
        // bounds; column `j` of a transposed tile is `mr` elements from `j * ld`.
        unsafe {
            let x = match addend {
                Some((lp, lld)) => _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, lp.add(j * lld))),
                None => x,
            };
            store_f32(p.add(j * ldt), m, x);
        }
    });
}

/// Calls `store(j, column)` for the tile's columns `0..nr`, each transposed in registers into
/// one vector of its rows (lane `i` is row `i`), for the epilogues that store tiles by column.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
#[inline]
fn columns<const N: usize>(c: &[__m512; N], nr: usize, mut store: impl FnMut(usize, __m512)) {
    for half in 0..2 {
        let cols = nr.saturating_sub(16 * half).min(16);
        if cols == 0 {
            break;
        }
        let mut r = [_mm512_setzero_ps(); 16];
        for (i, r) in r.iter_mut().enumerate().take(N / 2) {
            *r = c[2 * i + half];
        }
        transpose16(&mut r);
        for (q, &x) in r.iter().enumerate().take(cols) {
            store(16 * half + q, x);
        }
    }
}

/// Runs `step(0)` .. `step(n - 1)` as a loop whose body runs at least once; false, running
/// nothing, when `n` is 0. The kernels' accumulators start as zeros in a stack array that the
/// epilogue reads: with a plain `for` loop, the path that skips it kept those zeros alive, and
/// LLVM cleared the array's 1.5 KiB with a `memset` call before every tile (14 % of a K=10
/// product). Here every path that reaches the epilogue leaves through the loop's end, whose
/// stores overwrite the whole array, so the zeros stay in registers.
#[inline(always)]
fn steps(n: usize, mut step: impl FnMut(usize)) -> bool {
    if n == 0 {
        return false;
    }
    let mut p = 0;
    loop {
        step(p);
        p += 1;
        if p == n {
            return true;
        }
    }
}

/// The f32 micro-kernel: `st[0..mr, 0..nr] = ld + a · b` over `kc` steps, where `a` is an
/// `MR`-row panel packed `[kc][MR]` and `b` an `NR`-column panel packed `[kc][NR]` (64-byte
/// aligned).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
pub(super) unsafe fn kernel_f32(
    kc: usize,
    a: *const f32,
    b: *const f32,
    mr: usize,
    nr: usize,
    ld: Io,
    st: Io,
) {
    ld.prefetch(mr.min(MR), nr);
    st.prefetch(mr.min(MR), nr);
    let mut c = [_mm512_setzero_ps(); 2 * MR];
    // SAFETY: `a` holds `kc * MR` and `b` `kc * NR` f32 (b 64-byte aligned), as the caller
    // guarantees; the epilogue's tiles are the caller's too.
    unsafe {
        let (mut a, mut b) = (a, b);
        if !steps(kc, |_| {
            let b0 = _mm512_load_ps(b);
            let b1 = _mm512_load_ps(b.add(16));
            for i in 0..MR {
                let ai = _mm512_set1_ps(*a.add(i));
                c[2 * i] = _mm512_fmadd_ps(ai, b0, c[2 * i]);
                c[2 * i + 1] = _mm512_fmadd_ps(ai, b1, c[2 * i + 1]);
            }
            a = a.add(MR);
            b = b.add(NR);
        }) {
            return epilogue(&[_mm512_setzero_ps(); 2 * MR], mr, nr, ld, st);
        }
        epilogue(&c, mr, nr, ld, st);
    }
}

/// [`kernel_f32`] reading `a` in place: row `i` at `a + i * lda`, dense along `k`. For
/// products with few column panels, where packing (transposing) `a` would cost about as
/// much as using it.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn kernel_f32_direct(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    mr: usize,
    nr: usize,
    ld: Io,
    st: Io,
) {
    ld.prefetch(mr.min(MR), nr);
    st.prefetch(mr.min(MR), nr);
    let mut c = [_mm512_setzero_ps(); 2 * MR];
    // SAFETY: rows `0..mr` of `a` hold `kc` f32 each and `b` holds `kc * NR` f32 (64-byte
    // aligned), as the caller guarantees; rows past `mr` repeat the last one, and their sums
    // are not stored. The epilogue's tiles are the caller's too.
    unsafe {
        let rows: [*const f32; MR] = std::array::from_fn(|i| a.add(i.min(mr - 1) * lda));
        let mut b = b;
        if !steps(kc, |p| {
            let b0 = _mm512_load_ps(b);
            let b1 = _mm512_load_ps(b.add(16));
            for i in 0..MR {
                let ai = _mm512_set1_ps(*rows[i].add(p));
                c[2 * i] = _mm512_fmadd_ps(ai, b0, c[2 * i]);
                c[2 * i + 1] = _mm512_fmadd_ps(ai, b1, c[2 * i + 1]);
            }
            b = b.add(NR);
        }) {
            return epilogue(&[_mm512_setzero_ps(); 2 * MR], mr, nr, ld, st);
        }
        epilogue(&c, mr, nr, ld, st);
    }
}

/// The bf16 micro-kernel: as [`kernel_f32`] with `kc2` steps over pairs of `k`, `a` packed
/// `[kc2][MR_BF16]` and `b` `[kc2][NR]` in 32-bit words, each word the bf16 pair `(k, k + 1)`.
/// A tile of fewer rows runs a kernel of as many rows (rounded up to even), where the full
/// kernel would spend a whole tile's time on it: each thread's 512 rows of a 1024³ product
/// end in a tile of 8.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16")]
pub(super) unsafe fn kernel_bf16(
    kc2: usize,
    a: *const u32,
    b: *const u32,
    mr: usize,
    nr: usize,
    ld: Io,
    st: Io,
) {
    // SAFETY: forwarded from the caller; each kernel reads the first rows of the panel's
    // `MR_BF16`-word steps, at least `mr` of them.
    unsafe {
        match mr {
            0..=2 => kernel_bf16_rows::<2, 4>(kc2, a, b, mr, nr, ld, st),
            3..=4 => kernel_bf16_rows::<4, 8>(kc2, a, b, mr, nr, ld, st),
            5..=6 => kernel_bf16_rows::<6, 12>(kc2, a, b, mr, nr, ld, st),
            7..=8 => kernel_bf16_rows::<8, 16>(kc2, a, b, mr, nr, ld, st),
            9..=10 => kernel_bf16_rows::<10, 20>(kc2, a, b, mr, nr, ld, st),
            11..=12 => kernel_bf16_rows::<12, 24>(kc2, a, b, mr, nr, ld, st),
            _ => kernel_bf16_rows::<MR_BF16, { 2 * MR_BF16 }>(kc2, a, b, mr, nr, ld, st),
        }
    }
}

/// [`kernel_bf16`] over the first `R` rows of the panel (`N` = `2 * R` accumulators).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16")]
unsafe fn kernel_bf16_rows<const R: usize, const N: usize>(
    kc2: usize,
    a: *const u32,
    b: *const u32,
    mr: usize,
    nr: usize,
    ld: Io,
    st: Io,
) {
    const { assert!(N == 2 * R && R <= MR_BF16) };
    ld.prefetch(mr.min(R), nr);
    st.prefetch(mr.min(R), nr);
    let mut c = [_mm512_setzero_ps(); N];
    // SAFETY: `a` holds `kc2 * MR_BF16` and `b` `kc2 * NR` words (b 64-byte aligned), as the
    // caller guarantees; `__m512i` and `__m512bh` are both 64 bytes of plain bits.
    unsafe {
        let (mut a, mut b) = (a, b);
        if !steps(kc2, |_| {
            let b0: __m512bh = std::mem::transmute(_mm512_load_ps(b.cast()));
            let b1: __m512bh = std::mem::transmute(_mm512_load_ps(b.add(16).cast()));
            for i in 0..R {
                let ai: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(i) as i32));
                c[2 * i] = _mm512_dpbf16_ps(c[2 * i], b0, ai);
                c[2 * i + 1] = _mm512_dpbf16_ps(c[2 * i + 1], b1, ai);
            }
            a = a.add(MR_BF16);
            b = b.add(NR);
        }) {
            return epilogue(&[_mm512_setzero_ps(); N], mr, nr, ld, st);
        }
        if let (Io::None, Io::Bf16(p, ldc)) = (ld, st) {
            // A bf16 tile with nothing to add (`k` in one block, no bias): each row's two
            // vectors rounded at once and stored as one.
            let m = mask32(nr);
            for i in 0..mr.min(R) {
                let v = round_bf16x2(c[2 * i], c[2 * i + 1]);
                let row = p.add(i * ldc);
                if m == u32::MAX {
                    _mm512_storeu_si512(row.cast(), v);
                } else {
                    _mm512_mask_storeu_epi16(row.cast(), m, v);
                }
            }
            return;
        }
        epilogue(&c, mr, nr, ld, st);
    }
}

/// The implicit-GEMM convolution kernel (`conv.rs`): [`kernel_bf16`] whose `a` is not packed
/// but read in place from an image of channel pairs, one plane of 32-bit words per pair: step
/// `s` of tile row `i` is the word `steps[s] + i` from `a` (the pair's plane, shifted by the
/// tap), so the tile's rows are consecutive pixels. `b` holds `steps.len()` steps of `NR`
/// lanes (64-byte aligned). Columns `0..nr` of the tile are stored through `tile`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16")]
pub(super) unsafe fn kernel_bf16_taps(
    steps: &[usize],
    a: *const u32,
    b: *const u32,
    nr: usize,
    tile: &ConvTile,
) {
    tile.prefetch(nr);
    let mut c = [_mm512_setzero_ps(); 2 * MR_BF16];
    // SAFETY: `p` runs below `steps.len()`; for every step, words `s .. s + MR_BF16` from `a`
    // are readable (rows that are no output position included: their sums are not stored)
    // and `b` holds the steps named above, as the caller guarantees; `__m512i` and `__m512bh`
    // are both 64 bytes of plain bits.
    unsafe {
        // One flat loop over the steps, each finding its words through `steps`: with a loop
        // per tap, or a branch where the tap changes, the accumulators went through the stack
        // on every step.
        let mut b = b;
        if !self::steps(steps.len(), |p| {
            let b0: __m512bh = std::mem::transmute(_mm512_load_ps(b.cast()));
            let b1: __m512bh = std::mem::transmute(_mm512_load_ps(b.add(16).cast()));
            let row = a.add(*steps.get_unchecked(p));
            for i in 0..MR_BF16 {
                let ai: __m512bh = std::mem::transmute(_mm512_set1_epi32(*row.add(i) as i32));
                c[2 * i] = _mm512_dpbf16_ps(c[2 * i], b0, ai);
                c[2 * i + 1] = _mm512_dpbf16_ps(c[2 * i + 1], b1, ai);
            }
            b = b.add(NR);
        }) {
            return conv_epilogue(&[_mm512_setzero_ps(); 2 * MR_BF16], nr, tile);
        }
        conv_epilogue(&c, nr, tile);
    }
}

/// Where [`kernel_bf16_taps`] stores a tile: column `j` (an output channel) plus `bias[j]`,
/// rounded to bf16, goes to the plane at `out + j * plane`; row `i` (a position) is a lane of
/// one of the runs `runs[..count]`, each a mask of lanes and the plane's element of lane 0 (its
/// lanes are consecutive elements; positions past a row's real ones are in no run).
pub(super) struct ConvTile {
    pub(super) out: *mut u16,
    pub(super) plane: usize,
    pub(super) bias: *const f32,
    pub(super) runs: [(u16, isize); MR_BF16],
    pub(super) count: usize,
}

impl ConvTile {
    /// Starts loading the lines the tile's columns `0..nr` are stored to into L1, as
    /// [`Io::prefetch`] does for a product's tiles: 32 planes far apart in memory, which the
    /// hardware does not fetch ahead, so without this the epilogue's stores waited on them.
    #[target_feature(enable = "sse")]
    #[inline]
    fn prefetch(&self, nr: usize) {
        for &(mask, at) in &self.runs[..self.count] {
            let (first, last) = (mask.trailing_zeros(), 15 - mask.leading_zeros());
            for j in 0..nr {
                // `wrapping_add` keeps the address arithmetic safe; a prefetch never faults.
                let run = self.out.wrapping_add(j * self.plane).wrapping_offset(at);
                _mm_prefetch::<_MM_HINT_T0>(run.wrapping_add(first as usize).cast());
                _mm_prefetch::<_MM_HINT_T0>(run.wrapping_add(last as usize).cast());
            }
        }
    }

    /// Stores words 0..16 of `v` to channel `lo`'s runs and words 16..32 to channel `hi`'s.
    ///
    /// # Safety
    /// Every run's masked lanes must lie in the planes of `lo` and `hi`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
    #[inline]
    unsafe fn store(&self, lo: usize, hi: Option<usize>, v: __m512i) {
        for &(mask, at) in &self.runs[..self.count] {
            let plane = |j: usize| self.out.wrapping_add(j * self.plane).wrapping_offset(at);
            // SAFETY: the caller's; the masked-off lanes, which are not touched, include the
            // 16 before a plane's run that the high half's store starts at.
            unsafe {
                _mm512_mask_storeu_epi16(plane(lo).cast(), mask as u32, v);
                if let Some(hi) = hi {
                    let at = plane(hi).wrapping_sub(16);
                    _mm512_mask_storeu_epi16(at.cast(), (mask as u32) << 16, v);
                }
            }
        }
    }
}

/// Stores the accumulators of a [`kernel_bf16_taps`] tile through `tile`: transposed in
/// registers so that a channel's positions are one vector, then, two channels rounded at
/// once, a masked store per run and channel.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16")]
#[inline]
unsafe fn conv_epilogue(c: &[__m512; 2 * MR_BF16], nr: usize, tile: &ConvTile) {
    let mut pending: Option<(usize, __m512)> = None;
    columns(c, nr, |j, x| {
        // SAFETY: the caller guarantees `bias` holds `nr` values.
        let x = _mm512_add_ps(x, _mm512_set1_ps(unsafe { *tile.bias.add(j) }));
        match pending.take() {
            None if j + 1 < nr => pending = Some((j, x)),
            // SAFETY: as below, for the channels `j - 1` and `j` (or `j` alone).
            None => unsafe { tile.store(j, None, round_bf16x2(x, x)) },
            Some((i, lo)) => unsafe { tile.store(i, Some(j), round_bf16x2(lo, x)) },
        }
    });
}

/// `dst[l] = lo[l] | hi[l] << 16` for `l < n` (`hi` zero when `None`): a pair of bf16 channels
/// as the words `vdpbf16ps` reads.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
pub(super) unsafe fn pair_words(lo: *const u16, hi: Option<*const u16>, dst: *mut u32, n: usize) {
    let mut l = 0;
    while l < n {
        let m = mask16(n - l);
        // SAFETY: the caller guarantees `n` readable u16 at `lo` (and `hi`) and `n` writable
        // words at `dst`; masked lanes past them are not touched.
        unsafe {
            let mut v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo.add(l).cast()));
            if let Some(hi) = hi {
                let h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, hi.add(l).cast()));
                v = _mm512_or_si512(v, _mm512_slli_epi32::<16>(h));
            }
            if m == u16::MAX {
                _mm512_storeu_si512(dst.add(l).cast(), v);
            } else {
                _mm512_mask_storeu_epi32(dst.add(l).cast(), m, v);
            }
        }
        l += 16;
    }
}

/// Transposes 16 rows of 16 lanes in place.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
#[inline]
fn transpose16(r: &mut [__m512; 16]) {
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // Quads of rows: u[4q + s] holds element s (mod 4) of each 128-bit lane for rows 4q..4q+4.
    let mut u = [_mm512_setzero_ps(); 16];
    for q in 0..4 {
        let (lo0, hi0) = (_mm512_castps_pd(t[4 * q]), _mm512_castps_pd(t[4 * q + 2]));
        let (lo1, hi1) = (
            _mm512_castps_pd(t[4 * q + 1]),
            _mm512_castps_pd(t[4 * q + 3]),
        );
        u[4 * q] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, hi0));
        u[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, hi0));
        u[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo1, hi1));
        u[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo1, hi1));
    }
    for s in 0..4 {
        let v0 = _mm512_shuffle_f32x4::<0x88>(u[s], u[4 + s]);
        let v1 = _mm512_shuffle_f32x4::<0xdd>(u[s], u[4 + s]);
        let v2 = _mm512_shuffle_f32x4::<0x88>(u[8 + s], u[12 + s]);
        let v3 = _mm512_shuffle_f32x4::<0xdd>(u[8 + s], u[12 + s]);
        r[s] = _mm512_shuffle_f32x4::<0x88>(v0, v2);
        r[s + 8] = _mm512_shuffle_f32x4::<0xdd>(v0, v2);
        r[s + 4] = _mm512_shuffle_f32x4::<0x88>(v1, v3);
        r[s + 12] = _mm512_shuffle_f32x4::<0xdd>(v1, v3);
    }
}

/// Packs a panel for the f32 kernel: `dst[p * r + l]` = element (lane `l`, step `p`) as f32
/// for `l < lanes`, 0 for `lanes <= l < r`, `p < kc`; the source element is at
/// `src + l * ls + p * ks`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pack_f32<E: Elem>(
    dst: *mut f32,
    r: usize,
    src: *const E,
    lanes: usize,
    kc: usize,
    ls: usize,
    ks: usize,
) {
    // SAFETY: the caller guarantees `dst` holds `kc * r` f32 and the source elements named
    // above are readable; masked lanes beyond them are not accessed.
    unsafe {
        if ls == 1 || lanes == 1 {
            for p in 0..kc {
                copy_step::<E>(dst.add(p * r), r, src.add(p * ks), lanes);
            }
        } else if ks == 1 {
            let mut p0 = 0;
            while p0 < kc {
                let kn = (kc - p0).min(16);
                let mut g = 0;
                while g < r {
                    let mut rows = [_mm512_setzero_ps(); 16];
                    for (l, row) in rows.iter_mut().enumerate() {
                        if g + l < lanes {
                            let s = src.add((g + l) * ls + p0);
                            // The lanes are far apart: fetch each one's next line early.
                            _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(256).cast());
                            *row = load16::<E>(s, mask16(kn));
                        }
                    }
                    transpose16(&mut rows);
                    let m = mask16(r - g);
                    for (q, row) in rows.iter().enumerate().take(kn) {
                        store_f32(dst.add((p0 + q) * r + g), m, *row);
                    }
                    g += 16;
                }
                p0 += 16;
            }
        } else {
            for p in 0..kc {
                for l in 0..r {
                    *dst.add(p * r + l) = if l < lanes {
                        (*src.add(l * ls + p * ks)).to_f32()
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// One step of an f32 panel whose lanes are dense: `d[l]` = the element at `s + l` as f32
/// for `l < lanes`, 0 up to `r`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
unsafe fn copy_step<E: Elem>(d: *mut f32, r: usize, s: *const E, lanes: usize) {
    // SAFETY: the callers guarantee `d` holds `r` f32 and the step's `lanes` elements are
    // readable; masked lanes are not accessed.
    unsafe {
        let mut l = 0;
        while l < r {
            let v = load16::<E>(s.wrapping_add(l), mask16(lanes.saturating_sub(l)));
            store_f32(d.add(l), mask16(r - l), v);
            l += 16;
        }
    }
}

/// [`pack_f32`] for the panels of a block whose lanes are dense (`ls == 1`): panel `q` of
/// `lanes.div_ceil(r)` holds lanes `q * r..` at `dst + q * kc * r`. It reads sixteen steps'
/// lanes as sixteen runs, in order, where packing panel after panel would read `kc` short
/// pieces of far-apart rows per panel, which the hardware prefetcher does not follow.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
pub(super) unsafe fn pack_f32_dense<E: Elem>(
    dst: *mut f32,
    r: usize,
    src: *const E,
    lanes: usize,
    kc: usize,
    ks: usize,
) {
    let panels = lanes.div_ceil(r);
    // SAFETY: the caller guarantees `dst` holds `panels * kc * r` f32 and the `lanes`
    // elements of each of the `kc` steps are readable; masked lanes are not accessed.
    unsafe {
        // Sixteen steps at a time: a panel's piece of them is one run of the destination
        // (all panels at once would write to lines `kc * r * 4` bytes apart, one cache set).
        for p0 in (0..kc).step_by(16) {
            for q in 0..panels {
                for p in p0..(p0 + 16).min(kc) {
                    let s = src.add(p * ks).wrapping_add(q * r);
                    copy_step::<E>(dst.add((q * kc + p) * r), r, s, lanes - q * r);
                }
            }
        }
    }
}

/// Index vectors interleaving two vectors of 32 u16: lanes 0..16 and 16..32.
const INTERLEAVE: [[i16; 32]; 2] = {
    let mut t = [[0i16; 32]; 2];
    let mut i = 0;
    while i < 16 {
        t[0][2 * i] = i as i16;
        t[0][2 * i + 1] = 32 + i as i16;
        t[1][2 * i] = 16 + i as i16;
        t[1][2 * i + 1] = 48 + i as i16;
        i += 1;
    }
    t
};

/// One word-step of a bf16 panel whose lanes are dense: `d[l]` = lane `l`'s pair (the step
/// at `s0`, and the one `ks` further when `second`, else 0) for `l < lanes`, 0 up to `r`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
unsafe fn pair_step(d: *mut u32, r: usize, s0: *const u16, lanes: usize, second: bool, ks: usize) {
    // SAFETY: the callers guarantee `d` holds `r` words and the `lanes` elements of the step
    // (and of the next when `second`) are readable; masked lanes are not accessed.
    unsafe {
        let lo_idx = _mm512_loadu_epi16(INTERLEAVE[0].as_ptr());
        let hi_idx = _mm512_loadu_epi16(INTERLEAVE[1].as_ptr());
        let mut l = 0;
        while l < r {
            let m = mask32(lanes.saturating_sub(l));
            let r0 = _mm512_maskz_loadu_epi16(m, s0.wrapping_add(l).cast());
            let r1 = if second {
                _mm512_maskz_loadu_epi16(m, s0.wrapping_add(ks + l).cast())
            } else {
                _mm512_setzero_si512()
            };
            let lo = _mm512_permutex2var_epi16(r0, lo_idx, r1);
            store_f32(d.add(l).cast(), mask16(r - l), _mm512_castsi512_ps(lo));
            if r - l > 16 {
                let hi = _mm512_permutex2var_epi16(r0, hi_idx, r1);
                store_f32(
                    d.add(l + 16).cast(),
                    mask16(r - l - 16),
                    _mm512_castsi512_ps(hi),
                );
            }
            l += 32;
        }
    }
}

/// [`pack_bf16`] for the panels of a block whose lanes are dense (`ls == 1`), as
/// [`pack_f32_dense`] does it: panel `q` at `dst + q * kc.div_ceil(2) * r`, eight word-steps
/// at a time across the panels.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
pub(super) unsafe fn pack_bf16_dense(
    dst: *mut u32,
    r: usize,
    src: *const u16,
    lanes: usize,
    kc: usize,
    ks: usize,
) {
    let (kc2, panels) = (kc.div_ceil(2), lanes.div_ceil(r));
    // SAFETY: the caller guarantees `dst` holds `panels * kc2 * r` words and the `lanes`
    // elements of each of the `kc` steps are readable.
    unsafe {
        for p0 in (0..kc2).step_by(8) {
            for q in 0..panels {
                // The rows of the next eight steps, at this panel's columns, into L2: 16 rows
                // far apart, more streams than the hardware fetches ahead (a 1024x1024 operand
                // was packed at 8 GB/s; this took about a fifth off).
                for p in p0 + 8..(p0 + 16).min(kc2) {
                    let s = src.wrapping_add(2 * p * ks + q * r);
                    _mm_prefetch::<_MM_HINT_T1>(s.cast());
                    _mm_prefetch::<_MM_HINT_T1>(s.wrapping_add(ks).cast());
                }
                for p in p0..(p0 + 8).min(kc2) {
                    let d = dst.add((q * kc2 + p) * r);
                    let s0 = src.add(2 * p * ks).wrapping_add(q * r);
                    pair_step(d, r, s0, lanes - q * r, 2 * p + 1 < kc, ks);
                }
            }
        }
    }
}

/// Packs a panel for the bf16 kernel: `dst[p * r + l]` = the word of lane `l`'s bf16 pair
/// (step `2p` in the low half, `2p + 1` in the high half, 0 past `kc`) for `l < lanes`, 0 for
/// `lanes <= l < r`, `p < kc.div_ceil(2)`; the source element is at `src + l * ls + p * ks`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pack_bf16(
    dst: *mut u32,
    r: usize,
    src: *const u16,
    lanes: usize,
    kc: usize,
    ls: usize,
    ks: usize,
) {
    let kc2 = kc.div_ceil(2);
    // SAFETY: the caller guarantees `dst` holds `kc2 * r` words and the source elements named
    // above are readable; masked lanes beyond them are not accessed.
    unsafe {
        if ls == 1 || lanes == 1 {
            for p in 0..kc2 {
                pair_step(
                    dst.add(p * r),
                    r,
                    src.add(2 * p * ks),
                    lanes,
                    2 * p + 1 < kc,
                    ks,
                );
            }
        } else if ks == 1 {
            let mut p0 = 0;
            while p0 < kc2 {
                let kn = (kc2 - p0).min(16);
                let count = mask32(kc - 2 * p0);
                let mut g = 0;
                while g < r {
                    let mut rows = [_mm512_setzero_ps(); 16];
                    for (l, row) in rows.iter_mut().enumerate() {
                        if g + l < lanes {
                            let s = src.add((g + l) * ls + 2 * p0);
                            _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(64).cast());
                            *row = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(count, s.cast()));
                        }
                    }
                    transpose16(&mut rows);
                    let m = mask16(r - g);
                    for (q, row) in rows.iter().enumerate().take(kn) {
                        store_f32(dst.add((p0 + q) * r + g).cast(), m, *row);
                    }
                    g += 16;
                }
                p0 += 16;
            }
        } else {
            for p in 0..kc2 {
                for l in 0..r {
                    *dst.add(p * r + l) = if l < lanes {
                        let lo = *src.add(l * ls + 2 * p * ks) as u32;
                        let hi = if 2 * p + 1 < kc {
                            *src.add(l * ls + (2 * p + 1) * ks) as u32
                        } else {
                            0
                        };
                        lo | (hi << 16)
                    } else {
                        0
                    };
                }
            }
        }
    }
}

/// Matrix-vector, rows contiguous along `k`: `out[t] = sum_p m[t * mt + p] * v[p]` for
/// `t < len`, `p < k`, with `v` f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
pub(super) unsafe fn gemv_dot<E: Elem>(
    m: *const E,
    mt: usize,
    len: usize,
    k: usize,
    v: *const f32,
    out: &mut [f32],
) {
    const ROWS: usize = 8;
    let full = k / 16 * 16;
    let tail = mask16(k - full);
    // SAFETY: the caller guarantees rows `0..len` of `k` elements at stride `mt` from `m` and
    // `k` f32 at `v` are readable, and `out` has `len` elements.
    unsafe {
        let mut t = 0;
        while t + ROWS <= len {
            let mut acc = [_mm512_setzero_ps(); ROWS];
            let rows: [*const E; ROWS] = std::array::from_fn(|r| m.add((t + r) * mt));
            let mut p = 0;
            while p < full {
                let x = _mm512_loadu_ps(v.add(p));
                for r in 0..ROWS {
                    acc[r] = _mm512_fmadd_ps(load16::<E>(rows[r].add(p), u16::MAX), x, acc[r]);
                }
                p += 16;
            }
            if tail != 0 {
                let x = _mm512_maskz_loadu_ps(tail, v.add(p));
                for r in 0..ROWS {
                    acc[r] = _mm512_fmadd_ps(load16::<E>(rows[r].add(p), tail), x, acc[r]);
                }
            }
            for r in 0..ROWS {
                out[t + r] = _mm512_reduce_add_ps(acc[r]);
            }
            t += ROWS;
        }
        while t < len {
            let row = m.add(t * mt);
            let mut acc = [_mm512_setzero_ps(); 4];
            let mut p = 0;
            while p + 64 <= k {
                for (j, a) in acc.iter_mut().enumerate() {
                    let x = _mm512_loadu_ps(v.add(p + 16 * j));
                    *a = _mm512_fmadd_ps(load16::<E>(row.add(p + 16 * j), u16::MAX), x, *a);
                }
                p += 64;
            }
            while p < k {
                let mk = mask16(k - p);
                let x = _mm512_maskz_loadu_ps(mk, v.add(p));
                acc[0] = _mm512_fmadd_ps(load16::<E>(row.add(p), mk), x, acc[0]);
                p += 16;
            }
            let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
            out[t] = _mm512_reduce_add_ps(s);
            t += 1;
        }
    }
}

/// Matrix-vector, contiguous along the output: `out[t] = sum_p m[t + p * mk] * v[p]` for
/// `t < len`, `p < k`, with `v` f32. Columns go in chunks that keep `out` in L1 while the
/// rows stream through in long runs, four rows per pass over the chunk.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
pub(super) unsafe fn gemv_axpy<E: Elem>(
    m: *const E,
    mk: usize,
    len: usize,
    k: usize,
    v: &[f32],
    out: &mut [f32],
) {
    const CHUNK: usize = 4096;
    const R: usize = 4;
    /// What the missing rows of a last group of fewer than `R` read: zeros (of every element
    /// type), so their zero weights add nothing. Reading a real row there instead would
    /// multiply its infinities by 0 and turn every output into NaN.
    static ZEROS: [u32; CHUNK] = [0; CHUNK];
    out[..len].fill(0.0);
    // SAFETY: the caller guarantees elements `t + p * mk` of `m` are readable for `t < len`,
    // `p < k`, and `v` has `k` and `out` `len` elements; masked lanes are not accessed. Rows
    // read from `ZEROS` read at most `CHUNK` elements of at most 4 bytes: inside it.
    unsafe {
        let o = out.as_mut_ptr();
        let mut t0 = 0;
        while t0 < len {
            let width = (len - t0).min(CHUNK);
            let mut p = 0;
            while p < k {
                let rows = (k - p).min(R);
                let x: [__m512; R] =
                    std::array::from_fn(|r| _mm512_set1_ps(if r < rows { v[p + r] } else { 0.0 }));
                let base: [*const E; R] = std::array::from_fn(|r| {
                    if r < rows {
                        m.add(t0 + (p + r) * mk)
                    } else {
                        ZEROS.as_ptr().cast::<E>()
                    }
                });
                let mut t = 0;
                // Unmasked in the body: masked stores are slow on some processors.
                while t + 16 <= width {
                    let mut acc = _mm512_loadu_ps(o.add(t0 + t));
                    for r in 0..R {
                        acc = _mm512_fmadd_ps(load16::<E>(base[r].add(t), u16::MAX), x[r], acc);
                    }
                    _mm512_storeu_ps(o.add(t0 + t), acc);
                    t += 16;
                }
                if t < width {
                    let mask = mask16(width - t);
                    let mut acc = _mm512_maskz_loadu_ps(mask, o.add(t0 + t));
                    for r in 0..R {
                        acc = _mm512_fmadd_ps(load16::<E>(base[r].add(t), mask), x[r], acc);
                    }
                    _mm512_mask_storeu_ps(o.add(t0 + t), mask, acc);
                }
                p += rows;
            }
            t0 += width;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpu_tensor::bf16;

    /// `vcvtne2ps2bf16` with its fallback gives the software rounding's bits (`half`'s) for
    /// every class of f32: ties either way, overflow to infinity, NaNs of any payload, zeros,
    /// and denormals, which the instruction alone would flush. Pairs free of denormals take
    /// the instruction, the others the fallback, and both are checked.
    #[test]
    fn paired_bf16_rounding_keeps_the_scalar_bits() {
        if !crate::cpu::isa::has_avx512_bf16() {
            eprintln!("skipped: this processor has no AVX512_BF16");
            return;
        }
        let mut normal: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            f32::from_bits(0x3f80_8000), // a tie to even, down
            f32::from_bits(0x3f81_8000), // a tie to even, up
            f32::from_bits(0x3f80_8001),
            f32::MAX,
            f32::MIN,
            f32::from_bits(0x7f7f_8000), // rounds up to infinity
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7f80_0001), // a signalling NaN, payload below the kept bits
            f32::from_bits(0xffc1_2345),
        ];
        let mut tiny: Vec<f32> = vec![
            f32::from_bits(1),
            f32::from_bits(0x8000_8000),
            f32::from_bits(0x007f_ffff), // rounds up to the smallest normal
            f32::from_bits(0x0001_8000),
        ];
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2048 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let x = f32::from_bits(s as u32);
            if x.is_subnormal() {
                tiny.push(x);
            } else {
                normal.push(x);
            }
            tiny.push(f32::from_bits((s >> 32) as u32 & 0x807f_ffff));
        }
        let check = |xs: &[f32]| {
            let mut v = [0f32; 32];
            v[..xs.len()].copy_from_slice(xs);
            // SAFETY: the processor has AVX512_BF16 (checked above); `v` holds 32 f32.
            let got: [u16; 32] = unsafe {
                let (lo, hi) = (
                    _mm512_loadu_ps(v.as_ptr()),
                    _mm512_loadu_ps(v.as_ptr().add(16)),
                );
                std::mem::transmute(round_bf16x2(lo, hi))
            };
            for (x, g) in v.iter().zip(got) {
                let want = bf16::from_f32(*x).to_bits();
                assert_eq!(g, want, "{x:e} ({:#010x})", x.to_bits());
            }
        };
        for chunk in normal.chunks(32) {
            check(chunk);
        }
        // Each with one denormal among normal values, then denormals only.
        for (i, t) in tiny.iter().enumerate().take(64) {
            let mut mixed = normal[i..i + 31].to_vec();
            mixed.insert(i % 32, *t);
            check(&mixed);
        }
        for chunk in tiny.chunks(32) {
            check(chunk);
        }
    }
}
