//! `F.embedding_bag` (Core ATen's `_embedding_bag`): the rows of a table gathered per bag and
//! combined by sum, mean or max, as a composition of `embedding`, `index_add` and
//! `scatter_reduce`, so it runs on every device and carries their backward rules.
//!
//! The bag of each index is worked out on the host from the offsets (which are read back and
//! checked, as PyTorch's CPU kernel does); the indices and the table stay on their device.
//! Indices equal to `padding_idx`, and those past the last offset when it is included, go to
//! one extra bag that is dropped, so they take part in no sum, mean, count or max.

use tpu_tensor::tpu_runtime::error::{check_rank, fmt_shape};
use tpu_tensor::{DType, Device, Error, Result, Tensor};

use super::{ScatterReduction, embedding};
use crate::TensorOps;
use crate::ops::movement::MovementOps;

const OP: &str = "embedding_bag";

/// How `embedding_bag` combines the rows of a bag (PyTorch's `mode` strings parse into it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BagMode {
    /// `"sum"`: the rows added, each scaled by its per-sample weight when given.
    Sum,
    /// `"mean"`: the sum divided by the bag's size (PyTorch's default).
    #[default]
    Mean,
    /// `"max"`: the largest value per column.
    Max,
}

impl std::str::FromStr for BagMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "sum" => Ok(BagMode::Sum),
            "mean" => Ok(BagMode::Mean),
            "max" => Ok(BagMode::Max),
            other => Err(Error::invalid_argument(
                OP,
                format!("mode must be one of sum, mean, max, got {other:?}"),
            )),
        }
    }
}

/// The arguments of `embedding_bag` beyond the indices and the table, PyTorch's defaults
/// first (`BagOptions::default()` is `mode="mean"`, no offsets).
#[derive(Clone, Debug, Default)]
pub struct BagOptions {
    /// How the rows of a bag combine.
    pub mode: BagMode,
    /// For 1-D indices: where each bag starts (i64, 1-D, the first 0, non-decreasing).
    pub offsets: Option<Tensor>,
    /// For `mode` sum: one factor per index, of the table's dtype and the indices' shape.
    pub per_sample_weights: Option<Tensor>,
    /// The offsets end with the end of the last bag (CSR style), so there is one bag fewer.
    pub include_last_offset: bool,
    /// Indices equal to this row (negative counts from the end) are left out of their bag.
    pub padding_idx: Option<i64>,
}

/// `F.embedding_bag(indices, weight, offsets, mode=..., per_sample_weights=...,
/// include_last_offset=..., padding_idx=...)`: one row per bag, `[bags, weight.shape[1]]`.
/// 2-D indices are one bag per row (no offsets); 1-D indices are cut into bags at the offsets.
/// Empty bags, and bags of padding only, give zeros. In max mode, equal maxima share the
/// gradient evenly (PyTorch gives it all to one of them; the sum over a row is the same when
/// the tied values come from one row of the table).
pub fn embedding_bag(indices: &Tensor, weight: &Tensor, opts: &BagOptions) -> Result<Tensor> {
    check_rank(OP, "weight", weight.shape(), 2)?;
    if !weight.dtype().is_float() {
        return Err(Error::invalid_argument(
            OP,
            format!(
                "expected a floating-point weight, got dtype {}",
                weight.dtype()
            ),
        ));
    }
    if indices.dtype() != DType::I64 {
        return Err(Error::invalid_argument(
            OP,
            format!("expected indices of dtype i64, got {}", indices.dtype()),
        ));
    }
    let (rows, dim) = (weight.shape()[0], weight.shape()[1]);
    let n = indices.numel();
    let (bag_of, bags) = bag_ids(indices, opts)?;
    let device = weight.device();
    let mut bag_of = Tensor::from_vec(bag_of, [n], &Device::cpu())?.to_device(device)?;
    let flat = indices.reshape([n])?;
    if let Some(p) = opts.padding_idx {
        let p = padding_row(p, rows)?;
        bag_of = bag_of.masked_fill(&flat.eq(p)?, bags as i64)?;
    }
    let mut gathered = embedding(&flat, weight)?;
    if let Some(w) = &opts.per_sample_weights {
        gathered = gathered.mul(&sample_weights(w, indices, weight, opts.mode)?.unsqueeze(1)?)?;
    }
    // One more bag than asked for: it collects what belongs to no bag, and is cut off.
    let zeros = Tensor::zeros([bags + 1, dim], weight.dtype(), device)?;
    let out = match opts.mode {
        BagMode::Sum => zeros.index_add(0, &bag_of, &gathered, 1)?,
        BagMode::Mean => {
            let sum = zeros.index_add(0, &bag_of, &gathered, 1)?;
            let ones = Tensor::ones([n], weight.dtype(), device)?;
            let count = Tensor::zeros([bags + 1], weight.dtype(), device)?
                .index_add(0, &bag_of, &ones, 1)?;
            let count = count.masked_fill(&count.eq(0)?, 1)?;
            sum.div(&count.unsqueeze(1)?)?
        }
        BagMode::Max => {
            let index = bag_of.unsqueeze(1)?.expand([n, dim])?;
            zeros.scatter_reduce(0, &index, &gathered, ScatterReduction::Amax, false)?
        }
    };
    out.narrow(0, 0, bags)
}

