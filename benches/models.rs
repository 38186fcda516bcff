//! Real models on the native CPU device (2 threads) and on XLA's CPU plugin:
//! - `minilm_embed`: all-MiniLM-L6-v2 sentence embeddings (tokenize, encode, pool, normalise)
//!   of a batch of 32 sentences of about 16 tokens (`b32`), and of one sentence (`b1`); the
//!   throughput is in sentences per second.
//!
//! `cargo bench --bench models` (the model is installed into the model cache on first use);
//! peers: `benches/models_peers.py`, the same sentences through PyTorch.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tpu_rs::device::CpuOptions;
use tpu_rs::models::{MINILM, SentenceEncoder, locate};
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
    let cpu = Device::new_cpu(&CpuOptions {
        num_threads: Some(2),
        memory_limit: None,
    })
    .expect("a CPU device");
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
}

criterion_group!(benches, bench);
criterion_main!(benches);
