//! The blocked matrix product on top of the AVX-512 kernels (12×32 tile, 14×32 for bf16) or, on processors
//! without AVX-512, the AVX2 ones (6×16 tile, f32 only: 16-bit inputs are widened while packed).
//!
//! Goto's scheme: for each block of `NC` columns and `KC` steps of `k`, the `KC x NC` block of
//! `b` is packed into `NR`-column panels (kept in L3 and, a panel at a time, in L2; a block
//! with dense rows is read sixteen steps at a time across all its panels); for each
//! block of `MC` rows the `MC x KC` block of `a` is packed into `MR`-row panels (kept in L2);
//! the micro-kernel then runs over every `MR x NR` tile. Packing reads any strides (dense
//! rows or columns take vector paths, transposed blocks 16x16 register transposes) and
//! converts f16/bf16 to f32 for the f32 kernel; the bf16 kernel takes pairs of `k` packed
//! into 32-bit words, as `vdpbf16ps` wants them.
//!
//! Products split across threads by rows (or by columns when there are few rows). Split by
//! rows, the threads first pack all of `b` between them, once, where its panels take between
//! 512 KiB and 16 MiB, and then each packs its own blocks of `a`; otherwise each thread packs
//! its own blocks of both, and the threads never wait for each other. 16-bit outputs are
//! rounded once: when `k` needs several blocks the partial sums wait in an f32 scratch. A bias
//! of one value per column is added as the tiles of the first block of `k` are stored.

use std::cell::Cell;

use rayon::prelude::*;
use tpu_tensor::Result;

use super::{Elem, Kind, MatView};
use crate::cpu::isa;
use tpu_tensor::Error;

#[cfg(target_arch = "x86_64")]
use super::amx;
#[cfg(target_arch = "x86_64")]
use super::avx2;
#[cfg(target_arch = "x86_64")]
use super::avx512::{self, Io};

/// Which kernels a product runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    /// The AVX-512 tiles, 12×32 and 14×32 for bf16 (and the direct kernel and the gemv paths).
    Avx512,
    /// The 6×16 AVX2 tile.
    Avx2,
}

impl Isa {
    /// The kernels the current level allows, if any.
    fn now() -> Option<Isa> {
        match isa::level() {
            _ if !cfg!(target_arch = "x86_64") => None,
            isa::Level::Avx512 => Some(Isa::Avx512),
            isa::Level::Avx2 => Some(Isa::Avx2),
            isa::Level::Portable => None,
        }
    }

    /// Rows and columns of the register tile (of the bf16 kernel with `bf16`).
    #[cfg(target_arch = "x86_64")]
    fn tile(self, bf16: bool) -> (usize, usize) {
        match self {
            Isa::Avx512 if bf16 && amx::available() => (amx::MR, avx512::NR),
            Isa::Avx512 if bf16 => (avx512::MR_BF16, avx512::NR),
            Isa::Avx512 => (avx512::MR, avx512::NR),
            Isa::Avx2 => (avx2::MR, avx2::NR),
        }
    }
}

/// Steps of `k` per packed block for the f32 kernel: the `KC x NR` panel of `b` (128 KiB)
/// streams from L2, and products with `k` up to this take one block, so `c` is written once
/// (a 16-bit `c` also needs no f32 scratch). Measured against 512 (and `MC` 240): 2048³
/// 3 % faster, 1024³ 1-2 % on one thread and two.
const KC_F32: usize = 1024;
/// The same for bf16 (pairs of steps are one 32-bit word): products with `k` up to 2048 take
/// one block, so the tiles are stored once, rounded, without the f32 scratch. Measured against
/// 512 (and `MC` 240) on two threads: 1024³ 7 % faster, 2048³ 6 %, 128x1536 by 1536x1536ᵀ 10 %.
const KC_BF16: usize = 2048;
/// Rows of `a` per packed block for the f32 kernel (a multiple of `MR`): `MC x KC` fills
/// about half of L2.
const MC_F32: usize = 120;
/// The same for the bf16 kernel (a multiple of its 14 rows): 42 rows of up to 1024 words
/// (168 KiB), beside a `KC x NR` panel of `b` of up to 128 KiB in L2 (28, 56, 70 and 240 rows
/// measured level or slower).
const MC_BF16: usize = 42;
/// The same for the AMX kernel (a multiple of its 32 rows): up to 384 rows of `a` (1.5 MiB at
/// `k` = 2048) in the 2 MiB L2 of the machines that have AMX, so each panel of `b` serves as
/// many tiles. Measured on two threads against 64, 128, 256 and 512 (and blocks of `k` of 256
/// to 2048): 2048³ 10.2-10.4 ms against 13.5 at 64, 1024³ level with 128-256 within noise.
const MC_AMX: usize = 384;
/// Columns of `b` per packed block (a multiple of `NR`).
const NC: usize = 2048;
/// f32 elements of the scratch that holds partial sums of 16-bit outputs (per thread).
const SCRATCH: usize = 1 << 20;
/// Columns up to which f32 rows of `a` dense along `k` are read unpacked.
#[cfg(target_arch = "x86_64")]
const DIRECT_COLS: usize = 4 * avx512::NR;
/// Words of `b`'s panels from which a product split by rows packs them once, the threads
/// sharing the packing, before the parts run: each part would otherwise pack all of `b`
/// itself, a pass that takes the more of each thread's time the more threads there are.
const SHARED_MIN: usize = 1 << 17;
/// Words of panels up to which they are packed whole (16 MiB, kept by the calling thread).
const SHARED_MAX: usize = 1 << 22;
/// Multiply-adds below which a matrix-vector product stays on one thread.
const GEMV_PAR: usize = 1 << 17;

/// One 64-byte line of packing memory.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Line(pub(super) [u32; 16]);

thread_local! {
    /// Packing memory of this thread, reused between products.
    static BUFFER: Cell<Vec<Line>> = const { Cell::new(Vec::new()) };
    /// Panels of a `b` that this thread's product shares with the threads it splits across
    /// ([`Job::run_parts_shared`]), reused between products.
    static SHARED: Cell<Vec<Line>> = const { Cell::new(Vec::new()) };
}

/// At least `lines` lines of `slot`'s memory (taken out, so a product nested on the same
/// thread gets its own).
fn take_lines(slot: &'static std::thread::LocalKey<Cell<Vec<Line>>>, lines: usize) -> Vec<Line> {
    let mut v = slot.with(|b| b.take());
    if v.len() < lines {
        v = vec![Line([0; 16]); lines];
    }
    v
}

