//! Whole training steps compiled: forward, loss, backward and the optimizer's in-place update
//! in one graph, written back into the parameters and optimizer state after every call. A loop
//! that runs compiled gives the eager loop's losses and parameters: bit for bit on the native
//! CPU, within f32 rounding as one PJRT program. Learning-rate schedules never recompile.

use std::sync::{Arc, Mutex};

use tpu_graph::compile;
use tpu_ops::nn::{
    Activation, BatchNorm2d, Conv2d, Flatten, Init, Linear, MaxPool2d, Mlp, Module, Sequential,
};
use tpu_ops::ops::conv::{ConvOptions, MaxPoolOptions};
use tpu_ops::ops::nn::functional::cross_entropy;
use tpu_ops::optim::{Adam, CosineDecay, LrSchedule, Optimizer, Sgd};
use tpu_ops::prelude::*;
use tpu_ops::tpu_tensor::{DType, Device, Generator, Result, Tensor};

fn pjrt() -> Option<Device> {
    tpu_ops::testing::pjrt_device("tpu-graph train step")
}

type Model = Arc<dyn Module>;
type Opt = Arc<Mutex<dyn Optimizer + Send>>;

/// Batches of `x` (shape `[n, ...]` per batch) and class targets, the same for every run.
fn batches(shape: &[usize], classes: i64, steps: usize, dev: &Device) -> Vec<(Tensor, Tensor)> {
    // Two batches in turn, so that a few steps visibly lower the loss.
    let mut g = Generator::new(7);
    let two: Vec<(Tensor, Tensor)> = (0..2)
        .map(|_| {
            let x = g.randn(shape, DType::F32, dev).unwrap();
            let y = g.randint(0, classes, [shape[0]], DType::I64, dev).unwrap();
            (x, y)
        })
        .collect();
    (0..steps).map(|i| two[i % 2].clone()).collect()
}

/// The step every loop runs: zero the gradients, forward, loss, backward, update.
fn step_fn(model: Model, opt: Opt) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync {
    move |a: &[Tensor]| {
        let mut o = opt.lock().unwrap();
        o.zero_grad();
        let loss = cross_entropy(&model.forward(&a[0])?, &a[1])?;
        loss.backward()?;
        o.step()?;
        Ok(vec![loss.detach()])
    }
}

/// Runs `steps` steps (eagerly or compiled) with the learning rate of `schedule` set before
/// each; returns the losses, then the model's parameters and buffers.
fn train(
    make: &dyn Fn() -> (Model, Opt),
    data: &[(Tensor, Tensor)],
    schedule: &CosineDecay,
    compiled: bool,
) -> (Vec<f32>, Vec<Tensor>, usize) {
    let (model, opt) = make();
    let step = step_fn(model.clone(), opt.clone());
    let f = compile(step_fn(model.clone(), opt.clone()));
    let mut losses = Vec::new();
    for (i, (x, y)) in data.iter().enumerate() {
        schedule.apply(&mut *opt.lock().unwrap(), i as u64).unwrap();
        let out = if compiled {
            f.call(&[x.clone(), y.clone()]).unwrap()
        } else {
            step(&[x.clone(), y.clone()]).unwrap()
        };
        losses.push(
            out[0]
                .to_dtype(DType::F32)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
        );
    }
    let state = model.state_dict().into_iter().map(|(_, t)| t).collect();
    (losses, state, f.programs())
}

fn mlp(dev: &Device, adam: bool) -> impl Fn() -> (Model, Opt) + '_ {
    move || {
        let mut g = Generator::new(1);
        let model = Mlp::new(&[12, 32, 5], Activation::Relu, &mut Init::new(dev, &mut g)).unwrap();
        let params = model.parameters();
        let opt: Opt = if adam {
            Arc::new(Mutex::new(Adam::adamw(params, 0.01)))
        } else {
            let sgd = Sgd::new(params, 0.1)
                .with_momentum(0.9, 0.0, true)
                .unwrap()
                .with_weight_decay(1e-3);
            Arc::new(Mutex::new(sgd))
        };
        (Arc::new(model), opt)
    }
}

/// The MLP with plain SGD (no momentum, no weight decay): each update is `w - lr * grad`.
fn mlp_plain_sgd(dev: &Device) -> impl Fn() -> (Model, Opt) + '_ {
    move || {
        let mut g = Generator::new(1);
        let model = Mlp::new(&[12, 32, 5], Activation::Relu, &mut Init::new(dev, &mut g)).unwrap();
        let opt: Opt = Arc::new(Mutex::new(Sgd::new(model.parameters(), 0.1)));
        (Arc::new(model), opt)
    }
}

