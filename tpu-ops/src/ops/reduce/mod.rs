//! Reductions (sum, mean, prod, amax/amin, max/min with indices, argmax/argmin, var/std,
//! logsumexp, norm, all/any) and scans (cumsum, cumprod), with PyTorch's dtype rules.
//!
//! The CPU kernels first bring the input to the dtype they compute in (i64 for integers and
//! bool, f32 for the 16-bit floats, so half types accumulate in f32 and round once) and lay the
//! reduction out as `[outer, reduced, inner]` over one dense block, in the input's own memory
//! order when it is dense in some order, so a permuted view needs no copy. Rows (`inner == 1`)
//! fold in eight independent lanes over cascaded blocks: the lanes vectorise and the cascade
//! keeps float error growing with the log of the length. Columns (`inner > 1`) fold whole input
//! rows into a vector of accumulators. Work is split over rows, column blocks and, when there are
//! few long reductions, pieces of the reduced extent, on the device's pool above
//! [`PAR_THRESHOLD`].

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;
use tpu_tensor::shape::resolve_dim_in;
use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Device, Element, Error, Generator, Result, Tensor, bf16, f16};

use crate::autograd::Saved;
use crate::cpu::kernels::{PAR_THRESHOLD, Reader, cpu_device, par_chunks};
use crate::cpu::simd::reduce::{
    self as simd, Acc, ArgAcc, ExpDeviation, FloatAcc, Load, Magnitude, NonZero, PowMagnitude,
    RedOp, Square, SquaredDeviation, Truthy,
};
use crate::hlo::{Cmp, FnBuilder, TensorType, Value, i64_array};
use crate::op::promote::{compute_dtype, float_result};
use crate::op::{DTypeSet, Meta, OpDef, OpInfo};

// ---- shape and dtype rules -------------------------------------------------------------------

/// Which dims of `shape` a reduction over `dims` covers; empty `dims` means every dim.
fn reduce_mask(op: &str, dims: &[i64], shape: &[usize]) -> Result<Vec<bool>> {
    let rank = shape.len();
    let mut mask = vec![dims.is_empty(); rank];
    // A 0-dim tensor accepts dim 0 and -1 (both name its one implicit dim), as in PyTorch.
    let mut seen = vec![false; rank.max(1)];
    for &d in dims {
        let r = resolve_dim_in(op, d, rank, shape)?;
        if std::mem::replace(&mut seen[r], true) {
            return Err(Error::shape(
                op,
                format!(
                    "dim {r} appears more than once in dims {dims:?} (tensor of shape {})",
                    fmt_shape(shape)
                ),
            ));
        }
        if rank > 0 {
            mask[r] = true;
        }
    }
    Ok(mask)
}

/// The mask of a reduction over one optional dim (`None`: every dim).
fn single_mask(op: &str, dim: Option<i64>, shape: &[usize]) -> Result<Vec<bool>> {
    match dim {
        None => Ok(vec![true; shape.len()]),
        Some(d) => reduce_mask(op, &[d], shape),
    }
}

fn reduced_shape(shape: &[usize], mask: &[bool], keepdim: bool) -> Vec<usize> {
    shape
        .iter()
        .zip(mask)
        .filter_map(|(&s, &m)| match (m, keepdim) {
            (false, _) => Some(s),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

fn reduced_count(shape: &[usize], mask: &[bool]) -> usize {
    shape
        .iter()
        .zip(mask)
        .filter(|(_, m)| **m)
        .map(|(s, _)| *s)
        .product()
}

/// Refuses a reduction that has no identity (max, the inf norm, ...) over an empty extent.
fn check_nonempty(op: &str, shape: &[usize], mask: &[bool]) -> Result<()> {
    if let Some(d) = (0..shape.len()).find(|&d| mask[d] && shape[d] == 0) {
        return Err(Error::shape(
            op,
            format!(
                "cannot reduce over dim {d} of size 0 of a tensor of shape {}: {op} has no \
                 identity for an empty reduction",
                fmt_shape(shape)
            ),
        ));
    }
    Ok(())
}

fn check_dtype(op: &str, m: &Meta, supported: DTypeSet) -> Result<()> {
    if supported.contains(m.dtype) {
        return Ok(());
    }
    Err(Error::UnsupportedDType {
        op: op.into(),
        given: format!("{} (input of shape {})", m.dtype, fmt_shape(&m.shape)),
        supported: supported.to_string(),
    })
}

fn one_input<'a>(op: &str, inputs: &'a [Meta]) -> Result<&'a Meta> {
    match inputs {
        [m] => Ok(m),
        _ => Err(Error::invalid_argument(
            op,
            format!("expected one input tensor, got {}", inputs.len()),
        )),
    }
}

fn internal(op: &str, what: &str) -> Error {
    Error::internal(op, format!("{what}"))
}

/// PyTorch's result dtype of sum, prod, cumsum and cumprod: integers and bool widen to i64.
fn sum_dtype(d: DType) -> DType {
    if d.is_float() { d } else { DType::I64 }
}

/// The dtype kernels compute in when the op keeps or widens its input's dtype: i64 for integers
/// and bool, f32 for the 16-bit floats.
fn wide(d: DType) -> DType {
    if d.is_float() {
        compute_dtype(d)
    } else {
        DType::I64
    }
}

// ---- the ops ---------------------------------------------------------------------------------

/// The reductions that produce one value per output element.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReduceKind {
    /// Sum (integers and bool give i64).
    Sum,
    /// Product (integers and bool give i64).
    Prod,
    /// Arithmetic mean (floats only).
    Mean,
    /// Maximum, NaN propagating.
    Amax,
    /// Minimum, NaN propagating.
    Amin,
    /// True when every element is non-zero.
    All,
    /// True when some element is non-zero.
    Any,
    /// Variance with divisor `max(0, n - correction)` (floats only).
    Var {
        /// Subtracted from the element count in the divisor (1 is Bessel's correction).
        correction: f64,
    },
    /// Standard deviation, the square root of [`ReduceKind::Var`].
    Std {
        /// Subtracted from the element count in the divisor.
        correction: f64,
    },
    /// `log(sum(exp(x)))`, computed around the maximum (integers and bool give f32).
    LogSumExp,
    /// The vector p-norm (floats only): `p = 0` counts non-zeros, `p = ±inf` is the max/min of
    /// `|x|`.
    Norm {
        /// The order.
        p: f64,
    },
}

impl ReduceKind {
    /// The op's name (PyTorch's).
    pub fn name(self) -> &'static str {
        use ReduceKind::*;
        match self {
            Sum => "sum",
            Prod => "prod",
            Mean => "mean",
            Amax => "amax",
            Amin => "amin",
            All => "all",
            Any => "any",
            Var { .. } => "var",
            Std { .. } => "std",
            LogSumExp => "logsumexp",
            Norm { .. } => "norm",
        }
    }

    /// Input dtypes the op accepts.
    pub fn dtypes(self) -> DTypeSet {
        use ReduceKind::*;
        match self {
            Sum | Prod | Amax | Amin | All | Any | LogSumExp => DTypeSet::ALL,
            Mean | Var { .. } | Std { .. } | Norm { .. } => DTypeSet::FLOAT,
        }
    }

    fn out_dtype(self, d: DType) -> DType {
        use ReduceKind::*;
        match self {
            Sum | Prod => sum_dtype(d),
            All | Any => DType::Bool,
            LogSumExp => float_result(d),
            _ => d,
        }
    }

    fn compute(self, d: DType) -> DType {
        use ReduceKind::*;
        match self {
            Sum | Prod | Amax | Amin => wide(d),
            All | Any => DType::Bool,
            _ => compute_dtype(float_result(d)),
        }
    }

    /// True when the reduction has a backward rule: all and any give bools, which carry no
    /// gradient.
    pub fn differentiable(self) -> bool {
        !matches!(self, ReduceKind::All | ReduceKind::Any)
    }

    /// Reductions without an identity refuse empty extents.
    fn needs_elements(self) -> bool {
        match self {
            ReduceKind::Amax | ReduceKind::Amin => true,
            ReduceKind::Norm { p } => p == f64::INFINITY || p < 0.0,
            _ => false,
        }
    }

    /// The result of reducing zero elements.
    fn empty_value(self) -> f64 {
        use ReduceKind::*;
        match self {
            Prod | All => 1.0,
            Mean | Var { .. } | Std { .. } => f64::NAN,
            LogSumExp => f64::NEG_INFINITY,
            _ => 0.0,
        }
    }
}

/// A reduction over `dims` (empty: every dim), keeping them as size 1 when `keepdim`.
#[derive(Clone, Debug)]
pub struct Reduce {
    /// Which reduction.
    pub kind: ReduceKind,
    /// The dims; negative values count from the end.
    pub dims: Vec<i64>,
    /// Keep the reduced dims as size 1.
    pub keepdim: bool,
}

/// Max or min along one dim (or over the flattened tensor when `dim` is `None`) with the index
/// of the first extreme element; NaN counts as the extreme. Outputs (values, indices) when
/// `with_values`, else the indices alone (argmax, argmin).
#[derive(Clone, Debug)]
pub struct ArgReduce {
    /// Max (true) or min (false).
    pub max: bool,
    /// The dim; `None` flattens the tensor.
    pub dim: Option<i64>,
    /// Keep the reduced dims as size 1.
    pub keepdim: bool,
    /// Also output the values.
    pub with_values: bool,
}

/// `x.max()` or `x.min()`: the amax or amin of every element, whose gradient differs from
/// amax's as PyTorch's does. It is split among the elements equal to the result (the NaN
/// ones when the result is NaN) and placed by selection, so a NaN or infinite output gradient
/// reaches only them, where amax multiplies the gradient by a 0/1 mask.
#[derive(Clone, Debug)]
pub struct ExtremeAll {
    /// Max (true) or min (false).
    pub max: bool,
}

/// Cumulative sum (`prod == false`) or product along `dim`; integers and bool give i64.
#[derive(Clone, Debug)]
pub struct Scan {
    /// Product instead of sum.
    pub prod: bool,
    /// The dim; negative values count from the end.
    pub dim: i64,
}

impl ArgReduce {
    fn dtypes(&self) -> DTypeSet {
        // PyTorch's max/min accept bool; argmax/argmin do not.
        if self.with_values {
            DTypeSet::ALL
        } else {
            DTypeSet::NUMERIC
        }
    }
}

