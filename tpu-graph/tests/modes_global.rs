//! The process-wide fused mode (its own test binary, since it changes how every thread of the
//! process runs ops): unchanged model code runs deferred and gives the strict mode's bits.

use tpu_graph::metrics::fused_metrics_of_this_thread;
use tpu_graph::{ExecMode, set_mode, with_mode};
use tpu_ops::ops::nn::functional::cross_entropy;
use tpu_ops::prelude::*;
use tpu_ops::tpu_tensor::{DType, Device, Generator, Result, Tensor};

/// A training step with an optimizer-style in-place update, written as plain eager code.
fn train(dev: &Device, steps: usize) -> Result<Vec<f32>> {
    let g = |shape: &[usize], seed| Generator::new(seed).randn(shape, DType::F32, dev);
    let w = g(&[4, 6], 1)?.requires_grad_(true)?;
    let x = g(&[5, 6], 2)?;
    let target = Tensor::new([0i64, 3, 1, 2, 3], dev)?;
    let mut losses = Vec::new();
    for _ in 0..steps {
        w.zero_grad();
        let loss = cross_entropy(&x.matmul(&w.t()?)?.tanh()?, &target)?;
        loss.backward()?;
        let grad = w.grad().expect("a gradient");
        let updated = no_grad_update(&w, &grad)?;
        w.detach().copy_(&updated)?;
        losses.push(loss.to_vec::<f32>()?[0]);
    }
    losses.extend(w.to_vec::<f32>()?);
    Ok(losses)
}

fn no_grad_update(w: &Tensor, grad: &Tensor) -> Result<Tensor> {
    let _g = tpu_ops::autograd::no_grad();
    w.detach().sub(&grad.mul(0.5)?)
}

#[test]
fn the_process_wide_fused_mode_runs_unchanged_model_code() {
    assert_eq!("fused".parse::<ExecMode>().unwrap(), ExecMode::Fused);
    assert!("eager-ish".parse::<ExecMode>().is_err());
    let dev = Device::cpu();
    let strict = train(&dev, 3).unwrap();
    set_mode(ExecMode::Fused);
    assert_eq!(tpu_graph::mode::mode(), ExecMode::Fused);
    let before = fused_metrics_of_this_thread();
    let fused = train(&dev, 3).unwrap();
    let after = fused_metrics_of_this_thread();
    assert!(after.flushes > before.flushes, "ops were deferred");
    assert!(
        after.hits > before.hits,
        "later steps reuse the first step's programs"
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&fused), bits(&strict));
    // A strict scope inside the process-wide fused mode runs eagerly.
    let eager = with_mode(ExecMode::Strict, || {
        let y = Tensor::new([1.0f32, 2.0], &dev)?.exp()?;
        Ok(y.storage().is_pending())
    })
    .unwrap();
    assert!(!eager);
    // Compiled functions trace their ops as usual (the trace's hook is innermost).
    let f = tpu_graph::compile(|a: &[Tensor]| Ok(vec![a[0].exp()?.add(&a[0])?]));
    for v in [1.0f32, 2.0] {
        let x = Tensor::new([v, -v], &dev).unwrap();
        let want: Vec<f32> = [v, -v].iter().map(|t| t.exp() + t).collect();
        let got = f.call(&[x]).unwrap()[0].to_vec::<f32>().unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
                "{got:?} vs {want:?}"
            );
        }
    }
    set_mode(ExecMode::Strict);
    let y = Tensor::new([1.0f32, 2.0], &dev).unwrap().exp().unwrap();
    assert!(!y.storage().is_pending());
}