fn cnn(dev: &Device) -> impl Fn() -> (Model, Opt) + '_ {
    move || {
        let mut g = Generator::new(2);
        let mut init = Init::new(dev, &mut g);
        let model = Sequential::new()
            // No bias before batch norm: its gradient is rounding noise, which Adam would
            // amplify into different noise on each device.
            .push(
                Conv2d::new(
                    1,
                    4,
                    [3, 3],
                    ConvOptions::new().padding(1),
                    false,
                    &mut init,
                )
                .unwrap(),
            )
            .push(BatchNorm2d::new(4, &mut init).unwrap())
            .push(MaxPool2d {
                options: MaxPoolOptions::new(2),
            })
            .push(Flatten::default())
            .push(Linear::new(4 * 4 * 4, 3, true, &mut init).unwrap());
        let opt: Opt = Arc::new(Mutex::new(Adam::new(model.parameters(), 0.01)));
        (Arc::new(model), opt)
    }
}

const SCHEDULE: CosineDecay = CosineDecay {
    base_lr: 0.05,
    min_lr: 0.005,
    warmup: 3,
    total: 12,
};

fn compare(make: &dyn Fn() -> (Model, Opt), data: &[(Tensor, Tensor)], tol: f32) {
    let (el, ep, _) = train(make, data, &SCHEDULE, false);
    let (cl, cp, programs) = train(make, data, &SCHEDULE, true);
    assert_eq!(programs, 1, "a schedule must not recompile");
    for (i, (c, e)) in cl.iter().zip(&el).enumerate() {
        assert!(
            (c - e).abs() <= tol * (1.0 + e.abs()),
            "loss {i}: compiled {c}, eager {e}"
        );
    }
    let n = el.len();
    assert!(
        el[0] + el[1] > el[n - 2] + el[n - 1],
        "training lowers the loss: {el:?}"
    );
    for (k, (c, e)) in cp.iter().zip(&ep).enumerate() {
        let (c, e) = (
            c.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
            e.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
        );
        for (j, (a, b)) in c.iter().zip(&e).enumerate() {
            assert!(
                (a - b).abs() <= tol as f64 * (1.0 + b.abs()),
                "state {k}[{j}]: compiled {a}, eager {b}"
            );
        }
    }
}

#[test]
fn an_sgd_training_loop_compiled_equals_eager_bit_for_bit_on_cpu() {
    let dev = Device::cpu();
    compare(&mlp(&dev, false), &batches(&[6, 12], 5, 12, &dev), 0.0);
}

#[test]
fn plain_sgd_updates_fuse_into_the_gradient_products_with_eager_bits() {
    let dev = Device::cpu();
    let make = mlp_plain_sgd(&dev);
    compare(&make, &batches(&[6, 12], 5, 12, &dev), 0.0);
    let (model, opt) = make();
    let (x, y) = batches(&[6, 12], 5, 1, &dev).remove(0);
    let text = compile(step_fn(model, opt))
        .graph(&[x, y])
        .unwrap()
        .to_string();
    // Both weights' updates (the biases' gradients are sums, not products).
    assert_eq!(text.matches("sub_scaled_product(").count(), 2, "{text}");
}

#[test]
fn an_adamw_loop_with_a_schedule_compiles_once_and_equals_eager_on_cpu() {
    let dev = Device::cpu();
    compare(&mlp(&dev, true), &batches(&[6, 12], 5, 12, &dev), 0.0);
}

#[test]
fn a_cnn_with_batch_norm_statistics_trains_compiled_as_eager_on_cpu() {
    let dev = Device::cpu();
    compare(&cnn(&dev), &batches(&[4, 1, 8, 8], 3, 12, &dev), 0.0);
}

#[test]
fn training_loops_run_as_one_pjrt_program_with_eager_results() {
    let Some(dev) = pjrt() else { return };
    compare(&mlp(&dev, false), &batches(&[6, 12], 5, 12, &dev), 1e-5);
    compare(&mlp(&dev, true), &batches(&[6, 12], 5, 12, &dev), 1e-5);
    compare(&cnn(&dev), &batches(&[4, 1, 8, 8], 3, 12, &dev), 1e-5);
}

