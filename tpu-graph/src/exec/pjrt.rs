//! The PJRT executor: a whole graph lowered to one StableHLO module (each node through its op's
//! own lowering, the one the eager path uses), compiled once for the device, then executed with
//! every input as an argument buffer.
//!
//! Inputs are passed as the dense buffers behind them and turned into their views inside the
//! program, as the eager path does. Values without elements are not computed: they are zero-size
//! constants in the program, and an output without elements is made as an empty buffer outside
//! it (XLA's compiler has crashed on some programs whose results hold no elements).

use tpu_ops::exec::pjrt::{check_lowering, check_results, lower_device_checks};
use tpu_ops::hlo::checks::CheckError;
use tpu_ops::hlo::view::materialize_view;
use tpu_ops::hlo::{FnBuilder, TensorType, Value};
use tpu_ops::tpu_tensor::tpu_runtime::{Buffer, Executable, PjrtBuffer};
use tpu_ops::tpu_tensor::{Device, Error, Layout, Result, Tensor};
use tpu_ops::{Meta, OpDef};

use crate::disk::{DiskCache, Lookup, key_of};
use crate::ir::{Graph, InputKind};

/// One input of a program as the device holds it: the dense buffer's type, and the view of it.
pub type InputSpec = (TensorType, Layout);

/// A lowered graph: the module text, which outputs it returns, and the errors of the device
/// checks it returns after them.
#[derive(Clone)]
pub struct Lowered {
    /// The StableHLO module.
    pub text: Option<String>,
    /// For each graph output: true when the module returns it, false when it is empty.
    pub computed: Vec<bool>,
    /// The device checks' errors, in the order of their extra results.
    pub checks: Vec<CheckError>,
    /// The inputs (by index) whose buffers the program reuses for an output: the caller
    /// donates them, and they are gone after a run.
    pub donated: Vec<usize>,
}

/// Lowers `graph` with its inputs given as `inputs` (in the order of [`Graph::inputs`]).
/// `donate` pairs an input with the output written back into its storage: when the input is
/// its whole buffer and the output has the buffer's type, the program reuses the buffer for
/// the output.
pub fn lower(
    graph: &Graph,
    inputs: &[InputSpec],
    checks: bool,
    donate: &[(usize, usize)],
) -> Result<Lowered> {
    if inputs.len() != graph.inputs().len() {
        return Err(Error::invalid_argument(
            "to_stablehlo",
            format!(
                "{} inputs given, the graph has {}",
                inputs.len(),
                graph.inputs().len()
            ),
        ));
    }
    let mut b = FnBuilder::new();
    let mut env: Vec<Option<Value>> = vec![None; graph.num_values()];
    for ((v, _), (ty, layout)) in graph.inputs().iter().zip(inputs) {
        let arg = b.arg(ty.clone());
        env[v.0 as usize] = Some(materialize_view(&mut b, &arg, layout, ty.numel()));
    }
    let mut errors = Vec::new();
    let mut extra = Vec::new();
    for node in graph.nodes() {
        let op: &dyn OpDef = &*node.op;
        let ins = node
            .inputs
            .iter()
            .map(|v| {
                env[v.0 as usize].clone().ok_or_else(|| {
                    Error::internal(op.name(), format!("operand {v} is not lowered"))
                })
            })
            .collect::<Result<Vec<Value>>>()?;
        let metas: Vec<Meta> = node
            .outputs
            .iter()
            .map(|v| graph.meta(*v).clone())
            .collect();
        let outs = if metas.iter().all(|m| m.numel() == 0) && !metas.is_empty() {
            metas.iter().map(|m| b.splat(m.ty(), 0)).collect()
        } else {
            let outs = op.lower(&mut b, &ins, &metas)?;
            check_lowering(op, &outs, &metas)?;
            outs
        };
        if checks {
            for c in lower_device_checks(op, &mut b, &ins, &metas)? {
                extra.push(c.value);
                errors.push(c.error);
            }
        }
        for (v, val) in node.outputs.iter().zip(outs) {
            env[v.0 as usize] = Some(val);
        }
    }
    let mut results = Vec::new();
    let mut computed = Vec::new();
    for v in graph.outputs() {
        let val = env[v.0 as usize]
            .clone()
            .ok_or_else(|| Error::internal("to_stablehlo", format!("output {v} is not lowered")))?;
        let keep = graph.meta(*v).numel() > 0;
        if keep {
            results.push(val);
        }
        computed.push(keep);
    }
    let mut donated = Vec::new();
    for &(input, output) in donate {
        let (Some((ty, layout)), Some(&true)) = (inputs.get(input), computed.get(output)) else {
            continue;
        };
        let result = computed[..output].iter().filter(|&&c| c).count();
        let whole = layout.is_contiguous() && layout.offset == 0 && ty.dims[..] == layout.shape[..];
        if whole && results[result].ty == *ty && !donated.contains(&input) {
            b.alias_output(input, result);
            donated.push(input);
        }
    }
    results.extend(extra);
    let text = (!results.is_empty()).then(|| b.finish_module("graph", &results));
    Ok(Lowered {
        text,
        computed,
        checks: errors,
        donated,
    })
}

impl Graph {
    /// The graph as a StableHLO module whose parameters are its inputs as dense buffers of
    /// their shapes (in the order of [`Graph::inputs`]) and whose results are its outputs; it
    /// compiles with any PJRT plugin. Outputs without elements are left out of the results.
    pub fn to_stablehlo(&self) -> Result<String> {
        let specs: Vec<InputSpec> = self
            .inputs()
            .iter()
            .map(|(v, _)| {
                let m = self.meta(*v);
                (m.ty(), Layout::contiguous(&m.shape))
            })
            .collect();
        lower(self, &specs, false, &[])?
            .text
            .ok_or_else(|| Error::invalid_argument("to_stablehlo", "the graph computes no element"))
    }
}

