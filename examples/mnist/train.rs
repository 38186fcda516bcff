//! Training classifiers on Fashion-MNIST: the two models and the loop that
//! `examples/train_mnist.rs` runs, `benches/train_step.rs` times and `tests/train_smoke.rs`
//! exercises (each includes this file as a module: it is example code, not part of the
//! library). The model code is the same on every device; only the `Device` passed in changes.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tpu_rs::datasets::Split;
use tpu_rs::graph::compile;
use tpu_rs::nn::{Activation, Conv2d, Flatten, Init, Linear, MaxPool2d, Mlp, Sequential};
use tpu_rs::ops::conv::{ConvOptions, MaxPoolOptions};
use tpu_rs::optim::{Adam, CosineDecay, Optimizer};
use tpu_rs::prelude::*;

/// Mean and standard deviation of Fashion-MNIST's training pixels (scaled to [0, 1]).
pub const PIXEL_MEAN: f32 = 0.2860;
/// See [`PIXEL_MEAN`].
pub const PIXEL_STD: f32 = 0.3530;

/// Which model to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// 784-1024-1024-10 with ReLU.
    Mlp,
    /// Two 3x3 conv + ReLU + 2x2 max-pool stages (32 and 64 channels), then 3136-128-10.
    Cnn,
}

/// Builds a model with seeded PyTorch-default initialisation.
pub fn build_model(kind: ModelKind, device: &Device, seed: u64) -> Result<Box<dyn Module>> {
    let mut g = Generator::new(seed);
    let mut init = Init::new(device, &mut g);
    Ok(match kind {
        ModelKind::Mlp => Box::new(Mlp::new(
            &[784, 1024, 1024, 10],
            Activation::Relu,
            &mut init,
        )?),
        ModelKind::Cnn => {
            let conv = |i, o, init: &mut Init| {
                Conv2d::new(i, o, [3, 3], ConvOptions::new().padding(1), true, init)
            };
            let pool = || MaxPool2d {
                options: MaxPoolOptions::new(2),
            };
            Box::new(
                Sequential::new()
                    .push(conv(1, 32, &mut init)?)
                    .push(Activation::Relu)
                    .push(pool())
                    .push(conv(32, 64, &mut init)?)
                    .push(Activation::Relu)
                    .push(pool())
                    .push(Flatten::default())
                    .push(Linear::new(64 * 7 * 7, 128, true, &mut init)?)
                    .push(Activation::Relu)
                    .push(Linear::new(128, 10, true, &mut init)?),
            )
        }
    })
}

/// A batch of images (normalised, shaped for `kind`) and their labels, on `device`.
pub fn batch(
    split: &Split,
    indices: &[usize],
    kind: ModelKind,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let px = split.rows * split.cols;
    let mut x = Vec::with_capacity(indices.len() * px);
    let mut y = Vec::with_capacity(indices.len());
    for &i in indices {
        x.extend(
            split.images[i * px..(i + 1) * px]
                .iter()
                .map(|&p| (p as f32 / 255.0 - PIXEL_MEAN) / PIXEL_STD),
        );
        y.push(split.labels[i] as i64);
    }
    let n = indices.len();
    let x = match kind {
        ModelKind::Mlp => Tensor::from_vec(x, [n, px], device)?,
        ModelKind::Cnn => Tensor::from_vec(x, [n, 1, split.rows, split.cols], device)?,
    };
    Ok((x, Tensor::from_vec(y, [n], device)?))
}

/// How to train.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// The model.
    pub model: ModelKind,
    /// Passes over the training data.
    pub epochs: usize,
    /// Examples per step.
    pub batch_size: usize,
    /// Adam's peak learning rate; it decays along a cosine to a tenth of it by the last step.
    pub lr: f64,
    /// Use only the first `n` training examples (and `n / 6` test examples), for quick runs.
    pub subset: Option<usize>,
    /// Seed of initialisation and shuffling.
    pub seed: u64,
    /// Run each training step (forward, loss, backward, Adam's update) as one compiled
    /// program instead of op by op.
    pub compile: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: ModelKind::Mlp,
            epochs: 5,
            batch_size: 128,
            lr: 1e-3,
            subset: None,
            seed: 0,
            compile: false,
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct TrainReport {
    /// Training loss of every step.
    pub losses: Vec<f32>,
    /// Accuracy on the test split after each epoch.
    pub test_accuracy: Vec<f64>,
    /// Training examples per second, per epoch.
    pub throughput: Vec<f64>,
}

