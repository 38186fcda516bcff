//! Compiled functions: a closure over tensors traced once per input signature, optimised, and
//! then run by the native executor (CPU) or as one PJRT program, with every recompile explained.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tpu_ops::tpu_tensor::{DType, Device, Error, Result, Tensor};

use crate::bucket::{self, BucketDim, Buckets, SliceOutput};
use crate::capture::{WriteBack, WriteTarget, trace_with};
use crate::disk::DiskCache;
use crate::exec::{Executable, pjrt};
use crate::ir::{Graph, InputKind};
use crate::metrics::{FnMetrics, register};
use crate::mode::{ExecMode, with_mode};
use crate::operand::is_whole;
use crate::passes::{PassCounts, PassReport, optimize_counted, promote_constants};

/// What a compiled function's program depends on in one argument.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ArgSig {
    /// Element type.
    pub dtype: DType,
    /// Dims.
    pub shape: Vec<usize>,
    /// Strides of the view over its storage.
    pub strides: Vec<usize>,
    /// Offset of the view in its storage.
    pub offset: usize,
    /// Elements of the storage behind the view.
    pub storage: usize,
    /// The device, as it prints.
    pub device: String,
}

/// The input signature of one call: what selects (or compiles) a program.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Signature(pub Vec<ArgSig>);

impl Signature {
    /// The signature of `args`.
    pub fn of(args: &[Tensor]) -> Signature {
        Signature(
            args.iter()
                .map(|t| ArgSig {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                    strides: t.layout().strides.to_vec(),
                    offset: t.offset(),
                    storage: t.storage().numel(),
                    device: t.device().to_string(),
                })
                .collect(),
        )
    }

    /// What differs from `old`, one phrase per difference ("arg 0 dim 1: 1920 → 1280").
    pub fn changes_from(&self, old: &Signature) -> Vec<String> {
        let mut out = Vec::new();
        if self.0.len() != old.0.len() {
            out.push(format!(
                "argument count: {} → {}",
                old.0.len(),
                self.0.len()
            ));
        }
        for (i, (a, o)) in self.0.iter().zip(&old.0).enumerate() {
            if a.device != o.device {
                out.push(format!("arg {i} device: {} → {}", o.device, a.device));
            }
            if a.dtype != o.dtype {
                out.push(format!("arg {i} dtype: {} → {}", o.dtype, a.dtype));
            }
            if a.shape.len() != o.shape.len() {
                out.push(format!("arg {i} shape: {:?} → {:?}", o.shape, a.shape));
            } else {
                for (d, (x, y)) in a.shape.iter().zip(&o.shape).enumerate() {
                    if x != y {
                        out.push(format!("arg {i} dim {d}: {y} → {x}"));
                    }
                }
            }
            if a.shape == o.shape
                && (a.strides != o.strides || a.offset != o.offset || a.storage != o.storage)
            {
                out.push(format!(
                    "arg {i} layout: strides {:?} offset {} of {} → strides {:?} offset {} of {}",
                    o.strides, o.offset, o.storage, a.strides, a.offset, a.storage
                ));
            }
        }
        out
    }
}

