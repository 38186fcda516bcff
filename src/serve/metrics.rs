//! What the engine counts, and its Prometheus text form under vLLM's metric names (so
//! dashboards made for vLLM read it unchanged). The text format is a few lines per metric;
//! it is written here rather than through a metrics crate, whose registries and global state
//! an embedding application would inherit.

use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// A histogram with fixed bucket bounds (seconds), as Prometheus keeps them.
#[derive(Clone, Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations at most each bound (not cumulative; summed when printed).
    counts: Vec<u64>,
    /// Observations past the last bound.
    over: u64,
    sum: f64,
}

/// vLLM's bounds for time to first token.
const TTFT: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's bounds for the time between tokens.
const ITL: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's bounds for whole requests.
const E2E: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            over: 0,
            sum: 0.0,
        }
    }

    /// Counts one observation.
    pub fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        self.sum += s;
        match self.bounds.iter().position(|&b| s <= b) {
            Some(i) => self.counts[i] += 1,
            None => self.over += 1,
        }
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum::<u64>() + self.over
    }

    /// Their sum, in seconds.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut seen = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            seen += c;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {seen}");
        }
        let all = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {all}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {all}");
    }
}

/// The engine's counters and gauges at one moment.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Sequences in the running batch.
    pub running: usize,
    /// Requests waiting to be admitted.
    pub waiting: usize,
    /// Share of the KV cache's blocks held by sequences (0 to 1).
    pub kv_usage: f64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: u64,
    /// Of those, tokens found.
    pub prefix_hits: u64,
    /// Prompt tokens of finished and running requests.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generation_tokens: u64,
    /// Requests ended, by finish reason (`stop`, `length`, `abort`, `error`).
    pub finished: [(&'static str, u64); 4],
    /// Sequences preempted (their blocks freed, recomputed later).
    pub preemptions: u64,
    /// Passes of the model run.
    pub steps: u64,
    /// Programs compiled in the process after the engine warmed up (compiled functions,
    /// fused graphs and the one-op programs of eager PJRT execution): none while it serves.
    pub compiles_after_start: u64,
    /// Programs compiled when the engine started, and how long that took.
    pub warm_up: (usize, std::time::Duration),
    /// Time to first token.
    pub ttft: Histogram,
    /// Time between a request's tokens.
    pub itl: Histogram,
    /// Whole requests, arrival to end.
    pub e2e: Histogram,
}

impl Default for Snapshot {
    fn default() -> Snapshot {
        Snapshot {
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
            prefix_queries: 0,
            prefix_hits: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            finished: [("stop", 0), ("length", 0), ("abort", 0), ("error", 0)],
            preemptions: 0,
            steps: 0,
            compiles_after_start: 0,
            warm_up: (0, std::time::Duration::ZERO),
            ttft: Histogram::new(TTFT),
            itl: Histogram::new(ITL),
            e2e: Histogram::new(E2E),
        }
    }
}

impl Snapshot {
    /// Counts a request ended for `reason` (one of [`Snapshot::finished`]'s names).
    pub(crate) fn finish(&mut self, reason: &str) {
        if let Some((_, n)) = self.finished.iter_mut().find(|(r, _)| *r == reason) {
            *n += 1;
        }
    }

    /// The Prometheus text form, labelled with `model`.
    pub fn prometheus(&self, model: &str) -> String {
        let labels = format!("model_name=\"{}\"", model.replace(['"', '\\', '\n'], "_"));
        let mut out = String::new();
        let mut one = |name: &str, kind: &str, help: &str, v: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {v}"
            );
        };
        one(
            "vllm:num_requests_running",
            "gauge",
            "Requests in the running batch.",
            self.running.to_string(),
        );
        one(
            "vllm:num_requests_waiting",
            "gauge",
            "Requests waiting to be admitted.",
            self.waiting.to_string(),
        );
        one(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage (1 means full).",
            self.kv_usage.to_string(),
        );
        one(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            self.prefix_queries.to_string(),
        );
        one(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache.",
            self.prefix_hits.to_string(),
        );
        one(
            "vllm:prompt_tokens_total",
            "counter",
            "Prompt tokens processed.",
            self.prompt_tokens.to_string(),
        );
        one(
            "vllm:generation_tokens_total",
            "counter",
            "Tokens generated.",
            self.generation_tokens.to_string(),
        );
        one(
            "vllm:num_preemptions_total",
            "counter",
            "Sequences preempted to free KV-cache blocks.",
            self.preemptions.to_string(),
        );
        one(
            "tpu_rs:engine_steps_total",
            "counter",
            "Passes of the model run by the engine.",
            self.steps.to_string(),
        );
        one(
            "tpu_rs:compiles_since_start_total",
            "counter",
            "Programs compiled in the process since the engine warmed up (0 while it serves).",
            self.compiles_after_start.to_string(),
        );
        one(
            "tpu_rs:warmup_programs",
            "gauge",
            "Programs compiled when the engine started, one per bucket on a PJRT device.",
            self.warm_up.0.to_string(),
        );
        one(
            "tpu_rs:warmup_seconds",
            "gauge",
            "Time the engine took to compile its programs at start.",
            self.warm_up.1.as_secs_f64().to_string(),
        );
        let name = "vllm:request_success_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests ended, by finish reason.\n# TYPE {name} counter"
        );
        for (reason, n) in self.finished {
            let _ = writeln!(out, "{name}{{{labels},finished_reason=\"{reason}\"}} {n}");
        }
        self.ttft.render(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
            &labels,
        );
        self.itl.render(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Time between tokens of a request.",
            &labels,
        );
        self.e2e.render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "Time from a request's arrival to its end.",
            &labels,
        );
        out
    }
}

/// The engine's metrics, shared with whoever reads them.
#[derive(Default)]
pub struct Metrics(Mutex<Snapshot>);

impl Metrics {
    /// A copy of the current values.
    pub fn snapshot(&self) -> Snapshot {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Changes the values.
    pub(crate) fn update(&self, f: impl FnOnce(&mut Snapshot)) {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_print_cumulative_buckets() {
        let mut s = Snapshot::default();
        s.ttft.observe(Duration::from_millis(3));
        s.ttft.observe(Duration::from_millis(30));
        s.ttft.observe(Duration::from_secs(5000));
        s.finish("stop");
        let text = s.prometheus("m");
        let line = |p: &str| text.lines().find(|l| l.starts_with(p)).unwrap().to_string();
        assert_eq!(
            line("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.005\"}"),
            "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.005\"} 1"
        );
        assert!(
            line("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.04\"}")
                .ends_with(" 2")
        );
        assert!(
            line("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"}")
                .ends_with(" 3")
        );
        assert!(line("vllm:time_to_first_token_seconds_count").ends_with(" 3"));
        assert!(
            text.contains(
                "vllm:request_success_total{model_name=\"m\",finished_reason=\"stop\"} 1"
            )
        );
    }
}
