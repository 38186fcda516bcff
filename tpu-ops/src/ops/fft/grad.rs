//! The backward rules, PyTorch's for complex tensors seen through `view_as_real`: a forward
//! transform's adjoint is the unscaled backward transform under the same scale and the other
//! way round; a one-sided spectrum's missing half comes back as zeros, and the frequencies a
//! real inverse reads twice (all but the zero and the highest one) get their gradient twice.

use tpu_tensor::Tensor;

use super::{FftC2c, FftC2r, FftR2c, last_dim, resize};
use crate::autograd::Saved;
use crate::exec::dispatch::run1;
use crate::op::Grads;
use crate::ops::elementwise::methods::TensorOps;
use crate::ops::movement::cat;

pub(super) fn r2c(op: &FftR2c, saved: &Saved, g: &Tensor) -> Grads {
    let l = last_dim(&op.dims);
    let g = resize("fft_r2c", g, l, saved.inputs[0].shape()[l])?;
    let back = FftC2c {
        dims: op.dims.clone(),
        scale: op.scale,
        forward: false,
    };
    let full = run1(&back, &[&g])?;
    Ok(vec![Some(full.select(-1, 0)?)])
}

pub(super) fn c2r(op: &FftC2r, saved: &Saved, g: &Tensor) -> Grads {
    let l = last_dim(&op.dims);
    let n = op.last_dim_size;
    let forward = FftR2c {
        dims: op.dims.clone(),
        scale: op.scale,
        onesided: true,
    };
    let gz = run1(&forward, &[g])?;
    let half = n / 2 + 1;
    let twice = n - half;
    // Built from slices of the gradient, not from a table of factors on the host, so that
    // a traced backward stays inside the program.
    let gz = if twice > 0 {
        let first = gz.narrow(l, 0, 1)?;
        let doubled = gz.narrow(l, 1, twice)?.mul(2.0)?;
        let rest = gz.narrow(l, 1 + twice as i64, half - 1 - twice)?;
        cat(&[&first, &doubled, &rest], l)?
    } else {
        gz
    };
    let m = saved.inputs[0].shape()[l];
    Ok(vec![Some(resize("fft_c2r", &gz, l, m)?)])
}

pub(super) fn c2c(op: &FftC2c, _: &Saved, g: &Tensor) -> Grads {
    let back = FftC2c {
        forward: !op.forward,
        ..op.clone()
    };
    Ok(vec![Some(run1(&back, &[g])?)])
}
