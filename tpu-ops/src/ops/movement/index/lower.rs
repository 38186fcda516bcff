//! StableHLO lowerings of the index ops (`stablehlo.gather`/`scatter` with full coordinates),
//! and the device-side index checks they run while device checks are on.

use std::sync::Arc;

use tpu_tensor::shape::resolve_dim;
use tpu_tensor::{DType, Result, Scalar};

use super::super::args::at_least_1d;
use super::super::lower::{range_list, zeros};
use super::{
    Gather, IndexAdd, IndexCopy, IndexSelect, OneHot, Scatter, ScatterReduce, one_hot_error,
};
use crate::hlo::checks::{DeviceCheck, index_check};
use crate::hlo::lower::{Checks, Lowered, OpIo};
use crate::hlo::{Cmp, FnBuilder, TensorType, Value, i64_array, list};
use crate::op::Meta;
use crate::op::promote::compute_dtype;

/// Index tensor and dim as full coordinates for `stablehlo.gather`/`scatter`: shape
/// `index.dims + [rank]`, with iotas for the other dims.
fn full_coords(b: &mut FnBuilder, index: &Value, dim: usize) -> Value {
    let s = index.dims().to_vec();
    let r = s.len();
    let mut s1 = s.clone();
    s1.push(1);
    let parts: Vec<Value> = (0..r)
        .map(|d| {
            let v = if d == dim {
                index.clone()
            } else {
                b.iota(&s, d, DType::I64)
            };
            b.reshape(&v, &s1)
        })
        .collect();
    let refs: Vec<&Value> = parts.iter().collect();
    if r == 1 {
        parts[0].clone()
    } else {
        b.concatenate(&refs, r)
    }
}

pub(super) fn gather(op: &Gather, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    if let Some(z) = io.zeros_if_empty(b) {
        return Ok(z);
    }
    let x = b.reshape(&inputs[0], &at_least_1d(inputs[0].dims()));
    let index = b.reshape(&inputs[1], &at_least_1d(inputs[1].dims()));
    let d = resolve_dim("gather", op.dim, x.dims())?;
    let r = x.ty.rank();
    let coords = full_coords(b, &index, d);
    let attrs = format!(
        "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = {all}, start_index_map = {all}, index_vector_dim = {r}>, slice_sizes = {}, indices_are_sorted = false",
        i64_array(&vec![1; r]),
        all = range_list(r),
    );
    let g = b.op(
        "stablehlo.gather",
        &[&x, &coords],
        &attrs,
        TensorType::new(index.dims(), x.dtype()),
    );
    Ok(vec![b.reshape(&g, &outputs[0].shape)])
}

pub(super) fn gather_checks(op: &Gather, b: &mut FnBuilder, io: OpIo) -> Checks {
    let OpIo { inputs, .. } = io;
    index_check(
        b,
        "gather",
        &inputs[1],
        op.dim,
        &at_least_1d(inputs[0].dims()),
    )
}

/// `stablehlo.scatter` of `upd` into `x` at `coords` (all in `x`'s dtype) under the dimension
/// numbers `numbers`, combining by `reduce` (bool has no arithmetic: add and max are `or`,
/// prod and min are `and`). Float max and min are explicit comparisons so that NaN wins on
/// every backend.
fn scatter_hlo(
    b: &mut FnBuilder,
    x: &Value,
    coords: &Value,
    upd: &Value,
    reduce: ScatterReduce,
    numbers: &str,
) -> Value {
    let comp = x.dtype();
    let region = b.region(&[TensorType::scalar(comp)], 2, |b, a| {
        let (old, new) = (&a[0], &a[1]);
        let bool_op = |max_like: bool| {
            if max_like {
                "stablehlo.or"
            } else {
                "stablehlo.and"
            }
        };
        let v = match reduce {
            ScatterReduce::Replace => new.clone(),
            ScatterReduce::Add if comp == DType::Bool => b.ew(bool_op(true), &[old, new]),
            ScatterReduce::Add => b.ew("stablehlo.add", &[old, new]),
            ScatterReduce::Prod if comp == DType::Bool => b.ew(bool_op(false), &[old, new]),
            ScatterReduce::Prod => b.ew("stablehlo.multiply", &[old, new]),
            ScatterReduce::Amax | ScatterReduce::Amin => {
                let max = reduce == ScatterReduce::Amax;
                if comp == DType::Bool {
                    b.ew(bool_op(max), &[old, new])
                } else if !comp.is_float() {
                    let op = if max {
                        "stablehlo.maximum"
                    } else {
                        "stablehlo.minimum"
                    };
                    b.ew(op, &[old, new])
                } else {
                    let better = b.compare(if max { Cmp::Gt } else { Cmp::Lt }, old, new);
                    let nan = b.compare(Cmp::Ne, old, old);
                    let keep = b.ew("stablehlo.or", &[&better, &nan]);
                    b.select(&keep, old, new)
                }
            }
        };
        vec![v]
    });
    let attrs = format!(
        "scatter_dimension_numbers = #stablehlo.scatter<{numbers}>, indices_are_sorted = false, unique_indices = false"
    );
    b.op_n(
        "stablehlo.scatter",
        &[x, coords, upd],
        &attrs,
        &region,
        std::slice::from_ref(&x.ty),
    )
    .remove(0)
}

