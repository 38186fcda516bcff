//! The StableHLO lowerings of the losses, and the device check of the class losses' targets.

use tpu_tensor::DType;

use super::{ClassLoss, PointKind, PointLoss, Reduction, class_layout};
use crate::hlo::checks::DeviceCheck;
use crate::hlo::lower::{Checks, Lowered, OpIo, lower_sum};
use crate::hlo::{Cmp, FnBuilder, Value};
use crate::op::OpDef;
use crate::ops::nn::args::take;
use crate::ops::nn::lower::{add, cst, div, mul, sub, to_compute};
use crate::ops::nn::softmax::lower_softmax;

pub(super) fn class_loss(this: &ClassLoss, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let xshape = io.dims(0);
    let (n, classes, inner) = class_layout(&xshape);
    let x = io.compute(b, 0);
    let x = b.reshape(&x, &[n, classes, inner]);
    let dims = [n, classes, inner];
    let lp = if this.logits {
        lower_softmax(b, &x, 1, true, false)
    } else {
        x
    };
    let t = b.reshape(&inputs[1], &[n, inner]);
    let ci = b.iota(&dims, 1, DType::I64);
    let tb = b.broadcast_in_dim(&t, &[0, 2], &dims);
    let hot = b.compare(Cmp::Eq, &ci, &tb);
    let zero3 = cst(b, &lp, 0.0);
    let picked = b.select(&hot, &lp, &zero3);
    let lpt = lower_sum(b, &picked, &[1]);
    let ign = b.splat(t.ty.clone(), this.ignore_index);
    let valid = b.compare(Cmp::Ne, &t, &ign);
    let zero2 = cst(b, &lpt, 0.0);
    let wfull = inputs.get(2).map(|w| {
        let w = to_compute(b, w);
        b.broadcast_in_dim(&w, &[1], &dims)
    });
    let wt = match &wfull {
        Some(wf) => {
            let sel = b.select(&hot, wf, &zero3);
            lower_sum(b, &sel, &[1])
        }
        None => cst(b, &lpt, 1.0),
    };
    let wt = b.select(&valid, &wt, &zero2);
    let prod = mul(b, &wt, &lpt);
    let nll = b.ew("stablehlo.negate", &[&prod]);
    let nll = b.select(&valid, &nll, &zero2);
    let eps = this.label_smoothing;
    let smooth = if this.logits && eps > 0.0 {
        let terms = match &wfull {
            Some(wf) => mul(b, &lp, wf),
            None => lp.clone(),
        };
        let s = lower_sum(b, &terms, &[1]);
        let s = b.ew("stablehlo.negate", &[&s]);
        Some(b.select(&valid, &s, &zero2))
    } else {
        None
    };
    let mix = |b: &mut FnBuilder, nll: &Value, sm: &Option<Value>| match sm {
        Some(sm) => {
            let a = cst(b, nll, 1.0 - eps);
            let c = cst(b, nll, eps / classes as f64);
            let x = mul(b, &a, nll);
            let y = mul(b, &c, sm);
            add(b, &x, &y)
        }
        None => nll.clone(),
    };
    let y = match this.reduction {
        Reduction::None => {
            let y = mix(b, &nll, &smooth);
            b.reshape(&y, &outputs[0].shape)
        }
        red => {
            let mut a = lower_sum(b, &nll, &[0, 1]);
            let mut sm = smooth.map(|s| lower_sum(b, &s, &[0, 1]));
            if red == Reduction::Mean {
                let w = lower_sum(b, &wt, &[0, 1]);
                a = div(b, &a, &w);
                sm = sm.map(|s| div(b, &s, &w));
            }
            mix(b, &a, &sm)
        }
    };
    Ok(vec![b.convert(&y, outputs[0].dtype)])
}

pub(super) fn class_loss_checks(this: &ClassLoss, b: &mut FnBuilder, io: OpIo) -> Checks {
    let OpIo { inputs, .. } = io;
    let shape = io.dims(0);
    let classes = class_layout(&shape).1;
    let dim = if shape.len() == 1 { 0 } else { 1 };
    let check = crate::hlo::checks::index_in_range(b, &inputs[1], classes, Some(this.ignore_index));
    Ok(check
        .map(|value| DeviceCheck {
            value,
            error: crate::hlo::checks::index_error(this.name(), dim, classes, &shape),
        })
        .into_iter()
        .collect())
}

pub(super) fn point_loss(this: &PointLoss, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let dims = io.dims(0);
    let x = io.compute(b, 0);
    let t = to_compute(b, &inputs[1]);
    let loss = match this.kind {
        PointKind::Mse => {
            let d = sub(b, &x, &t);
            mul(b, &d, &d)
        }
        PointKind::BceWithLogits => {
            let mut i = 2;
            let w = take(inputs, this.weight, &mut i).map(|v| {
                let v = to_compute(b, v);
                b.broadcast_to(&v, &dims)
            });
            let pw = take(inputs, this.pos_weight, &mut i).map(|v| {
                let v = to_compute(b, v);
                b.broadcast_to(&v, &dims)
            });
            let zero = cst(b, &x, 0.0);
            let one = cst(b, &x, 1.0);
            let neg = b.extreme(&x, &zero, false);
            let ax = b.ew("stablehlo.abs", &[&x]);
            let nax = b.ew("stablehlo.negate", &[&ax]);
            let ex = b.ew("stablehlo.exponential", &[&nax]);
            let lp = b.ew("stablehlo.log_plus_one", &[&ex]);
            let mut log_sig = sub(b, &neg, &lp);
            if let Some(pw) = &pw {
                let pm = sub(b, pw, &one);
                let pt = mul(b, &pm, &t);
                let lw = add(b, &pt, &one);
                log_sig = mul(b, &log_sig, &lw);
            }
            let omt = sub(b, &one, &t);
            let a = mul(b, &omt, &x);
            let mut loss = sub(b, &a, &log_sig);
            if let Some(w) = &w {
                loss = mul(b, &loss, w);
            }
            loss
        }
    };
    let all: Vec<usize> = (0..dims.len()).collect();
    let y = match this.reduction {
        Reduction::None => loss,
        Reduction::Sum => lower_sum(b, &loss, &all),
        Reduction::Mean => {
            let s = lower_sum(b, &loss, &all);
            let n = cst(b, &s, dims.iter().product::<usize>() as f64);
            div(b, &s, &n)
        }
    };
    Ok(vec![b.convert(&y, outputs[0].dtype)])
}
