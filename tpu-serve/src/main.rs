//! `tpu-rs serve`: the OpenAI-compatible server; `tpu-rs bench-serve`: a load generator for it
//! (or any OpenAI-compatible server).
//!
//! ```sh
//! cargo run --release -p tpu-serve -- serve --model smollm2 --port 8000
//! curl localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \
//!   -d '{"model": "smollm2", "messages": [{"role": "user", "content": "Hi!"}]}'
//! cargo run --release -p tpu-serve -- bench-serve --max-concurrency 8 --num-prompts 64
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tpu_rs::models::{MINILM, SMOLLM2, locate};
use tpu_rs::prelude::*;
use tpu_serve::{AppState, ServerConfig};

const USAGE: &str = "usage: tpu-rs serve [options]
       tpu-rs bench-serve [options]

serve options:
  --model NAME|FILE        smollm2 (installed into the model cache on first use) or a GGUF
                           Llama file                                   [smollm2]
  --served-name NAME       the name clients give as `model`             [the model's]
  --embedding-model NAME   minilm, or none                              [minilm]
  --device DEVICE          cpu, pjrt, tpu, ...                          [cpu]
  --host ADDR              address to listen on                         [127.0.0.1]
  --port PORT              port to listen on                            [8000]
  --kv-cache-mib N         memory for the KV cache                      [512]
  --block-size N           positions per KV-cache block                 [16]
  --max-batch-tokens N     new tokens one engine pass takes at most     [512]
  --max-running N          sequences in the running batch at most       [64]
  --max-waiting N          queued requests at most (more get 429)       [256]
  --max-model-len N        positions a request may take (0: the model's) [0]
  --timeout-s N            a request running longer is ended (0: never) [600]

bench-serve options:
  --base-url URL           the server                       [http://127.0.0.1:8000]
  --model NAME             the model to ask for             [smollm2]
  --dataset random|chat    random token prompts (exact lengths, ignore_eos) or chat
                           questions                        [random]
  --num-prompts N          requests in all                  [64]
  --input-len N            prompt tokens (random)           [128]
  --output-len N           tokens per request               [128]
  --max-concurrency N      requests in flight at most       [8]
  --request-rate R         requests per second, Poisson (inf: all at once) [inf]
  --seed N                 seeds prompts and arrivals       [0]";

/// The value after `flag` in `args`, removed from them.
fn take(args: &mut Vec<String>, flag: &str) -> Result<Option<String>> {
    match args.iter().position(|a| a == flag) {
        Some(i) if i + 1 < args.len() => {
            let v = args.remove(i + 1);
            args.remove(i);
            Ok(Some(v))
        }
        Some(_) => Err(Error::invalid_argument(
            "serve",
            format!("{flag} needs a value"),
        )),
        None => Ok(None),
    }
}

/// A count given after `flag`, or `default`.
fn count(args: &mut Vec<String>, flag: &str, default: usize) -> Result<usize> {
    match take(args, flag)? {
        Some(v) => v.parse().map_err(|_| {
            Error::invalid_argument("serve", format!("{flag} {v:?} is not a whole number"))
        }),
        None => Ok(default),
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let command = args.first().cloned().unwrap_or_default();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        eprintln!("{USAGE}");
        return Ok(());
    }
    match command.as_str() {
        "serve" => {}
        "bench-serve" => {
            args.remove(0);
            return bench(args);
        }
        _ => {
            eprintln!("{USAGE}");
            return Err(Error::invalid_argument(
                "tpu-rs",
                format!("expected `serve` or `bench-serve`, got {command:?}"),
            ));
        }
    }
    args.remove(0);
    let model = take(&mut args, "--model")?.unwrap_or_else(|| "smollm2".into());
    let embedding = take(&mut args, "--embedding-model")?.unwrap_or_else(|| "minilm".into());
    let device = Device::parse(&take(&mut args, "--device")?.unwrap_or_else(|| "cpu".into()))?;
    let host = take(&mut args, "--host")?.unwrap_or_else(|| "127.0.0.1".into());
    let port = count(&mut args, "--port", 8000)?;
    let defaults = ServerConfig::default();
    let mut config = defaults.clone();
    config.engine.kv_cache_bytes = count(&mut args, "--kv-cache-mib", 512)? << 20;
    config.engine.block_size = count(&mut args, "--block-size", 16)?;
    config.engine.max_batch_tokens = count(&mut args, "--max-batch-tokens", 512)?;
    config.engine.max_running = count(&mut args, "--max-running", 64)?;
    config.engine.max_waiting = count(&mut args, "--max-waiting", 256)?;
    config.engine.max_model_len = match count(&mut args, "--max-model-len", 0)? {
        0 => None,
        n => Some(n),
    };
    config.request_timeout = match count(&mut args, "--timeout-s", 600)? {
        0 => None,
        s => Some(Duration::from_secs(s as u64)),
    };
    let served = take(&mut args, "--served-name")?;
    if let Some(a) = args.first() {
        return Err(Error::invalid_argument(
            "serve",
            format!("unknown argument {a:?}\n{USAGE}"),
        ));
    }
    let (path, name) = if model == "smollm2" {
        (locate(&SMOLLM2, true)?, "smollm2".to_string())
    } else {
        let p = PathBuf::from(&model);
        let stem = p
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        (p, stem)
    };
    config.model_name = served.unwrap_or(name);
    let embedder = match embedding.as_str() {
        "none" => None,
        "minilm" => Some(("all-minilm-l6-v2".to_string(), locate(&MINILM, true)?)),
        other => {
            return Err(Error::invalid_argument(
                "serve",
                format!("--embedding-model {other:?}: expected minilm or none"),
            ));
        }
    };
    let t0 = Instant::now();
    let state = AppState::load(
        &path,
        &device,
        config,
        embedder.as_ref().map(|(n, p)| (n.clone(), p.as_path())),
    )?;
    let (programs, warm) = state.engine.warm_up();
    eprintln!(
        "loaded {} on {device} in {:.1} s; requests of up to {} positions{}",
        state.model_name,
        t0.elapsed().as_secs_f64(),
        state.engine.context(),
        match programs {
            0 => String::new(),
            n => format!(
                "; warmed up {n} programs (one per bucket) in {:.1} s",
                warm.as_secs_f64()
            ),
        }
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the async runtime", e))?;
    runtime.block_on(async move {
        let addr = format!("{host}:{port}");
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| Error::io(format!("listening on {addr}"), e))?;
        eprintln!("serving {} on http://{addr}", state.model_name);
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("shutting down: finishing the requests in flight");
        };
        tpu_serve::serve(listener, Arc::new(state), shutdown)
            .await
            .map_err(|e| Error::io("serving", e))
    })
}

/// `tpu-rs bench-serve`.
fn bench(mut args: Vec<String>) -> Result<()> {
    let d = tpu_serve::bench::BenchConfig::default();
    let c = tpu_serve::bench::BenchConfig {
        base_url: take(&mut args, "--base-url")?.unwrap_or(d.base_url),
        model: take(&mut args, "--model")?.unwrap_or(d.model),
        dataset: take(&mut args, "--dataset")?.unwrap_or(d.dataset),
        num_prompts: count(&mut args, "--num-prompts", d.num_prompts)?,
        input_len: count(&mut args, "--input-len", d.input_len)?,
        output_len: count(&mut args, "--output-len", d.output_len)?,
        max_concurrency: count(&mut args, "--max-concurrency", d.max_concurrency)?,
        request_rate: match take(&mut args, "--request-rate")? {
            None => None,
            Some(r) if r == "inf" => None,
            Some(r) => Some(r.parse().map_err(|_| {
                Error::invalid_argument(
                    "bench-serve",
                    format!("--request-rate {r:?} is not a number"),
                )
            })?),
        },
        seed: count(&mut args, "--seed", 0)? as u64,
        vocab: d.vocab,
    };
    if !["random", "chat"].contains(&c.dataset.as_str()) {
        return Err(Error::invalid_argument(
            "bench-serve",
            format!("--dataset {:?}: expected random or chat", c.dataset),
        ));
    }
    if let Some(a) = args.first() {
        return Err(Error::invalid_argument(
            "bench-serve",
            format!("unknown argument {a:?}\n{USAGE}"),
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the async runtime", e))?;
    let report = runtime.block_on(tpu_serve::bench::run(&c));
    println!(
        "{} at {} ({} prompts, concurrency {}, {}):",
        c.model,
        c.base_url,
        c.num_prompts,
        c.max_concurrency,
        match c.dataset.as_str() {
            "random" => format!("random {} in / {} out", c.input_len, c.output_len),
            _ => format!("chat, up to {} out", c.output_len),
        }
    );
    print!("{}", report.table());
    if report.completed == 0 {
        return Err(Error::invalid_argument(
            "bench-serve",
            format!("every request failed: {}", report.first_error),
        ));
    }
    Ok(())
}
