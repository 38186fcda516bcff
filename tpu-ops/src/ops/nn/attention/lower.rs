//! The StableHLO lowering of attention: two batched products around the softmax lowering,
//! with grouped heads broadcast and the mask and causal limit applied to the scores.

use tpu_tensor::DType;

use super::{Attention, attn_batches};
use crate::hlo::lower::{Lowered, OpIo};
use crate::hlo::{Cmp, FnBuilder};
use crate::ops::nn::lower::{add, cst, mul, to_compute};
use crate::ops::nn::softmax::lower_softmax;

pub(super) fn attention(this: &Attention, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let qd = inputs[0].dims().to_vec();
    let kd = inputs[1].dims().to_vec();
    let r = qd.len();
    let (l, e, s, ev) = (qd[r - 2], qd[r - 1], kd[r - 2], inputs[2].dims()[r - 1]);
    let (bq, hq, hk) = attn_batches(&qd, &kd);
    let q = to_compute(b, &inputs[0]);
    let q = b.reshape(&q, &[bq, l, e]);
    // The queries are scaled before the product, as on the CPU (and as PyTorch scales q
    // and k): a product over an empty head dim is then exactly 0 whatever the scale, where
    // scaling the scores would give 0 * inf = NaN with the default 1 / sqrt(0).
    let scale = cst(b, &q, this.scale);
    let q = mul(b, &q, &scale);
    let outer = bq.checked_div(hq).unwrap_or(0);
    let mut kv = Vec::new();
    for (i, last) in [(1, e), (2, ev)] {
        let t = to_compute(b, &inputs[i]);
        let t = if hk != hq && hk > 0 {
            let t = b.reshape(&t, &[outer, hk, s, last]);
            let t = b.broadcast_in_dim(&t, &[0, 1, 3, 4], &[outer, hk, hq / hk, s, last]);
            b.reshape(&t, &[bq, s, last])
        } else {
            b.reshape(&t, &[bq, s, last])
        };
        kv.push(t);
    }
    let cdt = q.dtype();
    let scores_ty = crate::hlo::TensorType::new(&[bq, l, s], cdt);
    let sc = b.dot_general(
        &q,
        &kv[0],
        (&[0], &[0]),
        (&[2], &[2]),
        scores_ty,
        crate::ops::linalg::matmul_precision(),
    );
    let mut sc = sc;
    let ninf = cst(b, &sc, f64::NEG_INFINITY);
    if this.mask {
        let mut full: Vec<usize> = qd[..r - 2].to_vec();
        full.extend([l, s]);
        let m = b.broadcast_to(&inputs[3], &full);
        let m = b.reshape(&m, &[bq, l, s]);
        sc = if m.dtype() == DType::Bool {
            b.select(&m, &sc, &ninf)
        } else {
            let m = b.convert(&m, cdt);
            add(b, &sc, &m)
        };
    }
    if this.causal {
        let i = b.iota(&[bq, l, s], 1, DType::I64);
        let j = b.iota(&[bq, l, s], 2, DType::I64);
        let keep = b.compare(Cmp::Le, &j, &i);
        sc = b.select(&keep, &sc, &ninf);
    }
    let p = lower_softmax(b, &sc, 2, false, true);
    let out_ty = crate::hlo::TensorType::new(&[bq, l, ev], cdt);
    let y = b.dot_general(
        &p,
        &kv[1],
        (&[0], &[0]),
        (&[2], &[1]),
        out_ty,
        crate::ops::linalg::matmul_precision(),
    );
    let y = b.reshape(&y, &outputs[0].shape);
    Ok(vec![b.convert(&y, outputs[0].dtype)])
}
