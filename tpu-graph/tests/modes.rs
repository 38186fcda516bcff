//! Execution modes: one model's code (forward, loss, backward) gives the same values in strict,
//! blocking and fused mode, on the native CPU (the same bits) and as PJRT programs (within f32
//! rounding); the fused mode defers until a value is read, caches its programs, flushes at its
//! node limit, and reports a deferred op's error where the graph runs.

use tpu_graph::metrics::fused_metrics_of_this_thread;
use tpu_graph::{ExecMode, with_mode};
use tpu_ops::ops::conv::{ConvOptions, MaxPoolOptions};
use tpu_ops::ops::linalg::linear;
use tpu_ops::ops::nn::functional::cross_entropy;
use tpu_ops::prelude::*;
use tpu_ops::tpu_tensor::{DType, Device, Generator, Result, Tensor};

const MODES: [ExecMode; 3] = [ExecMode::Strict, ExecMode::Blocking, ExecMode::Fused];

fn randn(shape: &[usize], seed: u64, dev: &Device) -> Tensor {
    Generator::new(seed).randn(shape, DType::F32, dev).unwrap()
}

fn pjrt() -> Option<Device> {
    tpu_ops::testing::pjrt_device("tpu-graph modes")
}

/// An MLP's loss and the gradients of its weights and biases: plain eager model code.
fn mlp(dev: &Device) -> Result<Vec<Vec<f32>>> {
    let w1 = randn(&[16, 8], 1, dev).requires_grad_(true)?;
    let b1 = randn(&[16], 2, dev).requires_grad_(true)?;
    let w2 = randn(&[4, 16], 3, dev).requires_grad_(true)?;
    let x = randn(&[6, 8], 4, dev);
    let target = Tensor::new([0i64, 3, 1, 2, 3, 0], dev)?;
    let h = linear(&x, &w1, Some(&b1))?.relu()?;
    let logits = h.matmul(&w2.t()?)?;
    let loss = cross_entropy(&logits, &target)?;
    loss.backward()?;
    let mut out = vec![loss.to_vec::<f32>()?];
    for p in [&w1, &b1, &w2] {
        out.push(p.grad().expect("a gradient").to_vec::<f32>()?);
    }
    Ok(out)
}

/// A small CNN's logits and the gradient of its convolution's weight.
fn cnn(dev: &Device) -> Result<Vec<Vec<f32>>> {
    let x = randn(&[2, 3, 8, 8], 5, dev);
    let wc = randn(&[4, 3, 3, 3], 6, dev).requires_grad_(true)?;
    let bc = randn(&[4], 7, dev);
    let wl = randn(&[5, 16], 8, dev).requires_grad_(true)?;
    let y = x
        .conv2d(&wc, Some(&bc), &ConvOptions::new().padding(1))?
        .relu()?
        .max_pool2d(&MaxPoolOptions::new(2))?
        .max_pool2d(&MaxPoolOptions::new(2))?;
    let y = y.reshape([2, 16])?;
    let logits = linear(&y, &wl, None)?;
    logits.sum_all()?.backward()?;
    Ok(vec![
        logits.to_vec::<f32>()?,
        wc.grad().expect("a gradient").to_vec::<f32>()?,
        wl.grad().expect("a gradient").to_vec::<f32>()?,
    ])
}

fn in_each_mode(
    model: fn(&Device) -> Result<Vec<Vec<f32>>>,
    dev: &Device,
) -> Vec<(ExecMode, Vec<Vec<f32>>)> {
    MODES
        .iter()
        .map(|&m| {
            let before = fused_metrics_of_this_thread();
            let out = with_mode(m, || model(dev)).unwrap();
            let after = fused_metrics_of_this_thread();
            let (flushes, nodes) = (
                after.flushes - before.flushes,
                after.nodes_deferred - before.nodes_deferred,
            );
            if m == ExecMode::Fused {
                // Forward and backward run as one graph, at the first read.
                assert_eq!(flushes, 1, "{m} on {dev}");
                assert!(nodes > 10, "{m} on {dev}: {nodes} ops deferred");
            } else {
                assert_eq!((flushes, nodes), (0, 0), "{m} on {dev}");
            }
            (m, out)
        })
        .collect()
}

