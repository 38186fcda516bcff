//! One eager training step of the MLP 784-1024-1024-10 (batch 128, f32, SGD, cross-entropy) on
//! the native CPU device: forward, backward and the parameter update.
//!
//! `TPU_RS_NUM_THREADS=2 cargo bench --bench train_step`; `benches/train_step_torch.py` runs the
//! same step in PyTorch eager for comparison (see benches/README.md).

#[allow(dead_code)] // this target uses part of the shared example code
#[path = "../examples/mnist/train.rs"]
mod mnist;

use criterion::{Criterion, criterion_group, criterion_main};
use mnist::{ModelKind, build_model};
use tpu_rs::optim::Sgd;
use tpu_rs::prelude::*;

fn bench(c: &mut Criterion) {
    let device = Device::cpu();
    let model = build_model(ModelKind::Mlp, &device, 0).unwrap();
    let mut opt = Sgd::new(model.parameters(), 0.01);
    let mut g = Generator::new(1);
    let x = g.randn([128, 784], DType::F32, &device).unwrap();
    let y = g.randint(0, 10, [128], DType::I64, &device).unwrap();
    let mut step = || {
        opt.zero_grad();
        let loss = F::cross_entropy(&model.forward(&x).unwrap(), &y).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        loss
    };
    // Warm the caches and check that the step learns at all.
    let first = step().to_scalar::<f32>().unwrap();
    for _ in 0..5 {
        step();
    }
    let later = step().to_scalar::<f32>().unwrap();
    assert!(later < first, "the loss did not fall: {first} -> {later}");
    c.bench_function("train_step/mlp_784_1024_1024_10_b128_f32_sgd", |b| {
        b.iter(&mut step)
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