pub(super) fn scatter(op: &Scatter, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let x = b.reshape(&inputs[0], &at_least_1d(inputs[0].dims()));
    let index = b.reshape(&inputs[1], &at_least_1d(inputs[1].dims()));
    if index.ty.numel() == 0 || x.ty.numel() == 0 {
        return Ok(vec![inputs[0].clone()]);
    }
    let d = resolve_dim(op.op_name(), op.dim, x.dims())?;
    let r = x.ty.rank();
    let upd = if op.value {
        b.broadcast_in_dim(&inputs[2], &[], index.dims())
    } else {
        let s = b.reshape(&inputs[2], &at_least_1d(inputs[2].dims()));
        let zero = vec![0i64; r];
        let lim: Vec<i64> = index.dims().iter().map(|&n| n as i64).collect();
        b.slice(&s, &zero, &lim, &vec![1; r])
    };
    let dtype = x.dtype();
    let comp = if op.accumulates() {
        compute_dtype(dtype)
    } else {
        dtype
    };
    let mut xc = b.convert(&x, comp);
    let upd = b.convert(&upd, comp);
    let coords = full_coords(b, &index, d);
    let numbers = format!(
        "inserted_window_dims = {all}, scatter_dims_to_operand_dims = {all}, index_vector_dim = {r}",
        all = range_list(r)
    );
    if !op.include_self {
        let start = b.splat(upd.ty.clone(), op.reduce.identity(comp));
        xc = scatter_hlo(b, &xc, &coords, &start, ScatterReduce::Replace, &numbers);
    }
    let s = scatter_hlo(b, &xc, &coords, &upd, op.reduce, &numbers);
    let s = b.convert(&s, dtype);
    Ok(vec![b.reshape(&s, &outputs[0].shape)])
}

pub(super) fn scatter_checks(op: &Scatter, b: &mut FnBuilder, io: OpIo) -> Checks {
    let OpIo { inputs, .. } = io;
    let shape = at_least_1d(inputs[0].dims());
    index_check(b, op.op_name(), &inputs[1], op.dim, &shape)
}

pub(super) fn index_select(op: &IndexSelect, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    if let Some(z) = io.zeros_if_empty(b) {
        return Ok(z);
    }
    let x = &inputs[0];
    let d = resolve_dim(op.op_name(), op.dim, x.dims())?;
    let n = inputs[1].ty.numel();
    let index = b.reshape(&inputs[1], &[n, 1]);
    let r = x.ty.rank();
    let offs: Vec<i64> = (0..r as i64).filter(|&k| k != d as i64).collect();
    let mut sizes: Vec<i64> = x.dims().iter().map(|&s| s as i64).collect();
    sizes[d] = 1;
    let offset_dims = if offs.is_empty() {
        String::new()
    } else {
        format!("offset_dims = {}, ", list(&offs))
    };
    let attrs = format!(
        "dimension_numbers = #stablehlo.gather<{offset_dims}collapsed_slice_dims = [{d}], start_index_map = [{d}], index_vector_dim = 1>, slice_sizes = {}, indices_are_sorted = false",
        i64_array(&sizes)
    );
    let flat = TensorType::new(&op.flat_shape(x.dims(), d, n), x.dtype());
    let g = b.op("stablehlo.gather", &[x, &index], &attrs, flat);
    Ok(vec![b.reshape(&g, &outputs[0].shape)])
}

pub(super) fn index_select_checks(op: &IndexSelect, b: &mut FnBuilder, io: OpIo) -> Checks {
    let OpIo { inputs, .. } = io;
    index_check(b, op.op_name(), &inputs[1], op.dim, inputs[0].dims())
}

