//! A load generator for OpenAI-compatible servers (`tpu-rs bench-serve`), reporting what vLLM's
//! `bench serve` reports: requests and tokens per second, and the mean, median and 99th
//! percentile of time to first token (TTFT), time per output token after the first (TPOT),
//! inter-token latency (ITL) and end-to-end latency.
//!
//! Two datasets: `random` sends prompts of exactly `input_len` random token ids to
//! `/v1/completions` and asks for exactly `output_len` tokens (`ignore_eos`), so two servers
//! of the same model do the same work; `chat` sends a fixed set of chat-like questions of
//! varied lengths to `/v1/chat/completions`. Requests start at a given rate (Poisson
//! arrivals, or all at once) with at most a given number in flight; every request streams, and
//! each content event counts as one token's arrival (servers send one token per event).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

/// What to send, and how fast.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The server, as `http://host:port`.
    pub base_url: String,
    /// The `model` to ask for.
    pub model: String,
    /// `random` or `chat`.
    pub dataset: String,
    /// Requests in all.
    pub num_prompts: usize,
    /// Prompt tokens per request (`random`).
    pub input_len: usize,
    /// Tokens asked for per request.
    pub output_len: usize,
    /// Requests in flight at most.
    pub max_concurrency: usize,
    /// Requests started per second (Poisson arrivals); `None`: all at once.
    pub request_rate: Option<f64>,
    /// Seeds the prompts and the arrivals.
    pub seed: u64,
    /// Token ids of `random` prompts are drawn below this (the vocabulary size).
    pub vocab: u32,
}

impl Default for BenchConfig {
    fn default() -> BenchConfig {
        BenchConfig {
            base_url: "http://127.0.0.1:8000".into(),
            model: "smollm2".into(),
            dataset: "random".into(),
            num_prompts: 64,
            input_len: 128,
            output_len: 128,
            max_concurrency: 8,
            request_rate: None,
            seed: 0,
            vocab: 49152,
        }
    }
}

/// One request's timings.
#[derive(Clone, Debug, Default)]
pub struct Timing {
    /// Whether it succeeded.
    pub ok: bool,
    /// What went wrong, when it failed.
    pub error: String,
    /// Prompt tokens (as the server counted them, or as sent).
    pub input_tokens: usize,
    /// Output tokens (the server's count, or the events with text).
    pub output_tokens: usize,
    /// Time to the first token.
    pub ttft: Duration,
    /// Times between tokens.
    pub itl: Vec<Duration>,
    /// Time to the end.
    pub latency: Duration,
}

/// Mean, median and 99th percentile, in milliseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// The mean.
    pub mean: f64,
    /// The median.
    pub median: f64,
    /// The 99th percentile.
    pub p99: f64,
}

impl Stats {
    fn of(mut ms: Vec<f64>) -> Stats {
        if ms.is_empty() {
            return Stats::default();
        }
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| {
            // Linear between closest ranks, as numpy's percentile.
            let x = q * (ms.len() - 1) as f64;
            let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
            ms[lo] + (ms[hi] - ms[lo]) * (x - lo as f64)
        };
        Stats {
            mean: ms.iter().sum::<f64>() / ms.len() as f64,
            median: at(0.5),
            p99: at(0.99),
        }
    }
}

/// A benchmark's results.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Requests that succeeded.
    pub completed: usize,
    /// Requests that failed.
    pub failed: usize,
    /// The first failure's message.
    pub first_error: String,
    /// Wall time from the first request's start to the last one's end.
    pub duration: Duration,
    /// Prompt tokens of the successful requests.
    pub input_tokens: usize,
    /// Output tokens of the successful requests.
    pub output_tokens: usize,
    /// Time to first token.
    pub ttft: Stats,
    /// Time per output token after the first.
    pub tpot: Stats,
    /// Time between tokens.
    pub itl: Stats,
    /// End-to-end latency.
    pub e2el: Stats,
}

impl Report {
    /// Requests per second.
    pub fn request_throughput(&self) -> f64 {
        self.completed as f64 / self.duration.as_secs_f64()
    }

