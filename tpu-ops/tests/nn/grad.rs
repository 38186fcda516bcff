//! Backward rules of the neural-network ops: central finite differences on random shapes and
//! options (f64), gradients computed by PyTorch, the 16-bit and f32 dtypes against f64, and the
//! backward on the PJRT CPU plugin against the native CPU.

use crate::common::{cpu, devices, pjrt, randn, vals};
use proptest::prelude::*;
use tpu_ops::TensorOps;
use tpu_ops::autograd::{AutogradOps, grad_of};
use tpu_ops::ops::nn::functional::{self as nnf, DEFAULT_IGNORE_INDEX, Reduction};
use tpu_ops::ops::reduce::ReduceOps;
use tpu_ops::testing::{assert_close, gradcheck};
use tpu_tensor::{DType, Device, Generator, Result, Tensor};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 20,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// `sin(a i + b) * s` for the flat index `i`: inputs the PyTorch snippet builds the same way.
fn seq(shape: &[usize], a: f64, b: f64, s: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| (a * i as f64 + b).sin() * s).collect();
    Tensor::from_vec(v, shape, &cpu()).unwrap()
}

fn reductions() -> impl Strategy<Value = Reduction> {
    prop_oneof![
        Just(Reduction::None),
        Just(Reduction::Mean),
        Just(Reduction::Sum)
    ]
}

/// Runs [`gradcheck`] with this file's step and tolerance, as a proptest result.
fn check(
    what: &str,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
) -> std::result::Result<(), TestCaseError> {
    gradcheck(what, f, inputs, 1e-6, 1e-5).map_err(|e| TestCaseError::fail(e.to_string()))
}

/// Attention of `t[0]`, `t[1]` and `t[2]` with `opts`, masked by `t[3]` where there is one.
fn sdpa<'a>(t: &'a [Tensor], opts: nnf::AttentionOptions<'a>) -> Result<Tensor> {
    nnf::scaled_dot_product_attention_with(&t[0], &t[1], &t[2], &opts.attn_mask(t.get(3)))
}

/// Batch norm of `t[0]` in training mode, with weight `t[1]`, bias `t[2]` and the running
/// statistics `rm` and `rv`.
fn batch_norm_training(t: &[Tensor], rm: &Tensor, rv: &Tensor) -> Result<Tensor> {
    let opts = nnf::BatchNormOptions::new()
        .running_mean(rm)
        .running_var(rv)
        .weight(&t[1])
        .bias(&t[2])
        .training(true);
    Ok(nnf::batch_norm(&t[0], &opts)?.output)
}

/// Cross entropy of the logits `t[0]` against the targets `t[1]`.
fn cross_entropy(t: &[Tensor], opts: &nnf::CrossEntropyOptions) -> Result<Tensor> {
    nnf::cross_entropy_with(&t[0], &t[1], opts)
}