impl OpDef for Reduce {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn attrs(&self) -> String {
        format!("{:?}|{:?}|{}", self.kind, self.dims, self.keepdim)
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let name = self.name();
        let x = one_input(name, inputs)?;
        check_dtype(name, x, self.kind.dtypes())?;
        let mask = reduce_mask(name, &self.dims, &x.shape)?;
        if self.kind.needs_elements() {
            check_nonempty(name, &x.shape, &mask)?;
        }
        Ok(vec![Meta::new(
            &reduced_shape(&x.shape, &mask, self.keepdim),
            self.kind.out_dtype(x.dtype),
        )])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let name = self.name();
        let (x, out) = match (inputs, outputs) {
            ([x], [out]) => (*x, out),
            _ => return Err(internal(name, "expected one input and one output")),
        };
        let dev = cpu_device(name, x)?;
        let mask = reduce_mask(name, &self.dims, x.shape())?;
        if x.numel() == 0 {
            let device = Device::from_cpu(dev);
            return Ok(vec![Tensor::full(
                &out.shape[..],
                self.kind.empty_value(),
                out.dtype,
                &device,
            )?]);
        }
        let n = reduced_count(x.shape(), &mask);
        let k = self.kind;
        let t = match k {
            // Read the stored type directly (16-bit floats widen to f32 and integers to i64 in
            // the loop, with no converted copy).
            ReduceKind::Sum
            | ReduceKind::Mean
            | ReduceKind::Prod
            | ReduceKind::Amax
            | ReduceKind::Amin => {
                let plan = Plan::new(x, &mask, false)?;
                let r = Reader::new(&[&plan.x]);
                macro_rules! go {
                    ($x:ty, $a:ty) => {
                        basic_reduce::<$x, $a>(k, &dev, &plan, block(&r, &plan.x)?, n, &out.shape)?
                    };
                }
                match x.dtype() {
                    DType::F32 => f32_reduce(k, &dev, &plan, block(&r, &plan.x)?, n, &out.shape)?,
                    DType::BF16 => go!(bf16, f32),
                    DType::F16 => go!(f16, f32),
                    DType::F64 => go!(f64, f64),
                    DType::I64 => go!(i64, i64),
                    DType::I32 => go!(i32, i64),
                    DType::I8 => go!(i8, i64),
                    DType::U8 => go!(u8, i64),
                    DType::Bool => go!(bool, i64),
                }
            }
            ReduceKind::All | ReduceKind::Any => {
                let plan = Plan::new(x, &mask, false)?;
                let r = Reader::new(&[&plan.x]);
                macro_rules! go {
                    ($x:ty) => {
                        logic_reduce::<$x>(k, &dev, &plan, block(&r, &plan.x)?, &out.shape)?
                    };
                }
                match x.dtype() {
                    DType::F32 => go!(f32),
                    DType::BF16 => go!(bf16),
                    DType::F16 => go!(f16),
                    DType::F64 => go!(f64),
                    DType::I64 => go!(i64),
                    DType::I32 => go!(i32),
                    DType::I8 => go!(i8),
                    DType::U8 => go!(u8),
                    DType::Bool => go!(bool),
                }
            }
            _ => {
                let xc = x.to_dtype(k.compute(x.dtype()))?;
                let plan = Plan::new(&xc, &mask, false)?;
                let r = Reader::new(&[&plan.x]);
                match xc.dtype() {
                    DType::F32 => {
                        float_reduce::<f32>(k, &dev, &plan, block(&r, &plan.x)?, n, &out.shape)?
                    }
                    DType::F64 => {
                        float_reduce::<f64>(k, &dev, &plan, block(&r, &plan.x)?, n, &out.shape)?
                    }
                    d => return Err(internal(name, &format!("no kernel computing in {d}"))),
                }
            }
        };
        Ok(vec![t.to_dtype(out.dtype)?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let (x, out) = match (inputs, outputs) {
            ([x], [out]) => (x, out),
            _ => return Err(internal(self.name(), "expected one input and one output")),
        };
        let mask = reduce_mask(self.name(), &self.dims, x.dims())?;
        Ok(vec![lower_reduce(self.kind, b, x, &mask, out)])
    }

    fn has_backward(&self) -> bool {
        self.kind.differentiable()
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let (Some(Some(g)), [x], [y]) = (grads.first(), &saved.inputs[..], &saved.outputs[..])
        else {
            return Ok(vec![None; saved.inputs.len()]);
        };
        let mask = reduce_mask(self.name(), &self.dims, x.shape())?;
        Ok(vec![rules::reduce_backward(self.kind, x, y, g, &mask)?])
    }
}

impl OpDef for ArgReduce {
    fn name(&self) -> &'static str {
        match (self.max, self.with_values) {
            (true, true) => "max",
            (false, true) => "min",
            (true, false) => "argmax",
            (false, false) => "argmin",
        }
    }

    fn attrs(&self) -> String {
        format!("{:?}|{}", self.dim, self.keepdim)
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let name = self.name();
        let x = one_input(name, inputs)?;
        check_dtype(name, x, self.dtypes())?;
        let mask = single_mask(name, self.dim, &x.shape)?;
        check_nonempty(name, &x.shape, &mask)?;
        let shape = reduced_shape(&x.shape, &mask, self.keepdim);
        let indices = Meta::new(&shape, DType::I64);
        Ok(if self.with_values {
            vec![Meta::new(&shape, x.dtype), indices]
        } else {
            vec![indices]
        })
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let name = self.name();
        let x = match inputs {
            [x] => *x,
            _ => return Err(internal(name, "expected one input")),
        };
        let dev = cpu_device(name, x)?;
        let device = Device::from_cpu(dev.clone());
        if x.numel() == 0 {
            // The shape rule refused empty reductions, so the outputs are empty too.
            return outputs
                .iter()
                .map(|m| Tensor::zeros(&m.shape[..], m.dtype, &device))
                .collect();
        }
        let mask = single_mask(name, self.dim, x.shape())?;
        let shape = reduced_shape(x.shape(), &mask, self.keepdim);
        // The flattened index of argmax(dim=None) is in logical order, not memory order.
        let plan = Plan::new(x, &mask, self.dim.is_none())?;
        let r = Reader::new(&[&plan.x]);
        macro_rules! go {
            ($x:ty, $a:ty) => {
                arg_kernel::<$x, $a>(self.max, &dev, &plan, block(&r, &plan.x)?, &shape)?
            };
        }
        // 16-bit floats compare as f32, integers and bool as i64 (exact either way).
        let (values, indices) = match x.dtype() {
            DType::F32 => go!(f32, f32),
            DType::BF16 => go!(bf16, f32),
            DType::F16 => go!(f16, f32),
            DType::F64 => go!(f64, f64),
            DType::I64 => go!(i64, i64),
            DType::I32 => go!(i32, i64),
            DType::I8 => go!(i8, i64),
            DType::U8 => go!(u8, i64),
            DType::Bool => go!(bool, i64),
        };
        Ok(if self.with_values {
            vec![values.to_dtype(x.dtype())?, indices]
        } else {
            vec![indices]
        })
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let x = match inputs {
            [x] => x,
            _ => return Err(internal(self.name(), "expected one input")),
        };
        let in_dtype = x.dtype();
        let xc = b.convert(x, wide(in_dtype));
        let (xc, dim) = match self.dim {
            None => {
                let numel = xc.ty.numel();
                (b.reshape(&xc, &[numel]), 0)
            }
            Some(_) if xc.ty.rank() == 0 => (b.reshape(&xc, &[1]), 0),
            Some(d) => (
                xc.clone(),
                resolve_dim_in(self.name(), d, x.ty.rank(), x.dims())?,
            ),
        };
        let (v, i) = lower_arg(b, &xc, dim, self.max);
        let shape = &outputs
            .last()
            .ok_or_else(|| internal(self.name(), "expected outputs"))?
            .shape;
        let i = b.reshape(&i, shape);
        Ok(if self.with_values {
            let v = b.reshape(&v, shape);
            vec![b.convert(&v, in_dtype), i]
        } else {
            vec![i]
        })
    }

    /// max/min with values route the gradient to the returned index; argmax/argmin output only
    /// integers and have none.
    fn has_backward(&self) -> bool {
        self.with_values
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let (true, Some(Some(g)), [x], [_, idx]) = (
            self.with_values,
            grads.first(),
            &saved.inputs[..],
            &saved.outputs[..],
        ) else {
            return Ok(vec![None; saved.inputs.len()]);
        };
        Ok(vec![Some(rules::arg_backward(self.dim, x, idx, g)?)])
    }
}

impl ExtremeAll {
    /// The same values: amax or amin over every dim.
    fn reduce(&self) -> Reduce {
        Reduce {
            kind: if self.max {
                ReduceKind::Amax
            } else {
                ReduceKind::Amin
            },
            dims: Vec::new(),
            keepdim: false,
        }
    }
}

impl OpDef for ExtremeAll {
    fn name(&self) -> &'static str {
        if self.max { "max" } else { "min" }
    }

    fn attrs(&self) -> String {
        "all".into()
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        self.reduce().infer(inputs)
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        self.reduce().cpu(inputs, outputs)
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        self.reduce().lower(b, inputs, outputs)
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let (Some(Some(g)), [x], [y]) = (grads.first(), &saved.inputs[..], &saved.outputs[..])
        else {
            return Ok(vec![None; saved.inputs.len()]);
        };
        Ok(vec![Some(rules::extreme_all_backward(x, y, g)?)])
    }
}

