//! Products of f32 activations with matrices of GGML's quantised blocks (Q4_0, Q4_1, Q8_0: 32
//! weights per block, an f16 scale, for Q4_1 also an f16 minimum), without the matrix ever
//! being dequantised to memory as a whole.
//!
//! The blocks are repacked once, when the matrix is made: 16 output rows side by side, so one
//! vector holds one column of 16 rows and a step of the product is a broadcast activation times
//! that vector (no horizontal sums in the inner loop). Within a block the kernel sums `q · x`
//! and applies the block's scale once per row (`d · Σ q x + m · Σ x`), so the inner loop is a
//! widening load, a conversion and a fused multiply-add per 16 weights, and the matrix is read
//! at its quantised size (0.56–1.06 bytes per weight instead of 4). Activations stay f32: the
//! results are those of the dequantised f32 matrix up to rounding. (llama.cpp rounds activations
//! to 8 bits for integer dot products; its text drifts from the f32 model's after a few tokens.)
//!
//! A few activation rows (decode) run that kernel. Many rows (prefill) dequantise panels of
//! rows to f32, bit for bit as [`tpu_tensor::gguf::dequantize`] does, and multiply them with
//! [`super::gemm`], so the long prompts run at the f32 product's speed with the f32 model's
//! results.
//!
//! Hand-written because no crate multiplies GGML blocks by f32 activations; the AVX-512 or
//! AVX2+FMA kernels are chosen at run time ([`crate::cpu::isa::level`]), the portable ones serve
//! every other processor with the same layout.

use rayon::prelude::*;
use tpu_tensor::{Error, Result, f16};

use super::MatView;
use crate::cpu::isa::{Level, level};

/// Weights per block.
pub const BLOCK: usize = 32;
/// Rows packed side by side (one vector of f32).
const G: usize = 16;
/// Activation rows above which the product dequantises panels and runs the f32 product.
const SMALL_M: usize = 8;
/// The most f32 values one dequantised panel holds (256 KiB: it stays in L2 while multiplied).
const PANEL_VALUES: usize = 1 << 16;

/// A quantised block format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// An f16 scale `d` and 32 4-bit values `q`: `(q - 8) · d`.
    Q4_0,
    /// An f16 scale `d`, an f16 minimum `m` and 32 4-bit values `q`: `q · d + m`.
    Q4_1,
    /// An f16 scale `d` and 32 signed bytes `q`: `q · d`.
    Q8_0,
}

impl QuantFormat {
    /// Bytes of one block in GGML's layout.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q8_0 => 34,
        }
    }

    /// GGML's name of the format.
    pub fn name(self) -> &'static str {
        match self {
            QuantFormat::Q4_0 => "Q4_0",
            QuantFormat::Q4_1 => "Q4_1",
            QuantFormat::Q8_0 => "Q8_0",
        }
    }

    /// Bytes of packed values per block of one row.
    fn packed(self) -> usize {
        match self {
            QuantFormat::Q8_0 => BLOCK,
            _ => BLOCK / 2,
        }
    }
}

/// A `rows × cols` matrix of quantised blocks in the kernels' layout: groups of 16 rows, and
/// within a group, block by block, each column of the 16 rows contiguous (Q8_0: one byte per
/// row and column; Q4: one byte per row holding columns `2p` (low nibble) and `2p + 1`), with the
/// groups' f16 scales (and minimums) 16 to a vector. Rows past `rows` in the last group are
/// zero.
#[derive(Clone, Debug)]
pub struct PackedQuant {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    /// Blocks per row.
    nb: usize,
    /// Groups of 16 rows.
    ng: usize,
    q: Vec<u8>,
    d: Vec<u16>,
    m: Vec<u16>,
}

