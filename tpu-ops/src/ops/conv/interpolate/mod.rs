//! Interpolation (`upsample_nearest2d`, `upsample_bilinear2d`): the op struct, PyTorch's source
//! indices and weights (shared by the kernel, the lowering and the backward rule, so all three
//! agree bit for bit), and the `OpDef` impl that hands the work to the files below.

mod cpu;
mod grad;
mod lower;

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{Error, Result, Tensor};

use crate::cpu::float::Float;
use crate::op::args::check_float;
use crate::op::{Meta, OpDef, op_parts};

use super::options::InterpolateMode;
use super::single;

/// `interpolate` of a 4-D input (PyTorch's `upsample_nearest2d` and `upsample_bilinear2d`).
#[derive(Clone, Debug, PartialEq)]
pub struct Interpolate {
    pub(super) size: [usize; 2],
    /// Scale factors given by the caller; PyTorch maps coordinates with them when present.
    pub(super) scales: [Option<f64>; 2],
    pub(super) mode: InterpolateMode,
}

/// PyTorch's legacy nearest source index (`nearest_idx`), with its f32 arithmetic.
fn nearest_sources(len: usize, out: usize, scale: Option<f64>) -> Vec<usize> {
    (0..out)
        .map(|i| {
            if out == len {
                i
            } else if out == 2 * len {
                i >> 1
            } else {
                let s = match scale {
                    Some(v) if v > 0.0 => (1.0 / v) as f32,
                    _ => len as f32 / out as f32,
                };
                ((i as f32 * s).floor() as usize).min(len - 1)
            }
        })
        .collect()
}

/// PyTorch's linear interpolation taps along one dim, in the op's compute precision:
/// `(i0, i1, weight0, weight1)` per output index.
fn linear_taps<F: Float>(
    len: usize,
    out: usize,
    align: bool,
    scale: Option<f64>,
) -> Vec<(usize, usize, F, F)> {
    let zero = F::of(0.0);
    let one = F::of(1.0);
    let scale: F = if align {
        if out > 1 {
            F::of_usize(len - 1) / F::of_usize(out - 1)
        } else {
            zero
        }
    } else {
        match scale {
            Some(v) if v > 0.0 => F::of(1.0 / v),
            _ => F::of_usize(len) / F::of_usize(out),
        }
    };
    (0..out)
        .map(|i| {
            let real = if align {
                scale * F::of_usize(i)
            } else {
                let r = scale * (F::of_usize(i) + F::of(0.5)) - F::of(0.5);
                if r < zero { zero } else { r }
            };
            let i0 = (real.floor().to_f64() as usize).min(len - 1);
            let mut lambda = real - F::of_usize(i0);
            if lambda < zero {
                lambda = zero;
            }
            if lambda > one {
                lambda = one;
            }
            let i1 = if i0 < len - 1 { i0 + 1 } else { i0 };
            (i0, i1, one - lambda, lambda)
        })
        .collect()
}

impl Interpolate {
    fn check(&self, x: &Meta) -> Result<()> {
        let op = self.name();
        check_float(op, x)?;
        if x.rank() != 4 || x.shape[2] == 0 || x.shape[3] == 0 {
            return Err(Error::shape(
                op,
                format!(
                    "expected a 4-D [N, C, H, W] input with non-zero H and W, got shape {}",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        if self.size.contains(&0) {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "expected a positive output size, got {:?} for input of shape {}",
                    self.size,
                    fmt_shape(&x.shape)
                ),
            ));
        }
        Ok(())
    }
}

impl OpDef for Interpolate {
    fn name(&self) -> &'static str {
        match self.mode {
            InterpolateMode::Nearest => "upsample_nearest2d",
            InterpolateMode::Bilinear { .. } => "upsample_bilinear2d",
        }
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = single(self.name(), inputs)?;
        self.check(x)?;
        let out = [x.shape[0], x.shape[1], self.size[0], self.size[1]];
        Ok(vec![Meta::new(&out, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        Ok(vec![cpu::interpolate(self, inputs[0], &outputs[0])?])
    }

    op_parts! {
        lower: lower::interpolate,
        grad: grad::interpolate,
    }
}
