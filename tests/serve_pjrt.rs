//! The serving engine on a PJRT device: its passes run as compiled programs padded to
//! buckets, every bucket compiles when the engine starts, no request compiles after that, and
//! greedy requests produce the native CPU engine's tokens.
//!
//! A test binary of its own: the count of programs compiled is the process's, so no other
//! test may compile beside it. CI sets `TPU_RS_REQUIRE_PJRT=1` and `TPU_RS_REQUIRE_MODELS=1`,
//! which make a missing plugin or model a failure instead of a skip.

use std::sync::Arc;

use tpu_rs::models::llama::{PagedBuckets, PagedCache, PagedChunk};
use tpu_rs::models::{Llama, SMOLLM2, TextTokenizer, WeightFormat};
use tpu_rs::prelude::*;
use tpu_rs::serve::{Engine, EngineConfig};
use tpu_rs::tpu_tensor::GgufFile;

mod common;
#[path = "common/engine.rs"]
mod engine;

#[test]
fn a_pjrt_engine_compiles_its_buckets_at_start_and_never_while_it_serves() {
    let Some(dev) = tpu_rs::tpu_ops::testing::pjrt_device("the serving engine on pjrt") else {
        return;
    };
    let Some(path) = common::model_or_skip(&SMOLLM2) else {
        return;
    };
    let tok = Arc::new(TextTokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap());
    let load = |d: &Device| Arc::new(Llama::from_gguf_with(&path, d, WeightFormat::F32).unwrap());
    // Requests of up to 64 positions, 4 sequences, 32 tokens a pass: buckets of 1, 2 and 4
    // decodes and of 16 and 32 chunk tokens, all over 64 positions.
    let config = |m: &Llama| EngineConfig {
        kv_cache_bytes: 24 * PagedCache::block_bytes(m, 16),
        max_batch_tokens: 32,
        max_running: 4,
        max_model_len: Some(64),
        ..EngineConfig::default()
    };
    let (cpu_model, pjrt_model) = (load(&Device::cpu()), load(&dev));
    let pjrt = Engine::start(pjrt_model.clone(), tok.clone(), config(&pjrt_model)).unwrap();
    let (programs, took) = pjrt.warm_up();
    assert_eq!(programs, 3 + 2);
    assert_eq!(pjrt_model.paged_programs(), 5);
    assert!(took.as_secs_f64() > 0.0);
    let text = pjrt.metrics().snapshot().prometheus("smollm2");
    assert!(
        text.contains("tpu_rs:warmup_programs{model_name=\"smollm2\"} 5"),
        "{text}"
    );

    // Three share a system prompt of more than one pass's 32 tokens (chunked prefill, then a
    // cached prefix), one is short: decodes batch as 3 and 4 rows while prompts are pieces.
    let system = "You are a helpful assistant. You answer questions about geography, history \
                  and programming in one short and friendly sentence, without lists. Please \
                  keep each answer kind and clear. ";
    let prompts: Vec<Vec<u32>> = [
        format!("{system}The capital of France is"),
        "Rust is a programming language that".into(),
        format!("{system}Once upon a time"),
        format!("{system}The capital of Italy is"),
    ]
    .iter()
    .map(|p| tok.encode(p, true).unwrap())
    .collect();
    assert!(
        prompts[0].len() > 32 && prompts[0].len() + 5 <= 64,
        "{}",
        prompts[0].len()
    );
    let cpu = Engine::start(cpu_model.clone(), tok.clone(), config(&cpu_model)).unwrap();
    let want = engine::run_all(&cpu, &prompts, 5);
    let got = engine::run_all(&pjrt, &prompts, 5);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((&g.0, &g.1), (&w.0, &w.1));
    }
    assert_eq!(want[0].1, " Paris.\n\nThe");
    let m = pjrt.metrics().snapshot();
    assert_eq!(m.compiles_after_start, 0, "a request compiled a program");
    assert!(m.prefix_hits > 0, "{m:?}");
    assert_eq!(pjrt_model.paged_programs(), 5);
    cpu.shutdown();
    pjrt.shutdown();

    // Mixed passes straight on the compiled path: its logits are the eager native pass's.
    let bs = 16;
    let buckets = PagedBuckets::new(&[2], &[16], &[64]).unwrap();
    let pc = PagedCache::new(&pjrt_model, 12, bs)
        .unwrap()
        .with_buckets(buckets);
    let cc = PagedCache::new(&cpu_model, 12, bs).unwrap();
    let (a, b, c) = (&prompts[1], &prompts[0][..20], &prompts[2]);
    assert!(c.len() > 32);
    let (ta, tb, tc) = ([0usize, 1], [2usize, 3], [4usize, 5, 6]);
    let chunk = |tokens, start, blocks, logits| PagedChunk {
        tokens,
        start,
        blocks,
        logits,
    };
    // A's prompt whole, B's first 4 tokens (no logits wanted); then B's next 16 (a chunk of
    // the largest bucket) with A's next token (a decode); then C's prompt (three
    // pieces) with the decodes of A and B.
    let passes = [
        vec![
            chunk(&a[..], 0, &ta[..], true),
            chunk(&b[..4], 0, &tb[..], false),
        ],
        vec![
            chunk(&b[4..], 4, &tb[..], true),
            chunk(&a[..1], a.len(), &ta[..], true),
        ],
        vec![
            chunk(&a[1..2], a.len() + 1, &ta[..], true),
            chunk(&c[..], 0, &tc[..], true),
            chunk(&b[..1], b.len(), &tb[..], true),
        ],
    ];
    for (k, chunks) in passes.iter().enumerate() {
        let g = pjrt_model.forward_paged(&pc, chunks).unwrap();
        assert_eq!(g.device(), &Device::cpu());
        let w = cpu_model.forward_paged(&cc, chunks).unwrap();
        assert_eq!(g.shape(), w.shape());
        let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
        let worst = g
            .iter()
            .zip(&w)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 2e-3, "pass {k}: logits differ by up to {worst}");
    }
    // A pass past the largest context bucket fails before it runs anything.
    let far = [chunk(&c[..8], 60, &[7usize, 8, 9, 10, 11][..], true)];
    let e = pjrt_model.forward_paged(&pc, &far).unwrap_err();
    assert!(
        e.to_string()
            .contains("68 positions is past the largest bucket of [64]"),
        "{e}"
    );
}