fn assert_same_bits(runs: &[(ExecMode, Vec<Vec<f32>>)]) {
    let (_, want) = &runs[0];
    for (m, got) in &runs[1..] {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let gb: Vec<u32> = g.iter().map(|x| x.to_bits()).collect();
            let wb: Vec<u32> = w.iter().map(|x| x.to_bits()).collect();
            assert_eq!(gb, wb, "{m} mode, result {i}");
        }
    }
}

fn assert_near(runs: &[(ExecMode, Vec<Vec<f32>>)], tol: f32) {
    let (_, want) = &runs[0];
    for (m, got) in &runs[1..] {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g.len(), w.len(), "{m} mode, result {i}");
            for (j, (a, b)) in g.iter().zip(w).enumerate() {
                assert!(
                    (a - b).abs() <= tol * (1.0 + b.abs()),
                    "{m} mode, result {i}[{j}]: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn mlp_training_step_agrees_bit_for_bit_in_every_mode_on_cpu() {
    assert_same_bits(&in_each_mode(mlp, &Device::cpu()));
}

#[test]
fn cnn_agrees_bit_for_bit_in_every_mode_on_cpu() {
    assert_same_bits(&in_each_mode(cnn, &Device::cpu()));
}

#[test]
fn mlp_and_cnn_agree_in_every_mode_on_pjrt() {
    let Some(dev) = pjrt() else { return };
    let cpu = mlp(&Device::cpu()).unwrap();
    let mut runs = vec![(ExecMode::Strict, cpu)];
    runs.extend(in_each_mode(mlp, &dev));
    assert_near(&runs, 1e-5);
    let cpu = cnn(&Device::cpu()).unwrap();
    let mut runs = vec![(ExecMode::Strict, cpu)];
    runs.extend(in_each_mode(cnn, &dev));
    assert_near(&runs, 1e-5);
}

/// Several ops, then a read: (flushes before the read, values, flushes after it).
fn step(x: &Tensor, w: &Tensor) -> Result<(u64, Vec<f32>, u64)> {
    let before = fused_metrics_of_this_thread().flushes;
    let y = x.matmul(w)?.relu()?.add(x)?.mul(x)?.sum(&[1], false)?;
    assert_eq!(
        y.storage().is_pending(),
        tpu_graph::mode::mode() == ExecMode::Fused
    );
    let deferred = fused_metrics_of_this_thread().flushes - before;
    let v = y.to_vec::<f32>()?;
    assert!(!y.storage().is_pending());
    Ok((deferred, v, fused_metrics_of_this_thread().flushes - before))
}

#[test]
fn fused_mode_defers_until_a_read_and_caches_the_program() {
    let dev = Device::cpu();
    let x = randn(&[4, 4], 11, &dev);
    let w = randn(&[4, 4], 12, &dev);
    let eager = with_mode(ExecMode::Strict, || step(&x, &w)).unwrap().1;
    let m0 = fused_metrics_of_this_thread();
    let (deferred, first, flushes) = with_mode(ExecMode::Fused, || step(&x, &w)).unwrap();
    assert_eq!(deferred, 0, "nothing ran before the read");
    assert_eq!(flushes, 1, "one flush for the read");
    assert_eq!(first, eager);
    let m1 = fused_metrics_of_this_thread();
    let (_, second, _) = with_mode(ExecMode::Fused, || step(&x, &w)).unwrap();
    assert_eq!(second, eager);
    let m2 = fused_metrics_of_this_thread();
    assert_eq!(m1.nodes_deferred - m0.nodes_deferred, 5);
    assert_eq!(m2.flushes - m1.flushes, 1);
    assert_eq!(m2.hits - m1.hits, 1, "the second iteration hits the cache");
    assert_eq!(m2.compiles - m1.compiles, 0);
}

#[test]
fn fused_mode_flushes_at_its_node_limit() {
    let dev = Device::cpu();
    let x = randn(&[3], 13, &dev);
    let limit = tpu_graph::fused::node_limit();
    let m0 = fused_metrics_of_this_thread();
    let (out, pending) = with_mode(ExecMode::Fused, || {
        let mut y = x.clone();
        for _ in 0..limit + 5 {
            y = y.mul(1.0)?;
        }
        let pending = y.storage().is_pending();
        Ok((y, pending))
    })
    .unwrap();
    let m1 = fused_metrics_of_this_thread();
    assert!(pending, "the last five ops wait for the scope's end");
    assert_eq!(m1.limit_flushes - m0.limit_flushes, 1);
    assert_eq!(
        m1.flushes - m0.flushes,
        2,
        "the limit's flush and the scope's"
    );
    assert_eq!(out.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
}

#[test]
fn in_place_writes_to_an_input_wait_for_the_deferred_ops_that_read_it() {
    let dev = Device::cpu();
    let w = Tensor::new([1.0f32, 2.0, 3.0], &dev).unwrap();
    let y = with_mode(ExecMode::Fused, || {
        let y = w.mul(2.0)?;
        w.copy_(&Tensor::new([0.0f32, 0.0, 0.0], &dev)?)?;
        let z = y.add(&w)?;
        z.to_vec::<f32>()
    })
    .unwrap();
    assert_eq!(y, vec![2.0, 4.0, 6.0]);
}

#[test]
fn a_deferred_kernel_error_surfaces_at_the_flush_naming_the_op() {
    let dev = Device::cpu();
    let x = randn(&[4, 3], 14, &dev);
    let bad = Tensor::new([0i64, 7], &dev).unwrap();
    let mut kept = None;
    let err = with_mode(ExecMode::Fused, || {
        let y = x.index_select(0, &bad)?.relu()?;
        kept = Some(y.clone());
        assert!(y.storage().is_pending(), "the error waits for the flush");
        y.to_vec::<f32>()
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("index_select"), "{err}");
    let again = kept.unwrap().to_vec::<f32>().unwrap_err().to_string();
    assert!(again.contains("could not be computed"), "{again}");
    // The mode keeps working after a failed graph.
    let ok = with_mode(ExecMode::Fused, || x.relu()?.sum_all()?.to_vec::<f32>()).unwrap();
    assert_eq!(
        ok,
        x.relu()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    );
}

#[test]
fn a_strict_scope_inside_a_fused_one_runs_eagerly() {
    let dev = Device::cpu();
    let x = randn(&[5], 15, &dev);
    with_mode(ExecMode::Fused, || {
        let a = x.exp()?;
        assert!(a.storage().is_pending());
        let b = with_mode(ExecMode::Strict, || a.add(&x))?;
        assert!(!b.storage().is_pending());
        assert!(
            !a.storage().is_pending(),
            "its deferred operand was computed"
        );
        Ok(())
    })
    .unwrap();
}

#[test]
fn a_deferred_error_on_pjrt_surfaces_at_the_flush_naming_the_op() {
    let Some(dev) = pjrt() else { return };
    let x = randn(&[4, 3], 16, &dev);
    let bad = Tensor::new([0i64, 7], &dev).unwrap();
    let strict = x.index_select(0, &bad).and_then(|y| y.to_vec::<f32>());
    let fused = with_mode(ExecMode::Fused, || {
        let y = x.index_select(0, &bad)?.relu()?;
        assert!(y.storage().is_pending(), "the error waits for the flush");
        y.to_vec::<f32>()
    });
    match (strict, fused) {
        (Err(s), Err(f)) => {
            let f = f.to_string();
            assert!(f.contains("index_select"), "strict: {s}\nfused: {f}");
        }
        (Ok(s), Ok(f)) if !tpu_ops::device_checks() => {
            // Without device checks XLA clamps the index in both modes.
            assert_eq!(s.len(), f.len());
        }
        (s, f) => panic!("the modes disagree: strict {s:?}, fused {f:?}"),
    }
}

#[test]
fn a_fused_scope_inside_a_compiled_function_is_traced_like_eager_code() {
    let dev = Device::cpu();
    let f = tpu_graph::compile(|a: &[Tensor]| {
        with_mode(ExecMode::Fused, || Ok(vec![a[0].exp()?.add(&a[0])?]))
    });
    for seed in [17, 18] {
        let x = randn(&[3], seed, &dev);
        let want = x.exp().unwrap().add(&x).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(f.call(&[x]).unwrap()[0].to_vec::<f32>().unwrap(), want);
    }
}
