//! The StableHLO lowering of attention: two batched products around the softmax lowering,
//! with grouped heads broadcast and the mask and causal limit applied to the scores.

use tpu_tensor::DType;

use super::{Attention, attn_batches};
use crate::hlo::lower::{Lowered, OpIo};
use crate::hlo::{Cmp, FnBuilder, Value};
use crate::ops::nn::lower::{add, cst, mul, to_compute};
use crate::ops::nn::softmax::lower_softmax;

pub(super) fn attention(this: &Attention, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let qd = io.dims(0);
    let kd = inputs[1].dims().to_vec();
    let r = qd.len();
    let (l, e, s, ev) = (qd[r - 2], qd[r - 1], kd[r - 2], inputs[2].dims()[r - 1]);
    let (bq, hq, hk) = attn_batches(&qd, &kd);
    let q = io.compute(b, 0);
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
    let mut sc = batched_product(b, &q, &kv[0], 2, [bq, l, s]);
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
    let y = batched_product(b, &p, &kv[1], 1, [bq, l, ev]);
    let y = b.reshape(&y, &outputs[0].shape);
    Ok(vec![b.convert(&y, outputs[0].dtype)])
}

/// The product of `x` `[batch, m, k]` with `y` over `y`'s dim `contract` (2 for the keys,
/// `[batch, n, k]`; 1 for the values, `[batch, k, n]`), batched over dim 0, in `x`'s dtype.
fn batched_product(
    b: &mut FnBuilder,
    x: &Value,
    y: &Value,
    contract: i64,
    out: [usize; 3],
) -> Value {
    b.dot_general(
        x,
        y,
        (&[0], &[0]),
        (&[2], &[contract]),
        crate::hlo::TensorType::new(&out, x.dtype()),
        crate::ops::linalg::matmul_precision(),
    )
}
