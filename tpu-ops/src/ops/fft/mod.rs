//! Discrete Fourier transforms: Core ATen's `_fft_r2c` and `_fft_c2r`, the `_fft_c2c` they are
//! built and differentiated with, and `torch.fft`'s `rfft`, `irfft`, `fft`, `ifft` and their
//! n-dimensional forms.
//!
//! Tensors have no complex dtype. A complex tensor is held as `torch.view_as_real` holds it: a
//! real tensor whose last dim has size 2 (real part, imaginary part), so `[..., n]` complex
//! values are a `[..., n, 2]` tensor of f16, bf16, f32 or f64. The ops' `dims` index the complex
//! shape (the pair dim left out). Everything that works on real tensors (slicing, `abs` of the
//! parts, sums, autograd) works on spectra, and gradients are PyTorch's for a complex tensor
//! seen through `view_as_real`. A magnitude is `z.pow(2).sum(-1).sqrt()`.
//!
//! The CPU kernels run `rustfft` along each transformed dim (any length; f16 and bf16 in f32,
//! rounded once); the lowerings emit `stablehlo.fft` on complex values inside the op's program
//! only, so every PJRT device computes them with its own FFT.

mod cpu;
mod grad;
mod lower;
mod table;

pub use table::table;

use std::str::FromStr;

use tpu_tensor::shape::resolve_dim;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{Error, Result, Tensor};

use crate::exec::dispatch::run1;
use crate::op::args::check_float;
use crate::op::{Meta, OpDef, op_parts};
use crate::ops::movement::grad::zero_pad_dim;
use crate::ops::movement::stack;

/// The scaling of a transform's result, as ATen's `normalization` argument gives it (the same
/// for both directions; `n` is the number of points transformed, the product of the sizes
/// along the transformed dims of the larger side).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FftScale {
    /// No scaling (ATen's 0).
    #[default]
    None,
    /// Times `1/sqrt(n)` (ATen's 1).
    ByRootN,
    /// Times `1/n` (ATen's 2).
    ByN,
}

impl FftScale {
    /// The factor for `n` points.
    pub fn factor(self, n: usize) -> f64 {
        match self {
            FftScale::None => 1.0,
            FftScale::ByRootN => 1.0 / (n as f64).sqrt(),
            FftScale::ByN => 1.0 / n as f64,
        }
    }
}

/// `torch.fft`'s `norm` argument: which direction carries the `1/n`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FftNorm {
    /// The inverse transforms scale by `1/n` (the default).
    #[default]
    Backward,
    /// Both directions scale by `1/sqrt(n)`.
    Ortho,
    /// The forward transforms scale by `1/n`.
    Forward,
}

impl FftNorm {
    /// The scaling of a transform in the given direction.
    pub fn scale(self, forward: bool) -> FftScale {
        match (self, forward) {
            (FftNorm::Ortho, _) => FftScale::ByRootN,
            (FftNorm::Backward, true) | (FftNorm::Forward, false) => FftScale::None,
            (FftNorm::Backward, false) | (FftNorm::Forward, true) => FftScale::ByN,
        }
    }
}

impl FromStr for FftNorm {
    type Err = Error;

    fn from_str(s: &str) -> Result<FftNorm> {
        match s {
            "backward" => Ok(FftNorm::Backward),
            "ortho" => Ok(FftNorm::Ortho),
            "forward" => Ok(FftNorm::Forward),
            _ => Err(Error::invalid_argument(
                "fft",
                format!("expected norm \"backward\", \"ortho\" or \"forward\", got {s:?}"),
            )),
        }
    }
}

/// The transform of a real tensor over `dims`: a one-sided spectrum (the last of `dims` keeps
/// `n/2 + 1` frequencies) or, with `onesided` false, the full one; as complex pairs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FftR2c {
    /// The transformed dims of the input, the halved one last.
    pub dims: Vec<usize>,
    /// The scaling (by the input's points).
    pub scale: FftScale,
    /// Keep only the non-negative frequencies of the last dim.
    pub onesided: bool,
}

/// The inverse transform of a one-sided spectrum (complex pairs) over `dims` to real values of
/// `last_dim_size` points along the last of `dims`. The imaginary parts of the zero frequency
/// and, for an even size, of the highest one are ignored, and frequencies past
/// `last_dim_size / 2` are read as zeros or left out.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FftC2r {
    /// The transformed dims of the complex input, the one-sided one last.
    pub dims: Vec<usize>,
    /// The scaling (by the output's points).
    pub scale: FftScale,
    /// The size of the output along the last of `dims`.
    pub last_dim_size: usize,
}

