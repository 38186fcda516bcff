//! Indexing ops: gather, scatter/scatter_add, index_select/embedding, index_add and one_hot.
//! Here: the ops, their shape rules and `OpDef` impls; the kernels, the lowerings (with their
//! device-side index checks) and the backward rules are in `cpu.rs`, `lower.rs` and `grad.rs`;
//! `embed.rs` composes select_scatter and slice_scatter from index_copy, `advanced.rs` advanced
//! indexing (`index`) from index_select.

mod advanced;
mod bag;
mod cpu;
mod embed;
mod grad;
mod lower;

pub(crate) use advanced::{index, index_put};
pub use bag::{BagMode, BagOptions, embedding_bag};
pub(crate) use embed::{select_scatter, slice_scatter};

use tpu_tensor::shape::resolve_dim;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Dims, Error, Result, Scalar, Tensor};

use super::MovementOps;
use super::args::{at_least_1d, need_index, need_same_dtype};
use crate::TensorOps;
use crate::hlo::checks::DeviceCheck;
use crate::hlo::{FnBuilder, Value};
use crate::op::{Meta, OpDef, op_parts};

/// Checks that `index` fits `x` (same rank; no larger except along `dim`, and no larger than
/// `src` anywhere when given); returns the resolved dim.
fn check_index_shape(
    op: &str,
    dim: i64,
    x: &Meta,
    index: &Meta,
    src: Option<&Meta>,
) -> Result<usize> {
    let d = resolve_dim(op, dim, &x.shape)?;
    let (xs, is) = (at_least_1d(&x.shape), at_least_1d(&index.shape));
    if xs.len() != is.len() {
        return Err(Error::shape(
            op,
            format!(
                "index of shape {} must have as many dims as the input of shape {}",
                fmt_shape(&index.shape),
                fmt_shape(&x.shape)
            ),
        ));
    }
    if let Some(k) = (0..xs.len()).find(|&k| k != d && is[k] > xs[k]) {
        return Err(Error::shape(
            op,
            format!(
                "index of shape {} is larger than the input of shape {} in dim {k} (only dim {d} may be larger)",
                fmt_shape(&index.shape),
                fmt_shape(&x.shape)
            ),
        ));
    }
    if let Some(s) = src {
        let ss = at_least_1d(&s.shape);
        if ss.len() != is.len() || is.iter().zip(&ss).any(|(i, s)| i > s) {
            return Err(Error::shape(
                op,
                format!(
                    "index of shape {} is larger than src of shape {}",
                    fmt_shape(&index.shape),
                    fmt_shape(&s.shape)
                ),
            ));
        }
    }
    Ok(d)
}

/// Checks a 1-D (or 0-dim) index for `x` along `dim`; returns the resolved dim.
fn check_vector_index(op: &str, dim: i64, x: &Meta, index: &Meta) -> Result<usize> {
    need_index(op, "index", index)?;
    if x.rank() == 0 {
        return Err(Error::shape(
            op,
            "expected an input with at least 1 dim, got shape []",
        ));
    }
    if index.rank() > 1 {
        return Err(Error::shape(
            op,
            format!(
                "expected a 1-D index, got shape {}",
                fmt_shape(&index.shape)
            ),
        ));
    }
    resolve_dim(op, dim, &x.shape)
}

/// The error for class `bad` at row-major position `i` of a one_hot input of `shape`.
fn one_hot_error(bad: i64, i: usize, c: usize, shape: &[usize]) -> Error {
    Error::invalid_argument(
        "one_hot",
        format!(
            "class values must lie in [0, {c}), got {bad} at element {i} of the input of shape {}",
            fmt_shape(shape)
        ),
    )
}

// ---- gather -------------------------------------------------------------------------------------

/// `torch.gather`: `out[i][j] = x[index[i][j]][j]` along `dim` (for dim 0 of a 2-D input).
#[derive(Clone, Debug)]
pub struct Gather {
    /// The dim indexed (negative counts from the end).
    pub dim: i64,
}