/// Gives memory from [`take_lines`] back to `slot`, which keeps the larger of two.
fn give_lines(slot: &'static std::thread::LocalKey<Cell<Vec<Line>>>, v: Vec<Line>) {
    slot.with(|b| {
        let old = b.take();
        b.set(if old.len() > v.len() { old } else { v });
    });
}

/// Where all of `b` lies when packed in panels ([`Job::pack_panels`], [`PackedPanels`]): the
/// blocks of `kc_step` steps of `k` one after another, `block` words apart, and in each block
/// the panels of `tnr` columns, each `kw * tnr` words after the one before (`kw` the block's
/// words per lane).
struct Panels {
    kc_step: usize,
    tnr: usize,
    block: usize,
}

impl Panels {
    /// The word where the panel of column `jc` (a multiple of `tnr`) of the block starting at
    /// step `pc` begins, the block holding `kw` words per lane.
    fn at(&self, pc: usize, jc: usize, kw: usize) -> usize {
        pc / self.kc_step * self.block + jc / self.tnr * kw * self.tnr
    }
}

/// `c = a · b` (or `c += a · b` when `accumulate`) with f32 accumulation, where `c` is the
/// dense row-major `a.rows x b.cols` result, split across up to `threads` threads of the
/// calling rayon pool. 16-bit outputs are rounded once, from the f32 sum (to nearest, ties to
/// even), `c`'s old value included when `accumulate`.
///
/// The operands may have any strides (transposed, strided or broadcast); they are read in
/// place. With AVX-512 the packed-panel kernels run (`vdpbf16ps` for bf16 inputs when the
/// processor has it); below, the product is computed with faer on f32 copies.
pub fn gemm<I: Elem, O: Elem>(
    a: MatView<'_, I>,
    b: MatView<'_, I>,
    c: &mut [O],
    accumulate: bool,
    threads: usize,
) -> Result<()> {
    gemm_with(a, b, c, accumulate, None, threads)
}

/// `c = bias + a · b` as [`gemm`] computes it with `c` first filled with `bias` (`n`
/// values, one per column, added to every row) and `accumulate` set, the same bits: the
/// kernels' epilogues add `bias` to the tiles they store, so `c` is neither filled nor read
/// (a third of the passes over the output of `linear` with a bias).
pub fn gemm_bias<I: Elem, O: Elem>(
    a: MatView<'_, I>,
    b: MatView<'_, I>,
    bias: &[O],
    c: &mut [O],
    threads: usize,
) -> Result<()> {
    check_bias(bias, b.cols)?;
    gemm_with(a, b, c, false, Some(bias), threads)
}

/// Checks that `bias` holds one value per column of an `n`-column product.
fn check_bias<O>(bias: &[O], n: usize) -> Result<()> {
    if bias.len() != n {
        return Err(Error::internal(
            "matmul",
            format!("a bias of {} values for {n} columns", bias.len()),
        ));
    }
    Ok(())
}

/// Fills every row of the `n`-column `c` with `bias`, for the routes whose kernels do not add
/// a bias themselves (they then accumulate onto it).
fn fill_rows<O: Copy>(c: &mut [O], bias: &[O]) {
    for row in c.chunks_exact_mut(bias.len()) {
        row.copy_from_slice(bias);
    }
}

/// [`gemm`], or [`gemm_bias`] when `bias` is given (then `accumulate` is false).
fn gemm_with<I: Elem, O: Elem>(
    a: MatView<'_, I>,
    b: MatView<'_, I>,
    c: &mut [O],
    mut accumulate: bool,
    bias: Option<&[O]>,
    threads: usize,
) -> Result<()> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || m.checked_mul(n) != Some(c.len()) {
        return Err(Error::internal(
            "matmul",
            format!(
                "a {}x{} by {}x{} product into {} elements",
                a.rows,
                a.cols,
                b.rows,
                b.cols,
                c.len()
            ),
        ));
    }
    a.check("the first operand")?;
    b.check("the second operand")?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    // Only the packed kernels add a bias as they store: the other routes (nothing to multiply,
    // no SIMD kernels, a matrix-vector product) accumulate onto it.
    let bias = match bias {
        Some(r) if k == 0 || m == 1 || n == 1 || Isa::now().is_none() => {
            fill_rows(c, r);
            accumulate = true;
            None
        }
        bias => bias,
    };
    if k == 0 {
        if !accumulate {
            c.fill(O::from_f32(0.0));
        }
        return Ok(());
    }
    let Some(kernels) = Isa::now() else {
        portable(a, b, c, accumulate, threads);
        return Ok(());
    };
    #[cfg(target_arch = "x86_64")]
    {
        if n == 1 || m == 1 {
            if kernels == Isa::Avx512 && gemv(a, b, c, accumulate, threads) {
                return Ok(());
            }
            if kernels == Isa::Avx2 {
                // A 6-row tile would waste most of its work on one row or column.
                portable(a, b, c, accumulate, threads);
                return Ok(());
            }
        }
        let bf16 = I::KIND == Kind::Bf16 && isa::has_avx512_bf16();
        let (mut job, parts) = if swaps::<I, O>(&a, &b, kernels) {
            let (at, bt) = (b.t(), a.t());
            let mut job = Job::new(&at, &bt, c, accumulate, kernels, false, None);
            job.transposed = true;
            (job, split(n, m, threads.max(1), kernels, false))
        } else {
            let job = Job::new(&a, &b, c, accumulate, kernels, bf16, None);
            let bf16 = job.bf16;
            (job, split(m, n, threads.max(1), kernels, bf16))
        };
        job.bias = bias.map(<[O]>::as_ptr);
        // SAFETY: `job` describes the checked operands and the whole of `c`; the level check
        // above found the kernels' features (and `job.bf16` AVX512_BF16); `split` gives
        // disjoint parts.
        unsafe { job.run_parts_shared(parts) };
    }
    Ok(())
}

