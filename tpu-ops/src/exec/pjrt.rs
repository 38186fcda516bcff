//! Eager execution on PJRT devices: each op becomes a one-op StableHLO module, compiled once per
//! (op, attributes, input layouts, dtypes, device, device checks on or off) and cached, then
//! executed asynchronously with its outputs left on the device.
//!
//! Outputs without elements never reach XLA: they are made as empty device buffers, and an op
//! whose outputs are all empty and that checks nothing runs no program. With device checks on
//! (see [`crate::hlo::checks`]), an op's checks are extra outputs of its module, read back after the
//! run; such an op waits for its program before returning.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use tpu_tensor::tpu_runtime::{Buffer, Executable, PjrtBuffer};
use tpu_tensor::{Device, Error, Layout, Result, Tensor};

use crate::hlo::checks::{CheckError, device_checks, verdict};
use crate::hlo::view::materialize_view;
use crate::hlo::{FnBuilder, TensorType, Value};
use crate::op::{Meta, OpDef};

/// Figures of the eager compile cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Ops that found their executable in the cache.
    pub hits: u64,
    /// Ops that had to compile.
    pub misses: u64,
    /// Time spent compiling.
    pub compile_time: Duration,
    /// Executables held.
    pub entries: usize,
}

struct Cache {
    map: HashMap<String, Arc<Entry>>,
    stats: CacheStats,
}

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(|| {
    Mutex::new(Cache {
        map: HashMap::new(),
        stats: CacheStats::default(),
    })
});

/// The eager compile cache's figures.
pub fn cache_stats() -> CacheStats {
    let c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    CacheStats {
        entries: c.map.len(),
        ..c.stats
    }
}

/// Drops every cached executable and zeroes the figures.
pub fn clear_cache() {
    let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    c.map.clear();
    c.stats = CacheStats::default();
}

/// The module text of `op` applied to `inputs` (each given as a dense buffer plus a view).
pub fn module_for(
    op: &dyn OpDef,
    inputs: &[(TensorType, Layout)],
    outputs: &[Meta],
) -> Result<String> {
    let mut b = FnBuilder::new();
    let mut vals = Vec::with_capacity(inputs.len());
    for (ty, layout) in inputs {
        let arg = b.arg(ty.clone());
        vals.push(materialize_view(&mut b, &arg, layout, ty.numel()));
    }
    let outs = op.lower(&mut b, &vals, outputs)?;
    check_lowering(op, &outs, outputs)?;
    Ok(b.finish_module(op.name(), &outs))
}

/// What the eager path runs for one op: a module (none when every output is empty and nothing
/// is checked), which outputs it computes, and the errors of the checks it returns after them.
struct Program {
    text: Option<String>,
    /// For each output of the op: true when the module returns it, false when it is empty and
    /// made without running anything.
    computed: Vec<bool>,
    checks: Vec<CheckError>,
}

/// The eager program of `op`: the op's lowering for its non-empty outputs, then its device
/// checks when `checks` is on. Empty outputs are left out, so XLA never compiles a program
/// whose results hold no elements (its compiler has crashed on some, such as an integer
/// division of empty constants).
fn program_for(
    op: &dyn OpDef,
    inputs: &[(TensorType, Layout)],
    outputs: &[Meta],
    checks: bool,
) -> Result<Program> {
    let computed: Vec<bool> = outputs.iter().map(|m| m.numel() > 0).collect();
    let mut b = FnBuilder::new();
    let mut vals = Vec::with_capacity(inputs.len());
    for (ty, layout) in inputs {
        let arg = b.arg(ty.clone());
        vals.push(materialize_view(&mut b, &arg, layout, ty.numel()));
    }
    let mut results = Vec::new();
    if computed.iter().any(|&c| c) {
        let outs = op.lower(&mut b, &vals, outputs)?;
        check_lowering(op, &outs, outputs)?;
        results.extend(
            outs.into_iter()
                .zip(&computed)
                .filter(|(_, c)| **c)
                .map(|(v, _)| v),
        );
    }
    let mut errors = Vec::new();
    if checks {
        for c in lower_device_checks(op, &mut b, &vals, outputs)? {
            results.push(c.value);
            errors.push(c.error);
        }
    }
    let text = (!results.is_empty()).then(|| b.finish_module(op.name(), &results));
    Ok(Program {
        text,
        computed,
        checks: errors,
    })
}

/// Checks that a lowering produced what the shape rule said: as many values, of its types.
/// The eager path and a whole-graph lowering both call it after `OpDef::lower`.
pub fn check_lowering(op: &dyn OpDef, outs: &[Value], outputs: &[Meta]) -> Result<()> {
    if outs.len() != outputs.len() || outs.iter().zip(outputs).any(|(v, m)| v.ty != m.ty()) {
        let got: Vec<String> = outs.iter().map(|v| v.ty.to_string()).collect();
        let want: Vec<String> = outputs.iter().map(|m| m.ty().to_string()).collect();
        return Err(Error::internal(
            op.name(),
            format!("the lowering produced {got:?}, the shape rule {want:?}"),
        ));
    }
    Ok(())
}

