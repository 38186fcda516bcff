//! Losses: cross entropy and NLL over class indices, and the elementwise MSE and binary cross
//! entropy with logits: the ops with their shape rules, the options values and the public
//! functions. The kernels, lowerings and backward rules live in `cpu.rs`, `lower.rs` and
//! `grad.rs`.

mod cpu;
mod grad;
mod lower;

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Error, Result, Tensor};

use crate::exec::dispatch::run1;
use crate::op::args::{check_broadcasts_to, check_float};
use crate::op::{Meta, OpDef, op_parts};
use crate::ops::nn::args::{check_arity, check_dtype, check_param, take};

/// How a loss reduces its per-element values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// One loss per element (or per target position).
    None,
    /// The (weighted) mean.
    #[default]
    Mean,
    /// The sum.
    Sum,
}

/// PyTorch's default `ignore_index`.
pub const DEFAULT_IGNORE_INDEX: i64 = -100;

/// Cross entropy (from logits) or negative log-likelihood (from log-probabilities) of class
/// indices. Inputs: `input` (`[N, C, d...]` or `[C]`), `target` (i64, `[N, d...]` or `[]`),
/// then the class weights `[C]` when present.
#[derive(Clone, Debug)]
pub struct ClassLoss {
    /// The input holds logits (cross entropy) instead of log-probabilities (NLL).
    pub logits: bool,
    /// Reduction.
    pub reduction: Reduction,
    /// Targets equal to this contribute nothing (not even to the mean's denominator).
    pub ignore_index: i64,
    /// Label smoothing in `[0, 1]` (cross entropy only).
    pub label_smoothing: f64,
    /// Class weights are given.
    pub weight: bool,
}

/// `(N, C, inner)` of a class-loss input.
fn class_layout(shape: &[usize]) -> (usize, usize, usize) {
    if shape.len() == 1 {
        (1, shape[0], 1)
    } else {
        (shape[0], shape[1], shape[2..].iter().product())
    }
}

impl OpDef for ClassLoss {
    fn name(&self) -> &'static str {
        if self.logits {
            "cross_entropy"
        } else {
            "nll_loss"
        }
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.name();
        check_arity(op, inputs, 2 + self.weight as usize)?;
        let (x, t) = (&inputs[0], &inputs[1]);
        check_float(op, x)?;
        check_dtype(op, "target", t, DType::I64)?;
        if x.rank() == 0 {
            return Err(Error::shape(
                op,
                "expected an input of shape [N, C, d...] or [C], got []",
            ));
        }
        let want: Vec<usize> = if x.rank() == 1 {
            vec![]
        } else {
            std::iter::once(x.shape[0])
                .chain(x.shape[2..].iter().copied())
                .collect()
        };
        if t.shape[..] != want[..] {
            return Err(Error::shape(
                op,
                format!(
                    "expected a target of shape {} for an input of shape {}, got {}",
                    fmt_shape(&want),
                    fmt_shape(&x.shape),
                    fmt_shape(&t.shape)
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.label_smoothing) {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "expected label_smoothing in [0, 1], got {}",
                    self.label_smoothing
                ),
            ));
        }
        let classes = class_layout(&x.shape).1;
        if let Some(w) = inputs.get(2) {
            check_param(op, "weight", w, &[classes], x.dtype)?;
        }
        let out: Vec<usize> = if self.reduction == Reduction::None {
            want
        } else {
            vec![]
        };
        Ok(vec![Meta::new(&out, x.dtype)])
    }

    op_parts! {
        cpu: cpu::class_loss,
        lower: lower::class_loss,
        lower_checks: lower::class_loss_checks,
        grad: grad::class_loss,
    }
}

/// Which elementwise loss a [`PointLoss`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointKind {
    /// `(input - target)^2`.
    Mse,
    /// Binary cross entropy of logits: `-w [p t log σ(x) + (1 - t) log(1 - σ(x))]`.
    BceWithLogits,
}