impl OpDef for Scan {
    fn name(&self) -> &'static str {
        if self.prod { "cumprod" } else { "cumsum" }
    }

    fn attrs(&self) -> String {
        self.dim.to_string()
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = one_input(self.name(), inputs)?;
        resolve_dim_in(self.name(), self.dim, x.rank(), &x.shape)?;
        Ok(vec![Meta::new(&x.shape, sum_dtype(x.dtype))])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let name = self.name();
        let (x, out) = match (inputs, outputs) {
            ([x], [out]) => (*x, out),
            _ => return Err(internal(name, "expected one input and one output")),
        };
        let dev = cpu_device(name, x)?;
        let device = Device::from_cpu(dev.clone());
        if x.numel() == 0 {
            return Ok(vec![Tensor::zeros(&out.shape[..], out.dtype, &device)?]);
        }
        let d = resolve_dim_in(name, self.dim, x.rank(), x.shape())?;
        let shape = x.shape();
        let (outer, n, inner) = if shape.is_empty() {
            (1, 1, 1)
        } else {
            (
                shape[..d].iter().product(),
                shape[d],
                shape[d + 1..].iter().product(),
            )
        };
        let geo = (outer, n, inner);
        let xc = x.to_dtype(wide(x.dtype()))?.contiguous()?;
        let r = Reader::new(&[&xc]);
        let prod = self.prod;
        // One instantiation per (type, step): the step must inline for the column loop to
        // vectorise.
        macro_rules! go {
            ($x:ty, $to:expr, $back:expr, $mul:expr, $add:expr) => {{
                let src = block::<$x>(&r, &xc)?;
                if prod {
                    scan_tensor(&dev, src, geo, shape, prod, $to, $back, $mul)?
                } else {
                    scan_tensor(&dev, src, geo, shape, prod, $to, $back, $add)?
                }
            }};
        }
        let t = match (x.dtype(), xc.dtype()) {
            // f32 accumulates in f64, as PyTorch's CPU scans do; the 16-bit floats in f32.
            (DType::F32, _) => go!(
                f32,
                |v: f32| v as f64,
                |a: f64| a as f32,
                |a: f64, b: f64| a * b,
                |a: f64, b: f64| a + b
            ),
            (_, DType::F32) => go!(
                f32,
                |v: f32| v,
                |a: f32| a,
                |a: f32, b: f32| a * b,
                |a: f32, b: f32| a + b
            ),
            (_, DType::F64) => go!(
                f64,
                |v: f64| v,
                |a: f64| a,
                |a: f64, b: f64| a * b,
                |a: f64, b: f64| a + b
            ),
            (_, DType::I64) => go!(
                i64,
                |v: i64| v,
                |a: i64| a,
                |a: i64, b: i64| a.wrapping_mul(b),
                |a: i64, b: i64| a.wrapping_add(b)
            ),
            (_, c) => return Err(internal(name, &format!("no kernel computing in {c}"))),
        };
        Ok(vec![t.to_dtype(out.dtype)?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let (x, out) = match (inputs, outputs) {
            ([x], [out]) => (x, out),
            _ => return Err(internal(self.name(), "expected one input and one output")),
        };
        if out.numel() == 0 {
            return Ok(vec![b.splat(out.ty(), 0)]);
        }
        let d = resolve_dim_in(self.name(), self.dim, x.ty.rank(), x.dims())?;
        let x = if x.ty.rank() == 0 {
            b.reshape(x, &[1])
        } else {
            x.clone()
        };
        let ct = wide(x.dtype());
        let xc = b.convert(&x, ct);
        // A reduce_window whose window spans the whole dim, padded in front: XLA's TPU compiler
        // turns this pattern into an efficient scan; the CPU backend evaluates it in O(n^2).
        let n = xc.dims()[d];
        let rank = xc.ty.rank();
        let window: Vec<i64> = (0..rank)
            .map(|i| if i == d { n as i64 } else { 1 })
            .collect();
        let padding: Vec<String> = (0..rank)
            .map(|i| {
                if i == d {
                    format!("[{}, 0]", n - 1)
                } else {
                    "[0, 0]".to_string()
                }
            })
            .collect();
        let attrs = format!(
            "window_dimensions = {}, padding = dense<[{}]> : tensor<{rank}x2xi64>",
            i64_array(&window),
            padding.join(", ")
        );
        let init = b.scalar(ct, if self.prod { 1 } else { 0 });
        let step = if self.prod {
            "stablehlo.multiply"
        } else {
            "stablehlo.add"
        };
        let region = b.region(&[TensorType::scalar(ct)], 2, |b, a| {
            vec![b.ew(step, &[&a[0], &a[1]])]
        });
        let ty = xc.ty.clone();
        let s = b
            .op_n(
                "stablehlo.reduce_window",
                &[&xc, &init],
                &attrs,
                &region,
                &[ty],
            )
            .remove(0);
        let s = b.reshape(&s, &out.shape);
        Ok(vec![b.convert(&s, out.dtype)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let (Some(Some(g)), [x], [y]) = (grads.first(), &saved.inputs[..], &saved.outputs[..])
        else {
            return Ok(vec![None; saved.inputs.len()]);
        };
        Ok(vec![Some(rules::scan_backward(self, x, y, g)?)])
    }
}

/// Runs a reduction.
pub fn reduce(x: &Tensor, kind: ReduceKind, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    crate::exec::dispatch::run1(
        &Reduce {
            kind,
            dims: dims.to_vec(),
            keepdim,
        },
        &[x],
    )
}

fn extreme_dim(x: &Tensor, max: bool, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
    let op = ArgReduce {
        max,
        dim: Some(dim),
        keepdim,
        with_values: true,
    };
    let mut out = crate::exec::dispatch::run(&op, &[x])?.into_iter();
    match (out.next(), out.next()) {
        (Some(v), Some(i)) => Ok((v, i)),
        _ => Err(internal(op.name(), "expected values and indices")),
    }
}

fn arg(x: &Tensor, max: bool, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
    crate::exec::dispatch::run1(
        &ArgReduce {
            max,
            dim,
            keepdim,
            with_values: false,
        },
        &[x],
    )
}

fn scan(x: &Tensor, prod: bool, dim: i64) -> Result<Tensor> {
    crate::exec::dispatch::run1(&Scan { prod, dim }, &[x])
}

// ---- backward rules --------------------------------------------------------------------------
//
// PyTorch's formulas, written with ops so they run on the device the forward ran on. `g` is the
// gradient of the output; each rule first views it (and the saved output) with the reduced dims
// kept as size 1, so it broadcasts against the input. They live in their own module because the
// kernels' `std::ops` imports would make `tensor.mul(..)` ambiguous here.
mod rules {
    use tpu_tensor::shape::resolve_dim_in;
    use tpu_tensor::{Result, Tensor};

    use super::{ReduceKind, Scan, reduced_count, reduced_shape};
    use crate::op::OpDef;
    use crate::ops::movement::MovementOps;
    use crate::ops::reduce::ReduceOps;
    use crate::{TensorOps, where_};

    /// The dims `mask` marks, as the `dims` argument of a reduction. For a 0-dim input the mask is
    /// empty, which reduces "every dim" of a one-element tensor: the identity, as wanted.
    fn mask_dims(mask: &[bool]) -> Vec<i64> {
        (0..mask.len())
            .filter(|&d| mask[d])
            .map(|d| d as i64)
            .collect()
    }

    /// `t` (the shape of a reduction's output, with or without keepdim) viewed with the reduced
    /// dims kept as size 1.
    fn keep_reduced(t: &Tensor, shape: &[usize], mask: &[bool]) -> Result<Tensor> {
        t.reshape(reduced_shape(shape, mask, true))
    }

    /// `t` broadcast to `shape` and copied: the gradient a leaf accumulates must own its storage,
    /// since optimizers update gradients in place and a stride-0 view would write one element
    /// many times.
    fn expand_dense(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
        t.broadcast_to(shape)?.contiguous()
    }

    /// `where(cond, 0, v)`: PyTorch's `masked_fill(cond, 0)`.
    fn zero_where(cond: &Tensor, v: &Tensor) -> Result<Tensor> {
        where_(cond, &v.zeros_like()?, v)
    }

    /// `g / count(hit) * hit` over the reduced dims: the gradient of a max or min split evenly
    /// among the elements that attain it, as PyTorch's amax, amin and inf-norm do.
    fn split_among(g: &Tensor, hit: &Tensor, dims: &[i64]) -> Result<Tensor> {
        let count = hit.sum(dims, true)?;
        g.div(&count)?.mul(hit)
    }

    /// The gradient of a `Reduce` of `x` (output `y`, output gradient `g`) over the dims `mask`
    /// marks; `None` where PyTorch gives none (the 0-norm).
    pub(super) fn reduce_backward(
        kind: ReduceKind,
        x: &Tensor,
        y: &Tensor,
        g: &Tensor,
        mask: &[bool],
    ) -> Result<Option<Tensor>> {
        use ReduceKind::*;
        let shape = x.shape();
        let dims = mask_dims(mask);
        let n = reduced_count(shape, mask) as f64;
        let x = &x.to(g.dtype())?;
        let gk = &keep_reduced(g, shape, mask)?;
        let yk = &keep_reduced(&y.to(g.dtype())?, shape, mask)?;
        let grad = match kind {
            Sum => expand_dense(gk, shape)?,
            Mean => expand_dense(&gk.div(n)?, shape)?,
            Prod => {
                // y / x fails where x is 0. With one zero in a group the zero's gradient is the
                // product of the others and the rest get 0; with two or more, every element gets 0
                // (each partial product still holds a zero). Counting zeros per group covers all
                // three cases without reading anything back to the host.
                let zero = x.eq(0.0)?;
                let zeros_in_group = zero.sum(&dims, true)?;
                let safe = where_(&zero, &x.ones_like()?, x)?;
                let others = safe.prod(&dims, true)?;
                let no_zero = zeros_in_group.eq(0)?;
                let lone_zero = zeros_in_group.eq(1)?.logical_and(&zero)?;
                let at_zero = where_(&lone_zero, &others, &x.zeros_like()?)?;
                let d = where_(&no_zero, &others.div(&safe)?, &at_zero)?;
                gk.mul(&d)?
            }
            Amax | Amin => split_among(gk, &x.eq(yk)?, &dims)?,
            Var { correction } | Std { correction } => {
                // d var / dx = 2 (x - mean) / (n - correction). PyTorch divides by
                // n - correction itself here even where the forward clamps it at 0
                // (n <= correction), so a negative divisor gives finite gradients of an infinite
                // variance; we follow it.
                let gv = if matches!(kind, Std { .. }) {
                    // d std = d var / (2 std), taken as 0 where std is 0.
                    zero_where(&yk.eq(0.0)?, &gk.div(&yk.mul(2.0)?)?)?
                } else {
                    gk.clone()
                };
                let centered = x.sub(&x.mean(&dims, true)?)?;
                gv.mul(&centered)?.mul(2.0 / (n - correction))?
            }
            // exp(x - y) is softmax(x): 0 at -inf elements; NaN where y is infinite, as PyTorch.
            LogSumExp => gk.mul(&x.sub(yk)?.exp()?)?,
            Norm { p } => {
                if p == 0.0 {
                    // Counting non-zeros is piecewise constant; PyTorch leaves no gradient.
                    return Ok(None);
                }
                norm_backward(p, x, yk, gk, &dims)?
            }
            All | Any => return Ok(None),
        };
        Ok(Some(grad))
    }

    /// The gradient of the vector `p`-norm (`p != 0`) of `x`, `yk` the norm and `gk` its gradient
    /// with the reduced dims kept.
    fn norm_backward(p: f64, x: &Tensor, yk: &Tensor, gk: &Tensor, dims: &[i64]) -> Result<Tensor> {
        let sign = x.sign()?;
        if p == 1.0 {
            return gk.mul(&sign);
        }
        if p == 2.0 {
            // x / |x|, with gradient 0 at a zero norm (the subgradient PyTorch picks).
            return gk.mul(&zero_where(&yk.eq(0.0)?, &x.div(yk)?)?);
        }
        let a = x.abs()?;
        if p.is_infinite() {
            // The max (or min) of |x|: split among the elements that attain it; NaN elements
            // count as attaining it, as PyTorch.
            let hit = a.eq(yk)?.logical_or(&a.isnan()?)?;
            return sign.mul(&split_among(gk, &hit, dims)?);
        }
        // d/dx_i (sum |x|^p)^(1/p) = sign(x_i) |x_i|^(p-1) / norm^(p-1).
        if p < 1.0 {
            // |x|^(p-1) is infinite at 0; PyTorch takes 0 there, and multiplies by norm^(1-p)
            // rather than dividing by norm^(p-1), so a zero norm gives 0 instead of NaN.
            let scaled = zero_where(&x.eq(0.0)?, &sign.mul(&a.pow_scalar(p - 1.0)?)?)?;
            return scaled.mul(gk)?.mul(&yk.pow_scalar(1.0 - p)?);
        }
        // 1 < p: the gradient is 0 where the norm is 0 (every element of the group is 0).
        let scaled = if p < 2.0 {
            sign.mul(&a.pow_scalar(p - 1.0)?)?
        } else {
            x.mul(&a.pow_scalar(p - 2.0)?)?
        };
        let scale = zero_where(&yk.eq(0.0)?, &gk.div(&yk.pow_scalar(p - 1.0)?)?)?;
        scaled.mul(&scale)
    }

    /// The gradient of [`super::ExtremeAll`] of `x` (output `y`, 0-dim, and its gradient `g`):
    /// `g / count` at the elements equal to `y` (the NaN elements when `y` is NaN), selected
    /// into zeros elsewhere, as PyTorch's `evenly_distribute_backward`.
    pub(super) fn extreme_all_backward(x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Tensor> {
        let x = &x.to(g.dtype())?;
        let y = &y.to(g.dtype())?;
        let hit = where_(&y.isnan()?, &x.isnan()?, &x.eq(y)?)?;
        let share = g.div(&hit.sum(&[], false)?)?;
        share.masked_fill(&hit.logical_not()?, 0.0)
    }

    /// The gradient of max/min with values: the output gradient goes to the element whose index
    /// was returned, zeros elsewhere (PyTorch's convention: ties are not split).
    pub(super) fn arg_backward(
        dim: Option<i64>,
        x: &Tensor,
        idx: &Tensor,
        g: &Tensor,
    ) -> Result<Tensor> {
        let shape = x.shape();
        let zeros = |s: &[usize]| Tensor::zeros(s, g.dtype(), g.device());
        match dim {
            // A 0-dim input is its own extreme.
            Some(_) if x.rank() == 0 => g.reshape(shape),
            None => {
                // The index counts in the flattened tensor.
                let numel = x.numel();
                zeros(&[numel])?
                    .scatter(0, &idx.reshape([1])?, &g.reshape([1])?)?
                    .reshape(shape)
            }
            Some(d) => {
                let d = resolve_dim_in("max", d, x.rank(), shape)?;
                let mask: Vec<bool> = (0..x.rank()).map(|i| i == d).collect();
                let gk = keep_reduced(g, shape, &mask)?;
                let ik = keep_reduced(idx, shape, &mask)?;
                zeros(shape)?.scatter(d as i64, &ik, &gk)
            }
        }
    }

    /// The cumsum of `t` along `d` taken from the end.
    fn reverse_cumsum(t: &Tensor, d: i64) -> Result<Tensor> {
        t.flip(&[d])?.cumsum(d)?.flip(&[d])
    }

    /// The gradient of cumsum (the reversed cumsum of `g`) or cumprod.
    pub(super) fn scan_backward(op: &Scan, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Tensor> {
        // A 0-dim input: the scan is the identity.
        if x.rank() == 0 {
            return g.reshape(x.shape());
        }
        let d = resolve_dim_in(op.name(), op.dim, x.rank(), x.shape())? as i64;
        if !op.prod {
            return reverse_cumsum(g, d);
        }
        // dy_k/dx_i = prod_{j <= k, j != i} x_j for k >= i. Before the first zero of a line this is
        // y_k / x_i, so the gradient is revcumsum(g y) / x. At the first zero z it is the product
        // with x_z replaced by 1, so the gradient is revcumsum(g y') at z with y' = cumprod of that
        // line. After the first zero every product holds it: 0.
        let x = &x.to(g.dtype())?;
        let y = &y.to(g.dtype())?;
        let zero = x.eq(0.0)?;
        let zeros_so_far = zero.cumsum(d)?;
        let before = zeros_so_far.eq(0)?;
        let first = zero.logical_and(&zeros_so_far.eq(1)?)?;
        let ones = x.ones_like()?;
        let safe = where_(&zero, &ones, x)?;
        let left = reverse_cumsum(&g.mul(y)?, d)?.div(&safe)?;
        let y1 = where_(&first, &ones, x)?.cumprod(d)?;
        let at_zero = zero_where(&first.logical_not()?, &reverse_cumsum(&g.mul(&y1)?, d)?)?;
        where_(&before, &left, &at_zero)
    }
}

// ---- CPU kernels -----------------------------------------------------------------------------
//
// The loops themselves are in `crate::cpu::simd::reduce` (one build per instruction set, bit-identical
// results); here the work is laid out and split over the device's pool. Sums have a fixed
// order that does not depend on the thread count: a run of elements is folded as
// `simd_reduce` documents (lanes within blocks of `BLOCK`, blocks pairwise); a column fold takes
// `ROW_BLOCK` rows at a time, each column in row order, and combines those partial vectors
// pairwise. Work is split into pieces of `2^k` blocks, whose results combine pairwise to exactly
// the single-pass result (see `simd_reduce::Counter`).

/// Input rows per pairwise step of a column fold.
const ROW_BLOCK: usize = 64;
/// Bytes of accumulators per column-fold task (they stay in L1 while rows stream past).
const COL_BYTES: usize = 16 << 10;
/// Columns per scan task.
const COLS: usize = 256;
/// Elements of work per parallel task, at least.
const TASK: usize = 1 << 14;
/// Rows per piece of an arg column fold, at most (the row index lanes are 32-bit).
const ARG_ROWS: usize = 1 << 31;

/// Combines a sequence of partial results pairwise (equal-sized groups first, like a binary
/// counter), so rounding error grows with the log of the count instead of the count.
struct Cascade<T> {
    levels: Vec<(usize, T)>,
}

impl<T> Cascade<T> {
    fn new() -> Cascade<T> {
        Cascade { levels: Vec::new() }
    }

    fn push(&mut self, mut v: T, merge: &impl Fn(T, T) -> T) {
        let mut n = 1;
        while self.levels.last().map(|l| l.0) == Some(n) {
            let Some((_, prev)) = self.levels.pop() else {
                break;
            };
            v = merge(prev, v);
            n *= 2;
        }
        self.levels.push((n, v));
    }

    fn finish(self, merge: &impl Fn(T, T) -> T) -> Option<T> {
        self.levels
            .into_iter()
            .rev()
            .map(|l| l.1)
            .reduce(|newer, older| merge(older, newer))
    }
}

/// The length of pieces that split `len` among about `want` workers: `unit * 2^k`, so the
/// pieces' results combine to the single-pass result.
fn piece_len(len: usize, want: usize, unit: usize) -> usize {
    let units = len.div_ceil(unit).max(1);
    units.div_ceil(want.max(1)).next_power_of_two() * unit
}

/// Runs `op` over `x` laid out as `[outer, red, inner]`, `ps` holding the parameter of each of
/// the `outer * inner` outputs; returns their accumulators in that order.
fn fold<O: RedOp>(
    dev: &CpuDevice,
    op: &O,
    x: &[O::X],
    (outer, red, inner): (usize, usize, usize),
    ps: &[O::P],
) -> Result<Vec<O::A>> {
    if inner == 1 {
        fold_rows(dev, op, x, (outer, red), ps)
    } else {
        fold_cols(dev, op, x, (outer, red, inner), ps)
    }
}

/// Contiguous reductions: whole rows per task, or pieces of rows when there are few.
fn fold_rows<O: RedOp>(
    dev: &CpuDevice,
    op: &O,
    x: &[O::X],
    (outer, red): (usize, usize),
    ps: &[O::P],
) -> Result<Vec<O::A>> {
    let threads = dev.num_threads();
    let mut out = vec![op.identity(); outer];
    if outer * red < PAR_THRESHOLD || threads <= 1 {
        op.rows(x, red, ps, &mut out);
        return Ok(out);
    }
    if outer >= 2 * threads {
        let per = (TASK / red).max(1);
        dev.install(|| {
            out.par_chunks_mut(per)
                .zip(ps.par_chunks(per))
                .enumerate()
                .for_each(|(c, (o, p))| {
                    let r0 = c * per;
                    op.rows(&x[r0 * red..(r0 + o.len()) * red], red, p, o);
                })
        })?;
        return Ok(out);
    }
    let plen = piece_len(red, (2 * threads).div_ceil(outer), simd::BLOCK);
    let pieces = red.div_ceil(plen);
    let mut parts = vec![op.identity(); outer * pieces];
    dev.install(|| {
        parts.par_iter_mut().enumerate().for_each(|(w, o)| {
            let (row, k) = (w / pieces, w % pieces);
            let lo = row * red + k * plen;
            let hi = row * red + red.min((k + 1) * plen);
            let run = &x[lo..hi];
            op.rows(run, run.len(), &ps[row..=row], std::slice::from_mut(o));
        })
    })?;
    let merge = |a, b| op.merge(a, b);
    for (o, p) in out.iter_mut().zip(parts.chunks(pieces)) {
        let mut c = Cascade::new();
        for &v in p {
            c.push(v, &merge);
        }
        *o = c.finish(&merge).unwrap_or(op.identity());
    }
    Ok(out)
}

/// Reductions over an outer extent: each task folds a piece of the rows of one outer block into
/// accumulators for a band of columns, sweeping the rows in memory order.
fn fold_cols<O: RedOp>(
    dev: &CpuDevice,
    op: &O,
    x: &[O::X],
    (outer, red, inner): (usize, usize, usize),
    ps: &[O::P],
) -> Result<Vec<O::A>> {
    let cw = inner.min((COL_BYTES / size_of::<O::A>().max(1)).max(simd::LANES));
    let ncb = inner.div_ceil(cw);
    let tasks = outer * ncb;
    let threads = dev.num_threads();
    let serial = outer * red * inner < PAR_THRESHOLD || threads <= 1;
    let plen = if serial || tasks >= 2 * threads {
        red
    } else {
        piece_len(red, (2 * threads).div_ceil(tasks), ROW_BLOCK)
    };
    let pieces = red.div_ceil(plen);
    let item = |w: usize| {
        let (t, k) = (w / pieces, w % pieces);
        let (a, c) = (t / ncb, t % ncb);
        let cols = c * cw..inner.min((c + 1) * cw);
        let rows = k * plen..red.min((k + 1) * plen);
        let band = &ps[a * inner + cols.start..a * inner + cols.end];
        col_piece(op, x, (red, inner), a, (cols.start, rows), band)
    };
    let n = tasks * pieces;
    let parts: Vec<Vec<O::A>> = if serial {
        (0..n).map(item).collect()
    } else {
        dev.install(|| {
            (0..n)
                .into_par_iter()
                .with_min_len((TASK / (cw * plen)).max(1))
                .map(item)
                .collect()
        })?
    };
    let merge = |mut p: Vec<O::A>, q: Vec<O::A>| {
        for (s, t) in p.iter_mut().zip(q) {
            *s = op.merge(*s, t);
        }
        p
    };
    let mut out = Vec::with_capacity(outer * inner);
    let mut it = parts.into_iter();
    for _ in 0..tasks {
        let mut c = Cascade::new();
        for v in it.by_ref().take(pieces) {
            c.push(v, &merge);
        }
        out.extend(c.finish(&merge).unwrap_or_default());
    }
    Ok(out)
}

/// Folds rows `rows` of outer block `a` into accumulators for the band of columns starting at
/// `c0` whose parameters are `ps`.
fn col_piece<O: RedOp>(
    op: &O,
    x: &[O::X],
    (red, inner): (usize, usize),
    a: usize,
    (c0, rows): (usize, Range<usize>),
    ps: &[O::P],
) -> Vec<O::A> {
    let w = ps.len();
    let merge = |mut p: Vec<O::A>, q: Vec<O::A>| {
        for (s, t) in p.iter_mut().zip(q) {
            *s = op.merge(*s, t);
        }
        p
    };
    let mut casc = Cascade::new();
    let mut r0 = rows.start;
    while r0 < rows.end {
        let r1 = rows.end.min(r0 + ROW_BLOCK);
        let start = (a * red + r0) * inner + c0;
        let mut acc = vec![op.identity(); w];
        op.cols(
            &x[start..start + (r1 - r0 - 1) * inner + w],
            inner,
            r1 - r0,
            &mut acc,
            ps,
        );
        casc.push(acc, &merge);
        r0 = r1;
    }
    casc.finish(&merge)
        .unwrap_or_else(|| vec![op.identity(); w])
}

/// A reduction laid out as `[outer, red, inner]` over the dense elements of `x`, which is the
/// input itself or a copy of it.
struct Plan {
    x: Tensor,
    outer: usize,
    red: usize,
    inner: usize,
    /// When the kept dims appear in the dense order in another order than the logical one: the
    /// result's shape in that order and the permutation back to the logical order.
    perm_back: Option<(Vec<usize>, Vec<usize>)>,
}

/// True when the dims `order` (outermost first) of a view tile its elements densely.
fn dense(order: &[usize], shape: &[usize], strides: &[usize]) -> bool {
    let mut expect = 1;
    for &d in order.iter().rev() {
        if strides[d] != expect {
            return false;
        }
        expect *= shape[d];
    }
    true
}

impl Plan {
    /// Plans a reduction of a non-empty `x` over `mask`. With `logical`, the reduced elements
    /// are visited in logical row-major order (for flattened indices).
    fn new(x: &Tensor, mask: &[bool], logical: bool) -> Result<Plan> {
        let (shape, strides) = (x.shape(), x.strides());
        let live: Vec<usize> = (0..shape.len()).filter(|&d| shape[d] > 1).collect();
        let mut mem = live.clone();
        if !logical {
            mem.sort_by(|&a, &b| strides[b].cmp(&strides[a]));
        }
        if dense(&mem, shape, strides) {
            if let Some(p) = Plan::direct(x.clone(), &mem, mask) {
                return Ok(p);
            }
        } else if let Some(p) = Plan::direct(x.contiguous()?, &live, mask) {
            return Ok(p);
        }
        // Interleaved kept and reduced dims: one copy with the reduced dims last.
        let kept: Vec<usize> = (0..shape.len()).filter(|&d| !mask[d]).collect();
        let reduced: Vec<usize> = (0..shape.len()).filter(|&d| mask[d]).collect();
        let perm: Vec<usize> = kept.iter().chain(&reduced).copied().collect();
        Ok(Plan {
            x: x.permute(&perm[..])?.contiguous()?,
            outer: kept.iter().map(|&d| shape[d]).product(),
            red: reduced.iter().map(|&d| shape[d]).product(),
            inner: 1,
            perm_back: None,
        })
    }

    /// The plan for `x` dense in `order`, when its kept and reduced dims form at most
    /// `[kept, reduced, kept]` in that order.
    fn direct(x: Tensor, order: &[usize], mask: &[bool]) -> Option<Plan> {
        let shape = x.shape();
        let mut groups: Vec<(bool, usize)> = Vec::new();
        for &d in order {
            match groups.last_mut() {
                Some(g) if g.0 == mask[d] => g.1 *= shape[d],
                _ => groups.push((mask[d], shape[d])),
            }
        }
        let (outer, red, inner) = match groups[..] {
            [] => (1, 1, 1),
            [(false, k)] => (k, 1, 1),
            [(true, r)] => (1, r, 1),
            [(false, k), (true, r)] => (k, r, 1),
            [(true, r), (false, k)] => (1, r, k),
            [(false, k0), (true, r), (false, k1)] => (k0, r, k1),
            _ => return None,
        };
        let kept: Vec<usize> = order.iter().copied().filter(|&d| !mask[d]).collect();
        let perm_back = if kept.windows(2).all(|w| w[0] < w[1]) {
            None
        } else {
            let mut sorted = kept.clone();
            sorted.sort_unstable();
            let perm = sorted
                .iter()
                .map(|d| kept.iter().position(|k| k == d).unwrap_or(0))
                .collect();
            Some((kept.iter().map(|&d| shape[d]).collect(), perm))
        };
        Some(Plan {
            x,
            outer,
            red,
            inner,
            perm_back,
        })
    }

    fn geometry(&self) -> (usize, usize, usize) {
        (self.outer, self.red, self.inner)
    }

    /// Brings a flat result in the plan's order to the logical order, shaped `shape`.
    fn restore(&self, t: Tensor, shape: &[usize]) -> Result<Tensor> {
        match &self.perm_back {
            None => t.reshape(shape),
            Some((mem_shape, perm)) => t
                .reshape(&mem_shape[..])?
                .permute(&perm[..])?
                .contiguous()?
                .reshape(shape),
        }
    }
}

/// The dense elements of `t` (which must be dense from its offset on) as `T`.
fn block<'a, T: Element>(r: &'a Reader<'_>, t: &Tensor) -> Result<&'a [T]> {
    let data = r.data::<T>(t)?;
    data.get(t.offset()..t.offset() + t.numel())
        .ok_or_else(|| internal("reduce", "view outside its storage"))
}

/// The first extreme element (NaN first) of each output's group and its index, for `x` laid
/// out as `[outer, red, inner]`.
fn arg_fold<X: Load<A>, A: ArgAcc, const MAX: bool>(
    dev: &CpuDevice,
    x: &[X],
    (outer, red, inner): (usize, usize, usize),
) -> Result<Vec<(A, usize)>> {
    let threads = dev.num_threads();
    let serial = outer * red * inner < PAR_THRESHOLD || threads <= 1;
    let pick = |a, b| simd::arg_merge::<A, MAX>(a, b);
    if inner == 1 {
        let mut vals = vec![A::ZERO; outer];
        let mut idx = vec![0i64; outer];
        if serial {
            simd::arg_rows::<X, A, MAX>(x, red, &mut vals, &mut idx);
        } else if outer >= 2 * threads {
            let per = (TASK / red).max(1);
            dev.install(|| {
                vals.par_chunks_mut(per)
                    .zip(idx.par_chunks_mut(per))
                    .enumerate()
                    .for_each(|(c, (v, i))| {
                        let r0 = c * per;
                        let rows = &x[r0 * red..(r0 + v.len()) * red];
                        simd::arg_rows::<X, A, MAX>(rows, red, v, i);
                    })
            })?;
        } else {
            let plen = red
                .div_ceil((2 * threads).div_ceil(outer))
                .next_multiple_of(simd::LANES);
            let pieces = red.div_ceil(plen);
            let parts: Vec<(A, usize)> = dev.install(|| {
                (0..outer * pieces)
                    .into_par_iter()
                    .map(|w| {
                        let (row, k) = (w / pieces, w % pieces);
                        let lo = k * plen;
                        let run = &x[row * red + lo..row * red + red.min(lo + plen)];
                        let (mut v, mut i) = (A::ZERO, 0);
                        simd::arg_rows::<X, A, MAX>(
                            run,
                            run.len(),
                            std::slice::from_mut(&mut v),
                            std::slice::from_mut(&mut i),
                        );
                        (v, lo + i as usize)
                    })
                    .collect()
            })?;
            return Ok(parts
                .chunks(pieces)
                .map(|p| p.iter().copied().reduce(pick).unwrap_or((A::ZERO, 0)))
                .collect());
        }
        return Ok(vals
            .into_iter()
            .zip(idx)
            .map(|(v, i)| (v, i as usize))
            .collect());
    }
    let cw = inner.min((COL_BYTES / size_of::<A>()).max(simd::LANES));
    let ncb = inner.div_ceil(cw);
    let tasks = outer * ncb;
    let plen = if serial || tasks >= 2 * threads {
        red
    } else {
        red.div_ceil((2 * threads).div_ceil(tasks))
    }
    .min(ARG_ROWS);
    let pieces = red.div_ceil(plen);
    let item = |w: usize| -> Vec<(A, usize)> {
        let (t, k) = (w / pieces, w % pieces);
        let (a, c) = (t / ncb, t % ncb);
        let (c0, c1) = (c * cw, inner.min((c + 1) * cw));
        let (r0, r1) = (k * plen, red.min((k + 1) * plen));
        let start = (a * red + r0) * inner + c0;
        let w = c1 - c0;
        let mut vals: Vec<A> = x[start..start + w].iter().map(|e| e.load()).collect();
        let mut at = vec![A::index(0); w];
        simd::arg_cols::<X, A, MAX>(
            &x[start..start + (r1 - r0 - 1) * inner + w],
            inner,
            r1 - r0,
            &mut vals,
            &mut at,
        );
        vals.into_iter()
            .zip(at)
            .map(|(v, i)| (v, r0 + A::position(i)))
            .collect()
    };
    let n = tasks * pieces;
    let parts: Vec<Vec<(A, usize)>> = if serial {
        (0..n).map(item).collect()
    } else {
        dev.install(|| {
            (0..n)
                .into_par_iter()
                .with_min_len((TASK / (cw * plen)).max(1))
                .map(item)
                .collect()
        })?
    };
    let mut out = Vec::with_capacity(outer * inner);
    let mut it = parts.into_iter();
    for _ in 0..tasks {
        let best = it.by_ref().take(pieces).reduce(|mut p, q| {
            for (s, t) in p.iter_mut().zip(q) {
                *s = pick(*s, t);
            }
            p
        });
        out.extend(best.unwrap_or_default());
    }
    Ok(out)
}

/// A tensor of `f(acc)` for every accumulator, in logical order, shaped `shape`.
fn emit<A: Copy + Sync, O: Element>(
    dev: &Arc<CpuDevice>,
    plan: &Plan,
    accs: &[A],
    shape: &[usize],
    f: impl Fn(A) -> O + Sync + Send,
) -> Result<Tensor> {
    let device = Device::from_cpu(dev.clone());
    let t = Tensor::from_fn_overwrite::<O>(&[accs.len()], &device, |out| {
        par_chunks(dev, out, |chunk, base| {
            for (o, &a) in chunk.iter_mut().zip(&accs[base..]) {
                *o = f(a);
            }
        })
    })?;
    plan.restore(t, shape)
}

/// No parameters, one per output.
fn units(plan: &Plan) -> Vec<()> {
    vec![(); plan.outer * plan.inner]
}

/// The mean of a sum of `n` elements (unused for integers, which have no mean).
trait PerCount: Copy {
    fn per(self, n: usize) -> Self;
}

impl PerCount for f32 {
    fn per(self, n: usize) -> f32 {
        self / n as f32
    }
}

impl PerCount for f64 {
    fn per(self, n: usize) -> f64 {
        self / n as f64
    }
}

impl PerCount for i64 {
    fn per(self, n: usize) -> i64 {
        self / n as i64
    }
}

/// Sum, mean, prod, amax and amin, reading the stored type `X` and accumulating in `A`.
fn basic_reduce<X: Load<A>, A: Acc + PerCount + Element>(
    kind: ReduceKind,
    dev: &Arc<CpuDevice>,
    plan: &Plan,
    x: &[X],
    n: usize,
    shape: &[usize],
) -> Result<Tensor> {
    use ReduceKind::*;
    let geo = plan.geometry();
    let ps = units(plan);
    let map = simd::plain::<X, A>();
    let accs = match kind {
        Sum | Mean => fold(dev, &simd::Sum(map), x, geo, &ps)?,
        Prod => fold(dev, &simd::Prod(map), x, geo, &ps)?,
        Amax => fold(dev, &simd::Extreme::<_, true>(map), x, geo, &ps)?,
        Amin => fold(dev, &simd::Extreme::<_, false>(map), x, geo, &ps)?,
        _ => return Err(internal(kind.name(), "not a basic reduction")),
    };
    if kind == Mean {
        emit(dev, plan, &accs, shape, |s: A| s.per(n))
    } else {
        emit(dev, plan, &accs, shape, |s| s)
    }
}

/// [`basic_reduce`] for f32, whose sums and extremes have hand-vectorised loops.
fn f32_reduce(
    kind: ReduceKind,
    dev: &Arc<CpuDevice>,
    plan: &Plan,
    x: &[f32],
    n: usize,
    shape: &[usize],
) -> Result<Tensor> {
    let geo = plan.geometry();
    let ps = units(plan);
    let accs = match kind {
        ReduceKind::Sum | ReduceKind::Mean => fold(dev, &simd::SumF32, x, geo, &ps)?,
        ReduceKind::Amax => fold(dev, &simd::ExtremeF32::<true>, x, geo, &ps)?,
        ReduceKind::Amin => fold(dev, &simd::ExtremeF32::<false>, x, geo, &ps)?,
        _ => return basic_reduce::<f32, f32>(kind, dev, plan, x, n, shape),
    };
    if kind == ReduceKind::Mean {
        emit(dev, plan, &accs, shape, |s: f32| s.per(n))
    } else {
        emit(dev, plan, &accs, shape, |s| s)
    }
}

/// all and any over the stored type `X` (non-zero is true).
fn logic_reduce<X: Truthy>(
    kind: ReduceKind,
    dev: &Arc<CpuDevice>,
    plan: &Plan,
    x: &[X],
    shape: &[usize],
) -> Result<Tensor> {
    let geo = plan.geometry();
    let ps = units(plan);
    let accs = if kind == ReduceKind::All {
        fold(dev, &simd::Logic::<X, true>(PhantomData), x, geo, &ps)?
    } else {
        fold(dev, &simd::Logic::<X, false>(PhantomData), x, geo, &ps)?
    };
    emit(dev, plan, &accs, shape, |v| v)
}

/// The float-only reductions (var, std, logsumexp, norm), computing in `C`.
fn float_reduce<C: FloatAcc + Element>(
    kind: ReduceKind,
    dev: &Arc<CpuDevice>,
    plan: &Plan,
    x: &[C],
    n: usize,
    shape: &[usize],
) -> Result<Tensor> {
    use ReduceKind::*;
    let geo = plan.geometry();
    let ps = units(plan);
    let plain = simd::plain::<C, C>();
    match kind {
        Var { correction } | Std { correction } => {
            // Two passes: the mean, then the squared deviations from it.
            let nf = C::from_f64(n as f64);
            let means: Vec<C> = fold(dev, &simd::Sum(plain), x, geo, &ps)?
                .into_iter()
                .map(|s| s.div(nf))
                .collect();
            let m2 = fold(
                dev,
                &simd::Sum(SquaredDeviation(PhantomData)),
                x,
                geo,
                &means,
            )?;
            let divisor = C::from_f64((n as f64 - correction).max(0.0));
            let std = matches!(kind, Std { .. });
            emit(dev, plan, &m2, shape, |a: C| {
                let v = a.div(divisor);
                if std { v.sqrt() } else { v }
            })
        }
        LogSumExp => {
            // Around the maximum, with infinite maxima replaced by 0 as PyTorch does, so rows of
            // -inf give -inf and rows holding +inf give +inf instead of NaN.
            let centers: Vec<C> = fold(dev, &simd::Extreme::<_, true>(plain), x, geo, &ps)?
                .into_iter()
                .map(|m| if m.infinite() { C::ZERO } else { m })
                .collect();
            let s = fold(dev, &simd::Sum(ExpDeviation(PhantomData)), x, geo, &centers)?;
            let pairs: Vec<(C, C)> = s.into_iter().zip(centers).collect();
            emit(dev, plan, &pairs, shape, |(a, c): (C, C)| a.ln().add(c))
        }
        Norm { p } => {
            let accs = if p == f64::INFINITY {
                fold(
                    dev,
                    &simd::Extreme::<_, true>(Magnitude(PhantomData)),
                    x,
                    geo,
                    &ps,
                )?
            } else if p == f64::NEG_INFINITY {
                fold(
                    dev,
                    &simd::Extreme::<_, false>(Magnitude(PhantomData)),
                    x,
                    geo,
                    &ps,
                )?
            } else if p == 2.0 {
                fold(dev, &simd::Sum(Square(PhantomData)), x, geo, &ps)?
            } else if p == 1.0 {
                fold(dev, &simd::Sum(Magnitude(PhantomData)), x, geo, &ps)?
            } else if p == 0.0 {
                fold(dev, &simd::Sum(NonZero(PhantomData)), x, geo, &ps)?
            } else {
                let pc = C::from_f64(p);
                fold(dev, &simd::Sum(PowMagnitude(pc)), x, geo, &ps)?
            };
            let root = C::from_f64(1.0 / p);
            emit(dev, plan, &accs, shape, move |s: C| {
                if p.is_infinite() || p == 1.0 || p == 0.0 {
                    s
                } else if p == 2.0 {
                    s.sqrt()
                } else {
                    s.powf(root)
                }
            })
        }
        _ => Err(internal(kind.name(), "not a float-only reduction")),
    }
}

fn arg_kernel<X: Load<A>, A: ArgAcc + Element>(
    max: bool,
    dev: &Arc<CpuDevice>,
    plan: &Plan,
    x: &[X],
    shape: &[usize],
) -> Result<(Tensor, Tensor)> {
    let geo = plan.geometry();
    let accs = if max {
        arg_fold::<X, A, true>(dev, x, geo)?
    } else {
        arg_fold::<X, A, false>(dev, x, geo)?
    };
    Ok((
        emit(dev, plan, &accs, shape, |a| a.0)?,
        emit(dev, plan, &accs, shape, |a| a.1 as i64)?,
    ))
}

/// A scan of a dense `[outer, n, inner]` block: `acc = step(acc, to(x))`, storing `back(acc)`.
#[allow(clippy::too_many_arguments)]
fn scan_tensor<X: Element, A: Copy + Send + Sync>(
    dev: &Arc<CpuDevice>,
    x: &[X],
    (outer, n, inner): (usize, usize, usize),
    shape: &[usize],
    prod: bool,
    to: impl Fn(X) -> A + Sync + Send,
    back: impl Fn(A) -> X + Sync + Send,
    step: impl Fn(A, A) -> A + Sync + Send,
) -> Result<Tensor> {
    let init = to(if prod { X::from_i64(1) } else { X::from_i64(0) });
    let len = n * inner;
    let body = |src: &[X], out: &mut [X]| {
        if inner == 1 {
            let mut acc = init;
            for (o, &v) in out.iter_mut().zip(src) {
                acc = step(acc, to(v));
                *o = back(acc);
            }
            return;
        }
        for c0 in (0..inner).step_by(COLS) {
            let c1 = inner.min(c0 + COLS);
            let mut acc = vec![init; c1 - c0];
            for i in 0..n {
                let row = i * inner;
                let dst = &mut out[row + c0..row + c1];
                for ((a, o), &v) in acc.iter_mut().zip(dst).zip(&src[row + c0..row + c1]) {
                    *a = step(*a, to(v));
                    *o = back(*a);
                }
            }
        }
    };
    let device = Device::from_cpu(dev.clone());
    Tensor::from_fn_typed::<X>(shape, &device, |out| {
        if outer * len < PAR_THRESHOLD || dev.num_threads() <= 1 || outer == 1 {
            for (src, dst) in x.chunks(len).zip(out.chunks_mut(len)) {
                body(src, dst);
            }
            return Ok(());
        }
        dev.install(|| {
            x.par_chunks(len)
                .zip(out.par_chunks_mut(len))
                .with_min_len((TASK / len).max(1))
                .for_each(|(src, dst)| body(src, dst));
        })
    })
}

// ---- lowerings -------------------------------------------------------------------------------

fn fold_hlo(b: &mut FnBuilder, x: &Value, dims: &[usize], init: Value, op: &str) -> Value {
    b.reduce(&[x], &[&init], dims, |b, a| vec![b.ew(op, &[&a[0], &a[1]])])
        .remove(0)
}

fn sum_hlo(b: &mut FnBuilder, x: &Value, dims: &[usize]) -> Value {
    let zero = b.scalar(x.dtype(), 0);
    fold_hlo(b, x, dims, zero, "stablehlo.add")
}

/// Max or min over `dims`, NaN propagating (the comparison is explicit because XLA's
/// `maximum` need not propagate NaN on every backend).
fn extreme_hlo(b: &mut FnBuilder, x: &Value, dims: &[usize], max: bool) -> Value {
    let dt = x.dtype();
    if !dt.is_float() {
        let init = b.scalar(dt, if max { i64::MIN } else { i64::MAX });
        let op = if max {
            "stablehlo.maximum"
        } else {
            "stablehlo.minimum"
        };
        return fold_hlo(b, x, dims, init, op);
    }
    let init = b.scalar(
        dt,
        if max {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        },
    );
    b.reduce(&[x], &[&init], dims, |b, a| {
        let better = b.compare(if max { Cmp::Gt } else { Cmp::Lt }, &a[0], &a[1]);
        let nan = b.compare(Cmp::Ne, &a[0], &a[0]);
        let keep = b.ew("stablehlo.or", &[&better, &nan]);
        vec![b.select(&keep, &a[0], &a[1])]
    })
    .remove(0)
}

/// The max or min along `dim` and the index of its first occurrence, NaN first: a variadic
/// reduce over (values, iota) whose body is a total order, so XLA may combine in any order.
fn lower_arg(b: &mut FnBuilder, x: &Value, dim: usize, max: bool) -> (Value, Value) {
    let dt = x.dtype();
    let idx = b.iota(x.dims(), dim, DType::I64);
    let init_v = if dt.is_float() {
        b.scalar(
            dt,
            if max {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            },
        )
    } else {
        b.scalar(dt, if max { i64::MIN } else { i64::MAX })
    };
    let init_i = b.scalar(DType::I64, i64::MAX);
    let mut r = b.reduce(&[x, &idx], &[&init_v, &init_i], &[dim], |b, a| {
        let (av, ai, bv, bi) = (&a[0], &a[1], &a[2], &a[3]);
        let an = b.compare(Cmp::Ne, av, av);
        let bn = b.compare(Cmp::Ne, bv, bv);
        let better = b.compare(if max { Cmp::Gt } else { Cmp::Lt }, bv, av);
        let eq = b.compare(Cmp::Eq, bv, av);
        let both_nan = b.ew("stablehlo.and", &[&an, &bn]);
        let tie = b.ew("stablehlo.or", &[&eq, &both_nan]);
        let lower = b.compare(Cmp::Lt, bi, ai);
        let tie_win = b.ew("stablehlo.and", &[&tie, &lower]);
        let a_num = b.ew("stablehlo.not", &[&an]);
        let nan_win = b.ew("stablehlo.and", &[&bn, &a_num]);
        let win = b.ew("stablehlo.or", &[&nan_win, &better]);
        let win = b.ew("stablehlo.or", &[&win, &tie_win]);
        vec![b.select(&win, bv, av), b.select(&win, bi, ai)]
    });
    let i = r.remove(1);
    (r.remove(0), i)
}

fn lower_reduce(
    kind: ReduceKind,
    b: &mut FnBuilder,
    x: &Value,
    mask: &[bool],
    out: &Meta,
) -> Value {
    use ReduceKind::*;
    // A 0-dim input reduces as a 1-element vector.
    let (x, mask) = if x.ty.rank() == 0 {
        (b.reshape(x, &[1]), vec![true])
    } else {
        (x.clone(), mask.to_vec())
    };
    let dims: Vec<usize> = (0..mask.len()).filter(|&d| mask[d]).collect();
    let kept: Vec<i64> = (0..mask.len())
        .filter(|&d| !mask[d])
        .map(|d| d as i64)
        .collect();
    let n: usize = dims.iter().map(|&d| x.dims()[d]).product();
    let ct = kind.compute(x.dtype());
    let xc = b.convert(&x, ct);
    let v = match kind {
        Sum => sum_hlo(b, &xc, &dims),
        Prod => {
            let one = b.scalar(ct, 1);
            fold_hlo(b, &xc, &dims, one, "stablehlo.multiply")
        }
        Mean => {
            let s = sum_hlo(b, &xc, &dims);
            let nv = b.splat(s.ty.clone(), n as f64);
            b.ew("stablehlo.divide", &[&s, &nv])
        }
        Amax | Amin => extreme_hlo(b, &xc, &dims, kind == Amax),
        All | Any => {
            let init = b.scalar(DType::Bool, kind == All);
            let op = if kind == All {
                "stablehlo.and"
            } else {
                "stablehlo.or"
            };
            fold_hlo(b, &xc, &dims, init, op)
        }
        Var { correction } | Std { correction } => {
            let s = sum_hlo(b, &xc, &dims);
            let nv = b.splat(s.ty.clone(), n as f64);
            let mean = b.ew("stablehlo.divide", &[&s, &nv]);
            let mean = b.broadcast_in_dim(&mean, &kept, xc.dims());
            let d = b.ew("stablehlo.subtract", &[&xc, &mean]);
            let sq = b.ew("stablehlo.multiply", &[&d, &d]);
            let m2 = sum_hlo(b, &sq, &dims);
            let div = b.splat(m2.ty.clone(), (n as f64 - correction).max(0.0));
            let var = b.ew("stablehlo.divide", &[&m2, &div]);
            if matches!(kind, Std { .. }) {
                b.ew("stablehlo.sqrt", &[&var])
            } else {
                var
            }
        }
        LogSumExp => {
            let m = extreme_hlo(b, &xc, &dims, true);
            let am = b.ew("stablehlo.abs", &[&m]);
            let inf = b.splat(m.ty.clone(), f64::INFINITY);
            let is_inf = b.compare(Cmp::Eq, &am, &inf);
            let zero = b.splat(m.ty.clone(), 0);
            let center = b.select(&is_inf, &zero, &m);
            let cb = b.broadcast_in_dim(&center, &kept, xc.dims());
            let d = b.ew("stablehlo.subtract", &[&xc, &cb]);
            let e = b.ew("stablehlo.exponential", &[&d]);
            let s = sum_hlo(b, &e, &dims);
            let l = b.ew("stablehlo.log", &[&s]);
            b.ew("stablehlo.add", &[&l, &center])
        }
        Norm { p } => {
            let a = b.ew("stablehlo.abs", &[&xc]);
            if p.is_infinite() {
                extreme_hlo(b, &a, &dims, p > 0.0)
            } else if p == 0.0 {
                let zero = b.splat(xc.ty.clone(), 0);
                let one = b.splat(xc.ty.clone(), 1);
                let nz = b.compare(Cmp::Ne, &xc, &zero);
                let c = b.select(&nz, &one, &zero);
                sum_hlo(b, &c, &dims)
            } else if p == 1.0 {
                sum_hlo(b, &a, &dims)
            } else if p == 2.0 {
                let sq = b.ew("stablehlo.multiply", &[&xc, &xc]);
                let s = sum_hlo(b, &sq, &dims);
                b.ew("stablehlo.sqrt", &[&s])
            } else {
                let pv = b.splat(a.ty.clone(), p);
                let t = b.ew("stablehlo.power", &[&a, &pv]);
                let s = sum_hlo(b, &t, &dims);
                let inv = b.splat(s.ty.clone(), 1.0 / p);
                b.ew("stablehlo.power", &[&s, &inv])
            }
        }
    };
    let v = b.reshape(&v, &out.shape);
    b.convert(&v, out.dtype)
}

// ---- methods ---------------------------------------------------------------------------------

/// Reductions and scans as methods on `Tensor`, with PyTorch's names and semantics. `dims`
/// lists dims to reduce (negative values count from the end; empty means every dim; duplicates
/// and out-of-range dims are errors); `keepdim` keeps them as size 1.
pub trait ReduceOps {
    /// Sum over `dims`; integers and bool give i64, 16-bit floats accumulate in f32.
    fn sum(&self, dims: &[i64], keepdim: bool) -> Result<Tensor>;
    /// Sum of every element, as a 0-dim tensor.
    fn sum_all(&self) -> Result<Tensor>;
    /// Product over `dims`; integers and bool give i64.
    fn prod(&self, dims: &[i64], keepdim: bool) -> Result<Tensor>;
    /// Product of every element.
    fn prod_all(&self) -> Result<Tensor>;
    /// Mean over `dims` (floats only; NaN for an empty extent).
    fn mean(&self, dims: &[i64], keepdim: bool) -> Result<Tensor>;
    /// Mean of every element.
    fn mean_all(&self) -> Result<Tensor>;
    /// Maximum over `dims` (NaN propagates; an empty extent is an error).
    fn amax(&self, dims: &[i64], keepdim: bool) -> Result<Tensor>;
    /// Minimum over `dims` (NaN propagates; an empty extent is an error).
    fn amin(&self, dims: &[i64], keepdim: bool) -> Result<Tensor>;
    /// Maximum of every element (`x.max()`); an empty tensor is an error.
    fn max_all(&self) -> Result<Tensor>;
    /// Minimum of every element (`x.min()`); an empty tensor is an error.
    fn min_all(&self) -> Result<Tensor>;
    /// Maximum along `dim` and its index, as `x.max(dim, keepdim)`: NaN is the maximum, ties
    /// give the first index; indices are i64.
    fn max_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)>;
    /// Minimum along `dim` and its index (NaN is the minimum, ties give the first index).
    fn min_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)>;
    /// Index of the maximum along `dim`, or in the flattened tensor when `dim` is `None`
    /// (NaN first, ties give the first index; not for bool).
    fn argmax(&self, dim: Option<i64>, keepdim: bool) -> Result<Tensor>;
    /// Index of the minimum along `dim`, or in the flattened tensor when `dim` is `None`.
    fn argmin(&self, dim: Option<i64>, keepdim: bool) -> Result<Tensor>;
    /// Variance over `dims` with divisor `max(0, n - correction)` (1 is unbiased, 0 is the
    /// population variance); floats only.
    fn var(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor>;
    /// Standard deviation over `dims`, the square root of [`ReduceOps::var`].
    fn std(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor>;
    /// `log(sum(exp(x)))` over `dims`, computed around the maximum; integers and bool give f32.
    fn logsumexp(&self, dims: &[i64], keepdim: bool) -> Result<Tensor>;
    /// The vector `p`-norm over `dims` (`torch.linalg.vector_norm`): 2 is Euclidean, 1 sums
    /// magnitudes, `f64::INFINITY` / `f64::NEG_INFINITY` take the max / min magnitude, 0 counts
    /// non-zeros, other values give `(sum |x|^p)^(1/p)`; floats only.
    fn norm(&self, p: f64, dims: &[i64], keepdim: bool) -> Result<Tensor>;
    /// True where every element over `dims` is non-zero (bool result for every dtype).
    fn all(&self, dims: &[i64], keepdim: bool) -> Result<Tensor>;
    /// True where some element over `dims` is non-zero.
    fn any(&self, dims: &[i64], keepdim: bool) -> Result<Tensor>;
    /// Cumulative sum along `dim`; integers and bool give i64, 16-bit floats accumulate in f32.
    fn cumsum(&self, dim: i64) -> Result<Tensor>;
    /// Cumulative product along `dim`; integers and bool give i64.
    fn cumprod(&self, dim: i64) -> Result<Tensor>;
}

impl ReduceOps for Tensor {
    fn sum(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceKind::Sum, dims, keepdim)
    }
    fn sum_all(&self) -> Result<Tensor> {
        reduce(self, ReduceKind::Sum, &[], false)
    }
    fn prod(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceKind::Prod, dims, keepdim)
    }
    fn prod_all(&self) -> Result<Tensor> {
        reduce(self, ReduceKind::Prod, &[], false)
    }
    fn mean(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceKind::Mean, dims, keepdim)
    }
    fn mean_all(&self) -> Result<Tensor> {
        reduce(self, ReduceKind::Mean, &[], false)
    }
    fn amax(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceKind::Amax, dims, keepdim)
    }
    fn amin(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceKind::Amin, dims, keepdim)
    }
    fn max_all(&self) -> Result<Tensor> {
        crate::exec::dispatch::run1(&ExtremeAll { max: true }, &[self])
    }
    fn min_all(&self) -> Result<Tensor> {
        crate::exec::dispatch::run1(&ExtremeAll { max: false }, &[self])
    }
    fn max_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        extreme_dim(self, true, dim, keepdim)
    }
    fn min_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        extreme_dim(self, false, dim, keepdim)
    }
    fn argmax(&self, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
        arg(self, true, dim, keepdim)
    }
    fn argmin(&self, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
        arg(self, false, dim, keepdim)
    }
    fn var(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceKind::Var { correction }, dims, keepdim)
    }
    fn std(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceKind::Std { correction }, dims, keepdim)
    }
    fn logsumexp(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceKind::LogSumExp, dims, keepdim)
    }
    fn norm(&self, p: f64, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceKind::Norm { p }, dims, keepdim)
    }
    fn all(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceKind::All, dims, keepdim)
    }
    fn any(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceKind::Any, dims, keepdim)
    }
    fn cumsum(&self, dim: i64) -> Result<Tensor> {
        scan(self, false, dim)
    }
    fn cumprod(&self, dim: i64) -> Result<Tensor> {
        scan(self, true, dim)
    }
}

