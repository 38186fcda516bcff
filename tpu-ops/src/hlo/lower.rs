//! Lowering helpers that several op families share: sums and maxima over dims, and the
//! broadcast that lines a reduced value up with the value it was reduced from.

use super::{FnBuilder, Value};

/// The maximum (`max`, from -inf) or the sum (from 0) of `v` over `dims`, which disappear
/// from the result.
pub fn lower_reduce(b: &mut FnBuilder, v: &Value, dims: &[usize], max: bool) -> Value {
    let init = b.scalar(v.dtype(), if max { f64::NEG_INFINITY } else { 0.0 });
    let name = if max {
        "stablehlo.maximum"
    } else {
        "stablehlo.add"
    };
    b.reduce(&[v], &[&init], dims, |b, a| {
        vec![b.ew(name, &[&a[0], &a[1]])]
    })
    .remove(0)
}

/// The sum of `v` over `dims` (see [`lower_reduce`]).
pub fn lower_sum(b: &mut FnBuilder, v: &Value, dims: &[usize]) -> Value {
    lower_reduce(b, v, dims, false)
}

/// Broadcasts `v`, the result of a reduction over the dims `reduced` of a value of shape
/// `dims`, back to `dims`.
pub fn bcast_back(b: &mut FnBuilder, v: &Value, reduced: &[usize], dims: &[usize]) -> Value {
    let map: Vec<i64> = (0..dims.len())
        .filter(|d| !reduced.contains(d))
        .map(|d| d as i64)
        .collect();
    b.broadcast_in_dim(v, &map, dims)
}
