//! The lowerings: complex values made from the pairs (or the real input) inside the op's
//! program, one `stablehlo.fft` along each transformed dim, then pairs (or real parts) out.
//! XLA's inverse transforms divide by their length; the scale put back afterwards makes them
//! the unscaled transforms the ops' `scale` then applies to, as the CPU kernels compute.

use super::{FftC2c, FftC2r, FftR2c, FftScale, last_dim, points};
use crate::hlo::lower::{Lowered, OpIo};
use crate::hlo::{FnBuilder, TensorType, Value};

/// The kind of one transform, as `stablehlo.fft` names it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Fft,
    Ifft,
    Rfft,
    Irfft,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Fft => "FFT",
            Kind::Ifft => "IFFT",
            Kind::Rfft => "RFFT",
            Kind::Irfft => "IRFFT",
        }
    }
}

/// One transform of `n` points along `dim` of `v`: the dim moved last (where `stablehlo.fft`
/// works), transformed, and moved back.
fn along(b: &mut FnBuilder, v: &Value, dim: usize, kind: Kind, n: usize) -> Value {
    let rank = v.dims().len();
    let mut perm: Vec<i64> = (0..rank as i64).filter(|&d| d != dim as i64).collect();
    perm.push(dim as i64);
    let moved = b.transpose(v, &perm);
    let mut dims = moved.dims().to_vec();
    dims[rank - 1] = match kind {
        Kind::Rfft => n / 2 + 1,
        _ => n,
    };
    let ty = if kind == Kind::Irfft {
        TensorType::new(&dims, v.dtype())
    } else {
        TensorType::complex(&dims, v.dtype())
    };
    let attrs = format!(
        "fft_type = #stablehlo<fft_type {}>, fft_length = array<i64: {n}>",
        kind.name()
    );
    let done = b.op("stablehlo.fft", &[&moved], &attrs, ty);
    let mut back = vec![0i64; rank];
    for (i, &p) in perm.iter().enumerate() {
        back[p as usize] = i as i64;
    }
    b.transpose(&done, &back)
}

/// Complex values from the pairs `z` (`[..., 2]`, f32 or f64).
fn from_pairs(b: &mut FnBuilder, z: &Value) -> Value {
    let dims = z.dims().to_vec();
    let rank = dims.len();
    let lead = &dims[..rank - 1];
    let mut start = vec![0i64; rank];
    let mut limit: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let ones = vec![1i64; rank];
    limit[rank - 1] = 1;
    let re = b.slice(z, &start, &limit, &ones);
    start[rank - 1] = 1;
    limit[rank - 1] = 2;
    let im = b.slice(z, &start, &limit, &ones);
    let re = b.reshape(&re, lead);
    let im = b.reshape(&im, lead);
    let ty = TensorType::complex(lead, z.dtype());
    b.op("stablehlo.complex", &[&re, &im], "", ty)
}

/// The pairs `[..., 2]` of the complex `c`.
fn to_pairs(b: &mut FnBuilder, c: &Value) -> Value {
    let lead = c.dims().to_vec();
    let mut dims = lead.clone();
    dims.push(1);
    let real = TensorType::new(&lead, c.dtype());
    let re = b.op("stablehlo.real", &[c], "", real.clone());
    let im = b.op("stablehlo.imag", &[c], "", real);
    let re = b.reshape(&re, &dims);
    let im = b.reshape(&im, &dims);
    b.concatenate(&[&re, &im], lead.len())
}

/// `v` times `f` (skipped for 1).
fn scaled(b: &mut FnBuilder, v: &Value, f: f64) -> Value {
    if f == 1.0 {
        return v.clone();
    }
    let k = b.splat(v.ty.clone(), f);
    b.ew("stablehlo.multiply", &[v, &k])
}

/// The factor that makes XLA's inverse transforms of these lengths unscaled, times the op's.
fn factor(scale: FftScale, points: usize, inverse_lengths: usize) -> f64 {
    scale.factor(points) * inverse_lengths as f64
}

pub(super) fn r2c(op: &FftR2c, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let x = io.compute(b, 0);
    let dims = io.dims(0);
    let l = last_dim(&op.dims);
    let mut c = if op.onesided {
        along(b, &x, l, Kind::Rfft, dims[l])
    } else {
        let zero = b.splat(x.ty.clone(), 0);
        let c = b.op(
            "stablehlo.complex",
            &[&x, &zero],
            "",
            TensorType::complex(&dims, x.dtype()),
        );
        along(b, &c, l, Kind::Fft, dims[l])
    };
    for &d in &op.dims[..op.dims.len() - 1] {
        c = along(b, &c, d, Kind::Fft, dims[d]);
    }
    let pairs = to_pairs(b, &c);
    let y = scaled(b, &pairs, op.scale.factor(points(&dims, &op.dims)));
    Ok(vec![b.convert(&y, io.outputs[0].dtype)])
}

/// The pairs `z` cut or zero-padded to `m` along `dim`.
fn fit(b: &mut FnBuilder, z: &Value, dim: usize, m: usize) -> Value {
    let dims = z.dims().to_vec();
    let have = dims[dim];
    if m <= have {
        let start = vec![0i64; dims.len()];
        let mut limit: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        limit[dim] = m as i64;
        return b.slice(z, &start, &limit, &vec![1; dims.len()]);
    }
    let mut pad = dims;
    pad[dim] = m - have;
    let zeros = b.splat(TensorType::new(&pad, z.dtype()), 0);
    b.concatenate(&[z, &zeros], dim)
}

pub(super) fn c2r(op: &FftC2r, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let out = &io.outputs[0];
    let l = last_dim(&op.dims);
    let n = op.last_dim_size;
    let z = io.compute(b, 0);
    let z = fit(b, &z, l, n / 2 + 1);
    let mut c = from_pairs(b, &z);
    let others = &op.dims[..op.dims.len() - 1];
    for &d in others {
        c = along(b, &c, d, Kind::Ifft, out.shape[d]);
    }
    let y = along(b, &c, l, Kind::Irfft, n);
    let points = points(&out.shape, &op.dims);
    let y = scaled(b, &y, factor(op.scale, points, points));
    Ok(vec![b.convert(&y, out.dtype)])
}

pub(super) fn c2c(op: &FftC2c, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let z = io.compute(b, 0);
    let dims = io.dims(0);
    let lead = &dims[..dims.len() - 1];
    let mut c = from_pairs(b, &z);
    let kind = if op.forward { Kind::Fft } else { Kind::Ifft };
    for &d in &op.dims {
        c = along(b, &c, d, kind, lead[d]);
    }
    let pairs = to_pairs(b, &c);
    let points = points(lead, &op.dims);
    let inverse = if op.forward { 1 } else { points };
    let y = scaled(b, &pairs, factor(op.scale, points, inverse));
    Ok(vec![b.convert(&y, io.outputs[0].dtype)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpu_tensor::DType;

    #[test]
    fn complex_types_print_as_mlir() {
        let t = TensorType::complex(&[4, 5], DType::F32);
        assert_eq!(t.to_string(), "tensor<4x5xcomplex<f32>>");
        assert_eq!(t.with_dims(&[20]).to_string(), "tensor<20xcomplex<f32>>");
    }
}