/// `t` rounded to `round`, then in `dtype` on `dev`: a case in f64 then holds exactly the
/// values of one in `round`.
fn rounded(t: Tensor, round: DType, dtype: DType, dev: &Device) -> Tensor {
    t.to_dtype(round)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

/// The gradients of `sum(f(inputs) * go)` (`go` defaults to ones) with respect to every float
/// input, in order.
fn grads_of(
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    go: Option<&Tensor>,
) -> Vec<Tensor> {
    let leaves: Vec<Tensor> = inputs
        .iter()
        .map(|t| {
            if t.dtype().is_float() {
                t.detach().requires_grad_(true).unwrap()
            } else {
                t.clone()
            }
        })
        .collect();
    let out = f(&leaves).unwrap();
    let go = match go {
        Some(g) => g.clone(),
        None => out.ones_like().unwrap(),
    };
    let targets: Vec<&Tensor> = leaves.iter().filter(|t| t.dtype().is_float()).collect();
    grad_of(&[&out], &targets, Some(&[&go]), false)
        .unwrap()
        .into_iter()
        .map(|g| g.expect("every float input gets a gradient"))
        .collect()
}

// ---- finite differences on random shapes and options -----------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn softmax_and_log_softmax(
        shape in prop::collection::vec(1usize..4, 0..=3),
        dim in 0usize..3,
        log in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dim = (dim % shape.len().max(1)) as i64;
        let x = randn(seed, &shape).mul(2.0).unwrap();
        check("softmax", |t| if log {
            nnf::log_softmax(&t[0], dim)
        } else {
            nnf::softmax(&t[0], dim)
        }, &[x])?;
    }

    #[test]
    fn layer_norm_and_rms_norm(
        lead in prop::collection::vec(1usize..3, 0..=2),
        norm in prop::collection::vec(2usize..4, 1..=2),
        weight in any::<bool>(),
        bias in any::<bool>(),
        rms in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let shape: Vec<usize> = lead.iter().chain(&norm).copied().collect();
        let mut inputs = vec![randn(seed, &shape).mul(2.0).unwrap()];
        if weight {
            inputs.push(randn(seed + 1, &norm));
        }
        if bias && !rms {
            inputs.push(randn(seed + 2, &norm));
        }
        check("norm", |t| {
            let w = weight.then(|| &t[1]);
            if rms {
                nnf::rms_norm_with(&t[0], &norm, &nnf::RmsNormOptions::new().weight(w).eps(1e-5))
            } else {
                let b = bias.then(|| &t[1 + weight as usize]);
                nnf::layer_norm_with(&t[0], &norm, &nnf::NormOptions::new().weight(w).bias(b))
            }
        }, &inputs)?;
    }

    #[test]
    fn group_norm(
        n in 1usize..3,
        groups in 1usize..3,
        per_group in 1usize..3,
        spatial in prop::collection::vec(1usize..3, 0..=2),
        affine in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let c = groups * per_group;
        let shape: Vec<usize> = [n, c].iter().chain(&spatial).copied().collect();
        let mut inputs = vec![randn(seed, &shape).mul(2.0).unwrap()];
        if affine {
            inputs.push(randn(seed + 1, &[c]));
            inputs.push(randn(seed + 2, &[c]));
        }
        check("group_norm", |t| {
            nnf::group_norm_with(&t[0], groups, &nnf::NormOptions::new().weight(t.get(1)).bias(t.get(2)))
        }, &inputs)?;
    }

    #[test]
    fn batch_norm(
        n in 2usize..4,
        c in 1usize..3,
        spatial in prop::collection::vec(1usize..3, 0..=1),
        training in any::<bool>(),
        running in any::<bool>(),
        weight in any::<bool>(),
        bias in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let running = running || !training;
        let shape: Vec<usize> = [n, c].iter().chain(&spatial).copied().collect();
        let mut inputs = vec![randn(seed, &shape).mul(2.0).unwrap()];
        if weight {
            inputs.push(randn(seed + 1, &[c]));
        }
        if bias {
            inputs.push(randn(seed + 2, &[c]));
        }
        // The running statistics get no gradient, so they are constants here rather than
        // inputs the check differentiates.
        let rm = randn(seed + 3, &[c]);
        let rv = randn(seed + 4, &[c]).abs().unwrap().add(0.5).unwrap();
        check("batch_norm", |t| {
            let w = weight.then(|| &t[1]);
            let b = bias.then(|| &t[1 + weight as usize]);
            let (m, v) = if running { (Some(&rm), Some(&rv)) } else { (None, None) };
            Ok(nnf::batch_norm(&t[0], &nnf::BatchNormOptions::new().running_mean(m).running_var(v).weight(w).bias(b).training(training))?.output)
        }, &inputs)?;
    }

    #[test]
    fn dropout(
        shape in prop::collection::vec(1usize..5, 1..=3),
        p in prop_oneof![Just(0.2), Just(0.5), Just(0.9)],
        seed in any::<u64>(),
    ) {
        let x = randn(seed, &shape);
        // A fixed seed draws the same mask on every evaluation.
        check("dropout", |t| nnf::dropout_seeded(&t[0], p, true, seed), &[x])?;
    }

    #[test]
    fn rotary_embedding(
        lead in prop::collection::vec(1usize..3, 0..=2),
        seq_len in 1usize..4,
        half in 1usize..4,
        table in 0usize..3,
        seed in any::<u64>(),
    ) {
        let d = 2 * half;
        let shape: Vec<usize> = lead.iter().copied().chain([seq_len, d]).collect();
        // Tables per position, shared by all positions, or as large as the input.
        let tshape: Vec<usize> = match table {
            0 => vec![seq_len, d],
            1 => vec![1, d],
            _ => shape.clone(),
        };
        let inputs = [randn(seed, &shape), randn(seed + 1, &tshape), randn(seed + 2, &tshape)];
        check("apply_rotary_emb", |t| nnf::apply_rotary_emb(&t[0], &t[1], &t[2]), &inputs)?;
    }

    #[test]
    fn scaled_dot_product_attention(
        b in 1usize..3,
        hk in 1usize..3,
        rep in 1usize..3,
        l in 1usize..4,
        s in 1usize..5,
        e in 1usize..4,
        ev in 1usize..4,
        mask in 0usize..4,
        scale in prop_oneof![Just(None), Just(Some(0.7))],
        seed in any::<u64>(),
    ) {
        let hq = hk * rep;
        let mut inputs = vec![
            randn(seed, &[b, hq, l, e]),
            randn(seed + 1, &[b, hk, s, e]),
            randn(seed + 2, &[b, hk, s, ev]),
        ];
        let causal = mask == 1;
        match mask {
            // A bool mask, which may leave a query row nothing to attend to.
            2 => inputs.push(
                Generator::new(seed + 3)
                    .randint(0, 2, [l, s], DType::Bool, &cpu())
                    .unwrap(),
            ),
            // An additive mask per batch, broadcast over heads: it gets a gradient too.
            3 => inputs.push(randn(seed + 3, &[b, 1, l, s])),
            _ => {}
        }
        check("sdpa", |t| {
            sdpa(t, nnf::AttentionOptions::new().is_causal(causal).scale(scale).enable_gqa(rep > 1))
        }, &inputs)?;
    }

    #[test]
    fn cross_entropy_and_nll_loss(
        n in 1usize..4,
        classes in 2usize..5,
        extra in prop::collection::vec(1usize..3, 0..=1),
        one_d in any::<bool>(),
        logits in any::<bool>(),
        weighted in any::<bool>(),
        ignore in prop_oneof![Just(DEFAULT_IGNORE_INDEX), Just(1i64)],
        smoothing in prop_oneof![Just(0.0), Just(0.1), Just(0.3)],
        reduction in reductions(),
        seed in any::<u64>(),
    ) {
        let (xshape, tshape): (Vec<usize>, Vec<usize>) = if one_d {
            (vec![classes], vec![])
        } else {
            (
                [n, classes].iter().chain(&extra).copied().collect(),
                std::iter::once(n).chain(extra.iter().copied()).collect(),
            )
        };
        let mut g = Generator::new(seed + 1);
        let mut t = g
            .randint(0, classes as i64, &tshape[..], DType::I64, &cpu())
            .unwrap()
            .to_vec::<i64>()
            .unwrap();
        // Every third target ignored (for -100; class 1 is ignored wherever it is drawn).
        for v in t.iter_mut().step_by(3).skip(1) {
            *v = ignore;
        }
        let t = Tensor::from_vec(t, &tshape[..], &cpu()).unwrap();
        let w = randn(seed + 2, &[classes]).abs().unwrap().add(0.2).unwrap();
        let x = randn(seed, &xshape).mul(2.0).unwrap();
        check("class loss", |i| {
            let w = weighted.then_some(&w);
            if logits {
                nnf::cross_entropy_with(&i[0], &i[1], &nnf::CrossEntropyOptions::new().weight(w).ignore_index(ignore).reduction(reduction).label_smoothing(smoothing))
            } else {
                nnf::nll_loss_with(&i[0], &i[1], &nnf::NllLossOptions::new().weight(w).ignore_index(ignore).reduction(reduction))
            }
        }, &[x, t])?;
    }

    #[test]
    fn mse_loss(
        shape in prop::collection::vec(1usize..4, 0..=3),
        reduction in reductions(),
        seed in any::<u64>(),
    ) {
        let inputs = [randn(seed, &shape), randn(seed + 1, &shape)];
        check("mse_loss", |t| nnf::mse_loss(&t[0], &t[1], reduction), &inputs)?;
    }

    #[test]
    fn binary_cross_entropy_with_logits(
        shape in prop::collection::vec(1usize..4, 1..=3),
        weight in 0usize..3,
        pos_weight in any::<bool>(),
        reduction in reductions(),
        seed in any::<u64>(),
    ) {
        let last = *shape.last().unwrap_or(&1);
        let mut inputs = vec![
            randn(seed, &shape).mul(3.0).unwrap(),
            Generator::new(seed + 1).rand(&shape[..], DType::F64, &cpu()).unwrap(),
        ];
        // The weight as large as the input or one per last-dim entry; pos_weight per class.
        match weight {
            1 => inputs.push(randn(seed + 2, &shape)),
            2 => inputs.push(randn(seed + 2, &[last])),
            _ => {}
        }
        if pos_weight {
            inputs.push(randn(seed + 3, &[last]).abs().unwrap().add(0.5).unwrap());
        }
        let has_w = weight > 0;
        check("bce_with_logits", |t| {
            let w = has_w.then(|| &t[2]);
            let pw = pos_weight.then(|| &t[2 + has_w as usize]);
            nnf::binary_cross_entropy_with_logits_with(&t[0], &t[1], &nnf::BceWithLogitsOptions::new().weight(w).pos_weight(pw).reduction(reduction))
        }, &inputs)?;
    }
}

/// The updated running statistics that batch norm returns in training are differentiable too:
/// `m * batch_stat + (1 - m) * running_stat` (PyTorch updates buffers instead, so nothing
/// reaches them there).
#[test]
fn batch_norm_running_statistics_outputs() {
    // [N, C, S] with S == C, so that the `[C]` statistics broadcast against the output.
    let x = randn(41, &[3, 2, 2]).mul(2.0).unwrap();
    let rm = randn(42, &[2]);
    let rv = randn(43, &[2]).abs().unwrap().add(0.5).unwrap();
    let inputs = [x, rm, rv];
    for which in [1usize, 2] {
        gradcheck(
            "batch_norm running stats",
            |t| {
                let o = nnf::batch_norm(
                    &t[0],
                    &nnf::BatchNormOptions::new()
                        .running_mean(&t[1])
                        .running_var(&t[2])
                        .training(true)
                        .momentum(0.3),
                )?;
                let stat = if which == 1 {
                    o.running_mean
                } else {
                    o.running_var
                };
                // The normalised output too, so both paths meet in one backward (the sum is
                // an arbitrary but differentiable combination).
                o.output.add(&stat.expect("running stats"))
            },
            &inputs,
            1e-6,
            1e-5,
        )
        .unwrap();
    }
}