pub(super) fn index_add(op: &IndexAdd, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, .. } = io;
    let (x, src) = (&inputs[0], &inputs[2]);
    let n = inputs[1].ty.numel();
    let dtype = x.dtype();
    if n == 0 || x.ty.numel() == 0 || (dtype == DType::Bool && op.alpha.to_f64() == 0.0) {
        return Ok(vec![x.clone()]);
    }
    let d = resolve_dim("index_add", op.dim, x.dims())?;
    let comp = compute_dtype(dtype);
    let xc = b.convert(x, comp);
    let mut upd = b.convert(src, comp);
    let alpha = if comp.is_float() {
        Scalar::Float(op.alpha.to_f64())
    } else {
        Scalar::Int(op.alpha.to_i64())
    };
    if comp != DType::Bool && alpha.to_f64() != 1.0 {
        let a = b.splat(upd.ty.clone(), alpha);
        upd = b.ew("stablehlo.multiply", &[&upd, &a]);
    }
    let s = scatter_slices(b, &xc, &inputs[1], &upd, d, ScatterReduce::Add);
    Ok(vec![b.convert(&s, dtype)])
}

/// `x` with the slices of `upd` along `d` scattered to the positions of the 1-D `index`
/// (added, or replacing): one scatter of whole slices.
fn scatter_slices(
    b: &mut FnBuilder,
    x: &Value,
    index: &Value,
    upd: &Value,
    d: usize,
    reduce: ScatterReduce,
) -> Value {
    let n = index.ty.numel();
    let r = x.ty.rank();
    let index = b.reshape(index, &[n, 1]);
    let window: Vec<i64> = (0..r as i64).filter(|&k| k != d as i64).collect();
    let window = if window.is_empty() {
        String::new()
    } else {
        format!("update_window_dims = {}, ", list(&window))
    };
    let numbers = format!(
        "{window}inserted_window_dims = [{d}], scatter_dims_to_operand_dims = [{d}], index_vector_dim = 1"
    );
    scatter_hlo(b, x, &index, upd, reduce, &numbers)
}

pub(super) fn index_copy(op: &IndexCopy, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, .. } = io;
    let (x, src) = (&inputs[0], &inputs[2]);
    if inputs[1].ty.numel() == 0 || x.ty.numel() == 0 {
        return Ok(vec![x.clone()]);
    }
    let d = resolve_dim("index_copy", op.dim, x.dims())?;
    Ok(vec![scatter_slices(
        b,
        x,
        &inputs[1],
        src,
        d,
        ScatterReduce::Replace,
    )])
}

pub(super) fn index_copy_checks(op: &IndexCopy, b: &mut FnBuilder, io: OpIo) -> Checks {
    let OpIo { inputs, .. } = io;
    // As PyTorch: an empty source copies nothing, so its index is not checked.
    if inputs[2].ty.numel() == 0 {
        return Ok(Vec::new());
    }
    index_check(b, "index_copy", &inputs[1], op.dim, inputs[0].dims())
}

pub(super) fn index_add_checks(op: &IndexAdd, b: &mut FnBuilder, io: OpIo) -> Checks {
    let OpIo { inputs, .. } = io;
    // As PyTorch: an empty source adds nothing, so its index is not checked.
    if inputs[2].ty.numel() == 0 {
        return Ok(Vec::new());
    }
    index_check(b, "index_add", &inputs[1], op.dim, inputs[0].dims())
}

pub(super) fn one_hot(b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
    let out = &outputs[0];
    if out.numel() == 0 {
        return Ok(vec![zeros(b, out)]);
    }
    let x = &inputs[0];
    let r = x.ty.rank();
    let map: Vec<i64> = (0..r as i64).collect();
    let xb = b.broadcast_in_dim(x, &map, &out.shape);
    let io = b.iota(&out.shape, r, DType::I64);
    let eq = b.compare(Cmp::Eq, &xb, &io);
    Ok(vec![b.convert(&eq, DType::I64)])
}

pub(super) fn one_hot_checks(
    op: &OneHot,
    b: &mut FnBuilder,
    inputs: &[Value],
) -> Result<Vec<DeviceCheck>> {
    let x = &inputs[0];
    let c = op.num_classes;
    let shape = x.dims().to_vec();
    Ok(crate::hlo::checks::index_in_range(b, x, c, None)
        .map(|value| DeviceCheck {
            value,
            error: Arc::new(move |f: crate::hlo::checks::Found| {
                one_hot_error(f.value, f.position, c, &shape)
            }),
        })
        .into_iter()
        .collect())
}
