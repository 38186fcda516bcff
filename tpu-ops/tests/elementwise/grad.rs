//! Gradient checks of every differentiable elementwise op against central finite differences
//! (f64), with broadcasting for the binary ones.

use crate::common::cpu;
use crate::common::test_device;
use proptest::prelude::*;
use tpu_ops::OpDef;
use tpu_ops::ops::elementwise::binary::{Binary, BinaryKind, binary};
use tpu_ops::ops::elementwise::unary::{Unary, UnaryKind, unary};
use tpu_ops::prelude::*;
use tpu_ops::testing::gradcheck;
use tpu_tensor::{DType, Device, Generator, Tensor};

/// Inputs inside each function's domain, away from its kinks and jumps.
fn input_for(kind: UnaryKind, shape: &[usize], seed: u64) -> Tensor {
    let x = Generator::new(seed)
        .randn(shape, DType::F64, &cpu())
        .unwrap();
    match kind {
        UnaryKind::Log
        | UnaryKind::Log2
        | UnaryKind::Log10
        | UnaryKind::Sqrt
        | UnaryKind::Rsqrt
        | UnaryKind::Log1p
        | UnaryKind::Reciprocal => x.abs().unwrap().add(0.5).unwrap(),
        UnaryKind::Tan => x.mul(0.4).unwrap(),
        // Inside (-1, 1), clear of the poles at ±1.
        UnaryKind::Asin | UnaryKind::Acos | UnaryKind::Atanh => x.tanh().unwrap().mul(0.8).unwrap(),
        UnaryKind::Acosh => x.abs().unwrap().add(1.5).unwrap(),
        // Keep clear of 0 and of the clamp bounds, where the derivative jumps.
        UnaryKind::Abs | UnaryKind::Relu | UnaryKind::LeakyRelu(_) | UnaryKind::Clamp { .. } => {
            let s = x.sign().unwrap();
            x.abs()
                .unwrap()
                .add(0.05)
                .unwrap()
                .mul(&s)
                .unwrap()
                .mul(0.7)
                .unwrap()
        }
        _ => x.mul(1.5).unwrap(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn unary_gradients(shape in proptest::collection::vec(1usize..4, 1..3), seed in 0u64..500) {
        for kind in UnaryKind::all() {
            if !Unary(kind).has_backward() {
                continue;
            }
            let x = input_for(kind, &shape, seed);
            let r = gradcheck(&format!("{kind:?}"), |t| unary(&t[0], kind), &[x], 1e-6, 1e-5);
            prop_assert!(r.is_ok(), "{:?}", r.err());
        }
    }

    #[test]
    fn binary_gradients_with_broadcasting(
        shape in proptest::collection::vec(1usize..4, 1..3),
        seed in 0u64..500,
        broadcast in any::<bool>(),
    ) {
        let mut g = Generator::new(seed);
        let a = g.randn(&shape, DType::F64, &cpu()).unwrap();
        let bshape: Vec<usize> = if broadcast { shape[shape.len() - 1..].to_vec() } else { shape.clone() };
        // Positive, away from a: keeps pow, div and remainder smooth and max/min untied.
        let b = g.rand(&bshape, DType::F64, &cpu()).unwrap().add(0.75).unwrap();
        for kind in BinaryKind::all() {
            if !(Binary { kind, numbers: [false, false] }).has_backward() {
                continue;
            }
            let (a, b) = match kind {
                BinaryKind::Pow => (a.abs().unwrap().add(0.5).unwrap(), b.clone()),
                BinaryKind::Remainder | BinaryKind::Fmod => (a.mul(0.3).unwrap().add(0.1).unwrap().abs().unwrap(), b.add(1.0).unwrap()),
                _ => (a.clone(), b.clone()),
            };
            let r = gradcheck(&format!("{kind:?}"), |t| binary(&t[0], &t[1], kind), &[a, b], 1e-6, 1e-5);
            prop_assert!(r.is_ok(), "{:?}", r.err());
        }
        // where: gradients reach both branches.
        let c = g.randint(0, 2, &shape, DType::Bool, &cpu()).unwrap();
        let r = gradcheck("where", |t| tpu_ops::where_(&c, &t[0], &t[1]), &[a.clone(), g.randn(&bshape, DType::F64, &cpu()).unwrap()], 1e-6, 1e-6);
        prop_assert!(r.is_ok(), "{:?}", r.err());
        // A cast to f32 and back passes gradients through.
        let r = gradcheck("to(f32)", |t| t[0].to(DType::F32)?.mul(2.0)?.to(DType::F64), std::slice::from_ref(&a), 1e-3, 1e-4);
        prop_assert!(r.is_ok(), "{:?}", r.err());
    }
}

// ---- values from PyTorch, on both devices ------------------------------------------------------

fn f32s(v: &[f64], dev: &Device) -> Tensor {
    let n = v.len();
    let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    Tensor::from_vec(v, [n], &cpu())
        .unwrap()
        .to_device(dev)
        .unwrap()
}

fn host(t: &Tensor) -> Vec<f64> {
    tpu_ops::testing::host_f64(t).unwrap()
}

/// The gradients of `f(inputs)` with respect to each input, for an output gradient filled
/// with `go`.
fn grads(
    f: &dyn Fn(&[Tensor]) -> tpu_tensor::Result<Tensor>,
    inputs: &[Tensor],
    go: f64,
) -> Vec<Vec<f64>> {
    let leaves: Vec<Tensor> = inputs
        .iter()
        .map(|t| t.detach().requires_grad_(true).unwrap())
        .collect();
    let y = f(&leaves).unwrap();
    let g = Tensor::full(y.shape(), go, y.dtype(), y.device()).unwrap();
    let refs: Vec<&Tensor> = leaves.iter().collect();
    tpu_ops::autograd::grad_of(&[&y], &refs, Some(&[&g]), false)
        .unwrap()
        .iter()
        .map(|g| host(g.as_ref().expect("a gradient")))
        .collect()
}

/// Equal, NaN matching NaN, within f32 rounding.
fn same(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 1e-6 * w.abs();
        assert!(ok, "{what}: element {i} is {g}, PyTorch gives {w}");
    }
}

test_device!(
    /// Backward rules that zero the gradient where the op is flat select the zeros (PyTorch's
    /// `where`), so a NaN output gradient does not leak into them; abs multiplies by the sign in
    /// PyTorch too, so it leaks there as well:
    ///
    /// ```python
    /// nan, inf = float('nan'), float('inf')
    /// def g(f, x, go):
    ///     x = torch.tensor(x, requires_grad=True); y = f(x)
    ///     y.backward(torch.full_like(y, go)); return x.grad
    /// g(torch.relu, [-1., 0., 2.], nan)                                 # [0, 0, nan]
    /// g(torch.relu, [nan, -0., 0., 1., -inf, inf], 1.)                 # [1, 0, 0, 1, 0, 1]
    /// g(lambda x: x.clamp(-1, 1), [-2., 0., 2.], nan)                   # [0, nan, 0]
    /// g(lambda x: x.clamp(-1, 1), [nan, -1., 1., 2., -inf, inf], 1.)    # [0, 0, 0, 0, 0, 0]
    /// g(lambda x: x.clamp(min=-1), [nan, -1., 1., 2., -inf, inf], 1.)  # [0, 0, 1, 1, 0, 1]
    /// g(lambda x: x.clamp(max=1), [nan, -1., 1., 2., -inf, inf], 1.)   # [0, 1, 0, 0, 1, 0]
    /// g(torch.abs, [-2., 0., 2.], nan)                                  # [nan, nan, nan]
    /// g(lambda x: torch.maximum(x, torch.zeros(3)), [-2., 0., 2.], nan) # [0, nan, nan]
    /// ```
    masked_gradients_do_not_leak_nan_like_pytorch,
    |dev| {
        let (nan, inf) = (f64::NAN, f64::INFINITY);
        let specials = [nan, -0.0, 0.0, 1.0, -inf, inf];
        let bounds = [nan, -1.0, 1.0, 2.0, -inf, inf];
        type F = Box<dyn Fn(&[Tensor]) -> tpu_tensor::Result<Tensor>>;
        // What, the op, the input, the output gradient, PyTorch's input gradient.
        type Case = (&'static str, F, Vec<f64>, f64, Vec<f64>);
        let cases: Vec<Case> = vec![
            (
                "relu",
                Box::new(|t| t[0].relu()),
                vec![-1.0, 0.0, 2.0],
                nan,
                vec![0.0, 0.0, nan],
            ),
            (
                "relu",
                Box::new(|t| t[0].relu()),
                specials.to_vec(),
                1.0,
                vec![1.0, 0.0, 0.0, 1.0, 0.0, 1.0],
            ),
            (
                "clamp",
                Box::new(|t| t[0].clamp(Some(-1.0), Some(1.0))),
                vec![-2.0, 0.0, 2.0],
                nan,
                vec![0.0, nan, 0.0],
            ),
            (
                "clamp",
                Box::new(|t| t[0].clamp(Some(-1.0), Some(1.0))),
                bounds.to_vec(),
                1.0,
                vec![0.0; 6],
            ),
            (
                "clamp min",
                Box::new(|t| t[0].clamp(Some(-1.0), None)),
                bounds.to_vec(),
                1.0,
                vec![0.0, 0.0, 1.0, 1.0, 0.0, 1.0],
            ),
            (
                "clamp max",
                Box::new(|t| t[0].clamp(None, Some(1.0))),
                bounds.to_vec(),
                1.0,
                vec![0.0, 1.0, 0.0, 0.0, 1.0, 0.0],
            ),
            (
                "abs",
                Box::new(|t| t[0].abs()),
                vec![-2.0, 0.0, 2.0],
                nan,
                vec![nan; 3],
            ),
            (
                "maximum",
                Box::new(|t| t[0].maximum(&t[0].zeros_like()?)),
                vec![-2.0, 0.0, 2.0],
                nan,
                vec![0.0, nan, nan],
            ),
        ];
        for (what, f, x, go, want) in &cases {
            let got = grads(f, &[f32s(x, &dev)], *go);
            same(&format!("{what} on {dev:?}"), &got[0], want);
        }
    }
);

test_device!(
    /// pow's gradients at a zero base, with a tensor exponent, a number exponent and a number
    /// base:
    ///
    /// ```python
    /// x = torch.tensor([0., 0., 0., 2., -1.], requires_grad=True)
    /// e = torch.tensor([0., 1., -1., 0., 0.5], requires_grad=True)
    /// x.pow(e).sum().backward()
    /// x.grad  # [0, 1, -inf, 0, nan]
    /// e.grad  # [0, 0, -inf, 0.6931471824645996, nan]
    /// x = torch.tensor([0., 2.], requires_grad=True); e = torch.tensor([0., 0.], requires_grad=True)
    /// x.pow(e).backward(torch.tensor([nan, nan]))
    /// x.grad, e.grad  # [0, 0], [nan, nan]
    /// e = torch.tensor([0., 1., -1.], requires_grad=True); torch.pow(0., e).sum().backward()
    /// e.grad  # [0, 0, -inf]
    /// for p in [0., 0.5, -1.]:
    ///     x = torch.tensor([0., 2., -1.], requires_grad=True); x.pow(p).sum().backward()
    /// # x.grad: [0, 0, 0]; [inf, 0.3535533845424652, nan]; [-inf, -0.25, -1]
    /// ```
    pow_gradients_at_zero_match_pytorch,
    |dev| {
        let (nan, inf) = (f64::NAN, f64::INFINITY);
        let x = f32s(&[0.0, 0.0, 0.0, 2.0, -1.0], &dev);
        let e = f32s(&[0.0, 1.0, -1.0, 0.0, 0.5], &dev);
        let g = grads(&|t| t[0].pow(&t[1]), &[x, e], 1.0);
        same("pow: base", &g[0], &[0.0, 1.0, -inf, 0.0, nan]);
        same(
            "pow: exponent",
            &g[1],
            &[0.0, 0.0, -inf, 0.6931471824645996, nan],
        );
        let g = grads(
            &|t| t[0].pow(&t[1]),
            &[f32s(&[0.0, 2.0], &dev), f32s(&[0.0, 0.0], &dev)],
            nan,
        );
        same("pow with a NaN gradient: base", &g[0], &[0.0, 0.0]);
        same("pow with a NaN gradient: exponent", &g[1], &[nan, nan]);
        let g = grads(&|t| t[0].rpow(0.0), &[f32s(&[0.0, 1.0, -1.0], &dev)], 1.0);
        same("a zero number to a tensor power", &g[0], &[0.0, 0.0, -inf]);
        let x = f32s(&[0.0, 2.0, -1.0], &dev);
        for (p, want) in [
            (0.0, vec![0.0, 0.0, 0.0]),
            (0.5, vec![inf, 0.3535533845424652, nan]),
            (-1.0, vec![-inf, -0.25, -1.0]),
        ] {
            let g = grads(&|t| t[0].pow_scalar(p), std::slice::from_ref(&x), 1.0);
            same(&format!("pow_scalar({p}) on {dev:?}"), &g[0], &want);
            let g = grads(&|t| t[0].pow(p), std::slice::from_ref(&x), 1.0);
            same(&format!("pow({p}) on {dev:?}"), &g[0], &want);
        }
    }
);

test_device!(
    /// Rounded division and the rounding ops are piecewise constant: their outputs require grad
    /// and backward gives zeros, as PyTorch:
    ///
    /// ```python
    /// a = torch.tensor([3., -3.5], requires_grad=True); b = torch.tensor([2., 2.], requires_grad=True)
    /// torch.div(a, b, rounding_mode='floor').sum().backward()   # a.grad, b.grad: [0, 0], [0, 0]
    /// torch.div(a, b, rounding_mode='trunc').sum().backward()   # [0, 0], [0, 0]
    /// torch.div(a, 2., rounding_mode='floor').sum().backward()  # a.grad [0, 0]
    /// a.round(), a.floor(), a.ceil(), a.trunc(), a.sign()       # requires_grad True, a.grad [0, 0]
    /// ```
    rounded_division_and_rounding_have_zero_gradients,
    |dev| {
        type F = Box<dyn Fn(&[Tensor]) -> tpu_tensor::Result<Tensor>>;
        let two: Vec<(&str, F)> = vec![
            ("div_floor", Box::new(|t| t[0].div_floor(&t[1]))),
            ("div_trunc", Box::new(|t| t[0].div_trunc(&t[1]))),
        ];
        let one: Vec<(&str, F)> = vec![
            ("div_floor by a number", Box::new(|t| t[0].div_floor(2.0))),
            ("div_trunc by a number", Box::new(|t| t[0].div_trunc(2.0))),
            ("round", Box::new(|t| t[0].round())),
            ("floor", Box::new(|t| t[0].floor())),
            ("ceil", Box::new(|t| t[0].ceil())),
            ("trunc", Box::new(|t| t[0].trunc())),
            ("sign", Box::new(|t| t[0].sign())),
        ];
        let (a, b) = (f32s(&[3.0, -3.5], &dev), f32s(&[2.0, 2.0], &dev));
        for (what, f) in &two {
            let g = grads(f, &[a.clone(), b.clone()], 1.0);
            same(&format!("{what} on {dev:?}: a"), &g[0], &[0.0, 0.0]);
            same(&format!("{what} on {dev:?}: b"), &g[1], &[0.0, 0.0]);
        }
        for (what, f) in &one {
            let x = a.detach().requires_grad_(true).unwrap();
            assert!(
                f(std::slice::from_ref(&x)).unwrap().requires_grad(),
                "{what}"
            );
            let g = grads(f, std::slice::from_ref(&a), 1.0);
            same(&format!("{what} on {dev:?}"), &g[0], &[0.0, 0.0]);
        }
    }
);

test_device!(
    /// The gradients of the inverse trigonometric and hyperbolic functions and `log10`, at
    /// PyTorch's values:
    ///
    /// ```python
    /// x = torch.tensor([-0.5, 0.25, 0.75], dtype=torch.float64, requires_grad=True)
    /// torch.autograd.grad(torch.asin(x).sum(), x)   # and acos, atan, sinh, cosh, asinh, atanh
    /// torch.autograd.grad(torch.log10(x.abs()).sum(), x)
    /// xa = torch.tensor([1.5, 2.0, 10.0], dtype=torch.float64, requires_grad=True)
    /// torch.autograd.grad(torch.acosh(xa).sum(), xa)
    /// ```
    inverse_trig_hyperbolic_and_log10_gradients_match_pytorch,
    |dev| {
        let x = [-0.5, 0.25, 0.75];
        type F = Box<dyn Fn(&[Tensor]) -> tpu_tensor::Result<Tensor>>;
        let cases: Vec<(&str, F, [f64; 3], [f64; 3])> = vec![
            ("asin", Box::new(|t| t[0].asin()), x, [1.1547005383792517, 1.0327955589886444, 1.5118578920369088]),
            ("acos", Box::new(|t| t[0].acos()), x, [-1.1547005383792517, -1.0327955589886444, -1.5118578920369088]),
            ("atan", Box::new(|t| t[0].atan()), x, [0.8, 0.9411764705882353, 0.64]),
            ("sinh", Box::new(|t| t[0].sinh()), x, [1.1276259652063807, 1.0314130998795732, 1.2946832846768448]),
            ("cosh", Box::new(|t| t[0].cosh()), x, [-0.5210953054937474, 0.2526123168081683, 0.82231673193583]),
            ("asinh", Box::new(|t| t[0].asinh()), x, [0.8944271909999159, 0.9701425001453319, 0.8]),
            ("atanh", Box::new(|t| t[0].atanh()), x, [1.3333333333333333, 1.0666666666666667, 2.2857142857142856]),
            ("log10", Box::new(|t| t[0].abs()?.log10()), x, [-0.8685889638065035, 1.737177927613007, 0.5790593092043357]),
            ("acosh", Box::new(|t| t[0].acosh()), [1.5, 2.0, 10.0], [0.8944271909999159, 0.5773502691896258, 0.10050378152592121]),
        ];
        for (name, f, x, want) in cases {
            let got = grads(&f, &[f32s(&x, &dev)], 1.0);
            same(&format!("{name} on {dev}"), &got[0], &want.map(|w| w as f32 as f64));
        }
    }
);

test_device!(
    /// The gradients of `leaky_relu` and ATen's `elu` at PyTorch's values (the slope on the
    /// left at 0, the ELU's derivative from its input):
    ///
    /// ```python
    /// x = torch.tensor([-2.0, -0.5, 0.0, 0.75], dtype=torch.float64, requires_grad=True)
    /// torch.autograd.grad(F.leaky_relu(x, 0.2).sum(), x)               # [0.2, 0.2, 0.2, 1.0]
    /// torch.autograd.grad(torch.ops.aten.elu(x, 1.5, 2.0, 0.5).sum(), x)
    /// ```
    leaky_relu_and_elu_gradients_match_pytorch,
    |dev| {
        use tpu_ops::ops::elementwise::unary::UnaryKind;
        let x = [-2.0, -0.5, 0.0, 0.75];
        let elu = UnaryKind::Elu { alpha: 1.5, scale: 2.0, input_scale: 0.5 };
        let got = grads(&|t| t[0].leaky_relu(0.2), &[f32s(&x, &dev)], 1.0);
        same("leaky_relu", &got[0], &[0.2f32 as f64, 0.2f32 as f64, 0.2f32 as f64, 1.0]);
        let got = grads(&|t| unary(&t[0], elu), &[f32s(&x, &dev)], 1.0);
        let want = [0.5518191617571635, 1.1682011746071073, 1.5, 2.0];
        same("elu", &got[0], &want.map(|w: f64| w as f32 as f64));
    }
);

test_device!(
    /// `fmod`'s gradients: the dividend's is the incoming gradient, the divisor's `-g *
    /// trunc(a / b)`:
    ///
    /// ```python
    /// x = torch.tensor([-7.5, 7.5, 2.25], dtype=torch.float64, requires_grad=True)
    /// y = torch.tensor([2.0, -2.0, 0.5], dtype=torch.float64, requires_grad=True)
    /// torch.autograd.grad(torch.fmod(x, y).sum(), [x, y])   # [1, 1, 1], [3, 3, -4]
    /// ```
    fmod_gradients_match_pytorch,
    |dev| {
        let got = grads(
            &|t| t[0].fmod(&t[1]),
            &[f32s(&[-7.5, 7.5, 2.25], &dev), f32s(&[2.0, -2.0, 0.5], &dev)],
            1.0,
        );
        same("fmod dividend", &got[0], &[1.0, 1.0, 1.0]);
        same("fmod divisor", &got[1], &[3.0, 3.0, -4.0]);
    }
);
