//! Data movement that materialises (cat, stack, pad, gather, scatter, index ops, masks,
//! tril/triu, repeat, flip, roll, topk, sort).
//!
//! Most of these ops only move elements, so their CPU kernels are written once per element size
//! (1, 2, 4 or 8 bytes, carried as `u8`, `f16`, `i32` and `i64`) instead of once per dtype; only
//! the ops that compare or combine values (sort, topk, scatter_add/scatter_reduce, index_add)
//! look at the dtype.
//!
//! Index tensors are i64. Out-of-range indices are errors, naming the index, the dim and the
//! shape: on the native CPU device in the kernels, on PJRT devices through the ops'
//! `lower_checks` while device checks are on (see [`crate::hlo::checks`]); with them off, XLA clamps
//! gather indices and drops out-of-range scatter updates.
//!
//! scatter_add, scatter_reduce and index_add combine f16 and bf16 in f32 and round once per
//! element, as PyTorch's CPU scatter_add does (PyTorch's index_add on a 1-D f16/bf16 tensor rounds after
//! every addition instead). Sorts are always stable, and topk breaks ties by lower index (PyTorch's
//! CPU topk picks among equal values in an order of its own).
//!
//! Backward rules follow PyTorch's formulas and are written with this family's ops (and sums), so
//! they run on the device the forward ran on. Gradients of index tensors and masks are `None`.
//! Where a scatter's `src` is larger than its index, the positions of `src` that no index reads
//! get a zero gradient (PyTorch's rule returns an index-shaped gradient there and fails).
//!
//! Layout: one sub-family per file or folder, each holding its ops' shape rules, kernels,
//! lowerings and backward rules: `join` (cat, stack, repeat/tile), `pad`, `index` (gather,
//! scatter and scatter_reduce (sum, prod, amax, amin; mean divides the sum by a scatter_add
//! of ones), index_select/embedding, embedding_bag (composed in `bag`), index_add, index_copy, one_hot, and select_scatter and
//! slice_scatter composed from index_copy; a folder: `mod`/`cpu`/`lower`/`grad`/`embed`),
//! `mask` (masked_fill, tril/triu), `order` (flip, roll, sort/argsort/topk), `select`
//! (nonzero and masked_scatter). `args`, `cpu`,
//! `lower` and `grad` hold the pieces several sub-families share; `table` the op table's rows;
//! `view` the autograd view ops. This file: the public names and the [`MovementOps`] methods.

mod args;
mod cpu;
pub(crate) mod grad;
mod index;
mod join;
mod lower;
mod mask;
mod order;
mod pad;
mod select;
mod table;
pub mod view;

pub use index::{
    BagMode, BagOptions, Gather, IndexAdd, IndexCopy, IndexSelect, OneHot, Scatter, ScatterReduce,
    ScatterReduction, embedding, embedding_bag,
};
pub use join::{Cat, Repeat, Stack, cat, stack};
pub use mask::{MaskedFill, Tri};
pub use order::{Flip, Roll, Sort};
pub use pad::{Pad, PadMode};
pub use table::table;

use tpu_tensor::{Device, Dim, Error, Result, Scalar, Tensor};

use crate::op::{Meta, OpDef};
use args::{check_fill, need_index};

/// Runs a two-output op (sort, topk) and splits its outputs.
fn run2(op: &dyn OpDef, inputs: &[&Tensor]) -> Result<(Tensor, Tensor)> {
    let mut out = crate::exec::dispatch::run(op, inputs)?;
    if out.len() != 2 {
        return Err(Error::internal(op.name(), "expected two outputs"));
    }
    let b = out.remove(1);
    Ok((out.remove(0), b))
}

// ---- methods ------------------------------------------------------------------------------------

