//! Masking: masked_fill (a value where a bool mask is true) and tril/triu (zeros outside a
//! triangle), each with its shape rule, CPU kernel, lowering and backward rule.

use tpu_tensor::shape::broadcast_shapes;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Error, Result, Scalar, Tensor};

use super::MovementOps;
use super::args::check_fill;
use super::cpu::{by_size, carrier_value, contiguous_elements, out_raw};
use super::lower::zeros;
use crate::autograd::Saved;
use crate::cpu::kernels::{Reader, cpu_context, map2, par_row_blocks, pick};
use crate::hlo::{Cmp, FnBuilder, TensorType, Value};
use crate::op::{Meta, OpDef, grad_of_first, input_grad};

// ---- masked_fill --------------------------------------------------------------------------------

/// `torch.masked_fill`: inputs `(x, mask)`; `value` where the bool mask is true. The two
/// broadcast together, as PyTorch's out-of-place form.
#[derive(Clone, Debug)]
pub struct MaskedFill {
    /// The fill value (converted to the input's dtype).
    pub value: Scalar,
}

impl OpDef for MaskedFill {
    fn name(&self) -> &'static str {
        "masked_fill"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let (x, mask) = (&inputs[0], &inputs[1]);
        if mask.dtype != DType::Bool {
            return Err(Error::DTypeMismatch {
                context: format!("masked_fill: mask of shape {}", fmt_shape(&mask.shape)),
                expected: DType::Bool,
                given: mask.dtype,
            });
        }
        check_fill("masked_fill", self.value, x.dtype)?;
        let shape = broadcast_shapes("masked_fill", &x.shape, &mask.shape)?;
        Ok(vec![Meta::new(&shape, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let (x, mask) = (inputs[0], inputs[1]);
        let out = &outputs[0];
        let (dev, device) = cpu_context("masked_fill", x)?;
        let r = Reader::new(&[x, mask]);
        let md = r.data::<bool>(mask)?;
        let t = by_size!(x.dtype(), C, {
            let v: C = carrier_value(self.value, x.dtype())?;
            let xd = r.data::<C>(x)?;
            out_raw::<C>(out, &device, |o| {
                map2(&dev, (xd, x), (md, mask), &out.shape, o, |a: C, m: bool| {
                    pick(m, v, a)
                })
            })?
        });
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let out = &outputs[0];
        let x = b.broadcast_to(&inputs[0], &out.shape);
        let m = b.broadcast_to(&inputs[1], &out.shape);
        let v = b.splat(out.ty(), self.value);
        Ok(vec![b.select(&m, &v, &x)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The gradient, zero where the value was filled in. The mask gets none.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        grad_of_first(grads, 2, |g| {
            Ok(vec![Some(g.masked_fill(&saved.inputs[1], 0)?), None])
        })
    }
}

// ---- tril / triu --------------------------------------------------------------------------------

/// `torch.tril` / `torch.triu` over the last two dims: keeps elements with `col - row` at most
/// (tril) or at least (triu) `diagonal`, zeroes the rest.
#[derive(Clone, Debug)]
pub struct Tri {
    /// triu rather than tril.
    pub upper: bool,
    /// The diagonal offset (positive is above the main diagonal).
    pub diagonal: i64,
}

impl Tri {
    fn op_name(&self) -> &'static str {
        if self.upper { "triu" } else { "tril" }
    }

    fn keep(&self, row: i64, col: i64) -> bool {
        if self.upper {
            col - row >= self.diagonal
        } else {
            col - row <= self.diagonal
        }
    }
}

impl OpDef for Tri {
    fn name(&self) -> &'static str {
        self.op_name()
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = &inputs[0];
        if x.rank() < 2 {
            return Err(Error::shape(
                self.op_name(),
                format!(
                    "expected a tensor with at least 2 dims, got shape {}",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        Ok(vec![x.clone()])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0].contiguous()?;
        let (dev, device) = cpu_context(self.op_name(), &x)?;
        let n = x.rank();
        let (rows, cols) = (x.shape()[n - 2], x.shape()[n - 1]);
        let r = Reader::new(&[&x]);
        let t = by_size!(x.dtype(), C, {
            let src = contiguous_elements::<C>(&r, &x)?;
            out_raw::<C>(&outputs[0], &device, |o| {
                par_row_blocks(&dev, o, cols, |first, chunk| {
                    for (k, row) in chunk.chunks_mut(cols).enumerate() {
                        let rl = first + k;
                        let i = (rl % rows) as i64;
                        let s = &src[rl * cols..][..cols];
                        for (j, (o, &v)) in row.iter_mut().zip(s).enumerate() {
                            if self.keep(i, j as i64) {
                                *o = v;
                            }
                        }
                    }
                })
            })?
        });
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let x = &inputs[0];
        let out = &outputs[0];
        if out.numel() == 0 {
            return Ok(vec![zeros(b, out)]);
        }
        let dims = x.dims().to_vec();
        let n = dims.len();
        let row = b.iota(&dims, n - 2, DType::I64);
        let col = b.iota(&dims, n - 1, DType::I64);
        let diff = b.ew("stablehlo.subtract", &[&col, &row]);
        let k = b.splat(TensorType::new(&dims, DType::I64), self.diagonal);
        let keep = b.compare(if self.upper { Cmp::Ge } else { Cmp::Le }, &diff, &k);
        let z = zeros(b, out);
        Ok(vec![b.select(&keep, x, &z)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The same triangle of the gradient.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        input_grad(saved, grads, |g, _| crate::exec::dispatch::run1(self, &[g]))
    }
}
