//! Joining: cat and stack (inputs side by side along a dim) and repeat/tile (copies of one input
//! side by side), each with its shape rule, CPU kernel, lowering and backward rule.

use tpu_tensor::shape::{resolve_dim, resolve_dim_in};
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Dim, Dims, Error, Result, Scalar, Tensor};

use super::args::numel;
use super::cpu::{by_size, contiguous_elements, cpu_tables, empty_output, out_raw};
use super::grad::own;
use super::lower::zeros;
use crate::autograd::Saved;
use crate::cpu::kernels::{Reader, cpu_context, par_row_blocks};
use crate::hlo::{FnBuilder, Value};
use crate::op::promote::promote_types;
use crate::op::{Meta, OpDef, grad_of_first, input_grad};
use crate::ops::cast::lower_cast;

// ---- cat / stack --------------------------------------------------------------------------------

/// Concatenation along a dim with PyTorch's type promotion; 1-D empty inputs are skipped, as
/// PyTorch does for backward compatibility.
#[derive(Clone, Debug)]
pub struct Cat {
    /// The dim (negative counts from the end).
    pub dim: i64,
}

struct CatPlan {
    dim: usize,
    keep: Vec<usize>,
    shape: Dims,
    dtype: DType,
}

fn cat_plan(dim: i64, inputs: &[Meta]) -> Result<CatPlan> {
    let first = inputs
        .first()
        .ok_or_else(|| Error::invalid_argument("cat", "expected a non-empty list of tensors"))?;
    let dtype = inputs[1..]
        .iter()
        .fold(first.dtype, |a, m| promote_types(a, m.dtype));
    if let Some(i) = inputs.iter().position(|m| m.rank() == 0) {
        return Err(Error::shape(
            "cat",
            format!("tensor {i} is zero-dimensional (shape []) and cannot be concatenated"),
        ));
    }
    let keep: Vec<usize> = (0..inputs.len())
        .filter(|&i| !(inputs[i].rank() == 1 && inputs[i].shape[0] == 0))
        .collect();
    let Some(&r0) = keep.first() else {
        return Ok(CatPlan {
            dim: 0,
            keep,
            shape: Dims::from_elem(0, 1),
            dtype,
        });
    };
    let reference = &inputs[r0];
    let d = resolve_dim("cat", dim, &reference.shape)?;
    let mut shape = reference.shape.clone();
    shape[d] = 0;
    for &i in &keep {
        let m = &inputs[i];
        let fits = m.rank() == reference.rank()
            && m.shape
                .iter()
                .zip(&reference.shape)
                .enumerate()
                .all(|(k, (a, b))| k == d || a == b);
        if !fits {
            return Err(Error::shape(
                "cat",
                format!(
                    "expected every tensor to match tensor {r0} (shape {}) except in dim {d}, but tensor {i} has shape {}",
                    fmt_shape(&reference.shape),
                    fmt_shape(&m.shape)
                ),
            ));
        }
        shape[d] = shape[d].checked_add(m.shape[d]).ok_or_else(|| {
            Error::shape(
                "cat",
                "the result has more elements than the address space holds",
            )
        })?;
    }
    Ok(CatPlan {
        dim: d,
        keep,
        shape,
        dtype,
    })
}

