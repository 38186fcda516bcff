//! The serving engine on the real SmolLM2 model (quantised, native CPU): the paged pass gives
//! the plain pass's logits, and continuous batching, chunked prefill, prefix caching and
//! preemption never change what a greedy request produces.
//!
//! The model comes from the model cache (`TPU_RS_MODELS`); CI installs it and sets
//! `TPU_RS_REQUIRE_MODELS=1`, which makes a missing model a failure instead of a skip.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tpu_rs::models::llama::{PagedCache, PagedChunk};
use tpu_rs::models::{GenerateOptions, KvCache, Llama, SMOLLM2, TextTokenizer, WeightFormat};
use tpu_rs::prelude::*;
use tpu_rs::serve::{Admission, Engine, EngineConfig, Event, Finish, Request, Sink};
use tpu_rs::tpu_tensor::GgufFile;

mod common;
#[path = "common/engine.rs"]
mod engine;

use engine::run_all;

fn model() -> Option<&'static (Arc<Llama>, Arc<TextTokenizer>)> {
    static M: OnceLock<Option<(Arc<Llama>, Arc<TextTokenizer>)>> = OnceLock::new();
    M.get_or_init(|| {
        let path = common::model_or_skip(&SMOLLM2)?;
        let tok = TextTokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        let m = Llama::from_gguf_with(&path, &Device::cpu(), WeightFormat::Quantized).unwrap();
        Some((Arc::new(m), Arc::new(tok)))
    })
    .as_ref()
}

/// The plain pass's last logits after `ids`.
fn plain(m: &Llama, ids: &[u32]) -> Vec<f32> {
    let t = Tensor::from_vec(
        ids.iter().map(|&i| i as i64).collect::<Vec<_>>(),
        [1, ids.len()],
        &Device::cpu(),
    )
    .unwrap();
    m.forward(&t, &mut KvCache::new(), true)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 2e-3, "{what}: logits differ by up to {worst}");
}

#[test]
fn a_paged_pass_gives_the_plain_passs_logits() {
    let Some((m, tok)) = model() else { return };
    let a = tok
        .encode(
            "The capital of France is Paris. The capital of Italy is Rome. The capital of \
             Germany is Berlin. The capital of Portugal is Lisbon. The capital of Spain is",
            true,
        )
        .unwrap();
    let b = tok
        .encode("Rust is a programming language that", true)
        .unwrap();
    assert!(a.len() > 20 && a.len() <= 48 && b.len() > 1 && b.len() < 16);
    let cache = PagedCache::new(m, 12, 8).unwrap();
    // Scattered, out-of-order blocks.
    let (blocks_a, blocks_b) = ([5, 2, 9, 0, 11, 4], [7, 3]);
    let vocab = m.config.vocab_size;
    // Pass 1: a's first 11 tokens (no logits) beside b whole.
    let out = m
        .forward_paged(
            &cache,
            &[
                PagedChunk {
                    tokens: &a[..11],
                    start: 0,
                    blocks: &blocks_a,
                    logits: false,
                },
                PagedChunk {
                    tokens: &b,
                    start: 0,
                    blocks: &blocks_b,
                    logits: true,
                },
            ],
        )
        .unwrap();
    assert_eq!(out.shape(), [1, vocab]);
    assert_close("b's prompt", &out.to_vec::<f32>().unwrap(), &plain(m, &b));
    // Pass 2: b decodes one token (a one-token chunk) beside the rest of a.
    let next = 42u32;
    let out = m
        .forward_paged(
            &cache,
            &[
                PagedChunk {
                    tokens: &a[11..],
                    start: 11,
                    blocks: &blocks_a,
                    logits: true,
                },
                PagedChunk {
                    tokens: &[next],
                    start: b.len(),
                    blocks: &blocks_b,
                    logits: true,
                },
            ],
        )
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_close("a's prompt", &out[..vocab], &plain(m, &a));
    let mut b_next = b.clone();
    b_next.push(next);
    assert_close("b's decode", &out[vocab..], &plain(m, &b_next));
    // Bad chunks are errors that say what is wrong.
    let e = m
        .forward_paged(
            &cache,
            &[PagedChunk {
                tokens: &a,
                start: 0,
                blocks: &blocks_b,
                logits: true,
            }],
        )
        .unwrap_err();
    assert!(e.to_string().contains("its 2 blocks of 8 hold 16"), "{e}");
    let e = m
        .forward_paged(
            &cache,
            &[PagedChunk {
                tokens: &b,
                start: 0,
                blocks: &[12, 0],
                logits: true,
            }],
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("lists block 12, the cache has 12"),
        "{e}"
    );
    assert!(m.forward_paged(&cache, &[]).is_err());
}