/// The phrases of [`Signature::changes_from`] as one line, those that differ only in their
/// argument merged into ranges, the phrases apart by semicolons ("args 0-3, 5 dim 0: 1 → 8;
/// arg 4 dtype: f32 → bf16"): a batch size change of a model
/// touches every cache tensor, and one phrase each would bury the reason.
fn summarize(changes: &[String]) -> String {
    // (what changed, the arguments it changed in), in order of first appearance.
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    for c in changes {
        let parsed = c.strip_prefix("arg ").and_then(|r| {
            let (i, rest) = r.split_once(' ')?;
            Some((i.parse::<usize>().ok()?, rest))
        });
        match parsed {
            Some((i, rest)) => match groups.iter_mut().find(|(r, _)| *r == rest) {
                Some((_, args)) => args.push(i),
                None => groups.push((rest, vec![i])),
            },
            None => groups.push((c, Vec::new())),
        }
    }
    groups
        .iter()
        .map(|(rest, args)| match args[..] {
            [] => rest.to_string(),
            [i] => format!("arg {i} {rest}"),
            _ => format!("args {} {rest}", ranges(args)),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Sorted indices as runs: `[0, 1, 2, 5]` → "0-2, 5".
fn ranges(ix: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut k = 0;
    while k < ix.len() {
        let mut e = k;
        while e + 1 < ix.len() && ix[e + 1] == ix[e] + 1 {
            e += 1;
        }
        out.push(if e == k {
            ix[k].to_string()
        } else {
            format!("{}-{}", ix[k], ix[e])
        });
        k = e + 1;
    }
    out.join(", ")
}

/// What a compiled function does when it has compiled `recompile_limit` programs and meets
/// yet another signature.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnRecompileLimit {
    /// Compile anyway and say so each time.
    #[default]
    Warn,
    /// Refuse with an error that lists the signatures compiled.
    Error,
    /// Pad the dims declared with [`CompileOptions::bucket`] up to their buckets from now on
    /// (below the limit those dims compile at their exact sizes).
    Pad,
}

/// Options of [`compile_with`].
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// The name in logs and metrics (default: `function#N`).
    pub name: Option<String>,
    /// Programs one function may compile before `on_limit` applies (default 8).
    pub recompile_limit: usize,
    /// What happens past the limit.
    pub on_limit: OnRecompileLimit,
    /// Run the graph passes (default true).
    pub optimize: bool,
    /// Argument dims padded up to buckets ([`crate::bucket`]).
    pub buckets: Vec<BucketDim>,
    /// Outputs cut back to the true size of a bucketed dim.
    pub slices: Vec<SliceOutput>,
    /// Allow graph breaks (default false): a host read while tracing is then not an error;
    /// the function runs in the fused mode instead, one cached graph per segment between
    /// reads.
    pub graph_breaks: bool,
    /// Say why each new signature compiles (default true). Off for functions whose programs
    /// are expected, such as the buckets a server compiles at start; compiles are counted in
    /// [`crate::metrics`] either way.
    pub log_recompiles: bool,
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions {
            name: None,
            recompile_limit: 8,
            on_limit: OnRecompileLimit::Warn,
            optimize: true,
            buckets: Vec::new(),
            slices: Vec::new(),
            graph_breaks: false,
            log_recompiles: true,
        }
    }
}

impl CompileOptions {
    /// Names the function.
    pub fn name(mut self, name: impl Into<String>) -> CompileOptions {
        self.name = Some(name.into());
        self
    }

    /// Sets the recompile limit and what happens past it.
    pub fn recompile_limit(mut self, limit: usize, on_limit: OnRecompileLimit) -> CompileOptions {
        self.recompile_limit = limit;
        self.on_limit = on_limit;
        self
    }

    /// Whether each recompile is reported with its reason on standard error (see
    /// [`CompileOptions::log_recompiles`]).
    pub fn log_recompiles(mut self, on: bool) -> CompileOptions {
        self.log_recompiles = on;
        self
    }

    /// Turns the graph passes on or off.
    pub fn optimize(mut self, on: bool) -> CompileOptions {
        self.optimize = on;
        self
    }

    /// Allows graph breaks: a function that reads values on the host (`to_scalar`, a branch
    /// on a value) runs as several graphs with its Rust code between them, instead of failing
    /// to compile. Each call then runs the function in the fused mode ([`crate::mode`]).
    pub fn allow_graph_breaks(mut self) -> CompileOptions {
        self.graph_breaks = true;
        self
    }

    /// Pads dim `dim` of argument `arg` with zeros up to its bucket: always, or, with
    /// [`OnRecompileLimit::Pad`], once the recompile limit is reached. The function then
    /// receives one more argument per bucketed dim, after its own: the dim's true size as a
    /// 0-d `i64` tensor, to mask the padding with.
    pub fn bucket(self, arg: usize, dim: usize, buckets: Buckets) -> CompileOptions {
        self.bucket_padded_with(arg, dim, buckets, 0.0)
    }

    /// [`CompileOptions::bucket`] with another padding value.
    pub fn bucket_padded_with(
        mut self,
        arg: usize,
        dim: usize,
        buckets: Buckets,
        pad: f64,
    ) -> CompileOptions {
        let buckets = match buckets {
            Buckets::Sizes(mut v) => {
                v.sort_unstable();
                Buckets::Sizes(v)
            }
            b => b,
        };
        self.buckets.push(BucketDim {
            arg,
            dim,
            buckets,
            pad,
        });
        self
    }

    /// Cuts dim `dim` of output `output` back to the true size of the `bucket`-th bucketed
    /// dim.
    pub fn slice_output(mut self, output: usize, dim: usize, bucket: usize) -> CompileOptions {
        self.slices.push(SliceOutput {
            output,
            dim,
            bucket,
        });
        self
    }
}

type Body = dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync;

