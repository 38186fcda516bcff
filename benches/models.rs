//! Real models on the native CPU device (2 threads) and on XLA's CPU plugin:
//! - `minilm_embed`: all-MiniLM-L6-v2 sentence embeddings (tokenize, encode, pool, normalise)
//!   of a batch of 32 sentences of about 16 tokens (`b32`), and of one sentence (`b1`); the
//!   throughput is in sentences per second.
//! - `smollm2`: SmolLM2-135M-Instruct from its Q4_1 GGUF file on the native CPU, weights kept
//!   quantised (`q`), dequantised (`f32`) and rounded to bf16 (`bf16`): the forward pass of a
//!   prompt of 5 and of 128 tokens (`prefill5`, `prefill128`), and one decode step after 32
//!   cached positions for one sequence and for 8 (`decode_b1`, `decode_b8`); the throughput is in tokens per second.
//!   The prompt is token ids 1000, 1001, ... (the peers use the same). On XLA's CPU plugin the
//!   same rows run dequantised, op by op (`pjrt_eager`) and compiled (`pjrt_compiled`).
//!
//! `cargo bench --bench models` (the models are installed into the model cache on first use);
//! peers: `benches/models_peers.py`, the same sentences through PyTorch, and
//! `benches/generate_peers.py`, the same SmolLM2 rows through transformers and llama.cpp.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tpu_rs::device::CpuOptions;
use tpu_rs::models::{KvCache, Llama, MINILM, SMOLLM2, SentenceEncoder, WeightFormat, locate};
use tpu_rs::prelude::*;

/// 32 sentences of 13 to 17 tokens with the special ones (the peers script has the same).
pub fn sentences() -> Vec<String> {
    let subjects = [
        "The old lighthouse keeper",
        "A small team of engineers",
        "My neighbour's cat",
        "The orchestra",
    ];
    let verbs = [
        "carefully repaired",
        "quietly watched",
        "happily described",
        "slowly rebuilt",
    ];
    let objects = [
        "the broken wooden bridge near the river",
        "every star above the harbour tonight",
        "a long letter about the summer festival",
        "the map of the northern mountain trails",
        "two bicycles left in the rain",
        "the garden after the storm",
        "a recipe for bread",
        "the machine that sorts the mail",
    ];
    (0..32)
        .map(|i| {
            format!(
                "{} {} {}.",
                subjects[i % 4],
                verbs[(i / 4) % 4],
                objects[i % 8]
            )
        })
        .collect()
}

fn pjrt() -> Option<Device> {
    let path = tpu_rs::tpu_runtime::pjrt::find_pjrt_plugin().ok()?;
    let client = tpu_rs::tpu_runtime::pjrt::Client::create(path, &[]).ok()?;
    client.device(0).ok()
}

fn bench(c: &mut Criterion) {
    let folder = locate(&MINILM, true).expect("the MiniLM model");
    let cpu = cpu_device();
    let mut devices = vec![("cpu", cpu)];
    devices.extend(pjrt().map(|d| ("pjrt", d)));
    let owned = sentences();
    let batch: Vec<&str> = owned.iter().map(String::as_str).collect();
    let mut g = c.benchmark_group("minilm_embed");
    g.sample_size(20);
    for (name, dev) in &devices {
        let enc = SentenceEncoder::from_folder(&folder, dev).expect("the encoder");
        let wait = |t: Tensor| t.to_device(&Device::cpu()).expect("results").numel();
        g.throughput(Throughput::Elements(batch.len() as u64));
        g.bench_function(format!("{name}/b32"), |b| {
            b.iter(|| wait(enc.embed(&batch).unwrap()))
        });
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("{name}/b1"), |b| {
            b.iter(|| wait(enc.embed(&batch[..1]).unwrap()))
        });
    }
    g.finish();
    smollm2(c, &cpu_device());
    if let Some((_, dev)) = devices.iter().find(|(name, _)| *name == "pjrt") {
        smollm2_pjrt(c, dev);
    }
}

fn cpu_device() -> Device {
    Device::new_cpu(&CpuOptions {
        num_threads: Some(2),
        memory_limit: None,
    })
    .expect("a CPU device")
}

/// `[batch, len]` token ids 1000, 1001, ... (every row the same).
fn prompt(batch: usize, len: usize, dev: &Device) -> Tensor {
    let row: Vec<i64> = (1000..1000 + len as i64).collect();
    let ids: Vec<i64> = (0..batch).flat_map(|_| row.iter().copied()).collect();
    Tensor::from_vec(ids, [batch, len], dev).expect("token ids")
}

