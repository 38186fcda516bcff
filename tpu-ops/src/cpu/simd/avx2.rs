//! AVX2 building blocks of the matrix products, for processors without AVX-512: f32 packing
//! (f16 and bf16 converted while packing) and the FMA micro-kernel with its epilogue.
//!
//! The register tile is 6×16: twelve accumulators, two vectors of `b` and one broadcast of `a`
//! fill fifteen of the sixteen `ymm` registers, and each step does twelve FMAs for eight loads.
//!
//! Hand-written rather than left to faer (the path before it) because it measures faster where
//! training spends its time and lets the product carry the crate's epilogues (the SGD update
//! of [`super::gemm_update_f32`], 16-bit outputs rounded once, operands at any strides without
//! copies). Best of 30 on a 2-core AVX2 machine, 2 threads, ours against faer in one process:
//! a weight gradient 1024×128×1024 (`a` transposed) 1.53 ms against 1.86-1.95; `x · Wᵀ`
//! 128×784×1024 1.18 against 1.21, and 128×576×192 175 µs against 170; 512×384×1536 3.37 ms
//! against 3.33-3.45; 1024³ 11.9 ms, the same. faer stays ahead on small products
//! (32×384×384: 75 µs against 68).
//!
//! Every function here is `unsafe`: callers (the driver in `gemm.rs`) must have checked that
//! the processor has AVX2, FMA and F16C (see [`crate::cpu::isa::level`]) and that every
//! pointer, with the strides and counts passed, stays inside its allocation.

use std::arch::x86_64::*;

use super::avx512::Io;
use super::{Elem, Kind};
use tpu_tensor::{bf16, f16};

/// Rows of the register tile.
pub(super) const MR: usize = 6;
/// Columns of the register tile (two vectors of 8 f32).
pub(super) const NR: usize = 16;

/// Element `(i, j)` of `io` plus `x`, as the AVX-512 epilogue computes it (for `F32Scaled`,
/// `w + x * alpha`: a product, then a sum).
///
/// # Safety
/// `(i, j)` must lie inside `io`'s matrix.
#[inline(always)]
unsafe fn add_one(x: f32, io: Io, i: usize, j: usize) -> f32 {
    // SAFETY: forwarded from the caller.
    unsafe {
        match io {
            Io::None => x,
            Io::F32(p, ld) => x + *p.add(i * ld + j),
            Io::F32Scaled(p, ld, alpha) => *p.add(i * ld + j) + x * alpha,
            Io::Bf16(p, ld) => x + bf16::from_bits(*p.add(i * ld + j)).to_f32(),
            Io::F16(p, ld) => x + f16::from_bits(*p.add(i * ld + j)).to_f32(),
            Io::F32T(p, ld) => x + *p.add(j * ld + i),
        }
    }
}

/// Stores `x` as element `(i, j)` of `io`, rounded to its type (to nearest, ties to even).
///
/// # Safety
/// `(i, j)` must lie inside `io`'s matrix.
#[inline(always)]
unsafe fn store_one(x: f32, io: Io, i: usize, j: usize) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match io {
            Io::None => {}
            Io::F32(p, ld) | Io::F32Scaled(p, ld, _) => *p.add(i * ld + j) = x,
            Io::Bf16(p, ld) => *p.add(i * ld + j) = bf16::from_f32(x).to_bits(),
            Io::F16(p, ld) => *p.add(i * ld + j) = f16::from_f32(x).to_bits(),
            Io::F32T(p, ld) => *p.add(j * ld + i) = x,
        }
    }
}

