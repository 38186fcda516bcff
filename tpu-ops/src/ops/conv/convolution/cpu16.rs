//! The CPU convolution kernel in bf16 and f16: the blocks of the f32 kernel, gathered in the
//! 16-bit dtype and multiplied with f32 accumulation by the crate's SIMD product (AVX-512, AVX2) or,
//! elsewhere, by faer's f32 product on widened copies; one rounding per output element. bf16
//! with a stride of one on AVX512_BF16 runs the implicit product instead
//! ([`crate::cpu::simd::conv_bf16`]), which reads the image in place of gathered patches.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use tpu_tensor::{Element, Error, Result, bf16, f16};

use crate::cpu::simd::{ConvPlane, ConvWeight, conv_bf16, conv_bf16_available};

use super::cpu::{
    Conv, Split, conv_blocks, conv_tasks, im2col_block, inner_par, run_tasks, scatter_planes,
};

/// Elements of gathered patches per block on the 16-bit path: larger than the f32 block,
/// because the SIMD product packs its operands itself and per-product overhead dominates
/// narrow blocks (measured: 17.6 ms at 2^16, 15.2 ms at 2^18 for the benchmark's bf16 conv).
pub(super) const COLS_BLOCK_16: usize = 1 << 18;

/// The 16-bit float dtypes, which convolve with f32 accumulation. The conversions are plain
/// bit arithmetic without branches, so that loops over them vectorise.
pub(super) trait Half: Element {
    /// The value as f32 (exact).
    fn widen(self) -> f32;
    /// `v` rounded to this type (to nearest, ties to even).
    fn narrow(v: f32) -> Self;
}

impl Half for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    #[inline(always)]
    fn narrow(v: f32) -> bf16 {
        let b = v.to_bits();
        // Round to nearest even; NaNs keep their sign and stay NaNs.
        let r = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
        let nan = (b >> 16) | 0x40;
        bf16::from_bits(if v.is_nan() { nan } else { r } as u16)
    }
}

impl Half for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        let h = u32::from(self.to_bits());
        let em = h & 0x7fff;
        // The f16 exponent and fraction read as an f32 whose exponent is 112 short: scaling
        // by 2^112 fixes normals and subnormals alike; infinities and NaNs are set directly.
        let finite = (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits();
        let bits = if em >= 0x7c00 {
            (em << 13) | 0x7f80_0000
        } else {
            finite
        };
        f32::from_bits(bits | ((h & 0x8000) << 16))
    }
    fn narrow(v: f32) -> f16 {
        f16::from_f32(v)
    }
}

/// A row-major matrix inside a slice: element `(i, j)` at `data[i * ld + j]`.
#[derive(Clone, Copy)]
struct Panel<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    ld: usize,
}

/// The widened operands of [`gemm16`], kept by each task between products.
#[derive(Default)]
struct Widened {
    /// The address and shape of the 16-bit weight block now in `a`.
    a_key: Option<(usize, usize, usize, usize)>,
    a: Vec<f32>,
    b: Vec<f32>,
}

/// Copies the 16-bit matrix `p` into `dst` as a dense f32 matrix.
fn widen_panel<T: Half>(p: Panel<'_, T>, dst: &mut Vec<f32>) {
    dst.resize(p.rows * p.cols, 0.0);
    for (i, r) in dst.chunks_mut(p.cols).enumerate() {
        let src = &p.data[i * p.ld..][..p.cols];
        r.iter_mut().zip(src).for_each(|(d, s)| *d = s.widen());
    }
}

