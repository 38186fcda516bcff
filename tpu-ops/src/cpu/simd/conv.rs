//! The bf16 convolution on `vdpbf16ps` without im2col: an implicit matrix product whose rows
//! are output positions and whose columns are output channels.
//!
//! The image's group is copied once into zero-padded planes of channel pairs, each pixel of
//! a plane one 32-bit word of two bf16 channels (the operand `vdpbf16ps` takes). Output
//! positions run over the padded width (`ow` real ones and `(kw - 1) * dil` beyond them per
//! row, computed and dropped), so that consecutive positions are consecutive words at every
//! tap: the kernel ([`avx512::kernel_bf16_taps`]) reads a 14-position tile of any tap and
//! channel pair in place, and the patches are never gathered. Where an output row fills
//! whole tiles with less left over (56 wide: four tiles), tiles start at each row instead
//! and nothing past it is computed. The weight is packed once per
//! convolution ([`ConvWeight`]) into 32-channel panels of `(tap, channel pair)` steps, so a
//! tile's whole reduction runs in registers, and its sums are transposed in registers, the
//! bias added, rounded and stored straight into the output's channel planes.
//!
//! Where AMX tiles may be used and the input channels come in multiples of 32, the same
//! product runs transposed on them ([`amx::kernel_conv`]): 32 output channels by 32 positions a
//! tile, each step 16 channel pairs of one tap, the image's planes read in place as rows of the
//! tile 16 positions wide. On a processor with AMX the benchmark's bf16 row takes 4.6-4.8 ms
//! (PyTorch on the same machine: 6.8 and 21.7 ms in two runs).
//!
//! Hand-written rather than the general [`super::gemm`] on im2col blocks: that path spends a
//! third of a 3×3 convolution's time gathering and packing patches, and its 12-row tile over
//! 64 output channels leaves a ninth of the kernel's lanes idle. The benchmark's bf16 row
//! (`conv2d`, 3×3, 64 channels, 56×56, batch 32) went from 28.5 to 18.6 ms on two threads.

use tpu_tensor::tpu_runtime::memory::try_host_capacity;
use tpu_tensor::{Error, Result};

use super::{Elem, Kind};

#[cfg(target_arch = "x86_64")]
use super::amx;
#[cfg(target_arch = "x86_64")]
use super::avx512::{self, NR};
use super::gemm::Line;
/// Lanes of a weight panel: the kernel's columns (elsewhere unused: nothing is packed).
#[cfg(not(target_arch = "x86_64"))]
const NR: usize = 32;