/// Writes the accumulators of a tile: rows `0..mr`, columns `0..nr` of `st` receive `c` plus
/// the same elements of `ld`. Whole f32 rows take vectors; 16-bit and partial rows go element
/// by element (a few per thousand multiply-adds of the tile).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn epilogue(c: &[__m256; 2 * MR], mr: usize, nr: usize, ld: Io, st: Io) {
    for i in 0..mr.min(MR) {
        let (c0, c1) = (c[2 * i], c[2 * i + 1]);
        // SAFETY: the caller guarantees the `mr x nr` tiles of `ld` and `st` are in bounds.
        unsafe {
            if let (true, Io::F32(sp, sld)) = (nr == NR, st) {
                let (x0, x1) = match ld {
                    Io::None => (c0, c1),
                    Io::F32(p, l) => {
                        let p = p.add(i * l);
                        (
                            _mm256_add_ps(c0, _mm256_loadu_ps(p)),
                            _mm256_add_ps(c1, _mm256_loadu_ps(p.add(8))),
                        )
                    }
                    Io::F32Scaled(p, l, alpha) => {
                        let (p, s) = (p.add(i * l), _mm256_set1_ps(alpha));
                        (
                            _mm256_add_ps(_mm256_loadu_ps(p), _mm256_mul_ps(c0, s)),
                            _mm256_add_ps(_mm256_loadu_ps(p.add(8)), _mm256_mul_ps(c1, s)),
                        )
                    }
                    _ => {
                        let mut row = [0.0f32; NR];
                        _mm256_storeu_ps(row.as_mut_ptr(), c0);
                        _mm256_storeu_ps(row.as_mut_ptr().add(8), c1);
                        for (j, x) in row.iter_mut().enumerate() {
                            *x = add_one(*x, ld, i, j);
                        }
                        (
                            _mm256_loadu_ps(row.as_ptr()),
                            _mm256_loadu_ps(row.as_ptr().add(8)),
                        )
                    }
                };
                let sp = sp.add(i * sld);
                _mm256_storeu_ps(sp, x0);
                _mm256_storeu_ps(sp.add(8), x1);
                continue;
            }
            let mut row = [0.0f32; NR];
            _mm256_storeu_ps(row.as_mut_ptr(), c0);
            _mm256_storeu_ps(row.as_mut_ptr().add(8), c1);
            for (j, &x) in row.iter().enumerate().take(nr) {
                store_one(add_one(x, ld, i, j), st, i, j);
            }
        }
    }
}

/// The f32 micro-kernel: `st[0..mr, 0..nr] = ld + a · b` over `kc` steps, where `a` is an
/// `MR`-row panel packed `[kc][MR]` and `b` an `NR`-column panel packed `[kc][NR]` (32-byte
/// aligned).
#[target_feature(enable = "avx2,fma,f16c")]
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
    let mut c = [_mm256_setzero_ps(); 2 * MR];
    // SAFETY: `a` holds `kc * MR` and `b` `kc * NR` f32 (b 32-byte aligned), as the caller
    // guarantees; the epilogue's tiles are the caller's too.
    unsafe {
        let (mut a, mut b) = (a, b);
        for _ in 0..kc {
            let b0 = _mm256_load_ps(b);
            let b1 = _mm256_load_ps(b.add(8));
            for i in 0..MR {
                let ai = _mm256_broadcast_ss(&*a.add(i));
                c[2 * i] = _mm256_fmadd_ps(ai, b0, c[2 * i]);
                c[2 * i + 1] = _mm256_fmadd_ps(ai, b1, c[2 * i + 1]);
            }
            a = a.add(MR);
            b = b.add(NR);
        }
        epilogue(&c, mr, nr, ld, st);
    }
}

/// Transposes 8 rows of 8 lanes in place.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn transpose8(r: &mut [__m256; 8]) {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xee>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xee>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xee>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xee>(t5, t7);
    r[0] = _mm256_permute2f128_ps::<0x20>(u0, u4);
    r[1] = _mm256_permute2f128_ps::<0x20>(u1, u5);
    r[2] = _mm256_permute2f128_ps::<0x20>(u2, u6);
    r[3] = _mm256_permute2f128_ps::<0x20>(u3, u7);
    r[4] = _mm256_permute2f128_ps::<0x31>(u0, u4);
    r[5] = _mm256_permute2f128_ps::<0x31>(u1, u5);
    r[6] = _mm256_permute2f128_ps::<0x31>(u2, u6);
    r[7] = _mm256_permute2f128_ps::<0x31>(u3, u7);
}

