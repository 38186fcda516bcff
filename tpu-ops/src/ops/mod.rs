//! The op families. Each folder holds one family: `mod.rs` (the op structs and their `OpDef`
//! impls, the free functions, the family's trait of `Tensor` methods, the table rows), `cpu.rs`
//! (the CPU kernels), `lower.rs` (the StableHLO lowerings) and `grad.rs` (the backward rules).

use tpu_tensor::{Result, Tensor};

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

/// Sums `t` over `dims` (keeping them as size 1 when `keepdim`): the reduction autograd needs to
/// undo broadcasting. Sums keep the gradient's float dtype.
pub(crate) fn reduce_sum_dims(t: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    if dims.is_empty() {
        return Ok(t.clone());
    }
    reduce::reduce(t, reduce::ReduceKind::Sum, dims, keepdim)
}
