//! A short training run on the real Fashion-MNIST data: the loss must fall. CI installs the
//! data (`apt-get install dataset-fashion-mnist`); elsewhere the test says it was skipped.

#[allow(dead_code)] // this target uses part of the shared example code
#[path = "../examples/mnist/train.rs"]
mod mnist;

use mnist::{ModelKind, TrainConfig, TrainReport, train};
use tpu_rs::datasets::{FASHION_MNIST_DIR, FashionMnist};
use tpu_rs::prelude::*;

fn data() -> Option<FashionMnist> {
    match FashionMnist::load(FASHION_MNIST_DIR) {
        Ok(d) => Some(d),
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true but the data set is missing: {e}");
            }
            eprintln!("skipped: Fashion-MNIST training: {e}");
            None
        }
    }
}

fn mean(v: &[f32]) -> f32 {
    v.iter().sum::<f32>() / v.len() as f32
}

/// Trains `model` on `device` for one epoch over the first `subset` training examples.
fn run(
    d: &FashionMnist,
    model: ModelKind,
    batch_size: usize,
    subset: usize,
    device: &Device,
    compile: bool,
) -> TrainReport {
    let cfg = TrainConfig {
        model,
        epochs: 1,
        batch_size,
        subset: Some(subset),
        compile,
        ..TrainConfig::default()
    };
    let (_, report) = train(&cfg, &d.train, &d.test, device, |_, _, _, _| {}).unwrap();
    report
}

/// Trains `model` on the CPU for one epoch over the first `subset` training examples.
fn one_epoch(d: &FashionMnist, model: ModelKind, batch_size: usize, subset: usize) -> TrainReport {
    run(d, model, batch_size, subset, &Device::cpu(), false)
}

#[test]
fn mlp_loss_falls_in_one_short_epoch() {
    let Some(d) = data() else { return };
    let report = one_epoch(&d, ModelKind::Mlp, 64, 3000);
    let l = &report.losses;
    assert_eq!(l.len(), 47);
    assert!(
        mean(&l[l.len() - 8..]) < 0.6 * mean(&l[..8]),
        "losses {l:?}"
    );
    assert!(report.test_accuracy[0] > 0.6, "{:?}", report.test_accuracy);
}

#[test]
fn cnn_loss_falls_on_a_few_batches() {
    let Some(d) = data() else { return };
    let report = one_epoch(&d, ModelKind::Cnn, 32, 640);
    let l = &report.losses;
    assert!(
        mean(&l[l.len() - 5..]) < 0.8 * mean(&l[..5]),
        "losses {l:?}"
    );
}

/// The largest relative difference between the eager and the compiled loop's loss curves.
fn curve_gap(eager: &[f32], compiled: &[f32]) -> f32 {
    assert_eq!(eager.len(), compiled.len());
    eager
        .iter()
        .zip(compiled)
        .map(|(e, c)| (e - c).abs() / e.abs().max(1.0))
        .fold(0.0, f32::max)
}

/// `train_mnist --compile`: the first hundred steps of the compiled loop (forward, loss,
/// backward and Adam with its cosine schedule in one program per step) against the eager
/// loop's. On the native CPU the compiled graph runs the eager kernels: the same bits. Through
/// XLA's CPU plugin the whole-step program is fused and reduces in another order than the
/// op-by-op programs, so the curves agree to rounding (2e-7 measured), within the 1e-5 asked.
/// Batches of 8 keep the debug-build test short.
#[test]
fn the_compiled_training_loop_gives_the_eager_loss_curve() {
    let Some(d) = data() else { return };
    let cpu = Device::cpu();
    let eager = run(&d, ModelKind::Mlp, 8, 800, &cpu, false);
    let compiled = run(&d, ModelKind::Mlp, 8, 800, &cpu, true);
    assert_eq!(eager.losses.len(), 100);
    assert_eq!(eager.losses, compiled.losses);
    assert!(mean(&compiled.losses[92..]) < 0.8 * mean(&compiled.losses[..8]));
    if let Some(c) = tpu_rs::tpu_runtime::pjrt::testing::client_or_skip("compiled MNIST loop") {
        let dev = c.device(0).unwrap();
        // 30 steps: each eager step is dozens of PJRT calls, slow in a debug build.
        let eager = run(&d, ModelKind::Mlp, 8, 240, &dev, false);
        let compiled = run(&d, ModelKind::Mlp, 8, 240, &dev, true);
        assert_eq!(compiled.losses.len(), 30);
        let gap = curve_gap(&eager.losses, &compiled.losses);
        eprintln!("compiled MNIST loop on {dev}: largest relative loss gap {gap:e}");
        assert!(
            gap <= 1e-5,
            "eager {:?}\ncompiled {:?}",
            eager.losses,
            compiled.losses
        );
    }
}