impl OpDef for Gather {
    fn name(&self) -> &'static str {
        "gather"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let (x, index) = (&inputs[0], &inputs[1]);
        need_index("gather", "index", index)?;
        check_index_shape("gather", self.dim, x, index, None)?;
        Ok(vec![Meta::new(&index.shape, x.dtype)])
    }

    op_parts! {
        cpu: cpu::gather,
        lower: lower::gather,
        lower_checks: lower::gather_checks,
        grad: grad::gather,
    }
}

// ---- scatter ------------------------------------------------------------------------------------

/// What a scatter does where an index points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScatterReduce {
    /// Replace the element (duplicates: the last update in row-major index order wins on the
    /// CPU; PyTorch leaves it unspecified).
    Replace,
    /// Add to the element.
    Add,
    /// Multiply the element.
    Prod,
    /// Keep the larger (NaN wins).
    Amax,
    /// Keep the smaller (NaN wins).
    Amin,
}

impl ScatterReduce {
    /// The value that leaves an element unchanged, in `dtype`: where the input is not included,
    /// the positions an index names start from it.
    fn identity(self, dtype: DType) -> Scalar {
        match self {
            ScatterReduce::Replace | ScatterReduce::Add => Scalar::Int(0),
            ScatterReduce::Prod => Scalar::Int(1),
            ScatterReduce::Amax => crate::hlo::lowest(dtype),
            ScatterReduce::Amin => crate::hlo::highest(dtype),
        }
    }
}

/// The `reduce` of `scatter_reduce`, as PyTorch's strings name it (`"sum".parse()` works).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScatterReduction {
    /// `"sum"`.
    Sum,
    /// `"prod"`.
    Prod,
    /// `"mean"`: the sum divided by how many values met (floor division for integers).
    Mean,
    /// `"amax"`.
    Amax,
    /// `"amin"`.
    Amin,
}

impl std::str::FromStr for ScatterReduction {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "sum" => ScatterReduction::Sum,
            "prod" => ScatterReduction::Prod,
            "mean" => ScatterReduction::Mean,
            "amax" => ScatterReduction::Amax,
            "amin" => ScatterReduction::Amin,
            other => {
                return Err(Error::invalid_argument(
                    "scatter_reduce",
                    format!("reduce must be one of sum, prod, mean, amax, amin, got {other:?}"),
                ));
            }
        })
    }
}

/// `torch.scatter_reduce`: the op for every reduction but mean, which divides the sum by how
/// many values met at each position (the input counting once when included; positions no
/// index names divide by 1), as PyTorch computes it.
pub(crate) fn scatter_reduce(
    x: &Tensor,
    dim: i64,
    index: &Tensor,
    src: &Tensor,
    reduce: ScatterReduction,
    include_self: bool,
) -> Result<Tensor> {
    let op = Scatter {
        dim,
        reduce: match reduce {
            ScatterReduction::Sum | ScatterReduction::Mean => ScatterReduce::Add,
            ScatterReduction::Prod => ScatterReduce::Prod,
            ScatterReduction::Amax => ScatterReduce::Amax,
            ScatterReduction::Amin => ScatterReduce::Amin,
        },
        value: false,
        include_self,
    };
    if reduce == ScatterReduction::Mean && x.dtype() == DType::Bool {
        return Err(Error::invalid_argument(
            "scatter_reduce",
            "reduce=\"mean\" needs a numeric input, got dtype bool",
        ));
    }
    let sum = crate::exec::dispatch::run1(&op, &[x, index, src])?;
    if reduce != ScatterReduction::Mean {
        return Ok(sum);
    }
    let (dtype, device) = (x.dtype(), x.device());
    let start = if include_self {
        Tensor::ones(x.shape(), dtype, device)?
    } else {
        Tensor::zeros(x.shape(), dtype, device)?
    };
    let count = start.scatter_add(dim, index, &Tensor::ones(index.shape(), dtype, device)?)?;
    let count = count.masked_fill(&count.eq(0)?, 1)?;
    if dtype.is_float() {
        sum.div(&count)
    } else {
        sum.div_floor(&count)
    }
}