fn smollm2(c: &mut Criterion, cpu: &Device) {
    let path = locate(&SMOLLM2, true).expect("the SmolLM2 model");
    let mut g = c.benchmark_group("smollm2");
    g.sample_size(10);
    let logits = |t: Tensor| t.to_dtype(DType::F32).expect("logits").numel();
    for (name, format) in [
        ("q", WeightFormat::Quantized),
        ("f32", WeightFormat::F32),
        ("bf16", WeightFormat::Bf16),
    ] {
        let llama = Llama::from_gguf_with(&path, cpu, format).expect("the model");
        for len in [5, 128] {
            let ids = prompt(1, len, cpu);
            g.throughput(Throughput::Elements(len as u64));
            g.bench_function(format!("{name}/prefill{len}"), |b| {
                b.iter(|| logits(llama.forward(&ids, &mut KvCache::new(), true).unwrap()))
            });
        }
        for batch in [1, 8] {
            let mut cache = KvCache::new();
            llama
                .forward(&prompt(batch, 32, cpu), &mut cache, true)
                .expect("the prompt");
            let next = prompt(batch, 1, cpu);
            g.throughput(Throughput::Elements(batch as u64));
            g.bench_function(format!("{name}/decode_b{batch}"), |b| {
                b.iter_batched(
                    || cache.clone(),
                    |mut c| logits(llama.forward(&next, &mut c, true).unwrap()),
                    criterion::BatchSize::SmallInput,
                )
            });
        }
    }
    g.finish();
}

/// SmolLM2 (f32) on a PJRT device, op by op (`pjrt_eager`, every op its own program) and
/// compiled over a preallocated cache (`pjrt_compiled`, one program per pass), with the rows of
/// [`smollm2`]. The compiled prefill pads its prompt to the length bucket generation pads it
/// to (5 tokens to 8); the compiled decode steps run in a cache of 64 slots.
fn smollm2_pjrt(c: &mut Criterion, dev: &Device) {
    let path = locate(&SMOLLM2, true).expect("the SmolLM2 model");
    let llama = Llama::from_gguf_with(&path, dev, WeightFormat::F32).expect("the model");
    let mut g = c.benchmark_group("smollm2");
    g.sample_size(10);
    let logits = |t: Tensor| t.to_device(&Device::cpu()).expect("logits").numel();
    for len in [5, 128] {
        let ids = prompt(1, len, dev);
        g.throughput(Throughput::Elements(len as u64));
        g.bench_function(format!("pjrt_eager/prefill{len}"), |b| {
            b.iter(|| logits(llama.forward(&ids, &mut KvCache::new(), true).unwrap()))
        });
        let width = len.next_power_of_two().max(8);
        let padded = prompt(1, width, dev);
        let cache = || KvCache::left_padded(vec![width - len]).with_capacity(width);
        g.bench_function(format!("pjrt_compiled/prefill{len}"), |b| {
            b.iter(|| logits(llama.forward(&padded, &mut cache(), true).unwrap()))
        });
    }
    for batch in [1, 8] {
        let next = prompt(batch, 1, dev);
        g.throughput(Throughput::Elements(batch as u64));
        let mut eager = KvCache::new();
        llama
            .forward(&prompt(batch, 32, dev), &mut eager, true)
            .expect("the prompt");
        g.bench_function(format!("pjrt_eager/decode_b{batch}"), |b| {
            b.iter_batched(
                || eager.clone(),
                |mut c| logits(llama.forward(&next, &mut c, true).unwrap()),
                criterion::BatchSize::SmallInput,
            )
        });
        let mut base = KvCache::new().with_capacity(64);
        llama
            .forward(&prompt(batch, 32, dev), &mut base, true)
            .expect("the prompt");
        g.bench_function(format!("pjrt_compiled/decode_b{batch}"), |b| {
            b.iter_custom(|iters| {
                // Steps at positions 33 to 48 of a 64-slot cache, as the eager row's 33: a
                // fresh clone every 16 steps, its first step (which copies its slots) not
                // timed.
                let mut took = std::time::Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let mut c = base.clone();
                    logits(llama.forward(&next, &mut c, true).unwrap());
                    for _ in 0..left.min(15) {
                        let t0 = std::time::Instant::now();
                        logits(llama.forward(&next, &mut c, true).unwrap());
                        took += t0.elapsed();
                        left -= 1;
                    }
                }
                took
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
