//! Ordering along dims: flip, roll, and sort/argsort/topk (stable; NaN sorts as the largest
//! value), each with its shape rule, CPU kernel, lowering and backward rule.

use tpu_tensor::shape::resolve_dim;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Element, Error, Result, Scalar, Tensor, with_element};

use super::MovementOps;
use super::args::{at_least_1d, numel};
use super::cpu::{as_1d, by_size, contiguous_elements, cpu_tables, identity_tables, out_raw};
use super::lower::{reverse, slice_dim, zeros};
use crate::autograd::Saved;
use crate::cpu::kernels::{Reader, cpu_context, par_row_blocks};
use crate::hlo::{Cmp, FnBuilder, TensorType, Value};
use crate::op::args::check_dtype_in;
use crate::op::{DTypeSet, Meta, OpDef, input_grad};

// ---- flip / roll --------------------------------------------------------------------------------

/// Resolves a list of dims, refusing repeats.
fn distinct_dims(op: &str, dims: &[i64], shape: &[usize]) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(dims.len());
    for &d in dims {
        let r = resolve_dim(op, d, shape)?;
        if out.contains(&r) {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "dim {r} appears more than once in {dims:?} (tensor shape {})",
                    fmt_shape(shape)
                ),
            ));
        }
        out.push(r);
    }
    Ok(out)
}

/// `torch.flip`: reverses the order of elements along `dims`.
#[derive(Clone, Debug)]
pub struct Flip {
    /// The dims to reverse (negative count from the end).
    pub dims: Vec<i64>,
}