    /// Output tokens per second.
    pub fn output_throughput(&self) -> f64 {
        self.output_tokens as f64 / self.duration.as_secs_f64()
    }

    /// The report as vLLM prints it.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let mut line = |k: &str, v: String| t.push_str(&format!("{k:<40}{v:>12}\n"));
        line("Successful requests:", self.completed.to_string());
        line("Failed requests:", self.failed.to_string());
        line(
            "Benchmark duration (s):",
            format!("{:.2}", self.duration.as_secs_f64()),
        );
        line("Total input tokens:", self.input_tokens.to_string());
        line("Total generated tokens:", self.output_tokens.to_string());
        line(
            "Request throughput (req/s):",
            format!("{:.2}", self.request_throughput()),
        );
        line(
            "Output token throughput (tok/s):",
            format!("{:.2}", self.output_throughput()),
        );
        line(
            "Total token throughput (tok/s):",
            format!(
                "{:.2}",
                (self.input_tokens + self.output_tokens) as f64 / self.duration.as_secs_f64()
            ),
        );
        for (name, s) in [
            ("TTFT", self.ttft),
            ("TPOT", self.tpot),
            ("ITL", self.itl),
            ("E2EL", self.e2el),
        ] {
            line(&format!("Mean {name} (ms):"), format!("{:.2}", s.mean));
            line(&format!("Median {name} (ms):"), format!("{:.2}", s.median));
            line(&format!("P99 {name} (ms):"), format!("{:.2}", s.p99));
        }
        if self.failed > 0 {
            t.push_str(&format!("First error: {}\n", self.first_error));
        }
        t
    }

    fn of(timings: &[Timing], duration: Duration) -> Report {
        let ok: Vec<&Timing> = timings.iter().filter(|t| t.ok).collect();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Report {
            completed: ok.len(),
            failed: timings.len() - ok.len(),
            first_error: timings
                .iter()
                .find(|t| !t.ok)
                .map(|t| t.error.clone())
                .unwrap_or_default(),
            duration,
            input_tokens: ok.iter().map(|t| t.input_tokens).sum(),
            output_tokens: ok.iter().map(|t| t.output_tokens).sum(),
            ttft: Stats::of(ok.iter().map(|t| ms(t.ttft)).collect()),
            tpot: Stats::of(
                ok.iter()
                    .filter(|t| t.output_tokens > 1)
                    .map(|t| ms(t.latency - t.ttft) / (t.output_tokens - 1) as f64)
                    .collect(),
            ),
            itl: Stats::of(
                ok.iter()
                    .flat_map(|t| t.itl.iter().map(|&d| ms(d)))
                    .collect(),
            ),
            e2el: Stats::of(ok.iter().map(|t| ms(t.latency)).collect()),
        }
    }
}

/// splitmix64: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Chat-like questions of varied lengths.
const QUESTIONS: &[&str] = &[
    "What is the capital of France?",
    "Explain in a few sentences why the sky is blue.",
    "Write a short poem about the sea.",
    "Give me three tips for learning a new programming language, with a sentence on each.",
    "What is the difference between a list and a tuple in Python?",
    "Summarise the plot of Romeo and Juliet.",
    "How do I make a cup of tea? Describe the steps.",
    "I am planning a trip to Japan in the spring. Which cities should I visit, and what should \
     I see there? I like gardens, old temples and good food, and I have ten days.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "What are the main causes of climate change, and what can one person do about it?",
    "Tell me a joke about computers.",
    "Describe how a rainbow forms, for a child of seven.",
];

