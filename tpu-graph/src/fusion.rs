//! The fused elementwise kernel: a small program of f32 elementwise steps over one output
//! shape, run block by block so that its temporaries stay in cache and memory is read and
//! written once, where the ops run one by one would write and read back every intermediate.
//!
//! Each step runs the slice form of its op's own f32 kernel
//! ([`tpu_ops::ops::elementwise::fused`]), so a fused node gives the bits of the nodes it
//! replaces. It lowers to the steps' own lowerings, so a graph holding one still compiles for a
//! PJRT device.

use std::fmt::Write as _;
use std::sync::OnceLock;

use tpu_ops::cpu::kernels::{Reader, cpu_context, output_overwrite, par_chunks};
use tpu_ops::hlo::{FnBuilder, Value};
use tpu_ops::ops::elementwise::binary::{Binary, Where};
use tpu_ops::ops::elementwise::fused::{
    Cond, Operand, binary_f32, binary_fuses, unary_f32, unary_fuses, where_f32,
};
use tpu_ops::ops::elementwise::unary::Unary;
use tpu_ops::tpu_tensor::{DType, Error, Result, Tensor};
use tpu_ops::{Meta, OpDef};

/// Elements per block: a few temporaries of this many f32s stay in the first-level cache.
const BLOCK: usize = 2048;

/// The op's name in dumps and errors.
const NAME: &str = "fused_elementwise";

/// Where a step reads an operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Src {
    /// The fused node's `n`-th input.
    Input(usize),
    /// The result of the `n`-th step.
    Step(usize),
}

/// The op of one step: a unary or binary elementwise op of the op table, or `where`.
#[derive(Clone, Debug)]
pub enum StepOp {
    /// A unary op.
    Unary(Unary),
    /// A binary op (its `numbers` kept for its shape rule and lowering).
    Binary(Binary),
    /// `where(cond, a, b)`, its condition an input of bools.
    Where,
}

impl StepOp {
    /// The op as the op table defines it.
    pub fn op(&self) -> &dyn OpDef {
        match self {
            StepOp::Unary(u) => u,
            StepOp::Binary(b) => b,
            StepOp::Where => &Where,
        }
    }

    /// True when the step has an f32 slice kernel.
    pub fn fuses(&self) -> bool {
        match self {
            StepOp::Unary(u) => unary_fuses(u.0),
            StepOp::Binary(b) => binary_fuses(b.kind),
            StepOp::Where => true,
        }
    }

    /// Operands the step reads.
    pub fn arity(&self) -> usize {
        match self {
            StepOp::Unary(_) => 1,
            StepOp::Binary(_) => 2,
            StepOp::Where => 3,
        }
    }
}

/// One step of a fused program.
#[derive(Clone, Debug)]
pub struct Step {
    /// The op.
    pub op: StepOp,
    /// Its operands, in the op's order.
    pub args: Vec<Src>,
}

/// How the kernel reads an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Read {
    /// f32 of the output's shape, element by element.
    Dense,
    /// One element (of any dtype, made f32 as the op's kernel makes it) for every element.
    Scalar,
    /// bool of the output's shape: the condition of a `where`.
    Bools,
}

/// Several f32 elementwise ops of one output shape run as one kernel.
#[derive(Clone, Debug)]
pub struct FusedElementwise {
    shape: Vec<usize>,
    inputs: Vec<Read>,
    steps: Vec<Step>,
    /// The scratch slot of each step's result (the last step writes the output).
    slots: Vec<usize>,
    num_slots: usize,
}