/// Targets, masks and running statistics get no gradient; neither do class weights.
#[test]
fn non_differentiable_inputs_get_no_gradient() {
    let x = randn(1, &[3, 4]).requires_grad_(true).unwrap();
    let w = randn(2, &[4]).abs().unwrap().requires_grad_(true).unwrap();
    let t = Tensor::new([0i64, 3, 1], &cpu()).unwrap();
    let loss =
        nnf::cross_entropy_with(&x, &t, &nnf::CrossEntropyOptions::new().weight(&w)).unwrap();
    let g = grad_of(&[&loss], &[&x, &w], None, false).unwrap();
    assert!(g[0].is_some() && g[1].is_none());
    let x = randn(3, &[4, 2, 3]).requires_grad_(true).unwrap();
    let rm = randn(4, &[2]).requires_grad_(true).unwrap();
    let rv = randn(5, &[2]).abs().unwrap().requires_grad_(true).unwrap();
    for training in [true, false] {
        let y = nnf::batch_norm(
            &x,
            &nnf::BatchNormOptions::new()
                .running_mean(&rm)
                .running_var(&rv)
                .training(training),
        )
        .unwrap()
        .output;
        let go = randn(6, y.shape());
        let g = grad_of(&[&y], &[&x, &rm, &rv], Some(&[&go]), false).unwrap();
        assert!(
            g[0].is_some() && g[1].is_none() && g[2].is_none(),
            "training {training}"
        );
    }
}

// ---- values from PyTorch --------------------------------------------------------------------
//
// Generated with PyTorch 2.15 (CPU, float64) by:
//
// import torch, math
// import torch.nn.functional as F
// torch.set_default_dtype(torch.float64)
//
// def seq(n, a, b, s=1.0):
//     # the same formula as `seq` in the Rust test
//     return torch.tensor([math.sin(a * i + b) * s for i in range(n)])
//
// def T(shape, a, b, s=1.0):
//     n = math.prod(shape)
//     return seq(n, a, b, s).reshape(shape).requires_grad_(True)
//
// def show(name, t):
//     v = t.detach().flatten().tolist()
//     print(f"const {name}: [f64; {len(v)}] = [" + ", ".join(repr(x) for x in v) + "];")
//
// # softmax / log_softmax
// x = T([3, 5], 1.3, 0.5, 2.0); go = seq(15, 0.9, 0.2).reshape(3, 5)
// F.softmax(x, 1).backward(go); show("SOFTMAX_DX", x.grad)
// x = T([2, 3, 4], 0.7, 0.1, 3.0); go = seq(24, 1.1, 0.3).reshape(2, 3, 4)
// F.log_softmax(x, 1).backward(go); show("LOG_SOFTMAX_DX", x.grad)
// # layer_norm
// x = T([2, 3, 4], 0.8, 0.3, 2.0); w = T([4], 1.7, 0.4); b = T([4], 0.6, 1.0)
// go = seq(24, 0.5, 0.7).reshape(2, 3, 4)
// F.layer_norm(x, [4], w, b, 1e-5).backward(go)
// show("LAYER_NORM_DX", x.grad); show("LAYER_NORM_DW", w.grad); show("LAYER_NORM_DB", b.grad)
// # rms_norm
// x = T([2, 3, 4], 0.9, 0.2, 2.0); w = T([4], 1.2, 0.3)
// go = seq(24, 0.4, 0.9).reshape(2, 3, 4)
// F.rms_norm(x, [4], w, 1e-6).backward(go)
// show("RMS_NORM_DX", x.grad); show("RMS_NORM_DW", w.grad)
// # cross_entropy with weights, ignore_index and label smoothing, mean
// x = T([5, 4], 1.1, 0.2, 2.0); wt = torch.tensor([0.5, 1.5, 1.0, 2.0])
// t = torch.tensor([1, -100, 3, 0, 2])
// F.cross_entropy(x, t, weight=wt, ignore_index=-100, reduction='mean', label_smoothing=0.1).backward()
// show("CE_DX", x.grad)
// x = T([2, 4, 3], 0.6, 0.4, 2.0); t = torch.tensor([[0, 1, 3], [1, 2, 1]])
// F.cross_entropy(x, t, weight=wt, ignore_index=1, reduction='mean', label_smoothing=0.2).backward()
// show("CE3_DX", x.grad)
// # sdpa causal
// q = T([1, 2, 4, 3], 0.7, 0.1); k = T([1, 2, 5, 3], 1.3, 0.2); v = T([1, 2, 5, 2], 0.9, 0.3)
// go = seq(16, 0.5, 0.5).reshape(1, 2, 4, 2)
// F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)
// show("SDPA_CAUSAL_DQ", q.grad); show("SDPA_CAUSAL_DK", k.grad); show("SDPA_CAUSAL_DV", v.grad)
// # sdpa GQA with an additive mask
// q = T([1, 4, 3, 2], 0.8, 0.6, 1.5); k = T([1, 2, 3, 2], 1.2, 0.1, 1.5); v = T([1, 2, 3, 2], 0.4, 0.8)
// m = T([3, 3], 2.1, 0.3)
// go = seq(24, 0.3, 0.1).reshape(1, 4, 3, 2)
// F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True).backward(go)
// show("SDPA_GQA_DQ", q.grad); show("SDPA_GQA_DK", k.grad); show("SDPA_GQA_DV", v.grad); show("SDPA_GQA_DMASK", m.grad)
// # batch_norm training
// x = T([3, 2, 4], 0.9, 0.5, 2.0); w = T([2], 1.4, 0.2); b = T([2], 0.7, 0.9)
// rm = torch.zeros(2); rv = torch.ones(2)
// go = seq(24, 0.6, 0.2).reshape(3, 2, 4)
// F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5).backward(go)
// show("BATCH_NORM_DX", x.grad); show("BATCH_NORM_DW", w.grad); show("BATCH_NORM_DB", b.grad)

const SOFTMAX_DX: [f64; 15] = [
    -0.11178973174972269,
    0.13351450021746977,
    0.022447438149019575,
    -0.005848219222489151,
    -0.03832398739427757,
    -0.12878852512372707,
    -0.009004684726916618,
    0.052626366035798317,
    0.018575952781635974,
    0.06659089103320931,
    0.19110129168201018,
    -0.18188430941284103,
    -0.033135754599950974,
    -0.005077937532336181,
    0.02899670986311795,
];