// ---- the op table ----------------------------------------------------------------------------

/// How sample values are drawn.
#[derive(Clone, Copy)]
enum Values {
    /// Normal floats times 3, integers in [-5, 5].
    Wide,
    /// Normal floats times 0.8, integers in [-2, 2] (products stay in range).
    Narrow,
    /// Rounded floats and small integers, with many zeros (for all/any and p = 0).
    Sparse,
}

/// A seeded `[4, 3, 5]` input of `dtype` on `device`, built on the CPU.
fn sample_input(dtype: DType, device: &Device, values: Values) -> Result<Tensor> {
    let cpu = Device::cpu();
    let mut g = Generator::new(17);
    let x = if dtype.is_float() {
        let scale = match values {
            Values::Wide => 3.0,
            Values::Narrow => 0.8,
            Values::Sparse => 0.6,
        };
        let r = g.randn([4, 3, 5], DType::F64, &cpu)?;
        match values {
            Values::Sparse => crate::op::samples::host_map(&r, |v| (v * scale).round())?,
            _ => crate::op::samples::host_map(&r, |v| v * scale)?,
        }
    } else if dtype == DType::Bool {
        g.randint(0, 2, [4, 3, 5], DType::I64, &cpu)?
    } else {
        let (lo, hi) = match values {
            Values::Wide => (-5, 6),
            Values::Narrow => (-2, 3),
            Values::Sparse => (-1, 2),
        };
        g.randint(lo, hi, [4, 3, 5], DType::I64, &cpu)?
    };
    x.to_dtype(dtype)?.to_device(device)
}