/// The input specs of tensors on a PJRT device.
pub fn input_specs(inputs: &[&Tensor]) -> Result<Vec<InputSpec>> {
    inputs
        .iter()
        .map(|t| {
            let g = t.storage().read();
            let pb = g.as_pjrt().ok_or_else(|| {
                Error::invalid_argument("compiled graph", "expected a PJRT buffer")
            })?;
            Ok((TensorType::new(pb.dims(), t.dtype()), t.layout().clone()))
        })
        .collect()
}

/// A graph compiled for one PJRT device.
#[derive(Clone)]
pub struct Program {
    lowered: Lowered,
    exe: Option<Executable>,
    metas: Vec<Meta>,
}

/// Where a program's executable came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Compiled now (and stored in the disk cache when there is one).
    Compiled,
    /// Loaded from the disk cache.
    Disk,
    /// Compiled now because the disk cache's entry was rejected (the reason).
    Rejected(String),
    /// Nothing to compile: the graph computes no element.
    Nothing,
}

impl Program {
    /// Compiles `lowered` (from `graph`) for `device`, through the disk cache when one is
    /// given.
    pub fn compile(
        graph: &Graph,
        lowered: Lowered,
        device: &Device,
        cache: Option<&DiskCache>,
    ) -> Result<(Program, Origin)> {
        let (client, index) = device
            .as_pjrt()
            .ok_or_else(|| Error::invalid_argument("compiled graph", "expected a PJRT device"))?;
        let metas = graph
            .outputs()
            .iter()
            .map(|v| graph.meta(*v).clone())
            .collect();
        let Some(text) = &lowered.text else {
            let p = Program {
                lowered,
                exe: None,
                metas,
            };
            return Ok((p, Origin::Nothing));
        };
        let key = cache.map(|_| {
            key_of(&[
                text.as_bytes(),
                format!("compile_for_device({index}) of {}", client.device_count()).as_bytes(),
                client.platform_name().as_bytes(),
                client.platform_version().as_bytes(),
                format!("{:?}", client.api_version()).as_bytes(),
                env!("CARGO_PKG_VERSION").as_bytes(),
            ])
        });
        let mut origin = Origin::Compiled;
        if let (Some(c), Some(k)) = (cache, &key) {
            match c.get(k) {
                Lookup::Hit(bytes) => match client.deserialize(&bytes) {
                    Ok(exe) => {
                        let p = Program {
                            lowered,
                            exe: Some(exe),
                            metas,
                        };
                        return Ok((p, Origin::Disk));
                    }
                    Err(e) => origin = Origin::Rejected(format!("the plugin refused it: {e}")),
                },
                Lookup::Miss => {}
                Lookup::Rejected(why) => origin = Origin::Rejected(why),
            }
        }
        let exe = client.compile_for_device(text, index)?;
        if let (Some(c), Some(k)) = (cache, &key) {
            // A cache that cannot be written costs the next process a compile, nothing more.
            if let Err(e) = exe.serialize().and_then(|b| c.put(k, &b)) {
                eprintln!(
                    "tpu-graph: warning: the compile cache in {} was not written: {e}",
                    c.dir().display()
                );
            }
        }
        let p = Program {
            lowered,
            exe: Some(exe),
            metas,
        };
        Ok((p, origin))
    }

    /// The module text (none when the graph computes nothing).
    pub fn text(&self) -> Option<&str> {
        self.lowered.text.as_deref()
    }

    /// Runs the program on `inputs` (in the order of [`Graph::inputs`]) on `device`.
    pub fn run(&self, inputs: &[&Tensor], device: &Device) -> Result<Vec<Tensor>> {
        let (client, index) = device
            .as_pjrt()
            .ok_or_else(|| Error::invalid_argument("compiled graph", "expected a PJRT device"))?;
        let guards: Vec<_> = inputs.iter().map(|t| t.storage().read()).collect();
        let bufs = guards
            .iter()
            .map(|g| {
                g.as_pjrt().ok_or_else(|| {
                    Error::invalid_argument("compiled graph", "expected a PJRT buffer")
                })
            })
            .collect::<Result<Vec<&PjrtBuffer>>>()?;
        let mut results = match &self.exe {
            Some(exe) => exe.execute(&bufs)?.into_iter(),
            None => Vec::new().into_iter(),
        };
        drop(guards);
        let mut outs = Vec::with_capacity(self.metas.len());
        for (m, &computed) in self.metas.iter().zip(&self.lowered.computed) {
            let buf = if computed {
                results
                    .next()
                    .ok_or_else(|| Error::internal("compiled graph", "too few results"))?
            } else {
                PjrtBuffer::from_host(client, index, m.dtype, &m.shape, &[])?
            };
            outs.push(Tensor::from_buffer(Buffer::Pjrt(buf)));
        }
        if !self.lowered.checks.is_empty() {
            check_results("compiled graph", &self.lowered.checks, results)?;
        }
        Ok(outs)
    }
}

/// The inputs of `graph` gathered from `args`, `captured` and its own constants.
pub fn gather<'a>(
    graph: &'a Graph,
    args: &'a [Tensor],
    captured: &'a [Tensor],
) -> Result<Vec<&'a Tensor>> {
    graph
        .inputs()
        .iter()
        .map(|(_, kind)| {
            match *kind {
                InputKind::Arg(i) => args.get(i),
                InputKind::Captured(i) => captured.get(i),
                InputKind::Constant(i) => graph.constants().get(i),
            }
            .ok_or_else(|| {
                Error::invalid_argument("compiled graph", format!("no tensor for {kind:?}"))
            })
        })
        .collect()
}