impl PackedQuant {
    /// Packs `rows` rows of `cols` weights stored as GGML blocks, row after row, in `bytes`.
    pub fn pack(format: QuantFormat, rows: usize, cols: usize, bytes: &[u8]) -> Result<Self> {
        const OP: &str = "quantized matrix";
        if !cols.is_multiple_of(BLOCK) || cols == 0 {
            return Err(Error::shape(
                OP,
                format!(
                    "{} rows hold blocks of {BLOCK} weights, got rows of {cols}",
                    format.name()
                ),
            ));
        }
        let nb = cols / BLOCK;
        let bb = format.block_bytes();
        let want = rows.checked_mul(nb).and_then(|n| n.checked_mul(bb));
        if want != Some(bytes.len()) {
            return Err(Error::invalid_argument(
                OP,
                format!(
                    "a {rows}x{cols} {} matrix takes {} bytes, got {}",
                    format.name(),
                    want.map_or("more than the address space".into(), |w| w.to_string()),
                    bytes.len()
                ),
            ));
        }
        let ng = rows.div_ceil(G);
        let per = format.packed();
        let mut q = vec![0u8; ng * nb * per * G];
        let mut d = vec![0u16; ng * nb * G];
        let mut m = match format {
            QuantFormat::Q4_1 => vec![0u16; ng * nb * G],
            _ => Vec::new(),
        };
        for (row, blocks) in bytes.chunks_exact(nb * bb).enumerate() {
            let (g, r) = (row / G, row % G);
            for (b, blk) in blocks.chunks_exact(bb).enumerate() {
                let at = (g * nb + b) * G + r;
                d[at] = u16::from_le_bytes([blk[0], blk[1]]);
                let qs = match format {
                    QuantFormat::Q4_1 => {
                        m[at] = u16::from_le_bytes([blk[2], blk[3]]);
                        &blk[4..]
                    }
                    _ => &blk[2..],
                };
                let dst = &mut q[(g * nb + b) * per * G..][..per * G];
                match format {
                    QuantFormat::Q8_0 => {
                        for (k, &v) in qs.iter().enumerate() {
                            dst[k * G + r] = v;
                        }
                    }
                    _ => {
                        // GGML: weight k < 16 is the low nibble of byte k, weight k >= 16 the
                        // high nibble of byte k - 16.
                        let nib = |k: usize| if k < 16 { qs[k] & 15 } else { qs[k - 16] >> 4 };
                        for p in 0..BLOCK / 2 {
                            dst[p * G + r] = nib(2 * p) | (nib(2 * p + 1) << 4);
                        }
                    }
                }
            }
        }
        Ok(PackedQuant {
            format,
            rows,
            cols,
            nb,
            ng,
            q,
            d,
            m,
        })
    }

    /// The format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Rows (outputs of the product).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (inputs of the product).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes the packed matrix takes.
    pub fn nbytes(&self) -> usize {
        self.q.len() + 2 * (self.d.len() + self.m.len())
    }

    /// Weight `(row, col)` as GGML dequantises it (the same f32 bits).
    #[inline(always)]
    fn value(&self, row: usize, col: usize) -> f32 {
        let (g, r, b, k) = (row / G, row % G, col / BLOCK, col % BLOCK);
        let at = (g * self.nb + b) * G + r;
        let d = f16::from_bits(self.d[at]).to_f32();
        let base = (g * self.nb + b) * self.format.packed() * G;
        match self.format {
            QuantFormat::Q8_0 => (self.q[base + k * G + r] as i8) as f32 * d,
            f => {
                let byte = self.q[base + (k / 2) * G + r];
                let q = if k % 2 == 0 { byte & 15 } else { byte >> 4 };
                match f {
                    QuantFormat::Q4_0 => (q as i32 - 8) as f32 * d,
                    _ => q as f32 * d + f16::from_bits(self.m[at]).to_f32(),
                }
            }
        }
    }

    /// Row `row` dequantised into `out` (`cols` values), as GGML dequantises it.
    pub fn row(&self, row: usize, out: &mut [f32]) -> Result<()> {
        if row >= self.rows || out.len() != self.cols {
            return Err(Error::internal(
                "quantized matrix",
                format!(
                    "row {row} of {} into {} values (rows hold {})",
                    self.rows,
                    out.len(),
                    self.cols
                ),
            ));
        }
        for (c, o) in out.iter_mut().enumerate() {
            *o = self.value(row, c);
        }
        Ok(())
    }

