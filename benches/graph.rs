//! The compiled path against eager execution, in one run, on the native CPU device (2 threads)
//! and on XLA's CPU plugin (eager op by op, and compiled into one program):
//! - `graph_mlp_train_b128`: the MLP 784-1024-1024-10, batch 128, f32, a whole training step
//!   (forward, cross-entropy, backward, SGD with lr 0.01 written into the parameters);
//! - `graph_block_fwd`: a pre-LN transformer block forward (d_model 512, 8 heads, seq 256,
//!   batch 4, MLP 2048 with erf GELU, f32);
//! - `graph_block_fwd_bwd`: the same block forward and backward (loss: the mean of the output;
//!   the gradients of all its parameters).
//!
//! Before timing, each compiled function's first call, made after one eager call, is timed once
//! and printed as `first call: ...`, split into its compile (trace, passes, and the device
//! compile or the disk-cache load, from the function's metrics; `TPU_RS_LOG=compile` splits it
//! further) and its run. With `TPU_RS_CACHE_DIR` pointing at an empty directory the PJRT first
//! calls are cold compiles; run the bench again with the same directory for the warm start from
//! the disk cache in a new process.
//!
//! `cargo bench --bench graph`; peers: `benches/graph_peers.py`.

#[allow(dead_code)] // this target uses part of the shared example code
#[path = "../examples/mnist/train.rs"]
mod mnist;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use mnist::{ModelKind, build_model, training_step};
use tpu_rs::device::CpuOptions;
use tpu_rs::graph::{CompileOptions, compile_with, metrics};
use tpu_rs::nn::{Init, LayerNorm, Linear, MultiheadAttention};
use tpu_rs::optim::Sgd;
use tpu_rs::prelude::*;

fn cpu2() -> Device {
    Device::new_cpu(&CpuOptions {
        num_threads: Some(2),
        memory_limit: None,
    })
    .expect("a CPU device")
}

fn pjrt() -> Option<Device> {
    match tpu_rs::tpu_runtime::pjrt::find_pjrt_plugin() {
        Ok(path) => {
            let client = tpu_rs::tpu_runtime::pjrt::Client::create(path, &[])
                .expect("the PJRT plugin failed to create a client");
            Some(client.device(0).expect("device 0"))
        }
        Err(e) => {
            eprintln!("skipped: PJRT cases: {e}");
            None
        }
    }
}

type Step = Arc<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync>;

/// A training step of the MLP on `dev` (the example's model and step), with its own parameters
/// and SGD.
fn mlp_train(dev: &Device) -> Step {
    let model: Arc<dyn Module> = build_model(ModelKind::Mlp, dev, 0).expect("the MLP").into();
    let opt = Arc::new(Mutex::new(Sgd::new(model.parameters(), 0.01)));
    Arc::new(training_step(model, opt))
}

