//! Optimizer steps against PyTorch's, and state round trips.

// Literals are copied exactly as PyTorch prints them.
#![allow(clippy::excessive_precision)]

use crate::common::{cpu, pjrt_at};
use tpu_ops::autograd::set_grad;
use tpu_ops::optim::{Adam, CosineDecay, LinearWarmup, LrSchedule, Optimizer, Sgd, StepDecay};
use tpu_ops::prelude::*;
use tpu_tensor::{Device, Tensor};

/// Runs three steps of `make`'s optimizer on the loss
/// `sum(p * p * c) + (k + 1) * sum(p)` whose gradient is `2 p c + (k + 1)`.
fn run(make: impl Fn(Vec<Tensor>) -> Box<dyn Optimizer>) -> Vec<f64> {
    let p = Tensor::new([[0.5f64, -1.0], [2.0, 0.3]], &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let c = Tensor::new([[1.0f64, 2.0], [0.5, -1.5]], &cpu()).unwrap();
    let mut opt = make(vec![p.clone()]);
    for k in 0..3 {
        opt.zero_grad();
        let g = p
            .detach()
            .mul(&c)
            .unwrap()
            .mul(2.0)
            .unwrap()
            .add((k + 1) as f64)
            .unwrap();
        set_grad(&p, Some(g)).unwrap();
        opt.step().unwrap();
    }
    p.to_vec::<f64>().unwrap()
}

fn close(got: &[f64], want: &[f64]) {
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
    }
}

// The reference values come from:
// def run(make, steps=3):
//     p = torch.tensor([[0.5, -1.0], [2.0, 0.3]], dtype=torch.float64, requires_grad=True)
//     opt = make([p])
//     for k in range(steps):
//         opt.zero_grad()
//         loss = (p * p * torch.tensor([[1.0, 2.0], [0.5, -1.5]], dtype=torch.float64)).sum() + (k + 1) * p.sum()
//         loss.backward(); opt.step()
//     return p.detach().flatten().tolist()

#[test]
fn sgd_matches_pytorch() {
    // run(lambda ps: torch.optim.SGD(ps, lr=0.1))
    close(
        &run(|p| Box::new(Sgd::new(p, 0.1))),
        &[-0.268, -0.672, 0.8969999999999998, -0.06990000000000006],
    );
    // Momentum 0.9 and weight decay 0.01, with the dampening and nesterov of each row:
    // run(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01))
    // run(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01))
    let momentum_cases = [
        (
            0.1,
            false,
            [
                -0.7374692094050002,
                -0.18855933818999995,
                0.17706909137999974,
                -0.14378800354300014,
            ],
        ),
        (
            0.0,
            true,
            [
                -1.1873247930295001,
                -0.4302163562410001,
                -0.6422457190180004,
                -0.5909921426277002,
            ],
        ),
    ];
    for (dampening, nesterov, want) in momentum_cases {
        let make = |p| -> Box<dyn Optimizer> {
            let sgd = Sgd::new(p, 0.1).with_momentum(0.9, dampening, nesterov);
            Box::new(sgd.unwrap().with_weight_decay(0.01))
        };
        close(&run(make), &want);
    }
    assert!(Sgd::new(vec![], 0.1).with_momentum(0.0, 0.0, true).is_err());
}

#[test]
fn adam_and_adamw_match_pytorch() {
    // run(lambda ps: torch.optim.Adam(ps, lr=0.1, weight_decay=0.01))
    close(
        &run(|p| Box::new(Adam::new(p, 0.1).with((0.9, 0.999), 1e-8, 0.01))),
        &[
            0.2011727864838738,
            -0.7288610901676261,
            1.7003022819056754,
            0.0357470338017047,
        ],
    );
    // run(lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1))
    close(
        &run(|p| Box::new(Adam::adamw(p, 0.1).with((0.9, 0.999), 1e-8, 0.1))),
        &[
            0.18927754087030046,
            -0.7041936979082519,
            1.6438571428975164,
            0.029826297839501248,
        ],
    );
    // run(lambda ps: torch.optim.Adam(ps, lr=0.05, betas=(0.8, 0.9), eps=1e-6))
    close(
        &run(|p| Box::new(Adam::new(p, 0.05).with((0.8, 0.9), 1e-6, 0.0))),
        &[
            0.35060311768977365,
            -0.861076709520406,
            1.8500628026900083,
            0.16569495654872982,
        ],
    );
}