/// This family's ops as methods on `Tensor`, with PyTorch's names and semantics. Index tensors
/// are i64.
pub trait MovementOps {
    /// `F.pad`: `pads` are (before, after) pairs starting from the last dim.
    fn pad(&self, pads: &[usize], mode: PadMode) -> Result<Tensor>;
    /// `torch.constant_pad_nd`: [`MovementOps::pad`] with `value`, where a negative amount
    /// crops; always a new tensor.
    fn constant_pad_nd(&self, pads: &[i64], value: impl Into<Scalar>) -> Result<Tensor>;
    /// `torch.gather` along `dim` (indices must lie in `[0, size)`).
    fn gather(&self, dim: impl Dim, index: &Tensor) -> Result<Tensor>;
    /// `torch.scatter` of a tensor of updates along `dim`.
    fn scatter(&self, dim: impl Dim, index: &Tensor, src: &Tensor) -> Result<Tensor>;
    /// `torch.scatter` of one value along `dim`.
    fn scatter_value(
        &self,
        dim: impl Dim,
        index: &Tensor,
        value: impl Into<Scalar>,
    ) -> Result<Tensor>;
    /// `torch.scatter_add` along `dim`; duplicate indices accumulate.
    fn scatter_add(&self, dim: impl Dim, index: &Tensor, src: &Tensor) -> Result<Tensor>;
    /// `torch.scatter_reduce` along `dim`: each element of `src` combined into the position its
    /// index names by `reduce`; with `include_self` false, the input's values at those
    /// positions take no part (they start from the reduction's identity). f16/bf16 combine in
    /// f32 and round once.
    fn scatter_reduce(
        &self,
        dim: impl Dim,
        index: &Tensor,
        src: &Tensor,
        reduce: ScatterReduction,
        include_self: bool,
    ) -> Result<Tensor>;
    /// Advanced indexing, `x[i, :, j]` (ATen's `index.Tensor`): one optional index tensor per
    /// leading dim (`None` keeps it whole); integer indices broadcast together, bool masks
    /// select their true positions. See [`crate::ops::movement`]'s `index/advanced.rs`.
    fn index(&self, indices: &[Option<&Tensor>]) -> Result<Tensor>;
    /// `torch.index_put` (what `x[i, :, j] = v` does, without changing `x`): a copy with
    /// `values`, broadcast to the shape [`MovementOps::index`] gives, written at the indexed
    /// positions, or added to them with `accumulate` (where repeated positions add up).
    fn index_put(
        &self,
        indices: &[Option<&Tensor>],
        values: &Tensor,
        accumulate: bool,
    ) -> Result<Tensor>;
    /// `torch.index_select` with a 1-D index.
    fn index_select(&self, dim: impl Dim, index: &Tensor) -> Result<Tensor>;
    /// `torch.index_add`: adds `alpha * source` at the slices `index` names along `dim`.
    fn index_add(
        &self,
        dim: impl Dim,
        index: &Tensor,
        source: &Tensor,
        alpha: impl Into<Scalar>,
    ) -> Result<Tensor>;
    /// `torch.index_copy`: `source`'s slices written at the slices `index` names along `dim`.
    fn index_copy(&self, dim: impl Dim, index: &Tensor, source: &Tensor) -> Result<Tensor>;
    /// `torch.select_scatter`: a copy with `src` written at `index` along `dim` (`src` has the
    /// shape of that slice).
    fn select_scatter(&self, src: &Tensor, dim: impl Dim, index: i64) -> Result<Tensor>;
    /// `torch.slice_scatter`: a copy with `src` written over `[start:end:step]` along `dim`
    /// (Python's slice bounds; `src` has the slice's shape).
    fn slice_scatter(
        &self,
        src: &Tensor,
        dim: impl Dim,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
    ) -> Result<Tensor>;
    /// `torch.masked_fill` with a bool mask (broadcast).
    fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor>;
    /// `Tensor.masked_scatter`: where the bool `mask` (broadcast) is true, `source`'s elements
    /// in order. Stays on the device; gradients reach both tensors.
    fn masked_scatter(&self, mask: &Tensor, source: &Tensor) -> Result<Tensor>;
    /// `torch.nonzero`: the i64 indices `[count, rank]` of the non-zero elements, row-major.
    /// The count depends on the data: on PJRT devices the tensor is read back to the host once
    /// (a bool per element) and the indices go back to the device.
    fn nonzero(&self) -> Result<Tensor>;
    /// `F.one_hot` of an i64 tensor; `num_classes = -1` uses the largest value plus one (read
    /// back to the host on PJRT devices).
    fn one_hot(&self, num_classes: i64) -> Result<Tensor>;
    /// `torch.tril`: zeroes elements above the `diagonal`-th diagonal.
    fn tril(&self, diagonal: i64) -> Result<Tensor>;
    /// `torch.triu`: zeroes elements below the `diagonal`-th diagonal.
    fn triu(&self, diagonal: i64) -> Result<Tensor>;
    /// `Tensor.repeat`: tiles `sizes[i]` times along dim `i` (at least one size per dim).
    fn repeat(&self, sizes: &[usize]) -> Result<Tensor>;
    /// `torch.tile`: like `repeat`, with missing leading repetitions taken as 1.
    fn tile(&self, reps: &[usize]) -> Result<Tensor>;
    /// `torch.flip`: reverses `dims`.
    fn flip(&self, dims: &[i64]) -> Result<Tensor>;
    /// `torch.roll` by `shifts` along `dims` (empty `dims`: the flattened tensor).
    fn roll(&self, shifts: &[i64], dims: &[i64]) -> Result<Tensor>;
    /// `torch.topk`: the `k` largest (or smallest) along `dim` and their i64 indices, always in
    /// sorted order; ties go to the lower index.
    fn topk(
        &self,
        k: usize,
        dim: impl Dim,
        largest: bool,
        sorted: bool,
    ) -> Result<(Tensor, Tensor)>;
    /// `torch.sort` along `dim`: sorted values and i64 indices. The sort is always stable, which
    /// is a valid result for `stable = false` too; NaN counts as the largest value.
    fn sort(&self, dim: impl Dim, descending: bool, stable: bool) -> Result<(Tensor, Tensor)>;
    /// `torch.argsort`: the indices of [`MovementOps::sort`].
    fn argsort(&self, dim: impl Dim, descending: bool, stable: bool) -> Result<Tensor>;
}