/// The transform of complex pairs over `dims`, forward (`exp(-2πi jk/n)`) or backward
/// (`exp(+2πi jk/n)`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FftC2c {
    /// The transformed dims of the complex input.
    pub dims: Vec<usize>,
    /// The scaling (by the points).
    pub scale: FftScale,
    /// The forward direction.
    pub forward: bool,
}

/// The complex shape of a tensor of complex pairs, or an error naming `op`.
fn complex_shape(op: &str, m: &Meta) -> Result<Vec<usize>> {
    check_float(op, m)?;
    match m.shape.split_last() {
        Some((2, lead)) if !lead.is_empty() => Ok(lead.to_vec()),
        _ => Err(Error::shape(
            op,
            format!(
                "expected complex values as pairs (a last dim of size 2 after at least one \
                 other dim), got shape {}",
                fmt_shape(&m.shape)
            ),
        )),
    }
}

/// Checks that `dims` are distinct dims of `shape`, at least one, each of at least one point.
fn check_dims(op: &str, dims: &[usize], shape: &[usize]) -> Result<()> {
    if dims.is_empty() {
        return Err(Error::invalid_argument(
            op,
            "expected at least one dim to transform",
        ));
    }
    for (i, &d) in dims.iter().enumerate() {
        if d >= shape.len() || dims[..i].contains(&d) {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "expected distinct dims of the complex shape {}, got {dims:?}",
                    fmt_shape(shape)
                ),
            ));
        }
        if shape[d] == 0 {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "expected at least one point along dim {d}, got shape {}",
                    fmt_shape(shape)
                ),
            ));
        }
    }
    Ok(())
}

/// The number of points along `dims` of `shape`.
fn points(shape: &[usize], dims: &[usize]) -> usize {
    dims.iter().map(|&d| shape[d]).product()
}

/// The last transformed dim (the one a real transform halves). `dims` was checked not empty.
fn last_dim(dims: &[usize]) -> usize {
    dims.last().copied().unwrap_or(0)
}

impl OpDef for FftR2c {
    fn name(&self) -> &'static str {
        "fft_r2c"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = &inputs[0];
        check_float(self.name(), x)?;
        check_dims(self.name(), &self.dims, &x.shape)?;
        let mut shape = x.shape.to_vec();
        let l = last_dim(&self.dims);
        if self.onesided {
            shape[l] = shape[l] / 2 + 1;
        }
        shape.push(2);
        Ok(vec![Meta::new(&shape, x.dtype)])
    }

    fn backward_reads(&self, _: usize, _: &[bool]) -> bool {
        false
    }

    op_parts! {
        cpu: cpu::r2c,
        lower: lower::r2c,
        grad: grad::r2c,
    }
}

impl OpDef for FftC2r {
    fn name(&self) -> &'static str {
        "fft_c2r"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let z = &inputs[0];
        let mut shape = complex_shape(self.name(), z)?;
        check_dims(self.name(), &self.dims, &shape)?;
        if self.last_dim_size == 0 {
            return Err(Error::invalid_argument(
                self.name(),
                "expected an output of at least one point along the last dim, got 0",
            ));
        }
        shape[last_dim(&self.dims)] = self.last_dim_size;
        Ok(vec![Meta::new(&shape, z.dtype)])
    }

    fn backward_reads(&self, _: usize, _: &[bool]) -> bool {
        false
    }

    op_parts! {
        cpu: cpu::c2r,
        lower: lower::c2r,
        grad: grad::c2r,
    }
}

impl OpDef for FftC2c {
    fn name(&self) -> &'static str {
        "fft_c2c"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let z = &inputs[0];
        let shape = complex_shape(self.name(), z)?;
        check_dims(self.name(), &self.dims, &shape)?;
        Ok(vec![Meta::new(&z.shape, z.dtype)])
    }

    fn backward_reads(&self, _: usize, _: &[bool]) -> bool {
        false
    }

    op_parts! {
        cpu: cpu::c2c,
        lower: lower::c2c,
        grad: grad::c2c,
    }
}

/// Resolves possibly negative `dims` against `shape`.
fn resolve(op: &str, dims: &[i64], shape: &[usize]) -> Result<Vec<usize>> {
    dims.iter().map(|&d| resolve_dim(op, d, shape)).collect()
}