/// One compiled program of a function: its graph, what it captured, and how it runs.
struct Entry {
    sig: Signature,
    /// Whether device checks were compiled in (they are outputs of the program).
    checks: bool,
    /// The optimised graph, ready for its device.
    exe: Executable,
    captured: Vec<Tensor>,
    /// In-place writes to write back after each run; their values are the last outputs.
    writes: Vec<WriteBack>,
    report: PassReport,
    counts: PassCounts,
    /// How long the trace, the passes and the device compile took.
    phases: [Duration; 3],
    /// Where the function read values on the host while it was traced (graph breaks allowed):
    /// when there are any, each call runs the function in the fused mode, one graph per
    /// segment between reads, instead of one program.
    breaks: Vec<String>,
}

impl Entry {
    /// An error for asking a function that breaks into segments for its one graph.
    fn whole(&self, name: &str) -> Result<&Executable> {
        match self.breaks.first() {
            None => Ok(&self.exe),
            Some(at) => Err(Error::invalid_argument(
                "compile",
                format!(
                    "{name} reads values on the host (at {at}) and runs as several graphs, one \
                     per segment between reads; it has no single graph"
                ),
            )),
        }
    }

    fn run(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        // Natively, donations are found again for this call's tensors: a parameter written
        // back whole may be updated in its own memory, which must be that parameter's alone.
        let donate = match self.exe.program {
            None => donations(&self.exe.graph, args, &self.captured, &self.writes),
            Some(_) => Vec::new(),
        };
        let mut outs = self.exe.run(args, &self.captured, &donate)?;
        let values = outs.split_off(outs.len() - self.writes.len());
        for (w, v) in self.writes.iter().zip(values) {
            let region = match &w.target {
                WriteTarget::Arg(i) => {
                    Tensor::from_storage(args[*i].storage().clone(), w.layout.clone())?
                }
                WriteTarget::Tensor(t) => t.clone(),
            };
            store(&region, v)?;
        }
        Ok(outs)
    }
}

/// The (graph input, graph output) pairs whose input buffer can be donated to the output
/// written back into the same storage: the input is the whole storage, no other input reads
/// that storage, and the write covers all of it.
fn donations(
    graph: &Graph,
    args: &[Tensor],
    captured: &[Tensor],
    writes: &[WriteBack],
) -> Vec<(usize, usize)> {
    let tensors: Vec<Option<&Tensor>> = graph
        .inputs()
        .iter()
        .map(|(_, kind)| match *kind {
            InputKind::Arg(i) => args.get(i),
            InputKind::Captured(i) => captured.get(i),
            InputKind::Constant(_) => None,
        })
        .collect();
    let mut pairs = Vec::new();
    for w in writes {
        let target = match &w.target {
            WriteTarget::Arg(i) => match args.get(*i) {
                Some(t) => t.storage(),
                None => continue,
            },
            WriteTarget::Tensor(t) => t.storage(),
        };
        let readers: Vec<usize> = tensors
            .iter()
            .enumerate()
            .filter(|(_, t)| t.is_some_and(|t| Arc::ptr_eq(t.storage(), target)))
            .map(|(k, _)| k)
            .collect();
        let whole_write = w.layout.is_contiguous()
            && w.layout.offset == 0
            && w.layout.shape.iter().product::<usize>() == target.numel();
        if let ([k], true) = (&readers[..], whole_write)
            && tensors[*k].is_some_and(is_whole)
        {
            pairs.push((*k, w.output));
        }
    }
    pairs
}

/// Writes `value` into `region`: by handing its buffer over when both are whole storages and
/// nothing else holds the value (no bytes move), by a copy otherwise.
fn store(region: &Tensor, value: Tensor) -> Result<()> {
    if Arc::ptr_eq(region.storage(), value.storage()) && region.layout() == value.layout() {
        // Computed in place (a native node wrote its result over the donated input).
        return Ok(());
    }
    if is_whole(region) && is_whole(&value) && value.dtype() == region.dtype() {
        let (storage, layout) = (value.storage().clone(), value.layout().clone());
        drop(value);
        if Arc::strong_count(&storage) == 1 {
            let buffer = storage
                .into_buffer()
                .ok_or_else(|| Error::internal("compile", "an output's storage is shared"))?;
            return region.storage().replace(buffer).map(drop);
        }
        return region.copy_(&Tensor::from_storage(storage, layout)?);
    }
    region.copy_(&value)
}

struct Inner {
    name: String,
    f: Box<Body>,
    options: CompileOptions,
    entries: Mutex<Vec<Arc<Entry>>>,
    metrics: Arc<Mutex<FnMetrics>>,
}

