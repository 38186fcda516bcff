//! Shorthands the nn lowerings share: constants shaped like a value, the four arithmetic ops,
//! and the conversion to the compute dtype.

pub(super) use crate::hlo::lower::to_compute;
use crate::hlo::{FnBuilder, Value};

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
