//! Bucketing: dims whose size varies from call to call (a sequence length, a batch size) are
//! padded up to the next bucket, so a function compiles once per bucket instead of once per
//! size.
//!
//! Padding is only correct if the function knows which positions are padding, so a function
//! with bucketed dims receives, after its own arguments, one 0-d `i64` tensor per bucketed dim
//! holding the true size (a tensor, so it changes without a recompile); with it the function
//! masks what it must (`arange(n) < len`). Outputs declared with
//! [`CompileOptions::slice_output`](crate::CompileOptions::slice_output) are cut back to the
//! true size. Bucketed arguments are padded copies: writes into them are not seen by the
//! caller.

use tpu_ops::ops::movement::cat;
use tpu_ops::tpu_tensor::{DType, Error, Result, Tensor};

/// The sizes a bucketed dim is padded up to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Buckets {
    /// The next power of two.
    PowersOfTwo,
    /// The smallest of these sizes that holds the dim (sorted when set); a larger size is an
    /// error.
    Sizes(Vec<usize>),
}

impl Buckets {
    /// The bucket a dim of size `n` pads up to.
    pub fn bucket(&self, n: usize) -> Result<usize> {
        match self {
            Buckets::PowersOfTwo => n.checked_next_power_of_two().ok_or_else(|| {
                Error::invalid_argument("compile", format!("no power of two holds {n}"))
            }),
            Buckets::Sizes(sizes) => sizes.iter().copied().find(|&b| b >= n).ok_or_else(|| {
                Error::invalid_argument(
                    "compile",
                    format!("size {n} is larger than the largest bucket of {sizes:?}"),
                )
            }),
        }
    }
}

/// One argument dim padded up to a bucket, and the value padding fills it with.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketDim {
    /// The argument.
    pub arg: usize,
    /// Its dim.
    pub dim: usize,
    /// The sizes it pads up to.
    pub buckets: Buckets,
    /// What padded positions hold.
    pub pad: f64,
}

/// One output dim cut back to the true size of a bucketed dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceOutput {
    /// The output.
    pub output: usize,
    /// Its dim.
    pub dim: usize,
    /// Which bucketed dim (index into the declared ones) gives the size.
    pub bucket: usize,
}

/// The true size of each bucketed dim of `args`.
pub fn true_sizes(args: &[Tensor], dims: &[BucketDim]) -> Result<Vec<usize>> {
    dims.iter()
        .map(|d| {
            let t = args.get(d.arg).ok_or_else(|| {
                Error::invalid_argument(
                    "compile",
                    format!(
                        "a bucketed dim names argument {}, but the call has {} arguments",
                        d.arg,
                        args.len()
                    ),
                )
            })?;
            t.shape().get(d.dim).copied().ok_or_else(|| {
                Error::invalid_argument(
                    "compile",
                    format!(
                        "a bucketed dim names dim {} of argument {}, which has shape {:?}",
                        d.dim,
                        d.arg,
                        t.shape()
                    ),
                )
            })
        })
        .collect()
}

/// The arguments the function receives: `args` (padded when `pad`), then the true sizes as
/// 0-d `i64` tensors on the device of the argument each belongs to.
pub fn arguments(
    args: &[Tensor],
    dims: &[BucketDim],
    sizes: &[usize],
    pad: bool,
) -> Result<Vec<Tensor>> {
    let mut out: Vec<Tensor> = args.to_vec();
    if pad {
        for (d, &n) in dims.iter().zip(sizes) {
            let t = &out[d.arg];
            let b = d.buckets.bucket(n)?;
            let have = t.shape()[d.dim];
            if b > have {
                let mut shape = t.shape().to_vec();
                shape[d.dim] = b - have;
                let filler = Tensor::full(&shape[..], d.pad, t.dtype(), t.device())?;
                out[d.arg] = cat(&[t, &filler], d.dim)?;
            }
        }
    }
    for (d, &n) in dims.iter().zip(sizes) {
        out.push(Tensor::full(
            [0usize; 0],
            n as f64,
            DType::I64,
            args[d.arg].device(),
        )?);
    }
    Ok(out)
}

/// Cuts the declared outputs back to the true sizes.
pub fn slice(
    mut outs: Vec<Tensor>,
    slices: &[SliceOutput],
    sizes: &[usize],
) -> Result<Vec<Tensor>> {
    for s in slices {
        let n = *sizes.get(s.bucket).ok_or_else(|| {
            Error::invalid_argument(
                "compile",
                format!(
                    "an output slice names bucketed dim {}, but {} are declared",
                    s.bucket,
                    sizes.len()
                ),
            )
        })?;
        let o = outs.get(s.output).ok_or_else(|| {
            Error::invalid_argument(
                "compile",
                format!(
                    "an output slice names output {}, but the function returned {}",
                    s.output,
                    outs.len()
                ),
            )
        })?;
        outs[s.output] = o.narrow(s.dim, 0, n)?;
    }
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_up() {
        assert_eq!(Buckets::PowersOfTwo.bucket(5).unwrap(), 8);
        assert_eq!(Buckets::PowersOfTwo.bucket(8).unwrap(), 8);
        let s = Buckets::Sizes(vec![16, 64, 256]);
        assert_eq!(s.bucket(1).unwrap(), 16);
        assert_eq!(s.bucket(64).unwrap(), 64);
        assert_eq!(s.bucket(65).unwrap(), 256);
        assert!(
            s.bucket(257)
                .unwrap_err()
                .to_string()
                .contains("largest bucket")
        );
    }
}