/// The request body and path of prompt `i`.
fn request(c: &BenchConfig, i: usize, rng: &mut Rng) -> (String, Value, usize) {
    let mut body = match c.dataset.as_str() {
        "chat" => json!({
            "model": c.model,
            "messages": [{"role": "user", "content": QUESTIONS[i % QUESTIONS.len()]}],
            "max_tokens": c.output_len,
        }),
        _ => {
            // Ids past the special tokens and the byte tokens.
            let ids: Vec<u32> = (0..c.input_len)
                .map(|_| {
                    1000 + (rng.next() % u64::from(c.vocab.saturating_sub(1000).max(1))) as u32
                })
                .collect();
            json!({
                "model": c.model,
                "prompt": ids,
                "max_tokens": c.output_len,
                "ignore_eos": true,
            })
        }
    };
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body["temperature"] = json!(0);
    let path = match c.dataset.as_str() {
        "chat" => "/v1/chat/completions",
        _ => "/v1/completions",
    };
    let input = if c.dataset == "chat" { 0 } else { c.input_len };
    (format!("{}{path}", c.base_url), body, input)
}

/// Sends one streaming request and times its tokens.
async fn one(client: reqwest::Client, url: String, body: Value, input: usize) -> Timing {
    let start = Instant::now();
    let mut t = Timing {
        input_tokens: input,
        ..Timing::default()
    };
    let r = match client.post(&url).json(&body).send().await {
        Ok(r) => r,
        Err(e) => {
            t.error = chain(&e);
            return t;
        }
    };
    if !r.status().is_success() {
        t.error = format!("{}: {}", r.status(), r.text().await.unwrap_or_default());
        return t;
    }
    let mut stream = r.bytes_stream();
    let (mut buf, mut last, mut events) = (String::new(), None::<Instant>, 0);
    let mut usage: Option<Value> = None;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                t.error = chain(&e);
                return t;
            }
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if let Some(e) = v.get("error") {
                t.error = e.to_string();
                return t;
            }
            if v.get("usage").is_some_and(|u| !u.is_null()) {
                usage = v.get("usage").cloned();
            }
            let c = &v["choices"][0];
            let text = c["text"]
                .as_str()
                .or_else(|| c["delta"]["content"].as_str())
                .unwrap_or_default();
            if text.is_empty() {
                continue;
            }
            let now = Instant::now();
            match last {
                None => t.ttft = now - start,
                Some(l) => t.itl.push(now - l),
            }
            last = Some(now);
            events += 1;
        }
    }
    t.latency = start.elapsed();
    t.output_tokens = usage
        .as_ref()
        .and_then(|u| u["completion_tokens"].as_u64())
        .map_or(events, |n| n as usize);
    if let Some(p) = usage.as_ref().and_then(|u| u["prompt_tokens"].as_u64()) {
        t.input_tokens = p as usize;
    }
    t.ok = events > 0;
    if !t.ok {
        t.error = "no tokens came".into();
    }
    t
}

/// An error and its causes, for the report.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(&format!(": {c}"));
        cause = c.source();
    }
    s
}

/// Runs the benchmark.
pub async fn run(c: &BenchConfig) -> Report {
    // A connection per request: a pooled one that the server has closed meanwhile would fail
    // the request (servers differ in how long they keep idle connections).
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap_or_default();
    let mut rng = Rng(c.seed);
    let gate = Arc::new(tokio::sync::Semaphore::new(c.max_concurrency.max(1)));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(c.num_prompts);
    for i in 0..c.num_prompts {
        let (url, body, input) = request(c, i, &mut rng);
        if let Some(rate) = c.request_rate.filter(|r| r.is_finite() && *r > 0.0) {
            // Exponential gaps: Poisson arrivals.
            let gap = -(1.0 - rng.uniform()).ln() / rate;
            tokio::time::sleep(Duration::from_secs_f64(gap)).await;
        }
        let permit = gate.clone().acquire_owned().await;
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let t = one(client, url, body, input).await;
            drop(permit);
            t
        }));
    }
    let mut timings = Vec::with_capacity(tasks.len());
    for task in tasks {
        timings.push(task.await.unwrap_or_else(|e| Timing {
            error: e.to_string(),
            ..Timing::default()
        }));
    }
    Report::of(&timings, start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let s = Stats::of(vec![4.0, 1.0, 3.0, 2.0]);
        assert_eq!((s.mean, s.median), (2.5, 2.5));
        assert!((s.p99 - 3.97).abs() < 1e-12);
        assert_eq!(Stats::of(vec![]).median, 0.0);
    }
}
