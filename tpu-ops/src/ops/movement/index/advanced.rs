//! Advanced indexing (`x[i, :, j]`, ATen's `index.Tensor`, and writes through it,
//! `index_put`): a list of optional index
//! tensors, one per leading dim (`None` keeps the dim whole). Integer indices (negative ones
//! count from the end) broadcast together; a bool mask stands for the indices of its true
//! elements over as many dims as it has (found with `nonzero`, one host read on PJRT devices;
//! a 0-d mask is refused).
//! The result has the broadcast index shape in place of the indexed dims when they are
//! adjacent, else in front, as PyTorch places it.
//!
//! A composition: the indexed dims are moved to the front and flattened, the indices combined
//! into one flat index (each first checked against its dim by an `index_select`, so an index
//! out of range is an error, never a wrong element), then one `index_select` to read, or one
//! `index_copy` / `index_add` to write. It runs on every device, and its gradients are theirs
//! (duplicate indices accumulate on read).

use tpu_tensor::shape::broadcast_shapes;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Error, Result, Tensor};

use crate::TensorOps;
use crate::ops::movement::MovementOps;

const OP: &str = "index";

/// Where advanced indexing reads: `x` permuted by `perm` (indexed dims first) and flattened to
/// `front` (`[product of the indexed sizes, rest...]`) is read at the `flat` positions, giving
/// `[index shape..., rest...]`; with `at`, the index dims then move to position `at`.
struct Plan {
    flat: Tensor,
    perm: Vec<usize>,
    front: Vec<usize>,
    index_shape: Vec<usize>,
    rest_shape: Vec<usize>,
    at: Option<usize>,
}

impl Plan {
    /// The shape `x[indices]` has.
    fn result_shape(&self) -> Vec<usize> {
        let at = self.at.unwrap_or(0);
        let mut s = self.rest_shape[..at].to_vec();
        s.extend(&self.index_shape);
        s.extend(&self.rest_shape[at..]);
        s
    }

    /// The order that moves the index dims of `[index..., rest...]` to `at`, and its inverse.
    fn placement(&self) -> Option<(Vec<usize>, Vec<usize>)> {
        let at = self.at?;
        let (nb, n) = (
            self.index_shape.len(),
            self.index_shape.len() + self.rest_shape.len(),
        );
        let to: Vec<usize> = (nb..nb + at).chain(0..nb).chain(nb + at..n).collect();
        let back: Vec<usize> = (at..at + nb).chain(0..at).chain(at + nb..n).collect();
        Some((to, back))
    }
}

/// `x[indices]`: see the module doc.
pub(crate) fn index(x: &Tensor, indices: &[Option<&Tensor>]) -> Result<Tensor> {
    let Some(p) = plan(x, indices)? else {
        return x.copy();
    };
    let picked = x
        .permute(p.perm.clone())?
        .reshape(p.front.clone())?
        .index_select(0, &p.flat)?;
    let mut shape = p.index_shape.clone();
    shape.extend(&p.rest_shape);
    let out = picked.reshape(shape)?;
    match p.placement() {
        Some((to, _)) => out.permute(to),
        None => Ok(out),
    }
}

/// `x` with `values` (broadcast to the shape `x[indices]` has) written at the indexed
/// positions, or added to them with `accumulate` (ATen's `index_put`). Without accumulation,
/// a position indexed twice takes one of its values.
pub(crate) fn index_put(
    x: &Tensor,
    indices: &[Option<&Tensor>],
    values: &Tensor,
    accumulate: bool,
) -> Result<Tensor> {
    const PUT: &str = "index_put";
    if values.dtype() != x.dtype() {
        return Err(Error::invalid_argument(
            PUT,
            format!(
                "expected values of the input's dtype {}, got {}",
                x.dtype(),
                values.dtype()
            ),
        ));
    }
    let Some(p) = plan(x, indices)? else {
        let v = values.expand(x.shape())?;
        return if accumulate { x.add(&v) } else { v.copy() };
    };
    let result = p.result_shape();
    let v = values.expand(&result[..]).map_err(|_| {
        Error::shape(
            PUT,
            format!(
                "values of shape {} do not broadcast to the indexed shape {}",
                fmt_shape(values.shape()),
                fmt_shape(&result)
            ),
        )
    })?;
    let v = match p.placement() {
        Some((_, back)) => v.permute(back)?,
        None => v,
    };
    let count: usize = p.index_shape.iter().product();
    let mut rows = vec![count];
    rows.extend(&p.rest_shape);
    let v = v.reshape(rows)?;
    let permuted = x.permute(p.perm.clone())?;
    let permuted_shape = permuted.shape().to_vec();
    let xp = permuted.reshape(p.front.clone())?;
    let written = if accumulate {
        xp.index_add(0, &p.flat, &v, 1)?
    } else {
        xp.index_copy(0, &p.flat, &v)?
    };
    let mut inverse = vec![0; p.perm.len()];
    for (i, &d) in p.perm.iter().enumerate() {
        inverse[d] = i;
    }
    written.reshape(permuted_shape)?.permute(inverse)
}

