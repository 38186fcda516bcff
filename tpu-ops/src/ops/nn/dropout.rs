//! Dropout: the op that applies a given keep mask, its CPU kernel, lowering and backward
//! rule, and the public functions that draw the mask on the host. Small enough to stay one
//! file.

use tpu_tensor::tpu_runtime::buffer::describe;
use tpu_tensor::tpu_runtime::memory::{try_host_capacity, try_host_vec};
use tpu_tensor::{DType, Device, Element, Error, Generator, Result, Tensor};

use crate::autograd::Saved;
use crate::cpu::float::{Float, with_compute};
use crate::cpu::kernels::{Reader, cpu_context};
use crate::exec::dispatch::run1;
use crate::hlo::FnBuilder;
use crate::hlo::lower::{Lowered, OpIo};
use crate::op::args::{check_float, unsupported};
use crate::op::{DTypeSet, Meta, OpDef, op_parts};
use crate::ops::nn::args::{check_arity, check_param};
use crate::ops::nn::cpu::{contiguous_compute, elems, emit};
use crate::ops::nn::grad::Grads;
use crate::ops::nn::lower::{cst, mul};

/// Dropout with a given keep mask: `x * (keep ? scale : 0)`. Inputs: `x` and the bool mask
/// of `x`'s shape. The mask comes from the host's Philox generator, so every device drops the
/// same elements for the same seed.
#[derive(Clone, Debug)]
pub struct DropoutOp {
    /// The factor for kept elements, `1 / (1 - p)`.
    pub scale: f64,
}

impl OpDef for DropoutOp {
    fn name(&self) -> &'static str {
        "dropout"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        check_arity("dropout", inputs, 2)?;
        let (x, keep) = (&inputs[0], &inputs[1]);
        check_float("dropout", x)?;
        check_param("dropout", "mask", keep, &x.shape, DType::Bool)?;
        Ok(vec![Meta::new(&x.shape, x.dtype)])
    }

    op_parts! {
        cpu: dropout_cpu,
        lower: dropout_lower,
        grad: dropout_backward,
    }
}

// ---- the CPU kernel -------------------------------------------------------------------------

fn dropout_cpu(this: &DropoutOp, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let keep = inputs[1].contiguous()?;
    let (dev, device) = cpu_context("dropout", x)?;
    with_compute!("dropout", x.dtype(), |C| {
        let xd = contiguous_compute::<C>(x)?;
        let r = Reader::new(&[&xd, &keep]);
        let xs = elems::<C>(&r, &xd)?;
        let ks = r
            .data::<bool>(&keep)?
            .get(keep.offset()..keep.offset() + keep.numel())
            .ok_or_else(|| Error::invalid_argument("dropout", "mask outside its storage"))?;
        let scale = C::from_f64(this.scale);
        let t = emit::<C>(&outputs[0], &device, &dev, |o| {
            crate::cpu::kernels::par_chunks(&dev, o, |chunk, base| {
                for ((o, &v), &k) in chunk.iter_mut().zip(&xs[base..]).zip(&ks[base..]) {
                    *o = v * if k { scale } else { C::ZERO };
                }
            })
        })?;
        Ok(vec![t])
    })
}

// ---- the lowering ---------------------------------------------------------------------------

fn dropout_lower(this: &DropoutOp, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let x = io.compute(b, 0);
    let scale = cst(b, &x, this.scale);
    let zero = cst(b, &x, 0.0);
    let m = b.select(&inputs[1], &scale, &zero);
    let y = mul(b, &x, &m);
    Ok(vec![b.convert(&y, outputs[0].dtype)])
}

// ---- the backward rule ----------------------------------------------------------------------

fn dropout_backward(op: &DropoutOp, saved: &Saved, g: &Tensor) -> Grads {
    // The same mask and scale: dropout is linear in x. The mask gets no gradient.
    let gx = crate::exec::dispatch::run1(op, &[g, &saved.inputs[1]])?;
    Ok(vec![Some(gx), None])
}

// ---- public functions -----------------------------------------------------------------------

/// Dropout: in training, zeroes each element with probability `p` (drawn from
/// `generator`) and scales the others by `1 / (1 - p)`; otherwise returns `x` itself. The
/// mask is drawn on the host, so a seed gives the same mask on every device.
pub fn dropout(x: &Tensor, p: f64, training: bool, generator: &mut Generator) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::invalid_argument(
            "dropout",
            format!("expected a probability in [0, 1], got {p}"),
        ));
    }
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    if !x.dtype().is_float() {
        return Err(unsupported("dropout", x.dtype(), DTypeSet::FLOAT));
    }
    let cpu = Device::cpu();
    let what = || format!("the dropout mask of {}", describe(x.dtype(), x.shape()));
    let keep: Vec<bool> = if p == 1.0 {
        try_host_vec(x.numel(), false, what)?
    } else {
        let threshold = (1.0 - p) as f32;
        let u = generator
            .rand(x.shape(), DType::F32, &cpu)?
            .to_vec::<f32>()?;
        let mut keep = try_host_capacity(u.len(), what)?;
        keep.extend(u.into_iter().map(|u| u < threshold));
        keep
    };
    let keep = Tensor::from_vec(keep, x.shape(), x.device())?;
    let scale = if p == 1.0 { 0.0 } else { 1.0 / (1.0 - p) };
    run1(&DropoutOp { scale }, &[x, &keep])
}

/// [`dropout`] with a fresh generator seeded with `seed`.
pub fn dropout_seeded(x: &Tensor, p: f64, training: bool, seed: u64) -> Result<Tensor> {
    dropout(x, p, training, &mut Generator::new(seed))
}
