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

/// Trains `model` on the CPU for one epoch over the first `subset` training examples.
fn one_epoch(d: &FashionMnist, model: ModelKind, batch_size: usize, subset: usize) -> TrainReport {
    let cfg = TrainConfig {
        model,
        epochs: 1,
        batch_size,
        subset: Some(subset),
        ..TrainConfig::default()
    };
    let (_, report) = train(&cfg, &d.train, &d.test, &Device::cpu(), |_, _, _, _| {}).unwrap();
    report
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