impl OpDef for Flip {
    fn name(&self) -> &'static str {
        "flip"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        distinct_dims("flip", &self.dims, &inputs[0].shape)?;
        Ok(vec![inputs[0].clone()])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0];
        let dims = distinct_dims("flip", &self.dims, x.shape())?;
        let mut tabs = identity_tables(x);
        for &d in dims.iter().filter(|&&d| d < x.rank()) {
            tabs[d].reverse();
        }
        Ok(vec![cpu_tables(
            "flip",
            x,
            &tabs,
            Scalar::Int(0),
            &outputs[0],
        )?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], _outputs: &[Meta]) -> Result<Vec<Value>> {
        let x = &inputs[0];
        let dims: Vec<usize> = distinct_dims("flip", &self.dims, x.dims())?
            .into_iter()
            .filter(|&d| d < x.ty.rank() && x.dims()[d] > 1)
            .collect();
        if dims.is_empty() || x.ty.numel() == 0 {
            return Ok(vec![x.clone()]);
        }
        Ok(vec![reverse(b, x, &dims)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The gradient flipped back.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        input_grad(saved, grads, |g, _| g.flip(&self.dims))
    }
}

/// `torch.roll`: rotates elements along `dims` by `shifts` (element `i` moves to `i + shift`).
/// With no dims the tensor is rolled as if flattened, by its one shift.
#[derive(Clone, Debug)]
pub struct Roll {
    /// Shifts, one per dim.
    pub shifts: Vec<i64>,
    /// Dims (negative count from the end); empty rolls the flattened tensor.
    pub dims: Vec<i64>,
}

impl Roll {
    /// The total shift per dim of a tensor of `shape` (of the flattened tensor when `dims` is
    /// empty).
    fn plan(&self, shape: &[usize]) -> Result<Vec<i64>> {
        if self.dims.is_empty() {
            if self.shifts.len() != 1 {
                return Err(Error::invalid_argument(
                    "roll",
                    format!("without dims, expected one shift, got {:?}", self.shifts),
                ));
            }
            return Ok(vec![self.shifts[0]]);
        }
        if self.shifts.len() != self.dims.len() {
            return Err(Error::invalid_argument(
                "roll",
                format!(
                    "expected one shift per dim, got shifts {:?} and dims {:?}",
                    self.shifts, self.dims
                ),
            ));
        }
        if shape.is_empty() {
            return Err(Error::DimOutOfRange {
                op: "roll".into(),
                dim: self.dims[0],
                rank: 0,
                shape: vec![],
            });
        }
        let mut total = vec![0i64; shape.len()];
        for (&s, &d) in self.shifts.iter().zip(&self.dims) {
            let d = resolve_dim("roll", d, shape)?;
            total[d] = total[d].wrapping_add(s);
        }
        Ok(total)
    }
}

impl OpDef for Roll {
    fn name(&self) -> &'static str {
        "roll"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        self.plan(&inputs[0].shape)?;
        Ok(vec![inputs[0].clone()])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let out = &outputs[0];
        let x = if self.dims.is_empty() {
            inputs[0].reshape([inputs[0].numel()])?
        } else {
            inputs[0].clone()
        };
        let shifts = self.plan(x.shape())?;
        let mut tabs = identity_tables(&x);
        for ((t, &s), &n) in tabs.iter_mut().zip(&shifts).zip(x.shape()) {
            if n > 0 {
                t.rotate_right(s.rem_euclid(n as i64) as usize);
            }
        }
        let flat = Meta::new(x.shape(), out.dtype);
        let t = cpu_tables("roll", &x, &tabs, Scalar::Int(0), &flat)?;
        Ok(vec![t.reshape(&out.shape)?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let out = &outputs[0];
        if out.numel() == 0 {
            return Ok(vec![zeros(b, out)]);
        }
        let mut v = if self.dims.is_empty() {
            b.reshape(&inputs[0], &[out.numel()])
        } else {
            inputs[0].clone()
        };
        let shifts = self.plan(v.dims())?;
        for (d, &s) in shifts.iter().enumerate() {
            let n = v.dims()[d];
            let s = s.rem_euclid(n as i64) as usize;
            if s == 0 {
                continue;
            }
            let tail = slice_dim(b, &v, d, n - s, n);
            let head = slice_dim(b, &v, d, 0, n - s);
            v = b.concatenate(&[&tail, &head], d);
        }
        Ok(vec![b.reshape(&v, &out.shape)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The gradient rolled back by the opposite shifts.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        input_grad(saved, grads, |g, x| {
            let flat = [x.numel()];
            let shape = if self.dims.is_empty() {
                &flat[..]
            } else {
                x.shape()
            };
            // Negate each dim's total shift modulo its size: negating the raw shift could overflow.
            let back: Vec<i64> = self
                .plan(shape)?
                .iter()
                .zip(shape)
                .map(|(&s, &n)| match n as i64 {
                    0 => 0,
                    n => (n - s.rem_euclid(n)) % n,
                })
                .collect();
            let dims: Vec<i64> = if self.dims.is_empty() {
                vec![]
            } else {
                (0..shape.len() as i64).collect()
            };
            g.roll(&back, &dims)
        })
    }
}

// ---- sort / topk --------------------------------------------------------------------------------

/// `torch.sort` (stable), or `torch.topk` when `k` is given: outputs (values, i64 indices)
/// along `dim`. NaN sorts as the largest value; equal values keep their order.
#[derive(Clone, Debug)]
pub struct Sort {
    /// The dim sorted (negative counts from the end).
    pub dim: i64,
    /// Largest first.
    pub descending: bool,
    /// Keep only the first `k` of the sorted order (topk).
    pub k: Option<usize>,
}

/// A key whose integer order is the sort order: floats by value with NaN above everything and
/// -0.0 equal to 0.0, integers and bool by value.
fn sort_key<T: Element>(v: T) -> i64 {
    if !T::DTYPE.is_float() {
        return v.to_i64();
    }
    let f = v.to_f64();
    if f.is_nan() {
        return i64::MAX;
    }
    let bits = (if f == 0.0 { 0.0f64 } else { f }).to_bits() as i64;
    if bits < 0 { bits ^ i64::MAX } else { bits }
}

impl Sort {
    fn op_name(&self) -> &'static str {
        if self.k.is_some() { "topk" } else { "sort" }
    }

    /// The resolved dim, its size and the number of elements kept.
    fn plan(&self, x: &Meta) -> Result<(usize, usize, usize)> {
        let op = self.op_name();
        let d = resolve_dim(op, self.dim, &x.shape)?;
        let n = at_least_1d(&x.shape)[d];
        let k = self.k.unwrap_or(n);
        // A 0-dim tensor's output keeps its (empty) shape, so it holds its one element even
        // for k = 0, as PyTorch's topk returns it.
        let k = if x.shape.is_empty() { k.max(1) } else { k };
        if k > n {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "k = {k} is larger than dim {d} of size {n} (tensor shape {})",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        Ok((d, n, k))
    }
}

impl OpDef for Sort {
    fn name(&self) -> &'static str {
        self.op_name()
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = &inputs[0];
        if self.k.is_some() {
            check_dtype_in("topk", x, DTypeSet::NUMERIC)?;
        }
        let (d, _, k) = self.plan(x)?;
        let mut shape = x.shape.clone();
        if !shape.is_empty() {
            shape[d] = k;
        }
        Ok(vec![
            Meta::new(&shape, x.dtype),
            Meta::new(&shape, DType::I64),
        ])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        // Planned on the input as given: a 0-dim one keeps its element whatever `k`.
        let (d, n, k) = self.plan(&Meta::of(inputs[0]))?;
        let x = as_1d(inputs[0])?;
        let x = x.contiguous()?;
        let (dev, device) = cpu_context(self.op_name(), &x)?;
        let outer = numel(&x.shape()[..d]);
        let inner = numel(&x.shape()[d + 1..]);
        let r = Reader::new(&[&x]);
        let keys: Vec<i64> = with_element!(x.dtype(), T, {
            contiguous_elements::<T>(&r, &x)?
                .iter()
                .map(|&v| sort_key(v))
                .collect()
        });
        let mut perm = vec![0i64; outer * k * inner];
        let descending = self.descending;
        par_row_blocks(&dev, &mut perm, k * inner, |first, chunk| {
            let mut order: Vec<usize> = Vec::with_capacity(n);
            for (b, blk) in chunk.chunks_mut(k * inner).enumerate() {
                let base = (first + b) * n * inner;
                for i in 0..inner {
                    let key = |j: usize| keys[base + j * inner + i];
                    order.clear();
                    order.extend(0..n);
                    if descending {
                        order.sort_by_key(|&j| std::cmp::Reverse(key(j)));
                    } else {
                        order.sort_by_key(|&j| key(j));
                    }
                    for (j, &s) in order[..k].iter().enumerate() {
                        blk[j * inner + i] = s as i64;
                    }
                }
            }
        })?;
        let values = by_size!(x.dtype(), C, {
            let src = contiguous_elements::<C>(&r, &x)?;
            let perm = &perm;
            out_raw::<C>(&outputs[0], &device, |o| {
                par_row_blocks(&dev, o, k * inner, |first, chunk| {
                    for (b, blk) in chunk.chunks_mut(k * inner).enumerate() {
                        let ob = first + b;
                        let base = ob * n * inner;
                        let pb = ob * k * inner;
                        for (p, v) in blk.iter_mut().enumerate() {
                            let i = p % inner;
                            *v = src[base + perm[pb + p] as usize * inner + i];
                        }
                    }
                })
            })?
        });
        let indices = Tensor::from_vec(perm, &outputs[1].shape[..], &device)?;
        Ok(vec![values, indices])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        if outputs[0].numel() == 0 {
            return Ok(vec![zeros(b, &outputs[0]), zeros(b, &outputs[1])]);
        }
        let (d, _, k) = self.plan(&Meta::new(inputs[0].dims(), inputs[0].dtype()))?;
        let x = b.reshape(&inputs[0], &at_least_1d(inputs[0].dims()));
        let dtype = x.dtype();
        let xv = if dtype == DType::Bool {
            b.convert(&x, DType::U8)
        } else {
            x.clone()
        };
        let idx = b.iota(x.dims(), d, DType::I64);
        let st = TensorType::scalar(xv.dtype());
        let it = TensorType::scalar(DType::I64);
        let float = xv.dtype().is_float();
        let descending = self.descending;
        let region = b.region(&[st.clone(), st, it.clone(), it], 1, |b, a| {
            let (l, r) = (&a[0], &a[1]);
            let dir = if descending { Cmp::Gt } else { Cmp::Lt };
            let ordered = b.compare(dir, l, r);
            if !float {
                return vec![ordered];
            }
            // NaN is the largest value: it goes before numbers when descending, after them
            // when ascending.
            let l_nan = b.compare(Cmp::Ne, l, l);
            let r_nan = b.compare(Cmp::Ne, r, r);
            let nan_first = if descending {
                let r_num = b.ew("stablehlo.not", &[&r_nan]);
                b.ew("stablehlo.and", &[&l_nan, &r_num])
            } else {
                let l_num = b.ew("stablehlo.not", &[&l_nan]);
                b.ew("stablehlo.and", &[&l_num, &r_nan])
            };
            vec![b.ew("stablehlo.or", &[&nan_first, &ordered])]
        });
        let attrs = format!("dimension = {d} : i64, is_stable = true");
        let mut outs = b.op_n(
            "stablehlo.sort",
            &[&xv, &idx],
            &attrs,
            &region,
            &[xv.ty.clone(), idx.ty.clone()],
        );
        let (mut vals, mut ids) = (outs.remove(0), outs.remove(0));
        if k < x.dims()[d] {
            vals = slice_dim(b, &vals, d, 0, k);
            ids = slice_dim(b, &ids, d, 0, k);
        }
        let vals = b.convert(&vals, dtype);
        Ok(vec![
            b.reshape(&vals, &outputs[0].shape),
            b.reshape(&ids, &outputs[1].shape),
        ])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The values' gradient written back where the values came from; the indices get none.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        input_grad(saved, grads, |g, x| {
            let indices = saved.output(1)?;
            let z = Tensor::zeros(x.shape(), g.dtype(), g.device())?;
            z.scatter(self.dim, indices, g)
        })
    }
}