impl MovementOps for Tensor {
    fn pad(&self, pads: &[usize], mode: PadMode) -> Result<Tensor> {
        let op = Pad {
            pads: pads.to_vec(),
            mode,
        };
        crate::exec::dispatch::run1(&op, &[self])
    }

    fn constant_pad_nd(&self, pads: &[i64], value: impl Into<Scalar>) -> Result<Tensor> {
        pad::constant_pad_nd(self, pads, value.into())
    }

    fn gather(&self, dim: impl Dim, index: &Tensor) -> Result<Tensor> {
        crate::exec::dispatch::run1(&Gather { dim: dim.to_i64() }, &[self, index])
    }

    fn scatter(&self, dim: impl Dim, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        run_scatter(
            self,
            dim.to_i64(),
            ScatterReduce::Replace,
            false,
            index,
            src,
        )
    }

    fn scatter_value(
        &self,
        dim: impl Dim,
        index: &Tensor,
        value: impl Into<Scalar>,
    ) -> Result<Tensor> {
        let value = value.into();
        check_fill("scatter", value, self.dtype())?;
        let v = Tensor::full([0usize; 0], value, self.dtype(), self.device())?;
        run_scatter(self, dim.to_i64(), ScatterReduce::Replace, true, index, &v)
    }

    fn scatter_add(&self, dim: impl Dim, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        run_scatter(self, dim.to_i64(), ScatterReduce::Add, false, index, src)
    }

    fn scatter_reduce(
        &self,
        dim: impl Dim,
        index: &Tensor,
        src: &Tensor,
        reduce: ScatterReduction,
        include_self: bool,
    ) -> Result<Tensor> {
        index::scatter_reduce(self, dim.to_i64(), index, src, reduce, include_self)
    }

    fn index_select(&self, dim: impl Dim, index: &Tensor) -> Result<Tensor> {
        let op = IndexSelect {
            dim: dim.to_i64(),
            embedding: false,
        };
        crate::exec::dispatch::run1(&op, &[self, index])
    }

    fn index_add(
        &self,
        dim: impl Dim,
        index: &Tensor,
        source: &Tensor,
        alpha: impl Into<Scalar>,
    ) -> Result<Tensor> {
        let op = IndexAdd {
            dim: dim.to_i64(),
            alpha: alpha.into(),
        };
        crate::exec::dispatch::run1(&op, &[self, index, source])
    }

    fn index_copy(&self, dim: impl Dim, index: &Tensor, source: &Tensor) -> Result<Tensor> {
        let op = IndexCopy { dim: dim.to_i64() };
        crate::exec::dispatch::run1(&op, &[self, index, source])
    }

    fn index(&self, indices: &[Option<&Tensor>]) -> Result<Tensor> {
        index::index(self, indices)
    }

    fn index_put(
        &self,
        indices: &[Option<&Tensor>],
        values: &Tensor,
        accumulate: bool,
    ) -> Result<Tensor> {
        index::index_put(self, indices, values, accumulate)
    }