/// `op`'s device checks (`OpDef::lower_checks`), each checked to be of the type the readback
/// decodes.
pub fn lower_device_checks(
    op: &dyn OpDef,
    b: &mut FnBuilder,
    inputs: &[Value],
    outputs: &[Meta],
) -> Result<Vec<crate::hlo::checks::DeviceCheck>> {
    let checks = op.lower_checks(b, inputs, outputs)?;
    if let Some(c) = checks
        .iter()
        .find(|c| c.value.ty != crate::hlo::checks::check_type())
    {
        return Err(Error::internal(
            op.name(),
            format!(
                "a device check of type {}, expected {}",
                c.value.ty,
                crate::hlo::checks::check_type()
            ),
        ));
    }
    Ok(checks)
}

/// A cached eager program: the executable (none when nothing runs) and what its outputs are.
struct Entry {
    exe: Option<Executable>,
    computed: Vec<bool>,
    checks: Vec<CheckError>,
}

pub(crate) fn run(
    op: &dyn OpDef,
    inputs: &[&Tensor],
    outputs: &[Meta],
    device: &Device,
) -> Result<Vec<Tensor>> {
    let (client, index) = device
        .as_pjrt()
        .ok_or_else(|| Error::invalid_argument(op.name(), "expected a PJRT device"))?;
    let checks = device_checks();
    let guards: Vec<_> = inputs.iter().map(|t| t.storage().read()).collect();
    let mut bufs: Vec<&PjrtBuffer> = Vec::with_capacity(inputs.len());
    let mut key = String::with_capacity(96);
    let _ = write!(key, "{}|{}|{}|{}", op.name(), op.attrs(), index, checks);
    for (t, g) in inputs.iter().zip(&guards) {
        let pb = g
            .as_pjrt()
            .ok_or_else(|| Error::invalid_argument(op.name(), "expected a PJRT buffer"))?;
        let l = t.layout();
        let _ = write!(
            key,
            "|{}{:?}:{:?}/{:?}+{}",
            t.dtype(),
            pb.dims(),
            &l.shape[..],
            &l.strides[..],
            l.offset
        );
        bufs.push(pb);
    }
    let cached = {
        let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        let hit = c.map.get(&key).cloned();
        if hit.is_some() {
            c.stats.hits += 1;
        }
        hit
    };
    let entry = match cached {
        Some(e) => e,
        None => {
            let specs: Vec<(TensorType, Layout)> = inputs
                .iter()
                .zip(&bufs)
                .map(|(t, pb)| (TensorType::new(pb.dims(), t.dtype()), t.layout().clone()))
                .collect();
            let prog = program_for(op, &specs, outputs, checks)?;
            let t0 = Instant::now();
            let exe = match &prog.text {
                Some(text) => Some(client.compile_for_device(text, index)?),
                None => None,
            };
            let entry = Arc::new(Entry {
                exe,
                computed: prog.computed,
                checks: prog.checks,
            });
            let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
            if entry.exe.is_some() {
                c.stats.misses += 1;
                c.stats.compile_time += t0.elapsed();
            }
            c.map.insert(key, entry.clone());
            entry
        }
    };
    let mut results = match &entry.exe {
        Some(exe) => exe.execute(&bufs)?.into_iter(),
        None => Vec::new().into_iter(),
    };
    drop(guards);
    let mut outs = Vec::with_capacity(outputs.len());
    for (m, &computed) in outputs.iter().zip(&entry.computed) {
        let buf = if computed {
            results
                .next()
                .ok_or_else(|| Error::internal(op.name(), "the program returned too few outputs"))?
        } else {
            PjrtBuffer::from_host(client, index, m.dtype, &m.shape, &[])?
        };
        outs.push(Tensor::from_buffer(Buffer::Pjrt(buf)));
    }
    if !entry.checks.is_empty() {
        // The verdict is needed before the op returns: this read waits for the program.
        check_results(op.name(), &entry.checks, results)?;
    }
    Ok(outs)
}

/// Reads back the device checks' results of a program (waiting for it) and raises the error of
/// the first check that found an offending element. `results` are the program's results after
/// the ones it computes, one per check.
pub fn check_results(
    op: &str,
    checks: &[CheckError],
    results: impl Iterator<Item = PjrtBuffer>,
) -> Result<()> {
    let words = results
        .map(|b| {
            let bytes = b.to_host()?;
            let w: Vec<i64> = bytes
                .chunks_exact(8)
                .map(|c| i64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
            match w[..] {
                [p, v] => Ok([p, v]),
                _ => Err(Error::internal(
                    op,
                    "a device check returned a value of the wrong size",
                )),
            }
        })
        .collect::<Result<Vec<[i64; 2]>>>()?;
    if words.len() != checks.len() {
        return Err(Error::internal(
            op,
            "the program returned too few check values",
        ));
    }
    verdict(checks, &words)
}