    /// `out = x · selfᵀ` for `m` rows of `cols` activations in `x` (row-major), `out` holding
    /// `m` rows of `rows` values; on the threads of the calling rayon pool.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32], threads: usize) -> Result<()> {
        if x.len() != m * self.cols || out.len() != m * self.rows {
            return Err(Error::internal(
                "quant_linear",
                format!(
                    "{m} rows: {} activations for rows of {}, {} outputs for rows of {}",
                    x.len(),
                    self.cols,
                    out.len(),
                    self.rows
                ),
            ));
        }
        if m == 0 || self.rows == 0 {
            return Ok(());
        }
        if m > SMALL_M {
            return self.matmul_panels(x, m, out, threads);
        }
        // Σ x per block and row: the minimum's (or Q4_0's offset's) share of each block.
        let xs: Vec<f32> = x
            .chunks_exact(BLOCK)
            .map(|c| c.iter().sum::<f32>())
            .collect();
        // Split the groups so each part streams at least ~64 KiB of the matrix.
        let parts = threads
            .min(self.ng)
            .min((self.nbytes() >> 16).max(1))
            .max(1);
        let chunk = self.ng.div_ceil(parts);
        let pieces: Vec<(usize, Vec<f32>)> = (0..parts)
            .into_par_iter()
            .map(|p| {
                let (g0, g1) = (p * chunk, ((p + 1) * chunk).min(self.ng));
                let width = (g1.saturating_sub(g0)) * G;
                let mut local = vec![0f32; m * width];
                if g1 > g0 {
                    let step = Self::rows_at_once();
                    for r0 in (0..m).step_by(step) {
                        let rm = (m - r0).min(step);
                        let xr = &x[r0 * self.cols..(r0 + rm) * self.cols];
                        let sr = &xs[r0 * self.nb..(r0 + rm) * self.nb];
                        let o = &mut local[r0 * width..(r0 + rm) * width];
                        self.rows_kernel(rm, xr, sr, g0, g1, o);
                    }
                }
                (g0, local)
            })
            .collect();
        for (g0, local) in pieces {
            let width = local.len() / m;
            let (c0, c1) = (g0 * G, (g0 * G + width).min(self.rows));
            if c1 <= c0 {
                continue;
            }
            for r in 0..m {
                out[r * self.rows + c0..r * self.rows + c1]
                    .copy_from_slice(&local[r * width..r * width + (c1 - c0)]);
            }
        }
        Ok(())
    }

    /// The product over groups `g0..g1` for `rm` activation rows (up to [`PackedQuant::rows_at_once`]).
    fn rows_kernel(&self, rm: usize, x: &[f32], xs: &[f32], g0: usize, g1: usize, o: &mut [f32]) {
        let q8 = self.format == QuantFormat::Q8_0;
        #[cfg(target_arch = "x86_64")]
        match level() {
            // SAFETY (both arms): the processor has the level's features (`level` checked
            // them); `x`, `xs` and `o` hold `rm` rows of `cols`, `nb` and `(g1 - g0) * 16`
            // values, and `g1 <= ng`, which is all the kernels index.
            Level::Avx512 => unsafe {
                match (q8, rm) {
                    (true, 1) => x86::q8::<1>(self, x, g0, g1, o),
                    (true, 2) => x86::q8::<2>(self, x, g0, g1, o),
                    (true, 3) => x86::q8::<3>(self, x, g0, g1, o),
                    (true, _) => x86::q8::<4>(self, x, g0, g1, o),
                    (false, 1) => x86::q4::<1>(self, x, xs, g0, g1, o),
                    (false, 2) => x86::q4::<2>(self, x, xs, g0, g1, o),
                    (false, 3) => x86::q4::<3>(self, x, xs, g0, g1, o),
                    (false, _) => x86::q4::<4>(self, x, xs, g0, g1, o),
                }
                return;
            },
            Level::Avx2 => unsafe {
                match (q8, rm) {
                    (true, 1) => x86::q8_avx2::<1>(self, x, g0, g1, o),
                    (true, _) => x86::q8_avx2::<2>(self, x, g0, g1, o),
                    (false, 1) => x86::q4_avx2::<1>(self, x, xs, g0, g1, o),
                    (false, _) => x86::q4_avx2::<2>(self, x, xs, g0, g1, o),
                }
                return;
            },
            Level::Portable => {}
        }
        self.rows_portable(rm, x, xs, g0, g1, o);
    }

    /// Activation rows one kernel call takes (as many as its accumulators fit in registers).
    fn rows_at_once() -> usize {
        match level() {
            Level::Avx512 => 4,
            Level::Avx2 => 2,
            Level::Portable => 4,
        }
    }

    /// [`PackedQuant::rows_kernel`] in plain Rust, in the same order of operations.
    fn rows_portable(&self, rm: usize, x: &[f32], xs: &[f32], g0: usize, g1: usize, o: &mut [f32]) {
        let (nb, cols, per) = (self.nb, self.cols, self.format.packed());
        let width = (g1 - g0) * G;
        for g in g0..g1 {
            for r in 0..rm {
                let mut acc = [0f32; G];
                for b in 0..nb {
                    let blk = g * nb + b;
                    let q = &self.q[blk * per * G..][..per * G];
                    let xb = &x[r * cols + b * BLOCK..][..BLOCK];
                    let mut s = [0f32; G];
                    for (k, &xv) in xb.iter().enumerate() {
                        for (l, sl) in s.iter_mut().enumerate() {
                            let w = match self.format {
                                QuantFormat::Q8_0 => (q[k * G + l] as i8) as f32,
                                _ => {
                                    let byte = q[(k / 2) * G + l];
                                    (if k % 2 == 0 { byte & 15 } else { byte >> 4 }) as f32
                                }
                            };
                            *sl += w * xv;
                        }
                    }
                    for (l, a) in acc.iter_mut().enumerate() {
                        let d = f16::from_bits(self.d[blk * G + l]).to_f32();
                        *a += d * s[l];
                        let mn = match self.format {
                            QuantFormat::Q4_0 => -8.0 * d,
                            QuantFormat::Q4_1 => f16::from_bits(self.m[blk * G + l]).to_f32(),
                            QuantFormat::Q8_0 => 0.0,
                        };
                        *a += mn * xs[r * nb + b];
                    }
                }
                o[r * width + (g - g0) * G..][..G].copy_from_slice(&acc);
            }
        }
    }

    /// Many activation rows: panels of rows dequantised (transposed, `[cols][panel rows]`,
    /// small enough to stay in a core's L2 cache) and multiplied by the f32 product, each
    /// thread taking whole panels.
    fn matmul_panels(&self, x: &[f32], m: usize, out: &mut [f32], threads: usize) -> Result<()> {
        let pr = (PANEL_VALUES / self.cols / G).max(1) * G;
        let n_panels = self.rows.div_ceil(pr);
        let xv = MatView {
            data: x,
            offset: 0,
            rows: m,
            cols: self.cols,
            rs: self.cols,
            cs: 1,
        };
        // Fewer panels than threads: split each product's columns over the threads instead.
        let inner = if n_panels >= threads { 1 } else { threads };
        let products: Vec<(usize, Vec<f32>)> = (0..n_panels)
            .into_par_iter()
            .map_init(Vec::new, |panel, p| {
                let r0 = p * pr;
                let w = (self.rows - r0).min(pr);
                let wp = w.div_ceil(G) * G;
                panel.resize(self.cols * wp, 0f32);
                self.panel(r0 / G, wp / G, panel);
                let bv = MatView {
                    data: panel,
                    offset: 0,
                    rows: self.cols,
                    cols: w,
                    rs: wp,
                    cs: 1,
                };
                let mut o = vec![0f32; m * w];
                super::gemm(xv, bv, &mut o, false, inner)?;
                Ok((r0, o))
            })
            .collect::<Result<_>>()?;
        for (r0, o) in products {
            let w = o.len() / m;
            for r in 0..m {
                out[r * self.rows + r0..][..w].copy_from_slice(&o[r * w..][..w]);
            }
        }
        Ok(())
    }

    /// Groups `g0..g0 + n` dequantised into `panel`, `[cols][n * 16]`.
    fn panel(&self, g0: usize, n: usize, panel: &mut [f32]) {
        let wp = n * G;
        for (b, rows) in panel.chunks_exact_mut(BLOCK * wp).enumerate() {
            // SAFETY (both arms): the processor has the level's features (`level` checked
            // them); `rows` holds the 32 columns of block `b < nb` for the `n` groups from
            // `g0`, which end at or before `ng`.
            #[cfg(target_arch = "x86_64")]
            match level() {
                Level::Avx512 => {
                    unsafe { x86::panel(self, b, g0, n, rows) };
                    continue;
                }
                Level::Avx2 => {
                    unsafe { x86::panel_avx2(self, b, g0, n, rows) };
                    continue;
                }
                Level::Portable => {}
            }
            for g in 0..n {
                for l in 0..G {
                    let row = (g0 + g) * G + l;
                    for k in 0..BLOCK {
                        rows[k * wp + g * G + l] = if row < self.rows {
                            self.value(row, b * BLOCK + k)
                        } else {
                            0.0
                        };
                    }
                }
            }
        }
    }
}

