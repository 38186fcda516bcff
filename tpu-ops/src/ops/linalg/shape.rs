//! The shape and dtype rules of the products: one common numeric dtype for every operand, and
//! how `matmul` (and `mm`, `bmm`, `dot`) see their operands' ranks.

use tpu_tensor::shape::broadcast_shapes;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Error, Result};

use super::ProductKind;
use crate::op::args::unsupported;
use crate::op::{DTypeSet, Meta};

/// Dtypes the products accept (PyTorch has no bool matmul).
pub(super) const DTYPES: DTypeSet = DTypeSet::NUMERIC;

/// Checks that all operands share one supported dtype and returns it. `what` names each
/// operand in errors.
pub(super) fn common_dtype(op: &str, inputs: &[Meta], what: &[&str]) -> Result<DType> {
    let d = inputs
        .first()
        .map(|m| m.dtype)
        .ok_or_else(|| Error::invalid_argument(op, "expected at least one operand"))?;
    for (i, m) in inputs.iter().enumerate().skip(1) {
        if m.dtype != d {
            return Err(Error::DTypeMismatch {
                context: format!(
                    "{op}: {} (shape {}) must have the dtype of {} (shape {})",
                    what.get(i).copied().unwrap_or("an operand"),
                    fmt_shape(&m.shape),
                    what.first().copied().unwrap_or("the first operand"),
                    fmt_shape(&inputs[0].shape)
                ),
                expected: d,
                given: m.dtype,
            });
        }
    }
    if !DTYPES.contains(d) {
        return Err(unsupported(op, d, DTYPES));
    }
    Ok(d)
}

/// Refuses an operand count outside `counts`.
pub(super) fn expect_inputs<T>(op: &str, inputs: &[T], counts: &[usize]) -> Result<()> {
    if counts.contains(&inputs.len()) {
        Ok(())
    } else {
        Err(Error::invalid_argument(
            op,
            format!(
                "expected {} operands, got {}",
                tpu_tensor::tpu_runtime::error::join_display(counts, " or "),
                inputs.len()
            ),
        ))
    }
}

/// How `matmul` sees its operands: batch dims broadcast, vectors made matrices.
#[derive(Clone, Debug)]
pub(super) struct Plan {
    pub(super) batch: Vec<usize>,
    pub(super) m: usize,
    pub(super) k: usize,
    pub(super) n: usize,
    pub(super) a_vec: bool,
    pub(super) b_vec: bool,
    pub(super) out: Vec<usize>,
}

/// The [`Plan`] of a product of `kind` of operands shaped `a` and `b`, or the shape error.
pub(super) fn plan(kind: ProductKind, a: &[usize], b: &[usize]) -> Result<Plan> {
    let op = kind.name();
    let shapes = format!("{} and {}", fmt_shape(a), fmt_shape(b));
    let want = |ranks: &str| {
        Error::shape(
            op,
            format!(
                "expected {ranks}, got shapes {shapes} ({}-D and {}-D)",
                a.len(),
                b.len()
            ),
        )
    };
    match kind {
        ProductKind::Matmul if a.is_empty() || b.is_empty() => {
            return Err(want("operands with at least 1 dim each"));
        }
        ProductKind::Mm if a.len() != 2 || b.len() != 2 => return Err(want("two 2-D matrices")),
        ProductKind::Dot if a.len() != 1 || b.len() != 1 => return Err(want("two 1-D vectors")),
        ProductKind::Bmm if a.len() != 3 || b.len() != 3 => return Err(want("two 3-D tensors")),
        ProductKind::Bmm if a[0] != b[0] => {
            return Err(Error::shape(
                op,
                format!(
                    "expected equal batch sizes, got shapes {shapes} (batch {} and {})",
                    a[0], b[0]
                ),
            ));
        }
        _ => {}
    }
    let (a_vec, b_vec) = (a.len() == 1, b.len() == 1);
    let (m, k) = if a_vec {
        (1, a[0])
    } else {
        (a[a.len() - 2], a[a.len() - 1])
    };
    let (k2, n) = if b_vec {
        (b[0], 1)
    } else {
        (b[b.len() - 2], b[b.len() - 1])
    };
    if k != k2 {
        return Err(Error::shape(
            op,
            format!(
                "the contracted dims differ: shapes {shapes} multiply over {k} and {k2} elements"
            ),
        ));
    }
    let a_batch = &a[..a.len().saturating_sub(2)];
    let b_batch = &b[..b.len().saturating_sub(2)];
    let batch = broadcast_shapes(op, a_batch, b_batch)
        .map_err(|_| {
            Error::shape(
                op,
                format!(
                    "the batch dims {} and {} of shapes {shapes} do not broadcast",
                    fmt_shape(a_batch),
                    fmt_shape(b_batch)
                ),
            )
        })?
        .to_vec();
    let mut out = batch.clone();
    if !a_vec {
        out.push(m);
    }
    if !b_vec {
        out.push(n);
    }
    Ok(Plan {
        batch,
        m,
        k,
        n,
        a_vec,
        b_vec,
        out,
    })
}
