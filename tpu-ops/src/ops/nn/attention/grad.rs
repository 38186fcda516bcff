//! The backward rule of attention, recomputing the attention weights from the saved inputs.

use tpu_tensor::{DType, Result, Tensor};

use super::{Attention, attn_batches};
use crate::TensorOps;
use crate::autograd::Saved;
use crate::ops::linalg::LinalgOps;
use crate::ops::movement::MovementOps;
use crate::ops::nn::grad::{Grads, up};
use crate::ops::reduce::ReduceOps;

pub(super) fn attention(op: &Attention, saved: &Saved, g: &Tensor) -> Grads {
    let (q, k, v) = (
        up(&saved.inputs[0])?,
        up(&saved.inputs[1])?,
        up(&saved.inputs[2])?,
    );
    let g = up(g)?;
    let qs = q.shape().to_vec();
    let ks = k.shape().to_vec();
    let r = qs.len();
    let (l, e, s, ev) = (qs[r - 2], qs[r - 1], ks[r - 2], v.shape()[r - 1]);
    let (bq, hq, hk) = attn_batches(&qs, &ks);
    let mask = saved.inputs.get(3);
    let float_mask = mask.is_some_and(|m| m.dtype() != DType::Bool);
    if bq == 0 || l == 0 || s == 0 {
        // No query or no key: nothing is attended to and every gradient is zero.
        let mut out = vec![
            Some(q.zeros_like()?),
            Some(k.zeros_like()?),
            Some(v.zeros_like()?),
        ];
        if let Some(m) = mask {
            out.push(if float_mask {
                Some(up(m)?.zeros_like()?)
            } else {
                None
            });
        }
        return Ok(out);
    }
    let outer = bq / hq.max(1);
    let rep = if hk > 0 && hk != hq { hq / hk } else { 1 };
    // Keys and values per query batch: grouped heads repeat each key/value head `rep`
    // times, as the forward reads them.
    let per_query = |t: &Tensor, last: usize| -> Result<Tensor> {
        if rep > 1 {
            t.reshape([outer, hk, 1, s, last])?
                .expand([outer, hk, rep, s, last])?
                .reshape([bq, s, last])
        } else {
            t.reshape([bq, s, last])
        }
    };
    let q3 = q.reshape([bq, l, e])?;
    let k3 = per_query(&k, e)?;
    let v3 = per_query(&v, ev)?;
    // Recompute the attention weights (PyTorch's math backend saves them; recomputing
    // keeps the forward free of them, as flash attention does), from the scaled queries
    // as the forward: an empty head dim gives scores of exactly 0, not 0 * inf.
    let qs3 = q3.mul(op.scale)?;
    let mut sc = qs3.bmm(&k3.transpose(1, 2)?)?;
    let mut full: Vec<usize> = qs[..r - 2].to_vec();
    full.extend([l, s]);
    if let Some(m) = mask {
        let m3 = |t: &Tensor| t.broadcast_to(&full)?.reshape([bq, l, s]);
        sc = if m.dtype() == DType::Bool {
            sc.masked_fill(&m3(m)?.logical_not()?, f64::NEG_INFINITY)?
        } else {
            sc.add(&m3(&up(m)?)?)?
        };
    }
    if op.causal {
        let dev = q.device();
        let i = Tensor::arange(0i64, l as i64, 1i64, DType::I64, dev)?.reshape([l, 1])?;
        let j = Tensor::arange(0i64, s as i64, 1i64, DType::I64, dev)?.reshape([1, s])?;
        sc = sc.masked_fill(&j.gt(&i)?, f64::NEG_INFINITY)?;
    }
    // Rows with nothing to attend to gave zeros; their weights are zeros too.
    let empty = sc.amax(&[-1], true)?.eq(f64::NEG_INFINITY)?;
    let p = crate::ops::nn::functional::softmax(&sc.masked_fill(&empty, 0.0)?, -1)?
        .masked_fill(&empty, 0.0)?;
    let g3 = g.reshape([bq, l, ev])?;
    let dv3 = p.transpose(1, 2)?.bmm(&g3)?;
    let dp = g3.bmm(&v3.transpose(1, 2)?)?;
    // Softmax backward: ds = p * (dp - sum(p * dp)).
    let ds = p.mul(&dp.sub(&p.mul(&dp)?.sum(&[-1], true)?)?)?;
    let dq = ds.bmm(&k3)?.mul(op.scale)?.reshape(&qs)?;
    let dk3 = ds.transpose(1, 2)?.bmm(&qs3)?;
    // Grouped heads: each key/value head sums the gradients of the query heads it served.
    let back = |t: Tensor, like: &[usize], last: usize| -> Result<Tensor> {
        if rep > 1 {
            t.reshape([outer, hk, rep, s, last])?
                .sum(&[2], false)?
                .reshape(like)
        } else {
            t.reshape(like)
        }
    };
    let dk = back(dk3, &ks, e)?;
    let dv = back(dv3, v.shape(), ev)?;
    let mut out = vec![Some(dq), Some(dk), Some(dv)];
    if mask.is_some() {
        // An additive mask adds to the scores: it gets their gradient, which autograd sums
        // down to the mask's broadcast shape. A bool mask gets none.
        out.push(if float_mask {
            Some(ds.reshape(&full)?)
        } else {
            None
        });
    }
    Ok(out)
}