/// A pre-LN transformer block.
struct Block {
    ln1: LayerNorm,
    attn: MultiheadAttention,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl Block {
    fn new(dev: &Device, grad: bool) -> Block {
        let mut g = Generator::new(0);
        let mut init = Init::new(dev, &mut g);
        let b = Block {
            ln1: LayerNorm::new(&[512], &mut init).expect("ln1"),
            attn: MultiheadAttention::new(512, 8, 8, true, false, &mut init).expect("attention"),
            ln2: LayerNorm::new(&[512], &mut init).expect("ln2"),
            fc1: Linear::new(512, 2048, true, &mut init).expect("fc1"),
            fc2: Linear::new(2048, 512, true, &mut init).expect("fc2"),
        };
        if !grad {
            for p in b.parameters() {
                p.requires_grad_(false).expect("no grad");
            }
        }
        b
    }

    fn parameters(&self) -> Vec<Tensor> {
        let mut ps = self.ln1.parameters();
        ps.extend(self.attn.parameters());
        ps.extend(self.ln2.parameters());
        ps.extend(self.fc1.parameters());
        ps.extend(self.fc2.parameters());
        ps
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = x.add(&self.attn.forward(&self.ln1.forward(x)?)?)?;
        let m = self
            .fc2
            .forward(&self.fc1.forward(&self.ln2.forward(&h)?)?.gelu()?)?;
        h.add(&m)
    }
}

fn block_fwd(dev: &Device) -> Step {
    let b = Block::new(dev, false);
    Arc::new(move |a: &[Tensor]| Ok(vec![b.forward(&a[0])?]))
}

fn block_fwd_bwd(dev: &Device) -> Step {
    let b = Block::new(dev, true);
    Arc::new(move |a: &[Tensor]| {
        let ps = b.parameters();
        for p in &ps {
            p.zero_grad();
        }
        let loss = b.forward(&a[0])?.mean_all()?;
        loss.backward()?;
        let mut out = vec![loss.detach()];
        out.extend(ps.iter().map(|p| p.grad().expect("a gradient")));
        Ok(out)
    })
}

fn mlp_inputs(dev: &Device) -> Vec<Tensor> {
    let mut g = Generator::new(1);
    let x = g.randn([128, 784], DType::F32, &Device::cpu()).unwrap();
    let y = g.randint(0, 10, [128], DType::I64, &Device::cpu()).unwrap();
    vec![x.to_device(dev).unwrap(), y.to_device(dev).unwrap()]
}

fn block_inputs(dev: &Device) -> Vec<Tensor> {
    let mut g = Generator::new(2);
    let x = g.randn([4, 256, 512], DType::F32, &Device::cpu()).unwrap();
    vec![x.to_device(dev).unwrap()]
}

/// Waits for a step's results (a read of its first output; PJRT launches are asynchronous).
fn sync(out: Vec<Tensor>) -> f32 {
    out[0]
        .to_device(&Device::cpu())
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

type Case = (
    &'static str,
    fn(&Device) -> Step,
    fn(&Device) -> Vec<Tensor>,
);

const CASES: [Case; 3] = [
    ("graph_mlp_train_b128", mlp_train, mlp_inputs),
    ("graph_block_fwd", block_fwd, block_inputs),
    ("graph_block_fwd_bwd", block_fwd_bwd, block_inputs),
];

fn bench(c: &mut Criterion) {
    let mut devices = vec![("cpu", cpu2())];
    devices.extend(pjrt().map(|d| ("pjrt", d)));
    for (group, make, inputs) in CASES {
        let mut g = c.benchmark_group(group);
        g.sample_size(10);
        for (name, dev) in &devices {
            let args = inputs(dev);
            let eager = make(dev);
            let step = make(dev);
            let f = step.clone();
            let fn_name = format!("{group}/{name}");
            let options = CompileOptions::default().name(fn_name.clone());
            let compiled = compile_with(options, move |a: &[Tensor]| f(a));
            let e = sync(eager(&args).unwrap());
            let t0 = Instant::now();
            let k = sync(compiled.call(&args).unwrap());
            let first = t0.elapsed().as_secs_f64() * 1e3;
            let m = metrics();
            let row = m.functions.iter().find(|r| r.name == fn_name);
            let compile_ms = row.map_or(f64::NAN, |r| r.compile_time.as_secs_f64() * 1e3);
            let from_disk = row.is_some_and(|r| r.disk_hits > 0);
            eprintln!(
                "first call: {fn_name}/compiled {first:.1} ms = compile {compile_ms:.1} ms \
                 (trace, passes, {}) + run {:.1} ms",
                if from_disk {
                    "load from the disk cache"
                } else {
                    "device compile"
                },
                first - compile_ms
            );
            // Same first result both ways (the training step updates its own parameters).
            assert!(
                (e - k).abs() <= 1e-4 * e.abs().max(1e-3),
                "{group}/{name}: eager {e} vs compiled {k}"
            );
            g.bench_function(format!("{name}/eager"), |b| {
                b.iter(|| sync(eager(&args).unwrap()))
            });
            g.bench_function(format!("{name}/compiled"), |b| {
                b.iter(|| sync(compiled.call(&args).unwrap()))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
