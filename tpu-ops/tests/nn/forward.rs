//! The neural-network ops: property tests against naive f64 references, values computed by
//! PyTorch, dropout's statistics, refused inputs, and a few CPU-against-XLA checks beyond the
//! op table's samples.

use crate::common::test_device;
use crate::common::{check_near as check, cpu, pjrt, vals};
use proptest::prelude::*;
use tpu_ops::ops::nn::NnOps;
use tpu_ops::ops::nn::functional::{self as nnf, DEFAULT_IGNORE_INDEX, Reduction};
use tpu_ops::testing::assert_close;
use tpu_tensor::{DType, Generator, Tensor};

const NEG_INF: f64 = f64::NEG_INFINITY;

/// An f32 tensor from literal values.
fn lit(data: &[f64], shape: &[usize]) -> Tensor {
    let v: Vec<f32> = data.iter().map(|&x| x as f32).collect();
    Tensor::from_vec(v, shape, &cpu()).unwrap()
}

fn tol(d: DType) -> f64 {
    if d == DType::F64 { 1e-10 } else { 2e-5 }
}

/// Seeded normals of `shape` as `dtype`; with `strided`, seen through a transpose of the first
/// and last dims (non-contiguous whenever both exceed 1).
fn input(seed: u64, shape: &[usize], dtype: DType, strided: bool) -> Tensor {
    let r = shape.len();
    let mut g = Generator::new(seed);
    if !strided || r < 2 {
        return g
            .randn(shape, DType::F64, &cpu())
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
    }
    let mut s = shape.to_vec();
    s.swap(0, r - 1);
    g.randn(&s[..], DType::F64, &cpu())
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .transpose(0, r - 1)
        .unwrap()
}

fn split3(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    (
        shape[..dim].iter().product(),
        shape[dim],
        shape[dim + 1..].iter().product(),
    )
}

// ---- naive references, in f64 ---------------------------------------------------------------

fn softmax_ref(x: &[f64], shape: &[usize], dim: usize, log: bool) -> Vec<f64> {
    let (outer, n, inner) = split3(shape, dim);
    let mut out = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let idx = |c: usize| (o * n + c) * inner + i;
            let m = (0..n).map(|c| x[idx(c)]).fold(NEG_INF, f64::max);
            let s: f64 = (0..n).map(|c| (x[idx(c)] - m).exp()).sum();
            for c in 0..n {
                out[idx(c)] = if log {
                    x[idx(c)] - m - s.ln()
                } else {
                    (x[idx(c)] - m).exp() / s
                };
            }
        }
    }
    out
}

/// Rows of `n`: `(x - mean) / sqrt(var + eps)` (or `x / rms`), times `w[j]`, plus `b[j]`.
fn norm_ref(
    x: &[f64],
    n: usize,
    w: Option<&[f64]>,
    b: Option<&[f64]>,
    eps: f64,
    rms: bool,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let (mean, var) = crate::row_moments(row, n, rms);
        for (j, v) in row.iter().enumerate() {
            let y = (v - mean) / (var + eps).sqrt();
            out.push(y * w.map_or(1.0, |w| w[j]) + b.map_or(0.0, |b| b[j]));
        }
    }
    out
}

/// `(N, C, S)` with per-channel affine parameters.
struct Ncs {
    n: usize,
    c: usize,
    s: usize,
}

fn group_norm_ref(
    x: &[f64],
    d: &Ncs,
    groups: usize,
    w: Option<&[f64]>,
    b: Option<&[f64]>,
    eps: f64,
) -> Vec<f64> {
    let cpg = d.c / groups;
    let mut out = vec![0.0; x.len()];
    for n in 0..d.n {
        for g in 0..groups {
            let idx: Vec<usize> = (g * cpg..(g + 1) * cpg)
                .flat_map(|c| (0..d.s).map(move |s| (n * d.c + c) * d.s + s))
                .collect();
            let (mean, var) = mean_var(x, &idx);
            for &i in &idx {
                let c = (i / d.s) % d.c;
                let y = (x[i] - mean) / (var + eps).sqrt();
                out[i] = y * w.map_or(1.0, |w| w[c]) + b.map_or(0.0, |b| b[c]);
            }
        }
    }
    out
}

/// The mean and the biased variance of `x` at `idx`.
fn mean_var(x: &[f64], idx: &[usize]) -> (f64, f64) {
    let cnt = idx.len() as f64;
    let mean = idx.iter().map(|&i| x[i]).sum::<f64>() / cnt;
    let var = idx.iter().map(|&i| (x[i] - mean).powi(2)).sum::<f64>() / cnt;
    (mean, var)
}

/// Output, new running mean, new running variance.
fn batch_norm_train_ref(
    x: &[f64],
    d: &Ncs,
    rm: &[f64],
    rv: &[f64],
    momentum: f64,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; x.len()];
    let (mut nm, mut nv) = (vec![0.0; d.c], vec![0.0; d.c]);
    for c in 0..d.c {
        let idx: Vec<usize> = (0..d.n)
            .flat_map(|n| (0..d.s).map(move |s| (n * d.c + c) * d.s + s))
            .collect();
        let (mean, var) = mean_var(x, &idx);
        let cnt = idx.len() as f64;
        for &i in &idx {
            out[i] = (x[i] - mean) / (var + eps).sqrt();
        }
        nm[c] = momentum * mean + (1.0 - momentum) * rm[c];
        nv[c] = momentum * var * cnt / (cnt - 1.0) + (1.0 - momentum) * rv[c];
    }
    (out, nm, nv)
}

/// Attention sizes: batches `bo` (outside the heads), heads, lengths and widths.
#[derive(Clone, Copy, Debug)]
struct Attn {
    bo: usize,
    hq: usize,
    hk: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
}

/// With the full score matrix; `mask` is additive `[L, S]`.
fn sdpa_ref(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    a: Attn,
    mask: Option<&[f64]>,
    causal: bool,
    scale: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; a.bo * a.hq * a.l * a.ev];
    for b in 0..a.bo {
        for h in 0..a.hq {
            let kh = b * a.hk + h / (a.hq / a.hk);
            let qh = b * a.hq + h;
            for i in 0..a.l {
                let sc: Vec<f64> = (0..a.s)
                    .map(|j| {
                        let dot: f64 = (0..a.e)
                            .map(|t| q[(qh * a.l + i) * a.e + t] * k[(kh * a.s + j) * a.e + t])
                            .sum();
                        let m = mask.map_or(0.0, |m| m[i * a.s + j]);
                        if causal && j > i {
                            NEG_INF
                        } else {
                            dot * scale + m
                        }
                    })
                    .collect();
                let mx = sc.iter().copied().fold(NEG_INF, f64::max);
                if mx == NEG_INF {
                    continue;
                }
                let p: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
                let z: f64 = p.iter().sum();
                for t in 0..a.ev {
                    out[(qh * a.l + i) * a.ev + t] = (0..a.s)
                        .map(|j| p[j] / z * v[(kh * a.s + j) * a.ev + t])
                        .sum();
                }
            }
        }
    }
    out
}

/// Cross entropy (`logits`) or NLL over `[N, C, inner]`, as PyTorch 2.x defines them.
#[allow(clippy::too_many_arguments)]
fn class_loss_ref(
    x: &[f64],
    t: &[i64],
    (n, c, inner): (usize, usize, usize),
    w: Option<&[f64]>,
    ignore: i64,
    red: Reduction,
    eps: f64,
    logits: bool,
) -> Vec<f64> {
    let (mut nll, mut sm, mut ws) = (vec![], vec![], vec![]);
    for i in 0..n {
        for d in 0..inner {
            let tg = t[i * inner + d];
            if tg == ignore {
                nll.push(0.0);
                sm.push(0.0);
                ws.push(0.0);
                continue;
            }
            let xs: Vec<f64> = (0..c).map(|k| x[(i * c + k) * inner + d]).collect();
            let lse = if logits {
                let m = xs.iter().copied().fold(NEG_INF, f64::max);
                m + xs.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
            } else {
                0.0
            };
            let wt = w.map_or(1.0, |w| w[tg as usize]);
            nll.push(-wt * (xs[tg as usize] - lse));
            sm.push(
                -(0..c)
                    .map(|k| w.map_or(1.0, |w| w[k]) * (xs[k] - lse))
                    .sum::<f64>(),
            );
            ws.push(wt);
        }
    }
    let mix = |a: f64, s: f64| {
        if eps > 0.0 {
            (1.0 - eps) * a + eps / c as f64 * s
        } else {
            a
        }
    };
    match red {
        Reduction::None => nll.iter().zip(&sm).map(|(&a, &s)| mix(a, s)).collect(),
        Reduction::Sum => vec![mix(nll.iter().sum(), sm.iter().sum())],
        Reduction::Mean => {
            let wsum: f64 = ws.iter().sum();
            vec![mix(
                nll.iter().sum::<f64>() / wsum,
                sm.iter().sum::<f64>() / wsum,
            )]
        }
    }
}

