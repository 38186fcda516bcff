//! The op definitions, by category. Each file holds, per op, the shape rule, the CPU kernel, the
//! StableHLO lowering and the row of the op table that the generic tests and `op_coverage` use.

use tpu_tensor::{DType, Element, Result, Tensor};

use crate::op::OpInfo;

pub mod cast;
pub mod conv;
pub mod elementwise;
pub mod linalg;
pub mod movement;
pub mod nn;
pub mod reduce;

/// The op table, part by part.
/// A category's name and the function listing its rows.
pub(crate) type TablePart = (&'static str, fn() -> Vec<OpInfo>);

pub(crate) const TABLES: &[TablePart] = &[
    ("unary", elementwise::unary::table),
    ("binary", elementwise::binary::table),
    ("cast", cast::table),
    ("reduce", reduce::table),
    ("linalg", linalg::table),
    ("conv", conv::table),
    ("movement", movement::table),
    ("nn", nn::table),
    ("view", movement::view::table),
];

/// Maps an f64 tensor's values on the host (for building sample inputs).
pub(crate) fn host_map(t: &Tensor, f: impl Fn(f64) -> f64) -> Result<Tensor> {
    let v: Vec<f64> = t
        .to_dtype(DType::F64)?
        .to_vec::<f64>()?
        .into_iter()
        .map(f)
        .collect();
    Tensor::from_vec(v, t.shape(), t.device())
}

/// True when any element of the view `t` (whose storage is `data`) is zero.
pub(crate) fn any_zero<T: Element>(data: &[T], t: &Tensor) -> bool {
    let walk = t.layout().walk();
    let mut found = false;
    walk.for_rows(0, walk.rows(), |_, off| {
        for j in 0..walk.inner() {
            if data[off + j * walk.inner_stride()].to_f64() == 0.0 {
                found = true;
            }
        }
    });
    found
}

/// Sums `t` over `dims` (keeping them as size 1 when `keepdim`): the reduction autograd needs to
/// undo broadcasting. Sums keep the gradient's float dtype.
pub(crate) fn reduce_sum_dims(t: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    if dims.is_empty() {
        return Ok(t.clone());
    }
    reduce::reduce(t, reduce::ReduceKind::Sum, dims, keepdim)
}
