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