const LOG_SOFTMAX_DX: [f64; 24] = [
    0.4402981291248278,
    1.1351732663185117,
    0.4447574438922761,
    -0.5799764096584612,
    -0.779962592137011,
    -0.4599878760792135,
    0.5779460926507959,
    0.9886736725427869,
    0.33966446301218317,
    -0.6751853902392982,
    -1.0227035365430721,
    -0.4086972628843256,
    0.9144328694852539,
    0.8859806941125729,
    -0.017765923859032022,
    -0.889373248256244,
    -0.8125808313548396,
    0.14897458349307924,
    0.7977243403594895,
    0.44590738400744157,
    -0.10185203813041432,
    -1.034955277605652,
    -0.7799584165004574,
    0.4434658642488024,
];

const LAYER_NORM_DX: [f64; 24] = [
    0.5936381146653873,
    1.4035373075399689,
    -1.103675327761442,
    -0.8935000944439142,
    -0.39870463917333643,
    -0.35020206267321063,
    0.327383939069388,
    0.42152276277715917,
    -0.4434009897212786,
    -0.9110927958124233,
    1.0322806186615796,
    0.32221316687212215,
    0.739072436216848,
    0.8822746897441578,
    -1.233806388928077,
    -0.3875407370329289,
    -0.11551729915883258,
    0.08297558423848761,
    -0.04476783964516817,
    0.07730955456551314,
    -0.47910386223255197,
    -0.6986436663514232,
    1.173485757286314,
    0.00426177129766081,
];

const LAYER_NORM_DW: [f64; 4] = [
    0.27259875055678573,
    0.4389398649386653,
    0.5443473854306815,
    0.334546913041456,
];

const LAYER_NORM_DB: [f64; 4] = [
    0.18285844433601361,
    0.02759033561757651,
    -0.1344328495066378,
    -0.2635421845620924,
];

const RMS_NORM_DX: [f64; 24] = [
    0.0755047817463865,
    0.2797362159374563,
    -0.13944336430230087,
    -0.5747454260761737,
    0.07479451074810022,
    0.08487564890874222,
    -0.10811367507133662,
    0.2899967559953648,
    0.30157133187347396,
    -0.20726064639649705,
    -0.1758452343149302,
    0.07174592799168261,
    -0.12724218448097796,
    -0.1326504157942957,
    0.06558121081829174,
    -0.24771634428046357,
    -0.021468530002673458,
    0.6135129195865759,
    0.41113391690358614,
    -0.15492183999108694,
    0.14816825093890157,
    0.06843583665740094,
    -0.14863588903846264,
    0.23485432539751333,
];

const RMS_NORM_DW: [f64; 4] = [
    -0.005504453547203858,
    0.1923935617243903,
    0.11303498021636656,
    -0.2710194806205394,
];

const CE_DX: [f64; 20] = [
    0.0320215407119928,
    -0.11810885592997308,
    0.08458350411537743,
    0.0015038111026028957,
    0.0,
    0.0,
    0.0,
    0.0,
    0.26364661165575715,
    0.025937200256060385,
    0.011468589497214224,
    -0.3010524014090318,
    -0.051433973203610234,
    0.053095432090984766,
    0.00658761326668812,
    -0.008249072154062639,
    0.0004588816582670099,
    0.01104242061505262,
    -0.08092557801668146,
    0.06942427574336188,
];

const CE3_DX: [f64; 24] = [
    -0.06976003208692326,
    0.0,
    0.321489935700638,
    0.09803424889216598,
    0.0,
    0.0052727107551562525,
    -0.009066184086554357,
    0.0,
    -0.006680116866550056,
    -0.01920803271868836,
    0.0,
    -0.3200825295892442,
    0.0,
    0.14758674410445485,
    0.0,
    0.0,
    -0.013486487103431996,
    0.0,
    0.0,
    -0.23696766230376473,
    0.0,
    0.0,
    0.10286740530274185,
    0.0,
];

const SDPA_CAUSAL_DQ: [f64; 24] = [
    0.0,
    0.0,
    0.0,
    0.01965291469712365,
    0.03421100365308106,
    -0.0013501078905823237,
    -0.18677496082156714,
    -0.08753903356923805,
    0.13994178294416795,
    0.0486080995928384,
    -0.06405878435933783,
    -0.08287939915131418,
    0.0,
    0.0,
    0.0,
    -0.13697865494273628,
    -0.0835009007387261,
    0.09230586866932206,
    0.10613562254508326,
    -0.05300390649611248,
    -0.1344925883455577,
    0.10941625781615821,
    -0.1474458071843811,
    -0.18829941923101573,
];

const SDPA_CAUSAL_DK: [f64; 30] = [
    -0.0012209600384003256,
    -0.08125845581586622,
    -0.1230788301247338,
    -0.1104851378686505,
    -0.1134594117500945,
    -0.06307195143325676,
    0.10672266944563093,
    0.16354849951478248,
    0.14345491474633368,
    0.004983428461419814,
    0.031169368051178203,
    0.04269586681165695,
    0.0,
    0.0,
    0.0,
    -0.06521871756010743,
    0.01975627868122804,
    0.09543958835841244,
    -0.15985600817696385,
    -0.14226505157395064,
    -0.05776461826295801,
    0.1673033996773661,
    0.10737668416954071,
    -0.0030509637101918496,
    0.05777132605970523,
    0.015132088723181886,
    -0.034624006385262585,
    0.0,
    0.0,
    0.0,
];

const SDPA_CAUSAL_DV: [f64; 20] = [
    1.1197259806980058,
    1.2193296628697177,
    0.6464101458101648,
    0.2648761422392855,
    0.09289686476840704,
    -0.059105792888310256,
    -0.13442354965398345,
    -0.29001408783517574,
    0.0,
    0.0,
    -0.731212085645824,
    -0.41417026596864065,
    -0.3470236510736148,
    0.1773323889292462,
    0.36100510994159996,
    0.4473086597103025,
    0.1872801484049042,
    0.19753428980919852,
    0.0,
    0.0,
];

const SDPA_GQA_DQ: [f64; 24] = [
    0.005668037689949915,
    -0.0013369546216993398,
    0.0355512338809879,
    -0.055002153816252924,
    0.3128576671105942,
    -0.06362284634929156,
    0.23509939327021415,
    0.006272548194375478,
    0.016205752128678547,
    -0.03496096248334192,
    -0.002488592886881314,
    -0.00602245631894895,
    -0.010034894093637923,
    -0.01330716415793871,
    -0.18988944561655235,
    -0.196327962943166,
    -0.1003946683382124,
    -0.047536415690772146,
    -0.21763862095788752,
    -0.2956369117805853,
    -0.0009770550487775995,
    0.00023252756913079938,
    0.13510077820154273,
    0.14279202860417967,
];

const SDPA_GQA_DK: [f64; 12] = [
    -0.08066709048508522,
    -0.034852317412486046,
    -0.1549936025041445,
    -0.168240071793186,
    0.2356606929892297,
    0.20309238920567202,
    -0.13403162188825923,
    -0.04149083792916936,
    0.09083419604597823,
    -0.007779957497829077,
    0.04319742584228115,
    0.04927079542699862,
];

const SDPA_GQA_DV: [f64; 12] = [
    1.1537998393863047,
    1.1130526887161774,
    1.4456862305681173,
    1.3542450533691575,
    0.6944761135719515,
    0.6511086400213812,
    -1.3995858967860442,
    -1.1186478236040283,
    -1.3471220112490458,
    -1.0952737722972952,
    -0.16459969147308115,
    -0.11109293460469907,
];