/// Whether `gemm` computes `a · b` as `(bᵀ · aᵀ)ᵀ`: for f32 `x · Wᵀ`, as `linear` reads its
/// weight (`a` few rows dense along `k`, `b` transposed: its columns dense along `k`), on
/// AVX-512. The straight product packs all of the wide `W` transposed, 16×16 blocks at a
/// time, about a tenth of an MLP training step's time; swapped, `W`'s rows feed the kernel
/// in place ([`avx512::kernel_f32_direct`]), only the few rows of `x` are packed, and the
/// tiles are transposed in registers as they are stored. Each element is the same chain of
/// multiply-adds in the same order, so the bits do not change. A narrow `W` (fewer columns
/// than rows, as a classifier's last layer) swaps too where its columns fill more of the
/// tile's 12 rows than of its 32 columns (10 classes: 83 % of the tile's lanes used, not 31 %).
#[cfg(target_arch = "x86_64")]
fn swaps<I: Elem, O: Elem>(a: &MatView<'_, I>, b: &MatView<'_, I>, kernels: Isa) -> bool {
    // The share of a tile's lanes that `rows x cols` of output uses in `mr x nr` tiles.
    let used = |rows: usize, cols: usize, mr: usize, nr: usize| {
        (rows * cols) as f64 / (rows.next_multiple_of(mr) * cols.next_multiple_of(nr)) as f64
    };
    let (m, n) = (a.rows, b.cols);
    kernels == Isa::Avx512
        && I::KIND == Kind::F32
        && O::KIND == Kind::F32
        && a.cs == 1
        && b.rs == 1
        && b.cs != 1
        && m <= DIRECT_COLS
        && (n > m || used(n, m, avx512::MR, avx512::NR) > used(m, n, avx512::MR, avx512::NR))
}

/// The product without the SIMD kernels: faer on dense f32 copies of the operands, then one
/// rounding into `c`.
fn portable<I: Elem, O: Elem>(
    a: MatView<'_, I>,
    b: MatView<'_, I>,
    c: &mut [O],
    accumulate: bool,
    threads: usize,
) {
    use faer::{Accum, Mat, MatMut, MatRef, Par};
    let par = if threads > 1 {
        Par::rayon(threads)
    } else {
        Par::Seq
    };
    // f32 operands with a unit stride are read in place (copying them element by element
    // costs more than the product for the short, wide products of dequantised panels).
    fn in_place<'a, I: Elem>(v: &MatView<'a, I>) -> Option<MatRef<'a, f32>> {
        let d = I::as_f32(v.data)?.get(v.offset..)?;
        if v.cs == 1 && v.rs >= v.cols {
            Some(MatRef::from_row_major_slice_with_stride(
                d, v.rows, v.cols, v.rs,
            ))
        } else if v.rs == 1 && v.cs >= v.rows {
            Some(MatRef::from_column_major_slice_with_stride(
                d, v.rows, v.cols, v.cs,
            ))
        } else {
            None
        }
    }
    if let (Some(fa), Some(fb)) = (in_place(&a), in_place(&b))
        && let Some(dc) = O::as_f32_mut(c)
    {
        let fc = MatMut::from_row_major_slice_mut(dc, a.rows, b.cols);
        let acc = if accumulate {
            Accum::Add
        } else {
            Accum::Replace
        };
        faer::linalg::matmul::matmul(fc, acc, fa, fb, 1.0, par);
        return;
    }
    let at =
        |v: &MatView<'_, I>, i: usize, j: usize| v.data[v.offset + i * v.rs + j * v.cs].to_f32();
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let fa = Mat::<f32>::from_fn(m, k, |i, j| at(&a, i, j));
    let fb = Mat::<f32>::from_fn(k, n, |i, j| at(&b, i, j));
    let mut fc = Mat::<f32>::from_fn(m, n, |i, j| {
        if accumulate {
            c[i * n + j].to_f32()
        } else {
            0.0
        }
    });
    faer::linalg::matmul::matmul(fc.as_mut(), Accum::Add, fa.as_ref(), fb.as_ref(), 1.0, par);
    for (i, row) in c.chunks_mut(n).enumerate() {
        for (j, o) in row.iter_mut().enumerate() {
            *o = O::from_f32(fc[(i, j)]);
        }
    }
}

type Range = std::ops::Range<usize>;

/// Steps of `k` per packed block, and the 32-bit words each step's lane takes in a panel:
/// `k` in as few blocks as the kernel's limit allows, of even and near-equal lengths.
fn k_blocking(k: usize, bf16: bool) -> (usize, usize) {
    let kmax = if bf16 { KC_BF16 } else { KC_F32 };
    let kc_step = k.div_ceil(k.div_ceil(kmax).max(1)).next_multiple_of(2);
    (kc_step, if bf16 { kc_step / 2 } else { kc_step })
}

/// Up to `threads` parts of an `m x n` output: row ranges (whole tiles; for the bf16 kernel,
/// even numbers of rows), or column ranges when the rows are too few to share.
fn split(m: usize, n: usize, threads: usize, kernels: Isa, bf16: bool) -> Vec<(Range, Range)> {
    #[cfg(target_arch = "x86_64")]
    let (mr, nr) = kernels.tile(bf16);
    #[cfg(not(target_arch = "x86_64"))]
    let (mr, nr) = {
        let _ = (kernels, bf16);
        (1, 1)
    };
    let (tm, tn) = (m.div_ceil(mr), n.div_ceil(nr));
    // Each part packs all of the other operand's blocks (a split by columns all of `a`; one
    // by rows all of `b`, unless the threads share that packing), so the split goes along
    // the longer side.
    let by_rows = tn < threads || m >= n;
    let (tiles, unit, len) = if by_rows { (tm, mr, m) } else { (tn, nr, n) };
    let parts = threads.min(tiles).max(1);
    // The bf16 kernel runs a tile of fewer rows in about that share of a whole tile's time
    // ([`avx512::kernel_bf16`]), so its rows are shared out evenly (in pairs) rather than in
    // whole tiles: 1024 rows as 512 and 512, each ending in a tile of 8, take less time than
    // 518 and 506 rows as 37 tiles and 36 and a bit (by the tiles' count, about 1 %; not
    // measured: the machine at hand runs bf16 on AMX tiles, whose split stays by tiles).
    #[cfg(target_arch = "x86_64")]
    let even = bf16 && mr != amx::MR;
    #[cfg(not(target_arch = "x86_64"))]
    let even = false;
    let bound = |p: usize| {
        if by_rows && even {
            (len * p / parts) & !1
        } else {
            (tiles * p / parts * unit).min(len)
        }
    };
    (0..parts)
        .map(|p| {
            let (lo, hi) = (bound(p), if p + 1 == parts { len } else { bound(p + 1) });
            if by_rows {
                (lo..hi, 0..n)
            } else {
                (0..m, lo..hi)
            }
        })
        .collect()
}