/// The plan of `x[indices]`, or `None` when no index is a tensor.
fn plan(x: &Tensor, indices: &[Option<&Tensor>]) -> Result<Option<Plan>> {
    // Masks become one integer index per dim they cover.
    let mut expanded: Vec<Option<Tensor>> = Vec::with_capacity(indices.len());
    for ix in indices {
        match ix {
            None => expanded.push(None),
            Some(t) if matches!(t.dtype(), DType::Bool | DType::U8) => {
                if t.rank() == 0 {
                    return Err(Error::invalid_argument(
                        OP,
                        "a 0-d bool index is not supported; index with a 1-element mask instead",
                    ));
                }
                let d = expanded.len();
                let covered = x.shape().get(d..d + t.rank());
                if covered != Some(t.shape()) {
                    return Err(Error::shape(
                        OP,
                        format!(
                            "the mask {} must match the shape of the dims it indexes, from \
                             dim {d} of {}",
                            fmt_shape(t.shape()),
                            fmt_shape(x.shape())
                        ),
                    ));
                }
                // `nonzero` reads a u8 mask's non-zero bytes as true.
                let nz = t.nonzero()?;
                for c in 0..t.rank() {
                    expanded.push(Some(nz.select(1, c as i64)?));
                }
            }
            Some(t) if t.dtype().is_int() => expanded.push(Some(t.to(DType::I64)?)),
            Some(t) => {
                return Err(Error::invalid_argument(
                    OP,
                    format!("expected integer or bool index tensors, got {}", t.dtype()),
                ));
            }
        }
    }
    if expanded.len() > x.rank() {
        return Err(Error::shape(
            OP,
            format!(
                "{} indices for a tensor of shape {} with {} dims",
                expanded.len(),
                fmt_shape(x.shape()),
                x.rank()
            ),
        ));
    }
    let dims: Vec<usize> = (0..expanded.len())
        .filter(|&d| expanded[d].is_some())
        .collect();
    if dims.is_empty() {
        return Ok(None);
    }
    let ixs: Vec<&Tensor> = dims.iter().filter_map(|&d| expanded[d].as_ref()).collect();
    let mut shape = ixs[0].shape().to_vec();
    for t in &ixs[1..] {
        shape = broadcast_shapes(OP, &shape, t.shape())
            .map_err(|_| {
                let all: Vec<String> = ixs.iter().map(|t| fmt_shape(t.shape())).collect();
                Error::shape(
                    OP,
                    format!(
                        "indexing tensors could not be broadcast together with shapes {}",
                        all.join(", ")
                    ),
                )
            })?
            .to_vec();
    }
    let count: usize = shape.iter().product();
    // One flat index over the indexed dims, each index checked against its dim first.
    let mut flat: Option<Tensor> = None;
    for (&d, t) in dims.iter().zip(&ixs) {
        let size = x.shape()[d];
        let wrapped = crate::where_(&t.lt(0.0)?, &t.add(size as i64)?, t)?;
        let positions = Tensor::arange(0i64, size as i64, 1i64, DType::I64, x.device())?;
        let checked = positions
            .index_select(0, &wrapped.expand(&shape[..])?.reshape([count])?)
            .map_err(|e| match e {
                Error::IndexOutOfRange { index, size, .. } => Error::IndexOutOfRange {
                    op: OP.into(),
                    index,
                    dim: d,
                    size,
                    shape: x.shape().to_vec(),
                },
                e => e,
            })?;
        flat = Some(match flat {
            None => checked,
            Some(f) => f.mul(size as i64)?.add(&checked)?,
        });
    }
    let flat = flat.expect("at least one indexed dim, checked above");
    let rest: Vec<usize> = (0..x.rank()).filter(|d| !dims.contains(d)).collect();
    let perm: Vec<usize> = dims.iter().chain(&rest).copied().collect();
    let indexed: usize = dims.iter().map(|&d| x.shape()[d]).product();
    let rest_shape: Vec<usize> = rest.iter().map(|&d| x.shape()[d]).collect();
    let mut front = vec![indexed];
    front.extend(&rest_shape);
    // Adjacent indexed dims keep their place (after the whole dims before them).
    let adjacent = dims.windows(2).all(|w| w[1] == w[0] + 1);
    let at = (adjacent && dims[0] > 0).then_some(dims[0]);
    Ok(Some(Plan {
        flat,
        perm,
        front,
        index_shape: shape,
        rest_shape,
        at,
    }))
}