/// Packs a panel for the f32 kernel: `dst[p * r + l]` = element (lane `l`, step `p`) as f32
/// for `l < lanes`, 0 for `lanes <= l < r`, `p < kc`; the source element is at
/// `src + l * ls + p * ks`. f32 lanes dense along `k` go through 8×8 register transposes.
#[target_feature(enable = "avx2,fma,f16c")]
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
    // above are readable; the transposes read 8 steps of 8 lanes that all exist.
    unsafe {
        if E::KIND == Kind::F32 && r == MR && lanes == MR {
            return pack_a_panel(dst, src.cast(), kc, ls, ks);
        }
        if ls == 1 || lanes == 1 {
            for p in 0..kc {
                copy_step::<E>(dst.add(p * r), r, src.add(p * ks), lanes);
            }
            return;
        }
        let mut p0 = 0;
        if ks == 1 && E::KIND == Kind::F32 {
            let s = src.cast::<f32>();
            while p0 + 8 <= kc {
                let mut g = 0;
                while g + 8 <= r.min(lanes) {
                    let mut rows = [_mm256_setzero_ps(); 8];
                    for (l, row) in rows.iter_mut().enumerate() {
                        let at = s.add((g + l) * ls + p0);
                        // The lanes are far apart: fetch each one's next line early.
                        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64).cast());
                        *row = _mm256_loadu_ps(at);
                    }
                    transpose8(&mut rows);
                    for (q, row) in rows.iter().enumerate() {
                        _mm256_storeu_ps(dst.add((p0 + q) * r + g), *row);
                    }
                    g += 8;
                }
                for p in p0..p0 + 8 {
                    for l in g..r {
                        *dst.add(p * r + l) = if l < lanes { *s.add(l * ls + p) } else { 0.0 };
                    }
                }
                p0 += 8;
            }
        }
        for p in p0..kc {
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

/// [`pack_f32`] for a whole `MR`-lane f32 panel (the rows of `a`): six dense lanes per step
/// take one 4-lane and one 2-lane copy; lanes dense along `k` are read eight steps at a time
/// and transposed in registers.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_a_panel(dst: *mut f32, src: *const f32, kc: usize, ls: usize, ks: usize) {
    // SAFETY: the caller guarantees `dst` holds `kc * MR` f32 and the `MR` lanes of the `kc`
    // steps are readable; each store stays inside the panel (the last step of a group of
    // eight writes its six lanes exactly; the others spill into the next step, rewritten
    // right after).
    unsafe {
        let mut p0 = 0;
        if ls == 1 {
            for p in 0..kc {
                let (s, d) = (src.add(p * ks), dst.add(p * MR));
                _mm_storeu_ps(d, _mm_loadu_ps(s));
                _mm_store_sd(d.add(4).cast(), _mm_load_sd(s.add(4).cast()));
            }
            return;
        }
        if ks == 1 {
            while p0 + 8 <= kc {
                let mut rows = [_mm256_setzero_ps(); 8];
                for (l, row) in rows.iter_mut().enumerate().take(MR) {
                    let at = src.add(l * ls + p0);
                    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64).cast());
                    *row = _mm256_loadu_ps(at);
                }
                transpose8(&mut rows);
                let d = dst.add(p0 * MR);
                for (q, row) in rows.iter().enumerate().take(7) {
                    _mm256_storeu_ps(d.add(q * MR), *row);
                }
                let last = d.add(7 * MR);
                _mm_storeu_ps(last, _mm256_castps256_ps128(rows[7]));
                _mm_store_sd(
                    last.add(4).cast(),
                    _mm_castps_pd(_mm256_extractf128_ps::<1>(rows[7])),
                );
                p0 += 8;
            }
        }
        for p in p0..kc {
            for l in 0..MR {
                *dst.add(p * MR + l) = *src.add(l * ls + p * ks);
            }
        }
    }
}

/// One step of an f32 panel whose lanes are dense: `d[l]` = the element at `s + l` as f32
/// for `l < lanes`, 0 up to `r`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn copy_step<E: Elem>(d: *mut f32, r: usize, s: *const E, lanes: usize) {
    // SAFETY: the callers guarantee `d` holds `r` f32 and the step's `lanes` elements are
    // readable; only whole runs of 8 readable lanes are loaded as vectors.
    unsafe {
        let whole = lanes.min(r) / 8 * 8;
        let mut l = 0;
        while l < whole {
            let v = match E::KIND {
                Kind::F32 => _mm256_loadu_ps(s.add(l).cast()),
                Kind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(s.add(l).cast())),
                Kind::Bf16 => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                    _mm_loadu_si128(s.add(l).cast()),
                ))),
            };
            _mm256_storeu_ps(d.add(l), v);
            l += 8;
        }
        for l in whole..r {
            *d.add(l) = if l < lanes { (*s.add(l)).to_f32() } else { 0.0 };
        }
    }
}

/// [`pack_f32`] for the panels of a block whose lanes are dense (`ls == 1`): panel `q` of
/// `lanes.div_ceil(r)` holds lanes `q * r..` at `dst + q * kc * r`, read sixteen steps at a
/// time across all the panels (as the AVX-512 version does, for the hardware prefetcher).
#[target_feature(enable = "avx2,fma,f16c")]
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
    // elements of each of the `kc` steps are readable.
    unsafe {
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
