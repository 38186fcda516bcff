//! Backward rules of the matrix products, einsum, convolutions, pooling and interpolation:
//! against central finite differences on random small shapes and options (proptest, f64),
//! against gradients computed by PyTorch, and on the PJRT CPU plugin against the native CPU.

use crate::ConvCase;
use crate::common::{cpu, gradcheck_or_panic, pjrt, randn, seq};
use proptest::prelude::*;
use tpu_ops::autograd::grad_of;
use tpu_ops::ops::conv::{
    AvgPoolOptions, ConvOptions, ConvTransposeOptions, InterpolateMode, MaxPoolOptions, Padding,
    Resize,
};
use tpu_ops::ops::linalg::einsum;
use tpu_ops::prelude::*;
use tpu_ops::testing::assert_close;
use tpu_tensor::{DType, Device, Result, Tensor};

// ---- helpers ----------------------------------------------------------------------------------

/// Finite-difference step and tolerance: every op here is linear in each input (or piecewise
/// linear), so central differences in f64 are exact up to rounding.
const EPS: f64 = 1e-6;
const TOL: f64 = 1e-6;

fn check(what: &str, f: impl Fn(&[Tensor]) -> Result<Tensor>, inputs: &[Tensor]) {
    gradcheck_or_panic(what, f, inputs, EPS, TOL)
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_device(&cpu())
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
}

fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}: element {i} is {a}, expected {b}\ngot  {got:?}\nwant {want:?}"
        );
    }
}

/// Runs `f` on leaves made from `inputs`, backpropagates `seq`-built output gradients
/// `(a, m, off, div)`, and returns each input's gradient.
fn grads(
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    g: (usize, usize, f64, f64),
) -> Vec<Vec<f64>> {
    let leaves: Vec<Tensor> = inputs
        .iter()
        .map(|t| t.copy().unwrap().requires_grad_(true).unwrap())
        .collect();
    let y = f(&leaves).unwrap();
    let gy = seq(y.shape(), g.0, g.1, g.2, g.3);
    y.backward_with(Some(&gy), false).unwrap();
    leaves.iter().map(|l| vals(&l.grad().unwrap())).collect()
}

// ---- matrix products ----------------------------------------------------------------------------

/// Shapes of a `matmul` operand pair: ranks 1 to 4, batch dims that broadcast (some 1).
fn matmul_shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (
        (1..=4usize, 1..=4usize),
        (1..=3usize, 1..=3usize, 1..=3usize),
        prop::collection::vec((1..=2usize, any::<bool>(), any::<bool>()), 2),
    )
        .prop_map(|((ra, rb), (m, k, n), batch)| {
            let la = ra.saturating_sub(2);
            let lb = rb.saturating_sub(2);
            let l = la.max(lb);
            let mut a = Vec::new();
            for (i, &(s, one_a, _)) in batch.iter().enumerate().take(l) {
                if i >= l - la {
                    a.push(if one_a { 1 } else { s });
                }
            }
            let mut b = Vec::new();
            for (i, &(s, _, one_b)) in batch.iter().enumerate().take(l) {
                if i >= l - lb {
                    b.push(if one_b { 1 } else { s });
                }
            }
            if ra == 1 {
                a.push(k);
            } else {
                a.extend([m, k]);
            }
            if rb == 1 {
                b.push(k);
            } else {
                b.extend([k, n]);
            }
            (a, b)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn matmul_gradients((a, b) in matmul_shapes(), seed in 0u64..1000) {
        check("matmul", |x| x[0].matmul(&x[1]), &[randn(seed, &a), randn(seed + 1, &b)]);
    }

    #[test]
    fn mm_bmm_dot_gradients(
        (bs, m, k, n) in (1..=3usize, 1..=3usize, 1..=4usize, 1..=3usize), seed in 0u64..1000,
    ) {
        let (a, b) = (randn(seed, &[m, k]), randn(seed + 1, &[k, n]));
        check("mm", |x| x[0].mm(&x[1]), &[a, b]);
        let (a, b) = (randn(seed, &[bs, m, k]), randn(seed + 1, &[bs, k, n]));
        check("bmm", |x| x[0].bmm(&x[1]), &[a, b]);
        let (u, v) = (randn(seed, &[k]), randn(seed + 1, &[k]));
        check("dot", |x| x[0].dot(&x[1]), &[u, v]);
    }

    #[test]
    fn linear_gradients(
        lead in prop::collection::vec(1..=3usize, 0..=2),
        (fin, fout) in (1..=3usize, 1..=3usize),
        bias in 0..3usize,
        seed in 0u64..1000,
    ) {
        let mut xs = lead.clone();
        xs.push(fin);
        let x = randn(seed, &xs);
        let w = randn(seed + 1, &[fout, fin]);
        match bias {
            0 => check("linear", |t| t[0].linear(&t[1], None), &[x, w]),
            // A bias of one element broadcasts over the outputs.
            b => {
                let bias = randn(seed + 2, &[if b == 1 { fout } else { 1 }]);
                check("linear+bias", |t| t[0].linear(&t[1], Some(&t[2])), &[x, w, bias]);
            }
        }
    }
}

// ---- einsum -----------------------------------------------------------------------------------

/// Equations and their operands' shapes: a letter takes the random size of that subscript,
/// `1` is a broadcast dim of size 1, and capitals size the dims under an ellipsis.
const EINSUM_CASES: &[(&str, &[&str])] = &[
    ("ij,jk->ik", &["ij", "jk"]),
    ("bij,bjk->bik", &["bij", "bjk"]),
    ("i,i->", &["i", "i"]),
    ("i,j->ij", &["i", "j"]),
    ("ij->ji", &["ij"]),
    ("ij->", &["ij"]),
    ("ii->i", &["ii"]),
    ("ii", &["ii"]),
    ("iij,jk->ik", &["iij", "jk"]),
    ("bij,j->i", &["bij", "j"]),
    ("ij,ij->i", &["ij", "i1"]),
    ("ij,jk,kl->il", &["ij", "jk", "kl"]),
    ("...ij,...jk->...ik", &["A1ij", "Bjk"]),
    ("...ij->...", &["ABij"]),
    ("i...i->...i", &["iAi"]),
    ("bi,bi,bi->b", &["bi", "1i", "b1"]),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn einsum_gradients(
        case in 0..EINSUM_CASES.len(),
        sizes in prop::collection::vec(1..=3usize, 8),
        seed in 0u64..1000,
    ) {
        let (eq, specs) = EINSUM_CASES[case];
        let size = |c: char| -> usize {
            match c {
                '1' => 1,
                'A' => sizes[0],
                'B' => sizes[1],
                c => sizes[2 + (c as usize - 'a' as usize) % 6],
            }
        };
        let inputs: Vec<Tensor> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| randn(seed + i as u64, &s.chars().map(size).collect::<Vec<_>>()))
            .collect();
        check(eq, |x| einsum(eq, &x.iter().collect::<Vec<_>>()), &inputs);
    }
}

