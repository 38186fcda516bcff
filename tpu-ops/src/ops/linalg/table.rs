//! The op table's rows for the products: seeded operands of every rank combination, some of
//! them transposed or sliced views.

use std::sync::Arc;

use tpu_tensor::{DType, Device, Generator, Result, Tensor};

use super::shape::DTYPES;
use super::{bmm, dot, einsum, linear, matmul, mm};
use crate::op::OpInfo;
use crate::op::samples::randn;

/// A seeded sample of `shape` in `dtype` on `device`: normal floats, small integers.
fn sample_input(
    g: &mut Generator,
    shape: &[usize],
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    if dtype.is_float() {
        return randn(g, shape, dtype, device);
    }
    g.randint(-4, 5, shape, DType::I64, &Device::cpu())?
        .to_dtype(dtype)?
        .to_device(device)
}

fn sample_matmul(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(11);
    let mut s = |shape: &[usize]| sample_input(&mut g, shape, d, dev);
    let (a, b) = (s(&[3, 4])?, s(&[4, 5])?);
    let (u, v) = (s(&[4])?, s(&[4])?);
    let bt = s(&[5, 4])?.t()?;
    let x = s(&[2, 1, 3, 4])?;
    let y = s(&[5, 4, 2])?;
    let z = s(&[2, 4, 3])?.transpose(1, 2)?;
    Ok(vec![
        matmul(&u, &v)?,
        matmul(&u, &b)?,
        matmul(&a, &u)?,
        matmul(&a, &bt)?,
        matmul(&x, &y)?,
        matmul(&z, &u)?,
        matmul(&x, &b)?,
    ])
}

fn sample_linear(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(12);
    let mut s = |shape: &[usize]| sample_input(&mut g, shape, d, dev);
    let (x, w, bias) = (s(&[2, 3, 4])?, s(&[5, 4])?, s(&[5])?);
    let xt = s(&[4, 3])?.t()?;
    Ok(vec![
        linear(&x, &w, Some(&bias))?,
        linear(&xt, &w, None)?,
        linear(&s(&[4])?, &w, Some(&bias))?,
    ])
}

fn sample_einsum(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(13);
    let mut s = |shape: &[usize]| sample_input(&mut g, shape, d, dev);
    let (a, b) = (s(&[2, 3, 4])?, s(&[2, 4, 5])?);
    let sq = s(&[3, 3])?;
    let (u, v) = (s(&[3])?, s(&[4])?);
    Ok(vec![
        einsum("bij,bjk->kbi", &[&a, &b])?,
        einsum("i,j", &[&u, &v])?,
        einsum("ii", &[&sq.t()?])?,
        einsum("...ij->...ji", &[&a])?,
        einsum("bij,j->i", &[&a, &v])?,
    ])
}

/// The rows of the op table for this file's ops.
pub fn table() -> Vec<OpInfo> {
    fn row(
        name: &'static str,
        f: impl Fn(DType, &Device) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    ) -> OpInfo {
        OpInfo {
            name,
            cpu: DTYPES,
            hlo: DTYPES,
            sample: Arc::new(f),
            // Summation order differs between faer and XLA; 16-bit results are compared to
            // within two units in their last place (see `testing::assert_close`).
            tolerance: 1e-5,
            // Every product here has a backward rule.
        }
    }
    vec![
        row("matmul", sample_matmul),
        row("mm", |d, dev| {
            let mut g = Generator::new(14);
            let a = sample_input(&mut g, &[3, 4], d, dev)?;
            let b = sample_input(&mut g, &[2, 4], d, dev)?;
            Ok(vec![mm(&a, &b.t()?)?])
        }),
        row("bmm", |d, dev| {
            let mut g = Generator::new(15);
            let a = sample_input(&mut g, &[2, 3, 4], d, dev)?;
            let b = sample_input(&mut g, &[2, 5, 4], d, dev)?;
            Ok(vec![bmm(&a, &b.transpose(1, 2)?)?])
        }),
        row("dot", |d, dev| {
            let mut g = Generator::new(16);
            let a = sample_input(&mut g, &[7], d, dev)?;
            let b = sample_input(&mut g, &[14], d, dev)?;
            Ok(vec![dot(&a, &b.slice(0, .., 2)?)?])
        }),
        row("linear", sample_linear),
        row("einsum", sample_einsum),
    ]
}
