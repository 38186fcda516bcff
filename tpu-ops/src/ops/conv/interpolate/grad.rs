//! The backward rule of interpolation, made of ops so that gradients run where the forward ran:
//! `index_add` of the weighted gradient into its source rows and columns.

use tpu_tensor::{DType, Device, Result, Tensor};

use crate::TensorOps;
use crate::autograd::Saved;
use crate::op::Grads;
use crate::op::promote::compute_dtype;
use crate::ops::conv::nchw;
use crate::ops::conv::options::InterpolateMode;
use crate::ops::movement::MovementOps;

use super::{Interpolate, linear_taps, nearest_sources};

/// The adjoint of the resampling, one dim at a time: every output pixel's gradient, times
/// each tap's weight, is added to the tap's source row or column (`index_add`, which
/// accumulates the sources many outputs share).
pub(super) fn interpolate(op: &Interpolate, saved: &Saved, g: &Tensor) -> Grads {
    let x = &saved.inputs[0];
    let [n, c, h, w] = nchw(x.shape());
    let [oh, ow] = op.size;
    let dev = g.device();
    // The forward's precision (f32 for 16-bit floats); autograd rounds the result back.
    let cd = compute_dtype(g.dtype());
    let g = g.to(cd)?;
    let index = |v: Vec<usize>| -> Result<Tensor> {
        let len = v.len();
        let v: Vec<i64> = v.into_iter().map(|i| i as i64).collect();
        Tensor::from_vec(v, [len], dev)
    };
    let weights = |v: Vec<f64>, shape: &[usize]| -> Result<Tensor> {
        Tensor::from_vec(v, shape, &Device::cpu())?
            .to_dtype(cd)?
            .to_device(dev)
    };
    let rows = Tensor::zeros([n, c, oh, w], cd, dev)?;
    let full = Tensor::zeros([n, c, h, w], cd, dev)?;
    let gx = match op.mode {
        InterpolateMode::Nearest => {
            let sy = index(nearest_sources(h, oh, op.scales[0]))?;
            let sx = index(nearest_sources(w, ow, op.scales[1]))?;
            let t = rows.index_add(3, &sx, &g, 1.0)?;
            full.index_add(2, &sy, &t, 1.0)?
        }
        InterpolateMode::Bilinear { align_corners } => {
            type Taps = Vec<(usize, usize, f64, f64)>;
            let taps = |len: usize, out: usize, scale: Option<f64>| -> Taps {
                // The weights of the forward, in its precision (f32 values are exact in f64).
                if cd == DType::F64 {
                    linear_taps::<f64>(len, out, align_corners, scale)
                } else {
                    linear_taps::<f32>(len, out, align_corners, scale)
                        .into_iter()
                        .map(|(a, b, p, q)| (a, b, p as f64, q as f64))
                        .collect()
                }
            };
            let ty = taps(h, oh, op.scales[0]);
            let tx = taps(w, ow, op.scales[1]);
            let i0 = |t: &Taps| index(t.iter().map(|v| v.0).collect());
            let i1 = |t: &Taps| index(t.iter().map(|v| v.1).collect());
            let w0 = |t: &Taps, s: &[usize]| weights(t.iter().map(|v| v.2).collect(), s);
            let w1 = |t: &Taps, s: &[usize]| weights(t.iter().map(|v| v.3).collect(), s);
            let t = rows
                .index_add(3, &i0(&tx)?, &TensorOps::mul(&g, &w0(&tx, &[ow])?)?, 1.0)?
                .index_add(3, &i1(&tx)?, &TensorOps::mul(&g, &w1(&tx, &[ow])?)?, 1.0)?;
            full.index_add(2, &i0(&ty)?, &TensorOps::mul(&t, &w0(&ty, &[oh, 1])?)?, 1.0)?
                .index_add(2, &i1(&ty)?, &TensorOps::mul(&t, &w1(&ty, &[oh, 1])?)?, 1.0)?
        }
    };
    Ok(vec![Some(gx)])
}