impl FusedElementwise {
    /// A program over inputs of types `inputs` whose every step gives f32 of `shape`; the last
    /// step's result is the output. Refuses steps without an f32 slice kernel, operands that
    /// are neither f32 of `shape` nor one element, and references to later steps.
    pub fn new(shape: &[usize], inputs: &[Meta], steps: Vec<Step>) -> Result<FusedElementwise> {
        if steps.is_empty() {
            return Err(Error::internal(NAME, "a fused program without steps"));
        }
        let reads = inputs
            .iter()
            .enumerate()
            .map(|(i, m)| {
                if m.shape[..] == *shape && m.dtype == DType::F32 {
                    Ok(Read::Dense)
                } else if m.numel() == 1 {
                    Ok(Read::Scalar)
                } else if m.shape[..] == *shape && m.dtype == DType::Bool {
                    Ok(Read::Bools)
                } else {
                    Err(Error::internal(
                        NAME,
                        format!(
                            "input {i} of type {} is neither f32{shape:?}, bool{shape:?} nor \
                             one element",
                            crate::ir::meta_text(m)
                        ),
                    ))
                }
            })
            .collect::<Result<Vec<Read>>>()?;
        let mut last_use = vec![0usize; steps.len()];
        for (i, s) in steps.iter().enumerate() {
            if !s.op.fuses() {
                return Err(Error::internal(
                    NAME,
                    format!("{} has no f32 slice kernel", s.op.op().name()),
                ));
            }
            let arity = s.op.arity();
            if s.args.len() != arity {
                return Err(Error::internal(
                    NAME,
                    format!("step {i} has {} operands, not {arity}", s.args.len()),
                ));
            }
            for (k, a) in s.args.iter().enumerate() {
                // What each operand may be: a unary op's, f32 elements; a condition, bools
                // (of the output's shape or one); anything else, f32 elements or one element.
                let condition = matches!(s.op, StepOp::Where) && k == 0;
                let fits = |r: Read| match (&s.op, r) {
                    (StepOp::Unary(_), r) => r == Read::Dense,
                    _ if condition => r == Read::Bools || r == Read::Scalar,
                    (_, r) => r != Read::Bools,
                };
                match *a {
                    Src::Input(j) if j < reads.len() => {
                        if !fits(reads[j]) {
                            return Err(Error::internal(
                                NAME,
                                format!("step {i} cannot read input {j} as its operand {k}"),
                            ));
                        }
                    }
                    Src::Step(_) if condition => {
                        return Err(Error::internal(
                            NAME,
                            format!("step {i}'s condition is an f32 step"),
                        ));
                    }
                    Src::Step(j) if j < i => last_use[j] = i,
                    _ => {
                        return Err(Error::internal(
                            NAME,
                            format!("step {i} reads {a:?}, which is not defined before it"),
                        ));
                    }
                }
            }
        }
        let (slots, num_slots) = assign_slots(&steps, &last_use);
        let op = FusedElementwise {
            shape: shape.to_vec(),
            inputs: reads,
            steps,
            slots,
            num_slots,
        };
        op.infer(inputs)?;
        Ok(op)
    }

    /// The steps.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The output's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn out_meta(&self) -> Meta {
        Meta::new(&self.shape, DType::F32)
    }

    /// Runs the program over output elements `base..base + out.len()`, a block at a time.
    fn run_chunk(&self, data: &Inputs<'_>, out: &mut [f32], base: usize) -> Result<()> {
        let mut scratch = vec![0f32; self.num_slots * BLOCK.min(out.len())];
        let last = self.steps.len() - 1;
        let mut lo = 0;
        while lo < out.len() {
            let hi = (lo + BLOCK).min(out.len());
            let len = hi - lo;
            let mut slots: Vec<&mut [f32]> = scratch
                .chunks_mut(BLOCK.min(out.len()))
                .map(|s| &mut s[..len])
                .collect();
            for (i, step) in self.steps.iter().enumerate() {
                // The result's slot is taken out while the operands borrow the others; the
                // slot assignment never gives a step the slot of one of its operands.
                let mut taken: &mut [f32] = &mut [];
                let dest: &mut [f32] = if i == last {
                    &mut out[lo..hi]
                } else {
                    taken = std::mem::take(&mut slots[self.slots[i]]);
                    &mut *taken
                };
                let mut ops = [Operand::Scalar(0.0); 3];
                for (k, a) in step.args.iter().enumerate().take(3) {
                    ops[k] = match *a {
                        Src::Input(j) if self.inputs[j] == Read::Scalar => {
                            Operand::Scalar(data.scalars[j])
                        }
                        // A condition, read as bools below (`new` lets only conditions be).
                        Src::Input(j) if self.inputs[j] == Read::Bools => Operand::Scalar(0.0),
                        Src::Input(j) => Operand::Slice(&data.dense[j][base + lo..base + hi]),
                        Src::Step(j) => Operand::Slice(&slots[self.slots[j]][..]),
                    };
                }
                match &step.op {
                    StepOp::Unary(u) => match ops[0] {
                        Operand::Slice(x) => unary_f32(u.0, x, dest)?,
                        Operand::Scalar(_) => {
                            return Err(Error::internal(NAME, "a unary step over a scalar"));
                        }
                    },
                    StepOp::Binary(b) => binary_f32(b.kind, ops[0], ops[1], dest)?,
                    StepOp::Where => {
                        let cond = match step.args[0] {
                            Src::Input(j) if self.inputs[j] == Read::Bools => {
                                Cond::Slice(&data.bools[j][base + lo..base + hi])
                            }
                            Src::Input(j) => Cond::Scalar(data.conds[j]),
                            Src::Step(_) => {
                                return Err(Error::internal(NAME, "an f32 step as a condition"));
                            }
                        };
                        where_f32(cond, ops[1], ops[2], dest)?
                    }
                }
                if i != last {
                    slots[self.slots[i]] = taken;
                }
            }
            lo = hi;
        }
        Ok(())
    }
}