// The register kernels index several accumulator arrays and pointers with one row or half
// index in lockstep; iterators over one of them would hide that.
#[allow(clippy::needless_range_loop)]
#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The AVX-512 kernels. Callers have checked the processor's features and the sizes named
    //! in each function's doc; everything indexed follows from them.

    use std::arch::x86_64::*;

    use super::{BLOCK, G, PackedQuant, QuantFormat};

    /// 16 f16 values at `p` as f32.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
    #[inline]
    unsafe fn halves(p: *const u16) -> __m512 {
        // SAFETY: the caller passes 16 readable values.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }

    /// Sum of four vectors.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
    #[inline]
    fn sum4(s: [__m512; 4]) -> __m512 {
        _mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3]))
    }

    /// Q4_0 / Q4_1 rows: groups `g0..g1` for `M` activation rows `x` (`M × cols`) with their
    /// block sums `xs` (`M × nb`), into `o` (`M × (g1 - g0) * 16`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
    pub(super) unsafe fn q4<const M: usize>(
        pk: &PackedQuant,
        x: &[f32],
        xs: &[f32],
        g0: usize,
        g1: usize,
        o: &mut [f32],
    ) {
        let (nb, cols) = (pk.nb, pk.cols);
        let width = (g1 - g0) * G;
        let low = _mm512_set1_epi32(15);
        let offset8 = pk.format == QuantFormat::Q4_0;
        for g in g0..g1 {
            let mut acc = [_mm512_setzero_ps(); M];
            for b in 0..nb {
                let blk = g * nb + b;
                // SAFETY (whole block): `blk < ng * nb`, so its 256 packed bytes and 16 scales
                // (and minimums) lie inside `q`, `d` (and `m`); `x` holds `M` rows of `cols`,
                // with `b * 32 + 31 < cols`.
                unsafe {
                    let qp = pk.q.as_ptr().add(blk * BLOCK / 2 * G);
                    let mut s = [[_mm512_setzero_ps(); 4]; M];
                    // Even and odd pairs feed different sums, so four are in flight; the
                    // indices are constants, which keeps the sums in registers.
                    macro_rules! pair {
                        ($p:expr, $h:expr) => {{
                            let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(qp.add($p * G).cast()));
                            let lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, low));
                            let hi = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(v));
                            for r in 0..M {
                                let xr = x.as_ptr().add(r * cols + b * BLOCK + 2 * $p);
                                s[r][$h] = _mm512_fmadd_ps(lo, _mm512_set1_ps(*xr), s[r][$h]);
                                s[r][$h + 1] =
                                    _mm512_fmadd_ps(hi, _mm512_set1_ps(*xr.add(1)), s[r][$h + 1]);
                            }
                        }};
                    }
                    for pp in 0..BLOCK / 4 {
                        pair!(2 * pp, 0);
                        pair!(2 * pp + 1, 2);
                    }
                    let d = halves(pk.d.as_ptr().add(blk * G));
                    let mn = if offset8 {
                        _mm512_mul_ps(d, _mm512_set1_ps(-8.0))
                    } else {
                        halves(pk.m.as_ptr().add(blk * G))
                    };
                    for r in 0..M {
                        acc[r] = _mm512_fmadd_ps(d, sum4(s[r]), acc[r]);
                        let sx = _mm512_set1_ps(*xs.get_unchecked(r * nb + b));
                        acc[r] = _mm512_fmadd_ps(mn, sx, acc[r]);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                // SAFETY: `o` holds `M` rows of `width` values; `(g - g0) * 16 + 15 < width`.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(r * width + (g - g0) * G), *a) };
            }
        }
    }

    /// Q8_0 rows, as [`q4`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
    pub(super) unsafe fn q8<const M: usize>(
        pk: &PackedQuant,
        x: &[f32],
        g0: usize,
        g1: usize,
        o: &mut [f32],
    ) {
        let (nb, cols) = (pk.nb, pk.cols);
        let width = (g1 - g0) * G;
        for g in g0..g1 {
            let mut acc = [_mm512_setzero_ps(); M];
            for b in 0..nb {
                let blk = g * nb + b;
                // SAFETY: as in `q4`, with 512 packed bytes per block.
                unsafe {
                    let qp = pk.q.as_ptr().add(blk * BLOCK * G);
                    let mut s = [[_mm512_setzero_ps(); 4]; M];
                    // Four sums in flight, at constant indices (kept in registers).
                    macro_rules! col {
                        ($k:expr, $c:expr) => {{
                            let v = _mm512_cvtepi8_epi32(_mm_loadu_si128(qp.add($k * G).cast()));
                            let w = _mm512_cvtepi32_ps(v);
                            for r in 0..M {
                                let xv = _mm512_set1_ps(*x.as_ptr().add(r * cols + b * BLOCK + $k));
                                s[r][$c] = _mm512_fmadd_ps(w, xv, s[r][$c]);
                            }
                        }};
                    }
                    for kk in 0..BLOCK / 4 {
                        col!(4 * kk, 0);
                        col!(4 * kk + 1, 1);
                        col!(4 * kk + 2, 2);
                        col!(4 * kk + 3, 3);
                    }
                    let d = halves(pk.d.as_ptr().add(blk * G));
                    for r in 0..M {
                        acc[r] = _mm512_fmadd_ps(d, sum4(s[r]), acc[r]);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                // SAFETY: as in `q4`.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(r * width + (g - g0) * G), *a) };
            }
        }
    }

    /// Block `b` of groups `g0..g0 + n` dequantised (GGML's arithmetic: `q · d + m`,
    /// `(q - 8) · d`, `q · d`) into `out`, `[32][n * 16]`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")]
    pub(super) unsafe fn panel(pk: &PackedQuant, b: usize, g0: usize, n: usize, out: &mut [f32]) {
        let (nb, wp) = (pk.nb, n * G);
        let low = _mm512_set1_epi32(15);
        let eight = _mm512_set1_epi32(8);
        let o = out.as_mut_ptr();
        for g in 0..n {
            let blk = (g0 + g) * nb + b;
            // SAFETY: `blk < ng * nb` (see `PackedQuant::panel`), and `out` holds 32 rows of
            // `wp` values, of which this writes columns `g * 16 .. g * 16 + 16`.
            unsafe {
                let d = halves(pk.d.as_ptr().add(blk * G));
                let at = |k: usize| o.add(k * wp + g * G);
                match pk.format {
                    QuantFormat::Q8_0 => {
                        let qp = pk.q.as_ptr().add(blk * BLOCK * G);
                        for k in 0..BLOCK {
                            let v = _mm512_cvtepi8_epi32(_mm_loadu_si128(qp.add(k * G).cast()));
                            _mm512_storeu_ps(at(k), _mm512_mul_ps(_mm512_cvtepi32_ps(v), d));
                        }
                    }
                    f => {
                        let qp = pk.q.as_ptr().add(blk * BLOCK / 2 * G);
                        let mn = match f {
                            QuantFormat::Q4_1 => halves(pk.m.as_ptr().add(blk * G)),
                            _ => _mm512_setzero_ps(),
                        };
                        for p in 0..BLOCK / 2 {
                            let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(qp.add(p * G).cast()));
                            let (lo, hi) = (_mm512_and_si512(v, low), _mm512_srli_epi32::<4>(v));
                            let (lo, hi) = if f == QuantFormat::Q4_0 {
                                let l = _mm512_cvtepi32_ps(_mm512_sub_epi32(lo, eight));
                                let h = _mm512_cvtepi32_ps(_mm512_sub_epi32(hi, eight));
                                (_mm512_mul_ps(l, d), _mm512_mul_ps(h, d))
                            } else {
                                let l = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d);
                                let h = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d);
                                (_mm512_add_ps(l, mn), _mm512_add_ps(h, mn))
                            };
                            _mm512_storeu_ps(at(2 * p), lo);
                            _mm512_storeu_ps(at(2 * p + 1), hi);
                        }
                    }
                }
            }
        }
    }

    // ---- AVX2 + FMA: each group of 16 rows as two vectors of 8 ----------------------------

    /// 8 f16 values at `p` as f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn halves8(p: *const u16) -> __m256 {
        // SAFETY: the caller passes 8 readable values.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    /// 8 bytes at `p` widened to 8 lanes (zero-extended).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn bytes8(p: *const u8) -> __m256i {
        // SAFETY: the caller passes 8 readable bytes.
        unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())) }
    }

    /// [`q4`] with AVX2: accumulator `s[r][(p & 1) * 4 + half * 2 + lo/hi]` (the parity split
    /// only for one row, so eight sums are in flight either way).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_avx2<const M: usize>(
        pk: &PackedQuant,
        x: &[f32],
        xs: &[f32],
        g0: usize,
        g1: usize,
        o: &mut [f32],
    ) {
        let (nb, cols) = (pk.nb, pk.cols);
        let width = (g1 - g0) * G;
        let low = _mm256_set1_epi32(15);
        let offset8 = pk.format == QuantFormat::Q4_0;
        for g in g0..g1 {
            let mut acc = [[_mm256_setzero_ps(); 2]; M];
            for b in 0..nb {
                let blk = g * nb + b;
                // SAFETY: as in `q4`.
                unsafe {
                    let qp = pk.q.as_ptr().add(blk * BLOCK / 2 * G);
                    let mut s = [[_mm256_setzero_ps(); 8]; M];
                    // Constant indices keep the sums in registers.
                    macro_rules! pair {
                        ($p:expr, $par:expr) => {{
                            let v0 = bytes8(qp.add($p * G));
                            let v1 = bytes8(qp.add($p * G + 8));
                            let lo0 = _mm256_cvtepi32_ps(_mm256_and_si256(v0, low));
                            let hi0 = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v0));
                            let lo1 = _mm256_cvtepi32_ps(_mm256_and_si256(v1, low));
                            let hi1 = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v1));
                            for r in 0..M {
                                let xr = x.as_ptr().add(r * cols + b * BLOCK + 2 * $p);
                                let (x0, x1) = (_mm256_set1_ps(*xr), _mm256_set1_ps(*xr.add(1)));
                                s[r][$par] = _mm256_fmadd_ps(lo0, x0, s[r][$par]);
                                s[r][$par + 1] = _mm256_fmadd_ps(hi0, x1, s[r][$par + 1]);
                                s[r][$par + 2] = _mm256_fmadd_ps(lo1, x0, s[r][$par + 2]);
                                s[r][$par + 3] = _mm256_fmadd_ps(hi1, x1, s[r][$par + 3]);
                            }
                        }};
                    }
                    for pp in 0..BLOCK / 4 {
                        pair!(2 * pp, 0);
                        if M == 1 {
                            pair!(2 * pp + 1, 4);
                        } else {
                            pair!(2 * pp + 1, 0);
                        }
                    }
                    for half in 0..2 {
                        let d = halves8(pk.d.as_ptr().add(blk * G + half * 8));
                        let mn = if offset8 {
                            _mm256_mul_ps(d, _mm256_set1_ps(-8.0))
                        } else {
                            halves8(pk.m.as_ptr().add(blk * G + half * 8))
                        };
                        for r in 0..M {
                            let i = half * 2;
                            let mut t = _mm256_add_ps(s[r][i], s[r][i + 1]);
                            if M == 1 {
                                t = _mm256_add_ps(t, _mm256_add_ps(s[r][i + 4], s[r][i + 5]));
                            }
                            let a = _mm256_fmadd_ps(d, t, acc[r][half]);
                            let sx = _mm256_set1_ps(*xs.get_unchecked(r * nb + b));
                            acc[r][half] = _mm256_fmadd_ps(mn, sx, a);
                        }
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                for (half, v) in a.iter().enumerate() {
                    let at = r * width + (g - g0) * G + half * 8;
                    // SAFETY: as in `q4`.
                    unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(at), *v) };
                }
            }
        }
    }

    /// [`q8`] with AVX2: accumulator `s[r][(k & 3) * 2 + half]`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_avx2<const M: usize>(
        pk: &PackedQuant,
        x: &[f32],
        g0: usize,
        g1: usize,
        o: &mut [f32],
    ) {
        let (nb, cols) = (pk.nb, pk.cols);
        let width = (g1 - g0) * G;
        for g in g0..g1 {
            let mut acc = [[_mm256_setzero_ps(); 2]; M];
            for b in 0..nb {
                let blk = g * nb + b;
                // SAFETY: as in `q4`, with 512 packed bytes per block.
                unsafe {
                    let qp = pk.q.as_ptr().add(blk * BLOCK * G);
                    let mut s = [[_mm256_setzero_ps(); 8]; M];
                    // Constant indices keep the sums in registers.
                    macro_rules! col {
                        ($k:expr, $c:expr) => {{
                            let q = qp.add($k * G);
                            let w0 =
                                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q.cast())));
                            let w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                q.add(8).cast(),
                            )));
                            for r in 0..M {
                                let xv = _mm256_set1_ps(*x.as_ptr().add(r * cols + b * BLOCK + $k));
                                s[r][$c] = _mm256_fmadd_ps(w0, xv, s[r][$c]);
                                s[r][$c + 1] = _mm256_fmadd_ps(w1, xv, s[r][$c + 1]);
                            }
                        }};
                    }
                    for kk in 0..BLOCK / 4 {
                        col!(4 * kk, 0);
                        col!(4 * kk + 1, 2);
                        if M == 1 {
                            col!(4 * kk + 2, 4);
                            col!(4 * kk + 3, 6);
                        } else {
                            col!(4 * kk + 2, 0);
                            col!(4 * kk + 3, 2);
                        }
                    }
                    for half in 0..2 {
                        let d = halves8(pk.d.as_ptr().add(blk * G + half * 8));
                        for r in 0..M {
                            let t = [0, 2, 4, 6].iter().fold(_mm256_setzero_ps(), |t, &c| {
                                _mm256_add_ps(t, s[r][c + half])
                            });
                            acc[r][half] = _mm256_fmadd_ps(d, t, acc[r][half]);
                        }
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                for (half, v) in a.iter().enumerate() {
                    let at = r * width + (g - g0) * G + half * 8;
                    // SAFETY: as in `q4`.
                    unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(at), *v) };
                }
            }
        }
    }

    /// [`panel`] with AVX2.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn panel_avx2(
        pk: &PackedQuant,
        b: usize,
        g0: usize,
        n: usize,
        out: &mut [f32],
    ) {
        let (nb, wp) = (pk.nb, n * G);
        let low = _mm256_set1_epi32(15);
        let eight = _mm256_set1_epi32(8);
        let o = out.as_mut_ptr();
        for g in 0..n {
            let blk = (g0 + g) * nb + b;
            for half in 0..2 {
                // SAFETY: as in `panel`.
                unsafe {
                    let d = halves8(pk.d.as_ptr().add(blk * G + half * 8));
                    let at = |k: usize| o.add(k * wp + g * G + half * 8);
                    match pk.format {
                        QuantFormat::Q8_0 => {
                            let qp = pk.q.as_ptr().add(blk * BLOCK * G + half * 8);
                            for k in 0..BLOCK {
                                let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(qp.add(k * G).cast()));
                                _mm256_storeu_ps(at(k), _mm256_mul_ps(_mm256_cvtepi32_ps(v), d));
                            }
                        }
                        f => {
                            let qp = pk.q.as_ptr().add(blk * BLOCK / 2 * G + half * 8);
                            let mn = match f {
                                QuantFormat::Q4_1 => halves8(pk.m.as_ptr().add(blk * G + half * 8)),
                                _ => _mm256_setzero_ps(),
                            };
                            for p in 0..BLOCK / 2 {
                                let v = bytes8(qp.add(p * G));
                                let lo = _mm256_and_si256(v, low);
                                let hi = _mm256_srli_epi32::<4>(v);
                                let (lo, hi) = if f == QuantFormat::Q4_0 {
                                    let l = _mm256_cvtepi32_ps(_mm256_sub_epi32(lo, eight));
                                    let h = _mm256_cvtepi32_ps(_mm256_sub_epi32(hi, eight));
                                    (_mm256_mul_ps(l, d), _mm256_mul_ps(h, d))
                                } else {
                                    let l = _mm256_mul_ps(_mm256_cvtepi32_ps(lo), d);
                                    let h = _mm256_mul_ps(_mm256_cvtepi32_ps(hi), d);
                                    (_mm256_add_ps(l, mn), _mm256_add_ps(h, mn))
                                };
                                _mm256_storeu_ps(at(2 * p), lo);
                                _mm256_storeu_ps(at(2 * p + 1), hi);
                            }
                        }
                    }
                }
            }
        }
    }
}