type SampleFn = fn(&Tensor) -> Result<Vec<Tensor>>;

fn row(name: &'static str, dtypes: DTypeSet, tol: f64, values: Values, f: SampleFn) -> OpInfo {
    OpInfo {
        name,
        cpu: dtypes,
        hlo: dtypes,
        sample: Arc::new(move |d, dev| f(&sample_input(d, dev, values)?)),
        tolerance: tol,
    }
}

/// The rows of the op table for this file's ops. One call per row keeps XLA compiles few (each
/// costs tens of milliseconds); every call reads a permuted or sliced view. The CPU paths each
/// layout takes are covered by the property tests in `tests/reduce.rs`.
pub fn table() -> Vec<OpInfo> {
    use Values::*;
    let all = DTypeSet::ALL;
    let float = DTypeSet::FLOAT;
    // Float accumulations run in another order under XLA than on the CPU.
    let acc = 1e-5;
    vec![
        row("sum", all, acc, Wide, |x| {
            Ok(vec![
                x.slice(2, 1.., 2)?
                    .permute([2, 0, 1])?
                    .sum(&[0, -1], false)?,
            ])
        }),
        row("prod", all, acc, Narrow, |x| {
            Ok(vec![x.transpose(0, 2)?.prod(&[1], true)?])
        }),
        row("mean", float, acc, Wide, |x| {
            Ok(vec![x.permute([1, 2, 0])?.mean(&[2, 0], true)?])
        }),
        row("amax", all, 0.0, Wide, |x| {
            Ok(vec![x.permute([2, 0, 1])?.amax(&[1], false)?])
        }),
        row("amin", all, 0.0, Wide, |x| {
            Ok(vec![x.slice(0, 1.., 2)?.amin(&[], true)?])
        }),
        row("max", all, 0.0, Wide, |x| {
            let (v, i) = x.permute([2, 0, 1])?.max_dim(1, false)?;
            Ok(vec![v, i])
        }),
        row("min", all, 0.0, Wide, |x| {
            let (v, i) = x.slice(1, .., 2)?.min_dim(-1, true)?;
            Ok(vec![v, i])
        }),
        row("max_all", all, 0.0, Wide, |x| {
            Ok(vec![x.permute([1, 2, 0])?.max_all()?])
        }),
        row("min_all", all, 0.0, Wide, |x| {
            Ok(vec![x.slice(2, .., 2)?.min_all()?])
        }),
        row("argmax", DTypeSet::NUMERIC, 0.0, Wide, |x| {
            Ok(vec![x.permute([1, 2, 0])?.argmax(None, false)?])
        }),
        row("argmin", DTypeSet::NUMERIC, 0.0, Wide, |x| {
            Ok(vec![x.transpose(0, 2)?.argmin(Some(0), true)?])
        }),
        row("var", float, acc, Wide, |x| {
            Ok(vec![x.permute([2, 0, 1])?.var(&[0, 2], 1.0, false)?])
        }),
        row("std", float, acc, Wide, |x| {
            Ok(vec![x.slice(2, .., 2)?.std(&[-1, 0], 0.0, true)?])
        }),
        row("logsumexp", all, acc, Wide, |x| {
            Ok(vec![x.permute([1, 0, 2])?.logsumexp(&[0, 2], false)?])
        }),
        row("norm", float, acc, Sparse, |x| {
            Ok(vec![
                x.transpose(0, 2)?.norm(2.0, &[0], false)?,
                x.slice(1, .., 2)?.norm(3.0, &[-1, 0], true)?,
            ])
        }),
        row("all", all, 0.0, Sparse, |x| {
            Ok(vec![x.permute([2, 0, 1])?.all(&[1], false)?])
        }),
        row("any", all, 0.0, Sparse, |x| {
            Ok(vec![x.slice(2, .., 4)?.any(&[], true)?])
        }),
        row("cumsum", all, acc, Wide, |x| {
            Ok(vec![x.permute([2, 0, 1])?.cumsum(1)?])
        }),
        row("cumprod", all, acc, Narrow, |x| {
            Ok(vec![x.transpose(0, 1)?.cumprod(-1)?])
        }),
    ]
}
