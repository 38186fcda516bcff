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

/// The figures of the fused execution mode ([`crate::mode`]): its flushes, each of which runs
/// the ops deferred until then as one graph.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FusedMetrics {
    /// Graphs of deferred ops run.
    pub flushes: u64,
    /// Flushes that found their program in the memory cache.
    pub hits: u64,
    /// Flushes that optimised and compiled a new program.
    pub compiles: u64,
    /// Flushes made because the graph reached the node limit.
    pub limit_flushes: u64,
    /// Flushes whose graph failed (its values then report the error).
    pub failures: u64,
    /// Ops deferred.
    pub nodes_deferred: u64,
    /// Time spent optimising and compiling.
    pub compile_time: Duration,
    /// Time spent running the graphs (up to the return of asynchronous launches).
    pub execution_time: Duration,
}

impl FusedMetrics {
    fn add(&mut self, o: &FusedMetrics) {
        self.flushes += o.flushes;
        self.hits += o.hits;
        self.compiles += o.compiles;
        self.limit_flushes += o.limit_flushes;
        self.failures += o.failures;
        self.nodes_deferred += o.nodes_deferred;
        self.compile_time += o.compile_time;
        self.execution_time += o.execution_time;
    }
}

static FUSED: Mutex<FusedMetrics> = Mutex::new(FusedMetrics {
    flushes: 0,
    hits: 0,
    compiles: 0,
    limit_flushes: 0,
    failures: 0,
    nodes_deferred: 0,
    compile_time: Duration::ZERO,
    execution_time: Duration::ZERO,
});

thread_local! {
    static FUSED_HERE: std::cell::RefCell<FusedMetrics> =
        std::cell::RefCell::new(FusedMetrics::default());
}

/// Adds `delta` to the fused mode's figures (the process's and this thread's).
pub(crate) fn count_fused(delta: FusedMetrics) {
    FUSED.lock().unwrap_or_else(|e| e.into_inner()).add(&delta);
    FUSED_HERE.with(|m| m.borrow_mut().add(&delta));
}

/// The fused mode's figures for the flushes made on this thread (where other threads' work
/// must not blur the count, as in tests).
pub fn fused_metrics_of_this_thread() -> FusedMetrics {
    FUSED_HERE.with(|m| m.borrow().clone())
}

/// The figures of every live compiled function, and their total.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// One row per compiled function, in order of creation.
    pub functions: Vec<FnMetrics>,
    /// The fused execution mode's figures, over the process.
    pub fused: FusedMetrics,
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
        let z = &self.fused;
        if z.flushes > 0 || z.nodes_deferred > 0 {
            writeln!(
                f,
                "fused mode: {} ops deferred, {} flushes ({} at the node limit, {} failed), {} hits, \
                 {} compiles in {:.1} ms, run {:.1} ms",
                z.nodes_deferred,
                z.flushes,
                z.limit_flushes,
                z.failures,
                z.hits,
                z.compiles,
                z.compile_time.as_secs_f64() * 1e3,
                z.execution_time.as_secs_f64() * 1e3
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
        fused: FUSED.lock().unwrap_or_else(|e| e.into_inner()).clone(),
    }
}
