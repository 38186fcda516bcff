//! Hand-vectorised elementwise functions whose scalar form in `crate::cpu::math` reads tables: a
//! table lookup per lane compiles to a gather, a permute here. Each kernel runs the same
//! steps as its scalar form (one macro writes both) and gives the same bits.

/// `out[i] = gelu(src[i])` (erf form, [`crate::cpu::math::gelu_f32`]) at the best level; `false`,
/// with `out` untouched, below AVX2. Lengths may differ: the shorter one counts.
pub fn gelu_f32(src: &[f32], out: &mut [f32]) -> bool {
    let n = src.len().min(out.len());
    let (src, out) = (&src[..n], &mut out[..n]);
    match crate::cpu::isa::level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level()` reports AVX-512 only when the processor has AVX-512 F/BW/DQ/VL,
        // AVX2 and FMA, the features the kernel enables.
        crate::cpu::isa::Level::Avx512 => unsafe { x86::gelu_avx512(src, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level()` reports AVX2 only when the processor has AVX2 and FMA.
        crate::cpu::isa::Level::Avx2 => unsafe { x86::gelu_avx2(src, out) },
        _ => return false,
    }
    true
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::cpu::math::{gelu_f32, gelu_steps};
    use std::arch::x86_64::*;

    /// `vector` over each `W` elements of `src` and `out` (same length), `scalar` over the
    /// rest. Inlined into each kernel, so `vector` compiles with the kernel's features.
    #[inline(always)]
    fn by_lanes<const W: usize>(
        src: &[f32],
        out: &mut [f32],
        scalar: impl Fn(f32) -> f32,
        mut vector: impl FnMut(&[f32], &mut [f32]),
    ) {
        let (mut xs, mut os) = (src.chunks_exact(W), out.chunks_exact_mut(W));
        for (x, o) in (&mut xs).zip(&mut os) {
            vector(x, o);
        }
        for (o, &x) in os.into_remainder().iter_mut().zip(xs.remainder()) {
            *o = scalar(x);
        }
    }

    /// [`gelu_f32`] 16 lanes at a time; `src` and `out` have the same length.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    pub(super) unsafe fn gelu_avx512(src: &[f32], out: &mut [f32]) {
        by_lanes::<16>(src, out, gelu_f32, |x, o| {
            // SAFETY: both chunks hold 16 f32s; the loads and stores are unaligned.
            unsafe {
                let x = _mm512_loadu_ps(x.as_ptr());
                let r = gelu_steps!(
                    x,
                    |a, b| _mm512_add_ps(a, b),
                    |a, b| _mm512_sub_ps(a, b),
                    |a, b| _mm512_mul_ps(a, b),
                    |a, b, c| _mm512_fmadd_ps(a, b, c),
                    |a| _mm512_xor_ps(a, _mm512_set1_ps(-0.0)),
                    // minps returns its second operand when either is NaN, as `f32::min`.
                    |a, b| _mm512_min_ps(a, b),
                    |a| _mm512_abs_ps(a),
                    |c: f32| _mm512_set1_ps(c),
                    |y: __m512| _mm512_min_epu32(
                        _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32(31)),
                        _mm512_set1_epi32(15),
                    ),
                    |k: __m512i, t: &[f32; 16]| _mm512_permutexvar_ps(
                        k,
                        _mm512_loadu_ps(t.as_ptr())
                    ),
                    |kf: __m512| _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_sub_epi32(
                        _mm512_castps_si512(kf),
                        _mm512_set1_epi32(0x4B40_0000 - 127 - 64),
                    ))),
                    |x: __m512, n: __m512, p: __m512| _mm512_mask_blend_ps(
                        _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_setzero_ps()),
                        p,
                        n,
                    ),
                    |x: __m512, r: __m512| _mm512_mask_blend_ps(
                        _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_set1_ps(f32::NEG_INFINITY)),
                        r,
                        _mm512_set1_ps(f32::NAN),
                    )
                );
                _mm512_storeu_ps(o.as_mut_ptr(), r);
            }
        });
    }

    /// [`gelu_f32`] 8 lanes at a time; `src` and `out` have the same length. A 16-entry table
    /// is two 8-entry permutes and a blend on the index's bit 3.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gelu_avx2(src: &[f32], out: &mut [f32]) {
        by_lanes::<8>(src, out, gelu_f32, |x, o| {
            // SAFETY: both chunks hold 8 f32s; the loads and stores are unaligned.
            unsafe {
                let x = _mm256_loadu_ps(x.as_ptr());
                let r = gelu_steps!(
                    x,
                    |a, b| _mm256_add_ps(a, b),
                    |a, b| _mm256_sub_ps(a, b),
                    |a, b| _mm256_mul_ps(a, b),
                    |a, b, c| _mm256_fmadd_ps(a, b, c),
                    |a| _mm256_xor_ps(a, _mm256_set1_ps(-0.0)),
                    |a, b| _mm256_min_ps(a, b),
                    |a| _mm256_andnot_ps(_mm256_set1_ps(-0.0), a),
                    |c: f32| _mm256_set1_ps(c),
                    |y: __m256| _mm256_min_epu32(
                        _mm256_and_si256(_mm256_castps_si256(y), _mm256_set1_epi32(31)),
                        _mm256_set1_epi32(15),
                    ),
                    |k: __m256i, t: &[f32; 16]| _mm256_blendv_ps(
                        _mm256_permutevar8x32_ps(_mm256_loadu_ps(t.as_ptr()), k),
                        _mm256_permutevar8x32_ps(_mm256_loadu_ps(t.as_ptr().add(8)), k),
                        _mm256_castsi256_ps(_mm256_slli_epi32::<28>(k)),
                    ),
                    |kf: __m256| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_sub_epi32(
                        _mm256_castps_si256(kf),
                        _mm256_set1_epi32(0x4B40_0000 - 127 - 64),
                    ))),
                    |x: __m256, n: __m256, p: __m256| _mm256_blendv_ps(
                        p,
                        n,
                        _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_setzero_ps()),
                    ),
                    |x: __m256, r: __m256| _mm256_blendv_ps(
                        r,
                        _mm256_set1_ps(f32::NAN),
                        _mm256_cmp_ps::<_CMP_EQ_OQ>(x, _mm256_set1_ps(f32::NEG_INFINITY)),
                    )
                );
                _mm256_storeu_ps(o.as_mut_ptr(), r);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::isa::{Level, detected_level, with_level};
    use crate::cpu::math;

    /// Every 31st f32 bit pattern (all signs, subnormals, infinities, NaNs), then the special
    /// values and the pieces' edges.
    fn inputs() -> Vec<f32> {
        // Every 1021st bit pattern: about 2000 per binade, all signs, NaNs and subnormals.
        let mut xs: Vec<f32> = (0..u32::MAX / 1021)
            .map(|i| f32::from_bits(i * 1021))
            .collect();
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            15.0,
            -15.0,
        ]);
        for k in 0..40 {
            let e = k as f32 * 0.25;
            xs.extend([
                e,
                -e,
                e.next_up(),
                -e.next_up(),
                e.next_down(),
                -e.next_down(),
            ]);
        }
        xs
    }

    #[test]
    fn gelu_kernels_give_the_scalar_bits_at_every_level() {
        let xs = inputs();
        let want: Vec<u32> = xs.iter().map(|&x| math::gelu_f32(x).to_bits()).collect();
        for level in [Level::Avx512, Level::Avx2] {
            if detected_level() < level {
                eprintln!("skipped {level:?}: this processor lacks it");
                continue;
            }
            // Every length up to 40 leaves each tail of the 8- and 16-lane loops.
            for n in (0..40).chain([xs.len()]) {
                let mut out = vec![0f32; n];
                assert!(with_level(level, || gelu_f32(&xs[..n], &mut out)));
                for (i, o) in out.iter().enumerate() {
                    assert_eq!(o.to_bits(), want[i], "gelu({:e}) at {level:?}", xs[i]);
                }
            }
        }
        let mut out = [1.0f32; 4];
        assert!(!with_level(Level::Portable, || gelu_f32(
            &xs[..4],
            &mut out
        )));
        assert_eq!(out, [1.0; 4], "the portable level leaves `out` alone");
    }
}