/// `c = w + alpha * (a · b)` in one pass over `c` for f32 operands, where `w` and `c` are dense
/// row-major `a.rows x b.cols` matrices: the product's sums are scaled and added to `w` as
/// they are stored, so `a · b` is never written out and read back. Each element is `w +
/// (sum * alpha)`, two roundings, as the ops `mul` and `add` (or `sub` with `-alpha`) give
/// them one after the other. Returns false, with `c` untouched, where one pass cannot keep
/// those bits (a `k` longer than one block would add `w` to a partial sum) or the AVX-512
/// kernels do not run: the caller then multiplies and adds apart.
pub fn gemm_update_f32(
    a: MatView<'_, f32>,
    b: MatView<'_, f32>,
    w: &[f32],
    alpha: f32,
    c: &mut [f32],
    threads: usize,
) -> Result<bool> {
    if w.len() != c.len() {
        return Err(Error::internal(
            "matmul",
            format!("{} elements added into {}", w.len(), c.len()),
        ));
    }
    update_f32(a, b, Some(w), alpha, c, threads)
}

/// [`gemm_update_f32`] with `w` in `c`: `c = c + alpha * (a · b)`, each tile read and then
/// written in place, so an SGD step writes its weight's memory once instead of a new matrix
/// beside it. The same bits; returns false, with `c` untouched, where `gemm_update_f32` would.
pub fn gemm_update_f32_in_place(
    a: MatView<'_, f32>,
    b: MatView<'_, f32>,
    alpha: f32,
    c: &mut [f32],
    threads: usize,
) -> Result<bool> {
    update_f32(a, b, None, alpha, c, threads)
}

/// [`gemm_update_f32`], reading `w` from `c` itself when it is `None`.
fn update_f32(
    a: MatView<'_, f32>,
    b: MatView<'_, f32>,
    w: Option<&[f32]>,
    alpha: f32,
    c: &mut [f32],
    threads: usize,
) -> Result<bool> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || m.checked_mul(n) != Some(c.len()) {
        return Err(Error::internal(
            "matmul",
            format!(
                "a {m}x{k} by {}x{n} product added into {} elements",
                b.rows,
                c.len()
            ),
        ));
    }
    a.check("the first operand")?;
    b.check("the second operand")?;
    let Some(kernels) = Isa::now() else {
        return Ok(false);
    };
    if m <= 1 || n <= 1 || k == 0 || k > KC_F32 {
        return Ok(false);
    }
    #[cfg(target_arch = "x86_64")]
    {
        let mut job = Job::new(&a, &b, c, false, kernels, false, None);
        // In place, `w` is read through `c`'s own pointer, the one the tiles are stored through.
        job.addend = Some((w.map_or(job.c.cast_const(), <[f32]>::as_ptr), alpha));
        let parts = split(m, n, threads.max(1), kernels, false);
        // SAFETY: `job` describes the checked operands, the whole of `c` and a `w` of its size
        // (or `c` itself: each tile's store reads its elements of `w` before writing them, and
        // no other tile reads them); the level check above found the kernels' features; `k`
        // takes one block, so `w` is read once per tile, by the store of its final sums; the
        // parts cover disjoint tiles of `c`.
        unsafe { job.run_parts(parts) };
        Ok(true)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (w, alpha, threads);
        Ok(false)
    }
}

/// A `k x n` right operand packed once into the panels [`gemm`]'s kernels read, for products
/// that reuse it, such as a model's weights: [`gemm_packed`] reads them in place, where `gemm`
/// packs its operand again for every product (a weight read transposed, as `linear` reads it,
/// takes a fifth of a bf16 product's time to pack). The panels suit the kernels of the level
/// current when packed. `Send + Sync`; they take `b`'s size in 32-bit words per element
/// (f32, f16) or per pair (bf16 on `vdpbf16ps`), rounded up to whole panels.
pub struct PackedPanels {
    kind: Kind,
    isa: Isa,
    bf16: bool,
    k: usize,
    n: usize,
    lines: Vec<Line>,
}

impl std::fmt::Debug for PackedPanels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedPanels")
            .field("kind", &self.kind)
            .field("isa", &self.isa)
            .field("k", &self.k)
            .field("n", &self.n)
            .finish_non_exhaustive()
    }
}

impl PackedPanels {
    /// `b` in panels, or `None` where there is nothing to gain: below AVX2 (the products run on
    /// faer) or an empty `b`.
    pub fn pack<I: Elem>(b: MatView<'_, I>) -> Result<Option<PackedPanels>> {
        b.check("the packed operand")?;
        let (k, n) = (b.rows, b.cols);
        let Some(isa) = Isa::now() else {
            return Ok(None);
        };
        if k == 0 || n == 0 {
            return Ok(None);
        }
        #[cfg(target_arch = "x86_64")]
        {
            let bf16 = isa == Isa::Avx512 && I::KIND == Kind::Bf16 && isa::has_avx512_bf16();
            // Only `b` and the packing parts of the job are used: `a` and `c` are stand-ins,
            // so `k` is set from `b`.
            let mut job = Job::<I, f32>::new(&b, &b, &mut [], false, isa, bf16, None);
            job.k = k;
            let words = job.panel_words();
            let mut lines =
                tpu_tensor::tpu_runtime::memory::try_host_capacity(words.div_ceil(16), || {
                    format!("the panels of a {k}x{n} matrix")
                })?;
            lines.resize(words.div_ceil(16), Line([0; 16]));
            // SAFETY: `lines` holds `words` words; `b` was checked; the level check found the
            // kernels' features.
            unsafe { job.pack_panels(&mut lines, 1) };
            Ok(Some(PackedPanels {
                kind: I::KIND,
                isa,
                bf16,
                k,
                n,
                lines,
            }))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = isa;
            Ok(None)
        }
    }

