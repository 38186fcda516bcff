//! Elementwise fusion on the native CPU device (2 threads): the chain
//! `((x * a + b).gelu() * 0.5 + r).relu()` over 4M f32 (16 MiB per tensor),
//! - `eager`: op by op through dispatch;
//! - `compiled_unfused`: compiled without the passes (so without fusion), each node's kernel;
//! - `native_optimized_unfused`: the optimised graph run node by node, fusion left out;
//! - `compiled_fused`: compiled with the passes, the chain one fused kernel;
//! - `eager_gelu_alone`: the chain's one costly op by itself, a floor for the fused kernel.
//!
//! All four give the same bits (checked before timing). Also prints the memory plans of the
//! unfused and fused graphs.
//!
//! `cargo bench --bench fusion`.

use criterion::{Criterion, criterion_group, criterion_main};
use tpu_rs::device::CpuOptions;
use tpu_rs::graph::exec::native;
use tpu_rs::graph::passes::{fuse_for_cpu, optimize_counted, promote_constants};
use tpu_rs::graph::{CompileOptions, compile_with, trace};
use tpu_rs::prelude::*;

const N: usize = 1 << 22;

fn cpu2() -> Device {
    Device::new_cpu(&CpuOptions {
        num_threads: Some(2),
        memory_limit: None,
    })
    .expect("a CPU device")
}

fn chain(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let (x, w, b, r) = (&a[0], &a[1], &a[2], &a[3]);
    Ok(vec![x.mul(w)?.add(b)?.gelu()?.mul(0.5)?.add(r)?.relu()?])
}

fn bits(out: &[Tensor]) -> Vec<u32> {
    out[0]
        .to_vec::<f32>()
        .expect("f32 output")
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

fn bench(c: &mut Criterion) {
    let dev = cpu2();
    let mut g = Generator::new(0);
    let args: Vec<Tensor> = (0..4)
        .map(|_| g.randn([N], DType::F32, &dev).expect("randn"))
        .collect();
    let unfused = compile_with(CompileOptions::default().optimize(false), chain);
    let fused = compile_with(CompileOptions::default(), chain);
    let t = trace(&chain, &args).expect("trace");
    let (mut graph, captured) = (t.graph, t.captured);
    drop(t.outputs);
    promote_constants(&mut graph, &captured).expect("promote");
    optimize_counted(&mut graph).expect("passes");
    let mut fused_graph = graph.clone();
    let n = fuse_for_cpu(&mut fused_graph).expect("fusion");
    let want = bits(&chain(&args).expect("eager"));
    for _ in 0..2 {
        assert_eq!(bits(&unfused.call(&args).expect("unfused")), want);
        assert_eq!(bits(&fused.call(&args).expect("fused")), want);
    }
    let native_unfused = || native::run(&graph, &args, &captured, &dev, &[]).expect("native");
    assert_eq!(bits(&native_unfused()), want);
    let fg = fused.graph(&args).expect("graph");
    assert_eq!(fg.nodes().len(), 1, "{fg}");
    let (pu, pf) = (graph.memory_plan(), fused_graph.memory_plan());
    eprintln!(
        "{n} nodes fused into 1; memory plan: unfused peak {} MiB of {} MiB, fused peak {} MiB",
        pu.peak_bytes >> 20,
        pu.total_bytes >> 20,
        pf.peak_bytes >> 20
    );

    let mut group = c.benchmark_group("fusion_chain_4m");
    group.sample_size(20);
    group.bench_function("eager", |b| b.iter(|| chain(&args).expect("eager")));
    group.bench_function("compiled_unfused", |b| {
        b.iter(|| unfused.call(&args).expect("unfused"))
    });
    group.bench_function("native_optimized_unfused", |b| b.iter(native_unfused));
    group.bench_function("compiled_fused", |b| {
        b.iter(|| fused.call(&args).expect("fused"))
    });
    group.bench_function("eager_gelu_alone", |b| {
        b.iter(|| args[0].gelu().expect("gelu"))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