/// Fraction of `split` (up to `limit` examples) that `model` classifies correctly.
pub fn accuracy(
    model: &dyn Module,
    split: &Split,
    kind: ModelKind,
    device: &Device,
    limit: usize,
) -> Result<f64> {
    let _g = no_grad();
    let n = split.len().min(limit);
    let mut correct = 0usize;
    for start in (0..n).step_by(1000) {
        let idx: Vec<usize> = (start..(start + 1000).min(n)).collect();
        let (x, y) = batch(split, &idx, kind, device)?;
        let pred = model.forward(&x)?.argmax(Some(1), false)?;
        let hits = pred.eq(&y)?.to(DType::I64)?.sum_all()?;
        correct += hits.to_device(&Device::cpu())?.to_scalar::<i64>()? as usize;
    }
    Ok(correct as f64 / n.max(1) as f64)
}

/// One training step of a classifier, written for eager execution: zero the gradients,
/// forward, cross-entropy against the labels (`a[1]`), backward, update; returns the loss.
pub fn training_step<O: Optimizer + Send + 'static>(
    model: Arc<dyn Module>,
    opt: Arc<Mutex<O>>,
) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Clone + Send + Sync + 'static {
    move |a: &[Tensor]| {
        let mut opt = opt.lock().unwrap_or_else(|e| e.into_inner());
        opt.zero_grad();
        let loss = F::cross_entropy(&model.forward(&a[0])?, &a[1])?;
        loss.backward()?;
        opt.step()?;
        Ok(vec![loss.detach()])
    }
}

/// Trains on `train`, evaluating on `test` after each epoch. `on_step(epoch, step, steps,
/// loss)` reports progress.
pub fn train(
    config: &TrainConfig,
    train: &Split,
    test: &Split,
    device: &Device,
    mut on_step: impl FnMut(usize, usize, usize, f32),
) -> Result<(Arc<dyn Module>, TrainReport)> {
    if config.batch_size == 0 {
        return Err(Error::invalid_argument(
            "train",
            "batch size must be at least 1",
        ));
    }
    let model: Arc<dyn Module> = build_model(config.model, device, config.seed)?.into();
    let opt = Arc::new(Mutex::new(Adam::new(model.parameters(), config.lr)));
    // `compile` turns the eager step into one program per batch shape (the last, smaller
    // batch compiles a second one, and says so).
    let step_fn = training_step(model.clone(), opt.clone());
    let compiled = config.compile.then(|| compile(step_fn.clone()));
    let n = config.subset.map_or(train.len(), |s| s.min(train.len()));
    let test_n = config
        .subset
        .map_or(test.len(), |s| (s / 6).clamp(1, test.len()));
    let mut order: Vec<usize> = (0..n).collect();
    let mut g = Generator::new(config.seed ^ 0x5eed);
    let mut report = TrainReport::default();
    let steps = n.div_ceil(config.batch_size);
    let schedule = CosineDecay {
        base_lr: config.lr,
        min_lr: config.lr * 0.1,
        warmup: 0,
        total: (steps * config.epochs) as u64,
    };
    let mut global_step = 0u64;
    for epoch in 0..config.epochs {
        // Fisher-Yates with the seeded generator: the same order on every machine.
        for i in (1..order.len()).rev() {
            let j = (g.next_u64() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        let t0 = Instant::now();
        for (step, chunk) in order.chunks(config.batch_size).enumerate() {
            let (x, y) = batch(train, chunk, config.model, device)?;
            schedule.apply(
                &mut *opt.lock().unwrap_or_else(|e| e.into_inner()),
                global_step,
            )?;
            global_step += 1;
            let args = [x, y];
            let out = match &compiled {
                Some(f) => f.call(&args)?,
                None => step_fn(&args)?,
            };
            let loss = &out[0];
            let l = loss.to_device(&Device::cpu())?.to_scalar::<f32>()?;
            report.losses.push(l);
            on_step(epoch, step, steps, l);
        }
        report
            .throughput
            .push(n as f64 / t0.elapsed().as_secs_f64());
        report.test_accuracy.push(accuracy(
            model.as_ref(),
            test,
            config.model,
            device,
            test_n,
        )?);
    }
    Ok((model, report))
}
