//! Comparing tensors in tests: the CPU kernels against XLA, and against reference values.

use tpu_tensor::{DType, Error, Result, Tensor};

/// The relative precision of a dtype (one unit in the last place at 1.0).
pub fn epsilon(d: DType) -> f64 {
    match d {
        DType::BF16 => 2f64.powi(-7),
        DType::F16 => 2f64.powi(-10),
        DType::F32 => 2f64.powi(-23),
        DType::F64 => 2f64.powi(-52),
        _ => 0.0,
    }
}

/// Checks that `a` and `b` have the same shape and dtype and agree elementwise: exactly for
/// integers and bool, and for floats within `tol` (absolute and relative), widened to two units
/// in the last place of the dtype when `tol` is not 0. NaNs must match NaNs.
pub fn assert_close(what: &str, a: &Tensor, b: &Tensor, tol: f64) -> Result<()> {
    let fail = |why: String| Err(Error::invalid_argument(what, why));
    if a.shape() != b.shape() || a.dtype() != b.dtype() {
        return fail(format!(
            "shape/dtype differ: {:?} {} vs {:?} {}",
            a.shape(),
            a.dtype(),
            b.shape(),
            b.dtype()
        ));
    }
    let x = a
        .to_device(&tpu_tensor::Device::cpu())?
        .to_dtype(DType::F64)?
        .to_vec::<f64>()?;
    let y = b
        .to_device(&tpu_tensor::Device::cpu())?
        .to_dtype(DType::F64)?
        .to_vec::<f64>()?;
    let tol = if a.dtype().is_float() && tol > 0.0 {
        tol.max(2.0 * epsilon(a.dtype()))
    } else {
        tol
    };
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        let same = (p.is_nan() && q.is_nan())
            || p == q
            || (tol > 0.0 && (p - q).abs() <= tol * (1.0 + p.abs().max(q.abs())));
        if !same {
            return fail(format!(
                "element {i} differs: {p} vs {q} (tolerance {tol}); shape {:?}, dtype {}",
                a.shape(),
                a.dtype()
            ));
        }
    }
    Ok(())
}
