//! Walking a strided view of storage in row-major order.
//!
//! Every host-side kernel that reads a view (copies, casts, and the op kernels above) goes through
//! [`Walk`]: it merges dims that are laid out contiguously, so a contiguous tensor is one long row
//! and a transposed one is as few rows as its layout allows.

use crate::shape::Dims;

/// A strided view split into rows: `rows()` runs of `inner` elements, each `inner_stride` apart
/// in storage, starting at [`Walk::row_offset`].
#[derive(Clone, Debug)]
pub struct Walk {
    outer: Dims,
    outer_strides: Dims,
    inner: usize,
    inner_stride: usize,
    offset: usize,
    rows: usize,
}

impl Walk {
    /// Plans a walk over `shape`/`strides` starting at `offset` (all in elements).
    pub fn new(shape: &[usize], strides: &[usize], offset: usize) -> Walk {
        // Coalesce from the innermost dim outwards, dropping size-1 dims.
        let mut dims: Dims = Dims::new();
        let mut st: Dims = Dims::new();
        for i in (0..shape.len()).rev() {
            let (d, s) = (shape[i], strides[i]);
            if d == 1 {
                continue;
            }
            match (dims.last_mut(), st.last()) {
                (Some(ld), Some(&ls)) if s == ls * *ld => *ld *= d,
                _ => {
                    dims.push(d);
                    st.push(s);
                }
            }
        }
        if shape.contains(&0) {
            return Walk {
                outer: Dims::new(),
                outer_strides: Dims::new(),
                inner: 0,
                inner_stride: 1,
                offset,
                rows: 0,
            };
        }
        let (inner, inner_stride) = if dims.is_empty() {
            (1, 1)
        } else {
            (dims[0], st[0])
        };
        // Outer dims, outermost first.
        let outer: Dims = dims.iter().skip(1).rev().copied().collect();
        let outer_strides: Dims = st.iter().skip(1).rev().copied().collect();
        let rows = outer.iter().product();
        Walk {
            outer,
            outer_strides,
            inner,
            inner_stride,
            offset,
            rows,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Elements per row.
    pub fn inner(&self) -> usize {
        self.inner
    }

    /// Storage distance between consecutive elements of a row.
    pub fn inner_stride(&self) -> usize {
        self.inner_stride
    }

    /// True when the whole view is one dense run.
    pub fn is_dense(&self) -> bool {
        self.rows <= 1 && (self.inner_stride == 1 || self.inner <= 1)
    }

    /// Storage offset of the first element of row `row`.
    pub fn row_offset(&self, row: usize) -> usize {
        let mut rem = row;
        let mut off = self.offset;
        for i in (0..self.outer.len()).rev() {
            let d = self.outer[i];
            off += (rem % d) * self.outer_strides[i];
            rem /= d;
        }
        off
    }

    /// Calls `f(row, storage_offset)` for rows `start..end`, stepping the offsets incrementally.
    pub fn for_rows(&self, start: usize, end: usize, mut f: impl FnMut(usize, usize)) {
        if start >= end {
            return;
        }
        let n = self.outer.len();
        let mut idx: Dims = Dims::from_elem(0, n);
        let mut rem = start;
        for i in (0..n).rev() {
            idx[i] = rem % self.outer[i];
            rem /= self.outer[i];
        }
        let mut off = self.row_offset(start);
        for row in start..end {
            f(row, off);
            // Advance the multi-index like an odometer.
            let mut i = n;
            while i > 0 {
                i -= 1;
                idx[i] += 1;
                off += self.outer_strides[i];
                if idx[i] < self.outer[i] {
                    break;
                }
                off -= self.outer_strides[i] * self.outer[i];
                idx[i] = 0;
            }
        }
    }

    /// Gathers the view from `src` into the dense `dst` (length `rows * inner`).
    pub fn gather<T: Copy>(&self, src: &[T], dst: &mut [T]) {
        let inner = self.inner;
        let is = self.inner_stride;
        self.for_rows(0, self.rows, |row, off| {
            let out = &mut dst[row * inner..(row + 1) * inner];
            if is == 1 {
                out.copy_from_slice(&src[off..off + inner]);
            } else {
                for (j, o) in out.iter_mut().enumerate() {
                    *o = src[off + j * is];
                }
            }
        });
    }

    /// Applies `f` to each element of the view in row-major order, writing dense `dst`.
    pub fn map<S: Copy, D>(&self, src: &[S], dst: &mut [D], f: impl Fn(S) -> D) {
        let inner = self.inner;
        let is = self.inner_stride;
        self.for_rows(0, self.rows, |row, off| {
            let out = &mut dst[row * inner..(row + 1) * inner];
            if is == 1 {
                for (o, &s) in out.iter_mut().zip(&src[off..off + inner]) {
                    *o = f(s);
                }
            } else {
                for (j, o) in out.iter_mut().enumerate() {
                    *o = f(src[off + j * is]);
                }
            }
        });
    }

    /// The largest storage offset the view touches plus one (0 for empty views): what storage
    /// must hold for the view to be in bounds.
    pub fn extent(shape: &[usize], strides: &[usize], offset: usize) -> Option<usize> {
        if shape.contains(&0) {
            return Some(0);
        }
        let mut last = offset;
        for (&d, &s) in shape.iter().zip(strides) {
            last = last.checked_add((d - 1).checked_mul(s)?)?;
        }
        last.checked_add(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_is_one_row() {
        let w = Walk::new(&[2, 3, 4], &[12, 4, 1], 0);
        assert_eq!((w.rows(), w.inner(), w.inner_stride()), (1, 24, 1));
        assert!(w.is_dense());
    }

    #[test]
    fn transpose_gathers() {
        // [[0,1,2],[3,4,5]] transposed.
        let src: Vec<i32> = (0..6).collect();
        let w = Walk::new(&[3, 2], &[1, 3], 0);
        let mut dst = vec![0; 6];
        w.gather(&src, &mut dst);
        assert_eq!(dst, [0, 3, 1, 4, 2, 5]);
        let mut part = vec![];
        w.for_rows(1, 3, |r, off| part.push((r, off)));
        assert_eq!(part, [(1, 1), (2, 2)]);
    }

    #[test]
    fn broadcast_and_empty() {
        let src = [7, 8];
        let w = Walk::new(&[3, 2], &[0, 1], 0);
        let mut dst = vec![0; 6];
        w.gather(&src, &mut dst);
        assert_eq!(dst, [7, 8, 7, 8, 7, 8]);
        let w = Walk::new(&[3, 0], &[0, 1], 0);
        assert_eq!(w.rows() * w.inner(), 0);
        assert_eq!(Walk::extent(&[2, 3], &[3, 1], 1), Some(7));
    }
}