fn log_sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        -(-x).exp().ln_1p()
    } else {
        x - x.exp().ln_1p()
    }
}

fn reduce_ref(v: Vec<f64>, red: Reduction) -> Vec<f64> {
    match red {
        Reduction::None => v,
        Reduction::Sum => vec![v.iter().sum()],
        Reduction::Mean => vec![v.iter().sum::<f64>() / v.len() as f64],
    }
}

fn reduction() -> impl Strategy<Value = Reduction> {
    prop_oneof![
        Just(Reduction::None),
        Just(Reduction::Mean),
        Just(Reduction::Sum)
    ]
}

fn float_dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F64), Just(DType::F32)]
}

// ---- properties -----------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn softmax_matches_reference(
        shape in prop::collection::vec(1usize..5, 1..5),
        dim_pick in 0usize..8,
        seed in any::<u64>(),
        strided in any::<bool>(),
        with_inf in any::<bool>(),
        dtype in float_dtype(),
    ) {
        let dim = dim_pick % shape.len();
        let x = input(seed, &shape, DType::F64, strided);
        let x = if with_inf {
            let mut v = vals(&x);
            for e in v.iter_mut().step_by(3) {
                *e = NEG_INF;
            }
            Tensor::from_vec(v, &shape[..], &cpu()).unwrap()
        } else {
            x
        };
        let xv = vals(&x);
        let x = x.to_dtype(dtype).unwrap();
        let xv = if dtype == DType::F32 { vals(&x) } else { xv };
        for log in [false, true] {
            let got = if log { x.log_softmax(dim as i64) } else { x.softmax(dim as i64) }.unwrap();
            prop_assert_eq!(got.shape(), &shape[..]);
            check("softmax", &vals(&got), &softmax_ref(&xv, &shape, dim, log), tol(dtype));
        }
    }

    #[test]
    fn layer_and_rms_norm_match_reference(
        shape in prop::collection::vec(1usize..6, 1..4),
        trailing in 1usize..3,
        seed in any::<u64>(),
        strided in any::<bool>(),
        affine in any::<bool>(),
        dtype in float_dtype(),
    ) {
        let k = trailing.min(shape.len());
        let ns = &shape[shape.len() - k..];
        let n: usize = ns.iter().product();
        let x = input(seed, &shape, dtype, strided);
        let w = affine.then(|| input(seed ^ 1, ns, dtype, false));
        let b = affine.then(|| input(seed ^ 2, ns, dtype, false));
        let (xv, wv, bv) = (vals(&x), w.as_ref().map(vals), b.as_ref().map(vals));
        let got = x.layer_norm_with(ns, &nnf::NormOptions::new().weight(w.as_ref()).bias(b.as_ref())).unwrap();
        let want = norm_ref(&xv, n, wv.as_deref(), bv.as_deref(), 1e-5, false);
        check("layer_norm", &vals(&got), &want, 10.0 * tol(dtype));
        let got = x.rms_norm_with(ns, &nnf::RmsNormOptions::new().weight(w.as_ref()).eps(1e-3)).unwrap();
        let want = norm_ref(&xv, n, wv.as_deref(), None, 1e-3, true);
        check("rms_norm", &vals(&got), &want, 10.0 * tol(dtype));
    }

    #[test]
    fn group_norm_matches_reference(
        n in 1usize..4,
        groups in 1usize..4,
        per_group in 1usize..4,
        spatial in prop::collection::vec(1usize..4, 0..3),
        seed in any::<u64>(),
        affine in any::<bool>(),
        dtype in float_dtype(),
    ) {
        let c = groups * per_group;
        let mut shape = vec![n, c];
        shape.extend(&spatial);
        let x = input(seed, &shape, dtype, true);
        let w = affine.then(|| input(seed ^ 1, &[c], dtype, false));
        let b = affine.then(|| input(seed ^ 2, &[c], dtype, false));
        let got = x.group_norm_with(groups, &nnf::NormOptions::new().weight(w.as_ref()).bias(b.as_ref())).unwrap();
        let d = Ncs { n, c, s: spatial.iter().product() };
        let want = group_norm_ref(&vals(&x), &d, groups, w.as_ref().map(vals).as_deref(), b.as_ref().map(vals).as_deref(), 1e-5);
        check("group_norm", &vals(&got), &want, 10.0 * tol(dtype));
    }

    #[test]
    fn batch_norm_matches_reference(
        n in 1usize..4,
        c in 1usize..4,
        s in 2usize..5,
        seed in any::<u64>(),
        momentum in 0.0f64..1.0,
        dtype in float_dtype(),
    ) {
        let x = input(seed, &[n, c, s], dtype, true);
        let rm = input(seed ^ 1, &[c], dtype, false);
        let rv = rm.to_dtype(DType::F64).unwrap();
        let rv: Vec<f64> = vals(&rv).iter().map(|v| v.abs() + 0.5).collect();
        let rv = Tensor::from_vec(rv, [c], &cpu()).unwrap().to_dtype(dtype).unwrap();
        let got = nnf::batch_norm(&x, &nnf::BatchNormOptions::new().running_mean(&rm).running_var(&rv).training(true).momentum(momentum)).unwrap();
        let d = Ncs { n, c, s };
        let (out, nm, nv) = batch_norm_train_ref(&vals(&x), &d, &vals(&rm), &vals(&rv), momentum, 1e-5);
        check("batch_norm", &vals(&got.output), &out, 10.0 * tol(dtype));
        check("running_mean", &vals(got.running_mean.as_ref().unwrap()), &nm, tol(dtype));
        check("running_var", &vals(got.running_var.as_ref().unwrap()), &nv, tol(dtype));
        // Evaluation normalises with the running stats.
        let eval = nnf::batch_norm(&x, &nnf::BatchNormOptions::new().running_mean(&rm).running_var(&rv).momentum(momentum)).unwrap();
        let (xv, m, v) = (vals(&x), vals(&rm), vals(&rv));
        let want: Vec<f64> = xv.iter().enumerate().map(|(i, &e)| {
            let ch = (i / s) % c;
            (e - m[ch]) / (v[ch] + 1e-5).sqrt()
        }).collect();
        check("batch_norm eval", &vals(&eval.output), &want, 10.0 * tol(dtype));
    }

    #[test]
    fn sdpa_matches_reference(
        bo in 1usize..3,
        hk in 1usize..3,
        rep in 1usize..4,
        l in 1usize..6,
        s in 1usize..140,
        e in 1usize..6,
        ev in 1usize..5,
        mask_kind in 0usize..4,
        seed in any::<u64>(),
        scale in prop::option::of(0.1f64..2.0),
        dtype in float_dtype(),
    ) {
        let a = Attn { bo, hq: hk * rep, hk, l, s, e, ev };
        let q = input(seed, &[bo, a.hq, l, e], dtype, true);
        let k = input(seed ^ 1, &[bo, hk, s, e], dtype, false);
        let v = input(seed ^ 2, &[bo, hk, s, ev], dtype, true);
        let mut g = Generator::new(seed ^ 3);
        // 0: none, 1: causal, 2: bool mask, 3: additive mask.
        let keep = g.randint(0, 4, [l, s], DType::Bool, &cpu()).unwrap();
        let keep_v: Vec<f64> = vals(&keep).iter().map(|&b| if b != 0.0 { 0.0 } else { NEG_INF }).collect();
        let add = input(seed ^ 4, &[l, s], dtype, false);
        let (mask, mask_ref, causal) = match mask_kind {
            1 => (None, None, true),
            2 => (Some(&keep), Some(keep_v), false),
            3 => (Some(&add), Some(vals(&add)), false),
            _ => (None, None, false),
        };
        let got = nnf::scaled_dot_product_attention_with(&q, &k, &v, &nnf::AttentionOptions::new().attn_mask(mask).is_causal(causal).scale(scale).enable_gqa(true)).unwrap();
        prop_assert_eq!(got.shape(), &[bo, a.hq, l, ev][..]);
        let sc = scale.unwrap_or(1.0 / (e as f64).sqrt());
        let want = sdpa_ref(&vals(&q), &vals(&k), &vals(&v), a, mask_ref.as_deref(), causal, sc);
        check("sdpa", &vals(&got), &want, 10.0 * tol(dtype));
    }

    #[test]
    fn rotary_matches_reference(
        b in 1usize..3,
        s in 1usize..5,
        half in 1usize..5,
        seed in any::<u64>(),
        dtype in float_dtype(),
    ) {
        let d = 2 * half;
        let x = input(seed, &[b, s, d], dtype, true);
        let cos = input(seed ^ 1, &[s, d], dtype, false);
        let sin = input(seed ^ 2, &[s, d], dtype, true);
        let got = x.apply_rotary_emb(&cos, &sin).unwrap();
        let (xv, cv, sv) = (vals(&x), vals(&cos), vals(&sin));
        let mut want = vec![0.0; xv.len()];
        for r in 0..b * s {
            let p = r % s;
            for j in 0..d {
                let rot = if j < half { -xv[r * d + j + half] } else { xv[r * d + j - half] };
                want[r * d + j] = xv[r * d + j] * cv[p * d + j] + rot * sv[p * d + j];
            }
        }
        check("rotary", &vals(&got), &want, tol(dtype));
    }

    #[test]
    fn class_losses_match_reference(
        n in 1usize..5,
        c in 1usize..5,
        inner in prop::option::of(1usize..4),
        seed in any::<u64>(),
        weighted in any::<bool>(),
        ignore in prop_oneof![Just(DEFAULT_IGNORE_INDEX), Just(0i64)],
        smoothing in prop_oneof![Just(0.0), Just(0.1), Just(0.5)],
        red in reduction(),
        dtype in float_dtype(),
    ) {
        let shape: Vec<usize> = match inner { Some(i) => vec![n, c, i], None => vec![n, c] };
        let tshape: Vec<usize> = match inner { Some(i) => vec![n, i], None => vec![n] };
        let x = input(seed, &shape, dtype, true);
        let mut g = Generator::new(seed ^ 1);
        let t: Vec<i64> = g.randint(-1, c as i64, &tshape[..], DType::I64, &cpu()).unwrap()
            .to_vec::<i64>().unwrap().into_iter().map(|t| if t < 0 { ignore } else { t }).collect();
        let tt = Tensor::from_vec(t.clone(), &tshape[..], &cpu()).unwrap();
        let w = weighted.then(|| {
            let w = input(seed ^ 2, &[c], DType::F64, false);
            let w: Vec<f64> = vals(&w).iter().map(|v| v.abs() + 0.1).collect();
            Tensor::from_vec(w, [c], &cpu()).unwrap().to_dtype(dtype).unwrap()
        });
        let wv = w.as_ref().map(vals);
        let dims = (n, c, inner.unwrap_or(1));
        let got = nnf::cross_entropy_with(&x, &tt, &nnf::CrossEntropyOptions::new().weight(w.as_ref()).ignore_index(ignore).reduction(red).label_smoothing(smoothing)).unwrap();
        let want = class_loss_ref(&vals(&x), &t, dims, wv.as_deref(), ignore, red, smoothing, true);
        check("cross_entropy", &vals(&got), &want, 10.0 * tol(dtype));
        let got = nnf::nll_loss_with(&x, &tt, &nnf::NllLossOptions::new().weight(w.as_ref()).ignore_index(ignore).reduction(red)).unwrap();
        let want = class_loss_ref(&vals(&x), &t, dims, wv.as_deref(), ignore, red, 0.0, false);
        check("nll_loss", &vals(&got), &want, 10.0 * tol(dtype));
    }

    #[test]
    fn pointwise_losses_match_reference(
        shape in prop::collection::vec(1usize..5, 1..4),
        seed in any::<u64>(),
        weighted in any::<bool>(),
        pos_weighted in any::<bool>(),
        red in reduction(),
        dtype in float_dtype(),
    ) {
        let x = input(seed, &shape, dtype, true);
        let y = input(seed ^ 1, &shape, dtype, false);
        let got = nnf::mse_loss(&x, &y, red).unwrap();
        let (xv, yv) = (vals(&x), vals(&y));
        let want = reduce_ref(xv.iter().zip(&yv).map(|(a, b)| (a - b).powi(2)).collect(), red);
        check("mse_loss", &vals(&got), &want, 10.0 * tol(dtype));
        // Probabilities as targets; weights along the last dim, as per-class weights are.
        let last = [*shape.last().unwrap()];
        let t: Vec<f64> = yv.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect();
        let t = Tensor::from_vec(t, &shape[..], &cpu()).unwrap().to_dtype(dtype).unwrap();
        let w = weighted.then(|| input(seed ^ 2, &last, dtype, false));
        let pw = pos_weighted.then(|| {
            let p: Vec<f64> = vals(&input(seed ^ 3, &last, DType::F64, false)).iter().map(|v| v.abs() + 0.2).collect();
            Tensor::from_vec(p, last, &cpu()).unwrap().to_dtype(dtype).unwrap()
        });
        let got = nnf::binary_cross_entropy_with_logits_with(&x, &t, &nnf::BceWithLogitsOptions::new().weight(w.as_ref()).pos_weight(pw.as_ref()).reduction(red)).unwrap();
        let (tv, wv, pv) = (vals(&t), w.as_ref().map(vals), pw.as_ref().map(vals));
        let k = last[0];
        let elems: Vec<f64> = (0..xv.len()).map(|i| {
            let (x, t) = (xv[i], tv[i]);
            let p = pv.as_ref().map_or(1.0, |p| p[i % k]);
            -(p * t * log_sigmoid(x) + (1.0 - t) * log_sigmoid(-x)) * wv.as_ref().map_or(1.0, |w| w[i % k])
        }).collect();
        check("bce_with_logits", &vals(&got), &reduce_ref(elems, red), 10.0 * tol(dtype));
    }
}

