//! Views: new shapes and strides over the same storage, copying nothing.
//!
//! Every bad dim, size or index is an error that names the tensor's shape.

use std::ops::{Bound, RangeBounds};

use tpu_runtime::error::fmt_shape;
use tpu_runtime::{Error, Result};

use crate::shape::{
    Dim, Dims, IntoShape, checked_numel, exact_shape, infer_shape, resolve_dim, resolve_dim_in,
    view_strides,
};
use crate::tensor::{Layout, Tensor};

impl Tensor {
    /// `view`: a view with a new shape (one size may be `-1`), failing when the strides do not
    /// allow one, as PyTorch's `view` does.
    pub fn view(&self, shape: impl IntoShape) -> Result<Tensor> {
        let new_shape = infer_shape("view", shape, self.numel(), self.shape())?;
        self.derive(|l| match view_strides(&l.shape, &l.strides, &new_shape) {
            Some(strides) => Ok(Layout {
                shape: new_shape.clone(),
                strides,
                offset: l.offset,
            }),
            None => Err(Error::shape(
                "view",
                format!(
                    "a tensor of shape {} with strides {:?} cannot be viewed as {} without a copy; use reshape",
                    fmt_shape(&l.shape),
                    &l.strides[..],
                    fmt_shape(&new_shape)
                ),
            )),
        })
    }

    /// A tensor with a new shape (one size may be `-1`): a view when the strides allow one,
    /// otherwise a contiguous copy, as PyTorch's `reshape`.
    pub fn reshape(&self, shape: impl IntoShape) -> Result<Tensor> {
        let new_shape = infer_shape("reshape", shape, self.numel(), self.shape())?;
        if view_strides(self.shape(), self.strides(), &new_shape).is_some() {
            self.view(&new_shape)
        } else {
            self.copy()?.view(&new_shape)
        }
    }

    /// Swaps two dims.
    pub fn transpose(&self, dim0: impl Dim, dim1: impl Dim) -> Result<Tensor> {
        let a = resolve_dim("transpose", dim0, self.shape())?;
        let b = resolve_dim("transpose", dim1, self.shape())?;
        if self.rank() == 0 {
            return Ok(self.clone());
        }
        self.derive(|l| {
            let mut l = l.clone();
            l.shape.swap(a, b);
            l.strides.swap(a, b);
            Ok(l)
        })
    }

