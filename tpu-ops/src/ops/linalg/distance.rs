//! Pairwise distances: `cdist` (between the rows of two batches of matrices) and `pdist`
//! (between the rows of one matrix), composed from differences and the vector `p`-norm, so they
//! run on every device with the norm's backward rule (a zero gradient at a zero distance, as
//! PyTorch). They form every difference in memory: `P * R * M` elements for `cdist`.

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{Device, Error, Result, Tensor};

use crate::TensorOps;
use crate::ops::movement::MovementOps;
use crate::ops::reduce::ReduceOps;

fn check_p(op: &str, p: f64) -> Result<()> {
    if p.is_nan() || p < 0.0 {
        return Err(Error::invalid_argument(
            op,
            format!("expected a non-negative p, got {p}"),
        ));
    }
    Ok(())
}

/// `torch.cdist(x1, x2, p)`: the `p`-norm distances `[..., P, R]` between the rows of `x1`
/// (`[..., P, M]`) and `x2` (`[..., R, M]`), batch dims broadcast; `p` as the vector norm takes
/// it (0 counts differing coordinates, infinity takes the largest difference).
pub fn cdist(x1: &Tensor, x2: &Tensor, p: f64) -> Result<Tensor> {
    const OP: &str = "cdist";
    check_p(OP, p)?;
    let (r1, r2) = (x1.rank(), x2.rank());
    if r1 < 2 || r2 < 2 || x1.shape()[r1 - 1] != x2.shape()[r2 - 1] {
        return Err(Error::shape(
            OP,
            format!(
                "expected x1 [..., P, M] and x2 [..., R, M] with the same M, got {} and {}",
                fmt_shape(x1.shape()),
                fmt_shape(x2.shape())
            ),
        ));
    }
    let diff = x1.unsqueeze(-2)?.sub(&x2.unsqueeze(-3)?)?;
    diff.norm(p, &[-1], false)
}

/// `torch.nn.functional.pdist(x, p)`: the `p`-norm distances between the rows of `x` (`[N,
/// M]`), for every pair `i < j` in row-major order (`N (N - 1) / 2` of them).
pub fn pdist(x: &Tensor, p: f64) -> Result<Tensor> {
    const OP: &str = "pdist";
    check_p(OP, p)?;
    if x.rank() != 2 {
        return Err(Error::shape(
            OP,
            format!("expected a matrix [N, M], got {}", fmt_shape(x.shape())),
        ));
    }
    let n = x.shape()[0];
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for i in 0..n {
        for j in i + 1..n {
            first.push(i as i64);
            second.push(j as i64);
        }
    }
    let pairs = first.len();
    if pairs == 0 {
        return Tensor::zeros([0], x.dtype(), x.device());
    }
    let index = |v: Vec<i64>| Tensor::from_vec(v, [pairs], &Device::cpu())?.to_device(x.device());
    let (a, b) = (index(first)?, index(second)?);
    let diff = x.index_select(0, &a)?.sub(&x.index_select(0, &b)?)?;
    diff.norm(p, &[-1], false)
}