// ---- PyTorch's values -----------------------------------------------------------------------
//
// Generated with torch 2.15 on the CPU. The inputs are the values printed alongside; every
// snippet starts from:
//
//   import torch, torch.nn.functional as F
//   g = torch.Generator().manual_seed(0)
//   def r(*s): return (torch.randn(*s, generator=g) * 1.5).round(decimals=3)
//
// and the draws below happen in the order written.

#[test]
fn pytorch_softmax_with_neg_inf() {
    // x = torch.tensor([[1.0, -inf, 2.5, 0.3], [-inf, -inf, 0.0, -inf], [-inf] * 4])
    // F.softmax(x, -1), F.log_softmax(x, -1)
    // x2 = torch.tensor([[0.5, -1.25, 3.0], [2.0, -inf, -0.75]])
    // F.softmax(x2, 0), F.log_softmax(x2, 0)
    let x = lit(
        &[
            1.0, NEG_INF, 2.5, 0.3, NEG_INF, NEG_INF, 0.0, NEG_INF, NEG_INF, NEG_INF, NEG_INF,
            NEG_INF,
        ],
        &[3, 4],
    );
    let nan = f64::NAN;
    check(
        "softmax",
        &vals(&x.softmax(-1).unwrap()),
        &[
            0.16727234, 0.0, 0.74966264, 0.08306499, 0.0, 0.0, 1.0, 0.0, nan, nan, nan, nan,
        ],
        1e-6,
    );
    check(
        "log_softmax",
        &vals(&x.log_softmax(-1).unwrap()),
        &[
            -1.78813195,
            NEG_INF,
            -0.28813198,
            -2.488132,
            NEG_INF,
            NEG_INF,
            0.0,
            NEG_INF,
            nan,
            nan,
            nan,
            nan,
        ],
        1e-6,
    );
    let x2 = lit(&[0.5, -1.25, 3.0, 2.0, NEG_INF, -0.75], &[2, 3]);
    check(
        "softmax dim 0",
        &vals(&x2.softmax(0).unwrap()),
        &[0.18242551, 1.0, 0.97702265, 0.81757444, 0.0, 0.02297737],
        1e-6,
    );
    check(
        "log_softmax dim 0",
        &vals(&x2.log_softmax(0).unwrap()),
        &[
            -1.70141339,
            0.0,
            -0.02324545,
            -0.20141333,
            NEG_INF,
            -3.77324533,
        ],
        1e-6,
    );
}