/// ATen's `_fft_r2c`: the transform of the real `x` over `dims` (the halved one last when
/// `onesided`), scaled by `scale`, as complex pairs `[..., 2]`.
pub fn fft_r2c(x: &Tensor, dims: &[i64], scale: FftScale, onesided: bool) -> Result<Tensor> {
    let dims = resolve("fft_r2c", dims, x.shape())?;
    run1(
        &FftR2c {
            dims,
            scale,
            onesided,
        },
        &[x],
    )
}

/// The complex shape of the pairs `z` (its shape without the last dim), for resolving dims.
fn lead_shape(z: &Tensor) -> &[usize] {
    z.shape().split_last().map_or(&[], |(_, lead)| lead)
}

/// ATen's `_fft_c2r`: the inverse transform of the one-sided spectrum `z` (complex pairs) over
/// `dims` to real values with `last_dim_size` points along the last of `dims`, scaled by
/// `scale`.
pub fn fft_c2r(z: &Tensor, dims: &[i64], scale: FftScale, last_dim_size: usize) -> Result<Tensor> {
    let dims = resolve("fft_c2r", dims, lead_shape(z))?;
    run1(
        &FftC2r {
            dims,
            scale,
            last_dim_size,
        },
        &[z],
    )
}

/// ATen's `_fft_c2c`: the transform of the complex pairs `z` over `dims`, forward or backward,
/// scaled by `scale`.
pub fn fft_c2c(z: &Tensor, dims: &[i64], scale: FftScale, forward: bool) -> Result<Tensor> {
    let dims = resolve("fft_c2c", dims, lead_shape(z))?;
    run1(
        &FftC2c {
            dims,
            scale,
            forward,
        },
        &[z],
    )
}

/// `t` cut or zero-padded to `n` along dim `d`, as `torch.fft` does with its `n` and `s`.
fn resize(op: &str, t: &Tensor, d: usize, n: usize) -> Result<Tensor> {
    if n == 0 {
        return Err(Error::invalid_argument(
            op,
            "expected a signal length of at least 1, got 0",
        ));
    }
    let have = t.shape()[d];
    if n <= have {
        return t.narrow(d, 0, n);
    }
    zero_pad_dim(t, d, 0, n - have)
}

/// The sizes `s` (or the tensor's own, for `None`) for `dims`, checked to match in number.
fn sizes(op: &str, s: Option<&[usize]>, dims: &[usize], shape: &[usize]) -> Result<Vec<usize>> {
    match s {
        None => Ok(dims.iter().map(|&d| shape[d]).collect()),
        Some(s) if s.len() == dims.len() => Ok(s.to_vec()),
        Some(s) => Err(Error::invalid_argument(
            op,
            format!(
                "expected one signal size per dim ({} dims), got {} sizes",
                dims.len(),
                s.len()
            ),
        )),
    }
}

/// `torch.fft.rfftn`: the one-sided transform of the real `x` over `dims` (all dims when
/// empty), each first cut or zero-padded to its size in `s`.
pub fn rfftn(x: &Tensor, s: Option<&[usize]>, dims: &[i64], norm: FftNorm) -> Result<Tensor> {
    let op = "rfftn";
    let dims = all_if_empty(dims, x.rank());
    let dims = resolve(op, &dims, x.shape())?;
    let sizes = sizes(op, s, &dims, x.shape())?;
    let mut x = x.clone();
    for (&d, &n) in dims.iter().zip(&sizes) {
        x = resize(op, &x, d, n)?;
    }
    let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    fft_r2c(&x, &dims, norm.scale(true), true)
}

/// `torch.fft.irfftn`: the inverse of [`rfftn`] from the one-sided spectrum `z` (complex
/// pairs) over `dims` (all complex dims when empty), to the sizes `s` (default: the input's,
/// and `2 (m - 1)` along the last dim).
pub fn irfftn(z: &Tensor, s: Option<&[usize]>, dims: &[i64], norm: FftNorm) -> Result<Tensor> {
    let op = "irfftn";
    let lead = complex_shape(op, &Meta::of(z))?;
    let dims = all_if_empty(dims, lead.len());
    let dims = resolve(op, &dims, &lead)?;
    let mut sizes = sizes(op, s, &dims, &lead)?;
    let l = last_dim(&dims);
    if s.is_none() {
        let last = sizes.len() - 1;
        sizes[last] = 2 * lead[l].saturating_sub(1);
    }
    let mut z = z.clone();
    for (i, (&d, &n)) in dims.iter().zip(&sizes).enumerate() {
        let keep = if i + 1 == dims.len() { n / 2 + 1 } else { n };
        z = resize(op, &z, d, keep)?;
    }
    let last = sizes.last().copied().unwrap_or(0);
    let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    fft_c2r(&z, &dims, norm.scale(false), last)
}

