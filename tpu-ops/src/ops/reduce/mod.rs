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
//! [`crate::cpu::kernels::PAR_THRESHOLD`].
//!
//! Files: `shape.rs` (shape and dtype rules), `cpu.rs` (the kernels), `cpu_fold.rs` (their
//! layout and split over the pool), `lower.rs` (StableHLO), `grad.rs` (backward rules),
//! `table.rs` (the op table's rows).

mod cpu;
mod cpu_fold;
mod grad;
mod lower;
mod shape;
mod table;

pub use table::table;

use tpu_tensor::shape::resolve_dim_in;
use tpu_tensor::{DType, Error, Result, Tensor};

use self::shape::{
    check_dtype, check_nonempty, one_input, reduce_mask, reduced_shape, single_mask, sum_dtype,
    wide,
};
use crate::autograd::Saved;
use crate::hlo::{FnBuilder, Value};
use crate::op::promote::{compute_dtype, float_result};
use crate::op::{DTypeSet, Meta, OpDef, op_parts};

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

    op_parts! {
        cpu: cpu::reduce,
        lower: lower::reduce,
        grad: grad::reduce, has_backward: |op| op.kind.differentiable(),
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

    // max/min with values route the gradient to the returned index; argmax/argmin output only
    // integers and have none.
    op_parts! {
        cpu: cpu::arg_reduce,
        lower: lower::arg_reduce,
        grad: grad::arg_reduce, has_backward: |op| op.with_values,
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
        grad::extreme_all(saved, grads)
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

    op_parts! {
        cpu: cpu::scan,
        lower: lower::scan,
        grad: grad::scan,
    }
}

/// Runs a reduction.
pub fn reduce(x: &Tensor, kind: ReduceKind, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    if let Some(r) = cpu::small_dense_f32(x, kind, dims, keepdim) {
        return r;
    }
    crate::exec::dispatch::run1(
        &Reduce {
            kind,
            dims: dims.to_vec(),
            keepdim,
        },
        &[x],
    )
}

/// `max()` or `min()` of every element: [`ExtremeAll`], whose kernel is the reduction's
/// over every dim, so the small-tensor path of that reduction gives its bits too.
fn extreme_all(x: &Tensor, max: bool) -> Result<Tensor> {
    let op = ExtremeAll { max };
    if let Some(r) = cpu::small_dense_f32(x, op.reduce().kind, &[], false) {
        return r;
    }
    crate::exec::dispatch::run1(&op, &[x])
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
        _ => Err(Error::internal(op.name(), "expected values and indices")),
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
        extreme_all(self, true)
    }
    fn min_all(&self) -> Result<Tensor> {
        extreme_all(self, false)
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