/// `torch.scatter` / `scatter_add` / `scatter_reduce`: inputs `(x, index, src)`;
/// `x[index[i][j]][j] = src[i][j]` along `dim` (for dim 0 of a 2-D input), or combined with it
/// by `reduce`. With `value`, `src` is a 0-dim tensor used for every position. Without
/// `include_self`, the positions an index names start from the reduction's identity rather
/// than the input (PyTorch's `include_self=False`).
#[derive(Clone, Debug)]
pub struct Scatter {
    /// The dim indexed (negative counts from the end).
    pub dim: i64,
    /// Replace, or how to combine.
    pub reduce: ScatterReduce,
    /// `src` is a 0-dim value rather than a tensor of updates.
    pub value: bool,
    /// The input's values take part in the reduction where an index points.
    pub include_self: bool,
}

impl Scatter {
    fn op_name(&self) -> &'static str {
        match (self.reduce, self.include_self) {
            (ScatterReduce::Replace, _) => "scatter",
            (ScatterReduce::Add, true) => "scatter_add",
            _ => "scatter_reduce",
        }
    }

    /// Whether values are combined in f32 for 16-bit floats (anything but a plain replace).
    fn accumulates(&self) -> bool {
        self.reduce != ScatterReduce::Replace
    }
}

impl OpDef for Scatter {
    fn name(&self) -> &'static str {
        self.op_name()
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.op_name();
        let (x, index, src) = (&inputs[0], &inputs[1], &inputs[2]);
        need_index(op, "index", index)?;
        need_same_dtype(op, "src", x, src)?;
        let src = if self.value { None } else { Some(src) };
        check_index_shape(op, self.dim, x, index, src)?;
        Ok(vec![x.clone()])
    }

    op_parts! {
        cpu: cpu::scatter,
        lower: lower::scatter,
        lower_checks: lower::scatter_checks,
        grad: grad::scatter,
    }
}

// ---- index_select / embedding -------------------------------------------------------------------

/// `torch.index_select`: the slices of `x` along `dim` named by a 1-D index, in its order.
/// `embedding` is this op along dim 0 of the weight, under its own name, with an index of any
/// shape replacing that dim (so the result needs no reshape, which autograd would not see).
#[derive(Clone, Debug)]
pub struct IndexSelect {
    /// The dim indexed (negative counts from the end).
    pub dim: i64,
    /// Report errors as `embedding`, and take an index of any shape.
    pub embedding: bool,
}

impl IndexSelect {
    fn op_name(&self) -> &'static str {
        if self.embedding {
            "embedding"
        } else {
            "index_select"
        }
    }

    /// The result's shape with the index flattened to `n` elements: `x`'s with dim `d` set to
    /// `n`.
    fn flat_shape(&self, x: &[usize], d: usize, n: usize) -> Dims {
        let mut shape: Dims = x.into();
        shape[d] = n;
        shape
    }
}

impl OpDef for IndexSelect {
    fn name(&self) -> &'static str {
        self.op_name()
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let (x, index) = (&inputs[0], &inputs[1]);
        if self.embedding {
            // Any index shape: it takes the place of the indexed dim.
            let flat = Meta::new(&[index.numel()], index.dtype);
            let d = check_vector_index(self.op_name(), self.dim, x, &flat)?;
            let mut shape: Dims = x.shape[..d].into();
            shape.extend_from_slice(&index.shape);
            shape.extend_from_slice(&x.shape[d + 1..]);
            return Ok(vec![Meta::new(&shape, x.dtype)]);
        }
        let d = check_vector_index(self.op_name(), self.dim, x, index)?;
        Ok(vec![Meta::new(
            &self.flat_shape(&x.shape, d, index.numel()),
            x.dtype,
        )])
    }

    op_parts! {
        cpu: cpu::index_select,
        lower: lower::index_select,
        lower_checks: lower::index_select_checks,
        grad: grad::index_select,
    }
}