/// `torch.fft.fftn` (`forward`) and `torch.fft.ifftn` on complex pairs.
fn c2c_n(
    op: &str,
    z: &Tensor,
    s: Option<&[usize]>,
    dims: &[i64],
    norm: FftNorm,
    forward: bool,
) -> Result<Tensor> {
    let lead = complex_shape(op, &Meta::of(z))?;
    let dims = all_if_empty(dims, lead.len());
    let dims = resolve(op, &dims, &lead)?;
    let sizes = sizes(op, s, &dims, &lead)?;
    let mut z = z.clone();
    for (&d, &n) in dims.iter().zip(&sizes) {
        z = resize(op, &z, d, n)?;
    }
    let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    fft_c2c(&z, &dims, norm.scale(forward), forward)
}

/// `torch.fft.fftn` on complex pairs `z`: the forward transform over `dims` (all complex dims
/// when empty), each first cut or zero-padded to its size in `s`.
pub fn fftn(z: &Tensor, s: Option<&[usize]>, dims: &[i64], norm: FftNorm) -> Result<Tensor> {
    c2c_n("fftn", z, s, dims, norm, true)
}

/// `torch.fft.ifftn` on complex pairs `z`: the backward transform over `dims` (all complex dims
/// when empty), each first cut or zero-padded to its size in `s`.
pub fn ifftn(z: &Tensor, s: Option<&[usize]>, dims: &[i64], norm: FftNorm) -> Result<Tensor> {
    c2c_n("ifftn", z, s, dims, norm, false)
}

/// `torch.fft.rfft`: the one-sided transform of the real `x` along `dim`, first cut or
/// zero-padded to `n` points.
pub fn rfft(x: &Tensor, n: Option<usize>, dim: i64, norm: FftNorm) -> Result<Tensor> {
    rfftn(x, n.as_ref().map(std::slice::from_ref), &[dim], norm)
}

/// `torch.fft.irfft`: real values of `n` points (default `2 (m - 1)`) along `dim` from the
/// one-sided spectrum `z` (complex pairs).
pub fn irfft(z: &Tensor, n: Option<usize>, dim: i64, norm: FftNorm) -> Result<Tensor> {
    irfftn(z, n.as_ref().map(std::slice::from_ref), &[dim], norm)
}

/// `torch.fft.fft` on complex pairs `z` along `dim`, first cut or zero-padded to `n` points.
/// A real signal becomes pairs with [`complex`] (or use [`rfft`]).
pub fn fft(z: &Tensor, n: Option<usize>, dim: i64, norm: FftNorm) -> Result<Tensor> {
    fftn(z, n.as_ref().map(std::slice::from_ref), &[dim], norm)
}

/// `torch.fft.ifft` on complex pairs `z` along `dim`, first cut or zero-padded to `n` points.
pub fn ifft(z: &Tensor, n: Option<usize>, dim: i64, norm: FftNorm) -> Result<Tensor> {
    ifftn(z, n.as_ref().map(std::slice::from_ref), &[dim], norm)
}

/// `torch.complex(re, im)` as pairs: `[..., 2]` from two real tensors of one shape.
pub fn complex(re: &Tensor, im: &Tensor) -> Result<Tensor> {
    stack(&[re, im], -1)
}

/// The complex pairs of the real `x` (a zero imaginary part).
pub fn real_to_complex(x: &Tensor) -> Result<Tensor> {
    complex(x, &x.zeros_like()?)
}

/// `dims`, or every dim of a rank-`rank` shape when `dims` is empty.
fn all_if_empty(dims: &[i64], rank: usize) -> Vec<i64> {
    if dims.is_empty() {
        (0..rank as i64).collect()
    } else {
        dims.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norms_scale_as_torch_fft() {
        assert_eq!(FftNorm::Backward.scale(true), FftScale::None);
        assert_eq!(FftNorm::Backward.scale(false), FftScale::ByN);
        assert_eq!(FftNorm::Forward.scale(true), FftScale::ByN);
        assert_eq!(FftNorm::Ortho.scale(false), FftScale::ByRootN);
        assert_eq!("ortho".parse::<FftNorm>().ok(), Some(FftNorm::Ortho));
        assert!("sideways".parse::<FftNorm>().is_err());
        assert_eq!(FftScale::ByRootN.factor(16), 0.25);
    }
}