#[test]
fn pytorch_layer_norm_with_weight_and_bias() {
    // ln_x = r(2, 3, 4); ln_w = r(4); ln_b = r(4)
    // F.layer_norm(ln_x, (4,), ln_w, ln_b, 1e-5); F.layer_norm(ln_x, (3, 4), None, None, 1e-5)
    let x = lit(
        &[
            -1.68900001,
            -1.72899997,
            -0.37599999,
            -0.65100002,
            1.273,
            1.03799999,
            -0.47400001,
            -3.1730001,
            0.70200002,
            -0.237,
            2.16499996,
            0.39899999,
            0.25,
            1.31200004,
            -0.215,
            -0.167,
            1.398,
            1.88900006,
            3.00699997,
            0.081,
            0.92699999,
            -0.61900002,
            -1.26199996,
            -3.47399998,
        ],
        &[2, 3, 4],
    );
    let w = lit(&[0.55599999, 2.18499994, 1.40999997, 1.16199994], &[4]);
    let b = lit(&[0.28799999, 1.89600003, -1.93599999, -1.18700004], &[4]);
    check(
        "layer_norm",
        &vals(
            &x.layer_norm_with(&[4], &nnf::NormOptions::new().weight(&w).bias(&b))
                .unwrap(),
        ),
        &[
            -0.24227424,
            -0.33217815,
            -0.22464547,
            -0.30415249,
            0.79254031,
            3.58881974,
            -2.04746842,
            -3.04984498,
            0.25311527,
            -0.57103407,
            0.31809759,
            -1.65973794,
            0.24727663,
            5.51283312,
            -3.10642982,
            -2.06078434,
            0.18436003,
            2.51031637,
            -0.03846937,
            -2.86087871,
            1.00317299,
            2.57030535,
            -2.07420897,
            -2.92636108,
        ],
        1e-5,
    );
    check(
        "layer_norm [3, 4]",
        &vals(&x.layer_norm(&[3, 4]).unwrap()),
        &[
            -1.02866781,
            -1.05685687,
            -0.10336006,
            -0.29716024,
            1.05873621,
            0.893125,
            -0.17242341,
            -2.07448387,
            0.65633655,
            -0.00540291,
            1.68735337,
            0.44280398,
            -0.0066364,
            0.65930247,
            -0.29821983,
            -0.26812088,
            0.71322972,
            1.02111685,
            1.72217107,
            -0.11260973,
            0.41788396,
            -0.55155253,
            -0.95475274,
            -2.34181213,
        ],
        1e-5,
    );
}

#[test]
fn pytorch_rms_norm() {
    // (after the layer_norm draws) rms_x = r(2, 4); rms_w = r(4)
    // F.rms_norm(rms_x, (4,), rms_w); F.rms_norm(rms_x, (2, 4), None, 0.1)
    let x = lit(
        &[
            -0.031,
            -1.07799995,
            0.778,
            -1.96899998,
            0.28799999,
            0.81400001,
            -3.32800007,
            0.38800001,
        ],
        &[2, 4],
    );
    let w = lit(&[-1.54499996, -0.75099999, 0.41, -1.37699997], &[4]);
    check(
        "rms_norm",
        &vals(
            &x.rms_norm_with(&[4], &nnf::RmsNormOptions::new().weight(&w))
                .unwrap(),
        ),
        &[
            0.04031596,
            0.68146807,
            0.2685037,
            2.28226709,
            -0.25720155,
            -0.35335967,
            -0.78871453,
            -0.30882919,
        ],
        1e-5,
    );
    check(
        "rms_norm eps",
        &vals(
            &x.rms_norm_with(&[2, 4], &nnf::RmsNormOptions::new().eps(0.1))
                .unwrap(),
        ),
        &[
            -0.02043138,
            -0.71048474,
            0.51276177,
            -1.29772222,
            0.18981411,
            0.53648853,
            -2.19340777,
            0.25572181,
        ],
        1e-5,
    );
    // PyTorch's default eps for bf16 is f32's epsilon: tiny inputs stay well scaled.
    // F.rms_norm(torch.tensor([[1e-3, 2e-3, -1e-3, 4e-3]], dtype=torch.bfloat16), (4,))
    let tiny = lit(&[1e-3, 2e-3, -1e-3, 4e-3], &[1, 4])
        .to_dtype(DType::BF16)
        .unwrap();
    check(
        "rms_norm bf16 default eps",
        &vals(&tiny.rms_norm(&[4]).unwrap()),
        &[0.4219, 0.8438, -0.4219, 1.6875],
        1e-3,
    );
}

#[test]
fn pytorch_group_norm() {
    // (after the rms draws) gn_x = r(2, 4, 3); gn_w = r(4); gn_b = r(4)
    // F.group_norm(gn_x, 2, gn_w, gn_b, 1e-5)
    let x = lit(
        &[
            -0.14,
            1.03100002,
            -1.25699997,
            0.001,
            1.26300001,
            -0.60000002,
            1.55900002,
            0.537,
            0.11,
            1.66999996,
            0.42300001,
            0.65100002,
            -1.204,
            -1.94299996,
            -1.125,
            -1.96800005,
            0.31,
            -0.5,
            -0.64300001,
            0.34900001,
            1.19500005,
            -0.27700001,
            -0.55500001,
            -1.81500006,
        ],
        &[2, 4, 3],
    );
    let w = lit(&[-0.42699999, -0.2, 2.83899999, 4.66699982], &[4]);
    let b = lit(&[-0.68800002, -0.50400001, -2.35500002, 1.847], &[4]);
    check(
        "group_norm",
        &vals(
            &x.group_norm_with(2, &nnf::NormOptions::new().weight(&w).bias(&b))
                .unwrap(),
        ),
        &[
            -0.59553617,
            -1.16640723,
            -0.05099051,
            -0.49288744,
            -0.78105336,
            -0.35565469,
            1.21970451,
            -3.75760889,
            -5.83717155,
            8.61208439,
            -1.37141848,
            0.45395342,
            -0.61717194,
            -0.2216403,
            -0.65945476,
            -0.2792972,
            -0.8503716,
            -0.64731181,
            -3.43530416,
            -0.39081034,
            2.20560288,
            1.91763234,
            0.51507497,
            -5.84183979,
        ],
        1e-5,
    );
}

#[test]
fn pytorch_batch_norm_training_stats() {
    // (after the group_norm draws) bn_x = r(3, 2, 2); bn_rm = r(2); bn_rv = r(2).abs() + 0.5
    // bn_w = r(2); bn_b = r(2); rm, rv = bn_rm.clone(), bn_rv.clone()
    // F.batch_norm(bn_x, rm, rv, bn_w, bn_b, training=True, momentum=0.1, eps=1e-5)  # updates rm, rv
    // F.batch_norm(bn_x, bn_rm, bn_rv, bn_w, bn_b, training=False, momentum=0.1, eps=1e-5)
    let x = lit(
        &[
            2.09200001,
            1.75699997,
            0.64999998,
            -2.60100007,
            -2.00399995,
            1.33099997,
            1.15199995,
            0.086,
            0.336,
            0.82800001,
            -0.86799997,
            0.027,
        ],
        &[3, 2, 2],
    );
    let rm = lit(&[0.198, 1.52999997], &[2]);
    let rv = lit(&[1.17000008, 1.17799997], &[2]);
    let w = lit(&[-1.46399999, 1.06700003], &[2]);
    let b = lit(&[-1.13699996, -0.96499997], &[2]);
    let opts = nnf::BatchNormOptions::new()
        .running_mean(&rm)
        .running_var(&rv)
        .weight(&w)
        .bias(&b);
    let out = nnf::batch_norm(&x, &opts.training(true)).unwrap();
    check(
        "batch_norm",
        &vals(&out.output),
        &[
            -2.62291789,
            -2.25921893,
            -0.16747192,
            -3.01979733,
            1.82397914,
            -1.79672432,
            0.27296713,
            -0.6623078,
            -0.71648449,
            -1.25063324,
            -1.49931741,
            -0.71407253,
        ],
        1e-5,
    );
    check(
        "running_mean",
        &vals(&out.running_mean.unwrap()),
        &[0.25053334, 1.35109997],
        1e-6,
    );
    check(
        "running_var",
        &vals(&out.running_var.unwrap()),
        &[1.27120614, 1.23767734],
        1e-6,
    );
    // The inputs are left as they were.
    check("rm unchanged", &vals(&rm), &[0.198, 1.52999997], 1e-7);
    let eval = nnf::batch_norm(&x, &opts).unwrap();
    assert!(eval.running_mean.is_none() && eval.running_var.is_none());
    check(
        "batch_norm eval",
        &vals(&eval.output),
        &[
            -3.70045829,
            -3.24704814,
            -1.83011258,
            -5.02611399,
            1.8433249,
            -2.6704731,
            -1.33660519,
            -2.38457108,
            -1.32377779,
            -1.98968148,
            -3.3224318,
            -2.44257307,
        ],
        1e-5,
    );
}

