//! Layer, RMS, group and batch normalisation: the ops with their shape rules, the options
//! values and the public functions. The kernels, lowerings and backward rules live in
//! `cpu.rs`, `lower.rs` and `grad.rs`.

mod cpu;
mod grad;
mod lower;

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Error, Result, Tensor};

use crate::exec::dispatch::{run, run1};
use crate::op::args::check_float;
use crate::op::{Meta, OpDef, op_parts};
use crate::ops::nn::args::{check_arity, check_param, take};

/// Refuses an input of rank below 2 (group and batch norm take `[N, C, *]`).
fn check_nc(op: &str, x: &Meta) -> Result<()> {
    if x.rank() < 2 {
        return Err(Error::shape(
            op,
            format!(
                "expected an input of shape [N, C, *], got {}",
                fmt_shape(&x.shape)
            ),
        ));
    }
    Ok(())
}

// ---- layer, RMS and group norm --------------------------------------------------------------

/// Which statistic a [`Norm`] op normalises with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// Mean and variance over the trailing `normalized` dims.
    Layer,
    /// Root mean square over the trailing `normalized` dims.
    Rms,
    /// Mean and variance per group of channels of an `[N, C, *]` input.
    Group(usize),
}

/// Layer, RMS or group normalisation with an optional elementwise affine transform. Inputs:
/// `x`, then `weight` and `bias` when present.
#[derive(Clone, Debug)]
pub struct Norm {
    /// Which normalisation.
    pub kind: NormKind,
    /// The trailing dims normalised over (layer and RMS norm).
    pub normalized: Vec<usize>,
    /// Added to the variance (or mean square) before the square root.
    pub eps: f64,
    /// A weight is given.
    pub weight: bool,
    /// A bias is given.
    pub bias: bool,
}

impl Norm {
    fn layout(&self, shape: &[usize]) -> (usize, usize, usize) {
        match self.kind {
            NormKind::Group(g) => {
                let c = shape[1];
                let s: usize = shape[2..].iter().product();
                (c / g * s, s, g)
            }
            _ => (self.normalized.iter().product(), 1, 1),
        }
    }
}

impl OpDef for Norm {
    fn name(&self) -> &'static str {
        match self.kind {
            NormKind::Layer => "layer_norm",
            NormKind::Rms => "rms_norm",
            NormKind::Group(_) => "group_norm",
        }
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.name();
        check_arity(op, inputs, 1 + self.weight as usize + self.bias as usize)?;
        let x = &inputs[0];
        check_float(op, x)?;
        let pshape: Vec<usize> = match self.kind {
            NormKind::Layer | NormKind::Rms => {
                let ns = &self.normalized;
                if ns.is_empty() {
                    return Err(Error::shape(
                        op,
                        "expected normalized_shape to have at least one dim, got []",
                    ));
                }
                if x.rank() < ns.len() || x.shape[x.rank() - ns.len()..] != ns[..] {
                    let dims: Vec<String> = ns.iter().map(|d| d.to_string()).collect();
                    return Err(Error::shape(
                        op,
                        format!(
                            "given normalized_shape={}, expected input with shape [*, {}], got input of shape {}",
                            fmt_shape(ns),
                            dims.join(", "),
                            fmt_shape(&x.shape)
                        ),
                    ));
                }
                if self.kind == NormKind::Rms && self.bias {
                    return Err(Error::invalid_argument(op, "rms_norm takes no bias"));
                }
                ns.clone()
            }
            NormKind::Group(g) => {
                check_nc(op, x)?;
                if g == 0 || !x.shape[1].is_multiple_of(g) {
                    return Err(Error::shape(
                        op,
                        format!(
                            "expected the number of channels to be divisible by num_groups, got input of shape {} and num_groups={g}",
                            fmt_shape(&x.shape)
                        ),
                    ));
                }
                vec![x.shape[1]]
            }
        };
        let mut i = 1;
        if let Some(w) = take(inputs, self.weight, &mut i) {
            check_param(op, "weight", w, &pshape, x.dtype)?;
        }
        if let Some(b) = take(inputs, self.bias, &mut i) {
            check_param(op, "bias", b, &pshape, x.dtype)?;
        }
        Ok(vec![Meta::new(&x.shape, x.dtype)])
    }
    op_parts! {
        cpu: cpu::norm,
        lower: lower::norm,
        grad: grad::norm,
    }
}

// ---- batch norm -----------------------------------------------------------------------------

/// Batch normalisation of an `[N, C, *]` input. Inputs: `x`, then `running_mean` and
/// `running_var` (both or neither), `weight` and `bias` when present. Outputs: the normalised
/// input, then, in training with running stats, the updated running mean and variance.
#[derive(Clone, Debug)]
pub struct BatchNorm {
    /// Normalise with the batch's statistics (and update the running ones).
    pub training: bool,
    /// Weight of the batch statistics in the running update.
    pub momentum: f64,
    /// Added to the variance before the square root.
    pub eps: f64,
    /// Running mean and variance are given.
    pub running: bool,
    /// A weight is given.
    pub weight: bool,
    /// A bias is given.
    pub bias: bool,
}