/// An elementwise loss with a reduction. Inputs: `input`, `target` (same shape), then `weight`
/// and `pos_weight` (broadcastable to the input) when present.
#[derive(Clone, Debug)]
pub struct PointLoss {
    /// Which loss.
    pub kind: PointKind,
    /// Reduction.
    pub reduction: Reduction,
    /// A weight is given (BCE only).
    pub weight: bool,
    /// A positive-class weight is given (BCE only).
    pub pos_weight: bool,
}

impl OpDef for PointLoss {
    fn name(&self) -> &'static str {
        match self.kind {
            PointKind::Mse => "mse_loss",
            PointKind::BceWithLogits => "binary_cross_entropy_with_logits",
        }
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.name();
        check_arity(
            op,
            inputs,
            2 + self.weight as usize + self.pos_weight as usize,
        )?;
        let (x, t) = (&inputs[0], &inputs[1]);
        check_float(op, x)?;
        check_dtype(op, "target", t, x.dtype)?;
        if t.shape != x.shape {
            return Err(Error::shape(
                op,
                format!(
                    "expected a target of the input's shape {}, got {}",
                    fmt_shape(&x.shape),
                    fmt_shape(&t.shape)
                ),
            ));
        }
        let mut i = 2;
        for (present, what) in [(self.weight, "weight"), (self.pos_weight, "pos_weight")] {
            if let Some(m) = take(inputs, present, &mut i) {
                check_dtype(op, what, m, x.dtype)?;
                check_broadcasts_to(op, what, m, &x.shape)?;
            }
        }
        let out: &[usize] = if self.reduction == Reduction::None {
            &x.shape
        } else {
            &[]
        };
        Ok(vec![Meta::new(out, x.dtype)])
    }

    op_parts! {
        cpu: cpu::point_loss,
        lower: lower::point_loss,
        grad: grad::point_loss,
    }
}

// ---- options --------------------------------------------------------------------------------

/// Declares the options of a class-index loss: the arguments cross entropy and NLL share
/// (class weights, `ignore_index`, the reduction), then the loss's own.
macro_rules! class_loss_options {
    ($(#[$m:meta])* $Name:ident { $($own:tt)* }) => {
        options! {
            $(#[$m])*
            #[derive(Clone, Copy, Debug)]
            pub struct $Name<'a> {
                /// Weight per class (`[C]`).
                weight: Option<&'a Tensor> = None
                    => into "Sets (or, with `None`, clears) the class weights.",
                /// Targets equal to this contribute nothing (not even to the mean's denominator).
                ignore_index: i64 = DEFAULT_IGNORE_INDEX => "Sets the ignored target value.",
                /// How the per-target losses reduce.
                reduction: Reduction = Reduction::Mean => "Sets the reduction.",
                $($own)*
            }
        }
    };
}

class_loss_options! {
    /// Options of [`cross_entropy_with`], PyTorch's keyword arguments with their defaults: no
    /// class weights, `ignore_index` [`DEFAULT_IGNORE_INDEX`], the mean, no label smoothing.
    CrossEntropyOptions {
        /// Label smoothing in `[0, 1]`.
        label_smoothing: f64 = 0.0 => "Sets the label smoothing.",
    }
}

class_loss_options! {
    /// Options of [`nll_loss_with`], PyTorch's keyword arguments with their defaults: no class
    /// weights, `ignore_index` [`DEFAULT_IGNORE_INDEX`], the mean.
    NllLossOptions {}
}

options! {
    /// Options of [`binary_cross_entropy_with_logits_with`], PyTorch's keyword arguments with
    /// their defaults: no weight, no positive-class weight, the mean.
    #[derive(Clone, Copy, Debug)]
    pub struct BceWithLogitsOptions<'a> {
        /// Weight of each element's loss, broadcastable to the input.
        weight: Option<&'a Tensor> = None => into "Sets (or, with `None`, clears) the weight.",
        /// Weight of the positive term (typically one per class along the last dim),
        /// broadcastable to the input.
        pos_weight: Option<&'a Tensor> = None
            => into "Sets (or, with `None`, clears) the positive-class weight.",
        /// How the elementwise losses reduce.
        reduction: Reduction = Reduction::Mean => "Sets the reduction.",
    }
}