/// The inputs as the kernel reads them, by input: dense f32 and bool runs (empty where the
/// input is read otherwise), and one-element inputs as f32 and as bool.
#[derive(Default)]
struct Inputs<'a> {
    dense: Vec<&'a [f32]>,
    bools: Vec<&'a [bool]>,
    scalars: Vec<f32>,
    conds: Vec<bool>,
}

/// A scratch slot for each step's result, reusing the slots of results no later step reads:
/// a chain needs two, whatever its length. A step's slot is never one of its operands'.
fn assign_slots(steps: &[Step], last_use: &[usize]) -> (Vec<usize>, usize) {
    let mut free: Vec<usize> = Vec::new();
    let mut count = 0;
    let mut slots = vec![usize::MAX; steps.len()];
    for i in 0..steps.len().saturating_sub(1) {
        slots[i] = free.pop().unwrap_or_else(|| {
            count += 1;
            count - 1
        });
        for a in &steps[i].args {
            if let Src::Step(j) = *a
                && last_use[j] == i
                && !free.contains(&slots[j])
            {
                free.push(slots[j]);
            }
        }
        // A result nothing reads (not built by the pass) frees its slot at once.
        if last_use[i] == 0 {
            free.push(slots[i]);
        }
    }
    (slots, count)
}

impl OpDef for FusedElementwise {
    fn name(&self) -> &'static str {
        NAME
    }

    /// The program, one step a line-like clause: `t1 = add(t0, i2) [false, true]`.
    fn attrs(&self) -> String {
        let mut s = String::from("{");
        for (i, r) in self.inputs.iter().enumerate() {
            let _ = write!(
                s,
                "{}i{i}: {}",
                if i == 0 { "" } else { ", " },
                match r {
                    Read::Dense => "dense",
                    Read::Scalar => "scalar",
                    Read::Bools => "bools",
                }
            );
        }
        s.push_str("; ");
        for (i, step) in self.steps.iter().enumerate() {
            let args: Vec<String> = step
                .args
                .iter()
                .map(|a| match a {
                    Src::Input(j) => format!("i{j}"),
                    Src::Step(j) => format!("t{j}"),
                })
                .collect();
            let op = step.op.op();
            let _ = write!(
                s,
                "{}t{i} = {}({}) {}",
                if i == 0 { "" } else { "; " },
                op.name(),
                args.join(", "),
                op.attrs()
            );
        }
        s.push('}');
        s
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        if inputs.len() != self.inputs.len() {
            return Err(Error::invalid_argument(
                NAME,
                format!(
                    "{} inputs, the program reads {}",
                    inputs.len(),
                    self.inputs.len()
                ),
            ));
        }
        let want = self.out_meta();
        for (i, (m, r)) in inputs.iter().zip(&self.inputs).enumerate() {
            let fits = match r {
                Read::Dense => m.shape == want.shape && m.dtype == DType::F32,
                Read::Scalar => m.numel() == 1,
                Read::Bools => m.shape == want.shape && m.dtype == DType::Bool,
            };
            if !fits {
                return Err(Error::invalid_argument(
                    NAME,
                    format!(
                        "input {i} of type {}, the program reads {r:?} f32{:?}",
                        crate::ir::meta_text(m),
                        self.shape
                    ),
                ));
            }
        }
        let mut results: Vec<Meta> = Vec::with_capacity(self.steps.len());
        for (i, step) in self.steps.iter().enumerate() {
            let args: Vec<Meta> = step
                .args
                .iter()
                .map(|a| match *a {
                    Src::Input(j) => inputs[j].clone(),
                    Src::Step(j) => results[j].clone(),
                })
                .collect();
            let out = step.op.op().infer(&args)?;
            match &out[..] {
                [m] if m.shape == want.shape && m.dtype == DType::F32 => results.push(want.clone()),
                _ => {
                    return Err(Error::invalid_argument(
                        NAME,
                        format!(
                            "step {i} ({}) does not give f32{:?}",
                            step.op.op().name(),
                            self.shape
                        ),
                    ));
                }
            }
        }
        Ok(vec![want])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let metas: Vec<Meta> = inputs.iter().map(|t| Meta::of(t)).collect();
        let [out] = &self.infer(&metas)?[..] else {
            return Err(Error::internal(NAME, "one output expected"));
        };
        if outputs.len() != 1 || outputs[0].shape != out.shape || outputs[0].dtype != out.dtype {
            return Err(Error::internal(NAME, "the graph expects another output"));
        }
        let lead = inputs
            .first()
            .ok_or_else(|| Error::internal(NAME, "no inputs"))?;
        let (dev, device) = cpu_context(NAME, lead)?;
        // Dense inputs are read as one run each; a strided view is copied first (the copy
        // keeps its values, so the bits stay those of the unfused kernels). One-element inputs
        // are made f32 as the binary kernels make their operands (and read as bools too, for
        // a condition).
        let prepared = inputs
            .iter()
            .zip(&self.inputs)
            .map(|(t, r)| match r {
                Read::Dense | Read::Bools if t.is_contiguous() => Ok(((*t).clone(), None)),
                Read::Dense | Read::Bools => Ok((t.contiguous()?, None)),
                Read::Scalar => Ok((t.to_dtype(DType::F32)?, Some(t.to_dtype(DType::Bool)?))),
            })
            .collect::<Result<Vec<(Tensor, Option<Tensor>)>>>()?;
        let refs: Vec<&Tensor> = prepared
            .iter()
            .flat_map(|(t, b)| std::iter::once(t).chain(b.as_ref()))
            .collect();
        let reader = Reader::new(&refs);
        let n = out.numel();
        let mut data = Inputs::default();
        let bad = || Error::internal(NAME, "an input view exceeds its storage");
        for ((t, b), r) in prepared.iter().zip(&self.inputs) {
            let (mut dense, mut bools, mut scalar, mut cond) = (&[][..], &[][..], 0.0, false);
            match (r, b) {
                (Read::Dense, _) => {
                    let d = reader.data::<f32>(t)?;
                    dense = d.get(t.offset()..t.offset() + n).ok_or_else(bad)?;
                }
                (Read::Bools, _) => {
                    let d = reader.data::<bool>(t)?;
                    bools = d.get(t.offset()..t.offset() + n).ok_or_else(bad)?;
                }
                (Read::Scalar, Some(b)) => {
                    scalar = *reader.data::<f32>(t)?.get(t.offset()).ok_or_else(bad)?;
                    cond = *reader.data::<bool>(b)?.get(b.offset()).ok_or_else(bad)?;
                }
                (Read::Scalar, None) => return Err(bad()),
            }
            data.dense.push(dense);
            data.bools.push(bools);
            data.scalars.push(scalar);
            data.conds.push(cond);
        }
        let failed: OnceLock<Error> = OnceLock::new();
        let t = output_overwrite::<f32>(out, &device, |o| {
            par_chunks(&dev, o, |chunk, base| {
                if let Err(e) = self.run_chunk(&data, chunk, base) {
                    let _ = failed.set(e);
                }
            })
        })?;
        if let Some(e) = failed.into_inner() {
            return Err(e);
        }
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], _outputs: &[Meta]) -> Result<Vec<Value>> {
        let meta = self.out_meta();
        let mut results: Vec<Value> = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            let args: Vec<Value> = step
                .args
                .iter()
                .map(|a| match *a {
                    Src::Input(j) => inputs.get(j).cloned(),
                    Src::Step(j) => results.get(j).cloned(),
                })
                .collect::<Option<Vec<Value>>>()
                .ok_or_else(|| Error::internal(NAME, "a step reads a missing operand"))?;
            let out = step.op.op().lower(b, &args, std::slice::from_ref(&meta))?;
            let v = out
                .into_iter()
                .next()
                .ok_or_else(|| Error::internal(NAME, "a step lowered to no value"))?;
            results.push(v);
        }
        results
            .pop()
            .map(|v| vec![v])
            .ok_or_else(|| Error::internal(NAME, "a fused program without steps"))
    }
}