    /// `(k, n)`: the shape of the matrix packed.
    pub fn shape(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// Bytes the panels take.
    pub fn nbytes(&self) -> usize {
        self.lines.len() * std::mem::size_of::<Line>()
    }
}

/// `c = a · b` (or `c += a · b` when `accumulate`) as [`gemm`] computes it, with `b` read from
/// its panels: the same bits as `gemm` gives with the matrix they were packed from, except
/// where `gemm` takes its matrix-vector path (`a` of one row, or one column in `b`). Returns
/// false, with `c` untouched, when the panels suit other kernels than the level now allows
/// (the caller then multiplies with the matrix itself).
pub fn gemm_packed<I: Elem, O: Elem>(
    a: MatView<'_, I>,
    b: &PackedPanels,
    c: &mut [O],
    accumulate: bool,
    threads: usize,
) -> Result<bool> {
    gemm_packed_with(a, b, c, accumulate, None, threads)
}

/// [`gemm_packed`] adding `bias` (one value per column) as [`gemm_bias`] does: the bits of
/// `gemm_packed` with `c` filled with `bias` and `accumulate` set.
pub fn gemm_packed_bias<I: Elem, O: Elem>(
    a: MatView<'_, I>,
    b: &PackedPanels,
    bias: &[O],
    c: &mut [O],
    threads: usize,
) -> Result<bool> {
    check_bias(bias, b.n)?;
    gemm_packed_with(a, b, c, false, Some(bias), threads)
}

/// [`gemm_packed`], or [`gemm_packed_bias`] when `bias` is given.
fn gemm_packed_with<I: Elem, O: Elem>(
    a: MatView<'_, I>,
    b: &PackedPanels,
    c: &mut [O],
    accumulate: bool,
    bias: Option<&[O]>,
    threads: usize,
) -> Result<bool> {
    let (m, k, n) = (a.rows, a.cols, b.n);
    if I::KIND != b.kind || k != b.k || m.checked_mul(n) != Some(c.len()) {
        return Err(Error::internal(
            "matmul",
            format!(
                "a {m}x{k} {:?} matrix by {}x{n} {:?} panels into {} elements",
                I::KIND,
                b.k,
                b.kind,
                c.len()
            ),
        ));
    }
    a.check("the first operand")?;
    #[cfg(target_arch = "x86_64")]
    {
        let bf16 = I::KIND == Kind::Bf16 && isa::has_avx512_bf16();
        if Isa::now() != Some(b.isa) || (bf16 && b.isa == Isa::Avx512) != b.bf16 {
            return Ok(false);
        }
        if m == 0 {
            return Ok(true);
        }
        // `b`'s view fields are stand-ins (`a`'s): the panels replace them.
        let mut job = Job::new(&a, &a, c, accumulate, b.isa, b.bf16, None);
        job.packed = Some(b.lines.as_ptr().cast());
        job.n = n;
        job.bias = bias.map(<[O]>::as_ptr);
        let parts = split(m, n, threads.max(1), b.isa, job.bf16);
        // SAFETY: `job` describes the checked `a`, panels of the shape and kernels the checks
        // above matched, and the whole of `c`; the parts cover disjoint tiles of `c`.
        unsafe { job.run_parts(parts) };
        Ok(true)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (accumulate, bias, threads);
        Ok(false)
    }
}

/// A product in raw pointers (checked by [`gemm`]): `a` and `b` at their `(0, 0)` elements.
#[cfg(target_arch = "x86_64")]
struct Job<I, O> {
    a: *const I,
    ars: usize,
    acs: usize,
    b: *const I,
    brs: usize,
    bcs: usize,
    c: *mut O,
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
    /// Which kernels run.
    isa: Isa,
    /// Whether to use the bf16 kernel (else f32, converting while packing); AVX-512 only.
    bf16: bool,
    /// Whether the bf16 kernel is the one on AMX tiles ([`amx::kernel_bf16`]), which packs
    /// `a` its own way.
    amx: bool,
    /// A dense f32 `m x n` matrix `w` and a scale `alpha`: the tiles become
    /// `w + alpha * sums` (only with f32 `c` and `k` in one block; [`gemm_update_f32`]).
    addend: Option<(*const f32, f32)>,
    /// `b` already in panels ([`PackedPanels`], made for this job's kernels): read in place
    /// instead of packed (then `b`, `brs` and `bcs` are unused).
    packed: Option<*const u32>,
    /// `c` holds this job's `m x n` result transposed (element `(i, j)` at `c + j * m + i`):
    /// an f32 product computed swapped ([`swaps`]).
    transposed: bool,
    /// A bias added to the sums of the first block of `k`, in place of `c`'s old values: one
    /// value per column of `c` (per row of the job when `transposed`), never with `accumulate`.
    bias: Option<*const O>,
}

// SAFETY: a job only reads `a` and `b`, and its parts write disjoint tiles of `c`; the slices
// it was made from outlive the parallel loop that shares it.
#[cfg(target_arch = "x86_64")]
unsafe impl<I, O> Sync for Job<I, O> {}

#[cfg(target_arch = "x86_64")]
impl<I: Elem, O: Elem> Job<I, O> {
    /// The product `a · b` into the whole of `c` (checked by the caller).
    fn new(
        a: &MatView<'_, I>,
        b: &MatView<'_, I>,
        c: &mut [O],
        accumulate: bool,
        isa: Isa,
        bf16: bool,
        addend: Option<(*const f32, f32)>,
    ) -> Job<I, O> {
        Job {
            a: a.data[a.offset..].as_ptr(),
            ars: a.rs,
            acs: a.cs,
            b: b.data[b.offset..].as_ptr(),
            brs: b.rs,
            bcs: b.cs,
            c: c.as_mut_ptr(),
            m: a.rows,
            n: b.cols,
            k: a.cols,
            accumulate,
            isa,
            bf16: bf16 && isa == Isa::Avx512,
            amx: bf16 && isa == Isa::Avx512 && amx::available(),
            addend,
            packed: None,
            transposed: false,
            bias: None,
        }
    }

    /// Computes the tiles of `c` in each part: one part on this thread, more over the pool.
    ///
    /// # Safety
    /// As for [`Job::run`], for every part; the parts must not overlap.
    unsafe fn run_parts(&self, parts: Vec<(Range, Range)>) {
        if let [(rows, cols)] = &parts[..] {
            // SAFETY: forwarded from the caller.
            unsafe { self.run(rows.clone(), cols.clone()) };
        } else {
            parts.into_par_iter().for_each(|(rows, cols)| {
                // SAFETY: forwarded from the caller; the parts write disjoint tiles.
                unsafe { self.run(rows, cols) };
            });
        }
    }