// ---- public functions -----------------------------------------------------------------------

/// Cross entropy of logits against class indices with PyTorch's defaults (see
/// [`cross_entropy_with`]).
pub fn cross_entropy(input: &Tensor, target: &Tensor) -> Result<Tensor> {
    cross_entropy_with(input, target, &CrossEntropyOptions::new())
}

/// Cross entropy of logits `input` (`[N, C, d...]` or `[C]`) against class indices
/// `target` (i64, `[N, d...]` or `[]`), with optional class `weight` (`[C]`),
/// `ignore_index` and `label_smoothing` as PyTorch 2.x: the mean divides by the summed
/// weights of the non-ignored targets. Targets outside `[0, C)` other than `ignore_index` are
/// errors on the CPU. Only `input` gets a gradient (the class weights do not, as in PyTorch).
pub fn cross_entropy_with(
    input: &Tensor,
    target: &Tensor,
    opts: &CrossEntropyOptions,
) -> Result<Tensor> {
    class_loss(input, target, true, opts)
}

/// Cross entropy (`logits`) or NLL of `input` at the class indices `target`.
fn class_loss(
    input: &Tensor,
    target: &Tensor,
    logits: bool,
    opts: &CrossEntropyOptions,
) -> Result<Tensor> {
    let op = ClassLoss {
        logits,
        reduction: opts.reduction,
        ignore_index: opts.ignore_index,
        label_smoothing: opts.label_smoothing,
        weight: opts.weight.is_some(),
    };
    let mut ins = vec![input, target];
    ins.extend(opts.weight);
    run1(&op, &ins)
}

/// Negative log-likelihood of log-probabilities at class indices with PyTorch's defaults (see
/// [`nll_loss_with`]).
pub fn nll_loss(input: &Tensor, target: &Tensor) -> Result<Tensor> {
    nll_loss_with(input, target, &NllLossOptions::new())
}

/// Negative log-likelihood of log-probabilities `input` at class indices `target`; the
/// options are [`cross_entropy_with`]'s without label smoothing.
pub fn nll_loss_with(input: &Tensor, target: &Tensor, opts: &NllLossOptions) -> Result<Tensor> {
    let opts = CrossEntropyOptions {
        weight: opts.weight,
        ignore_index: opts.ignore_index,
        reduction: opts.reduction,
        label_smoothing: 0.0,
    };
    class_loss(input, target, false, &opts)
}

/// Mean squared error of `input` against a `target` of the same shape.
pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let op = PointLoss {
        kind: PointKind::Mse,
        reduction,
        weight: false,
        pos_weight: false,
    };
    run1(&op, &[input, target])
}

/// Binary cross entropy of logits against probabilities with PyTorch's defaults (see
/// [`binary_cross_entropy_with_logits_with`]).
pub fn binary_cross_entropy_with_logits(input: &Tensor, target: &Tensor) -> Result<Tensor> {
    binary_cross_entropy_with_logits_with(input, target, &BceWithLogitsOptions::new())
}

/// Binary cross entropy of logits `input` against probabilities `target` (same shape),
/// computed stably through `log σ(x)`; `weight` and `pos_weight` (the weight of the
/// positive term, typically one per class along the last dim) broadcast to the input.
/// Unlike PyTorch, which does not differentiate them, `weight` and `pos_weight` get
/// gradients too.
pub fn binary_cross_entropy_with_logits_with(
    input: &Tensor,
    target: &Tensor,
    opts: &BceWithLogitsOptions,
) -> Result<Tensor> {
    let op = PointLoss {
        kind: PointKind::BceWithLogits,
        reduction: opts.reduction,
        weight: opts.weight.is_some(),
        pos_weight: opts.pos_weight.is_some(),
    };
    let mut ins = vec![input, target];
    ins.extend(opts.weight);
    ins.extend(opts.pos_weight);
    run1(&op, &ins)
}