/// A function compiled by [`compile`]: call it like the closure it wraps. Cheap to clone;
/// clones share their programs.
#[derive(Clone)]
pub struct CompiledFn {
    inner: Arc<Inner>,
}

impl fmt::Debug for CompiledFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CompiledFn({})", self.inner.name)
    }
}

/// Compiles `f` with the default options: each new input signature traces it once, and calls
/// run the optimised graph (natively on the CPU, as one program on a PJRT device).
///
/// `f` is traced, not re-run: Rust values it reads (numbers, flags, branches on them) are fixed
/// at the values they had while it was traced. Pass what changes from call to call as tensor
/// arguments, or keep it in a tensor the function reads (the optimizers keep their learning rate
/// and step count in tensors, so a schedule never recompiles). Tensors it reads from its
/// environment are read again on every call, and the in-place writes it makes to them or to its
/// arguments (`copy_`, `fill_`, optimizer steps, batch-norm statistics) are made again by every
/// call. The trace computes nothing (its ops return placeholders), so the first call of a
/// signature costs the trace, the passes and the compile, and then runs the program like every
/// later call. Other effects happen only while it is traced: prints print once, and gradients a
/// `backward` inside it leaves in `.grad` are placeholders whose values exist only inside the
/// program (reading one is an error that says so): return what a caller needs. Random draws
/// inside `f` are refused, since they would repeat the traced numbers on every call.
pub fn compile<F>(f: F) -> CompiledFn
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'static,
{
    compile_with(CompileOptions::default(), f)
}

/// [`compile`] with options.
pub fn compile_with<F>(options: CompileOptions, f: F) -> CompiledFn
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'static,
{
    let metrics = register(options.name.clone());
    let name = metrics
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .name
        .clone();
    CompiledFn {
        inner: Arc::new(Inner {
            name,
            f: Box::new(f),
            options,
            entries: Mutex::new(Vec::new()),
            metrics,
        }),
    }
}

/// True when `TPU_RS_LOG` asks for a line per compile, hit and miss.
fn log_compiles() -> bool {
    std::env::var("TPU_RS_LOG").is_ok_and(|v| v.split(',').any(|w| w.trim() == "compile"))
}

impl CompiledFn {
    /// The function's name in logs and metrics.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Calls the function: runs the program compiled for the arguments' signature, compiling
    /// one first when there is none.
    pub fn call(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        let opts = &self.inner.options;
        if opts.buckets.is_empty() {
            return self.call_exact(args);
        }
        let sizes = bucket::true_sizes(args, &opts.buckets)?;
        let pad = match opts.on_limit {
            OnRecompileLimit::Pad => {
                let exact = bucket::arguments(args, &opts.buckets, &sizes, false)?;
                let known = self.has_program(&exact);
                if known || self.programs() < opts.recompile_limit {
                    return bucket::slice(self.call_exact(&exact)?, &opts.slices, &sizes);
                }
                true
            }
            _ => true,
        };
        let full = bucket::arguments(args, &opts.buckets, &sizes, pad)?;
        bucket::slice(self.call_exact(&full)?, &opts.slices, &sizes)
    }

    /// True when a program for `args`' signature exists.
    fn has_program(&self, args: &[Tensor]) -> bool {
        let sig = Signature::of(args);
        let checks = tpu_ops::device_checks();
        self.entries()
            .iter()
            .any(|e| e.sig == sig && e.checks == checks)
    }

    /// [`CompiledFn::call`] once the arguments are the ones the function receives.
    fn call_exact(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        let (entry, traced) = self.lookup(args)?;
        if let Some(out) = traced {
            // The trace ran the function eagerly, writes included: that was this call.
            // (A trace with placeholders computed nothing; the program runs below.)
            return Ok(out);
        }
        let t0 = Instant::now();
        let out = if entry.breaks.is_empty() {
            entry.run(args)?
        } else {
            with_mode(ExecMode::Fused, || (self.inner.f)(args))?
        };
        let mut m = self.metrics();
        m.executions += 1;
        m.execution_time += t0.elapsed();
        Ok(out)
    }

    /// The optimised graph compiled for `args`' signature (compiling it if needed).
    pub fn graph(&self, args: &[Tensor]) -> Result<Graph> {
        let e = self.entry(args)?;
        Ok(e.whole(&self.inner.name)?.graph.clone())
    }