    /// The transpose of a tensor of at most 2 dims, as PyTorch's `t()`.
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() > 2 {
            return Err(Error::shape(
                "t",
                format!(
                    "expected a tensor of at most 2 dims, got shape {}; use transpose or permute",
                    fmt_shape(self.shape())
                ),
            ));
        }
        if self.rank() < 2 {
            return Ok(self.clone());
        }
        self.transpose(0, 1)
    }

    /// Reorders the dims: output dim `i` is input dim `dims[i]`.
    pub fn permute(&self, dims: impl IntoShape) -> Result<Tensor> {
        let dims = dims.into_shape();
        if dims.len() != self.rank() {
            return Err(Error::shape(
                "permute",
                format!(
                    "expected {} dims for a tensor of shape {}, got {:?}",
                    self.rank(),
                    fmt_shape(self.shape()),
                    &dims[..]
                ),
            ));
        }
        let mut seen = vec![false; self.rank()];
        let mut order = Vec::with_capacity(dims.len());
        for &d in &dims {
            let d = resolve_dim_in("permute", d, self.rank(), self.shape())?;
            if std::mem::replace(&mut seen[d], true) {
                return Err(Error::shape(
                    "permute",
                    format!("dim {d} appears twice in {:?}", &dims[..]),
                ));
            }
            order.push(d);
        }
        self.derive(|l| {
            Ok(Layout {
                shape: order.iter().map(|&d| l.shape[d]).collect(),
                strides: order.iter().map(|&d| l.strides[d]).collect(),
                offset: l.offset,
            })
        })
    }

    /// `length` elements along `dim` starting at `start` (negative `start` counts from the end).
    pub fn narrow(&self, dim: impl Dim, start: i64, length: usize) -> Result<Tensor> {
        let (d, size) = self.dim_and_size("narrow", dim)?;
        let s = wrap_negative(start, size);
        if s < 0 || s as usize > size || length > size - s as usize {
            return Err(Error::shape(
                "narrow",
                format!(
                    "start {start} and length {length} do not fit in dim {d} of size {size} (tensor shape {})",
                    fmt_shape(self.shape())
                ),
            ));
        }
        self.derive(|l| {
            let mut l = l.clone();
            l.shape[d] = length;
            l.offset += s as usize * l.strides[d];
            Ok(l)
        })
    }

    /// Python slicing along `dim`: `t.slice(0, 1.., 2)` is `t[1::2]`. Negative bounds count from
    /// the end and out-of-range bounds are clamped, as in Python; `step` must be positive.
    pub fn slice(
        &self,
        dim: impl Dim,
        range: impl RangeBounds<i64>,
        step: usize,
    ) -> Result<Tensor> {
        let (d, _) = self.dim_and_size("slice", dim)?;
        if step == 0 {
            return Err(Error::invalid_argument(
                "slice",
                "step must be positive, got 0",
            ));
        }
        let size = self.shape()[d] as i64;
        let clamp = |v: i64| {
            let v = if v < 0 { v.saturating_add(size) } else { v };
            v.clamp(0, size)
        };
        let start = match range.start_bound() {
            Bound::Included(&v) => clamp(v),
            Bound::Excluded(&v) => clamp(v.saturating_add(1)),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&v) => clamp(if v == -1 { size } else { v.saturating_add(1) }),
            Bound::Excluded(&v) => clamp(v),
            Bound::Unbounded => size,
        };
        let len = if end > start {
            ((end - start) as usize).div_ceil(step)
        } else {
            0
        };
        self.derive(|l| {
            let mut l = l.clone();
            l.shape[d] = len;
            l.offset += start as usize * l.strides[d];
            // A slice of one element never steps, so its stride need not be representable.
            l.strides[d] = l.strides[d].checked_mul(step).unwrap_or(0);
            Ok(l)
        })
    }

    /// The slice at `index` along `dim`, with that dim removed.
    pub fn select(&self, dim: impl Dim, index: i64) -> Result<Tensor> {
        let (d, size) = self.dim_and_size("select", dim)?;
        let i = wrap_negative(index, size);
        if i < 0 || i as usize >= size {
            return Err(Error::IndexOutOfRange {
                op: "select".into(),
                index,
                dim: d,
                size,
                shape: self.shape().to_vec(),
            });
        }
        self.derive(|l| {
            let mut l = l.clone();
            l.offset += i as usize * l.strides[d];
            l.shape.remove(d);
            l.strides.remove(d);
            Ok(l)
        })
    }

    /// The diagonals of the matrices spanned by `dim1` and `dim2` (`torch.diagonal`): both
    /// dims removed and the diagonal appended as the last dim; `offset` picks one above (> 0)
    /// or below (< 0) the main one, and one past the edge is empty. A view.
    pub fn diagonal(&self, offset: i64, dim1: impl Dim, dim2: impl Dim) -> Result<Tensor> {
        let d1 = resolve_dim("diagonal", dim1, self.shape())?;
        let d2 = resolve_dim("diagonal", dim2, self.shape())?;
        if self.rank() < 2 || d1 == d2 {
            return Err(Error::invalid_argument(
                "diagonal",
                format!(
                    "expected two different dims of a tensor with at least 2, got dims {d1} \
                     and {d2} of shape {}",
                    fmt_shape(self.shape())
                ),
            ));
        }
        let (n1, n2) = (self.shape()[d1], self.shape()[d2]);
        let shift = offset.unsigned_abs() as usize;
        let len = if offset >= 0 {
            n1.min(n2.saturating_sub(shift))
        } else {
            n1.saturating_sub(shift).min(n2)
        };
        self.derive(|l| {
            let mut l = l.clone();
            // As PyTorch: an empty diagonal keeps the storage offset.
            if len > 0 {
                l.offset += shift * l.strides[if offset >= 0 { d2 } else { d1 }];
            }
            let step = l.strides[d1] + l.strides[d2];
            for d in [d1.max(d2), d1.min(d2)] {
                l.shape.remove(d);
                l.strides.remove(d);
            }
            l.shape.push(len);
            l.strides.push(step);
            Ok(l)
        })
    }

    /// Removes every dim of size 1.
    pub fn squeeze(&self) -> Tensor {
        let keep: Vec<usize> = (0..self.rank()).filter(|&d| self.shape()[d] != 1).collect();
        self.derive_infallible(|l| Layout {
            shape: keep.iter().map(|&d| l.shape[d]).collect(),
            strides: keep.iter().map(|&d| l.strides[d]).collect(),
            offset: l.offset,
        })
    }

    /// Removes `dim` if its size is 1; otherwise returns the tensor unchanged, as PyTorch does.
    pub fn squeeze_dim(&self, dim: impl Dim) -> Result<Tensor> {
        let d = resolve_dim("squeeze", dim, self.shape())?;
        if self.rank() == 0 || self.shape()[d] != 1 {
            return Ok(self.clone());
        }
        self.derive(|l| {
            let mut l = l.clone();
            l.shape.remove(d);
            l.strides.remove(d);
            Ok(l)
        })
    }

    /// Inserts a dim of size 1 at `dim` (which may equal the rank, or count from the end).
    pub fn unsqueeze(&self, dim: impl Dim) -> Result<Tensor> {
        let d = resolve_dim_in("unsqueeze", dim.to_i64(), self.rank() + 1, self.shape())?;
        self.derive(|l| {
            let mut l = l.clone();
            // Any stride works for a size-1 dim; this one keeps contiguous tensors contiguous.
            let stride = if d < l.shape.len() {
                l.shape[d].saturating_mul(l.strides[d])
            } else {
                1
            };
            l.shape.insert(d, 1);
            l.strides.insert(d, stride);
            Ok(l)
        })
    }

    /// Merges dims `start_dim..=end_dim` into one (a view when possible, else a copy).
    pub fn flatten(&self, start_dim: impl Dim, end_dim: impl Dim) -> Result<Tensor> {
        if self.rank() == 0 {
            return self.reshape([1]);
        }
        let s = resolve_dim("flatten", start_dim, self.shape())?;
        let e = resolve_dim("flatten", end_dim, self.shape())?;
        if s > e {
            return Err(Error::shape(
                "flatten",
                format!(
                    "start dim {s} comes after end dim {e} (tensor shape {})",
                    fmt_shape(self.shape())
                ),
            ));
        }
        let mut shape: Dims = self.shape()[..s].into();
        shape.push(self.shape()[s..=e].iter().product());
        shape.extend_from_slice(&self.shape()[e + 1..]);
        self.reshape(&shape)
    }

    /// A view with size-1 dims repeated (stride 0) to `shape`; `-1` keeps a size, and new leading
    /// dims may be added, as PyTorch's `expand`.
    pub fn expand(&self, shape: impl IntoShape) -> Result<Tensor> {
        let want = shape.into_shape();
        let bad = |why: String| {
            Error::shape(
                "expand",
                format!(
                    "cannot expand a tensor of shape {} to {:?}: {why}",
                    fmt_shape(self.shape()),
                    &want[..]
                ),
            )
        };
        if want.len() < self.rank() {
            return Err(bad("the target has fewer dims".into()));
        }
        let lead = want.len() - self.rank();
        // Per output dim: its size, and the input dim it keeps (None: broadcast, stride 0).
        let mut plan: Vec<(usize, Option<usize>)> = Vec::with_capacity(want.len());
        for (i, &w) in want.iter().enumerate() {
            if i < lead {
                if w < 0 {
                    return Err(bad(format!("new leading dim {i} cannot be {w}")));
                }
                plan.push((w as usize, None));
                continue;
            }
            let cur = self.shape()[i - lead];
            match w {
                -1 => plan.push((cur, Some(i - lead))),
                w if w >= 0 && w as usize == cur => plan.push((cur, Some(i - lead))),
                w if w >= 0 && cur == 1 => plan.push((w as usize, None)),
                _ => {
                    return Err(bad(format!(
                        "dim {i} has size {cur}, which is not 1 and differs from {w}"
                    )));
                }
            }
        }
        checked_numel("expand", &plan.iter().map(|p| p.0).collect::<Vec<_>>())?;
        self.derive(|l| {
            Ok(Layout {
                shape: plan.iter().map(|p| p.0).collect(),
                strides: plan
                    .iter()
                    .map(|p| p.1.map_or(0, |d| l.strides[d]))
                    .collect(),
                offset: l.offset,
            })
        })
    }

    /// A stride-0 view of this tensor at `shape` (all sizes given).
    pub fn broadcast_to(&self, shape: impl IntoShape) -> Result<Tensor> {
        let shape = exact_shape("broadcast_to", shape)?;
        self.expand(&shape)
    }

    /// Splits into `chunks` views along `dim`, each of `ceil(size / chunks)` elements but the
    /// last, as PyTorch's `chunk`.
    pub fn chunk(&self, chunks: usize, dim: impl Dim) -> Result<Vec<Tensor>> {
        if chunks == 0 {
            return Err(Error::invalid_argument(
                "chunk",
                "expected at least 1 chunk, got 0",
            ));
        }
        let (d, size) = self.dim_and_size("chunk", dim)?;
        let step = size.div_ceil(chunks).max(1);
        self.split(step, d)
    }

    /// Splits into views of `split_size` elements along `dim` (the last may be smaller).
    pub fn split(&self, split_size: usize, dim: impl Dim) -> Result<Vec<Tensor>> {
        let (d, size) = self.dim_and_size("split", dim)?;
        if split_size == 0 {
            if size == 0 {
                return Ok(vec![self.clone()]);
            }
            return Err(Error::invalid_argument(
                "split",
                format!("split size 0 cannot split dim {d} of size {size}"),
            ));
        }
        let mut out = Vec::with_capacity(size.div_ceil(split_size));
        let mut start = 0;
        while start < size {
            let len = split_size.min(size - start);
            out.push(self.narrow(d, start as i64, len)?);
            start += len;
        }
        if out.is_empty() {
            out.push(self.clone());
        }
        Ok(out)
    }

    /// Splits into views of the given sizes along `dim`; the sizes must add up to the dim's size.
    pub fn split_with_sizes(&self, sizes: &[usize], dim: impl Dim) -> Result<Vec<Tensor>> {
        let (d, size) = self.dim_and_size("split_with_sizes", dim)?;
        let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if total != Some(size) {
            return Err(Error::shape(
                "split_with_sizes",
                format!(
                    "sizes {sizes:?} do not add up to dim {d} of size {size} (tensor shape {})",
                    fmt_shape(self.shape())
                ),
            ));
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&len| {
                let t = self.narrow(d, start as i64, len);
                start += len;
                t
            })
            .collect()
    }

    /// A view with explicit sizes, strides and offset over this tensor's storage; it must stay
    /// inside the storage. Under autograd its gradient flows through storage positions, as
    /// PyTorch's `as_strided` does.
    pub fn as_strided(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<Tensor> {
        let checked = Tensor::from_storage(
            self.storage().clone(),
            Layout {
                shape: shape.into(),
                strides: strides.into(),
                offset,
            },
        )?;
        let view = self.view_with(checked.layout().clone());
        self.note_view(&view, None);
        Ok(view)
    }

    /// Resolves `dim` for an op that needs at least one dim, and gives that dim's size.
    fn dim_and_size(&self, op: &str, dim: impl Dim) -> Result<(usize, usize)> {
        let d = resolve_dim(op, dim, self.shape())?;
        if self.rank() == 0 {
            return Err(Error::shape(
                op,
                "expected a tensor with at least 1 dim, got a scalar (shape [])",
            ));
        }
        Ok((d, self.shape()[d]))
    }
}