#[test]
fn writes_into_arguments_and_through_views_are_written_back() {
    let run = |dev: &Device| {
        let state = Tensor::new([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], dev).unwrap();
        let s = state.clone();
        let f = compile(move |a: &[Tensor]| {
            // A row of a captured tensor, written through a view, then read back whole.
            s.select(0, 1)?.copy_(&s.select(0, 0)?.add(&a[1])?)?;
            // An argument updated in place.
            a[0].copy_(&a[0].mul(2.0)?)?;
            Ok(vec![s.sum_all()?])
        });
        let acc = Tensor::new([1.0f32, 1.0], dev).unwrap();
        let mut sums = Vec::new();
        for i in 0..3 {
            let bump = Tensor::full([3], i as f64, DType::F32, dev).unwrap();
            sums.push(
                f.call(&[acc.clone(), bump]).unwrap()[0]
                    .to_scalar::<f32>()
                    .unwrap(),
            );
        }
        assert_eq!(f.programs(), 1);
        (
            sums,
            state.to_vec::<f32>().unwrap(),
            acc.to_vec::<f32>().unwrap(),
        )
    };
    let want = (
        vec![12.0f32, 15.0, 18.0],
        vec![1.0f32, 2.0, 3.0, 3.0, 4.0, 5.0],
        vec![8.0f32, 8.0],
    );
    assert_eq!(run(&Device::cpu()), want);
    if let Some(dev) = pjrt() {
        assert_eq!(run(&dev), want);
    }
}

#[test]
fn whole_tensor_writes_are_written_back_on_pjrt() {
    let Some(dev) = pjrt() else { return };
    let state = Tensor::new([1.0f32, 2.0, 3.0], &dev).unwrap();
    let s = state.clone();
    let f = compile(move |a: &[Tensor]| {
        s.copy_(&s.add(&a[1])?)?;
        a[0].copy_(&a[0].mul(2.0)?)?;
        Ok(vec![s.sum_all()?])
    });
    let acc = Tensor::new([1.0f32, 1.0], &dev).unwrap();
    let mut sums = Vec::new();
    for i in 0..3 {
        let bump = Tensor::full([3], i as f64, DType::F32, &dev).unwrap();
        sums.push(
            f.call(&[acc.clone(), bump]).unwrap()[0]
                .to_scalar::<f32>()
                .unwrap(),
        );
    }
    assert_eq!(f.programs(), 1);
    assert_eq!(sums, vec![6.0f32, 9.0, 15.0]);
    // Both written tensors donate their buffers to the values written back into them.
    let text = f
        .stablehlo(&[acc.clone(), Tensor::zeros([3], DType::F32, &dev).unwrap()])
        .unwrap()
        .unwrap();
    assert_eq!(text.matches("tf.aliasing_output").count(), 2, "{text}");
    assert_eq!(state.to_vec::<f32>().unwrap(), vec![4.0f32, 5.0, 6.0]);
    assert_eq!(acc.to_vec::<f32>().unwrap(), vec![8.0f32, 8.0]);
}

#[test]
fn random_numbers_inside_a_compiled_function_are_refused() {
    let dev = Device::cpu();
    let f = compile(|a: &[Tensor]| {
        let mut g = Generator::new(0);
        let noise = g.rand([2], DType::F32, &Device::cpu())?;
        Ok(vec![a[0].add(&noise)?])
    });
    let e = f
        .call(&[Tensor::new([1.0f32, 2.0], &dev).unwrap()])
        .unwrap_err();
    assert!(e.to_string().contains("pass them in as an argument"), "{e}");
}