fn prompts(tok: &TextTokenizer) -> Vec<Vec<u32>> {
    let system = "You are a helpful assistant. You answer questions about geography, history \
                  and programming in one short and friendly sentence, without lists. ";
    // Three share a long system prompt (a cached prefix), two are the same prompt.
    [
        (true, "The capital of France is"),
        (false, "Rust is a programming language that"),
        (true, "Once upon a time"),
        (true, "The capital of France is"),
    ]
    .iter()
    .map(|&(sys, p)| {
        let text = if sys {
            format!("{system}{p}")
        } else {
            p.into()
        };
        tok.encode(&text, true).unwrap()
    })
    .collect()
}

/// Waits until the engine's KV cache is free (its gauges are published after each pass).
fn wait_free(engine: &Engine) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while engine.metrics().snapshot().kv_usage != 0.0 {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            engine.metrics().snapshot()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn continuous_batching_prefix_caching_and_preemption_keep_each_requests_tokens() {
    let Some((m, tok)) = model() else { return };
    let prompts = prompts(tok);
    // Few and short: tests run unoptimised model code.
    let max_new = 4;
    let start = |config: EngineConfig| Engine::start(m.clone(), tok.clone(), config).unwrap();
    // Each alone.
    let alone = start(EngineConfig::default());
    let want: Vec<_> = prompts
        .iter()
        .map(|p| run_all(&alone, std::slice::from_ref(p), max_new).remove(0))
        .collect();
    for (ids, _, u) in &want {
        assert_eq!(ids.len(), max_new);
        assert_eq!((u.finish, u.completion_tokens), (Finish::Length, max_new));
    }
    // The shared system prompt and the repeated prompt were found cached.
    assert_eq!(want[0].2.cached_tokens, 0);
    assert!(want[2].2.cached_tokens >= 16, "{:?}", want[2].2);
    assert_eq!(want[3].2.cached_tokens, (prompts[3].len() - 1) / 16 * 16);
    // Together, with prompts cut into pieces of at most 13 tokens per pass.
    let chunked = start(EngineConfig {
        max_batch_tokens: 13,
        ..EngineConfig::default()
    });
    let got = run_all(&chunked, &prompts, max_new);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.0, w.0, "prompt {i} in a batch, prefill chunked");
        assert_eq!(g.1, w.1, "prompt {i}'s text");
    }
    let s = chunked.metrics().snapshot();
    assert_eq!(s.generation_tokens, (prompts.len() * max_new) as u64);
    assert!(
        s.prefix_hits > 0,
        "the shared system prompt was found cached"
    );
    assert_eq!(s.finished[1], ("length", prompts.len() as u64));
    chunked.shutdown();
    // A cache of 20 blocks of 4 cannot hold them all: sequences are preempted and
    // recomputed, with the same tokens.
    let per_block = PagedCache::block_bytes(m, 4);
    let small = start(EngineConfig {
        kv_cache_bytes: 20 * per_block,
        block_size: 4,
        ..EngineConfig::default()
    });
    let got = run_all(&small, &prompts, max_new);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.0, w.0, "prompt {i} with a small cache");
    }
    wait_free(&small);
    let s = small.metrics().snapshot();
    assert!(s.preemptions > 0, "expected preemptions: {s:?}");
    small.shutdown();
}

