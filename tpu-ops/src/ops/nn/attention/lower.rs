//! The StableHLO lowering of attention: two batched products around the softmax lowering,
//! with grouped heads as rows of one product per key/value head, and the mask and causal limit applied to the scores.

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
    // Grouped heads: query head h uses key/value head h / g, so the queries of one key/value
    // head are adjacent, and `[outer, hk, g, l, e]` is `[outer * hk, g * l, e]`: the products
    // run per key/value head with the group's queries as rows, and the keys and values are
    // read once, never broadcast to every query head.
    let g = if hk != hq && hk > 0 { hq / hk } else { 1 };
    let bk = bq.checked_div(g).unwrap_or(0);
    let q = io.compute(b, 0);
    let q = b.reshape(&q, &[bk, g * l, e]);
    // The queries are scaled before the product, as on the CPU (and as PyTorch scales q
    // and k): a product over an empty head dim is then exactly 0 whatever the scale, where
    // scaling the scores would give 0 * inf = NaN with the default 1 / sqrt(0).
    let scale = cst(b, &q, this.scale);
    let q = mul(b, &q, &scale);
    let kv: Vec<Value> = [(1, e), (2, ev)]
        .into_iter()
        .map(|(i, last)| {
            let t = to_compute(b, &inputs[i]);
            b.reshape(&t, &[bk, s, last])
        })
        .collect();
    let cdt = q.dtype();
    let sc = batched_product(b, &q, &kv[0], 2, [bk, g * l, s]);
    let mut sc = b.reshape(&sc, &[bq, l, s]);
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
    let p = b.reshape(&p, &[bk, g * l, s]);
    let y = batched_product(b, &p, &kv[1], 1, [bk, g * l, ev]);
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
