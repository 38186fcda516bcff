//! Shapes, strides and the arguments users pass for them.

use smallvec::SmallVec;
use tpu_runtime::error::fmt_shape;
use tpu_runtime::{Error, Result};

/// Dimensions or strides, stored inline for the ranks models use.
pub type Dims = SmallVec<[usize; 6]>;

/// Something that names a dimension: a `usize`, or a signed integer where negative values count
/// from the end as in PyTorch (`-1` is the last dim).
pub trait Dim: Copy {
    /// The dim as a signed index.
    fn to_i64(self) -> i64;
}

macro_rules! dim_impl {
    ($($t:ty),*) => {$(
        impl Dim for $t {
            #[inline]
            fn to_i64(self) -> i64 {
                self as i64
            }
        }
    )*};
}
dim_impl!(usize, isize, i64, i32, u32);

/// Resolves a possibly negative dim against a rank, with an error naming the shape.
pub fn resolve_dim(op: &str, dim: impl Dim, shape: &[usize]) -> Result<usize> {
    resolve_dim_in(op, dim.to_i64(), shape.len(), shape)
}

/// Resolves a dim against `rank` (which may differ from `shape.len()`, as for `unsqueeze`).
pub fn resolve_dim_in(op: &str, dim: i64, rank: usize, shape: &[usize]) -> Result<usize> {
    // Scalars accept dim 0 and -1, as in PyTorch.
    let r = (rank as i64).max(1);
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(Error::DimOutOfRange {
            op: op.to_string(),
            dim,
            rank,
            shape: shape.to_vec(),
        });
    }
    Ok(d as usize)
}

/// A list of sizes as users write it: `[2, 3]`, `&[2, -1]`, `vec![4usize]`, `t.shape()`.
/// Signed entries allow `-1` where an op infers a size.
pub trait IntoShape {
    /// The sizes, as signed values.
    fn into_shape(self) -> SmallVec<[i64; 6]>;
}

macro_rules! shape_impl {
    ($($t:ty),*) => {$(
        impl IntoShape for &[$t] {
            fn into_shape(self) -> SmallVec<[i64; 6]> {
                self.iter().map(|&v| v as i64).collect()
            }
        }
        impl<const N: usize> IntoShape for [$t; N] {
            fn into_shape(self) -> SmallVec<[i64; 6]> {
                self.iter().map(|&v| v as i64).collect()
            }
        }
        impl<const N: usize> IntoShape for &[$t; N] {
            fn into_shape(self) -> SmallVec<[i64; 6]> {
                self.iter().map(|&v| v as i64).collect()
            }
        }
        impl IntoShape for Vec<$t> {
            fn into_shape(self) -> SmallVec<[i64; 6]> {
                self.iter().map(|&v| v as i64).collect()
            }
        }
        impl IntoShape for &Vec<$t> {
            fn into_shape(self) -> SmallVec<[i64; 6]> {
                self.iter().map(|&v| v as i64).collect()
            }
        }
    )*};
}
shape_impl!(usize, isize, i64, i32, u32);

impl IntoShape for &Dims {
    fn into_shape(self) -> SmallVec<[i64; 6]> {
        self.iter().map(|&v| v as i64).collect()
    }
}

impl IntoShape for () {
    fn into_shape(self) -> SmallVec<[i64; 6]> {
        SmallVec::new()
    }
}

/// Converts a shape argument in which every size must be given (no `-1`).
pub fn exact_shape(op: &str, shape: impl IntoShape) -> Result<Dims> {
    let s = shape.into_shape();
    let mut out = Dims::with_capacity(s.len());
    for &v in &s {
        if v < 0 {
            return Err(Error::shape(
                op,
                format!("expected non-negative sizes, got {s:?}"),
            ));
        }
        out.push(v as usize);
    }
    checked_numel(op, &out)?;
    Ok(out)
}

/// Resolves a shape with at most one `-1` against a known element count.
pub fn infer_shape(op: &str, shape: impl IntoShape, numel: usize, from: &[usize]) -> Result<Dims> {
    let s = shape.into_shape();
    let mut infer = None;
    let mut known: usize = 1;
    for (i, &v) in s.iter().enumerate() {
        match v {
            -1 if infer.is_none() => infer = Some(i),
            -1 => {
                return Err(Error::shape(
                    op,
                    format!("only one dimension can be -1, got {s:?}"),
                ));
            }
            v if v < 0 => {
                return Err(Error::shape(
                    op,
                    format!("invalid size {v} in {s:?}: expected a size >= 0 or -1"),
                ));
            }
            v => {
                known = known
                    .checked_mul(v as usize)
                    .ok_or_else(|| Error::shape(op, format!("shape {s:?} has too many elements")))?
            }
        }
    }
    let mismatch = || {
        Error::shape(
            op,
            format!(
                "shape {s:?} is invalid for a tensor of shape {} ({numel} elements)",
                fmt_shape(from)
            ),
        )
    };
    let mut out: Dims = s.iter().map(|&v| v.max(0) as usize).collect();
    match infer {
        Some(i) => {
            if known == 0 || !numel.is_multiple_of(known) {
                return Err(mismatch());
            }
            out[i] = numel / known;
        }
        None if known != numel => return Err(mismatch()),
        None => {}
    }
    Ok(out)
}