fn sdpa_inputs() -> (Tensor, Tensor, Tensor) {
    // (after the batch_norm draws) q = r(1, 4, 3, 2); k = r(1, 2, 3, 2); v = r(1, 2, 3, 2)
    let q = lit(
        &[
            -0.099,
            -0.53799999,
            -2.34200001,
            -0.53200001,
            1.62199998,
            0.197,
            2.3599999,
            1.17200005,
            -0.76700002,
            -2.5710001,
            -0.76499999,
            -0.71200001,
            -0.94999999,
            -2.2019999,
            -1.31799996,
            -3.11800003,
            -1.65100002,
            -1.08000004,
            0.018,
            0.50999999,
            -0.39500001,
            1.921,
            0.029,
            -1.32099998,
        ],
        &[1, 4, 3, 2],
    );
    let k = lit(
        &[
            0.74800003,
            -0.78500003,
            -0.377,
            -1.58299994,
            -0.83899999,
            -0.18000001,
            -0.245,
            -0.37599999,
            -1.63199997,
            0.007,
            0.34900001,
            -1.23000002,
        ],
        &[1, 2, 3, 2],
    );
    let v = lit(
        &[
            -1.01900005,
            2.13800001,
            2.94700003,
            1.15199995,
            2.9849999,
            1.07700002,
            -0.745,
            1.96500003,
            0.59299999,
            0.134,
            -0.252,
            -0.70899999,
        ],
        &[1, 2, 3, 2],
    );
    (q, k, v)
}

#[test]
fn pytorch_sdpa_causal_and_masked_with_gqa() {
    // F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    // m = torch.tensor([[True, False, True], [False, False, False], [True, True, False]])
    // F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True, scale=0.7)
    let (q, k, v) = sdpa_inputs();
    let got = gqa(&q, &k, &v, &nnf::AttentionOptions::new().is_causal(true)).unwrap();
    check(
        "sdpa causal",
        &vals(&got),
        &[
            -1.01900005,
            2.13800001,
            2.5381043,
            1.25365686,
            0.16362087,
            1.83586276,
            -1.01900005,
            2.13800001,
            2.49901223,
            1.26337564,
            2.23617887,
            1.30793011,
            -0.745,
            1.96500003,
            0.07146741,
            0.84769666,
            0.21787509,
            0.31242752,
            -0.745,
            1.96500003,
            0.20834988,
            0.6603784,
            -0.23130065,
            0.11775948,
        ],
        1e-5,
    );
    let m = Tensor::from_vec(
        vec![true, false, true, false, false, false, true, true, false],
        [3, 3],
        &cpu(),
    )
    .unwrap();
    let got = gqa(
        &q,
        &k,
        &v,
        &nnf::AttentionOptions::new().attn_mask(&m).scale(0.7),
    )
    .unwrap();
    // The fully masked query row gives zeros, as PyTorch's.
    check(
        "sdpa masked",
        &vals(&got),
        &[
            0.86515445,
            1.63872707,
            0.0,
            0.0,
            -0.22648184,
            1.94096947,
            -0.59195656,
            2.02483964,
            0.0,
            0.0,
            1.88050342,
            1.41714501,
            -0.39234912,
            0.05224453,
            0.0,
            0.0,
            0.30945489,
            0.52202028,
            -0.534886,
            0.82535523,
            0.0,
            0.0,
            -0.2023495,
            1.22240424,
        ],
        1e-5,
    );
}

#[test]
fn pytorch_rotary_embedding() {
    // Hugging Face Llama's tables and rotate_half, in float64:
    // inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 4, 2).double() / 4))
    // freqs = torch.outer(torch.arange(3).double(), inv_freq); emb = torch.cat((freqs, freqs), -1)
    // cos, sin = emb.cos(), emb.sin()
    // (after the sdpa draws) rx = r(1, 2, 3, 4)
    // (rx.double() * cos + rotate_half(rx.double()) * sin).float()
    let (cos, sin) = nnf::rotary_cos_sin(&[0, 1, 2], 4, 10000.0, DType::F64, &cpu()).unwrap();
    check(
        "cos",
        &vals(&cos),
        &[
            1.0,
            1.0,
            1.0,
            1.0,
            0.54030231,
            0.99995,
            0.54030231,
            0.99995,
            -0.41614684,
            0.99980001,
            -0.41614684,
            0.99980001,
        ],
        1e-8,
    );
    check(
        "sin",
        &vals(&sin),
        &[
            0.0, 0.0, 0.0, 0.0, 0.84147098, 0.00999983, 0.84147098, 0.00999983, 0.90929743,
            0.01999867, 0.90929743, 0.01999867,
        ],
        1e-8,
    );
    let x = lit(
        &[
            2.2349999,
            -1.051,
            0.271,
            2.04200006,
            3.05599999,
            0.96499997,
            -1.09899998,
            -0.73199999,
            0.838,
            1.18799996,
            -0.27700001,
            -1.09800005,
            -0.121,
            -1.47000003,
            0.091,
            -0.73299998,
            -1.22099996,
            1.23000002,
            -0.94999999,
            1.94200003,
            2.19400001,
            -0.93099999,
            1.48300004,
            -0.648,
        ],
        &[1, 2, 3, 4],
    );
    let (cos, sin) = nnf::rotary_cos_sin(&[0, 1, 2], 4, 10000.0, DType::F32, &cpu()).unwrap();
    check(
        "rotary",
        &vals(&x.apply_rotary_emb(&cos, &sin).unwrap()),
        &[
            2.2349999,
            -1.051,
            0.271,
            2.04200006,
            2.57594037,
            0.97227162,
            1.97774315,
            -0.72231358,
            -0.09685566,
            1.20972085,
            0.8772639,
            -1.07402205,
            -0.121,
            -1.47000003,
            0.091,
            -0.73299998,
            0.13968833,
            1.21051884,
            -1.5407232,
            1.95420277,
            -2.26151419,
            -0.91785467,
            1.3778528,
            -0.66648918,
        ],
        1e-6,
    );
}

#[test]
fn pytorch_cross_entropy_weights_ignore_smoothing() {
    // (after the rotary draws) ce_x = r(4, 3); ce_t = torch.tensor([0, 2, -100, 1])
    // ce_w = torch.tensor([0.2, 1.0, 2.5])
    // F.cross_entropy(ce_x, ce_t, weight=ce_w, label_smoothing=0.1)  (and reduction='sum', 'none')
    // F.cross_entropy(ce_x, ce_t)
    // ce3_x = r(2, 3, 2); ce3_t = torch.tensor([[1, 0], [2, 1]])
    // F.cross_entropy(ce3_x, ce3_t, ignore_index=1, label_smoothing=0.25)
    let x = lit(
        &[
            0.49200001,
            -2.16599989,
            -2.07500005,
            -1.19799995,
            -1.39100003,
            1.16199994,
            1.85500002,
            -1.15499997,
            -1.48800004,
            2.54699993,
            0.17399999,
            -1.38399994,
        ],
        &[4, 3],
    );
    let t = Tensor::from_vec(vec![0i64, 2, -100, 1], [4], &cpu()).unwrap();
    let w = lit(&[0.2, 1.0, 2.5], &[3]);
    let ce = |red, ls| {
        vals(
            &nnf::cross_entropy_with(
                &x,
                &t,
                &nnf::CrossEntropyOptions::new()
                    .weight(&w)
                    .reduction(red)
                    .label_smoothing(ls),
            )
            .unwrap(),
        )
    };
    check("ce mean", &ce(Reduction::Mean, 0.1), &[0.93889493], 1e-5);
    check("ce sum", &ce(Reduction::Sum, 0.1), &[3.47391129], 1e-5);
    check(
        "ce none",
        &ce(Reduction::None, 0.1),
        &[0.34408015, 0.47805178, 0.0, 2.65177917],
        1e-5,
    );
    let plain = nnf::cross_entropy(&x, &t);
    check("ce plain", &vals(&plain.unwrap()), &[0.92528802], 1e-5);
    let x3 = lit(
        &[
            1.54100001,
            -1.68200004,
            1.09599996,
            -0.066,
            1.745,
            0.228,
            1.06400001,
            0.611,
            -2.90700006,
            -1.91999996,
            -2.02200007,
            0.09,
        ],
        &[2, 3, 2],
    );
    let t3 = Tensor::from_vec(vec![1i64, 0, 2, 1], [2, 2], &cpu()).unwrap();
    let got = nnf::cross_entropy_with(
        &x3,
        &t3,
        &nnf::CrossEntropyOptions::new()
            .ignore_index(1)
            .label_smoothing(0.25),
    )
    .unwrap();
    check("ce spatial", &vals(&got), &[2.60982156], 1e-5);
}

