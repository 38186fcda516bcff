//! Figures of every compiled function, like torch_xla's metrics report: compiles and their
//! time, memory- and disk-cache hits, executions and their time, graph sizes before and after the passes, and
//! why each recompile happened.

use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The figures of one compiled function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FnMetrics {
    /// The function's name.
    pub name: String,
    /// Calls (and graph or StableHLO requests).
    pub calls: u64,
    /// Programs compiled (each a cache miss).
    pub compiles: u64,
    /// Time spent tracing, optimising and compiling.
    pub compile_time: Duration,
    /// Calls that found their program.
    pub hits: u64,
    /// Programs run.
    pub executions: u64,
    /// Time spent running them (up to the return of asynchronous launches).
    pub execution_time: Duration,
    /// Programs loaded from the disk cache instead of compiled.
    pub disk_hits: u64,
    /// Programs the disk cache did not have (compiled, then stored).
    pub disk_misses: u64,
    /// Disk cache entries rejected as corrupt, truncated or foreign (then compiled again).
    pub disk_rejected: u64,
    /// Bytes in the disk cache after this function last used it.
    pub disk_bytes: u64,
    /// Nodes traced, over all programs.
    pub nodes_traced: usize,
    /// Nodes left after the passes, over all programs.
    pub nodes_optimized: usize,
    /// Why each recompile happened, in order.
    pub recompile_reasons: Vec<String>,
}

/// The figures of every live compiled function, and their total.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// One row per compiled function, in order of creation.
    pub functions: Vec<FnMetrics>,
}

impl Metrics {
    /// The sum over all functions.
    pub fn total(&self) -> FnMetrics {
        let mut t = FnMetrics {
            name: "total".into(),
            ..FnMetrics::default()
        };
        for f in &self.functions {
            t.calls += f.calls;
            t.compiles += f.compiles;
            t.compile_time += f.compile_time;
            t.hits += f.hits;
            t.disk_hits += f.disk_hits;
            t.disk_misses += f.disk_misses;
            t.disk_rejected += f.disk_rejected;
            t.disk_bytes = t.disk_bytes.max(f.disk_bytes);
            t.executions += f.executions;
            t.execution_time += f.execution_time;
            t.nodes_traced += f.nodes_traced;
            t.nodes_optimized += f.nodes_optimized;
        }
        t
    }
}

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<24} {:>7} {:>8} {:>12} {:>7} {:>11} {:>10} {:>12} {:>13}",
            "function",
            "calls",
            "compiles",
            "compile ms",
            "hits",
            "disk hit/miss",
            "runs",
            "run ms",
            "nodes (opt)"
        )?;
        let total = self.total();
        for m in self.functions.iter().chain(std::iter::once(&total)) {
            writeln!(
                f,
                "{:<24} {:>7} {:>8} {:>12.1} {:>7} {:>13} {:>10} {:>12.1} {:>13}",
                m.name,
                m.calls,
                m.compiles,
                m.compile_time.as_secs_f64() * 1e3,
                m.hits,
                format!("{}/{}", m.disk_hits, m.disk_misses),
                m.executions,
                m.execution_time.as_secs_f64() * 1e3,
                format!("{} ({})", m.nodes_traced, m.nodes_optimized)
            )?;
        }
        Ok(())
    }
}

static FUNCTIONS: Mutex<Vec<Weak<Mutex<FnMetrics>>>> = Mutex::new(Vec::new());

/// A new row for a compiled function named `name` (or `function#N`).
pub(crate) fn register(name: Option<String>) -> Arc<Mutex<FnMetrics>> {
    let mut all = FUNCTIONS.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|w| w.strong_count() > 0);
    let name = name.unwrap_or_else(|| format!("function#{}", all.len()));
    let m = Arc::new(Mutex::new(FnMetrics {
        name,
        ..FnMetrics::default()
    }));
    all.push(Arc::downgrade(&m));
    m
}

/// The figures of every compiled function alive now.
pub fn metrics() -> Metrics {
    let all = FUNCTIONS.lock().unwrap_or_else(|e| e.into_inner());
    Metrics {
        functions: all
            .iter()
            .filter_map(Weak::upgrade)
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect(),
    }
}