/// A pre-LN transformer block (attention and a GELU MLP), forward and backward, compiled as
/// one graph: the output and every parameter's gradient equal eager execution's, bit for bit
/// on the CPU, within f32 rounding as one PJRT program.
#[test]
fn a_transformer_block_forward_and_backward_compiled_equals_eager() {
    use tpu_ops::nn::{LayerNorm, MultiheadAttention};
    let run = |dev: &Device, tol: f32| {
        let mut g = Generator::new(3);
        let mut init = Init::new(dev, &mut g);
        let ln1 = LayerNorm::new(&[16], &mut init).unwrap();
        let attn = MultiheadAttention::new(16, 4, 2, true, true, &mut init).unwrap();
        let ln2 = LayerNorm::new(&[16], &mut init).unwrap();
        let fc1 = Linear::new(16, 32, true, &mut init).unwrap();
        let fc2 = Linear::new(32, 16, true, &mut init).unwrap();
        let mut ps = Vec::new();
        for m in [&ln1 as &dyn Module, &attn, &ln2, &fc1, &fc2] {
            ps.extend(m.parameters());
        }
        let step = move |a: &[Tensor]| -> Result<Vec<Tensor>> {
            for p in &ps {
                p.zero_grad();
            }
            let x = &a[0];
            let h = x.add(&attn.forward(&ln1.forward(x)?)?)?;
            let y = h.add(&fc2.forward(&fc1.forward(&ln2.forward(&h)?)?.gelu()?)?)?;
            y.square()?.mean_all()?.backward()?;
            let mut out = vec![y.detach()];
            out.extend(ps.iter().map(|p| p.grad().unwrap()));
            Ok(out)
        };
        let step = Arc::new(step);
        let s = step.clone();
        let f = compile(move |a: &[Tensor]| s(a));
        for seed in 0..3 {
            let x = Generator::new(10 + seed)
                .randn([2, 5, 16], DType::F32, dev)
                .unwrap();
            let eager = step(std::slice::from_ref(&x)).unwrap();
            let compiled = f.call(std::slice::from_ref(&x)).unwrap();
            assert_eq!(eager.len(), compiled.len());
            for (k, (c, e)) in compiled.iter().zip(&eager).enumerate() {
                let (c, e) = (c.to_vec::<f32>().unwrap(), e.to_vec::<f32>().unwrap());
                for (a, b) in c.iter().zip(&e) {
                    assert!(
                        (a - b).abs() <= tol * (1.0 + b.abs()),
                        "{dev} output {k}: compiled {a}, eager {b}"
                    );
                }
            }
        }
        assert_eq!(f.programs(), 1);
    };
    run(&Device::cpu(), 0.0);
    if let Some(dev) = pjrt() {
        run(&dev, 1e-5);
    }
}

/// Graph breaks: a function that branches on a value it reads on the host runs as fused
/// segments, so each call takes the branch its own values choose, and a training step that
/// reads its loss inside still trains as eagerly.
#[test]
fn graph_breaks_run_data_dependent_code_in_segments() {
    use tpu_graph::{CompileOptions, compile_with};
    let branchy = |a: &[Tensor]| -> Result<Vec<Tensor>> {
        let positive = a[0].sum_all()?.to_scalar::<f32>()? > 0.0;
        let y = if positive {
            a[0].mul(2.0)?
        } else {
            a[0].neg()?
        };
        Ok(vec![y.add(1.0)?])
    };
    let e = compile(branchy)
        .call(&[Tensor::new([1.0f32], &Device::cpu()).unwrap()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("allow_graph_breaks"), "{e}");
    let mut devices = vec![Device::cpu()];
    devices.extend(pjrt());
    for dev in &devices {
        let f = compile_with(
            CompileOptions::default()
                .name("branchy")
                .allow_graph_breaks(),
            branchy,
        );
        for (x, want) in [
            ([1.0f32, 2.0], [3.0f32, 5.0]),
            ([-1.0, -2.0], [2.0, 3.0]),
            ([3.0, -1.0], [7.0, -1.0]),
        ] {
            let out = f.call(&[Tensor::new(x, dev).unwrap()]).unwrap();
            assert_eq!(out[0].to_vec::<f32>().unwrap(), want);
        }
        assert_eq!(f.programs(), 1);
        assert!(
            f.graph(&[Tensor::new([1.0f32, 2.0], dev).unwrap()])
                .is_err()
        );
    }
    // A training step that reads its loss on the host (to log it) inside the function.
    let dev = Device::cpu();
    let data = batches(&[6, 12], 5, 6, &dev);
    let (el, ep, _) = train(&mlp(&dev, false), &data, &SCHEDULE, false);
    let (model, opt) = mlp(&dev, false)();
    let step = step_fn(model.clone(), opt.clone());
    let logged = Arc::new(Mutex::new(Vec::new()));
    let log = logged.clone();
    let f = compile_with(CompileOptions::default().allow_graph_breaks(), move |a| {
        let out = step(a)?;
        log.lock().unwrap().push(out[0].to_scalar::<f32>()?);
        Ok(out)
    });
    for (i, (x, y)) in data.iter().enumerate() {
        SCHEDULE.apply(&mut *opt.lock().unwrap(), i as u64).unwrap();
        f.call(&[x.clone(), y.clone()]).unwrap();
    }
    assert_eq!(*logged.lock().unwrap(), el);
    let state: Vec<Tensor> = model.state_dict().into_iter().map(|(_, t)| t).collect();
    for (c, e) in state.iter().zip(&ep) {
        assert_eq!(c.to_vec::<f32>().unwrap(), e.to_vec::<f32>().unwrap());
    }
}
