//! Shorthands the nn lowerings share: constants shaped like a value, the four arithmetic ops,
//! and the conversion to the compute dtype.

use crate::hlo::{FnBuilder, Value};
use crate::op::promote::compute_dtype;

pub(super) fn cst(b: &mut FnBuilder, like: &Value, v: f64) -> Value {
    b.splat(like.ty.clone(), v)
}

pub(super) fn add(b: &mut FnBuilder, x: &Value, y: &Value) -> Value {
    b.ew("stablehlo.add", &[x, y])
}

pub(super) fn sub(b: &mut FnBuilder, x: &Value, y: &Value) -> Value {
    b.ew("stablehlo.subtract", &[x, y])
}

pub(super) fn mul(b: &mut FnBuilder, x: &Value, y: &Value) -> Value {
    b.ew("stablehlo.multiply", &[x, y])
}

pub(super) fn div(b: &mut FnBuilder, x: &Value, y: &Value) -> Value {
    b.ew("stablehlo.divide", &[x, y])
}

pub(super) fn to_compute(b: &mut FnBuilder, v: &Value) -> Value {
    b.convert(v, compute_dtype(v.dtype()))
}