/// A position along a dim of `size` elements where negative values count from the end; the
/// result may still be out of range, which the caller reports.
fn wrap_negative(i: i64, size: usize) -> i64 {
    if i < 0 { i + size as i64 } else { i }
}

#[cfg(test)]
mod tests {
    use tpu_runtime::{DType, Device};

    use super::*;

    fn iota(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::arange(0, n as i64, 1, DType::I64, &Device::cpu())
            .unwrap()
            .reshape(shape)
            .unwrap()
    }

    fn vals(t: &Tensor) -> Vec<i64> {
        t.to_vec::<i64>().unwrap()
    }

    #[test]
    fn reshape_and_view() {
        let t = iota(&[2, 3]);
        let v = t.view([3, -1]).unwrap();
        assert!(v.shares_storage(&t));
        assert_eq!(v.shape(), &[3, 2]);
        let tt = t.t().unwrap();
        let e = tt.view([6]).unwrap_err().to_string();
        assert!(e.contains("use reshape"), "{e}");
        let r = tt.reshape([6]).unwrap();
        assert!(!r.shares_storage(&t));
        assert_eq!(vals(&r), [0, 3, 1, 4, 2, 5]);
        assert!(t.reshape([4, -1]).is_err());
    }

    #[test]
    fn transpose_permute() {
        let t = iota(&[2, 3, 4]);
        let p = t.permute([2, 0, 1]).unwrap();
        assert_eq!(p.shape(), &[4, 2, 3]);
        assert_eq!(p.strides(), &[1, 12, 4]);
        assert!(t.permute([0, 0, 1]).is_err());
        assert!(t.permute([0, 1]).is_err());
        let e = t.transpose(0, 3).unwrap_err().to_string();
        assert!(e.contains("shape [2, 3, 4]"), "{e}");
        assert_eq!(
            vals(&t.transpose(-1, 0).unwrap().select(0, 1).unwrap()),
            [1, 13, 5, 17, 9, 21]
        );
        assert!(t.t().is_err());
    }