impl OpDef for BatchNorm {
    fn name(&self) -> &'static str {
        "batch_norm"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.name();
        let n = 1 + 2 * self.running as usize + self.weight as usize + self.bias as usize;
        check_arity(op, inputs, n)?;
        let x = &inputs[0];
        check_float(op, x)?;
        check_nc(op, x)?;
        let c = x.shape[1];
        if self.training && x.numel() / c.max(1) == 1 {
            return Err(Error::shape(
                op,
                format!(
                    "expected more than 1 value per channel when training, got input of shape {}",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        if !self.training && !self.running {
            return Err(Error::invalid_argument(
                op,
                "running_mean and running_var must be given in evaluation mode",
            ));
        }
        let mut i = 1;
        for (present, what) in [
            (self.running, "running_mean"),
            (self.running, "running_var"),
            (self.weight, "weight"),
            (self.bias, "bias"),
        ] {
            if let Some(m) = take(inputs, present, &mut i) {
                check_param(op, what, m, &[c], x.dtype)?;
            }
        }
        let mut out = vec![Meta::new(&x.shape, x.dtype)];
        if self.training && self.running {
            out.push(Meta::new(&[c], x.dtype));
            out.push(Meta::new(&[c], x.dtype));
        }
        Ok(out)
    }
    fn backward_reads(&self, input: usize, _: &[bool]) -> bool {
        // In training the running stats are updated from the batch's statistics and the
        // backward never reads their old values; the module writes the new ones back in place
        // right after the forward.
        !(self.training && self.running && (input == 1 || input == 2))
    }

    op_parts! {
        cpu: cpu::batch_norm,
        lower: lower::batch_norm,
        backward: grad::batch_norm,
    }
}

// ---- options --------------------------------------------------------------------------------

options! {
    /// Options of [`layer_norm_with`] and [`group_norm_with`], PyTorch's keyword arguments with
    /// their defaults: no weight, no bias, `eps` 1e-5.
    #[derive(Clone, Copy, Debug)]
    pub struct NormOptions<'a> {
        /// Multiplies the normalised value: one per element of `normalized_shape` (layer norm)
        /// or per channel (group norm).
        weight: Option<&'a Tensor> = None => into "Sets (or, with `None`, clears) the weight.",
        /// Added after the weight, shaped as it.
        bias: Option<&'a Tensor> = None => into "Sets (or, with `None`, clears) the bias.",
        /// Added to the variance before the square root.
        eps: f64 = 1e-5 => "Sets `eps`.",
    }

    /// Options of [`rms_norm_with`], PyTorch's keyword arguments with their defaults: no
    /// weight, and `eps` the machine epsilon of the compute type (f32's for the 16-bit floats).
    #[derive(Clone, Copy, Debug)]
    pub struct RmsNormOptions<'a> {
        /// Multiplies the normalised value, one per element of `normalized_shape`.
        weight: Option<&'a Tensor> = None => into "Sets (or, with `None`, clears) the weight.",
        /// Added to the mean square before the square root; `None` for the default.
        eps: Option<f64> = None => into "Sets `eps` (`None`: the default).",
    }

    /// Options of [`batch_norm`], PyTorch's arguments with their defaults: no running stats,
    /// no weight, no bias, evaluation mode, `momentum` 0.1, `eps` 1e-5.
    #[derive(Clone, Copy, Debug)]
    pub struct BatchNormOptions<'a> {
        /// Running mean per channel (given with `running_var`, or neither).
        running_mean: Option<&'a Tensor> = None
            => into "Sets (or, with `None`, clears) the running mean.",
        /// Running variance per channel.
        running_var: Option<&'a Tensor> = None
            => into "Sets (or, with `None`, clears) the running variance.",
        /// Weight per channel.
        weight: Option<&'a Tensor> = None => into "Sets (or, with `None`, clears) the weight.",
        /// Bias per channel.
        bias: Option<&'a Tensor> = None => into "Sets (or, with `None`, clears) the bias.",
        /// Normalise with the batch's statistics (and update the running ones).
        training: bool = false
            => "Training (batch statistics) or evaluation (running statistics) mode.",
        /// Weight of the batch statistics in the running update.
        momentum: f64 = 0.1 => "Sets `momentum`.",
        /// Added to the variance before the square root.
        eps: f64 = 1e-5 => "Sets `eps`.",
    }
}

// ---- public functions -----------------------------------------------------------------------

