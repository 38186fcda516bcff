//! StableHLO pieces that several movement lowerings share (empty results, slices along a dim,
//! reversal); each op's own lowering lives with its sub-family.

use crate::hlo::{FnBuilder, Value, i64_array, list};
use crate::op::Meta;

/// A dense zero of the output's type (for empty outputs, which XLA need not compute).
pub(super) fn zeros(b: &mut FnBuilder, m: &Meta) -> Value {
    b.splat(m.ty(), 0)
}

/// Elements `start..end` along dim `d`.
pub(super) fn slice_dim(b: &mut FnBuilder, v: &Value, d: usize, start: usize, end: usize) -> Value {
    let r = v.ty.rank();
    let mut lo = vec![0i64; r];
    let mut hi: Vec<i64> = v.dims().iter().map(|&n| n as i64).collect();
    lo[d] = start as i64;
    hi[d] = end as i64;
    b.slice(v, &lo, &hi, &vec![1; r])
}

/// `v` reversed along `dims`.
pub(super) fn reverse(b: &mut FnBuilder, v: &Value, dims: &[usize]) -> Value {
    let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let attrs = format!("dimensions = {}", i64_array(&dims));
    b.op("stablehlo.reverse", &[v], &attrs, v.ty.clone())
}

/// The list `[0, 1, .., n - 1]` (every dim of a rank-`n` tensor), as StableHLO attributes write it.
pub(super) fn range_list(n: usize) -> String {
    list(&(0..n as i64).collect::<Vec<_>>())
}