#[test]
fn pytorch_nll_loss() {
    // (after the cross-entropy draws) nll_x = F.log_softmax(r(3, 4), -1).round(decimals=4)
    // nll_t = torch.tensor([3, 0, 1]); nll_w = torch.tensor([1.0, 0.5, 2.0, 0.25])
    // F.nll_loss(nll_x, nll_t, weight=nll_w)
    // F.nll_loss(nll_x, nll_t, weight=nll_w, ignore_index=0, reduction='none')
    // F.nll_loss(nll_x, nll_t, weight=nll_w, ignore_index=0)
    let x = lit(
        &[
            -2.91280007,
            -0.1478,
            -3.11279988,
            -3.25480008,
            -3.5638001,
            -0.30680001,
            -2.32780004,
            -1.97780001,
            -2.3283,
            -0.62629998,
            -1.33430004,
            -2.2572999,
        ],
        &[3, 4],
    );
    let t = Tensor::from_vec(vec![3i64, 0, 1], [3], &cpu()).unwrap();
    let w = lit(&[1.0, 0.5, 2.0, 0.25], &[4]);
    let nll = |ign, red| {
        vals(
            &nnf::nll_loss_with(
                &x,
                &t,
                &nnf::NllLossOptions::new()
                    .weight(&w)
                    .ignore_index(ign)
                    .reduction(red),
            )
            .unwrap(),
        )
    };
    check(
        "nll mean",
        &nll(DEFAULT_IGNORE_INDEX, Reduction::Mean),
        &[2.68037152],
        1e-5,
    );
    check(
        "nll none",
        &nll(0, Reduction::None),
        &[0.81370002, 0.0, 0.31314999],
        1e-5,
    );
    check("nll ignore", &nll(0, Reduction::Mean), &[1.50246668], 1e-5);
}

#[test]
fn pytorch_bce_with_logits_and_mse() {
    // (after the nll draws) b_x = r(2, 3); b_t = torch.tensor([[1.0, 0.0, 0.3], [0.0, 1.0, 0.8]])
    // b_w = torch.tensor([0.5, 1.0, 2.0]); b_pw = torch.tensor([3.0, 0.5, 1.0])
    // F.binary_cross_entropy_with_logits(b_x, b_t, weight=b_w, pos_weight=b_pw, reduction='none')
    // F.binary_cross_entropy_with_logits(b_x, b_t, pos_weight=b_pw)
    // F.binary_cross_entropy_with_logits(b_x, b_t, weight=b_w, reduction='sum')
    // F.mse_loss(b_x, b_t)
    let x = lit(
        &[
            -0.74299997,
            2.89899993,
            -2.375,
            -0.88499999,
            -0.26300001,
            0.52899998,
        ],
        &[2, 3],
    );
    let t = lit(&[1.0, 0.0, 0.3, 0.0, 1.0, 0.8], &[2, 3]);
    let w = lit(&[0.5, 1.0, 2.0], &[3]);
    let pw = lit(&[3.0, 0.5, 1.0], &[3]);
    let bce = |w: Option<&Tensor>, pw: Option<&Tensor>, red| {
        vals(
            &nnf::binary_cross_entropy_with_logits_with(
                &x,
                &t,
                &nnf::BceWithLogitsOptions::new()
                    .weight(w)
                    .pos_weight(pw)
                    .reduction(red),
            )
            .unwrap(),
        )
    };
    check(
        "bce none",
        &bce(Some(&w), Some(&pw), Reduction::None),
        &[
            1.69818306, 2.95261478, 1.60287881, 0.17275643, 0.41663426, 1.13805377,
        ],
        1e-5,
    );
    check(
        "bce mean",
        &bce(None, Some(&pw), Reduction::Mean),
        &[1.41359901],
        1e-5,
    );
    check(
        "bce sum",
        &bce(Some(&w), None, Reduction::Sum),
        &[7.26563263],
        1e-5,
    );
    let mse = nnf::mse_loss(&x, &t, Reduction::Mean).unwrap();
    check("mse", &vals(&mse), &[3.50828481], 1e-5);
}

// ---- dropout --------------------------------------------------------------------------------

#[test]
fn dropout_statistics_scaling_and_seeds() {
    let x = Tensor::ones([200, 100], DType::F32, &cpu()).unwrap();
    let p = 0.3;
    let y = nnf::dropout_seeded(&x, p, true, 11).unwrap();
    let v = vals(&y);
    let kept = (1.0f64 / 0.7) as f32 as f64;
    let zeros = v.iter().filter(|&&e| e == 0.0).count();
    assert!(
        v.iter().all(|&e| e == 0.0 || e == kept),
        "values other than 0 and 1/(1-p)"
    );
    let frac = zeros as f64 / v.len() as f64;
    // 20000 draws: the standard deviation of the fraction is about 0.0032.
    assert!((frac - p).abs() < 0.02, "dropped fraction {frac}");
    // Reproducible; another seed or a used generator draws another mask.
    assert_eq!(v, vals(&nnf::dropout_seeded(&x, p, true, 11).unwrap()));
    assert_ne!(v, vals(&nnf::dropout_seeded(&x, p, true, 12).unwrap()));
    let mut g = Generator::new(11);
    let first = vals(&x.dropout(p, true, &mut g).unwrap());
    let second = vals(&x.dropout(p, true, &mut g).unwrap());
    assert_eq!(first, v);
    assert_ne!(first, second);
    // Identity in evaluation or with p = 0 (the same tensor, as PyTorch).
    assert!(nnf::dropout_seeded(&x, p, false, 1).unwrap().is_same(&x));
    assert!(nnf::dropout_seeded(&x, 0.0, true, 1).unwrap().is_same(&x));
    // p = 1 zeroes everything by multiplying by zero, so NaN stays NaN as in PyTorch.
    let z = lit(&[1.0, f64::NAN, -2.0], &[3]);
    let out = vals(&nnf::dropout_seeded(&z, 1.0, true, 1).unwrap());
    assert!(out[0] == 0.0 && out[1].is_nan() && out[2] == 0.0);
    // bf16 keeps the scaled values rounded once.
    let xb = x.to_dtype(DType::BF16).unwrap();
    let yb = vals(&nnf::dropout_seeded(&xb, 0.5, true, 3).unwrap());
    assert!(yb.iter().all(|&e| e == 0.0 || e == 2.0));
    assert!(nnf::dropout_seeded(&x, 1.5, true, 1).is_err());
    assert!(nnf::dropout_seeded(&x, -0.1, true, 1).is_err());
}

// ---- refused inputs -------------------------------------------------------------------------

/// Attention with `opts` and grouped-query heads enabled.
fn gqa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &nnf::AttentionOptions,
) -> tpu_tensor::Result<Tensor> {
    nnf::scaled_dot_product_attention_with(q, k, v, &opts.enable_gqa(true))
}