/// Product of sizes, or an error when it, or any size, is more than an `i64` holds (PyTorch's
/// limit, which also keeps every size and count valid as a signed index).
pub fn checked_numel(op: &str, shape: &[usize]) -> Result<usize> {
    const MAX: usize = i64::MAX as usize;
    shape
        .iter()
        .try_fold(1usize, |a, &d| {
            if d > MAX {
                return None;
            }
            a.checked_mul(d)
        })
        .filter(|&n| n <= MAX)
        .ok_or_else(|| {
            Error::shape(
                op,
                format!("shape {} has too many elements", fmt_shape(shape)),
            )
        })
}

/// Row-major strides of a dense tensor.
#[inline]
pub fn contiguous_strides(shape: &[usize]) -> Dims {
    let mut strides = Dims::from_elem(0, shape.len());
    let mut acc = 1usize;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc = acc.saturating_mul(shape[i]);
    }
    strides
}

/// The shape two shapes broadcast to under PyTorch's rules (align right; sizes equal or 1).
pub fn broadcast_shapes(op: &str, a: &[usize], b: &[usize]) -> Result<Dims> {
    let rank = a.len().max(b.len());
    let mut out = Dims::from_elem(0, rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::shape(
                    op,
                    format!(
                        "shapes {} and {} cannot be broadcast: dim {i} has sizes {da} and {db}",
                        fmt_shape(a),
                        fmt_shape(b)
                    ),
                ));
            }
        };
    }
    Ok(out)
}

/// Strides that let a tensor of `shape`/`strides` be viewed as `new_shape` without copying, or
/// `None` when no such strides exist. This is PyTorch's rule: the new shape must split or merge
/// only runs of dims that are laid out contiguously with respect to each other.
pub fn view_strides(shape: &[usize], strides: &[usize], new_shape: &[usize]) -> Option<Dims> {
    let numel: usize = shape.iter().product();
    if numel == 0 || shape.is_empty() {
        // Any shape works for empty tensors and scalars.
        return Some(contiguous_strides(new_shape));
    }
    let mut new_strides = Dims::from_elem(0, new_shape.len());
    let mut view_d = new_shape.len() as isize - 1;
    let mut chunk_base_stride = *strides.last()?;
    let mut tensor_numel = 1usize;
    let mut view_numel = 1usize;
    for tensor_d in (0..shape.len()).rev() {
        tensor_numel *= shape[tensor_d];
        // A chunk ends where the next-outer dim is not laid out right after this one.
        let chunk_ends = tensor_d == 0
            || (shape[tensor_d - 1] != 1
                && strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
        if chunk_ends {
            while view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d as usize] == 1) {
                new_strides[view_d as usize] = view_numel * chunk_base_stride;
                view_numel *= new_shape[view_d as usize];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base_stride = strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    if view_d != -1 {
        return None;
    }
    Some(new_strides)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_resolve() {
        assert_eq!(resolve_dim("t", -1, &[2, 3]).unwrap(), 1);
        assert_eq!(resolve_dim("t", 0usize, &[2, 3]).unwrap(), 0);
        let e = resolve_dim("t", 2, &[2, 3]).unwrap_err().to_string();
        assert!(e.contains("shape [2, 3]"), "{e}");
        assert!(resolve_dim("t", -3, &[2, 3]).is_err());
    }

    #[test]
    fn element_counts_stay_within_i64() {
        assert_eq!(checked_numel("t", &[]).unwrap(), 1);
        assert_eq!(checked_numel("t", &[1 << 31, 1 << 31]).unwrap(), 1 << 62);
        assert_eq!(checked_numel("t", &[0, i64::MAX as usize]).unwrap(), 0);
        for bad in [
            &[1usize << 32, 1 << 32, 16][..],
            &[1 << 32, 1 << 31],
            &[usize::MAX, 0],
            &[1 << 63],
        ] {
            let e = checked_numel("t", bad).unwrap_err();
            assert!(e.to_string().contains("too many elements"), "{e}");
        }
    }

    #[test]
    fn infer_minus_one() {
        assert_eq!(&infer_shape("r", [2, -1], 6, &[6]).unwrap()[..], &[2, 3]);
        assert!(infer_shape("r", [-1, -1], 6, &[6]).is_err());
        let e = infer_shape("r", [4, -1], 6, &[6]).unwrap_err().to_string();
        assert!(e.contains("[6]"), "{e}");
        assert_eq!(&infer_shape("r", [0, -1], 0, &[0]).is_err(), &true);
    }

    #[test]
    fn broadcasting() {
        assert_eq!(
            &broadcast_shapes("add", &[3, 1], &[4]).unwrap()[..],
            &[3, 4]
        );
        assert!(broadcast_shapes("add", &[3], &[4]).is_err());
    }

    #[test]
    fn view_rule() {
        // A transposed 2x3 cannot be flattened without a copy.
        assert!(view_strides(&[3, 2], &[1, 3], &[6]).is_none());
        assert_eq!(
            &view_strides(&[2, 3], &[3, 1], &[3, 2]).unwrap()[..],
            &[2, 1]
        );
        // Splitting a transposed dim is fine.
        assert_eq!(
            &view_strides(&[4, 2], &[1, 4], &[2, 2, 2]).unwrap()[..],
            &[2, 1, 4]
        );
    }
}
