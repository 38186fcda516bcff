//! The StableHLO lowering of interpolation: gathers of the source rows and columns with constant
//! indices, blended with constant weights computed as the CPU kernel computes them.

use tpu_tensor::DType;

use crate::hlo::lower::{Lowered, OpIo};
use crate::hlo::{FnBuilder, Value};
use crate::ops::conv::lower::{const_float, gather_axis, to_nchw};
use crate::ops::conv::nchw;
use crate::ops::conv::options::InterpolateMode;

use super::{Interpolate, linear_taps, nearest_sources};

/// The interpolation weights of one dim as a constant broadcast along `axis` of `dims`.
fn weights_along(b: &mut FnBuilder, w: &[f64], dtype: DType, axis: i64, dims: &[usize]) -> Value {
    let c = const_float(b, w, dtype);
    b.broadcast_in_dim(&c, &[axis], dims)
}

/// `upsample_nearest2d` and `upsample_bilinear2d`.
pub(super) fn interpolate(op: &Interpolate, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let x = to_nchw(b, &inputs[0]);
    let cd = x.dtype();
    let [n, c, h, w] = nchw(x.dims());
    let [oh, ow] = op.size;
    let out4 = [n, c, oh, ow];
    if let Some(z) = io.zeros_if_empty(b) {
        return Ok(z);
    }
    let y = match op.mode {
        InterpolateMode::Nearest => {
            let sy: Vec<i64> = nearest_sources(h, oh, op.scales[0])
                .iter()
                .map(|&v| v as i64)
                .collect();
            let sx: Vec<i64> = nearest_sources(w, ow, op.scales[1])
                .iter()
                .map(|&v| v as i64)
                .collect();
            let g = gather_axis(b, &x, 2, &sy, &[oh]);
            gather_axis(b, &g, 3, &sx, &[ow])
        }
        InterpolateMode::Bilinear { align_corners } => {
            // Weights in the compute precision, as the CPU kernel computes them.
            type Taps = Vec<(usize, usize, f64, f64)>;
            let widen = |t: Vec<(usize, usize, f32, f32)>| -> Taps {
                t.into_iter()
                    .map(|(a, b, c, d)| (a, b, c as f64, d as f64))
                    .collect()
            };
            let (ty, tx): (Taps, Taps) = if cd == DType::F64 {
                (
                    linear_taps::<f64>(h, oh, align_corners, op.scales[0]),
                    linear_taps::<f64>(w, ow, align_corners, op.scales[1]),
                )
            } else {
                (
                    widen(linear_taps::<f32>(h, oh, align_corners, op.scales[0])),
                    widen(linear_taps::<f32>(w, ow, align_corners, op.scales[1])),
                )
            };
            let iy: Vec<i64> = ty.iter().flat_map(|t| [t.0 as i64, t.1 as i64]).collect();
            let ix: Vec<i64> = tx.iter().flat_map(|t| [t.0 as i64, t.1 as i64]).collect();
            // [N, C, OH, 2, W], then [N, C, OH, 2, OW, 2].
            let g = gather_axis(b, &x, 2, &iy, &[oh, 2]);
            let g = gather_axis(b, &g, 4, &ix, &[ow, 2]);
            let corner = |b: &mut FnBuilder, y: i64, xx: i64| {
                let s = b.slice(
                    &g,
                    &[0, 0, 0, y, 0, xx],
                    &[n as i64, c as i64, oh as i64, y + 1, ow as i64, xx + 1],
                    &[1; 6],
                );
                b.reshape(&s, &out4)
            };
            let (x00, x01) = (corner(b, 0, 0), corner(b, 0, 1));
            let (x10, x11) = (corner(b, 1, 0), corner(b, 1, 1));
            let col = |t: &Taps, k: usize| -> Vec<f64> {
                t.iter().map(|v| if k == 0 { v.2 } else { v.3 }).collect()
            };
            let wx0 = weights_along(b, &col(&tx, 0), cd, 3, &out4);
            let wx1 = weights_along(b, &col(&tx, 1), cd, 3, &out4);
            let hy0 = weights_along(b, &col(&ty, 0), cd, 2, &out4);
            let hy1 = weights_along(b, &col(&ty, 1), cd, 2, &out4);
            let lerp = |b: &mut FnBuilder, p: &Value, q: &Value, wp: &Value, wq: &Value| {
                let a = b.ew("stablehlo.multiply", &[p, wp]);
                let c = b.ew("stablehlo.multiply", &[q, wq]);
                b.ew("stablehlo.add", &[&a, &c])
            };
            let t0 = lerp(b, &x00, &x01, &wx0, &wx1);
            let t1 = lerp(b, &x10, &x11, &wx0, &wx1);
            lerp(b, &t0, &t1, &hy0, &hy1)
        }
    };
    Ok(vec![b.convert(&y, outputs[0].dtype)])
}