impl OpDef for Cat {
    fn name(&self) -> &'static str {
        "cat"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let p = cat_plan(self.dim, inputs)?;
        Ok(vec![Meta::new(&p.shape, p.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let metas: Vec<Meta> = inputs.iter().map(|t| Meta::of(t)).collect();
        let p = cat_plan(self.dim, &metas)?;
        let out = &outputs[0];
        let (dev, device) = cpu_context("cat", inputs[0])?;
        let parts = p
            .keep
            .iter()
            .map(|&i| inputs[i].to_dtype(out.dtype)?.contiguous())
            .collect::<Result<Vec<Tensor>>>()?;
        let inner = numel(&out.shape[p.dim + 1..]);
        let row_len = out.shape[p.dim] * inner;
        let blocks: Vec<usize> = parts.iter().map(|t| t.shape()[p.dim] * inner).collect();
        let refs: Vec<&Tensor> = parts.iter().collect();
        let r = Reader::new(&refs);
        let t = by_size!(out.dtype, C, {
            let srcs = parts
                .iter()
                .map(|t| contiguous_elements::<C>(&r, t))
                .collect::<Result<Vec<&[C]>>>()?;
            out_raw::<C>(out, &device, |o| {
                par_row_blocks(&dev, o, row_len, |first, chunk| {
                    for (k, row) in chunk.chunks_mut(row_len).enumerate() {
                        let ob = first + k;
                        let mut pos = 0;
                        for (s, &bl) in srcs.iter().zip(&blocks) {
                            row[pos..pos + bl].copy_from_slice(&s[ob * bl..(ob + 1) * bl]);
                            pos += bl;
                        }
                    }
                })
            })?
        });
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let metas: Vec<Meta> = inputs.iter().map(Meta::of_value).collect();
        let p = cat_plan(self.dim, &metas)?;
        if outputs[0].numel() == 0 {
            return Ok(vec![zeros(b, &outputs[0])]);
        }
        let parts: Vec<Value> = p
            .keep
            .iter()
            .filter(|&&i| inputs[i].dims()[p.dim] > 0)
            .map(|&i| lower_cast(b, &inputs[i], p.dtype))
            .collect();
        if parts.len() == 1 {
            return Ok(parts);
        }
        let refs: Vec<&Value> = parts.iter().collect();
        Ok(vec![b.concatenate(&refs, p.dim)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// Each input gets its slice of the gradient; skipped 1-D empty inputs get an empty one.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let n = saved.inputs.len();
        grad_of_first(grads, n, |g| {
            let metas: Vec<Meta> = saved.inputs.iter().map(Meta::of).collect();
            let p = cat_plan(self.dim, &metas)?;
            let mut out = vec![None; n];
            for (i, slot) in out.iter_mut().enumerate() {
                if !p.keep.contains(&i) {
                    *slot = Some(Tensor::zeros([0], g.dtype(), g.device())?);
                }
            }
            let mut start = 0;
            for &i in &p.keep {
                let len = metas[i].shape[p.dim];
                out[i] = Some(own(g.narrow(p.dim, start as i64, len)?)?);
                start += len;
            }
            Ok(out)
        })
    }
}

/// `torch.cat`: concatenates tensors along `dim`, promoting their dtypes as PyTorch does.
/// One-dimensional empty tensors are skipped (PyTorch's legacy rule).
pub fn cat(tensors: &[&Tensor], dim: impl Dim) -> Result<Tensor> {
    run_joined(&Cat { dim: dim.to_i64() }, tensors)
}

/// Runs `cat` or `stack`, which both refuse an empty list before the op sees it (its checks
/// read the first input).
fn run_joined(op: &dyn OpDef, tensors: &[&Tensor]) -> Result<Tensor> {
    if tensors.is_empty() {
        return Err(Error::invalid_argument(
            op.name(),
            "expected a non-empty list of tensors",
        ));
    }
    crate::exec::dispatch::run1(op, tensors)
}

/// `torch.stack`: [`Cat`] of the inputs each given a new dim `dim` of size 1. It is an op of
/// its own, rather than `cat` of unsqueezed views, so that autograd records it: views carry no
/// autograd record.
#[derive(Clone, Debug)]
pub struct Stack {
    /// The new dim (negative counts from the end of the result's dims).
    pub dim: i64,
}

impl Stack {
    /// The resolved new dim, after checking that every input has the first one's shape.
    fn plan(&self, inputs: &[Meta]) -> Result<usize> {
        let first = inputs.first().ok_or_else(|| {
            Error::invalid_argument("stack", "expected a non-empty list of tensors")
        })?;
        for (i, m) in inputs.iter().enumerate() {
            if m.shape != first.shape {
                return Err(Error::shape(
                    "stack",
                    format!(
                        "expected every tensor to have the shape of tensor 0 ({}), but tensor {i} has shape {}",
                        fmt_shape(&first.shape),
                        fmt_shape(&m.shape)
                    ),
                ));
            }
        }
        resolve_dim_in("stack", self.dim, first.rank() + 1, &first.shape)
    }

    /// The shape of an input with the new dim inserted.
    fn unsqueezed(shape: &[usize], d: usize) -> Dims {
        let mut s: Dims = shape.into();
        s.insert(d, 1);
        s
    }
}

impl OpDef for Stack {
    fn name(&self) -> &'static str {
        "stack"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let d = self.plan(inputs)?;
        let metas: Vec<Meta> = inputs
            .iter()
            .map(|m| Meta::new(&Stack::unsqueezed(&m.shape, d), m.dtype))
            .collect();
        Cat { dim: d as i64 }.infer(&metas)
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let metas: Vec<Meta> = inputs.iter().map(|t| Meta::of(t)).collect();
        let d = self.plan(&metas)?;
        let views = inputs
            .iter()
            .map(|t| t.unsqueeze(d))
            .collect::<Result<Vec<Tensor>>>()?;
        let refs: Vec<&Tensor> = views.iter().collect();
        Cat { dim: d as i64 }.cpu(&refs, outputs)
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let metas: Vec<Meta> = inputs.iter().map(Meta::of_value).collect();
        let d = self.plan(&metas)?;
        let parts: Vec<Value> = inputs
            .iter()
            .map(|v| b.reshape(v, &Stack::unsqueezed(v.dims(), d)))
            .collect();
        Cat { dim: d as i64 }.lower(b, &parts, outputs)
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// Input `i` gets index `i` of the gradient along the new dim.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let n = saved.inputs.len();
        grad_of_first(grads, n, |g| {
            let metas: Vec<Meta> = saved.inputs.iter().map(Meta::of).collect();
            let d = self.plan(&metas)?;
            (0..n)
                .map(|i| Ok(Some(own(g.select(d, i as i64)?)?)))
                .collect()
        })
    }
}

/// `torch.stack`: joins tensors of one shape along a new dim `dim`.
pub fn stack(tensors: &[&Tensor], dim: impl Dim) -> Result<Tensor> {
    run_joined(&Stack { dim: dim.to_i64() }, tensors)
}

// ---- repeat -------------------------------------------------------------------------------------

/// `Tensor.repeat`: tiles the tensor `sizes[i]` times along dim `i`; `sizes` may be longer than
/// the rank (new leading dims).
#[derive(Clone, Debug)]
pub struct Repeat {
    /// Repetitions per dim.
    pub sizes: Vec<usize>,
}

impl OpDef for Repeat {
    fn name(&self) -> &'static str {
        "repeat"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = &inputs[0];
        let m = self.sizes.len();
        if m < x.rank() {
            return Err(Error::shape(
                "repeat",
                format!(
                    "expected at least {} repetition counts for a tensor of shape {}, got {:?}",
                    x.rank(),
                    fmt_shape(&x.shape),
                    self.sizes
                ),
            ));
        }
        let lead = m - x.rank();
        let shape: Vec<usize> = (0..m)
            .map(|d| {
                let n = if d < lead { 1 } else { x.shape[d - lead] };
                n.checked_mul(self.sizes[d])
            })
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| Error::shape("repeat", "the result has too many elements"))?;
        tpu_tensor::shape::checked_numel("repeat", &shape)?;
        Ok(vec![Meta::new(&shape, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0];
        if let Some(t) = empty_output(x, &outputs[0])? {
            return Ok(vec![t]);
        }
        let lead = self.sizes.len() - x.rank();
        let tabs: Vec<Vec<i64>> = self
            .sizes
            .iter()
            .enumerate()
            .map(|(d, &reps)| {
                if d < lead {
                    return vec![0; reps];
                }
                let (n, st) = (x.shape()[d - lead], x.strides()[d - lead]);
                (0..reps * n).map(|o| ((o % n) * st) as i64).collect()
            })
            .collect();
        Ok(vec![cpu_tables(
            "repeat",
            x,
            &tabs,
            Scalar::Int(0),
            &outputs[0],
        )?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let out = &outputs[0];
        if out.numel() == 0 {
            return Ok(vec![zeros(b, out)]);
        }
        let x = &inputs[0];
        let m = self.sizes.len();
        let lead = m - x.ty.rank();
        let padded: Vec<usize> = (0..m)
            .map(|d| if d < lead { 1 } else { x.dims()[d - lead] })
            .collect();
        let xp = b.reshape(x, &padded);
        let wide: Vec<usize> = (0..m).flat_map(|d| [self.sizes[d], padded[d]]).collect();
        let map: Vec<i64> = (0..m as i64).map(|d| 2 * d + 1).collect();
        let w = b.broadcast_in_dim(&xp, &map, &wide);
        Ok(vec![b.reshape(&w, &out.shape)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The gradient seen as `[r0, s0, r1, s1, ..]` (repeats, sizes), summed over the repeats.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        input_grad(saved, grads, |g, x| {
            let m = self.sizes.len();
            let lead = m.saturating_sub(x.rank());
            let wide: Vec<usize> = (0..m)
                .flat_map(|d| {
                    let n = if d < lead { 1 } else { x.shape()[d - lead] };
                    [self.sizes[d], n]
                })
                .collect();
            let reps: Vec<i64> = (0..m as i64).map(|d| 2 * d).collect();
            let summed = crate::ops::reduce_sum_dims(&g.reshape(&wide[..])?, &reps, false)?;
            summed.reshape(x.shape())
        })
    }
}