#[test]
fn requests_are_checked_cancelled_timed_out_and_turned_away() {
    let Some((m, tok)) = model() else { return };
    let engine = Engine::start(
        m.clone(),
        tok.clone(),
        EngineConfig {
            max_waiting: 2,
            max_running: 1,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let req = |prompt: Vec<u32>, max_new: usize| Request {
        prompt,
        options: GenerateOptions {
            max_new,
            ..GenerateOptions::default()
        },
        logprobs: None,
        deadline: None,
    };
    let hi = tok.encode("Hi", true).unwrap();
    let sink = || crossbeam_channel::unbounded::<Event>().0;
    let msg = |r: Request| engine.submit(r, sink()).unwrap_err().to_string();
    assert!(msg(req(vec![], 4)).contains("no tokens"));
    assert!(msg(req(hi.clone(), 0)).contains("max_tokens is 0"));
    assert!(msg(req(vec![60000], 4)).contains("token 60000, the vocabulary has 49152"));
    let ctx = engine.context();
    assert!(msg(req(hi.clone(), ctx + 5)).contains(&format!("the context holds {ctx}")));
    let mut bad = req(hi.clone(), 4);
    bad.options.sampling.top_p = 0.0;
    assert!(msg(bad).contains("top_p"));
    // A receiver dropped at once: the request ends as aborted, its blocks freed.
    let (tx, rx) = crossbeam_channel::unbounded();
    drop(rx);
    engine.submit(req(hi.clone(), 50), tx).unwrap();
    // A deadline already past: it ends with a timeout.
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut late = req(hi.clone(), 50);
    late.deadline = Some(Instant::now());
    engine.submit(late, tx).unwrap();
    let timed_out = loop {
        match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
            Event::Done(u) => break u,
            Event::Token { .. } => {}
            Event::Failed(e) => panic!("{e}"),
        }
    };
    assert_eq!(timed_out.finish, Finish::Timeout);
    let deadline = Instant::now() + Duration::from_secs(60);
    while engine.metrics().snapshot().finished[2].1 < 2 {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            engine.metrics().snapshot()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_free(&engine);
    // A full queue turns requests away: one request runs (a batch of one), two wait, the
    // next is busy.
    let mut queued = Vec::new();
    let mut busy = None;
    for _ in 0..5 {
        let (tx, rx) = crossbeam_channel::unbounded();
        match engine.submit(req(hi.clone(), 200), tx).unwrap() {
            Admission::Busy { waiting } => {
                busy = Some(waiting);
                break;
            }
            Admission::Queued => queued.push(rx),
        }
    }
    assert_eq!(busy, Some(2));
    assert!((2..=3).contains(&queued.len()), "{}", queued.len());
    // Shutting down ends everything left.
    engine.shutdown();
    for rx in &queued {
        let last = rx.try_iter().last().expect("an event");
        assert!(
            matches!(last, Event::Done(u) if u.finish == Finish::Shutdown),
            "{last:?}"
        );
    }
}

/// A request's sink that panics on its `at`-th event (counting from 1), or on `closed()`
/// once it has seen an event when `at` is 0; it passes events on until then.
struct PanickySink {
    tx: crossbeam_channel::Sender<Event>,
    seen: usize,
    at: usize,
}

impl Sink for PanickySink {
    fn send(&mut self, event: Event) -> bool {
        self.seen += 1;
        if self.seen == self.at {
            panic!("a sink that panics on event {}", self.at);
        }
        self.tx.send(event).is_ok()
    }

    fn closed(&self) -> bool {
        if self.at == 0 && self.seen > 0 {
            panic!("a sink that panics when asked whether it is closed");
        }
        false
    }
}

#[test]
fn a_request_whose_code_panics_fails_alone_and_the_engine_goes_on() {
    let Some((m, tok)) = model() else { return };
    let engine = Engine::start(m.clone(), tok.clone(), EngineConfig::default()).unwrap();
    let prompts = prompts(tok);
    let want = run_all(&engine, &prompts[..1], 6);
    let options = GenerateOptions {
        max_new: 6,
        ..GenerateOptions::default()
    };
    let req = |p: &Vec<u32>| Request {
        prompt: p.clone(),
        options: options.clone(),
        logprobs: None,
        deadline: None,
    };
    // Panics on its second token, on its last event (the usage), and when the engine asks
    // whether it is closed, beside two requests that run to their end.
    let mut receivers = Vec::new();
    for at in [2, 7, 0] {
        let (tx, rx) = crossbeam_channel::unbounded();
        let sink = PanickySink { tx, seen: 0, at };
        assert_eq!(
            engine.submit(req(&prompts[1]), sink).unwrap(),
            Admission::Queued
        );
        receivers.push(rx);
    }
    let got = run_all(&engine, &[prompts[0].clone(), prompts[0].clone()], 6);
    for g in &got {
        assert_eq!((&g.0, &g.1), (&want[0].0, &want[0].1));
    }
    // The panicking requests end without their usage: their receivers see the sender
    // dropped, after the events delivered before the panic.
    for (rx, delivered) in receivers.iter().zip([1, 6, 1]) {
        let events: Vec<Event> = rx.iter().collect();
        assert_eq!(events.len(), delivered, "{events:?}");
        assert!(events.iter().all(|e| matches!(e, Event::Token { .. })));
    }
    // The engine still serves.
    let again = run_all(&engine, &prompts[..1], 6);
    assert_eq!(again[0].0, want[0].0);
    wait_free(&engine);
    engine.shutdown();
}