    #[test]
    fn slicing() {
        let t = iota(&[10]);
        assert_eq!(vals(&t.slice(0, 1.., 3).unwrap()), [1, 4, 7]);
        assert_eq!(vals(&t.slice(0, -3.., 1).unwrap()), [7, 8, 9]);
        assert_eq!(vals(&t.slice(0, ..-8, 1).unwrap()), [0, 1]);
        assert_eq!(vals(&t.slice(0, 2..=4, 1).unwrap()), [2, 3, 4]);
        assert_eq!(vals(&t.slice(0, 5..100, 2).unwrap()), [5, 7, 9]);
        let (hi, lo) = (8, 2);
        assert_eq!(t.slice(0, hi..lo, 1).unwrap().numel(), 0);
        assert!(t.slice(0, .., 0).is_err());
        assert_eq!(vals(&t.narrow(0, -2, 2).unwrap()), [8, 9]);
        assert!(t.narrow(0, 8, 3).is_err());
        let e = t.select(0, 10).unwrap_err().to_string();
        assert!(
            e.contains("index 10 is out of range for dim 0 of size 10"),
            "{e}"
        );
        assert_eq!(vals(&t.select(0, -1).unwrap()), [9]);
    }

    #[test]
    fn squeeze_unsqueeze_flatten() {
        let t = iota(&[2, 1, 3, 1]);
        assert_eq!(t.squeeze().shape(), &[2, 3]);
        assert_eq!(t.squeeze_dim(1).unwrap().shape(), &[2, 3, 1]);
        assert_eq!(t.squeeze_dim(0).unwrap().shape(), &[2, 1, 3, 1]);
        let u = iota(&[2, 3]).unsqueeze(-1).unwrap();
        assert_eq!(u.shape(), &[2, 3, 1]);
        assert!(u.is_contiguous());
        assert_eq!(iota(&[2, 3]).unsqueeze(0).unwrap().shape(), &[1, 2, 3]);
        assert!(iota(&[2, 3]).unsqueeze(3).is_err());
        assert_eq!(iota(&[2, 3, 4]).flatten(1, -1).unwrap().shape(), &[2, 12]);
        assert_eq!(iota(&[2, 3, 4]).flatten(0, 1).unwrap().shape(), &[6, 4]);
    }