const SDPA_GQA_DMASK: [f64; 9] = [
    -0.14762168168781112,
    0.2770410651268974,
    -0.12941938343908627,
    -0.20553861732781148,
    0.16679000066493532,
    0.0387486166628765,
    0.031260786483058065,
    0.13429688830256584,
    -0.16555767478562392,
];

const BATCH_NORM_DX: [f64; 24] = [
    0.03427983156887259,
    0.09202326241074446,
    0.13793038013967457,
    0.15283473805743195,
    0.19925462552137524,
    -0.196865618411157,
    -0.6071858733921937,
    -0.8790170323321086,
    -0.14707409502697003,
    -0.09222471391211984,
    0.011874080394300235,
    0.11828925276412741,
    0.4727752169838416,
    0.51284358000108,
    0.3003926630122715,
    -0.07650439958538519,
    -0.05410137035868421,
    -0.09377643835201917,
    -0.0944471019146521,
    -0.0656078257707059,
    -0.43091056363302654,
    -0.052128253249645096,
    0.28558387351746606,
    0.47176178156748155,
];

const BATCH_NORM_DW: [f64; 2] = [1.8785826836604798, 0.4803845015686708];

const BATCH_NORM_DB: [f64; 2] = [-1.3855187855626143, 3.3432844064830443];

/// Compares the gradients of `f` at `inputs` (with output gradient `go`) with PyTorch's.
fn against_torch(
    what: &str,
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    go: Option<&Tensor>,
    want: &[&[f64]],
) {
    let got = grads_of(f, inputs, go);
    assert_eq!(got.len(), want.len(), "{what}: number of gradients");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let g = vals(g);
        assert_eq!(g.len(), w.len(), "{what}: gradient {k} length");
        for (i, (a, b)) in g.iter().zip(w.iter()).enumerate() {
            assert!(
                (a - b).abs() <= 1e-10 * (1.0 + b.abs()),
                "{what}: gradient {k} element {i}: {a} vs PyTorch's {b}"
            );
        }
    }
}

#[test]
fn softmax_matches_pytorch() {
    let x = seq(&[3, 5], 1.3, 0.5, 2.0);
    let go = seq(&[3, 5], 0.9, 0.2, 1.0);
    against_torch(
        "softmax",
        &|t| nnf::softmax(&t[0], 1),
        &[x],
        Some(&go),
        &[&SOFTMAX_DX],
    );
    let x = seq(&[2, 3, 4], 0.7, 0.1, 3.0);
    let go = seq(&[2, 3, 4], 1.1, 0.3, 1.0);
    against_torch(
        "log_softmax",
        &|t| nnf::log_softmax(&t[0], 1),
        &[x],
        Some(&go),
        &[&LOG_SOFTMAX_DX],
    );
}

#[test]
fn norms_match_pytorch() {
    let inputs = [
        seq(&[2, 3, 4], 0.8, 0.3, 2.0),
        seq(&[4], 1.7, 0.4, 1.0),
        seq(&[4], 0.6, 1.0, 1.0),
    ];
    let go = seq(&[2, 3, 4], 0.5, 0.7, 1.0);
    against_torch(
        "layer_norm",
        &|t| {
            nnf::layer_norm_with(
                &t[0],
                &[4],
                &nnf::NormOptions::new().weight(&t[1]).bias(&t[2]),
            )
        },
        &inputs,
        Some(&go),
        &[&LAYER_NORM_DX, &LAYER_NORM_DW, &LAYER_NORM_DB],
    );
    let inputs = [seq(&[2, 3, 4], 0.9, 0.2, 2.0), seq(&[4], 1.2, 0.3, 1.0)];
    let go = seq(&[2, 3, 4], 0.4, 0.9, 1.0);
    against_torch(
        "rms_norm",
        &|t| {
            nnf::rms_norm_with(
                &t[0],
                &[4],
                &nnf::RmsNormOptions::new().weight(&t[1]).eps(1e-6),
            )
        },
        &inputs,
        Some(&go),
        &[&RMS_NORM_DX, &RMS_NORM_DW],
    );
    let inputs = [
        seq(&[3, 2, 4], 0.9, 0.5, 2.0),
        seq(&[2], 1.4, 0.2, 1.0),
        seq(&[2], 0.7, 0.9, 1.0),
    ];
    let rm = Tensor::zeros([2], DType::F64, &cpu()).unwrap();
    let rv = Tensor::ones([2], DType::F64, &cpu()).unwrap();
    let go = seq(&[3, 2, 4], 0.6, 0.2, 1.0);
    against_torch(
        "batch_norm",
        &|t| batch_norm_training(t, &rm, &rv),
        &inputs,
        Some(&go),
        &[&BATCH_NORM_DX, &BATCH_NORM_DW, &BATCH_NORM_DB],
    );
}

#[test]
fn cross_entropy_matches_pytorch() {
    let w = Tensor::new([0.5f64, 1.5, 1.0, 2.0], &cpu()).unwrap();
    let t = Tensor::new([1i64, DEFAULT_IGNORE_INDEX, 3, 0, 2], &cpu()).unwrap();
    let t3 = Tensor::from_vec(vec![0i64, 1, 3, 1, 2, 1], [2, 3], &cpu()).unwrap();
    let opts = nnf::CrossEntropyOptions::new().weight(&w);
    // What, the options, the logits and targets, PyTorch's gradient.
    let cases: [(&str, _, [Tensor; 2], &[f64]); 2] = [
        (
            "cross_entropy",
            opts.label_smoothing(0.1),
            [seq(&[5, 4], 1.1, 0.2, 2.0), t],
            &CE_DX,
        ),
        (
            "cross_entropy [N, C, d]",
            opts.ignore_index(1).label_smoothing(0.2),
            [seq(&[2, 4, 3], 0.6, 0.4, 2.0), t3],
            &CE3_DX,
        ),
    ];
    for (what, opts, inputs, want) in &cases {
        against_torch(what, &|i| cross_entropy(i, opts), inputs, None, &[want]);
    }
}

#[test]
fn attention_matches_pytorch() {
    // What, the options, the inputs (a fourth is the mask), the output gradient, PyTorch's
    // gradients.
    type Case<'a> = (
        &'a str,
        nnf::AttentionOptions<'a>,
        Vec<Tensor>,
        Tensor,
        Vec<&'a [f64]>,
    );
    let cases: [Case; 2] = [
        (
            "sdpa causal",
            nnf::AttentionOptions::new().is_causal(true),
            vec![
                seq(&[1, 2, 4, 3], 0.7, 0.1, 1.0),
                seq(&[1, 2, 5, 3], 1.3, 0.2, 1.0),
                seq(&[1, 2, 5, 2], 0.9, 0.3, 1.0),
            ],
            seq(&[1, 2, 4, 2], 0.5, 0.5, 1.0),
            vec![&SDPA_CAUSAL_DQ, &SDPA_CAUSAL_DK, &SDPA_CAUSAL_DV],
        ),
        (
            "sdpa gqa with an additive mask",
            nnf::AttentionOptions::new().enable_gqa(true),
            vec![
                seq(&[1, 4, 3, 2], 0.8, 0.6, 1.5),
                seq(&[1, 2, 3, 2], 1.2, 0.1, 1.5),
                seq(&[1, 2, 3, 2], 0.4, 0.8, 1.0),
                seq(&[3, 3], 2.1, 0.3, 1.0),
            ],
            seq(&[1, 4, 3, 2], 0.3, 0.1, 1.0),
            vec![&SDPA_GQA_DQ, &SDPA_GQA_DK, &SDPA_GQA_DV, &SDPA_GQA_DMASK],
        ),
    ];
    for (what, opts, inputs, go, want) in &cases {
        against_torch(what, &|t| sdpa(t, *opts), inputs, Some(go), want);
    }
}

