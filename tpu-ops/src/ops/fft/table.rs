//! The op table's rows for the transforms: seeded inputs of even and odd lengths, one and two
//! transformed dims, every scale, strided views, and spectra cut and zero-padded.

use tpu_tensor::{DType, Device, Generator, Result, Tensor};

use super::{FftScale, fft_c2c, fft_c2r, fft_r2c};
use crate::op::samples::{randn, randn_permuted};
use crate::op::{DTypeSet, OpInfo};

fn sample_r2c(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(71);
    let x = randn(&mut g, &[3, 8], d, dev)?;
    let v = randn_permuted(&mut g, &[4, 7], &[1, 0], d, dev)?;
    let w = randn(&mut g, &[2, 3, 5], d, dev)?;
    Ok(vec![
        fft_r2c(&x, &[1], FftScale::None, true)?,
        fft_r2c(&v, &[0, 1], FftScale::ByN, true)?,
        fft_r2c(&w, &[2, 0], FftScale::ByRootN, false)?,
        fft_r2c(&w, &[-1, 0], FftScale::None, true)?,
    ])
}

fn sample_c2r(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(72);
    let z = randn(&mut g, &[3, 5, 2], d, dev)?;
    let y = randn(&mut g, &[4, 3, 2], d, dev)?;
    Ok(vec![
        fft_c2r(&z, &[1], FftScale::ByN, 8)?,
        fft_c2r(&z, &[-1], FftScale::None, 9)?,
        fft_c2r(&z, &[1], FftScale::None, 4)?,
        fft_c2r(&y, &[0, 1], FftScale::ByRootN, 4)?,
        fft_c2r(&y, &[1, 0], FftScale::ByN, 7)?,
    ])
}

fn sample_c2c(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(73);
    let z = randn(&mut g, &[3, 6, 2], d, dev)?;
    let y = randn(&mut g, &[4, 5, 2], d, dev)?;
    Ok(vec![
        fft_c2c(&z, &[1], FftScale::None, true)?,
        fft_c2c(&y, &[0, 1], FftScale::ByN, false)?,
        fft_c2c(&y.narrow(0, 1, 3)?, &[0], FftScale::ByRootN, true)?,
    ])
}

/// The rows of the op table for the transforms. rustfft and XLA's FFT sum in different orders.
pub fn table() -> Vec<OpInfo> {
    vec![
        OpInfo::new("fft_r2c", DTypeSet::FLOAT, 1e-5, sample_r2c),
        OpInfo::new("fft_c2r", DTypeSet::FLOAT, 1e-5, sample_c2r),
        OpInfo::new("fft_c2c", DTypeSet::FLOAT, 1e-5, sample_c2c),
    ]
}