    #[test]
    fn expand_and_split() {
        let t = iota(&[3, 1]);
        let e = t.expand([2, -1, 4]).unwrap();
        assert_eq!(e.shape(), &[2, 3, 4]);
        assert_eq!(e.strides(), &[0, 1, 0]);
        assert_eq!(
            vals(&e.select(0, 1).unwrap().select(0, 2).unwrap()),
            [2, 2, 2, 2]
        );
        let err = t.expand([3, 2, 2]).unwrap_err().to_string();
        assert!(err.contains("shape [3, 1]"), "{err}");
        let parts = iota(&[7]).chunk(3, 0).unwrap();
        let sizes: Vec<usize> = parts.iter().map(|p| p.numel()).collect();
        assert_eq!(sizes, [3, 3, 1]);
        assert_eq!(vals(&parts[2]), [6]);
        let parts = iota(&[5, 2]).split_with_sizes(&[1, 4], 0).unwrap();
        assert_eq!(vals(&parts[1].select(1, 0).unwrap()), [2, 4, 6, 8]);
        assert!(iota(&[5]).split_with_sizes(&[1, 1], 0).is_err());
        assert_eq!(iota(&[5]).split(2, 0).unwrap().len(), 3);
    }

    #[test]
    fn scalar_views() {
        let s = Tensor::scalar(3i64, &Device::cpu()).unwrap();
        assert_eq!(s.unsqueeze(0).unwrap().shape(), &[1]);
        assert!(s.select(0, 0).is_err());
        assert_eq!(s.reshape([1, 1]).unwrap().shape(), &[1, 1]);
        assert_eq!(s.flatten(0, -1).unwrap().shape(), &[1]);
    }
}
