//! Padding (`F.pad`: constant, reflect, replicate borders), with its shape rule, CPU kernel,
//! lowering and backward rule.

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{Error, Result, Scalar, Tensor};

use super::MovementOps;
use super::args::check_fill;
use super::cpu::{cpu_tables, empty_output};
use super::grad::{own, zero_pad_dim};
use super::lower::{reverse, slice_dim, zeros};
use crate::TensorOps;
use crate::autograd::Saved;
use crate::hlo::{FnBuilder, Value, i64_array};
use crate::op::args::check_dtype_in;
use crate::op::{DTypeSet, Meta, OpDef, input_grad};

/// How [`MovementOps::pad`] fills the border.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PadMode {
    /// A constant value (converted to the tensor's dtype).
    Constant(Scalar),
    /// The mirror image of the tensor, without repeating the edge element.
    Reflect,
    /// Copies of the edge element.
    Replicate,
}

/// `F.pad`: pads the last `pads.len() / 2` dims; `pads` lists (before, after) pairs starting
/// from the last dim, as PyTorch's.
#[derive(Clone, Debug)]
pub struct Pad {
    /// (before, after) pairs, last dim first.
    pub pads: Vec<usize>,
    /// How the border is filled.
    pub mode: PadMode,
}

impl Pad {
    fn pair(&self, d: usize, rank: usize) -> (usize, usize) {
        let p = rank - 1 - d;
        match (self.pads.get(2 * p), self.pads.get(2 * p + 1)) {
            (Some(&lo), Some(&hi)) => (lo, hi),
            _ => (0, 0),
        }
    }
}

/// `torch.constant_pad_nd` (`F.pad` in constant mode): (before, after) pairs from the last dim,
/// where a negative amount crops that many elements before the rest is padded with `value`;
/// the result is a new tensor either way. Padding that would leave a dim with a negative size
/// is an error.
pub(crate) fn constant_pad_nd(x: &Tensor, pads: &[i64], value: Scalar) -> Result<Tensor> {
    const OP: &str = "constant_pad_nd";
    let r = x.rank();
    if !pads.len().is_multiple_of(2) || pads.len() > 2 * r {
        return Err(Error::shape(
            OP,
            format!(
                "expected at most {r} (before, after) pairs for shape {}, got {pads:?}",
                fmt_shape(x.shape())
            ),
        ));
    }
    let mut cropped = x.clone();
    let mut grow = Vec::with_capacity(pads.len());
    for (p, pair) in pads.chunks(2).enumerate() {
        let d = r - 1 - p;
        let n = x.shape()[d] as i64;
        let (lo, hi) = (pair[0], pair[1]);
        let (cut_lo, cut_hi) = ((-lo).max(0), (-hi).max(0));
        let len = n - cut_lo - cut_hi;
        if len < 0 || n + lo + hi < 0 {
            return Err(Error::shape(
                OP,
                format!(
                    "padding ({lo}, {hi}) leaves dim {d} of size {n} with a negative size \
                     (shape {})",
                    fmt_shape(x.shape())
                ),
            ));
        }
        if cut_lo > 0 || cut_hi > 0 {
            cropped = cropped.narrow(d as i64, cut_lo, len as usize)?;
        }
        grow.extend([lo.max(0) as usize, hi.max(0) as usize]);
    }
    if grow.iter().all(|&g| g == 0) {
        // A new tensor, as PyTorch's: writes to it must not reach `x`.
        return cropped.copy();
    }
    cropped.pad(&grow, PadMode::Constant(value))
}