    /// [`Job::run_parts`], where the parts split the rows, with all of `b` packed first, once,
    /// its panels shared out among the threads, and then read by every part in place.
    ///
    /// # Safety
    /// As for [`Job::run_parts`].
    unsafe fn run_parts_shared(&mut self, parts: Vec<(Range, Range)>) {
        let n = self.n;
        let words = self.panel_words();
        let by_rows = parts.iter().all(|(_, cols)| *cols == (0..n));
        if parts.len() < 2
            || !by_rows
            || self.packed.is_some()
            || self.addend.is_some()
            || !(SHARED_MIN..=SHARED_MAX).contains(&words)
        {
            // SAFETY: forwarded from the caller.
            return unsafe { self.run_parts(parts) };
        }
        let mut buf = take_lines(&SHARED, words.div_ceil(16));
        // SAFETY: `buf` holds at least `words` words; the caller's operands and features.
        unsafe { self.pack_panels(&mut buf, parts.len()) };
        self.packed = Some(buf.as_ptr().cast());
        // SAFETY: forwarded from the caller; the panels cover `b` whole, as
        // [`Job::pack_panels`] lays them out.
        unsafe { self.run_parts(parts) };
        self.packed = None;
        give_lines(&SHARED, buf);
    }

    /// Computes the tiles of `c` in `rows x cols`.
    ///
    /// # Safety
    /// The job's pointers and strides must describe the operands checked by [`gemm`], the
    /// processor must have the kernels' features, and no other thread may write these tiles.
    unsafe fn run(&self, rows: Range, cols: Range) {
        if rows.is_empty() || cols.is_empty() {
            return;
        }
        let (m, n, k) = (self.m, self.n, self.k);
        let (tmr, tnr) = self.isa.tile(self.bf16);
        debug_assert!(rows.end <= m && cols.end <= n);
        let mc_max = match (self.amx, self.bf16) {
            (true, _) => MC_AMX,
            (false, true) => MC_BF16,
            (false, false) => MC_F32,
        };
        let (kc_step, kw_step) = k_blocking(k, self.bf16);
        let kblocks = k.div_ceil(kc_step);
        let mrows = rows.len();
        let mblocks = mrows.div_ceil(mc_max);
        let mc_step = mrows.div_ceil(mblocks).next_multiple_of(tmr);
        let scratch_needed = O::KIND != Kind::F32 && kblocks > 1;
        let nc_max = if scratch_needed {
            (SCRATCH / mrows / tnr * tnr).clamp(tnr, NC)
        } else {
            NC
        }
        .min(cols.len().next_multiple_of(tnr));
        // f32 rows of `a` dense along `k` feed the kernel unpacked when few column panels
        // would share each packed one.
        let direct = self.isa == Isa::Avx512
            && I::KIND == Kind::F32
            && self.acs == 1
            && cols.len() <= DIRECT_COLS;
        // Rows of `a` a multiple of 2 KiB apart fall into one or two sets of the L1 cache,
        // too few ways for a tile's rows: the kernel then reads a copy, rows a line apart
        // more than `kc` (x · Wᵀ for W 1024 wide ran at 135 GFLOP/s in place, 180 copied).
        let copied = direct && self.ars != 0 && self.ars.is_multiple_of(512);
        let lda = if copied { kc_step + 16 } else { self.ars };
        // Words of one packed tile of rows of `a`.
        let a_tile = if self.amx {
            kc_step.div_ceil(32) * amx::STEP_WORDS
        } else {
            kw_step * tmr
        };
        let a_words = match (direct, copied) {
            (false, _) => mc_step / tmr * a_tile,
            (true, true) => mc_step * lda,
            (true, false) => 0,
        };
        let b_words = if self.packed.is_some() {
            0
        } else {
            nc_max * kw_step
        };
        let s_words = if scratch_needed { mrows * nc_max } else { 0 };
        let lines = |w: usize| w.div_ceil(16);
        let mut buf = take_lines(&BUFFER, lines(a_words) + lines(b_words) + lines(s_words));
        let base = buf.as_mut_ptr().cast::<u32>();
        // SAFETY: the three regions lie inside `buf`, each starting on a 64-byte line.
        let (apack, bpack, scratch) = unsafe {
            (
                base,
                base.add(lines(a_words) * 16),
                base.add((lines(a_words) + lines(b_words)) * 16)
                    .cast::<f32>(),
            )
        };
        let out = |i: usize, j: usize| {
            if self.transposed {
                // SAFETY: as below, with `c` an f32 `n x m` matrix ([`swaps`]).
                Io::F32T(unsafe { self.c.add(j * m + i) }.cast(), m)
            } else {
                // SAFETY: `(i, j)` lies in `c` (the callers pass tile origins inside it).
                Io::of::<O>(unsafe { self.c.add(i * n + j) }, n)
            }
        };
        // The bias as a tile of `ld` 0, each of its rows the same values: element `(i, j)` of
        // the tile at `(i0, j0)` is `r[j0 + j]`, or `r[i0 + i]` for a transposed `c`. Only read.
        let row = |r: *const O, i: usize, j: usize| {
            if self.transposed {
                // SAFETY: `i` is a row of the job, a column of the transposed `c`: inside `r`.
                Io::F32T(unsafe { r.add(i) }.cast_mut().cast(), 0)
            } else {
                // SAFETY: `j` is a column of `c`: inside `r`, which holds `n` values.
                Io::of::<O>(unsafe { r.add(j) }.cast_mut(), 0)
            }
        };
        let layout = self.panels();
        // SAFETY: `amx` is set only where AMX is available.
        let _tiles = self.amx.then(|| unsafe { amx::Tiles::configure() });
        let mut jc = cols.start;
        while jc < cols.end {
            let nc = nc_max.min(cols.end - jc);
            let mut pc = 0;
            while pc < k {
                let kc = kc_step.min(k - pc);
                let kw = if self.bf16 { kc.div_ceil(2) } else { kc };
                let (first, last) = (pc == 0, pc + kc == k);
                let bpanels = match self.packed {
                    // `jc` is a multiple of `tnr`: so are the parts' column starts.
                    // SAFETY: inside the panels, which cover `b` whole.
                    Some(p) => unsafe { p.add(layout.at(pc, jc, kw)) },
                    None => {
                        // SAFETY: the panels read elements `(pc.., jc..)` of `b` inside its
                        // checked bounds and write `nc.div_ceil(tnr) * kw * tnr <= b_words`
                        // words.
                        unsafe { self.pack_b(bpack, pc, kc, jc, nc, cols.end) };
                        bpack.cast_const()
                    }
                };
                let mut ic = rows.start;
                while ic < rows.end {
                    let mc = mc_step.min(rows.end - ic);
                    if copied {
                        // SAFETY: rows `ic..ic + mc` of the checked f32 `a` hold steps
                        // `pc..pc + kc`; `mc * lda <= a_words`.
                        unsafe {
                            let a = self.a.cast::<f32>();
                            for r in 0..mc {
                                std::ptr::copy_nonoverlapping(
                                    a.add((ic + r) * self.ars + pc),
                                    apack.cast::<f32>().add(r * lda),
                                    kc,
                                );
                            }
                        }
                    } else if self.amx {
                        // SAFETY: as for `b`, with `mc.div_ceil(tmr) * a_tile <= a_words`; the
                        // AMX kernel runs only for bf16 inputs, whose elements are their bits.
                        unsafe {
                            for ip in 0..mc.div_ceil(tmr) {
                                let i = ic + ip * tmr;
                                let src = self.a.add(i * self.ars + pc * self.acs);
                                let dst = apack.add(ip * a_tile);
                                let rows = tmr.min(rows.end - i);
                                amx::pack_a(dst, src.cast(), rows, kc, self.ars, self.acs);
                            }
                        }
                    } else if !direct {
                        // SAFETY: as for `b`, with `mc.div_ceil(tmr) * kw * tmr <= a_words`.
                        unsafe {
                            for ip in 0..mc.div_ceil(tmr) {
                                let i = ic + ip * tmr;
                                let src = self.a.add(i * self.ars + pc * self.acs);
                                let dst = apack.add(ip * kw * tmr);
                                self.pack(
                                    dst,
                                    tmr,
                                    src,
                                    tmr.min(rows.end - i),
                                    kc,
                                    self.ars,
                                    self.acs,
                                );
                            }
                        }
                    }
                    for jp in 0..nc.div_ceil(tnr) {
                        let j = jc + jp * tnr;
                        let nr = tnr.min(cols.end - j);
                        for ip in 0..mc.div_ceil(tmr) {
                            let i = ic + ip * tmr;
                            let mr = tmr.min(rows.end - i);
                            // SAFETY: scratch row `i - rows.start`, column `j - jc` of the
                            // `mrows x nc_max` scratch.
                            let tmp = || unsafe {
                                Io::F32(scratch.add((i - rows.start) * nc_max + j - jc), nc_max)
                            };
                            let ld = if let Some((w, alpha)) = self.addend {
                                // SAFETY: `(i, j)` lies in `w`, which has `c`'s shape; it is
                                // only read.
                                Io::F32Scaled(unsafe { w.add(i * n + j) }.cast_mut(), n, alpha)
                            } else if first {
                                match self.bias {
                                    Some(r) => row(r, i, j),
                                    None if self.accumulate => out(i, j),
                                    None => Io::None,
                                }
                            } else if scratch_needed {
                                tmp()
                            } else {
                                out(i, j)
                            };
                            let st = if last || !scratch_needed {
                                out(i, j)
                            } else {
                                tmp()
                            };
                            // SAFETY: the packed panels hold `kw` steps of `tmr` and `tnr` lanes
                            // (or, when `direct`, rows `i..i + mr` of the checked f32 `a`, or
                            // of its copy, hold steps `pc..pc + kc`); the `mr x nr` tiles at
                            // `(i, j)` lie inside `c` and the scratch.
                            unsafe {
                                let ap = if self.amx {
                                    apack.add(ip * a_tile)
                                } else {
                                    apack.add(ip * kw * tmr)
                                };
                                let bp = bpanels.add(jp * kw * tnr);
                                if direct {
                                    let a = if copied {
                                        apack.cast::<f32>().add((i - ic) * lda)
                                    } else {
                                        self.a.add(i * self.ars + pc).cast::<f32>()
                                    };
                                    avx512::kernel_f32_direct(
                                        kw,
                                        a,
                                        lda,
                                        bp.cast(),
                                        mr,
                                        nr,
                                        ld,
                                        st,
                                    );
                                } else if self.amx {
                                    amx::kernel_bf16(kw, ap, bp, mr, nr, ld, st);
                                } else if self.isa == Isa::Avx2 {
                                    avx2::kernel_f32(kw, ap.cast(), bp.cast(), mr, nr, ld, st);
                                } else if self.bf16 {
                                    avx512::kernel_bf16(kw, ap, bp, mr, nr, ld, st);
                                } else {
                                    avx512::kernel_f32(kw, ap.cast(), bp.cast(), mr, nr, ld, st);
                                }
                            }
                        }
                    }
                    ic += mc;
                }
                pc += kc;
            }
            jc += nc;
        }
        give_lines(&BUFFER, buf);
    }

