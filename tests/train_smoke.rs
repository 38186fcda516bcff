//! A short training run on the real Fashion-MNIST data: the loss must fall. CI installs the
//! data (`apt-get install dataset-fashion-mnist`); elsewhere the test says it was skipped.

#[allow(dead_code)] // this target uses part of the shared example code
#[path = "../examples/mnist/train.rs"]
mod mnist;

use mnist::{ModelKind, TrainConfig, train};
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

#[test]
fn mlp_loss_falls_in_one_short_epoch() {
    let Some(d) = data() else { return };
    let cfg = TrainConfig {
        model: ModelKind::Mlp,
        epochs: 1,
        batch_size: 64,
        subset: Some(3000),
        ..TrainConfig::default()
    };
    let (_, report) = train(&cfg, &d.train, &d.test, &Device::cpu(), |_, _, _, _| {}).unwrap();
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
    let cfg = TrainConfig {
        model: ModelKind::Cnn,
        epochs: 1,
        batch_size: 32,
        subset: Some(640),
        ..TrainConfig::default()
    };
    let (_, report) = train(&cfg, &d.train, &d.test, &Device::cpu(), |_, _, _, _| {}).unwrap();
    let l = &report.losses;
    assert!(
        mean(&l[l.len() - 5..]) < 0.8 * mean(&l[..5]),
        "losses {l:?}"
    );
}