    fn masked_scatter(&self, mask: &Tensor, source: &Tensor) -> Result<Tensor> {
        select::masked_scatter(self, mask, source)
    }

    fn nonzero(&self) -> Result<Tensor> {
        select::nonzero(self)
    }

    fn select_scatter(&self, src: &Tensor, dim: impl Dim, index: i64) -> Result<Tensor> {
        index::select_scatter(self, src, dim, index)
    }

    fn slice_scatter(
        &self,
        src: &Tensor,
        dim: impl Dim,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
    ) -> Result<Tensor> {
        index::slice_scatter(self, src, dim, start, end, step)
    }

    fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let op = MaskedFill {
            value: value.into(),
        };
        crate::exec::dispatch::run1(&op, &[self, mask])
    }

    fn one_hot(&self, num_classes: i64) -> Result<Tensor> {
        need_index("one_hot", "input", &Meta::of(self))?;
        let c = match num_classes {
            -1 => {
                let v = self
                    .to_device(&Device::cpu())?
                    .contiguous()?
                    .to_vec::<i64>()?;
                let max = v.iter().copied().max().ok_or_else(|| {
                    Error::invalid_argument(
                        "one_hot",
                        "cannot infer the number of classes (-1) from an empty tensor",
                    )
                })?;
                usize::try_from(max.saturating_add(1)).unwrap_or(0)
            }
            c if c >= 0 => c as usize,
            c => {
                return Err(Error::invalid_argument(
                    "one_hot",
                    format!("num_classes must be -1 or at least 0, got {c}"),
                ));
            }
        };
        crate::exec::dispatch::run1(&OneHot { num_classes: c }, &[self])
    }

    fn tril(&self, diagonal: i64) -> Result<Tensor> {
        let op = Tri {
            upper: false,
            diagonal,
        };
        crate::exec::dispatch::run1(&op, &[self])
    }

    fn triu(&self, diagonal: i64) -> Result<Tensor> {
        let op = Tri {
            upper: true,
            diagonal,
        };
        crate::exec::dispatch::run1(&op, &[self])
    }

    fn repeat(&self, sizes: &[usize]) -> Result<Tensor> {
        let op = Repeat {
            sizes: sizes.to_vec(),
        };
        crate::exec::dispatch::run1(&op, &[self])
    }

    fn tile(&self, reps: &[usize]) -> Result<Tensor> {
        let mut sizes = vec![1; self.rank().saturating_sub(reps.len())];
        sizes.extend_from_slice(reps);
        self.repeat(&sizes)
    }

    fn flip(&self, dims: &[i64]) -> Result<Tensor> {
        let op = Flip {
            dims: dims.to_vec(),
        };
        crate::exec::dispatch::run1(&op, &[self])
    }

    fn roll(&self, shifts: &[i64], dims: &[i64]) -> Result<Tensor> {
        let op = Roll {
            shifts: shifts.to_vec(),
            dims: dims.to_vec(),
        };
        crate::exec::dispatch::run1(&op, &[self])
    }

    fn topk(
        &self,
        k: usize,
        dim: impl Dim,
        largest: bool,
        _sorted: bool,
    ) -> Result<(Tensor, Tensor)> {
        let op = Sort {
            dim: dim.to_i64(),
            descending: largest,
            k: Some(k),
        };
        run2(&op, &[self])
    }

    fn sort(&self, dim: impl Dim, descending: bool, _stable: bool) -> Result<(Tensor, Tensor)> {
        let op = Sort {
            dim: dim.to_i64(),
            descending,
            k: None,
        };
        run2(&op, &[self])
    }

    fn argsort(&self, dim: impl Dim, descending: bool, stable: bool) -> Result<Tensor> {
        Ok(self.sort(dim, descending, stable)?.1)
    }
}

/// Runs `scatter` (`value` when `src` is a 0-dim fill value rather than a tensor of sources).
fn run_scatter(
    x: &Tensor,
    dim: i64,
    reduce: ScatterReduce,
    value: bool,
    index: &Tensor,
    src: &Tensor,
) -> Result<Tensor> {
    let op = Scatter {
        dim,
        reduce,
        value,
        include_self: true,
    };
    crate::exec::dispatch::run1(&op, &[x, index, src])
}