    /// The StableHLO module run for `args` on a PJRT device (compiling it if needed); `None`
    /// on the native CPU device, where the graph runs natively.
    pub fn stablehlo(&self, args: &[Tensor]) -> Result<Option<String>> {
        let e = self.entry(args)?;
        Ok(e.whole(&self.inner.name)?
            .program
            .as_ref()
            .and_then(|p| p.text().map(str::to_string)))
    }

    /// How many programs the function holds.
    pub fn programs(&self) -> usize {
        self.entries().len()
    }

    fn metrics(&self) -> std::sync::MutexGuard<'_, FnMetrics> {
        self.inner.metrics.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Entry>>> {
        self.inner.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry(&self, args: &[Tensor]) -> Result<Arc<Entry>> {
        Ok(self.lookup(args)?.0)
    }

    /// The program for `args`' signature, and, when this lookup compiled it by running the
    /// function eagerly (graph breaks allowed), what that run returned.
    fn lookup(&self, args: &[Tensor]) -> Result<(Arc<Entry>, Option<Vec<Tensor>>)> {
        let sig = Signature::of(args);
        let checks = tpu_ops::device_checks();
        self.metrics().calls += 1;
        if let Some(e) = self
            .entries()
            .iter()
            .find(|e| e.sig == sig && e.checks == checks)
        {
            self.metrics().hits += 1;
            if log_compiles() {
                eprintln!(
                    "tpu-graph: {} hit {:016x}",
                    self.inner.name,
                    e.exe.graph.fingerprint()
                );
            }
            return Ok((e.clone(), None));
        }
        let old: Vec<Signature> = self.entries().iter().map(|e| e.sig.clone()).collect();
        let reason = self.recompile_reason(&sig, &old)?;
        let t0 = Instant::now();
        let (entry, traced) = self.build(args, sig, checks)?;
        let entry = Arc::new(entry);
        let took = t0.elapsed();
        {
            let mut m = self.metrics();
            m.compiles += 1;
            m.compile_time += took;
            m.nodes_traced += entry.report.nodes_before;
            m.nodes_optimized += entry.report.nodes_after;
            if let Some(r) = &reason {
                m.recompile_reasons.push(r.clone());
            }
        }
        let fp = entry.exe.graph.fingerprint();
        match &reason {
            Some(r) if self.inner.options.log_recompiles || log_compiles() => eprintln!(
                "tpu-graph: recompiling {} ({} programs now): {r}",
                self.inner.name,
                old.len() + 1
            ),
            None if log_compiles() => eprintln!(
                "tpu-graph: {} compiled {fp:016x} in {:.1} ms (trace {:.1}, passes {:.1}, \
                 compile {:.1}; {} nodes, {} after passes: {})",
                self.inner.name,
                took.as_secs_f64() * 1e3,
                entry.phases[0].as_secs_f64() * 1e3,
                entry.phases[1].as_secs_f64() * 1e3,
                entry.phases[2].as_secs_f64() * 1e3,
                entry.report.nodes_before,
                entry.report.nodes_after,
                entry.counts
            ),
            _ => {}
        }
        self.entries().push(entry.clone());
        Ok((entry, traced))
    }

    /// Why a new signature compiles again (`None` for the first), or the error of the
    /// recompile limit.
    fn recompile_reason(&self, sig: &Signature, old: &[Signature]) -> Result<Option<String>> {
        // The fewest changes; among equals, the latest program.
        let Some(closest) = old.iter().rev().min_by_key(|o| sig.changes_from(o).len()) else {
            return Ok(None);
        };
        let reason = summarize(&sig.changes_from(closest));
        let opts = &self.inner.options;
        if old.len() >= opts.recompile_limit {
            let calls = self.metrics().calls;
            let msg = format!(
                "{} compiled {} times in {calls} calls (limit {}); the new signature differs by {reason}",
                self.inner.name,
                old.len() + 1,
                opts.recompile_limit
            );
            match opts.on_limit {
                OnRecompileLimit::Error => {
                    return Err(Error::invalid_argument("compile", msg));
                }
                OnRecompileLimit::Warn => eprintln!("tpu-graph: warning: {msg}"),
                OnRecompileLimit::Pad if opts.buckets.is_empty() => eprintln!(
                    "tpu-graph: warning: {msg}; no dims are declared for padding \
                     (CompileOptions::bucket), so each new size compiles"
                ),
                // A new bucket: at most one program per bucket.
                OnRecompileLimit::Pad => {}
            }
        }
        Ok(Some(reason))
    }

    /// Traces and compiles a program for `args`; with it, the function's outputs when the trace
    /// ran it eagerly (graph breaks allowed), which were then this call.
    fn build(
        &self,
        args: &[Tensor],
        sig: Signature,
        checks: bool,
    ) -> Result<(Entry, Option<Vec<Tensor>>)> {
        let t0 = Instant::now();
        let t = trace_with(&*self.inner.f, args, self.inner.options.graph_breaks)?;
        let trace_time = t0.elapsed();
        if let Some(at) = t.breaks.first() {
            eprintln!(
                "tpu-graph: {}: graph break: values are read on the host at {at}{}; calls run \
                 as fused segments, one cached graph between reads",
                self.inner.name,
                match t.breaks.len() {
                    1 => String::new(),
                    n => format!(" and {} more places", n - 1),
                }
            );
            let device = t.device.unwrap_or_else(Device::cpu);
            let entry = Entry {
                sig,
                checks,
                exe: Executable {
                    graph: Graph::new(),
                    device,
                    program: None,
                },
                captured: Vec::new(),
                writes: Vec::new(),
                report: PassReport::default(),
                counts: PassCounts::default(),
                phases: [trace_time, Duration::ZERO, Duration::ZERO],
                breaks: t.breaks,
            };
            return Ok((entry, Some(t.outputs)));
        }
        let mut graph = t.graph;
        let t1 = Instant::now();
        let (report, counts) = if self.inner.options.optimize {
            // Tensors only the trace holds (numbers the function turned into tensors) cannot
            // change between calls: they become constants the passes may fold.
            let promoted = promote_constants(&mut graph, &t.captured)?;
            let (report, mut counts) = optimize_counted(&mut graph)?;
            counts.promoted = promoted;
            (report, counts)
        } else {
            let n = graph.nodes().len();
            let report = PassReport {
                nodes_before: n,
                nodes_after: n,
                rounds: 0,
            };
            (report, PassCounts::default())
        };
        let device = t.device.unwrap_or_else(Device::cpu);
        // On the CPU, elementwise chains become fused kernels (on a PJRT device XLA fuses).
        let counts = PassCounts {
            fused: if self.inner.options.optimize && device.as_pjrt().is_none() {
                crate::passes::fuse_for_cpu(&mut graph)?
            } else {
                0
            },
            ..counts
        };
        let pass_time = t1.elapsed();
        let t2 = Instant::now();
        let donate = donations(&graph, args, &t.captured, &t.writes);
        let cache = device.as_pjrt().and_then(|_| DiskCache::from_env());
        let (exe, origin) = Executable::prepare(
            graph,
            args,
            &t.captured,
            &device,
            checks,
            &donate,
            cache.as_ref(),
        )?;
        if let Some(origin) = origin {
            let mut m = self.metrics();
            match &origin {
                pjrt::Origin::Disk => m.disk_hits += 1,
                pjrt::Origin::Compiled | pjrt::Origin::Rejected(_) => m.disk_misses += 1,
                pjrt::Origin::Nothing => {}
            }
            if let pjrt::Origin::Rejected(why) = &origin {
                m.disk_rejected += 1;
                eprintln!(
                    "tpu-graph: {}: a compile cache entry was rejected ({why}); compiled again",
                    self.inner.name
                );
            }
            if let Some(c) = &cache {
                m.disk_bytes = c.bytes();
            }
        }
        let entry = Entry {
            sig,
            checks,
            exe,
            captured: t.captured,
            writes: t.writes,
            report,
            counts,
            phases: [trace_time, pass_time, t2.elapsed()],
            breaks: Vec::new(),
        };
        Ok((entry, t.eager.then_some(t.outputs)))
    }
}

#[cfg(test)]
mod tests {
    use super::summarize;

    #[test]
    fn changes_in_many_arguments_read_as_ranges() {
        let mut changes: Vec<String> = (0..6)
            .filter(|&i| i != 4)
            .map(|i| format!("arg {i} dim 0: 1 → 8"))
            .collect();
        changes.insert(2, "arg 9 dtype: f32 → bf16".into());
        changes.push("argument count: 6 → 7".into());
        assert_eq!(
            summarize(&changes),
            "args 0-3, 5 dim 0: 1 → 8; arg 9 dtype: f32 → bf16; argument count: 6 → 7"
        );
        assert_eq!(
            summarize(&["arg 0 dim 1: 1920 → 1280".into()]),
            "arg 0 dim 1: 1920 → 1280"
        );
        assert_eq!(summarize(&[]), "");
    }
}