    /// Where all of `b` lies in panels ([`Job::pack_panels`]).
    fn panels(&self) -> Panels {
        let (kc_step, kw_step) = k_blocking(self.k, self.bf16);
        let tnr = self.isa.tile(self.bf16).1;
        Panels {
            kc_step,
            tnr,
            block: self.n.div_ceil(tnr) * kw_step * tnr,
        }
    }

    /// Words that all of `b` takes in panels.
    fn panel_words(&self) -> usize {
        let p = self.panels();
        self.k.div_ceil(p.kc_step) * p.block
    }

    /// Packs all of `b` into `lines`, as [`Job::run`] reads panels given to it (`packed`), laid
    /// out as [`Panels`] says. Each block of `k` is cut into `pieces` runs of whole panels,
    /// packed over the pool when there are several.
    ///
    /// # Safety
    /// `lines` must hold [`Job::panel_words`] words; `b` and the features as for
    /// [`Job::pack_b`].
    unsafe fn pack_panels(&self, lines: &mut [Line], pieces: usize) {
        let (k, n) = (self.k, self.n);
        let Panels {
            kc_step,
            tnr,
            block,
        } = self.panels();
        let panels = n.div_ceil(tnr);
        let words = self.panel_words();
        debug_assert!(lines.len() * 16 >= words);
        // SAFETY: a line is 16 plain 32-bit words (`repr(C)`), and `lines` holds `words`.
        let all =
            unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u32>(), words) };
        let mut tasks = Vec::with_capacity(k.div_ceil(kc_step) * pieces);
        for (b, mut rest) in all.chunks_mut(block).enumerate() {
            let (pc, kc) = (b * kc_step, kc_step.min(k - b * kc_step));
            let kw = if self.bf16 { kc.div_ceil(2) } else { kc };
            for piece in 0..pieces {
                let (p0, p1) = (panels * piece / pieces, panels * (piece + 1) / pieces);
                let (run, tail) = rest.split_at_mut((p1 - p0) * kw * tnr);
                rest = tail;
                if p1 > p0 {
                    tasks.push((run, pc, kc, p0 * tnr, (p1 * tnr).min(n) - p0 * tnr));
                }
            }
        }
        let pack = |(run, pc, kc, jc, nc): (&mut [u32], usize, usize, usize, usize)| {
            // SAFETY: the caller's `b` holds elements `(pc..pc + kc, jc..jc + nc)`; `run` holds
            // their `nc.div_ceil(tnr)` panels of `kw` words per lane.
            unsafe { self.pack_b(run.as_mut_ptr(), pc, kc, jc, nc, n) };
        };
        if pieces > 1 {
            tasks.into_par_iter().for_each(pack);
        } else {
            tasks.into_iter().for_each(pack);
        }
    }

    /// Packs the `kc x nc` block of `b` at `(pc, jc)` into `nc.div_ceil(tnr)` panels at `dst`,
    /// `kc.div_ceil(2)` (bf16) or `kc` words per lane each; lanes at or past `end` are 0.
    ///
    /// # Safety
    /// `b`'s elements `(pc..pc + kc, jc..end.min(jc + nc))` must be readable and `dst` must hold
    /// the panels; the processor must have the kernels' features.
    unsafe fn pack_b(&self, dst: *mut u32, pc: usize, kc: usize, jc: usize, nc: usize, end: usize) {
        let tnr = self.isa.tile(self.bf16).1;
        let kw = if self.bf16 { kc.div_ceil(2) } else { kc };
        // SAFETY: forwarded from the caller.
        unsafe {
            if self.bcs == 1 {
                let src = self.b.add(pc * self.brs + jc);
                let (f, brs) = (dst.cast(), self.brs);
                match (self.isa, self.bf16) {
                    (Isa::Avx2, _) => avx2::pack_f32_dense::<I>(f, tnr, src, nc, kc, brs),
                    (_, true) => avx512::pack_bf16_dense(dst, tnr, src.cast(), nc, kc, brs),
                    _ => avx512::pack_f32_dense::<I>(f, tnr, src, nc, kc, brs),
                }
            } else {
                for jp in 0..nc.div_ceil(tnr) {
                    let j = jc + jp * tnr;
                    let src = self.b.add(pc * self.brs + j * self.bcs);
                    let d = dst.add(jp * kw * tnr);
                    self.pack(d, tnr, src, tnr.min(end - j), kc, self.bcs, self.brs);
                }
            }
        }
    }

    /// Packs `lanes` lanes of `kc` steps into an `r`-lane panel for this job's kernel.
    ///
    /// # Safety
    /// As for [`avx512::pack_f32`] / [`avx512::pack_bf16`] / [`avx2::pack_f32`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn pack(
        &self,
        dst: *mut u32,
        r: usize,
        src: *const I,
        lanes: usize,
        kc: usize,
        ls: usize,
        ks: usize,
    ) {
        // SAFETY: forwarded from the caller; the bf16 kernel runs only for bf16 inputs, whose
        // elements are their u16 bits.
        unsafe {
            if self.isa == Isa::Avx2 {
                avx2::pack_f32::<I>(dst.cast(), r, src, lanes, kc, ls, ks);
            } else if self.bf16 {
                avx512::pack_bf16(dst, r, src.cast(), lanes, kc, ls, ks);
            } else {
                avx512::pack_f32::<I>(dst.cast(), r, src, lanes, kc, ls, ks);
            }
        }
    }
}