#[test]
fn einsum_gradient_of_a_shared_operand_accumulates() {
    // tr(A A) = sum_ij A_ij A_ji: the gradient is 2 Aᵀ.
    let a = randn(5, &[3, 3]).requires_grad_(true).unwrap();
    let y = einsum("ij,ji->", &[&a, &a]).unwrap();
    y.backward().unwrap();
    let want: Vec<f64> = vals(&a.t().unwrap()).iter().map(|v| 2.0 * v).collect();
    close("einsum shared", &vals(&a.grad().unwrap()), &want, 1e-12);
}

#[test]
fn einsum_backward_refuses_too_many_subscripts_clearly() {
    // 52 letters and a one-dim ellipsis leave no letter for the ellipsis in the gradient's
    // equation: the backward says so instead of failing obscurely.
    let letters: String = ('A'..='Z').chain('a'..='z').collect();
    let eq = format!("...{letters}->...");
    let x = Tensor::ones(vec![1usize; 53], DType::F64, &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let y = einsum(&eq, &[&x]).unwrap();
    let e = y.backward_with(None, false).unwrap_err().to_string();
    assert!(e.contains("52 letters"), "{e}");
}

// ---- convolutions -----------------------------------------------------------------------------

/// A case's convolution, and whether it has a bias and whether its input has a batch dim.
type Case = (ConvCase, bool, bool);

/// The inputs of a case: the input (`[c, ...]` or, batched, `[n, c, ...]`), the weight (of a
/// transposed convolution with `transposed`) and the bias if it has one.
fn conv_inputs(
    (c, bias, batched): &Case,
    seed: u64,
    spatial: usize,
    transposed: bool,
) -> Vec<Tensor> {
    let (cin, o) = (c.cg * c.groups, c.og * c.groups);
    let mut xs = vec![c.n, cin];
    let mut ws = if transposed {
        vec![cin, c.og]
    } else {
        vec![o, c.cg]
    };
    if spatial == 2 {
        xs.push(c.h);
        ws.push(c.kh);
    }
    xs.push(c.w);
    ws.push(c.kw);
    if !batched {
        xs.remove(0);
    }
    let mut v = vec![randn(seed, &xs), randn(seed + 1, &ws)];
    if *bias {
        v.push(randn(seed + 2, &[o]));
    }
    v
}

fn conv_case(spatial: usize) -> impl Strategy<Value = Case> {
    let hh = if spatial == 1 { 1..=1usize } else { 1..=4usize };
    let hk = if spatial == 1 { 1..=1usize } else { 1..=3usize };
    (
        (1..=2usize, 1..=2usize, 1..=2usize, 1..=2usize),
        (hh, 1..=5usize, hk, 1..=3usize),
        (
            1..=2usize,
            1..=3usize,
            0..=2usize,
            0..=2usize,
            0..=2usize,
            0..=2usize,
        ),
        (1..=2usize, 1..=2usize, any::<bool>(), any::<bool>()),
    )
        .prop_map(
            move |(
                (n, groups, cg, og),
                (h, w, kh, kw),
                (s0, s1, p0, p1, q0, q1),
                (d0, d1, bias, batched),
            )| {
                let one = spatial == 1;
                let c = ConvCase::new(
                    [n, groups, cg, og, h, w, kh, kw],
                    [if one { 1 } else { s0 }, s1],
                    [if one { [0, 0] } else { [p0, p1] }, [q0, q1]],
                    [if one { 1 } else { d0 }, d1],
                );
                (c, bias, batched)
            },
        )
}

/// The options of a case: symmetric padding when both sides agree, "same" when asked for
/// (stride 1 only), and `[before, after]` pairs otherwise.
fn conv_opts(c: &ConvCase, spatial: usize, same: bool) -> ConvOptions {
    let pick = |v: [usize; 2]| -> Vec<usize> { if spatial == 1 { vec![v[1]] } else { v.to_vec() } };
    let sym = c.p[0][0] == c.p[0][1] && c.p[1][0] == c.p[1][1];
    let padding = if same {
        Padding::Same
    } else if sym {
        Padding::Symmetric(pick([c.p[0][0], c.p[1][0]]).into())
    } else if spatial == 1 {
        Padding::Sides(vec![c.p[1]])
    } else {
        Padding::Sides(c.p.to_vec())
    };
    ConvOptions::new()
        .stride(pick(c.s))
        .padding(padding)
        .dilation(pick(c.d))
        .groups(c.groups)
}

fn check_conv(case: &Case, spatial: usize, same: bool, seed: u64) {
    let o = conv_opts(&case.0, spatial, same);
    let inputs = conv_inputs(case, seed, spatial, false);
    check(
        &format!("conv{spatial}d {case:?} same={same}"),
        |x| {
            let b = x.get(2);
            if spatial == 1 {
                x[0].conv1d(&x[1], b, &o)
            } else {
                x[0].conv2d(&x[1], b, &o)
            }
        },
        &inputs,
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn conv2d_gradients((c, bias, batched) in conv_case(2), same in any::<bool>(), seed in 0u64..1000) {
        let c = if same { ConvCase { s: [1, 1], ..c } } else { c };
        prop_assume!(same || c.out().is_some());
        check_conv(&(c, bias, batched), 2, same, seed);
    }

    #[test]
    fn conv1d_gradients((c, bias, batched) in conv_case(1), same in any::<bool>(), seed in 0u64..1000) {
        let c = if same { ConvCase { s: [1, 1], ..c } } else { c };
        prop_assume!(same || c.out().is_some());
        check_conv(&(c, bias, batched), 1, same, seed);
    }

    #[test]
    fn conv_transpose2d_gradients(
        (c, bias, batched) in conv_case(2), op in (0..=2usize, 0..=2usize), seed in 0u64..1000,
    ) {
        let case = (c.symmetric(), bias, batched);
        let op = [op.0, op.1];
        prop_assume!(case.0.transpose_fits(op));
        let o = case.0.transpose_options(op);
        let inputs = conv_inputs(&case, seed, 2, true);
        check(
            &format!("conv_transpose2d {case:?} {op:?}"),
            |x| x[0].conv_transpose2d(&x[1], x.get(2), &o),
            &inputs,
        );
    }
}

// ---- pooling and interpolation ------------------------------------------------------------------

/// A pooling input: `[planes, h, w]` or `[1, planes, h, w]`.
fn pool_input(seed: u64, planes: usize, h: usize, w: usize, batched: bool) -> Tensor {
    if batched {
        randn(seed, &[1, planes, h, w])
    } else {
        randn(seed, &[planes, h, w])
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn max_pool2d_gradients(
        (planes, h, w) in (1..=2usize, 1..=5usize, 1..=5usize),
        (k0, k1, s0, s1) in (1..=3usize, 1..=3usize, 1..=3usize, 1..=3usize),
        (p0, p1, d0, d1) in (0..=1usize, 0..=1usize, 1..=2usize, 1..=2usize),
        (ceil, indices, batched) in (any::<bool>(), any::<bool>(), any::<bool>()),
        seed in 0u64..1000,
    ) {
        let o = MaxPoolOptions::new([k0, k1])
            .stride([s0, s1])
            .padding([p0, p1])
            .dilation([d0, d1])
            .ceil_mode(ceil);
        let x = pool_input(seed, planes, h, w, batched);
        let y = x.max_pool2d(&o);
        // Options without an output, and windows wholly in the padding (-inf), have nothing
        // to differentiate.
        prop_assume!(y.as_ref().is_ok_and(|y| vals(y).iter().all(|v| v.is_finite())));
        check(
            &format!("max_pool2d {o:?} indices={indices}"),
            |t| {
                if indices {
                    Ok(t[0].max_pool2d_with_indices(&o)?.0)
                } else {
                    t[0].max_pool2d(&o)
                }
            },
            &[x],
        );
    }

    #[test]
    fn avg_pool2d_gradients(
        (planes, h, w) in (1..=2usize, 1..=5usize, 1..=5usize),
        (k0, k1, s0, s1) in (1..=3usize, 1..=3usize, 1..=3usize, 1..=3usize),
        (p0, p1) in (0..=1usize, 0..=1usize),
        (ceil, include, batched) in (any::<bool>(), any::<bool>(), any::<bool>()),
        divisor in prop::option::of(1..=5usize),
        seed in 0u64..1000,
    ) {
        let o = AvgPoolOptions::new([k0, k1])
            .stride([s0, s1])
            .padding([p0, p1])
            .ceil_mode(ceil)
            .count_include_pad(include)
            .divisor_override(divisor);
        let x = pool_input(seed, planes, h, w, batched);
        prop_assume!(x.avg_pool2d(&o).is_ok());
        check(&format!("avg_pool2d {o:?}"), |t| t[0].avg_pool2d(&o), &[x]);
    }

    #[test]
    fn adaptive_avg_pool2d_gradients(
        (planes, h, w) in (1..=2usize, 1..=6usize, 1..=6usize),
        (oh, ow) in (1..=4usize, 1..=4usize),
        batched in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let x = pool_input(seed, planes, h, w, batched);
        check("adaptive_avg_pool2d", |t| t[0].adaptive_avg_pool2d([oh, ow]), &[x]);
    }

    #[test]
    fn interpolate_gradients(
        (n, c, h, w) in (1..=2usize, 1..=2usize, 1..=4usize, 1..=4usize),
        (oh, ow) in (1..=6usize, 1..=6usize),
        (sh, sw) in (0.5f64..2.6, 0.5f64..2.6),
        (mode, scaled) in (0..3usize, any::<bool>()),
        seed in 0u64..1000,
    ) {
        let to = if scaled { Resize::Scale([sh, sw]) } else { Resize::Size([oh, ow]) };
        prop_assume!(!scaled || (h as f64 * sh >= 1.0 && w as f64 * sw >= 1.0));
        let mode = match mode {
            0 => InterpolateMode::Nearest,
            m => InterpolateMode::Bilinear { align_corners: m == 2 },
        };
        let x = randn(seed, &[n, c, h, w]);
        check(&format!("interpolate {to:?} {mode:?}"), |t| t[0].interpolate(to, mode), &[x]);
    }
}

// ---- against PyTorch ----------------------------------------------------------------------------
//
// Generated with torch 2.15 (CPU, float64):
//
//   import torch, torch.nn.functional as F
//   torch.set_default_dtype(torch.float64)
//   def seq(shape, a, m, off, div):
//       n = 1
//       for s in shape: n *= s
//       return torch.tensor([((i * a % m) - off) / div for i in range(n)]).reshape(shape)
//   def grads(out_fn, ins, ga):
//       ins = [t.clone().requires_grad_(True) for t in ins]
//       y = out_fn(*ins)
//       y.backward(seq(list(y.shape), *ga))
//       return [t.grad.flatten().tolist() for t in ins]
//
// and, per test, the call shown in its comment.

#[test]
fn conv2d_groups_stride_dilation_match_pytorch() {
    // x = seq([1, 4, 4, 5], 7, 11, 5, 4); w = seq([4, 2, 2, 2], 5, 9, 4, 3); b = seq([4], 3, 5, 2, 2)
    // grads(lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 1), dilation=(1, 2),
    //       groups=2), [x, w, b], (3, 7, 3, 2))
    let x = seq(&[1, 4, 4, 5], 7, 11, 5.0, 4.0);
    let w = seq(&[4, 2, 2, 2], 5, 9, 4.0, 3.0);
    let b = seq(&[4], 3, 5, 2.0, 2.0);
    let o = ConvOptions::new()
        .stride([2, 1])
        .padding(1)
        .dilation([1, 2])
        .groups(2);
    let g = grads(
        |t| t[0].conv2d(&t[1], Some(&t[2]), &o),
        &[x, w, b],
        (3, 7, 3.0, 2.0),
    );
    let gx = [
        0.5,
        -2.666666666666667,
        -0.6666666666666667,
        0.16666666666666674,
        -1.3333333333333333,
        -0.6666666666666666,
        1.0,
        2.1666666666666665,
        -2.5,
        -2.0,
        -1.0,
        0.3333333333333335,
        2.333333333333333,
        -2.666666666666667,
        -1.5,
        -1.3333333333333333,
        -0.16666666666666674,
        0.9999999999999999,
        1.0,
        2.1666666666666665,
        1.5,
        -3.0,
        0.6666666666666667,
        0.8333333333333333,
        -1.0,
        -1.3333333333333333,
        -0.33333333333333326,
        2.5,
        -2.833333333333333,
        -1.0,
        -1.6666666666666667,
        -1.0,
        2.6666666666666665,
        -3.0,
        -0.5,
        -1.3333333333333333,
        -0.16666666666666652,
        0.33333333333333326,
        -0.33333333333333326,
        1.5,
        0.6666666666666666,
        -0.16666666666666674,
        -0.16666666666666674,
        0.9999999999999999,
        -1.0,
        -0.5,
        2.1666666666666665,
        1.0,
        0.9999999999999999,
        1.3333333333333333,
        0.0,
        -2.5,
        -1.3333333333333335,
        -0.16666666666666674,
        -1.5,
        1.1666666666666665,
        -1.3333333333333335,
        -2.5,
        2.1666666666666665,
        2.0,
        1.0,
        0.5,
        -0.16666666666666652,
        0.33333333333333326,
        -1.3333333333333333,
        0.5,
        -2.666666666666667,
        -0.6666666666666667,
        0.16666666666666674,
        -1.3333333333333333,
        1.0,
        -2.833333333333333,
        0.0,
        0.5,
        -1.1666666666666665,
        -1.0,
        0.3333333333333335,
        2.333333333333333,
        -2.666666666666667,
        -1.5,
    ];
    let gw = [
        -1.875, 1.375, 3.25, 3.25, 1.25, -1.25, -2.75, 2.375, -0.5, 1.375, -2.5, -0.625, -2.75,
        0.375, 1.25, -1.125, -0.625, -1.125, -0.625, 0.375, -1.125, -0.625, -0.75, 1.375, 2.5,
        2.375, 1.5, -1.25, -2.0, 3.25, 1.5, 1.375,
    ];
    close("conv2d dx", &g[0], &gx, 1e-12);
    close("conv2d dw", &g[1], &gw, 1e-12);
    close("conv2d db", &g[2], &[-1.5, 0.0, 1.5, -0.5], 1e-12);
}

#[test]
fn conv_transpose2d_matches_pytorch() {
    // x = seq([1, 4, 3, 3], 5, 7, 3, 2); w = seq([4, 1, 3, 2], 3, 11, 5, 4); b = seq([2], 1, 3, 1, 1)
    // grads(lambda x, w, b: F.conv_transpose2d(x, w, b, stride=(2, 1), padding=(1, 0),
    //       output_padding=(1, 0), groups=2, dilation=(1, 2)), [x, w, b], (5, 9, 4, 2))
    let x = seq(&[1, 4, 3, 3], 5, 7, 3.0, 2.0);
    let w = seq(&[4, 1, 3, 2], 3, 11, 5.0, 4.0);
    let b = seq(&[2], 1, 3, 1.0, 1.0);
    let o = ConvTransposeOptions::new()
        .stride([2, 1])
        .padding([1, 0])
        .output_padding([1, 0])
        .groups(2)
        .dilation([1, 2]);
    let g = grads(
        |t| t[0].conv_transpose2d(&t[1], Some(&t[2]), &o),
        &[x, w, b],
        (5, 9, 4.0, 2.0),
    );
    let gx = [
        -4.0, 1.625, -2.875, -1.25, -2.25, 0.125, -2.25, 0.125, 1.375, 0.125, -0.75, 5.125, 2.5,
        4.875, -2.875, 4.875, -2.875, 1.75, -0.25, -0.75, -0.125, -0.625, 0.5, -0.625, 0.5, -0.625,
        5.0, 0.875, 2.875, 0.375, 2.5, -1.0, 2.25, -1.0, 2.25, -4.625,
    ];
    let gw = [
        -4.0, 0.5, -0.5, -0.75, -2.25, -7.0, -2.5, 3.5, -3.75, -4.25, 6.25, -3.25, 0.0, 0.25, 2.0,
        0.75, 0.0, 1.0, 3.75, 3.25, -1.75, 4.0, 0.25, -0.75,
    ];
    close("conv_transpose2d dx", &g[0], &gx, 1e-12);
    close("conv_transpose2d dw", &g[1], &gw, 1e-12);
    close("conv_transpose2d db", &g[2], &[-3.0, 1.5], 1e-12);
}

#[test]
fn max_pool2d_ties_route_like_pytorch() {
    // x = seq([1, 2, 4, 5], 7, 5, 0, 1)   (every row is [0, 2, 4, 1, 3]: ties down each column)
    // grads(lambda x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True), [x], (3, 7, 3, 1))
    // grads(lambda x: F.max_pool2d(x, 2, stride=1), [x], (3, 7, 3, 1))
    let x = seq(&[1, 2, 4, 5], 7, 5, 0.0, 1.0);
    let o = MaxPoolOptions::new(3).stride(2).padding(1).ceil_mode(true);
    let want = [
        0.0, -3.0, 0.0, 0.0, 3.0, 0.0, -1.0, 2.0, 0.0, -2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0,
        -3.0, 0.0, 0.0, 0.0, 3.0, -1.0, 0.0, 2.0, 0.0, -2.0, 1.0, 0.0, -3.0, 0.0, 0.0, 0.0, 0.0,
        0.0, 0.0, 0.0, 3.0, 0.0, -1.0,
    ];
    let g = grads(
        |t| t[0].max_pool2d(&o),
        std::slice::from_ref(&x),
        (3, 7, 3.0, 1.0),
    );
    close("max_pool2d ties", &g[0], &want, 0.0);
    // The same through the op that also returns the indices.
    let g = grads(
        |t| Ok(t[0].max_pool2d_with_indices(&o)?.0),
        std::slice::from_ref(&x),
        (3, 7, 3.0, 1.0),
    );
    close("max_pool2d_with_indices ties", &g[0], &want, 0.0);
    let (_, idx) = x.max_pool2d_with_indices(&o).unwrap();
    assert_eq!(
        idx.to_vec::<i64>().unwrap(),
        [1, 2, 4, 6, 7, 9, 16, 17, 19, 1, 2, 4, 6, 7, 9, 16, 17, 19]
    );
    let o = MaxPoolOptions::new(2).stride(1);
    let g = grads(|t| t[0].max_pool2d(&o), &[x], (3, 7, 3.0, 1.0));
    let want = [
        0.0, -3.0, 3.0, 0.0, -1.0, 0.0, 2.0, -1.0, 0.0, -3.0, 0.0, 0.0, 2.0, 0.0, 2.0, 0.0, 0.0,
        0.0, 0.0, 0.0, 0.0, -2.0, -2.0, 0.0, 0.0, 0.0, 3.0, 1.0, 0.0, -2.0, 0.0, 1.0, -3.0, 0.0,
        3.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    ];
    close("max_pool2d overlapping ties", &g[0], &want, 0.0);
}

#[test]
fn bilinear_interpolate_matches_pytorch() {
    // x = seq([1, 1, 3, 4], 5, 7, 3, 2)
    // grads(lambda x: F.interpolate(x, size=(5, 3), mode="bilinear", align_corners=False),
    //       [x], (3, 7, 3, 2))
    // grads(lambda x: F.interpolate(x, scale_factor=(1.7, 2.0), mode="bilinear",
    //       align_corners=True), [x], (3, 7, 3, 2))
    // grads(lambda x: F.interpolate(x, scale_factor=(1.7, 0.6), mode="bilinear",
    //       align_corners=False), [x], (3, 7, 3, 2))
    let x = seq(&[1, 1, 3, 4], 5, 7, 3.0, 2.0);
    let cases: [(Resize, bool, [f64; 12]); 3] = [
        (
            Resize::Size([5, 3]),
            false,
            [
                -1.5,
                1.1102230246251565e-16,
                0.4500000000000003,
                0.7499999999999997,
                0.7500000000000002,
                -0.5,
                -0.65,
                1.1102230246251565e-16,
                -0.08333333333333365,
                0.08333333333333331,
                -0.05000000000000025,
                -0.7499999999999998,
            ],
        ),
        (
            Resize::Scale([1.7, 2.0]),
            true,
            [
                -0.8928571428571427,
                1.5357142857142856,
                -0.392857142857143,
                -1.75,
                1.7142857142857142,
                0.14285714285714268,
                -1.6785714285714288,
                1.0714285714285716,
                0.46428571428571425,
                -1.3214285714285716,
                0.5000000000000004,
                1.107142857142857,
            ],
        ),
        (
            Resize::Scale([1.7, 0.6]),
            false,
            [
                -0.3627450980392158,
                -0.18137254901960786,
                -0.33823529411764697,
                0.0,
                1.176470588235294,
                0.5882352941176472,
                -1.823529411764706,
                0.0,
                0.18627450980392157,
                0.0931372549019608,
                0.6617647058823529,
                0.0,
            ],
        ),
    ];
    for (to, align_corners, want) in cases {
        let mode = InterpolateMode::Bilinear { align_corners };
        let g = grads(
            |t| t[0].interpolate(to, mode),
            std::slice::from_ref(&x),
            (3, 7, 3.0, 2.0),
        );
        // Sums of a few products: PyTorch adds in another order.
        close(&format!("bilinear {to:?} {mode:?}"), &g[0], &want, 1e-14);
    }
}

#[test]
fn broadcast_matmul_and_linear_match_pytorch() {
    // a = seq([2, 1, 3, 4], 5, 7, 3, 2); b = seq([3, 4, 2], 3, 11, 5, 4); u = seq([4], 1, 5, 2, 1)
    // grads(lambda a, b: torch.matmul(a, b), [a, b], (3, 7, 3, 2))
    // grads(lambda u, b: torch.matmul(u, b), [u, b], (3, 7, 3, 2))
    let a = seq(&[2, 1, 3, 4], 5, 7, 3.0, 2.0);
    let b = seq(&[3, 4, 2], 3, 11, 5.0, 4.0);
    let u = seq(&[4], 1, 5, 2.0, 1.0);
    let g = grads(|t| t[0].matmul(&t[1]), &[a, b.clone()], (3, 7, 3.0, 2.0));
    let ga = [
        2.0, 0.25, 1.25, 2.25, -1.25, -3.875, -1.0, 0.5, -1.0, -0.125, -0.625, -3.875, -1.0,
        -0.125, -0.625, -3.875, 0.125, -0.75, -0.25, -3.875, -0.5, 2.125, -0.75, 0.5,
    ];
    let gb = [
        6.0, -3.0, -1.75, -0.5, -2.5, 2.0, 2.0, -2.5, -0.75, 6.0, 4.0, -1.75, -1.75, -2.5, -2.25,
        2.0, 1.25, -0.75, -4.25, 4.0, -1.0, -1.75, 7.5, -2.25,
    ];
    close("matmul da", &g[0], &ga, 1e-12);
    close("matmul db", &g[1], &gb, 1e-12);
    let g = grads(|t| t[0].matmul(&t[1]), &[u, b], (3, 7, 3.0, 2.0));
    close("matmul du", &g[0], &[0.0, 3.375, -0.125, 0.5], 1e-12);
    let gb = [
        3.0, 0.0, 1.5, 0.0, 0.0, 0.0, -1.5, 0.0, -3.0, 1.0, -1.5, 0.5, 0.0, 0.0, 1.5, -0.5, -2.0,
        2.0, -1.0, 1.0, 0.0, 0.0, 1.0, -1.0,
    ];
    close("matmul db (vector a)", &g[1], &gb, 1e-12);

    // x = seq([2, 3, 4], 5, 7, 3, 2); w = seq([5, 4], 3, 11, 5, 4); b = seq([5], 1, 3, 1, 1)
    // grads(lambda x, w, b: F.linear(x, w, b), [x, w, b], (3, 7, 3, 2))
    let x = seq(&[2, 3, 4], 5, 7, 3.0, 2.0);
    let w = seq(&[5, 4], 3, 11, 5.0, 4.0);
    let b = seq(&[5], 1, 3, 1.0, 1.0);
    let g = grads(
        |t| t[0].linear(&t[1], Some(&t[2])),
        &[x, w, b],
        (3, 7, 3.0, 2.0),
    );
    let gx = [
        0.75, 1.125, 1.5, -3.625, 1.5, 1.125, 0.75, 0.375, 0.5, -0.625, -1.75, 2.625, -1.375,
        -0.625, 0.125, 2.25, 0.25, 0.25, 0.25, -2.5, 0.125, -0.625, -1.375, 0.625,
    ];
    let gw = [
        -0.25, -4.0, 2.75, 2.5, 3.0, 2.5, -6.75, 1.5, -6.0, 0.25, 3.0, -1.25, 2.5, -0.25, -1.25,
        3.0, -1.25, 2.75, 1.5, -6.75,
    ];
    close("linear dx", &g[0], &gx, 1e-12);
    close("linear dw", &g[1], &gw, 1e-12);
    close("linear db", &g[2], &[-1.5, 0.5, -1.0, 1.0, -0.5], 1e-12);
}

// ---- dtypes -----------------------------------------------------------------------------------

#[test]
fn half_precision_gradients_keep_the_dtype_and_approximate_f32() {
    let x = randn(1, &[1, 2, 5, 4]);
    let w = randn(2, &[4, 1, 3, 2]);
    let f = |t: &[Tensor]| -> Result<Tensor> {
        let y = t[0].conv2d(&t[1], None, &ConvOptions::new().padding(1).groups(2))?;
        let y = y.interpolate(
            Resize::Size([7, 3]),
            InterpolateMode::Bilinear {
                align_corners: false,
            },
        )?;
        y.avg_pool2d(&AvgPoolOptions::new(2).ceil_mode(true))
    };
    let run = |d: DType| -> Vec<Tensor> {
        let xs = [
            x.to_dtype(d).unwrap().requires_grad_(true).unwrap(),
            w.to_dtype(d).unwrap().requires_grad_(true).unwrap(),
        ];
        let y = f(&xs).unwrap();
        let gy = Tensor::ones(y.shape(), d, &cpu()).unwrap();
        y.backward_with(Some(&gy), false).unwrap();
        xs.iter().map(|t| t.grad().unwrap()).collect()
    };
    let want = run(DType::F32);
    for d in [DType::BF16, DType::F16] {
        for (g, r) in run(d).iter().zip(&want) {
            assert_eq!(g.dtype(), d);
            close(&format!("{d}"), &vals(g), &vals(r), 5e-2);
        }
    }
}

// ---- on the PJRT CPU plugin ---------------------------------------------------------------------

/// Gradients of `f` at `inputs` (f32) on the native CPU and on the PJRT device agree, and the
/// PJRT ones stay on the PJRT device.
fn same_on_pjrt(
    what: &str,
    dev: &Device,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
) {
    let run = |d: &Device| -> Vec<Tensor> {
        let leaves: Vec<Tensor> = inputs
            .iter()
            .map(|t| {
                t.to_dtype(DType::F32)
                    .unwrap()
                    .to_device(d)
                    .unwrap()
                    .requires_grad_(true)
                    .unwrap()
            })
            .collect();
        let y = f(&leaves).unwrap();
        let gy = randn(99, y.shape())
            .to_dtype(DType::F32)
            .unwrap()
            .to_device(d)
            .unwrap();
        let refs: Vec<&Tensor> = leaves.iter().collect();
        grad_of(&[&y], &refs, Some(&[&gy]), false)
            .unwrap()
            .into_iter()
            .map(|g| g.unwrap())
            .collect()
    };
    let want = run(&cpu());
    let got = run(dev);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.device(), dev, "{what}: gradient {i} left the device");
        if let Err(e) = assert_close(&format!("{what} gradient {i}"), g, w, 1e-5) {
            panic!("{e}");
        }
    }
}

#[test]
fn backward_on_pjrt_agrees_with_the_cpu() {
    let Some(dev) = pjrt("backward_on_pjrt_agrees_with_the_cpu") else {
        return;
    };
    // Reductions have no backward rule yet: each check is one op, or ops joined by
    // broadcasting elementwise ones.
    same_on_pjrt(
        "matmul",
        &dev,
        |t| t[0].matmul(&t[1])?.add(&t[2].matmul(&t[1])?),
        &[
            randn(1, &[2, 1, 3, 4]),
            randn(2, &[3, 4, 2]),
            randn(3, &[4]),
        ],
    );
    same_on_pjrt(
        "linear",
        &dev,
        |t| t[0].linear(&t[1], Some(&t[2])),
        &[randn(4, &[2, 3, 4]), randn(5, &[5, 4]), randn(6, &[5])],
    );
    let o = ConvOptions::new()
        .stride([2, 1])
        .padding(Padding::Sides(vec![[1, 0], [2, 1]]))
        .dilation([1, 2])
        .groups(2);
    same_on_pjrt(
        "conv2d",
        &dev,
        |t| t[0].conv2d(&t[1], Some(&t[2]), &o),
        &[
            randn(7, &[2, 4, 5, 6]),
            randn(8, &[6, 2, 3, 2]),
            randn(9, &[6]),
        ],
    );
    same_on_pjrt(
        "conv1d",
        &dev,
        |t| t[0].conv1d(&t[1], None, &ConvOptions::new().padding(Padding::Same)),
        &[randn(10, &[3, 7]), randn(11, &[2, 3, 4])],
    );
    let o = ConvTransposeOptions::new()
        .stride(2)
        .padding([1, 0])
        .output_padding(1)
        .groups(2);
    same_on_pjrt(
        "conv_transpose2d",
        &dev,
        |t| t[0].conv_transpose2d(&t[1], Some(&t[2]), &o),
        &[
            randn(12, &[1, 4, 3, 4]),
            randn(13, &[4, 3, 2, 3]),
            randn(14, &[6]),
        ],
    );
    let x = randn(15, &[2, 3, 6, 7]);
    let one = std::slice::from_ref(&x);
    let o = MaxPoolOptions::new(3).stride(2).padding(1).ceil_mode(true);
    same_on_pjrt("max_pool2d", &dev, |t| t[0].max_pool2d(&o), one);
    let o = AvgPoolOptions::new([3, 2])
        .padding(1)
        .ceil_mode(true)
        .count_include_pad(false);
    same_on_pjrt("avg_pool2d", &dev, |t| t[0].avg_pool2d(&o), one);
    same_on_pjrt(
        "adaptive_avg_pool2d",
        &dev,
        |t| t[0].adaptive_avg_pool2d([4, 3]),
        one,
    );
    same_on_pjrt(
        "nearest",
        &dev,
        |t| t[0].interpolate(Resize::Scale([1.5, 0.7]), InterpolateMode::Nearest),
        one,
    );
    same_on_pjrt(
        "bilinear",
        &dev,
        |t| {
            t[0].interpolate(
                Resize::Size([4, 9]),
                InterpolateMode::Bilinear {
                    align_corners: true,
                },
            )
        },
        one,
    );
    same_on_pjrt(
        "einsum",
        &dev,
        |t| einsum("...ii,...ij->...j", &[&t[0], &t[1]]),
        &[randn(16, &[2, 3, 3]), randn(17, &[3, 4])],
    );
}

/// Pooling and resizing backward give a NaN output gradient only to the inputs whose windows
/// or taps it comes from, as PyTorch (bilinear resizing multiplies by its tap weights, zero
/// ones included, in PyTorch too). On both devices:
///
/// ```python
/// F = torch.nn.functional
/// def g(f, shape):
///     x = torch.zeros(shape, requires_grad=True); y = f(x)
///     go = torch.ones_like(y); go[0, 0, 0, 0] = float('nan'); y.backward(go); return x.grad
/// g(lambda x: F.adaptive_avg_pool2d(x, 2), (1, 1, 4, 4))
/// g(lambda x: F.avg_pool2d(x, 2), (1, 1, 4, 4))
/// # both: nan at [0:2, 0:2], 0.25 elsewhere
/// g(lambda x: F.interpolate(x, scale_factor=2, mode='nearest'), (1, 1, 2, 2))  # [nan, 4, 4, 4]
/// g(lambda x: F.interpolate(x, size=(2, 2), mode='bilinear', align_corners=True), (1, 1, 3, 3))
/// # [nan, nan, 1, nan, nan, 0, 1, 0, 1]
/// ```
#[test]
fn pooling_gradients_keep_nan_in_its_windows_like_pytorch() {
    let nan = f64::NAN;
    let mut devices = vec![cpu()];
    devices.extend(pjrt("pooling_gradients_keep_nan_in_its_windows"));
    let mut quarter = vec![0.25; 16];
    for i in [0, 1, 4, 5] {
        quarter[i] = nan;
    }
    type F = Box<dyn Fn(&Tensor) -> Result<Tensor>>;
    // What, the input shape, the op, PyTorch's input gradient.
    type Case = (&'static str, [usize; 4], F, Vec<f64>);
    let cases: Vec<Case> = vec![
        (
            "adaptive_avg_pool2d",
            [1, 1, 4, 4],
            Box::new(|x| x.adaptive_avg_pool2d(2)),
            quarter.clone(),
        ),
        (
            "avg_pool2d",
            [1, 1, 4, 4],
            Box::new(|x| x.avg_pool2d(&AvgPoolOptions::new(2))),
            quarter,
        ),
        (
            "nearest",
            [1, 1, 2, 2],
            Box::new(|x| x.interpolate(Resize::Scale([2.0, 2.0]), InterpolateMode::Nearest)),
            vec![nan, 4.0, 4.0, 4.0],
        ),
        (
            "bilinear",
            [1, 1, 3, 3],
            Box::new(|x| {
                x.interpolate(
                    Resize::Size([2, 2]),
                    InterpolateMode::Bilinear {
                        align_corners: true,
                    },
                )
            }),
            vec![nan, nan, 1.0, nan, nan, 0.0, 1.0, 0.0, 1.0],
        ),
    ];
    for dev in &devices {
        for (what, shape, f, want) in &cases {
            let x = Tensor::zeros(*shape, DType::F32, dev)
                .unwrap()
                .requires_grad_(true)
                .unwrap();
            let y = f(&x).unwrap();
            let mut go = vec![1.0f32; y.numel()];
            go[0] = f32::NAN;
            let go = Tensor::from_vec(go, y.shape(), &cpu())
                .unwrap()
                .to_device(dev)
                .unwrap();
            let g = grad_of(&[&y], &[&x], Some(&[&go]), false).unwrap()[0]
                .clone()
                .unwrap();
            let got = g.to_device(&cpu()).unwrap().to_dtype(DType::F64).unwrap();
            let got = got.to_vec::<f64>().unwrap();
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-6,
                    "{what} on {dev:?}: element {i} is {g}, PyTorch gives {w}"
                );
            }
        }
    }
}