/// The 16-bit convolution's only product: `dst (+)= a · b` for a 16-bit weight block `a`
/// (`[m, k]`) and patch panel `b` (`[k, n]`), accumulated in f32 into `dst` (`[m, n]`, rows
/// `n` apart). With AVX-512 or AVX2 the SIMD product reads the 16-bit operands in place
/// (`vdpbf16ps` for bf16 where the processor has it, else widened while packed); elsewhere it widens both (the weight once while a task reuses it) and runs
/// faer's f32 product.
fn gemm16<T: Half + crate::cpu::simd::Elem>(
    a: Panel<'_, T>,
    b: Panel<'_, T>,
    dst: &mut [f32],
    accumulate: bool,
    par: Par,
    wide: &mut Widened,
) -> Result<()> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || dst.len() < m * n {
        return Err(Error::internal(
            "conv2d",
            format!("product of [{m}, {k}] and [{}, {n}]", b.rows),
        ));
    }
    if crate::cpu::simd::gemm_accelerated() {
        fn view<'a, T>(p: Panel<'a, T>) -> crate::cpu::simd::MatView<'a, T> {
            crate::cpu::simd::MatView {
                data: p.data,
                offset: 0,
                rows: p.rows,
                cols: p.cols,
                rs: p.ld,
                cs: 1,
            }
        }
        let threads = match par {
            Par::Seq => 1,
            Par::Rayon(t) => t.get(),
        };
        return crate::cpu::simd::gemm(view(a), view(b), &mut dst[..m * n], accumulate, threads);
    }
    // The weight stays borrowed for the whole convolution, so one address means one content.
    let key = (a.data.as_ptr() as usize, m, k, a.ld);
    if wide.a_key != Some(key) {
        widen_panel(a, &mut wide.a);
        wide.a_key = Some(key);
    }
    widen_panel(b, &mut wide.b);
    let accum = if accumulate {
        Accum::Add
    } else {
        Accum::Replace
    };
    matmul(
        MatMut::from_row_major_slice_mut(&mut dst[..m * n], m, n),
        accum,
        MatRef::from_row_major_slice(&wide.a, m, k),
        MatRef::from_row_major_slice(&wide.b, k, n),
        1.0f32,
        par,
    );
    Ok(())
}

