//! The bf16 product on AMX tiles (Intel's Advanced Matrix Extensions, `tdpbf16ps`), where the
//! processor and the OS allow them: one instruction multiplies a 16×32 tile of `a` by a 32×16
//! tile of `b` into a 16×16 tile of f32 sums, eight times the work per cycle of `vdpbf16ps` on
//! 512-bit registers. On such a machine PyTorch (oneDNN) ran 1024³ in bf16 six times faster
//! than the `vdpbf16ps` kernel.
//!
//! The register tile is 32×32: four tiles of sums, two of `a` (16 rows each) and two of `b`
//! (16 columns each). `b` comes in the same panels as for [`super::avx512::kernel_bf16`] (steps
//! of `k` pairs, 32 words each), which a tile reads with a stride of 128 bytes; `a` is packed
//! per 32 rows as steps of 32 `k` values, a tile's 16 rows 64 bytes apart, zero past `k` and past
//! the last row. The sums go through memory to the AVX-512 epilogue, which adds, rounds and
//! stores them as for the other kernels.
//!
//! The instructions are written with `asm!`: Rust's AMX intrinsics are not stable. Each
//! element's sum takes the `k` pairs in order, as `tdpbf16ps` defines it; its bits may differ
//! from `vdpbf16ps`'s (the two add a pair's products in different orders), so a machine uses
//! one of the two for every bf16 product it packs.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::avx512::{self, Io, NR};

/// Rows of the register tile.
pub(super) const MR: usize = 32;
/// Words of one packed step of `a`: 32 rows of 16 words (32 bf16 values of `k`).
pub(super) const STEP_WORDS: usize = MR * 16;

/// Whether AMX-BF16 tiles may be used: the processor has AMX-TILE and AMX-BF16, the OS saves
/// the tile state (XCR0 bits 17 and 18), and Linux grants this process the tile data (a
/// permission asked once; without it, the first tile instruction faults).
pub(super) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(detect)
}

#[cfg(target_os = "linux")]
fn detect() -> bool {
    // Leaf 7 read on a processor without it would report another leaf's bits.
    if __cpuid(0).eax < 7 {
        return false;
    }
    let (l1, l7) = (__cpuid(1), __cpuid_count(7, 0));
    let (tile, bf16, osxsave) = (l7.edx >> 24 & 1, l7.edx >> 22 & 1, l1.ecx >> 27 & 1);
    if tile & bf16 & osxsave == 0 {
        return false;
    }
    let (lo, _hi): (u32, u32);
    // SAFETY: OSXSAVE is set, so `xgetbv` with ECX = 0 reads XCR0.
    unsafe {
        asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") _hi, options(nomem, nostack));
    }
    if lo >> 17 & 3 != 3 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: `arch_prctl` with this request reads only its two integer arguments.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn detect() -> bool {
    false
}

/// The tile configuration: palette 1; tiles 0-3 the sums, 4-5 `a`, 6-7 `b`, each 16 rows of
/// 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    Config(c)
};

/// Tiles configured on this thread for [`kernel_bf16`], released as it drops.
pub(super) struct Tiles(());

impl Tiles {
    /// Configures this thread's tiles.
    ///
    /// # Safety
    /// [`available`] must be true.
    pub(super) unsafe fn configure() -> Tiles {
        // SAFETY: AMX is available (the caller's); the configuration is valid for palette 1.
        unsafe { asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack)) };
        Tiles(())
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: tiles were configured on this thread ([`Tiles::configure`]).
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// Packs rows `0..rows` (at most [`MR`]) of `a` (bf16 bits, row stride `ls`, step stride `ks`
/// along `k`), steps `0..kc`, for [`kernel_bf16`]: `kc.div_ceil(32)` steps of [`STEP_WORDS`]
/// words, row `r` of a step 16 words (32 values of `k`, pairs in words), zero past `kc` and
/// past `rows`.
///
/// # Safety
/// `dst` must hold `kc.div_ceil(32) * STEP_WORDS` words; the `rows x kc` elements read must
/// lie in `a`.
pub(super) unsafe fn pack_a(
    dst: *mut u32,
    src: *const u16,
    rows: usize,
    kc: usize,
    ls: usize,
    ks: usize,
) {
    let steps = kc.div_ceil(32);
    let d = dst.cast::<u16>();
    // SAFETY: the caller's bounds; every write is inside `steps * STEP_WORDS` words.
    unsafe {
        for s in 0..steps {
            let k0 = s * 32;
            let kn = (kc - k0).min(32);
            for r in 0..MR {
                let row = d.add((s * MR + r) * 32);
                if r >= rows {
                    std::ptr::write_bytes(row, 0, 32);
                    continue;
                }
                let from = src.add(r * ls + k0 * ks);
                if ks == 1 {
                    std::ptr::copy_nonoverlapping(from, row, kn);
                } else {
                    for q in 0..kn {
                        *row.add(q) = *from.add(q * ks);
                    }
                }
                std::ptr::write_bytes(row.add(kn), 0, 32 - kn);
            }
        }
    }
}