fn with_opts<'a>(x: &'a Tensor, opts: &[Option<&'a Tensor>]) -> Vec<&'a Tensor> {
    std::iter::once(x)
        .chain(opts.iter().flatten().copied())
        .collect()
}

/// Layer, RMS or group norm (`normalized` empty for group norm) with the weight and bias given.
fn run_norm(
    x: &Tensor,
    kind: NormKind,
    normalized: &[usize],
    eps: f64,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
) -> Result<Tensor> {
    let op = Norm {
        kind,
        normalized: normalized.to_vec(),
        eps,
        weight: weight.is_some(),
        bias: bias.is_some(),
    };
    run1(&op, &with_opts(x, &[weight, bias]))
}

/// Layer normalisation over the trailing `normalized_shape` dims (biased variance), with
/// PyTorch's defaults (see [`layer_norm_with`]).
pub fn layer_norm(x: &Tensor, normalized_shape: &[usize]) -> Result<Tensor> {
    layer_norm_with(x, normalized_shape, &NormOptions::new())
}

/// Layer normalisation over the trailing `normalized_shape` dims (biased variance), then
/// `* weight + bias` where given.
pub fn layer_norm_with(
    x: &Tensor,
    normalized_shape: &[usize],
    opts: &NormOptions,
) -> Result<Tensor> {
    run_norm(
        x,
        NormKind::Layer,
        normalized_shape,
        opts.eps,
        opts.weight,
        opts.bias,
    )
}

/// RMS normalisation over the trailing `normalized_shape` dims, with PyTorch's defaults (see
/// [`rms_norm_with`]).
pub fn rms_norm(x: &Tensor, normalized_shape: &[usize]) -> Result<Tensor> {
    rms_norm_with(x, normalized_shape, &RmsNormOptions::new())
}

/// RMS normalisation over the trailing `normalized_shape` dims, then `* weight` where given.
/// `eps` defaults, as in PyTorch, to the machine epsilon of the compute type (f32's for
/// the 16-bit floats).
pub fn rms_norm_with(
    x: &Tensor,
    normalized_shape: &[usize],
    opts: &RmsNormOptions,
) -> Result<Tensor> {
    let eps = opts.eps.unwrap_or(match x.dtype() {
        DType::F64 => f64::EPSILON,
        _ => f32::EPSILON as f64,
    });
    run_norm(x, NormKind::Rms, normalized_shape, eps, opts.weight, None)
}

/// Group normalisation of an `[N, C, *]` input, with PyTorch's defaults (see
/// [`group_norm_with`]).
pub fn group_norm(x: &Tensor, num_groups: usize) -> Result<Tensor> {
    group_norm_with(x, num_groups, &NormOptions::new())
}

/// Group normalisation of an `[N, C, *]` input: statistics per sample and group of
/// `C / num_groups` channels, then per-channel `* weight + bias` where given.
pub fn group_norm_with(x: &Tensor, num_groups: usize, opts: &NormOptions) -> Result<Tensor> {
    run_norm(
        x,
        NormKind::Group(num_groups),
        &[],
        opts.eps,
        opts.weight,
        opts.bias,
    )
}

/// What [`batch_norm`] returns.
#[derive(Clone)]
pub struct BatchNormOutput {
    /// The normalised input.
    pub output: Tensor,
    /// In training with running stats: the updated running mean (a new tensor; the one
    /// passed in is left as it was).
    pub running_mean: Option<Tensor>,
    /// In training with running stats: the updated running variance (from the unbiased
    /// batch variance), a new tensor.
    pub running_var: Option<Tensor>,
}

/// Batch normalisation of an `[N, C, *]` input (the arguments and their defaults are in
/// [`BatchNormOptions`]).
///
/// In training it normalises with the batch's mean and biased variance per channel and,
/// when running stats are given, returns them updated as
/// `momentum * batch + (1 - momentum) * running` (the variance term unbiased). Tensors are
/// immutable handles, so the updated stats come back as new tensors instead of being
/// written in place. In evaluation it normalises with the running stats, which are then
/// required.
///
/// Gradients: the output is differentiated through the batch statistics in training and
/// with the running stats as constants in evaluation; the running stats get no gradient from
/// it. The updated running stats are differentiable too (`momentum` times the batch
/// statistic's gradient, `1 - momentum` into the old stat), though PyTorch's in-place
/// update gives them no graph at all.
pub fn batch_norm(x: &Tensor, opts: &BatchNormOptions) -> Result<BatchNormOutput> {
    let BatchNormOptions {
        running_mean,
        running_var,
        weight,
        bias,
        training,
        momentum,
        eps,
    } = *opts;
    if running_mean.is_some() != running_var.is_some() {
        return Err(Error::invalid_argument(
            "batch_norm",
            "expected running_mean and running_var both given or both absent",
        ));
    }
    let op = BatchNorm {
        training,
        momentum,
        eps,
        running: running_mean.is_some(),
        weight: weight.is_some(),
        bias: bias.is_some(),
    };
    let mut outs = run(
        &op,
        &with_opts(x, &[running_mean, running_var, weight, bias]),
    )?
    .into_iter();
    let output = outs
        .next()
        .ok_or_else(|| Error::invalid_argument("batch_norm", "the op produced no output"))?;
    Ok(BatchNormOutput {
        output,
        running_mean: outs.next(),
        running_var: outs.next(),
    })
}