/// The bf16 and f16 convolution: the blocks of the f32 kernel (`cpu.rs`), gathered in the 16-bit dtype and
/// multiplied by [`gemm16`] into an f32 accumulator, to which the bias is added before the one
/// rounding of each output element.
pub(super) fn conv_cpu16<T: Half + crate::cpu::simd::Elem>(
    c: &Conv<'_, T>,
    out: &mut [T],
) -> Result<()> {
    let (g, cg, taps, ohw, k) = (c.g, c.cg, c.taps, c.ohw, c.k);
    let bias_of = |oc: usize| c.bias.map_or(0.0, |b| b[oc].widen());
    let tasks = conv_tasks(g, c.split, out);
    match c.split {
        Split::Planes { ob } => {
            let (nb, cb) = conv_blocks(ohw, cg, taps, c.budget);
            // bf16 with a stride of one runs the implicit product where each task has a thread
            // of its own (it runs on one).
            let implicit = !c.pointwise
                && g.stride == [1, 1]
                && inner_par(c.threads, tasks.len()) == Par::Seq
                && conv_bf16_available();
            let plane = ConvPlane {
                channels: cg,
                h: g.h,
                w: g.w,
                kh: g.kh,
                kw: g.kw,
                pad: g.pad,
                dil: g.dil,
            };
            // The weight of each group's block of output channels, packed once for all images.
            let mut packed = Vec::new();
            if implicit {
                for grp in 0..g.groups {
                    for o0 in (0..c.og).step_by(ob) {
                        let rows = ob.min(c.og - o0);
                        let wg = &c.w[(grp * c.og + o0) * k..][..rows * k];
                        packed.push(ConvWeight::pack(&plane, wg, k, rows)?);
                    }
                }
            }
            run_tasks(c.dev, c.threads, tasks, |(u, o0, dst), par| {
                let (grp, xs, rows, wg) = c.plane_task(u, o0, dst.len());
                let bias = |o: usize| bias_of(grp * c.og + o0 + o);
                if let Some(Some(w)) = packed.get(grp * c.og.div_ceil(ob) + o0 / ob)
                    && conv_bf16(&plane, xs, w, &bias, dst)?
                {
                    return Ok(());
                }
                let mut cols = vec![T::default(); if c.pointwise { 0 } else { cb * taps * nb }];
                let mut acc = vec![0.0f32; rows * nb];
                let mut wide = Widened::default();
                for p0 in (0..ohw).step_by(nb) {
                    let np = nb.min(ohw - p0);
                    for c0 in (0..cg).step_by(cb) {
                        let nc = cb.min(cg - c0);
                        let kc = nc * taps;
                        let panel = if c.pointwise {
                            Panel {
                                data: &xs[c0 * c.hw + p0..],
                                rows: nc,
                                cols: np,
                                ld: c.hw,
                            }
                        } else {
                            im2col_block(g, xs, c0..c0 + nc, p0..p0 + np, &mut cols, np, 0);
                            Panel {
                                data: &cols,
                                rows: kc,
                                cols: np,
                                ld: np,
                            }
                        };
                        let weight = Panel {
                            data: &wg[c0 * taps..],
                            rows,
                            cols: kc,
                            ld: k,
                        };
                        gemm16(weight, panel, &mut acc, c0 > 0, par, &mut wide)?;
                    }
                    for (o, row) in dst.chunks_mut(ohw).enumerate() {
                        let b = bias_of(grp * c.og + o0 + o);
                        let src = &acc[o * np..][..np];
                        for (d, s) in row[p0..p0 + np].iter_mut().zip(src) {
                            *d = T::narrow(s + b);
                        }
                    }
                }
                Ok(())
            })
        }
        Split::Images { imgs } => {
            let (_, cb) = conv_blocks(imgs * ohw, cg, taps, c.budget);
            run_tasks(c.dev, c.threads, tasks, |(t, _, dst), par| {
                let (bn, ncols, mut cols) = c.images_task(dst.len(), cb);
                let mut acc = vec![0.0f32; c.og * ncols];
                let mut wide = Widened::default();
                for grp in 0..g.groups {
                    for c0 in (0..cg).step_by(cb) {
                        let nc = cb.min(cg - c0);
                        let kc = nc * taps;
                        c.gather_images((t * imgs, bn), grp, c0..c0 + nc, &mut cols, ncols);
                        let panel = Panel {
                            data: &cols,
                            rows: kc,
                            cols: ncols,
                            ld: ncols,
                        };
                        let weight = Panel {
                            data: &c.w[grp * c.og * k + c0 * taps..],
                            rows: c.og,
                            cols: kc,
                            ld: k,
                        };
                        gemm16(weight, panel, &mut acc, c0 > 0, par, &mut wide)?;
                    }
                    scatter_planes(g, grp, &acc, ncols, dst, |oc, v| T::narrow(v + bias_of(oc)));
                }
                Ok(())
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpu_tensor::{DType, Device, Generator};

    #[test]
    fn half_conversions_match_the_half_crate() {
        for bits in 0..=u16::MAX {
            for (mine, theirs) in [
                (
                    bf16::from_bits(bits).widen(),
                    bf16::from_bits(bits).to_f32(),
                ),
                (f16::from_bits(bits).widen(), f16::from_bits(bits).to_f32()),
            ] {
                assert!(
                    mine.to_bits() == theirs.to_bits() || (mine.is_nan() && theirs.is_nan()),
                    "{bits:#06x}: {mine} vs {theirs}"
                );
            }
        }
        let mut r = Generator::new(7);
        let mut v = r
            .randn([4096], DType::F32, &Device::cpu())
            .and_then(|t| t.to_vec::<f32>())
            .unwrap();
        // Ties, values next to ties, overflow, infinities, NaNs and subnormals.
        v.extend([
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            f32::from_bits(0x3f80_8001),
            f32::from_bits(0x3f81_7fff),
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            1e-40,
            -1e-41,
            0.0,
            -0.0,
        ]);
        for x in v {
            let (mine, theirs) = (bf16::narrow(x), bf16::from_f32(x));
            assert!(
                mine.to_bits() == theirs.to_bits() || (mine.is_nan() && theirs.is_nan()),
                "{x}: {mine} vs {theirs}"
            );
        }
    }
}