/// 64-byte-aligned words: a step of `b`, a tile's sums.
#[repr(C, align(64))]
struct Block<const W: usize>([u32; W]);

/// Zeroes the four sum tiles.
///
/// # Safety
/// [`Tiles::configure`] must have run on this thread.
#[inline(always)]
unsafe fn zero_sums() {
    // SAFETY: the caller's; only tile registers are written.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        )
    };
}

/// One step of the kernels: the sum tiles plus `a`'s two tiles (16 rows of 64 bytes, 64 bytes
/// apart; the second [`STEP_WORDS`]` / 2` words on) times `b`'s two (16 rows of 64 bytes,
/// `ldb` bytes apart; the second 16 words on).
///
/// # Safety
/// [`Tiles::configure`] must have run on this thread; the rows read must be readable.
#[inline(always)]
unsafe fn step(a: *const u32, b: *const u32, ldb: usize) {
    // SAFETY: the caller's.
    unsafe {
        asm!(
            "tileloadd tmm4, [{a0} + {lda}*1]",
            "tileloadd tmm5, [{a1} + {lda}*1]",
            "tileloadd tmm6, [{b0} + {ldb}*1]",
            "tileloadd tmm7, [{b1} + {ldb}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            a0 = in(reg) a,
            a1 = in(reg) a.wrapping_add(STEP_WORDS / 2),
            b0 = in(reg) b,
            b1 = in(reg) b.wrapping_add(16),
            lda = in(reg) 64usize,
            ldb = in(reg) ldb,
            options(nostack, readonly),
        )
    };
}

/// The four sum tiles as 32 rows of [`NR`] f32 values (bits).
///
/// # Safety
/// [`Tiles::configure`] must have run on this thread.
#[inline(always)]
unsafe fn sums() -> Block<{ MR * NR }> {
    let mut sums = std::mem::MaybeUninit::<Block<{ MR * NR }>>::uninit();
    let s = sums.as_mut_ptr().cast::<u32>();
    // SAFETY: the four stores write all of `sums` (16 rows of 64 bytes each, rows `NR` words
    // apart, at the four corners), so it is initialised after them.
    unsafe {
        asm!(
            "tilestored [{c0} + {ldc}*1], tmm0",
            "tilestored [{c1} + {ldc}*1], tmm1",
            "tilestored [{c2} + {ldc}*1], tmm2",
            "tilestored [{c3} + {ldc}*1], tmm3",
            c0 = in(reg) s,
            c1 = in(reg) s.add(16),
            c2 = in(reg) s.add(16 * NR),
            c3 = in(reg) s.add(16 * NR + 16),
            ldc = in(reg) NR * 4,
            options(nostack),
        );
        sums.assume_init()
    }
}

