//! Autograd on elementwise ops: gradients against central finite differences, accumulation,
//! no_grad, retain_graph and in-place detection.

use crate::common::{cpu, pjrt, pjrt_at};
use tpu_ops::autograd::grad_of;
use tpu_ops::prelude::*;
use tpu_tensor::{DType, Device, Tensor};

#[test]
fn chain_rule_through_elementwise_ops() {
    let x = Tensor::new([0.3f64, -1.2, 2.0], &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    // y = sum over elements of tanh(x) * x + exp(x) / 2, written elementwise then added up.
    let y = x
        .tanh()
        .unwrap()
        .mul(&x)
        .unwrap()
        .add(&x.exp().unwrap().div(2.0).unwrap())
        .unwrap();
    let g = Tensor::ones([3], DType::F64, &cpu()).unwrap();
    y.backward_with(Some(&g), false).unwrap();
    let got = x.grad().unwrap().to_vec::<f64>().unwrap();
    let xs = [0.3f64, -1.2, 2.0];
    for (i, v) in xs.iter().enumerate() {
        let want = (1.0 - v.tanh().powi(2)) * v + v.tanh() + v.exp() / 2.0;
        assert!((got[i] - want).abs() < 1e-12, "{} vs {}", got[i], want);
    }
    // A second backward accumulates; zero_grad clears.
    let y2 = x.mul(3.0).unwrap();
    y2.backward_with(Some(&g), false).unwrap();
    assert!((x.grad().unwrap().to_vec::<f64>().unwrap()[0] - (got[0] + 3.0)).abs() < 1e-12);
    x.zero_grad();
    assert!(x.grad().is_none());
}

#[test]
fn no_grad_retain_graph_and_in_place_errors() {
    let x = Tensor::new([1.5f32, 2.5], &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    {
        let _g = no_grad();
        let y = x.mul(2.0).unwrap();
        assert!(!y.requires_grad());
    }
    let y = x.square().unwrap();
    assert!(y.requires_grad() && !y.is_leaf() && x.is_leaf());
    let g = Tensor::ones([2], DType::F32, &cpu()).unwrap();
    y.backward_with(Some(&g), true).unwrap();
    y.backward_with(Some(&g), false).unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), [6.0, 10.0]);
    let e = y.backward_with(Some(&g), false).unwrap_err().to_string();
    assert!(e.contains("retain_graph"), "{e}");
    // Changing a saved input in place is detected.
    let a = Tensor::new([1.0f32, 2.0], &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let b = Tensor::new([3.0f32, 4.0], &cpu()).unwrap();
    let p = a.mul(&b).unwrap();
    b.fill_(0.0).unwrap();
    let e = p.backward_with(Some(&g), false).unwrap_err().to_string();
    assert!(e.contains("modified by an in-place operation"), "{e}");
    // Integer tensors cannot require grad; non-scalar outputs need an explicit gradient.
    assert!(
        Tensor::new([1i64], &cpu())
            .unwrap()
            .requires_grad_(true)
            .is_err()
    );
    let q = x.mul(2.0).unwrap();
    assert!(q.backward().is_err());
}

#[test]
fn functional_grad_returns_without_accumulating() {
    let x = Tensor::new([2.0f64], &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let w = Tensor::new([-3.0f64], &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let y = x.mul(&w).unwrap().add(&x.square().unwrap()).unwrap();
    let gs = grad_of(&[&y], &[&x, &w], None, false).unwrap();
    assert_eq!(
        gs[0].as_ref().unwrap().to_vec::<f64>().unwrap(),
        [-3.0 + 4.0]
    );
    assert_eq!(gs[1].as_ref().unwrap().to_vec::<f64>().unwrap(), [2.0]);
    assert!(x.grad().is_none());
}

#[test]
fn backward_runs_on_the_pjrt_device() {
    let Some(dev) = pjrt_at("backward_runs_on_the_pjrt_device", 1) else {
        return;
    };
    let x = Tensor::new([0.5f32, -1.0], &cpu())
        .unwrap()
        .to_device(&dev)
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let y = x.sigmoid().unwrap().mul(&x).unwrap();
    let g = Tensor::ones([2], DType::F32, &dev).unwrap();
    y.backward_with(Some(&g), false).unwrap();
    let gr = x.grad().unwrap();
    assert_eq!(gr.device(), &dev);
    let got = gr.to_vec::<f32>().unwrap();
    for (i, v) in [0.5f32, -1.0].iter().enumerate() {
        let s = 1.0 / (1.0 + (-v).exp());
        let want = s + v * s * (1.0 - s);
        assert!((got[i] - want).abs() < 1e-6);
    }
}

#[test]
fn gradcheck_elementwise_with_broadcasting() {
    use tpu_ops::testing::gradcheck;
    use tpu_tensor::Generator;
    let mut g = Generator::new(3);
    let a = g.randn([3, 4], DType::F64, &cpu()).unwrap();
    let b = g
        .randn([4], DType::F64, &cpu())
        .unwrap()
        .abs()
        .unwrap()
        .add(0.5)
        .unwrap();
    gradcheck(
        "mul/div/exp",
        |x| x[0].mul(&x[1])?.div(&x[1].add(1.0)?)?.exp(),
        &[a.clone(), b.clone()],
        1e-6,
        1e-6,
    )
    .unwrap();
    gradcheck(
        "pow",
        |x| x[1].pow(&x[0].tanh()?),
        &[a.clone(), b.clone()],
        1e-6,
        1e-6,
    )
    .unwrap();
    gradcheck(
        "maximum",
        |x| x[0].maximum(&x[1])?.atan2(&x[1]),
        &[a.clone(), b.clone()],
        1e-6,
        1e-6,
    )
    .unwrap();
    gradcheck(
        "gelu+silu",
        |x| x[0].gelu()?.add(&x[0].silu()?)?.add(&x[0].gelu_tanh()?),
        std::slice::from_ref(&a),
        1e-6,
        1e-6,
    )
    .unwrap();
    // A wrong rule is caught: the check must fail for a deliberately wrong function pairing.
    let wrong = gradcheck(
        "detached",
        |x| x[0].detach().mul(&x[0]),
        std::slice::from_ref(&a),
        1e-6,
        1e-6,
    );
    assert!(wrong.is_err());
}

#[test]
fn gradients_flow_through_views() {
    use tpu_ops::testing::gradcheck;
    use tpu_tensor::Generator;
    let mut g = Generator::new(8);
    let a = g.randn([3, 4], DType::F64, &cpu()).unwrap();
    gradcheck(
        "t",
        |x| x[0].t()?.mul(2.0)?.exp(),
        std::slice::from_ref(&a),
        1e-6,
        1e-6,
    )
    .unwrap();
    gradcheck(
        "reshape",
        |x| x[0].reshape([2, 6])?.tanh(),
        std::slice::from_ref(&a),
        1e-6,
        1e-6,
    )
    .unwrap();
    gradcheck(
        "slice+select",
        |x| x[0].slice(1, 1.., 2)?.select(0, 2)?.square(),
        std::slice::from_ref(&a),
        1e-6,
        1e-6,
    )
    .unwrap();
    gradcheck(
        "expand",
        |x| x[0].narrow(0, 1, 1)?.expand([5, 4])?.sin(),
        std::slice::from_ref(&a),
        1e-6,
        1e-6,
    )
    .unwrap();
    gradcheck(
        "permute of view",
        |x| {
            x[0].unsqueeze(0)?
                .permute([2, 0, 1])?
                .flatten(0, -1)?
                .mul(&x[0].reshape([12])?)
        },
        std::slice::from_ref(&a),
        1e-6,
        1e-6,
    )
    .unwrap();
    // The view gradient on the PJRT device matches the CPU.
    if let Some(dev) = pjrt("gradients_flow_through_views") {
        let run = |d: &Device| {
            let x = a.to_device(d).unwrap().requires_grad_(true).unwrap();
            let y = x.t().unwrap().slice(0, 1.., 2).unwrap().mul(3.0).unwrap();
            let go = Tensor::ones(y.shape(), DType::F64, d).unwrap();
            y.backward_with(Some(&go), false).unwrap();
            x.grad()
                .unwrap()
                .to_device(&cpu())
                .unwrap()
                .to_vec::<f64>()
                .unwrap()
        };
        assert_eq!(run(&cpu()), run(&dev));
    }
}