/// Values within f32 rounding of `want`, NaN for NaN.
fn near(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 1e-6 * (1.0 + w.abs());
        assert!(ok, "{what}: element {i} is {g}, PyTorch gives {w}");
    }
}

/// Attention with a head dim of 0: every score is an empty sum, exactly 0, whatever the scale
/// (the default 1 / sqrt(0) is infinite), so each query averages the values it attends to. On
/// both devices, forward and backward, with a causal mask, explicit scales, bool and additive
/// masks and grouped heads:
///
/// ```python
/// F = torch.nn.functional
/// def run(qs, ks, v, **kw):
///     q = torch.zeros(qs, requires_grad=True); k = torch.zeros(ks, requires_grad=True)
///     v = v.clone().requires_grad_()
///     o = F.scaled_dot_product_attention(q, k, v, **kw); o.sum().backward()
///     return o, v.grad, q.grad.shape, k.grad.shape
/// v = torch.tensor([[1.], [2.]])
/// run((3, 0), (2, 0), v)                         # [1.5, 1.5, 1.5], dv [1.5, 1.5]
/// run((3, 0), (2, 0), v, is_causal=True)         # [1.0, 1.5, 1.5], dv [2.0, 1.0]
/// for s in [2.0, -1.0, 0.0, float('inf')]:
///     run((3, 0), (2, 0), v, scale=s)            # [1.5, 1.5, 1.5], dv [1.5, 1.5]
/// run((3, 0), (2, 0), v, attn_mask=torch.tensor([[True, False], [False, True], [True, True]]))
///                                                # [1.0, 2.0, 1.5], dv [1.5, 1.5]
/// m = torch.tensor([[0., -inf], [1., 0.], [0.5, 0.5]], requires_grad=True)
/// run((3, 0), (2, 0), v, attn_mask=m)            # [1.0, 1.2689414024353027, 1.5],
///     # dv [2.2310585975646973, 0.7689414024353027],
///     # m.grad [0, 0, -0.1966119259595871, 0.1966119408607483, -0.25, 0.25]
/// run((1, 4, 3, 0), (1, 2, 2, 0), torch.arange(4.).reshape(1, 2, 2, 1), enable_gqa=True)
///     # [0.5] * 6 + [2.5] * 6, dv [3, 3, 3, 3]
/// ```
#[test]
fn attention_over_an_empty_head_dim_matches_pytorch() {
    type Sdpa = dyn Fn(&Tensor, &Tensor, &Tensor, Option<&Tensor>) -> Result<Tensor>;
    let plain: &Sdpa = &|q, k, v, m| {
        nnf::scaled_dot_product_attention_with(q, k, v, &nnf::AttentionOptions::new().attn_mask(m))
    };
    let causal: &Sdpa = &|q, k, v, m| {
        nnf::scaled_dot_product_attention_with(
            q,
            k,
            v,
            &nnf::AttentionOptions::new().attn_mask(m).is_causal(true),
        )
    };
    let scaled = |s: f64| {
        move |q: &Tensor, k: &Tensor, v: &Tensor, m: Option<&Tensor>| {
            nnf::scaled_dot_product_attention_with(
                q,
                k,
                v,
                &nnf::AttentionOptions::new().attn_mask(m).scale(s),
            )
        }
    };
    let gqa: &Sdpa = &|q, k, v, m| {
        nnf::scaled_dot_product_attention_with(
            q,
            k,
            v,
            &nnf::AttentionOptions::new().attn_mask(m).enable_gqa(true),
        )
    };
    let inf = f64::INFINITY;
    let keep =
        Tensor::from_vec(vec![true, false, false, true, true, true], [3, 2], &cpu()).unwrap();
    let add = Tensor::from_vec(
        vec![0.0f32, -inf as f32, 1.0, 0.0, 0.5, 0.5],
        [3, 2],
        &cpu(),
    )
    .unwrap();
    let v2 = Tensor::from_vec(vec![1.0f32, 2.0], [2, 1], &cpu()).unwrap();
    let v4 = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0], [1, 2, 2, 1], &cpu()).unwrap();
    let s1: Vec<Box<Sdpa>> = [2.0, -1.0, 0.0, inf]
        .into_iter()
        .map(|s| Box::new(scaled(s)) as Box<Sdpa>)
        .collect();
    // What, the call, the query and key shapes, the values, the mask, PyTorch's output and
    // value gradient.
    type Case<'a> = (
        &'a str,
        &'a Sdpa,
        [&'a [usize]; 2],
        &'a Tensor,
        Option<&'a Tensor>,
        Vec<f64>,
        Vec<f64>,
    );
    /// Most cases: three queries, two keys and their values `v2`.
    fn three_by_two<'a>(
        what: &'a str,
        f: &'a Sdpa,
        v2: &'a Tensor,
        mask: Option<&'a Tensor>,
        want: Vec<f64>,
        want_dv: Vec<f64>,
    ) -> Case<'a> {
        (what, f, [&[3, 0], &[2, 0]], v2, mask, want, want_dv)
    }
    let mut cases: Vec<Case> = vec![
        three_by_two(
            "default scale",
            plain,
            &v2,
            None,
            vec![1.5; 3],
            vec![1.5; 2],
        ),
        three_by_two(
            "causal",
            causal,
            &v2,
            None,
            vec![1.0, 1.5, 1.5],
            vec![2.0, 1.0],
        ),
        three_by_two(
            "bool mask",
            plain,
            &v2,
            Some(&keep),
            vec![1.0, 2.0, 1.5],
            vec![1.5; 2],
        ),
        three_by_two(
            "additive mask",
            plain,
            &v2,
            Some(&add),
            vec![1.0, 1.2689414024353027, 1.5],
            vec![2.2310585975646973, 0.7689414024353027],
        ),
        (
            "grouped heads",
            gqa,
            [&[1, 4, 3, 0], &[1, 2, 2, 0]],
            &v4,
            None,
            [vec![0.5; 6], vec![2.5; 6]].concat(),
            vec![3.0; 4],
        ),
    ];
    for f in &s1 {
        cases.push(three_by_two(
            "explicit scale",
            &**f,
            &v2,
            None,
            vec![1.5; 3],
            vec![1.5; 2],
        ));
    }
    for dev in devices() {
        for (what, f, [qs, ks], v, mask, want, want_dv) in &cases {
            let what = format!("{what} on {dev:?}");
            let q = Tensor::zeros(*qs, DType::F32, &dev)
                .unwrap()
                .requires_grad_(true)
                .unwrap();
            let k = Tensor::zeros(*ks, DType::F32, &dev)
                .unwrap()
                .requires_grad_(true)
                .unwrap();
            // Fresh leaves for each case: a gradient accumulates into its leaf.
            let v = v
                .to_device(&dev)
                .unwrap()
                .detach()
                .requires_grad_(true)
                .unwrap();
            let m = mask.map(|m| {
                let m = m.to_device(&dev).unwrap().detach();
                if m.dtype().is_float() {
                    m.requires_grad_(true).unwrap()
                } else {
                    m
                }
            });
            let o = f(&q, &k, &v, m.as_ref()).unwrap();
            near(&what, &vals(&o), want);
            o.sum_all().unwrap().backward().unwrap();
            near(&format!("{what}: dv"), &vals(&v.grad().unwrap()), want_dv);
            assert_eq!(q.grad().unwrap().shape(), *qs, "{what}: dq");
            assert_eq!(k.grad().unwrap().shape(), *ks, "{what}: dk");
            if let Some(m) = m.filter(|m| m.dtype().is_float()) {
                let want_dm = [
                    0.0,
                    0.0,
                    -0.1966119259595871,
                    0.1966119408607483,
                    -0.25,
                    0.25,
                ];
                near(
                    &format!("{what}: dmask"),
                    &vals(&m.grad().unwrap()),
                    &want_dm,
                );
            }
        }
    }
}

