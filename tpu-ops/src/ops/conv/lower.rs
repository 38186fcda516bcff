//! StableHLO helpers that the sub-families' lowerings share: float constants, gathers with
//! constant indices, padding attributes, and the `[N, C, H, W]` view in compute precision.

use tpu_tensor::{DType, Scalar};

use crate::hlo::lower::to_compute;
use crate::hlo::{FnBuilder, TensorType, Value, i64_array, list, literal};

use super::nchw;

/// A 1-D float constant of `dtype` with exactly these values.
pub(super) fn const_float(b: &mut FnBuilder, values: &[f64], dtype: DType) -> Value {
    let ty = TensorType::new(&[values.len()], dtype);
    let parts: Vec<String> = values
        .iter()
        .map(|&v| literal(dtype, Scalar::Float(v)))
        .collect();
    let attrs = format!("value = dense<[{}]> : {ty}", parts.join(", "));
    b.op("stablehlo.constant", &[], &attrs, ty)
}

/// Gathers along `axis` of `x` with constant indices of shape `idx_dims`; the index dims take
/// the place of `axis` in the result.
pub(super) fn gather_axis(
    b: &mut FnBuilder,
    x: &Value,
    axis: usize,
    idx: &[i64],
    idx_dims: &[usize],
) -> Value {
    let rank = x.ty.rank();
    let k = idx_dims.len();
    let mut ishape = idx_dims.to_vec();
    ishape.push(1);
    let iv = b.constant_i64(&ishape, idx);
    let offset: Vec<i64> = (0..rank)
        .filter(|&d| d != axis)
        .map(|d| {
            if d < axis {
                d as i64
            } else {
                (d - 1 + k) as i64
            }
        })
        .collect();
    let sizes: Vec<i64> = (0..rank)
        .map(|d| if d == axis { 1 } else { x.dims()[d] as i64 })
        .collect();
    let mut out = x.dims()[..axis].to_vec();
    out.extend_from_slice(idx_dims);
    out.extend_from_slice(&x.dims()[axis + 1..]);
    let attrs = format!(
        "dimension_numbers = #stablehlo.gather<offset_dims = {}, collapsed_slice_dims = [{axis}], start_index_map = [{axis}], index_vector_dim = {k}>, slice_sizes = {}, indices_are_sorted = false",
        list(&offset),
        i64_array(&sizes)
    );
    b.op(
        "stablehlo.gather",
        &[x, &iv],
        &attrs,
        TensorType::new(&out, x.dtype()),
    )
}

/// A `[lo, hi]` per dim padding attribute.
pub(super) fn padding_attr(pad: &[[i64; 2]]) -> String {
    let rows: Vec<String> = pad
        .iter()
        .map(|p| format!("[{}, {}]", p[0], p[1]))
        .collect();
    format!("dense<[{}]> : tensor<{}x2xi64>", rows.join(", "), pad.len())
}

/// Reshapes a 3-D or 4-D input to 4-D in compute precision.
pub(super) fn to_nchw(b: &mut FnBuilder, x: &Value) -> Value {
    let v = to_compute(b, x);
    b.reshape(&v, &nchw(x.dims()))
}
