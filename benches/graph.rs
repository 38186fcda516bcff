//! The compiled path against eager execution, in one run: the forward and backward of the MLP
//! 784-1024-1024-10 (batch 128, f32, cross-entropy; the gradients of all six parameters are
//! returned), eager and compiled, on the native CPU device (2 threads) and on XLA's CPU plugin
//! (eager op by op, and compiled into one program).
//!
//! `cargo bench --bench graph`. The optimizer update is not in the step: compiled functions do
//! not capture in-place writes yet.

use criterion::{Criterion, criterion_group, criterion_main};
use tpu_rs::device::CpuOptions;
use tpu_rs::graph::{CompiledFn, compile};
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

type Step = Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync>;

/// The step over parameters living on `dev`: loss and the six gradients.
fn mlp_step(dev: &Device) -> Step {
    let mut g = Generator::new(0);
    let mut param = |shape: &[usize]| {
        g.randn(shape, DType::F32, &Device::cpu())
            .and_then(|t| t.mul(0.05))
            .and_then(|t| t.to_device(dev))
            .and_then(|t| t.requires_grad_(true))
            .expect("a parameter")
    };
    let ps = [
        param(&[1024, 784]),
        param(&[1024]),
        param(&[1024, 1024]),
        param(&[1024]),
        param(&[10, 1024]),
        param(&[10]),
    ];
    Box::new(move |a: &[Tensor]| {
        for p in &ps {
            p.zero_grad();
        }
        let h = a[0].linear(&ps[0], Some(&ps[1]))?.relu()?;
        let h = h.linear(&ps[2], Some(&ps[3]))?.relu()?;
        let loss = F::cross_entropy(&h.linear(&ps[4], Some(&ps[5]))?, &a[1])?;
        loss.backward()?;
        let mut out = vec![loss];
        out.extend(ps.iter().map(|p| p.grad().expect("a gradient")));
        Ok(out)
    })
}

fn inputs(dev: &Device) -> [Tensor; 2] {
    let mut g = Generator::new(1);
    let x = g.randn([128, 784], DType::F32, &Device::cpu()).unwrap();
    let y = g.randint(0, 10, [128], DType::I64, &Device::cpu()).unwrap();
    [x.to_device(dev).unwrap(), y.to_device(dev).unwrap()]
}

/// Waits for the step's results (a read of the loss; PJRT launches are asynchronous).
fn sync(out: Vec<Tensor>) -> f32 {
    out[0]
        .to_device(&Device::cpu())
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("graph_mlp_fwd_bwd_b128");
    g.sample_size(20);
    let mut devices = vec![("cpu", cpu2())];
    devices.extend(pjrt().map(|d| ("pjrt", d)));
    for (name, dev) in devices {
        let args = inputs(&dev);
        let eager = mlp_step(&dev);
        let compiled: CompiledFn = compile(mlp_step(&dev));
        // Same loss both ways, and the program compiled before timing.
        let (e, k) = (
            sync(eager(&args).unwrap()),
            sync(compiled.call(&args).unwrap()),
        );
        assert!(
            (e - k).abs() <= 1e-5 * e.abs(),
            "{name}: eager {e} vs compiled {k}"
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

criterion_group!(benches, bench);
criterion_main!(benches);