/// A 32×32 tile of `a · b` over `kc2` steps of `k` pairs: `a` packed by [`pack_a`], `b` a panel
/// of `kc2` steps of [`NR`] words (64-byte aligned). Rows `0..mr`, columns `0..nr` of `st`
/// receive the sums plus the same elements of `ld`, as [`avx512::kernel_bf16`] stores them.
///
/// # Safety
/// [`Tiles::configure`] must have run on this thread; `a` holds `kc2.div_ceil(16)` packed
/// steps, `b` `kc2 * NR` words; the `mr x nr` tiles of `ld` and `st` must be in bounds.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
pub(super) unsafe fn kernel_bf16(
    kc2: usize,
    a: *const u32,
    b: *const u32,
    mr: usize,
    nr: usize,
    ld: Io,
    st: Io,
) {
    // SAFETY: the caller's bounds; tiles 4-7 read 16 rows of 64 bytes at the given strides,
    // inside the packed steps of `a` and the panel of `b` (or `tail`).
    unsafe {
        zero_sums();
        let full = kc2 / 16;
        for s in 0..full {
            step(a.add(s * STEP_WORDS), b.add(s * 16 * NR), NR * 4);
        }
        let rem = kc2 % 16;
        if rem != 0 {
            // The last steps of `b`, in a block zero past them: the tile reads 16 steps.
            let mut tail = Block([0u32; 16 * NR]);
            std::ptr::copy_nonoverlapping(b.add(full * 16 * NR), tail.0.as_mut_ptr(), rem * NR);
            step(a.add(full * STEP_WORDS), tail.0.as_ptr(), NR * 4);
        }
        let block = sums();
        let sums = block.0.as_ptr().cast::<f32>();
        for half in 0..2 {
            let rows = mr.saturating_sub(16 * half).min(16);
            if rows == 0 {
                break;
            }
            let mut c = [_mm512_setzero_ps(); 32];
            for (i, pair) in c.chunks_exact_mut(2).enumerate() {
                let row = sums.add((16 * half + i) * NR);
                pair[0] = _mm512_load_ps(row);
                pair[1] = _mm512_load_ps(row.add(16));
            }
            avx512::epilogue(&c, rows, nr, ld.down(16 * half), st.down(16 * half));
        }
    }
}

/// Where [`kernel_conv`] stores a tile: row `j` (an output channel) plus `bias[j]`, rounded to
/// bf16, goes to the plane at `out + j * plane`; column `i` (a position) is a lane of one of
/// the runs `runs[..count]`, each a mask of lanes and the plane's element of lane 0.
pub(super) struct ConvTile {
    pub(super) out: *mut u16,
    pub(super) plane: usize,
    pub(super) bias: *const f32,
    pub(super) runs: [(u32, isize); MR],
    pub(super) count: usize,
}

/// The implicit-GEMM convolution on AMX tiles (`conv.rs`), transposed against
/// [`avx512::kernel_bf16_taps`]: the tile's rows are 32 output channels, its columns 32
/// consecutive positions. Step `s` multiplies the packed weight step `w + s * STEP_WORDS` (32
/// channels by 16 channel pairs of one tap) by the image's 16 channel-pair planes from word
/// `steps[s]` on (read in place: a row of the tile is 16 consecutive positions of one plane,
/// `plane_words` apart), and the same 16 positions on. Rows `0..n` are stored through `tile`.
///
/// # Safety
/// [`Tiles::configure`] must have run on this thread; for every step, 16 planes of 32 words
/// from `a + steps[s]` must be readable and `w` must hold `steps.len()` packed steps; the
/// runs' lanes must be elements of the `n` output planes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16")]
pub(super) unsafe fn kernel_conv(
    steps: &[usize],
    w: *const u32,
    a: *const u32,
    plane_words: usize,
    n: usize,
    tile: &ConvTile,
) {
    // SAFETY: the caller's bounds, as stated.
    unsafe {
        zero_sums();
        for (s, &at) in steps.iter().enumerate() {
            step(w.add(s * STEP_WORDS), a.add(at), plane_words * 4);
        }
        let block = sums();
        let sums = block.0.as_ptr().cast::<f32>();
        for j in 0..n {
            let b = _mm512_set1_ps(*tile.bias.add(j));
            let row = sums.add(j * NR);
            let lo = _mm512_add_ps(_mm512_load_ps(row), b);
            let hi = _mm512_add_ps(_mm512_load_ps(row.add(16)), b);
            let v = avx512::round_bf16x2(lo, hi);
            let plane = tile.out.wrapping_add(j * tile.plane);
            for &(mask, at) in &tile.runs[..tile.count] {
                _mm512_mask_storeu_epi16(plane.wrapping_offset(at).cast(), mask, v);
            }
        }
    }
}