impl OpDef for Pad {
    fn name(&self) -> &'static str {
        "pad"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = &inputs[0];
        let r = x.rank();
        if !self.pads.len().is_multiple_of(2) {
            return Err(Error::invalid_argument(
                "pad",
                format!(
                    "expected (before, after) pairs, got {} values {:?}",
                    self.pads.len(),
                    self.pads
                ),
            ));
        }
        if self.pads.len() > 2 * r {
            return Err(Error::shape(
                "pad",
                format!(
                    "{} pairs of padding {:?} for a tensor of shape {} with {r} dims",
                    self.pads.len() / 2,
                    self.pads,
                    fmt_shape(&x.shape)
                ),
            ));
        }
        match self.mode {
            PadMode::Constant(v) => check_fill("pad", v, x.dtype)?,
            PadMode::Reflect | PadMode::Replicate => check_dtype_in("pad", x, DTypeSet::NUMERIC)?,
        }
        let mut shape = x.shape.clone();
        for (d, s) in shape.iter_mut().enumerate() {
            let (lo, hi) = self.pair(d, r);
            let n = *s;
            let bad = match self.mode {
                PadMode::Reflect => (lo > 0 || hi > 0) && (lo >= n || hi >= n),
                PadMode::Replicate => n == 0 && (lo > 0 || hi > 0),
                PadMode::Constant(_) => false,
            };
            if bad {
                let why = if self.mode == PadMode::Reflect {
                    "reflect padding must be smaller than the dim's size"
                } else {
                    "replicate padding needs a non-empty dim"
                };
                return Err(Error::shape(
                    "pad",
                    format!(
                        "{why}: padding ({lo}, {hi}) for dim {d} of size {n} (tensor shape {})",
                        fmt_shape(&x.shape)
                    ),
                ));
            }
            *s = n
                .checked_add(lo)
                .and_then(|v| v.checked_add(hi))
                .ok_or_else(|| {
                    Error::shape("pad", format!("padding {:?} is too large", self.pads))
                })?;
        }
        tpu_tensor::shape::checked_numel("pad", &shape)?;
        Ok(vec![Meta::new(&shape, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0];
        if let Some(t) = empty_output(x, &outputs[0])? {
            return Ok(vec![t]);
        }
        let r = x.rank();
        let tabs: Vec<Vec<i64>> = (0..r)
            .map(|d| {
                let (lo, hi) = self.pair(d, r);
                let (n, st) = (x.shape()[d] as i64, x.strides()[d] as i64);
                (0..n + (lo + hi) as i64)
                    .map(|o| {
                        let i = o - lo as i64;
                        let s = match self.mode {
                            PadMode::Constant(_) if i < 0 || i >= n => return -1,
                            PadMode::Constant(_) => i,
                            PadMode::Reflect if i < 0 => -i,
                            PadMode::Reflect if i >= n => 2 * (n - 1) - i,
                            PadMode::Reflect => i,
                            PadMode::Replicate => i.clamp(0, n - 1),
                        };
                        s * st
                    })
                    .collect()
            })
            .collect();
        let fill = match self.mode {
            PadMode::Constant(v) => v,
            _ => Scalar::Int(0),
        };
        Ok(vec![cpu_tables("pad", x, &tabs, fill, &outputs[0])?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let x = &inputs[0];
        let r = x.ty.rank();
        if outputs[0].numel() == 0 {
            return Ok(vec![zeros(b, &outputs[0])]);
        }
        if let PadMode::Constant(v) = self.mode {
            let pv = b.scalar(x.dtype(), v);
            let (lo, hi): (Vec<i64>, Vec<i64>) = (0..r)
                .map(|d| {
                    let (l, h) = self.pair(d, r);
                    (l as i64, h as i64)
                })
                .unzip();
            let attrs = format!(
                "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
                i64_array(&lo),
                i64_array(&hi),
                i64_array(&vec![0; r])
            );
            return Ok(vec![b.op(
                "stablehlo.pad",
                &[x, &pv],
                &attrs,
                outputs[0].ty(),
            )]);
        }
        let mut v = x.clone();
        for d in 0..r {
            let (lo, hi) = self.pair(d, r);
            if lo + hi == 0 {
                continue;
            }
            let n = v.dims()[d];
            let mut parts = Vec::new();
            let edge = |b: &mut FnBuilder, v: &Value, start: usize, count: usize, at_end: bool| {
                if self.mode == PadMode::Reflect {
                    let s = slice_dim(b, v, d, start, start + count);
                    reverse(b, &s, &[d])
                } else {
                    let at = if at_end { n - 1 } else { 0 };
                    let s = slice_dim(b, v, d, at, at + 1);
                    let mut dims = s.dims().to_vec();
                    dims[d] = count;
                    let map: Vec<i64> = (0..r as i64).collect();
                    b.broadcast_in_dim(&s, &map, &dims)
                }
            };
            if lo > 0 {
                parts.push(edge(b, &v, 1, lo, false));
            }
            parts.push(v.clone());
            if hi > 0 {
                parts.push(edge(b, &v, n.saturating_sub(1 + hi), hi, true));
            }
            let refs: Vec<&Value> = parts.iter().collect();
            v = b.concatenate(&refs, d);
        }
        Ok(vec![v])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The gradient's middle slice, plus (reflect, replicate) the border's gradient added back
    /// to the elements it copied; one dim at a time, as the padding of each dim is separate.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        input_grad(saved, grads, |g, x| {
            let r = x.rank();
            let mut g = g.clone();
            for d in 0..r {
                let (lo, hi) = self.pair(d, r);
                if lo + hi == 0 {
                    continue;
                }
                let n = x.shape()[d];
                let mut acc = g.narrow(d, lo as i64, n)?;
                match self.mode {
                    PadMode::Constant(_) => {}
                    PadMode::Reflect => {
                        // Output position lo - k copies element k (k = 1..=lo), so the left border
                        // reversed lands on elements 1..=lo.
                        if lo > 0 {
                            let left = g.narrow(d, 0, lo)?.flip(&[d as i64])?;
                            acc = acc.add(&zero_pad_dim(&left, d, 1, n - 1 - lo)?)?;
                        }
                        // Position lo + n - 1 + k copies element n - 1 - k (k = 1..=hi): the right
                        // border reversed lands on elements n - 1 - hi..n - 1.
                        if hi > 0 {
                            let right = g.narrow(d, (lo + n) as i64, hi)?.flip(&[d as i64])?;
                            acc = acc.add(&zero_pad_dim(&right, d, n - 1 - hi, 1)?)?;
                        }
                    }
                    PadMode::Replicate => {
                        // Every border position copies the edge element: their sum goes there.
                        if lo > 0 {
                            let left = crate::ops::reduce_sum_dims(
                                &g.narrow(d, 0, lo)?,
                                &[d as i64],
                                true,
                            )?;
                            acc = acc.add(&zero_pad_dim(&left, d, 0, n - 1)?)?;
                        }
                        if hi > 0 {
                            let right = crate::ops::reduce_sum_dims(
                                &g.narrow(d, (lo + n) as i64, hi)?,
                                &[d as i64],
                                true,
                            )?;
                            acc = acc.add(&zero_pad_dim(&right, d, n - 1, 0)?)?;
                        }
                    }
                }
                g = acc;
            }
            own(g)
        })
    }
}