#[test]
fn state_round_trips_through_safetensors() {
    let dir = std::env::temp_dir().join(format!("tpu-rs-optim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("adam.safetensors");
    let make = |p: &Tensor| Adam::adamw(vec![p.clone()], 0.1);
    let p1 = Tensor::new([1.0f64, -2.0], &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let p2 = Tensor::new([1.0f64, -2.0], &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let mut a = make(&p1);
    let g = Tensor::new([0.5f64, 0.25], &cpu()).unwrap();
    for _ in 0..2 {
        set_grad(&p1, Some(g.clone())).unwrap();
        a.step().unwrap();
    }
    a.save(&path).unwrap();
    // A fresh optimizer on a parameter with the same values resumes exactly.
    {
        // A leaf that requires grad is written under no_grad, as in PyTorch.
        let _g = no_grad();
        p2.copy_(&p1).unwrap();
    }
    let mut b = make(&p2);
    b.load(&path, &cpu()).unwrap();
    set_grad(&p1, Some(g.clone())).unwrap();
    set_grad(&p2, Some(g.clone())).unwrap();
    a.step().unwrap();
    b.step().unwrap();
    assert_eq!(p1.to_vec::<f64>().unwrap(), p2.to_vec::<f64>().unwrap());
    // Wrong shapes are refused.
    let p3 = Tensor::new([1.0f64, 2.0, 3.0], &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let e = make(&p3).load(&path, &cpu()).err().unwrap().to_string();
    assert!(e.contains("expected shape [3]"), "{e}");
}

#[test]
fn schedules() {
    let w = LinearWarmup {
        base_lr: 1.0,
        warmup: 4,
    };
    assert_eq!((w.lr_at(0), w.lr_at(3), w.lr_at(10)), (0.25, 1.0, 1.0));
    let c = CosineDecay {
        base_lr: 1.0,
        min_lr: 0.1,
        warmup: 2,
        total: 12,
    };
    assert_eq!(c.lr_at(0), 0.5);
    assert!((c.lr_at(2) - 1.0).abs() < 1e-12);
    assert!((c.lr_at(7) - 0.55).abs() < 1e-12);
    assert!((c.lr_at(12) - 0.1).abs() < 1e-12);
    let s = StepDecay {
        base_lr: 1.0,
        step_size: 3,
        gamma: 0.5,
    };
    assert_eq!((s.lr_at(2), s.lr_at(3), s.lr_at(7)), (1.0, 0.5, 0.25));
    let mut opt = Sgd::new(vec![], 0.1);
    c.apply(&mut opt, 7).unwrap();
    assert!((opt.lr() - 0.55).abs() < 1e-12);
}

#[test]
fn clip_grad_norm_matches_pytorch() {
    use tpu_ops::optim::clip_grad_norm;
    let a = Tensor::new([[3.0f32, -4.0]], &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let b = Tensor::new([12.0f32], &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let set = || {
        set_grad(&a, Some(Tensor::new([[3.0f32, -4.0]], &cpu()).unwrap())).unwrap();
        set_grad(&b, Some(Tensor::new([12.0f32], &cpu()).unwrap())).unwrap();
    };
    // n = torch.nn.utils.clip_grad_norm_([a, b], 6.5) -> 13.0, a.grad [[1.4999998807907104, -1.9999998807907104]], b.grad [5.999999523162842]
    set();
    let n = clip_grad_norm(&[a.clone(), b.clone()], 6.5, 2.0).unwrap();
    assert!((n - 13.0).abs() < 1e-5);
    let ga = a.grad().unwrap().to_vec::<f32>().unwrap();
    assert!((ga[0] - 1.4999998807907104).abs() < 1e-6 && (ga[1] + 1.9999998807907104).abs() < 1e-6);
    assert!((b.grad().unwrap().to_vec::<f32>().unwrap()[0] - 5.999999523162842).abs() < 1e-6);
    // clip_grad_norm_([a, b], 2.0, norm_type=inf) -> 12.0, a.grad [[0.49999997, -0.66666663]], b.grad [1.9999999]
    set();
    let n = clip_grad_norm(&[a.clone(), b.clone()], 2.0, f64::INFINITY).unwrap();
    assert!((n - 12.0).abs() < 1e-5);
    let ga = a.grad().unwrap().to_vec::<f32>().unwrap();
    assert!((ga[0] - 0.4999999701976776).abs() < 1e-6 && (ga[1] + 0.6666666269302368).abs() < 1e-6);
    // Below the limit nothing changes.
    set();
    clip_grad_norm(&[a.clone(), b.clone()], 100.0, 2.0).unwrap();
    assert_eq!(b.grad().unwrap().to_vec::<f32>().unwrap(), [12.0]);
}

#[test]
fn optimizers_step_on_a_pjrt_device_as_on_the_cpu() {
    let Some(dev) = pjrt_at("optimizers_step_on_a_pjrt_device_as_on_the_cpu", 2) else {
        return;
    };
    let go = |d: &Device| -> Vec<f32> {
        let p = Tensor::new([[0.5f32, -1.0], [2.0, 0.3]], &cpu())
            .unwrap()
            .to_device(d)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let mut sgd = Sgd::new(vec![p.clone()], 0.1)
            .with_momentum(0.9, 0.0, true)
            .unwrap()
            .with_weight_decay(0.01);
        let mut adam = Adam::adamw(vec![p.clone()], 0.05);
        for k in 0..3 {
            let g = Tensor::new([[1.0f32, -2.0], [0.5, 3.0]], &cpu())
                .unwrap()
                .mul((k + 1) as f64)
                .unwrap()
                .to_device(d)
                .unwrap();
            set_grad(&p, Some(g)).unwrap();
            sgd.step().unwrap();
            adam.step().unwrap();
        }
        assert_eq!(p.device(), d);
        p.to_device(&cpu()).unwrap().to_vec::<f32>().unwrap()
    };
    let (a, b) = (go(&cpu()), go(&dev));
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
    }
}