thread_local! {
    /// The padded image of this thread's last convolution, reused by the next.
    static IMAGE: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// One image's group of input channels for [`conv_bf16`], and the convolution's window: a
/// stride of one, any padding and dilation.
#[derive(Clone, Copy, Debug)]
pub struct ConvPlane {
    /// Input channels.
    pub channels: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Zeros before and after the rows, then the columns.
    pub pad: [[usize; 2]; 2],
    /// Dilation of the rows and columns.
    pub dil: [usize; 2],
}

impl ConvPlane {
    /// Output height and width, or `None` when the window does not fit.
    pub fn out(&self) -> Option<(usize, usize)> {
        let hp = self.h + self.pad[0][0] + self.pad[0][1];
        let wp = self.w + self.pad[1][0] + self.pad[1][1];
        let span = |k: usize, d: usize| (k.max(1) - 1) * d;
        let oh = hp.checked_sub(span(self.kh, self.dil[0]))?;
        let ow = wp.checked_sub(span(self.kw, self.dil[1]))?;
        Some((oh, ow))
    }
}

/// Whether [`conv_bf16`] runs on this processor now (AVX-512 with `vdpbf16ps`).
pub fn conv_bf16_available() -> bool {
    cfg!(target_arch = "x86_64") && crate::cpu::isa::has_avx512_bf16()
}

/// The weight of `rows` output channels of one group, packed once for [`conv_bf16`] (every
/// image reuses it): 32-channel panels of `(tap, channel pair)` steps, one 32-bit word per
/// channel pair, zero past the channels.
pub struct ConvWeight {
    channels: usize,
    kh: usize,
    kw: usize,
    rows: usize,
    /// Packed for the AMX kernel ([`amx_conv`]): blocks of 32 output channels, each of
    /// `(tap, 16 channel pairs)` steps of 32 rows of 16 words.
    amx: bool,
    lines: Vec<Line>,
}

/// Whether a convolution over `channels` input channels runs on AMX tiles: where they may be
/// used, and the channels fill whole steps of 16 pairs (a step reads 16 planes of the image).
#[cfg(target_arch = "x86_64")]
fn amx_conv(channels: usize) -> bool {
    channels.is_multiple_of(32) && amx::available()
}

impl ConvWeight {
    /// Packs `rows` output channels of a `[rows, channels, kh, kw]` weight whose row `o` starts
    /// at `w[o * ldw]`; `None` for other element types than bf16 or where
    /// [`conv_bf16_available`] is false.
    pub fn pack<E: Elem>(
        p: &ConvPlane,
        w: &[E],
        ldw: usize,
        rows: usize,
    ) -> Result<Option<ConvWeight>> {
        if E::KIND != Kind::Bf16 || !conv_bf16_available() {
            return Ok(None);
        }
        let taps = p.kh * p.kw;
        let k = p.channels * taps;
        if rows > 0 && (ldw < k || w.len() < (rows - 1) * ldw + k) {
            return Err(Error::internal(
                "conv2d",
                format!(
                    "a weight of {} elements for {rows} channels of {k}, rows {ldw} apart",
                    w.len()
                ),
            ));
        }
        let cw = p.channels.div_ceil(2);
        #[cfg(target_arch = "x86_64")]
        if amx_conv(p.channels) {
            return Ok(Some(pack_amx(p, w, ldw, rows)?));
        }
        let nr = NR;
        let panel = taps * cw * nr;
        let len = (rows.div_ceil(nr) * panel).div_ceil(16);
        let mut lines = try_host_capacity(len, || format!("the packed weight of {p:?}"))?;
        lines.resize(len, Line([0; 16]));
        let words = lines.as_mut_ptr().cast::<u32>();
        let bits = |o: usize, c: usize, t: usize| {
            if c < p.channels {
                // SAFETY: a bf16 element's bits (`E` is bf16); `(o, c, t)` was checked above.
                u32::from(unsafe { *w.as_ptr().cast::<u16>().add(o * ldw + c * taps + t) })
            } else {
                0
            }
        };
        for o in 0..rows {
            let (jp, lane) = (o / nr, o % nr);
            for t in 0..taps {
                for cp in 0..cw {
                    let v = bits(o, 2 * cp, t) | bits(o, 2 * cp + 1, t) << 16;
                    // SAFETY: the word lies in panel `jp` of `lines`, sized for them all.
                    unsafe { *words.add(jp * panel + (t * cw + cp) * nr + lane) = v };
                }
            }
        }
        Ok(Some(ConvWeight {
            channels: p.channels,
            kh: p.kh,
            kw: p.kw,
            rows,
            amx: false,
            lines,
        }))
    }
}

/// [`ConvWeight::pack`] for the AMX kernel ([`amx_conv`]; bf16 `w`, bounds checked): per block
/// of 32 output channels, step `t * (cw / 16) + h` holds channel pairs `16 h..16 h + 16` of
/// tap `t`, row `r` (channel `32 b + r`, zero past `rows`) 16 words.
#[cfg(target_arch = "x86_64")]
fn pack_amx<E: Elem>(p: &ConvPlane, w: &[E], ldw: usize, rows: usize) -> Result<ConvWeight> {
    let taps = p.kh * p.kw;
    let halves = p.channels / 32;
    let block = taps * halves * amx::STEP_WORDS;
    let len = (rows.div_ceil(amx::MR) * block).div_ceil(16);
    let mut lines = try_host_capacity(len, || format!("the packed weight of {p:?}"))?;
    lines.resize(len, Line([0; 16]));
    let words = lines.as_mut_ptr().cast::<u32>();
    // SAFETY: a bf16 element's bits (`E` is bf16); the caller checked the weight's bounds.
    let bits = |o: usize, c: usize, t: usize| unsafe {
        u32::from(*w.as_ptr().cast::<u16>().add(o * ldw + c * taps + t))
    };
    for o in 0..rows {
        let (b, r) = (o / amx::MR, o % amx::MR);
        for t in 0..taps {
            for cp in 0..p.channels / 2 {
                let v = bits(o, 2 * cp, t) | bits(o, 2 * cp + 1, t) << 16;
                let step = t * halves + cp / 16;
                let at = b * block + step * amx::STEP_WORDS + r * 16 + cp % 16;
                // SAFETY: inside block `b` of `lines`, sized for them all.
                unsafe { *words.add(at) = v };
            }
        }
    }
    Ok(ConvWeight {
        channels: p.channels,
        kh: p.kh,
        kw: p.kw,
        rows,
        amx: true,
        lines,
    })
}

/// `out[o, y, x] = bf16(bias(o) + Σ w[o, c, i, j] · x[c, y + i·dil₀ - top, x + j·dil₁ - left])`
/// for the output channels of `w`, one image's group, on the calling thread: `x` is
/// `[channels, h, w]` and `out` `[rows, oh, ow]`. The products are exact and summed in f32
/// (`vdpbf16ps`, whose sums treat subnormals as zero), rounded once. Returns false, with `out`
/// untouched, for other element types than bf16 or where [`conv_bf16_available`] is false.
pub fn conv_bf16<E: Elem>(
    p: &ConvPlane,
    x: &[E],
    w: &ConvWeight,
    bias: &dyn Fn(usize) -> f32,
    out: &mut [E],
) -> Result<bool> {
    if E::KIND != Kind::Bf16 || !conv_bf16_available() {
        return Ok(false);
    }
    let (oh, ow) = p.out().unwrap_or((0, 0));
    let fits = x.len() == p.channels * p.h * p.w
        && out.len() == w.rows * oh * ow
        && (w.channels, w.kh, w.kw) == (p.channels, p.kh, p.kw);
    if !fits {
        return Err(Error::internal(
            "conv2d",
            format!(
                "{p:?} with {} input and {} output elements, and a weight of {} channels, {}x{} taps, {} rows",
                x.len(),
                out.len(),
                w.channels,
                w.kh,
                w.kw,
                w.rows
            ),
        ));
    }
    if out.is_empty() {
        return Ok(true);
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the element type is bf16 (its u16 bits), the slices have the sizes checked
        // above, and the processor has AVX-512 with BF16.
        unsafe {
            run(
                p,
                (oh, ow),
                x.as_ptr().cast(),
                w,
                bias,
                out.as_mut_ptr().cast(),
            )?
        };
    }
    Ok(true)
}

/// [`conv_bf16`] on raw bf16 bits.
///
/// # Safety
/// As [`conv_bf16`] checks: `x` and `out` hold the elements it names for `w`, and the
/// processor has AVX-512 with BF16. Fails only where the padded image cannot be allocated.
#[cfg(target_arch = "x86_64")]
unsafe fn run(
    p: &ConvPlane,
    (oh, ow): (usize, usize),
    x: *const u16,
    w: &ConvWeight,
    bias: &dyn Fn(usize) -> f32,
    out: *mut u16,
) -> Result<()> {
    let mr = if w.amx { amx::MR } else { avx512::MR_BF16 };
    let (nr, rows) = (NR, w.rows);
    let taps = p.kh * p.kw;
    let cw = p.channels.div_ceil(2);
    let (top, left) = (p.pad[0][0], p.pad[1][0]);
    let wp = p.w + left + p.pad[1][1];
    // Positions run over the padded width; the last row stops at its real ones.
    let npos = (oh - 1) * wp + ow;
    // Every pixel a tile of any tap reads, its rows past the last position included (a tile
    // starts at most at the last position).
    let span = (p.kh - 1) * p.dil[0] * wp + (p.kw - 1) * p.dil[1];
    let plane_words = npos + mr + span;
    // Where each step's words start: a channel pair's plane shifted by the tap (for AMX, the
    // first of 16 planes).
    let (per_tap, pairs) = if w.amx { (cw / 16, 16) } else { (cw, 1) };
    let steps: Vec<usize> = (0..taps)
        .flat_map(|t| {
            let off = (t / p.kw) * p.dil[0] * wp + (t % p.kw) * p.dil[1];
            (0..per_tap).map(move |h| h * pairs * plane_words + off)
        })
        .collect();
    let mut img = IMAGE.with(|b| b.take());
    if img.len() < cw * plane_words {
        img = try_host_capacity(cw * plane_words, || format!("the padded image of {p:?}"))?;
        img.resize(cw * plane_words, 0);
    }
    let plane = p.h * p.w;
    for (cp, words) in img[..cw * plane_words].chunks_mut(plane_words).enumerate() {
        let (c0, c1) = (2 * cp, 2 * cp + 1);
        // Every word is written: the image's rows, and zeros around them (the buffer is
        // reused, so its old words are not zero).
        let mut next = 0;
        for y in 0..p.h {
            let row = (y + top) * wp + left;
            words[next..row].fill(0);
            let dst = words[row..row + p.w].as_mut_ptr();
            // SAFETY: rows `y` of channels `c0` and `c1 < channels` lie inside `x`; `dst`
            // holds `p.w` words.
            unsafe {
                let hi = (c1 < p.channels).then(|| x.add(c1 * plane + y * p.w));
                avx512::pair_words(x.add(c0 * plane + y * p.w), hi, dst, p.w);
            }
            next = row + p.w;
        }
        words[next..].fill(0);
    }
    let panel = taps * cw * nr;
    let panels = rows.div_ceil(nr);
    let bw = w.lines.as_ptr().cast::<u32>();
    let biases: Vec<f32> = (0..rows).map(bias).collect();
    let ohw = oh * ow;
    // Tiles of consecutive positions, each its first position and how many follow: from the
    // start of every output row when its positions fill whole tiles with fewer left over than
    // the padded row's dropped ones (56 wide: four tiles a row, none dropped, where running
    // over the padded width drops 2 of every 58), else on over the padded width.
    let tiles: Vec<(usize, usize)> = if ow.next_multiple_of(mr) < wp {
        (0..oh)
            .flat_map(|y| {
                (0..ow)
                    .step_by(mr)
                    .map(move |x| (y * wp + x, mr.min(ow - x)))
            })
            .collect()
    } else {
        (0..npos)
            .step_by(mr)
            .map(|q| (q, mr.min(npos - q)))
            .collect()
    };
    // SAFETY: AMX is available where the weight was packed for it.
    let _tiles = w.amx.then(|| unsafe { amx::Tiles::configure() });
    for (q, m) in tiles {
        // The tile's positions as runs of real ones, each within one output row.
        let mut runs = [(0u32, 0isize); amx::MR];
        let mut count = 0;
        let mut l = 0;
        while l < m {
            let (y, x0) = ((q + l) / wp, (q + l) % wp);
            if x0 >= ow {
                l += wp - x0;
                continue;
            }
            let len = (ow - x0).min(m - l);
            runs[count] = (
                (((1u64 << len) - 1) << l) as u32,
                (y * ow + x0) as isize - l as isize,
            );
            count += 1;
            l += len;
        }
        if w.amx {
            let block = taps * per_tap * amx::STEP_WORDS;
            for jp in 0..panels {
                let tile = amx::ConvTile {
                    out: out.wrapping_add(jp * nr * ohw),
                    plane: ohw,
                    bias: biases[jp * nr..].as_ptr(),
                    runs,
                    count,
                };
                let n = nr.min(rows - jp * nr);
                // SAFETY: as below, for the AMX kernel: 16 planes of 32 words from every
                // step's start lie inside `img`; block `jp` of the weight holds the steps.
                unsafe {
                    amx::kernel_conv(
                        &steps,
                        bw.add(jp * block),
                        img.as_ptr().add(q),
                        plane_words,
                        n,
                        &tile,
                    )
                };
            }
            continue;
        }
        let mut short = [(0u16, 0isize); avx512::MR_BF16];
        for (s, &(mask, at)) in short.iter_mut().zip(&runs[..count]) {
            *s = (mask as u16, at);
        }
        for jp in 0..panels {
            let n = nr.min(rows - jp * nr);
            let tile = avx512::ConvTile {
                out: out.wrapping_add(jp * nr * ohw),
                plane: ohw,
                bias: biases[jp * nr..].as_ptr(),
                runs: short,
                count,
            };
            // SAFETY: the tile's pixels at every tap lie inside `img` (sized for them); panel
            // `jp` holds `taps * cw` steps; the runs' lanes are elements of the `n` output
            // planes from channel `jp * nr`, whose biases `biases` holds.
            unsafe {
                avx512::kernel_bf16_taps(&steps, img.as_ptr().add(q), bw.add(jp * panel), n, &tile)
            };
        }
    }
    IMAGE.with(|b| b.set(img));
    Ok(())
}