/// The bag of every index (row-major) and the number of bags, from the indices' shape and the
/// offsets; indices past the last offset (when it is included) get bag `bags`.
fn bag_ids(indices: &Tensor, opts: &BagOptions) -> Result<(Vec<i64>, usize)> {
    let n = indices.numel();
    match (indices.rank(), &opts.offsets) {
        (2, None) => {
            let (b, per) = (indices.shape()[0], indices.shape()[1]);
            let ids = (0..b).flat_map(|i| std::iter::repeat_n(i as i64, per));
            Ok((ids.collect(), b))
        }
        (2, Some(_)) => Err(Error::invalid_argument(
            OP,
            "expected no offsets with 2-D indices (each row is a bag)",
        )),
        (1, None) => Err(Error::invalid_argument(
            OP,
            "expected offsets with 1-D indices (where each bag starts)",
        )),
        (1, Some(offsets)) => {
            let starts = read_offsets(offsets, n)?;
            let bags = if opts.include_last_offset {
                if starts.len() < 2 {
                    return Err(Error::invalid_argument(
                        OP,
                        format!(
                            "include_last_offset needs at least 2 offsets (a start and an end), got {}",
                            starts.len()
                        ),
                    ));
                }
                starts.len() - 1
            } else {
                starts.len()
            };
            let mut ids = vec![bags as i64; n];
            for b in 0..bags {
                let end = starts.get(b + 1).map_or(n, |&e| e as usize);
                ids[starts[b] as usize..end].fill(b as i64);
            }
            Ok((ids, bags))
        }
        (r, _) => Err(Error::shape(
            OP,
            format!(
                "expected 1-D or 2-D indices, got rank {r} (shape {})",
                fmt_shape(indices.shape())
            ),
        )),
    }
}

/// The offsets on the host, checked: 1-D i64, starting at 0, non-decreasing, within `n`.
fn read_offsets(offsets: &Tensor, n: usize) -> Result<Vec<i64>> {
    check_rank(OP, "offsets", offsets.shape(), 1)?;
    if offsets.dtype() != DType::I64 {
        return Err(Error::invalid_argument(
            OP,
            format!("expected offsets of dtype i64, got {}", offsets.dtype()),
        ));
    }
    let v = offsets.to_device(&Device::cpu())?.to_vec::<i64>()?;
    if v.first().is_some_and(|&f| f != 0) {
        return Err(Error::invalid_argument(
            OP,
            format!("expected offsets[0] to be 0, got {}", v[0]),
        ));
    }
    if let Some(w) = v.windows(2).find(|w| w[1] < w[0]) {
        return Err(Error::invalid_argument(
            OP,
            format!(
                "expected non-decreasing offsets, got {} after {}",
                w[1], w[0]
            ),
        ));
    }
    if let Some(&last) = v.last()
        && last as usize > n
    {
        return Err(Error::invalid_argument(
            OP,
            format!("expected offsets no larger than the number of indices {n}, got {last}"),
        ));
    }
    Ok(v)
}

/// `padding_idx` as a row of a table of `rows` rows.
fn padding_row(p: i64, rows: usize) -> Result<i64> {
    let r = rows as i64;
    if p < -r || p >= r {
        return Err(Error::invalid_argument(
            OP,
            format!("expected padding_idx in [{}, {}), got {p}", -r, r),
        ));
    }
    Ok(if p < 0 { p + r } else { p })
}

/// The per-sample weights, checked, flattened like the indices.
fn sample_weights(w: &Tensor, indices: &Tensor, weight: &Tensor, mode: BagMode) -> Result<Tensor> {
    if mode != BagMode::Sum {
        return Err(Error::invalid_argument(
            OP,
            format!("per_sample_weights are only supported for mode sum, got mode {mode:?}"),
        ));
    }
    if w.shape() != indices.shape() {
        return Err(Error::shape(
            OP,
            format!(
                "expected per_sample_weights of the indices' shape {}, got {}",
                fmt_shape(indices.shape()),
                fmt_shape(w.shape())
            ),
        ));
    }
    if w.dtype() != weight.dtype() {
        return Err(Error::invalid_argument(
            OP,
            format!(
                "expected per_sample_weights of the weight's dtype {}, got {}",
                weight.dtype(),
                w.dtype()
            ),
        ));
    }
    w.reshape([indices.numel()])
}
