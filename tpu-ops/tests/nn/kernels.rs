//! The vectorised row kernels (softmax, log-softmax, layer and RMS norm) and the blocked
//! attention kernel against naive f64 references, at every instruction-set level this machine
//! has, on the sizes around their blocking: rows of 1, 7, 17, 63, 65 and 257 elements, query and
//! key counts across the attention's row and key blocks, head dims across the vector widths,
//! transposed operands, and 16-bit outputs rounded once.

use crate::common::{check_near as check, cpu, vals};
use proptest::prelude::*;
use tpu_ops::cpu::isa::{self, Level};
use tpu_ops::ops::nn::functional as nnf;
use tpu_tensor::{DType, Generator, Tensor};

const SIZES: [usize; 6] = [1, 7, 17, 63, 65, 257];

/// The levels to compare: the portable code, AVX2 and AVX-512 where the processor has them.
fn levels() -> Vec<Level> {
    [Level::Portable, Level::Avx2, Level::Avx512]
        .into_iter()
        .filter(|&l| l <= isa::detected_level())
        .collect()
}

/// Seeded normals of `shape` as `dtype`, times `mag`; with `transposed`, a view through a
/// transpose of the last two dims of a contiguous tensor.
fn input(seed: u64, shape: &[usize], dtype: DType, mag: f64, transposed: bool) -> Tensor {
    let r = shape.len();
    let mut s = shape.to_vec();
    if transposed {
        s.swap(r - 2, r - 1);
    }
    let t = Generator::new(seed)
        .randn(&s[..], DType::F64, &cpu())
        .unwrap();
    let t = Tensor::from_vec(
        vals(&t).iter().map(|v| v * mag).collect::<Vec<_>>(),
        &s[..],
        &cpu(),
    )
    .unwrap()
    .to_dtype(dtype)
    .unwrap();
    if transposed {
        t.transpose(r - 2, r - 1).unwrap()
    } else {
        t
    }
}

/// The tolerance of a result stored as `d` and computed in f32 (or f64).
fn tol(d: DType) -> f64 {
    match d {
        DType::F64 => 1e-10,
        DType::F32 => 1e-5,
        _ => tpu_ops::testing::epsilon(d),
    }
}

fn softmax_ref(x: &[f64], n: usize, log: bool) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        out.extend(row.iter().map(|v| {
            if log {
                v - m - s.ln()
            } else {
                (v - m).exp() / s
            }
        }));
    }
    out
}

fn norm_ref(x: &[f64], n: usize, w: &[f64], b: Option<&[f64]>, rms: bool) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let (mean, var) = crate::row_moments(row, n, rms);
        let rstd = 1.0 / (var + 1e-5).sqrt();
        for (j, v) in row.iter().enumerate() {
            out.push((v - mean) * rstd * w[j] + b.map_or(0.0, |b| b[j]));
        }
    }
    out
}

/// `[B, H, L, E]` queries against `[B, H / rep, S, E]` keys and values, with the full score
/// matrix; `keep` is a `[L, S]` boolean mask.
#[allow(clippy::too_many_arguments)]
fn sdpa_ref(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (bh, rep, l, s, e, ev): (usize, usize, usize, usize, usize, usize),
    keep: Option<&[f64]>,
    causal: bool,
    scale: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; bh * l * ev];
    for h in 0..bh {
        let kh = h / rep;
        for i in 0..l {
            let sc: Vec<f64> = (0..s)
                .map(|j| {
                    let masked = (causal && j > i) || keep.is_some_and(|m| m[i * s + j] == 0.0);
                    if masked {
                        return f64::NEG_INFINITY;
                    }
                    let dot: f64 = (0..e)
                        .map(|t| q[(h * l + i) * e + t] * k[(kh * s + j) * e + t])
                        .sum();
                    dot * scale
                })
                .collect();
            let mx = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if mx == f64::NEG_INFINITY {
                continue;
            }
            let p: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
            let z: f64 = p.iter().sum();
            for t in 0..ev {
                out[(h * l + i) * ev + t] = (0..s)
                    .map(|j| p[j] / z * v[(kh * s + j) * ev + t])
                    .sum::<f64>();
            }
        }
    }
    out
}

fn size() -> impl Strategy<Value = usize> {
    prop::sample::select(&SIZES[..])
}

fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![
        3 => Just(DType::F32),
        1 => Just(DType::F64),
        1 => Just(DType::BF16),
        1 => Just(DType::F16),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn row_kernels_match_reference_at_every_level(
        rows in prop::sample::select(&[1usize, 3, 9][..]),
        n in size(),
        seed in any::<u64>(),
        transposed in any::<bool>(),
        mag in prop::sample::select(&[0.1f64, 1.0, 10.0][..]),
        dtype in dtype(),
    ) {
        let x = input(seed, &[rows, n], dtype, mag, transposed);
        let w = input(seed ^ 1, &[n], dtype, 1.0, false);
        let b = input(seed ^ 2, &[n], dtype, 1.0, false);
        let (xv, wv, bv) = (vals(&x), vals(&w), vals(&b));
        let t = tol(dtype);
        for level in levels() {
            isa::with_level(level, || {
                let what = |op: &str| format!("{op} at {level:?}");
                let got = nnf::softmax(&x, -1).unwrap();
                // The rounding of `x - max` (up to ~60 here) moves exp by a few f32 ulps of 60.
                check(&what("softmax"), &vals(&got), &softmax_ref(&xv, n, false), 4.0 * t);
                let got = nnf::log_softmax(&x, -1).unwrap();
                check(&what("log_softmax"), &vals(&got), &softmax_ref(&xv, n, true), 4.0 * t);
                let got = nnf::layer_norm_with(&x, &[n], &nnf::NormOptions::new().weight(&w).bias(&b)).unwrap();
                let want = norm_ref(&xv, n, &wv, Some(&bv), false);
                check(&what("layer_norm"), &vals(&got), &want, 10.0 * t);
                let got = nnf::rms_norm_with(&x, &[n], &nnf::RmsNormOptions::new().weight(&w).eps(1e-5)).unwrap();
                let want = norm_ref(&xv, n, &wv, None, true);
                check(&what("rms_norm"), &vals(&got), &want, 10.0 * t);
            });
        }
    }

    #[test]
    fn attention_matches_reference_at_every_level(
        l in prop::sample::select(&[1usize, 7, 17, 33, 63, 65][..]),
        s in prop::sample::select(&[1usize, 7, 17, 63, 65, 129, 257][..]),
        e in prop::sample::select(&[1usize, 7, 17, 64, 65][..]),
        ev in prop::sample::select(&[1usize, 7, 17, 63, 65][..]),
        rep in 1usize..3,
        mask_kind in 0usize..3,
        transposed in any::<bool>(),
        seed in any::<u64>(),
        dtype in dtype(),
    ) {
        let (b, hk) = (1, 2);
        let hq = hk * rep;
        let q = input(seed, &[b, hq, l, e], dtype, 1.0, transposed);
        let k = input(seed ^ 1, &[b, hk, s, e], dtype, 1.0, transposed);
        let v = input(seed ^ 2, &[b, hk, s, ev], dtype, 1.0, !transposed);
        // 0: none, 1: causal, 2: a boolean mask that leaves some rows with nothing to attend.
        let keep = Generator::new(seed ^ 3)
            .randint(0, 4, [l, s], DType::Bool, &cpu())
            .unwrap();
        let (mask, keep_v, causal) = match mask_kind {
            1 => (None, None, true),
            2 => (Some(&keep), Some(vals(&keep)), false),
            _ => (None, None, false),
        };
        let scale = 1.0 / (e as f64).sqrt();
        let dims = (b * hq, rep, l, s, e, ev);
        let want = sdpa_ref(&vals(&q), &vals(&k), &vals(&v), dims, keep_v.as_deref(), causal, scale);
        for level in levels() {
            isa::with_level(level, || {
                let got = nnf::scaled_dot_product_attention_with(&q, &k, &v, &nnf::AttentionOptions::new().attn_mask(mask).is_causal(causal).enable_gqa(true))
                    .unwrap();
                assert_eq!(got.shape(), &[b, hq, l, ev][..]);
                check(&format!("sdpa at {level:?}"), &vals(&got), &want, 10.0 * tol(dtype));
            });
        }
    }
}

#[test]
fn softmax_rows_of_nan_and_neg_inf() {
    let inf = f32::INFINITY;
    let x = Tensor::from_vec(
        vec![
            f32::NAN,
            1.0,
            2.0,
            3.0, //
            -inf,
            -inf,
            -inf,
            -inf, //
            -inf,
            0.0,
            -inf,
            1.0, //
            inf,
            0.0,
            1.0,
            2.0,
        ],
        [4, 4],
        &cpu(),
    )
    .unwrap();
    for level in levels() {
        isa::with_level(level, || {
            let got = vals(&nnf::softmax(&x, -1).unwrap());
            assert!(got[..8].iter().all(|v| v.is_nan()), "{level:?}: {got:?}");
            let e = std::f64::consts::E;
            let want = [0.0, 1.0 / (1.0 + e), 0.0, e / (1.0 + e)];
            check(&format!("{level:?}"), &got[8..12], &want, 1e-6);
            assert!(
                got[12].is_nan(),
                "{level:?}: +inf in a row gives NaN: {got:?}"
            );
        });
    }
}

#[test]
fn attention_rows_with_a_nan_score_are_nan() {
    let q = Tensor::from_vec(vec![1.0f32, f32::NAN, 0.5, 0.5], [1, 1, 2, 2], &cpu()).unwrap();
    let k = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], [1, 1, 3, 2], &cpu()).unwrap();
    let v = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [1, 1, 3, 1], &cpu()).unwrap();
    for level in levels() {
        isa::with_level(level, || {
            let got = vals(&nnf::scaled_dot_product_attention(&q, &k, &v).unwrap());
            assert!(got[0].is_nan(), "{level:?}: {got:?}");
            assert!(got[1].is_finite(), "{level:?}: {got:?}");
        });
    }
}
