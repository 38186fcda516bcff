//! The StableHLO lowerings of the normalisations, computing in f32 (or f64) as the CPU
//! kernels do.

use tpu_tensor::Error;

use super::{BatchNorm, Norm, NormKind};
use crate::hlo::lower::{Lowered, OpIo, bcast_back, lower_sum};
use crate::hlo::{FnBuilder, Value};
use crate::op::OpDef;
use crate::ops::nn::args::take;
use crate::ops::nn::lower::{add, cst, div, mul, sub, to_compute};

/// `(x - mean) * rsqrt(var + eps)` over the last dim of `x` (or `x * rsqrt(mean(x^2) + eps)`
/// for RMS).
fn lower_normalize_last(b: &mut FnBuilder, x: &Value, rms: bool, eps: f64) -> Value {
    let dims = x.dims().to_vec();
    let last = dims.len() - 1;
    let len = dims[last] as f64;
    let centered = if rms {
        x.clone()
    } else {
        let s = lower_sum(b, x, &[last]);
        let n = cst(b, &s, len);
        let mean = div(b, &s, &n);
        let mb = bcast_back(b, &mean, &[last], &dims);
        sub(b, x, &mb)
    };
    let sq = mul(b, &centered, &centered);
    let ss = lower_sum(b, &sq, &[last]);
    let n = cst(b, &ss, len);
    let var = div(b, &ss, &n);
    let e = cst(b, &var, eps);
    let ve = add(b, &var, &e);
    let rstd = b.ew("stablehlo.rsqrt", &[&ve]);
    let rb = bcast_back(b, &rstd, &[last], &dims);
    mul(b, &centered, &rb)
}

pub(super) fn norm(this: &Norm, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let shape = io.dims(0);
    let x = io.compute(b, 0);
    let numel: usize = shape.iter().product();
    let (row_len, seg, groups) = this.layout(&shape);
    let rms = this.kind == NormKind::Rms;
    let y = match this.kind {
        NormKind::Group(_) => {
            let n = shape[0];
            let x3 = b.reshape(&x, &[n, groups, row_len]);
            let y3 = lower_normalize_last(b, &x3, false, this.eps);
            b.reshape(&y3, &[n, shape[1], seg])
        }
        _ => {
            let rows = numel.checked_div(row_len).unwrap_or(0);
            let x2 = b.reshape(&x, &[rows, row_len]);
            lower_normalize_last(b, &x2, rms, this.eps)
        }
    };
    let ydims = y.dims().to_vec();
    // The parameters line up with dim 1 of the normalised value in both layouts.
    let mut y = y;
    let mut i = 1;
    for (present, is_weight) in [(this.weight, true), (this.bias, false)] {
        if let Some(p) = take(inputs, present, &mut i) {
            let p = to_compute(b, p);
            let p = b.reshape(&p, &[ydims[1]]);
            let pb = b.broadcast_in_dim(&p, &[1], &ydims);
            y = if is_weight {
                mul(b, &y, &pb)
            } else {
                add(b, &y, &pb)
            };
        }
    }
    let y = b.reshape(&y, &shape);
    Ok(vec![b.convert(&y, outputs[0].dtype)])
}

pub(super) fn batch_norm(this: &BatchNorm, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let dims = io.dims(0);
    let x = io.compute(b, 0);
    let ch = dims[1];
    let count: usize = dims.iter().product::<usize>() / ch.max(1);
    let red: Vec<usize> = (0..dims.len()).filter(|&d| d != 1).collect();
    let mut i = 1;
    let rm = take(inputs, this.running, &mut i).map(|v| to_compute(b, v));
    let rv = take(inputs, this.running, &mut i).map(|v| to_compute(b, v));
    let w = take(inputs, this.weight, &mut i).map(|v| to_compute(b, v));
    let bias = take(inputs, this.bias, &mut i).map(|v| to_compute(b, v));
    let (mean, var) = if this.training {
        let s = lower_sum(b, &x, &red);
        let cnt = cst(b, &s, count as f64);
        let mean = div(b, &s, &cnt);
        let mb = bcast_back(b, &mean, &red, &dims);
        let xc = sub(b, &x, &mb);
        let sq = mul(b, &xc, &xc);
        let ss = lower_sum(b, &sq, &red);
        (mean, div(b, &ss, &cnt))
    } else {
        match (&rm, &rv) {
            (Some(m), Some(v)) => (m.clone(), v.clone()),
            _ => {
                return Err(Error::invalid_argument(
                    this.name(),
                    "running stats are required in evaluation mode",
                ));
            }
        }
    };
    let mb = bcast_back(b, &mean, &red, &dims);
    let xc = sub(b, &x, &mb);
    let e = cst(b, &var, this.eps);
    let ve = add(b, &var, &e);
    let rstd = b.ew("stablehlo.rsqrt", &[&ve]);
    let rb = bcast_back(b, &rstd, &red, &dims);
    let mut y = mul(b, &xc, &rb);
    if let Some(w) = &w {
        let wb = bcast_back(b, w, &red, &dims);
        y = mul(b, &y, &wb);
    }
    if let Some(bv) = &bias {
        let bb = bcast_back(b, bv, &red, &dims);
        y = add(b, &y, &bb);
    }
    let mut outs = vec![b.convert(&y, outputs[0].dtype)];
    if let (true, Some(rm), Some(rv)) = (this.training, &rm, &rv) {
        let mom = cst(b, &mean, this.momentum);
        let keep = cst(b, &mean, 1.0 - this.momentum);
        let unbias = cst(b, &mean, count as f64 / (count as f64 - 1.0));
        let a = mul(b, &mom, &mean);
        let k = mul(b, &keep, rm);
        let new_m = add(b, &a, &k);
        let vu = mul(b, &var, &unbias);
        let a = mul(b, &mom, &vu);
        let k = mul(b, &keep, rv);
        let new_v = add(b, &a, &k);
        outs.push(b.convert(&new_m, outputs[1].dtype));
        outs.push(b.convert(&new_v, outputs[2].dtype));
    }
    Ok(outs)
}