/// NLL's gradient reaches only the targets' log-probabilities, so a NaN or infinite output
/// gradient leaves the other classes (and ignored targets) at 0; cross entropy's softmax
/// spreads it over the row, as in PyTorch. On both devices:
///
/// ```python
/// F = torch.nn.functional
/// x = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], requires_grad=True)
/// F.nll_loss(x, torch.tensor([0, 2]), reduction='none').backward(torch.tensor([nan, 1.]))
/// x.grad  # [[nan, 0, 0], [0, 0, -1]]
/// F.nll_loss(x, torch.tensor([0, 2]), reduction='sum').backward(torch.tensor(inf))
/// x.grad  # [[-inf, 0, 0], [0, 0, -inf]]
/// F.nll_loss(x, torch.tensor([0, -100]), reduction='none').backward(torch.tensor([1., nan]))
/// x.grad  # [[-1, 0, 0], [0, 0, 0]]
/// F.cross_entropy(x, torch.tensor([0, 2]), reduction='none').backward(torch.tensor([nan, 1.]))
/// x.grad  # [[nan, nan, nan], [0.3006, 0.3322, -0.6328]]
/// ```
#[test]
fn nll_gradients_reach_only_the_targets_like_pytorch() {
    let (nan, inf) = (f64::NAN, f64::INFINITY);
    let x = [0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6];
    type Loss = fn(&Tensor, &Tensor) -> Result<Tensor>;
    let (nll_none, nll_sum, ce_none): (Loss, Loss, Loss) = (
        |x, t| nnf::nll_loss_with(x, t, &nnf::NllLossOptions::new().reduction(Reduction::None)),
        |x, t| nnf::nll_loss_with(x, t, &nnf::NllLossOptions::new().reduction(Reduction::Sum)),
        |x, t| {
            nnf::cross_entropy_with(
                x,
                t,
                &nnf::CrossEntropyOptions::new().reduction(Reduction::None),
            )
        },
    );
    // What, the loss, the targets, the output gradient, PyTorch's input gradient.
    type Case = (&'static str, Loss, [i64; 2], Vec<f32>, Vec<f64>);
    let cases: [Case; 4] = [
        (
            "nll",
            nll_none,
            [0, 2],
            vec![f32::NAN, 1.0],
            vec![nan, 0.0, 0.0, 0.0, 0.0, -1.0],
        ),
        (
            "nll sum",
            nll_sum,
            [0, 2],
            vec![f32::INFINITY],
            vec![-inf, 0.0, 0.0, 0.0, 0.0, -inf],
        ),
        (
            "nll ignored",
            nll_none,
            [0, -100],
            vec![1.0, f32::NAN],
            vec![-1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ),
        (
            "cross entropy",
            ce_none,
            [0, 2],
            vec![f32::NAN, 1.0],
            vec![nan, nan, nan, 0.30061, 0.33222, -0.63283],
        ),
    ];
    for dev in devices() {
        for (what, f, t, go, want) in &cases {
            let x = Tensor::from_vec(x.to_vec(), [2, 3], &cpu())
                .unwrap()
                .to_device(&dev)
                .unwrap();
            let x = x.requires_grad_(true).unwrap();
            let t = Tensor::from_vec(t.to_vec(), [2], &cpu())
                .unwrap()
                .to_device(&dev)
                .unwrap();
            let y = f(&x, &t).unwrap();
            let go = Tensor::from_vec(go.clone(), y.shape(), &cpu())
                .unwrap()
                .to_device(&dev)
                .unwrap();
            let g = grad_of(&[&y], &[&x], Some(&[&go]), false).unwrap()[0]
                .clone()
                .unwrap();
            let got = vals(&g);
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 1e-4;
                assert!(
                    ok,
                    "{what} on {dev:?}: element {i} is {g}, PyTorch gives {w}"
                );
            }
        }
    }
}

// ---- other dtypes and devices -----------------------------------------------------------------

type Case = (
    &'static str,
    Box<dyn Fn(&[Tensor]) -> Result<Tensor>>,
    Vec<Tensor>,
);

/// One call of every op with a backward rule, on `dev` in `dtype`, with float values rounded
/// to `round` first (so that a case in f64 holds exactly the values of one in `round`).
fn cases(dev: &Device, dtype: DType, round: DType) -> Vec<Case> {
    let mut seed = 100;
    let mut f = |shape: &[usize], scale: f64| -> Tensor {
        seed += 1;
        rounded(randn(seed, shape).mul(scale).unwrap(), round, dtype, dev)
    };
    let on = |t: Tensor| t.to_device(dev).unwrap();
    let x = f(&[3, 5], 2.0);
    let x3 = f(&[2, 3, 4], 2.0);
    let w4 = f(&[4], 1.0);
    let b4 = f(&[4], 1.0);
    let gx = f(&[2, 4, 3], 2.0);
    let (gw, gb) = (f(&[4], 1.0), f(&[4], 1.0));
    let bx = f(&[3, 2, 4], 2.0);
    let (bw, bb) = (f(&[2], 1.0), f(&[2], 1.0));
    let rm = f(&[2], 1.0);
    let rv = f(&[2], 1.0).abs().unwrap().add(0.5).unwrap();
    let (rm2, rv2) = (rm.clone(), rv.clone());
    let dx = f(&[4, 5], 1.0);
    let (rx, rc, rs) = (f(&[2, 3, 4], 1.0), f(&[3, 4], 1.0), f(&[3, 4], 1.0));
    let (q, k, v) = (
        f(&[1, 4, 3, 2], 1.0),
        f(&[1, 2, 5, 2], 1.0),
        f(&[1, 2, 5, 3], 1.0),
    );
    let keep = on(Tensor::from_vec(
        vec![
            true, false, true, true, false, false, false, false, false, false, true, true, false,
            true, true,
        ],
        [3, 5],
        &cpu(),
    )
    .unwrap());
    let fmask = f(&[1, 1, 3, 5], 1.0);
    let cx = f(&[5, 4], 2.0);
    let ct = on(Tensor::new([1i64, DEFAULT_IGNORE_INDEX, 3, 0, 2], &cpu()).unwrap());
    let cw = f(&[4], 1.0).abs().unwrap().add(0.2).unwrap();
    let cw2 = cw.clone();
    let cx3 = f(&[2, 4, 3], 2.0);
    let ct3 = on(Tensor::from_vec(vec![0i64, 1, 3, 1, 2, 1], [2, 3], &cpu()).unwrap());
    let (mx, mt) = (f(&[3, 4], 1.0), f(&[3, 4], 1.0));
    let lx = f(&[3, 4], 3.0);
    let lt = on(Generator::new(7).rand([3, 4], DType::F64, &cpu()).unwrap());
    let lt = rounded(lt, round, dtype, dev);
    let (lw, lpw) = (f(&[4], 1.0), f(&[4], 1.0).abs().unwrap().add(0.5).unwrap());
    vec![
        (
            "softmax",
            Box::new(|t: &[Tensor]| nnf::softmax(&t[0], 1)),
            vec![x.clone()],
        ),
        (
            "log_softmax",
            Box::new(|t: &[Tensor]| nnf::log_softmax(&t[0], 1)),
            vec![x3.clone()],
        ),
        (
            "layer_norm",
            Box::new(|t: &[Tensor]| {
                nnf::layer_norm_with(
                    &t[0],
                    &[4],
                    &nnf::NormOptions::new().weight(&t[1]).bias(&t[2]),
                )
            }),
            vec![x3.clone(), w4.clone(), b4],
        ),
        (
            "rms_norm",
            Box::new(|t: &[Tensor]| {
                nnf::rms_norm_with(&t[0], &[3, 4], &nnf::RmsNormOptions::new().eps(1e-5))
            }),
            vec![x3.clone()],
        ),
        (
            "group_norm",
            Box::new(|t: &[Tensor]| {
                nnf::group_norm_with(&t[0], 2, &nnf::NormOptions::new().weight(&t[1]).bias(&t[2]))
            }),
            vec![gx, gw, gb],
        ),
        (
            "batch_norm training",
            Box::new(move |t: &[Tensor]| batch_norm_training(t, &rm, &rv)),
            vec![bx.clone(), bw.clone(), bb.clone()],
        ),
        (
            "batch_norm eval",
            Box::new(move |t: &[Tensor]| {
                Ok(nnf::batch_norm(
                    &t[0],
                    &nnf::BatchNormOptions::new()
                        .running_mean(&rm2)
                        .running_var(&rv2)
                        .weight(&t[1]),
                )?
                .output)
            }),
            vec![bx, bw],
        ),
        (
            "dropout",
            Box::new(|t: &[Tensor]| nnf::dropout_seeded(&t[0], 0.3, true, 5)),
            vec![dx],
        ),
        (
            "apply_rotary_emb",
            Box::new(|t: &[Tensor]| nnf::apply_rotary_emb(&t[0], &t[1], &t[2])),
            vec![rx, rc, rs],
        ),
        (
            "sdpa causal gqa",
            Box::new(|t: &[Tensor]| {
                sdpa(
                    t,
                    nnf::AttentionOptions::new()
                        .is_causal(true)
                        .enable_gqa(true),
                )
            }),
            vec![q.clone(), k.clone(), v.clone()],
        ),
        (
            "sdpa bool mask",
            Box::new(|t: &[Tensor]| {
                sdpa(t, nnf::AttentionOptions::new().scale(0.8).enable_gqa(true))
            }),
            vec![q.clone(), k.clone(), v.clone(), keep],
        ),
        (
            "sdpa float mask",
            Box::new(|t: &[Tensor]| sdpa(t, nnf::AttentionOptions::new().enable_gqa(true))),
            vec![q, k, v, fmask],
        ),
        (
            "cross_entropy",
            Box::new(move |t: &[Tensor]| {
                cross_entropy(
                    t,
                    &nnf::CrossEntropyOptions::new()
                        .weight(&cw)
                        .label_smoothing(0.1),
                )
            }),
            vec![cx.clone(), ct.clone()],
        ),
        (
            "cross_entropy [N, C, d]",
            Box::new(move |t: &[Tensor]| {
                let opts = nnf::CrossEntropyOptions::new().weight(&cw2).ignore_index(1);
                cross_entropy(t, &opts.reduction(Reduction::Sum))
            }),
            vec![cx3, ct3],
        ),
        (
            "nll_loss",
            Box::new(|t: &[Tensor]| {
                nnf::nll_loss_with(
                    &t[0],
                    &t[1],
                    &nnf::NllLossOptions::new().reduction(Reduction::None),
                )
            }),
            vec![cx, ct],
        ),
        (
            "mse_loss",
            Box::new(|t: &[Tensor]| nnf::mse_loss(&t[0], &t[1], Reduction::Mean)),
            vec![mx, mt],
        ),
        (
            "binary_cross_entropy_with_logits",
            Box::new(|t: &[Tensor]| {
                nnf::binary_cross_entropy_with_logits_with(
                    &t[0],
                    &t[1],
                    &nnf::BceWithLogitsOptions::new()
                        .weight(&t[2])
                        .pos_weight(&t[3]),
                )
            }),
            vec![lx, lt, lw, lpw],
        ),
    ]
}

/// Gradients of every case with a seeded output gradient, as (case, input) names and tensors.
fn case_grads(dev: &Device, dtype: DType, round: DType) -> Vec<(String, Tensor)> {
    let mut out = Vec::new();
    for (name, f, inputs) in cases(dev, dtype, round) {
        let shape = f(&inputs).unwrap().shape().to_vec();
        let go = Generator::new(9)
            .randn(&shape[..], DType::F64, &cpu())
            .unwrap();
        let go = rounded(go, round, dtype, dev);
        for (i, g) in grads_of(&*f, &inputs, Some(&go)).into_iter().enumerate() {
            assert_eq!(g.dtype(), dtype, "{name}: gradient {i} dtype");
            assert_eq!(g.device(), dev, "{name}: gradient {i} device");
            out.push((format!("{name} gradient {i}"), g));
        }
    }
    out
}

#[test]
fn gradients_in_f32_and_16_bit_floats_match_f64() {
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 1e-2), (DType::BF16, 5e-2)] {
        let want = case_grads(&cpu(), DType::F64, dtype);
        let got = case_grads(&cpu(), dtype, dtype);
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            assert_close(
                &format!("{name} in {dtype}"),
                &g.to_dtype(DType::F64).unwrap(),
                w,
                tol,
            )
            .unwrap();
        }
    }
}

#[test]
fn backward_on_pjrt_matches_cpu() {
    let Some(dev) = pjrt("nn_grad/backward_on_pjrt_matches_cpu") else {
        return;
    };
    let want = case_grads(&cpu(), DType::F32, DType::F32);
    let got = case_grads(&dev, DType::F32, DType::F32);
    assert_eq!(got.len(), want.len());
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        assert_close(name, &g.to_device(&cpu()).unwrap(), w, 2e-5).unwrap();
    }
}