fn err_text<T>(r: tpu_tensor::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_inputs_are_errors_naming_the_shapes() {
    let x = Tensor::zeros([3, 4], DType::F32, &cpu()).unwrap();
    let e = err_text(x.layer_norm(&[3]));
    assert!(e.contains("[3]") && e.contains("[3, 4]"), "{e}");
    let e = err_text(x.layer_norm_with(
        &[4],
        &nnf::NormOptions::new().weight(&Tensor::zeros([3], DType::F32, &cpu()).unwrap()),
    ));
    assert!(
        e.contains("weight") && e.contains("[4]") && e.contains("[3]"),
        "{e}"
    );
    let e = err_text(x.rms_norm(&[2, 4]));
    assert!(e.contains("[2, 4]") && e.contains("[3, 4]"), "{e}");
    let e = err_text(x.group_norm(3));
    assert!(e.contains("num_groups=3") && e.contains("[3, 4]"), "{e}");
    let e = err_text(x.softmax(2));
    assert!(e.contains("[3, 4]"), "{e}");

    // Attention: key/value heads that do not divide the query heads, and mismatched heads
    // without enable_gqa.
    let q = Tensor::zeros([1, 3, 2, 4], DType::F32, &cpu()).unwrap();
    let k = Tensor::zeros([1, 2, 5, 4], DType::F32, &cpu()).unwrap();
    let e = err_text(gqa(&q, &k, &k, &nnf::AttentionOptions::new()));
    assert!(
        e.contains("divide") && e.contains("[1, 3, 2, 4]") && e.contains("[1, 2, 5, 4]"),
        "{e}"
    );
    let q4 = Tensor::zeros([1, 4, 2, 4], DType::F32, &cpu()).unwrap();
    let e = err_text(nnf::scaled_dot_product_attention(&q4, &k, &k));
    assert!(
        e.contains("enable_gqa") && e.contains("[1, 4, 2, 4]"),
        "{e}"
    );
    let k3 = Tensor::zeros([1, 2, 5, 3], DType::F32, &cpu()).unwrap();
    let e = err_text(gqa(&q4, &k3, &k3, &nnf::AttentionOptions::new()));
    assert!(e.contains("[1, 2, 5, 3]"), "{e}");
    let m = Tensor::zeros([3, 5], DType::Bool, &cpu()).unwrap();
    let e = err_text(gqa(
        &q4,
        &k,
        &k,
        &nnf::AttentionOptions::new().attn_mask(&m),
    ));
    assert!(e.contains("[1, 4, 2, 5]") && e.contains("[3, 5]"), "{e}");
    let m = Tensor::zeros([2, 5], DType::Bool, &cpu()).unwrap();
    assert!(
        gqa(
            &q4,
            &k,
            &k,
            &nnf::AttentionOptions::new().attn_mask(&m).is_causal(true)
        )
        .is_err()
    );

    // Losses: targets out of range, and mismatched shapes.
    let logits = Tensor::zeros([3, 4], DType::F32, &cpu()).unwrap();
    let t = Tensor::from_vec(vec![1i64, 5, 2], [3], &cpu()).unwrap();
    let e = err_text(nnf::cross_entropy(&logits, &t));
    assert!(e.contains("index 5") && e.contains("[3, 4]"), "{e}");
    let t = Tensor::from_vec(vec![1i64, -3, 2], [3], &cpu()).unwrap();
    let e = err_text(nnf::nll_loss_with(
        &logits,
        &t,
        &nnf::NllLossOptions::new().reduction(Reduction::Sum),
    ));
    assert!(e.contains("index -3"), "{e}");
    let t = Tensor::from_vec(vec![1i64, 2], [2], &cpu()).unwrap();
    let e = err_text(nnf::cross_entropy(&logits, &t));
    assert!(
        e.contains("[3]") && e.contains("[2]") && e.contains("[3, 4]"),
        "{e}"
    );
    let ti32 = Tensor::from_vec(vec![1i32, 2, 0], [3], &cpu()).unwrap();
    assert!(nnf::cross_entropy(&logits, &ti32).is_err());
    let y = Tensor::zeros([4], DType::F32, &cpu()).unwrap();
    let e = err_text(nnf::mse_loss(&logits, &y, Reduction::Mean));
    assert!(e.contains("[3, 4]") && e.contains("[4]"), "{e}");
    let pw = Tensor::zeros([3], DType::F32, &cpu()).unwrap();
    let e = err_text(nnf::binary_cross_entropy_with_logits_with(
        &logits,
        &logits,
        &nnf::BceWithLogitsOptions::new().pos_weight(&pw),
    ));
    assert!(e.contains("[3]") && e.contains("[3, 4]"), "{e}");

    // Batch norm: one value per channel in training; no running stats in evaluation.
    let one = Tensor::zeros([1, 3], DType::F32, &cpu()).unwrap();
    let e = err_text(nnf::batch_norm(
        &one,
        &nnf::BatchNormOptions::new().training(true),
    ));
    assert!(e.contains("[1, 3]"), "{e}");
    assert!(nnf::batch_norm(&x, &nnf::BatchNormOptions::new()).is_err());

    // Rotary: odd last dim; tables that do not broadcast.
    let odd = Tensor::zeros([2, 3], DType::F32, &cpu()).unwrap();
    let e = err_text(odd.apply_rotary_emb(&odd, &odd));
    assert!(e.contains("[2, 3]"), "{e}");
    let c = Tensor::zeros([3, 4], DType::F32, &cpu()).unwrap();
    let e = err_text(
        Tensor::zeros([2, 4], DType::F32, &cpu())
            .unwrap()
            .apply_rotary_emb(&c, &c),
    );
    assert!(e.contains("[2, 4]") && e.contains("[3, 4]"), "{e}");

    // Integer inputs are refused.
    let ints = Tensor::zeros([2, 4], DType::I32, &cpu()).unwrap();
    let e = err_text(ints.softmax(-1));
    assert!(e.contains("i32"), "{e}");
}

// ---- sizes past the parallel threshold and the key blocks, and edge sizes ---------------------

#[test]
fn large_inputs_take_the_parallel_paths() {
    let shape = [300, 257];
    let x = input(5, &shape, DType::F32, true);
    let xv = vals(&x);
    check(
        "softmax",
        &vals(&x.softmax(1).unwrap()),
        &softmax_ref(&xv, &shape, 1, false),
        2e-5,
    );
    check(
        "softmax dim 0",
        &vals(&x.log_softmax(0).unwrap()),
        &softmax_ref(&xv, &shape, 0, true),
        2e-5,
    );
    check(
        "layer_norm",
        &vals(&x.layer_norm(&[257]).unwrap()),
        &norm_ref(&xv, 257, None, None, 1e-5, false),
        1e-4,
    );
    let a = Attn {
        bo: 1,
        hq: 4,
        hk: 2,
        l: 40,
        s: 300,
        e: 16,
        ev: 8,
    };
    let q = input(6, &[1, 4, 40, 16], DType::F32, false);
    let k = input(7, &[1, 2, 300, 16], DType::F32, false);
    let v = input(8, &[1, 2, 300, 8], DType::F32, false);
    let got = gqa(&q, &k, &v, &nnf::AttentionOptions::new().is_causal(true)).unwrap();
    let want = sdpa_ref(&vals(&q), &vals(&k), &vals(&v), a, None, true, 0.25);
    check("sdpa", &vals(&got), &want, 1e-4);
}

#[test]
fn sixteen_bit_floats_round_once() {
    let x = input(9, &[7, 33], DType::F64, true);
    let xv = vals(&x);
    for d in [DType::BF16, DType::F16] {
        let xd = x.to_dtype(d).unwrap();
        let got = vals(&xd.layer_norm(&[33]).unwrap());
        let want = norm_ref(&vals(&xd), 33, None, None, 1e-5, false);
        check(
            "layer_norm 16-bit",
            &got,
            &want,
            tpu_ops::testing::epsilon(d),
        );
        let got = vals(&xd.softmax(-1).unwrap());
        check(
            "softmax 16-bit",
            &got,
            &softmax_ref(&vals(&xd), &[7, 33], 1, false),
            tpu_ops::testing::epsilon(d),
        );
    }
    assert_eq!(xv.len(), 7 * 33);
}

#[test]
fn empty_inputs_give_empty_outputs() {
    let x = Tensor::zeros([0, 3], DType::F32, &cpu()).unwrap();
    assert_eq!(x.softmax(-1).unwrap().shape(), &[0, 3]);
    assert_eq!(x.layer_norm(&[3]).unwrap().shape(), &[0, 3]);
    let mse = nnf::mse_loss(&x, &x, Reduction::Mean).unwrap();
    assert!(vals(&mse)[0].is_nan());
    assert_eq!(vals(&nnf::mse_loss(&x, &x, Reduction::Sum).unwrap()), [0.0]);
    let s = Tensor::scalar(3.0f32, &cpu()).unwrap();
    assert_eq!(vals(&s.softmax(0).unwrap()), [1.0]);
    assert_eq!(vals(&s.log_softmax(-1).unwrap()), [0.0]);
}

// ---- CPU against XLA beyond the op table's samples --------------------------------------------

#[test]
fn long_attention_and_dropout_masks_agree_with_xla() {
    let Some(dev) = pjrt("long_attention_and_dropout_masks_agree_with_xla") else {
        return;
    };
    // Several key blocks, grouped heads, a bool mask broadcast over the batch.
    let q = input(30, &[2, 4, 9, 16], DType::F32, true);
    let k = input(31, &[2, 2, 150, 16], DType::F32, false);
    let v = input(32, &[2, 2, 150, 8], DType::F32, false);
    let m = Generator::new(33)
        .randint(0, 2, [1, 1, 9, 150], DType::Bool, &cpu())
        .unwrap();
    let on = |t: &Tensor| t.to_device(&dev).unwrap();
    let a = gqa(&q, &k, &v, &nnf::AttentionOptions::new().attn_mask(&m)).unwrap();
    let b = gqa(
        &on(&q),
        &on(&k),
        &on(&v),
        &nnf::AttentionOptions::new().attn_mask(&on(&m)),
    )
    .unwrap();
    assert_close("sdpa long", &a, &b, 1e-5).unwrap();
    // One seed, one mask, on every device.
    let x = input(34, &[64, 48], DType::F32, false);
    let a = nnf::dropout_seeded(&x, 0.4, true, 99).unwrap();
    let b = nnf::dropout_seeded(&on(&x), 0.4, true, 99).unwrap();
    assert_close("dropout", &a, &b, 0.0).unwrap();
}

// ---- on every device: targets out of range, attention without head dims -----------------------

test_device!(
    class_targets_out_of_range_are_errors_on_every_device,
    |dev| {
        let on = |t: Tensor| t.to_device(&dev).unwrap();
        let tgt = |v: &[i64], s: &[usize]| on(Tensor::from_slice(v, s, &cpu()).unwrap());
        let index_err = |r: tpu_tensor::Result<Tensor>| {
            tpu_ops::testing::index_error_of(r).unwrap_or_else(|e| panic!("on {dev}: {e}"))
        };
        let z = on(Tensor::zeros([2, 3], DType::F32, &cpu()).unwrap());
        // F.cross_entropy(torch.zeros(2, 3), torch.tensor([3, 0])) -> IndexError: Target 3 is
        //   out of bounds.
        let e = index_err(nnf::cross_entropy(&z, &tgt(&[3, 0], &[2])));
        assert_eq!(e, ("cross_entropy".into(), 3, 1, 3, vec![2, 3]));
        // F.nll_loss(torch.zeros(2, 3), torch.tensor([-2, 0])) -> IndexError: Target -2 is out
        //   of bounds.
        let e = index_err(nnf::nll_loss_with(
            &z,
            &tgt(&[-2, 0], &[2]),
            &nnf::NllLossOptions::new().reduction(Reduction::None),
        ));
        assert_eq!(e, ("nll_loss".into(), -2, 1, 3, vec![2, 3]));
        // F.cross_entropy(torch.zeros(2, 4, 3), torch.tensor([[0, 1, 2], [3, 4, 0]])) ->
        //   IndexError: Target 4 is out of bounds.
        let z3 = on(Tensor::zeros([2, 4, 3], DType::F32, &cpu()).unwrap());
        let e = index_err(nnf::cross_entropy_with(
            &z3,
            &tgt(&[0, 1, 2, 3, 4, 0], &[2, 3]),
            &nnf::CrossEntropyOptions::new()
                .reduction(Reduction::Sum)
                .label_smoothing(0.1),
        ));
        assert_eq!(e, ("cross_entropy".into(), 4, 1, 4, vec![2, 4, 3]));
        // Unbatched: F.nll_loss(torch.zeros(3), torch.tensor(3)) -> IndexError: Target 3 is out
        //   of bounds.
        let z1 = on(Tensor::zeros([3], DType::F32, &cpu()).unwrap());
        let e = index_err(nnf::nll_loss(&z1, &tgt(&[3], &[])));
        assert_eq!(e, ("nll_loss".into(), 3, 0, 3, vec![3]));
        // Ignored targets are not checked:
        // F.cross_entropy(torch.zeros(2, 3), torch.tensor([0, -100])) -> 1.0986123085021973
        let l = nnf::cross_entropy(&z, &tgt(&[0, -100], &[2])).unwrap();
        check("ignored", &vals(&l), &[1.0986123085021973], 1e-6);
        // F.nll_loss(torch.tensor([[-1., -2., -3.], [-0.5, -1., -2.]]), torch.tensor([5, 1]),
        //            ignore_index=5) -> 1.0
        let lp = on(lit(&[-1., -2., -3., -0.5, -1., -2.], &[2, 3]));
        let l = nnf::nll_loss_with(
            &lp,
            &tgt(&[5, 1], &[2]),
            &nnf::NllLossOptions::new().ignore_index(5),
        )
        .unwrap();
        check("ignore_index out of range", &vals(&l), &[1.0], 0.0);
    }
);

test_device!(
    attention_without_head_dims_averages_the_values_on_every_device,
    |dev| {
        // q = torch.ones(1, 2, 0); k = torch.zeros(1, 3, 0); v = torch.arange(12.).reshape(1, 3, 4)
        // F.scaled_dot_product_attention(q, k, v) -> [[[4., 5., 6., 7.], [4., 5., 6., 7.]]]
        // F.scaled_dot_product_attention(q, k, v, is_causal=True) ->
        //   [[[0., 1., 2., 3.], [2., 3., 4., 5.]]]
        let q = Tensor::ones([1, 2, 0], DType::F32, &dev).unwrap();
        let k = Tensor::zeros([1, 3, 0], DType::F32, &dev).unwrap();
        let v = Tensor::arange(0, 12, 1, DType::F32, &dev)
            .unwrap()
            .reshape([1, 3, 4])
            .unwrap();
        let y = nnf::scaled_dot_product_attention(&q, &k, &v).unwrap();
        assert_eq!(y.device(), &dev);
        check(
            &format!("sdpa on {dev}"),
            &vals(&y.to_device(&cpu()).unwrap()),
            &[4., 5., 6., 7., 4., 5., 6., 7.],
            1e-6,
        );
        let y = nnf::scaled_dot_product_attention_with(
            &q,
            &k,
            &v,
            &nnf::AttentionOptions::new().is_causal(true),
        )
        .unwrap();
        check(
            &format!("causal sdpa on {dev}"),
            &vals(&y.to_device(&cpu()).unwrap()),
            &[0., 1., 2., 3., 2., 3., 4., 5.],
            1e-6,
        );
    }
);

test_device!(
    softmax_of_rows_with_infinities_and_nan_matches_pytorch_on_every_device,
    |dev| {
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        // s = torch.tensor([[inf, 1, 2], [-inf, -inf, -inf], [inf, inf, 0], [nan, 1, 2],
        //                   [1, -inf, 2]])
        // torch.softmax(s, 1) -> [[nan] * 3] * 4 + [[0.2689414322376251, 0.0, 0.7310585975646973]]
        // torch.log_softmax(s, 1) -> [[nan] * 3] * 4 + [[-1.31326162815094, -inf,
        //                                                 -0.31326165795326233]]
        let s = lit(
            &[
                inf, 1., 2., NEG_INF, NEG_INF, NEG_INF, inf, inf, 0., nan, 1., 2., 1., NEG_INF, 2.,
            ],
            &[5, 3],
        );
        let mut sm = vec![nan; 12];
        sm.extend([0.2689414322376251, 0.0, 0.7310585975646973]);
        let mut lsm = vec![nan; 12];
        lsm.extend([-1.31326162815094, NEG_INF, -0.31326165795326233]);
        let x = s.to_device(&dev).unwrap();
        let y = x.softmax(1).unwrap().to_device(&cpu()).unwrap();
        check(&format!("softmax on {dev}"), &vals(&y), &sm, 1e-6);
        let y = x.log_softmax(-1).unwrap().to_device(&cpu()).unwrap();
        check(&format!("log_softmax on {dev}"), &vals(&y), &lsm, 1e-6);
    }
);