/// `F.embedding`: rows of the 2-D `weight` named by `indices` (any shape, i64); the result has
/// shape `indices.shape + [weight.shape[1]]`.
pub fn embedding(indices: &Tensor, weight: &Tensor) -> Result<Tensor> {
    tpu_tensor::tpu_runtime::error::check_rank("embedding", "weight", weight.shape(), 2)?;
    crate::exec::dispatch::run1(
        &IndexSelect {
            dim: 0,
            embedding: true,
        },
        &[weight, indices],
    )
}

// ---- index_add ----------------------------------------------------------------------------------

/// `torch.index_add`: inputs `(x, index, source)`; adds `alpha * source[.., i, ..]` to
/// `x[.., index[i], ..]` along `dim`, accumulating duplicates.
#[derive(Clone, Debug)]
pub struct IndexAdd {
    /// The dim indexed (negative counts from the end).
    pub dim: i64,
    /// The factor applied to `source` (truncated to an integer for integer tensors).
    pub alpha: Scalar,
}

impl OpDef for IndexAdd {
    fn name(&self) -> &'static str {
        "index_add"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let (x, index, src) = (&inputs[0], &inputs[1], &inputs[2]);
        check_source("index_add", self.dim, x, index, src)?;
        Ok(vec![x.clone()])
    }

    op_parts! {
        cpu: cpu::index_add,
        lower: lower::index_add,
        lower_checks: lower::index_add_checks,
        grad: grad::index_add,
    }
}

// ---- index_copy ---------------------------------------------------------------------------------

/// `torch.index_copy`: inputs `(x, index, source)`; writes `source[.., i, ..]` into
/// `x[.., index[i], ..]` along `dim` (of duplicate indices, the last one's slice stays). What a
/// preallocated KV cache needs to store new positions: on a PJRT device it is one scatter of
/// whole slices, in place when `x`'s buffer is donated.
#[derive(Clone, Debug)]
pub struct IndexCopy {
    /// The dim indexed (negative counts from the end).
    pub dim: i64,
}

impl OpDef for IndexCopy {
    fn name(&self) -> &'static str {
        "index_copy"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let (x, index, src) = (&inputs[0], &inputs[1], &inputs[2]);
        check_source("index_copy", self.dim, x, index, src)?;
        Ok(vec![x.clone()])
    }

    op_parts! {
        cpu: cpu::index_copy,
        lower: lower::index_copy,
        lower_checks: lower::index_copy_checks,
        grad: grad::index_copy,
    }
}

/// Checks `index` and the `source` of an index_add or index_copy into `x` along `dim`.
fn check_source(op: &str, dim: i64, x: &Meta, index: &Meta, src: &Meta) -> Result<()> {
    let d = check_vector_index(op, dim, x, index)?;
    need_same_dtype(op, "source", x, src)?;
    let mut want = x.shape.clone();
    want[d] = index.numel();
    if src.shape != want {
        return Err(Error::shape(
            op,
            format!(
                "expected source of shape {} (the input's shape {} with dim {d} the index's length {}), got {}",
                fmt_shape(&want),
                fmt_shape(&x.shape),
                index.numel(),
                fmt_shape(&src.shape)
            ),
        ));
    }
    Ok(())
}

// ---- one_hot ------------------------------------------------------------------------------------

/// `F.one_hot`: i64 class indices to i64 rows of `num_classes` with a 1 at the class.
#[derive(Clone, Debug)]
pub struct OneHot {
    /// Row length.
    pub num_classes: usize,
}

impl OpDef for OneHot {
    fn name(&self) -> &'static str {
        "one_hot"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = &inputs[0];
        need_index("one_hot", "input", x)?;
        let mut shape = x.shape.clone();
        shape.push(self.num_classes);
        tpu_tensor::shape::checked_numel("one_hot", &shape)?;
        Ok(vec![Meta::new(&shape, DType::I64)])
    }

    op_parts! {
        cpu: cpu::one_hot,
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        lower::one_hot(b, inputs, outputs)
    }

    fn lower_checks(
        &self,
        b: &mut FnBuilder,
        inputs: &[Value],
        _outputs: &[Meta],
    ) -> Result<Vec<DeviceCheck>> {
        lower::one_hot_checks(self, b, inputs)
    }
}
