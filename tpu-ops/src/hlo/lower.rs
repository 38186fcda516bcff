//! Lowering helpers that several op families share: what one op's lowering works from
//! ([`OpIo`]), sums and maxima over dims, and the broadcast that lines a reduced value up with
//! the value it was reduced from.

use tpu_tensor::Result;

use super::checks::DeviceCheck;
use super::{FnBuilder, Value};
use crate::op::Meta;
use crate::op::promote::compute_dtype;

/// What a lowering returns: one value per output.
pub type Lowered = Result<Vec<Value>>;

/// What the lowering of an op's device checks returns.
pub type Checks = Result<Vec<DeviceCheck>>;

/// What one op's lowering works from: its dense inputs and the shapes and dtypes of its
/// outputs, as [`crate::op::OpDef::lower`] receives them. `op_parts!` hands the two to a
/// family's lowering function in one piece, with the first steps most lowerings take.
#[derive(Clone, Copy, Debug)]
pub struct OpIo<'a> {
    /// The op's inputs.
    pub inputs: &'a [Value],
    /// The op's outputs' shapes and dtypes.
    pub outputs: &'a [Meta],
}

impl<'a> OpIo<'a> {
    /// The dims of input `i`, owned so the builder can be borrowed meanwhile.
    pub fn dims(&self, i: usize) -> Vec<usize> {
        self.inputs[i].dims().to_vec()
    }

    /// Input `i` converted to the dtype kernels compute in (f32 for the 16-bit floats).
    pub fn compute(&self, b: &mut FnBuilder, i: usize) -> Value {
        to_compute(b, &self.inputs[i])
    }

    /// Zeros for output 0 when it has no elements, which XLA need not compute (and whose
    /// windows or gathers some lowerings cannot build); `None` otherwise.
    pub fn zeros_if_empty(&self, b: &mut FnBuilder) -> Option<Vec<Value>> {
        let out = &self.outputs[0];
        (out.numel() == 0).then(|| vec![b.splat(out.ty(), 0)])
    }
}

/// `v` converted to the dtype kernels compute in (f32 for the 16-bit floats).
pub fn to_compute(b: &mut FnBuilder, v: &Value) -> Value {
    b.convert(v, compute_dtype(v.dtype()))
}

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
