//! Views in StableHLO: a program's arguments are dense buffers, and these instructions turn one
//! into the strided view an op reads (a reshape when the view is the whole buffer in order, a
//! gather of computed offsets otherwise). The eager path and a whole-graph lowering share them.

use tpu_tensor::{DType, Layout};

use super::{FnBuilder, TensorType, Value};

/// Emits the instructions that turn a dense buffer argument into the tensor view `layout`.
pub fn materialize_view(
    b: &mut FnBuilder,
    arg: &Value,
    layout: &Layout,
    buffer_numel: usize,
) -> Value {
    let shape: Vec<usize> = layout.shape.to_vec();
    let numel: usize = shape.iter().product();
    if layout.is_contiguous() && layout.offset == 0 && numel == buffer_numel {
        return b.reshape(arg, &shape);
    }
    if numel == 0 {
        return b.splat(TensorType::new(&shape, arg.dtype()), 0);
    }
    if let Some(v) = permuted_broadcast(b, arg, layout, buffer_numel) {
        return v;
    }
    // General case: gather the elements at offset + sum(index_d * stride_d) from the flat buffer.
    let flat = b.reshape(arg, &[buffer_numel]);
    let idx_dims: Vec<usize> = shape.clone();
    let idx = layout_offsets(b, layout);
    let mut idx_shape = idx_dims.clone();
    idx_shape.push(1);
    let idx = b.reshape(&idx, &idx_shape);
    let attrs = format!(
        "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = {}>, slice_sizes = array<i64: 1>, indices_are_sorted = false",
        shape.len()
    );
    b.op(
        "stablehlo.gather",
        &[&flat, &idx],
        &attrs,
        TensorType::new(&shape, arg.dtype()),
    )
}

/// The view as a transpose and a broadcast of the whole buffer, when it is one: its dims of
/// stride 0 (or size 1) aside, the others, ordered by stride, lay the buffer out densely from
/// offset 0 (a transpose, a `permute`, an `expand` of such). A gather of computed offsets
/// gives the same values, but compilers see through a transpose and a broadcast.
fn permuted_broadcast(
    b: &mut FnBuilder,
    arg: &Value,
    layout: &Layout,
    buffer_numel: usize,
) -> Option<Value> {
    if layout.offset != 0 {
        return None;
    }
    let real: Vec<usize> = (0..layout.shape.len())
        .filter(|&d| layout.shape[d] > 1 && layout.strides[d] != 0)
        .collect();
    let mut by_stride = real.clone();
    by_stride.sort_by_key(|&d| std::cmp::Reverse(layout.strides[d]));
    let mut expect = 1usize;
    for &d in by_stride.iter().rev() {
        if layout.strides[d] != expect {
            return None;
        }
        expect = expect.checked_mul(layout.shape[d])?;
    }
    if expect != buffer_numel {
        return None;
    }
    // The buffer as the real dims in storage order, then in the view's order, then the view.
    let stored: Vec<usize> = by_stride.iter().map(|&d| layout.shape[d]).collect();
    let dense = b.reshape(arg, &stored);
    let perm: Vec<i64> = real
        .iter()
        .map(|d| by_stride.iter().position(|x| x == d).map(|p| p as i64))
        .collect::<Option<_>>()?;
    let ordered = b.transpose(&dense, &perm);
    let map: Vec<i64> = real.iter().map(|&d| d as i64).collect();
    Some(b.broadcast_in_dim(&ordered, &map, &layout.shape))
}

/// The storage offset of every element of `layout`, as an i64 tensor of the layout's shape.
pub fn layout_offsets(b: &mut FnBuilder, layout: &Layout) -> Value {
    let shape: Vec<usize> = layout.shape.to_vec();
    let mut idx = b.splat(TensorType::new(&shape, DType::I64), layout.offset as i64);
    for (d, &stride) in layout.strides.iter().enumerate() {
        if shape[d] == 1 || stride == 0 {
            continue;
        }
        let io = b.iota(&shape, d, DType::I64);
        let s = b.splat(TensorType::new(&shape, DType::I64), stride as i64);
        let term = b.ew("stablehlo.multiply", &[&io, &s]);
        idx = b.ew("stablehlo.add", &[&idx, &term]);
    }
    idx
}