/// A matrix-vector product (`m == 1` or `n == 1`) when the matrix is dense along `k` or along
/// the output; returns false to leave other layouts to the general kernel.
#[cfg(target_arch = "x86_64")]
fn gemv<I: Elem, O: Elem>(
    a: MatView<'_, I>,
    b: MatView<'_, I>,
    c: &mut [O],
    accumulate: bool,
    threads: usize,
) -> bool {
    let k = a.cols;
    // The matrix as (output index, k) with strides (mt, mk); the vector with stride vs.
    let (mat, len, mt, mk, vec, vs) = if b.cols == 1 {
        (a, a.rows, a.rs, a.cs, b, b.rs)
    } else {
        (b, b.cols, b.cs, b.rs, a, a.cs)
    };
    let dot = mk == 1 || k == 1;
    if !(dot || mt == 1 || len == 1) {
        return false;
    }
    let v: Vec<f32> = (0..k)
        .map(|p| vec.data[vec.offset + p * vs].to_f32())
        .collect();
    let data = &mat.data[mat.offset..];
    let store = |out: &mut [O], acc: &[f32]| {
        for (o, &x) in out.iter_mut().zip(acc) {
            let prev = if accumulate { o.to_f32() } else { 0.0 };
            *o = O::from_f32(prev + x);
        }
    };
    let parallel = threads > 1 && len * k >= GEMV_PAR;
    if dot {
        let chunk = |t0: usize, out: &mut [O]| {
            let mut acc = vec![0.0f32; out.len()];
            // SAFETY: elements `(t0 + t, p)` of the checked matrix for `t < out.len()`,
            // `p < k`; `mk == 1` or `k == 1`.
            unsafe {
                let m = data.as_ptr().add(t0 * mt);
                avx512::gemv_dot::<I>(m, mt, out.len(), k, v.as_ptr(), &mut acc);
            }
            store(out, &acc);
        };
        if parallel && len >= 256 {
            let per = len.div_ceil(threads).next_multiple_of(128);
            c.par_chunks_mut(per)
                .enumerate()
                .for_each(|(i, out)| chunk(i * per, out));
        } else {
            chunk(0, c);
        }
    } else {
        // Along the output the matrix is dense: the threads share `k`, each streaming its own
        // run of rows, and their partial sums are added at the end.
        let part = |p0: usize, p1: usize| {
            let mut acc = vec![0.0f32; len];
            // SAFETY: elements `(t, p0 + p)` of the checked matrix for `t < len`,
            // `p < p1 - p0`; `mt == 1` or `len == 1`.
            unsafe {
                let m = data.as_ptr().add(p0 * mk);
                avx512::gemv_axpy::<I>(m, mk, len, p1 - p0, &v[p0..p1], &mut acc);
            }
            acc
        };
        let acc = if parallel && k >= 2 * threads {
            let parts: Vec<Vec<f32>> = (0..threads)
                .into_par_iter()
                .map(|i| part(k * i / threads, k * (i + 1) / threads))
                .collect();
            let mut acc = vec![0.0f32; len];
            for p in &parts {
                for (a, x) in acc.iter_mut().zip(p) {
                    *a += x;
                }
            }
            acc
        } else {
            part(0, k)
        };
        store(c, &acc);
    }
    true
}
