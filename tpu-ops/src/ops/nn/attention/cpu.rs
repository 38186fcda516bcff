//! The CPU kernel of attention: blocks of query rows, one task each, through the
//! flash-attention style kernel of `crate::cpu::simd::rows`.

use rayon::prelude::*;
use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::{DType, Element, Result, Tensor};

use super::{Attention, attn_batches};
use crate::cpu::float::with_compute;
use crate::cpu::kernels::{PAR_THRESHOLD, Reader, broadcast_strides, launch};
use crate::cpu::simd::rows::{self as simd_rows, RowKernels};
use crate::op::Meta;
use crate::ops::nn::cpu::{contiguous_compute, elems, emit_overwrite, lead_offset};

/// Runs attention `a` into `o` (`[B, L, Ev]`): one task per block of query rows of a query
/// batch, on the device's pool when the work is large enough.
fn attn_run<C: RowKernels>(dev: &CpuDevice, a: &simd_rows::Attn<'_, C>, o: &mut [C]) -> Result<()> {
    let head = a.l * a.ev;
    if head == 0 || o.is_empty() {
        return Ok(());
    }
    let rows = simd_rows::ATTN_ROWS;
    let block = rows * a.ev;
    let work = (o.len() / a.ev).saturating_mul(a.s.max(1) * (a.e + a.ev).max(1));
    let tasks = (o.len() / head) * a.l.div_ceil(rows);
    if tasks <= 1 || dev.num_threads() <= 1 || work < PAR_THRESHOLD {
        for (bq, oh) in o.chunks_mut(head).enumerate() {
            for (qb, ob) in oh.chunks_mut(block).enumerate() {
                a.block(bq, qb * rows, ob);
            }
        }
        return Ok(());
    }
    dev.install(|| {
        o.par_chunks_mut(head).enumerate().for_each(|(bq, oh)| {
            oh.par_chunks_mut(block)
                .enumerate()
                .for_each(|(qb, ob)| a.block(bq, qb * rows, ob))
        })
    })
}

pub(super) fn attention(
    this: &Attention,
    inputs: &[&Tensor],
    outputs: &[Meta],
) -> Result<Vec<Tensor>> {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let (op, dev, device) = launch(this, q)?;
    let qs = q.shape();
    let r = qs.len();
    let (l, e, s, ev) = (qs[r - 2], qs[r - 1], k.shape()[r - 2], v.shape()[r - 1]);
    let (_, hq, hk) = attn_batches(qs, k.shape());
    let causal = this.causal;
    let lead = &qs[..r - 2];
    with_compute!(op, q.dtype(), |C| {
        let (qd, kd, vd) = (
            contiguous_compute::<C>(q)?,
            contiguous_compute::<C>(k)?,
            contiguous_compute::<C>(v)?,
        );
        let mask = match inputs.get(3) {
            Some(m) if m.dtype() == DType::Bool => Some((*m).clone()),
            Some(m) => Some(m.to_dtype(C::DTYPE)?),
            None => None,
        };
        let mut full: Vec<usize> = lead.to_vec();
        full.extend([l, s]);
        let mst = mask.as_ref().map(|m| broadcast_strides(m, &full));
        let mut all = vec![&qd, &kd, &vd];
        all.extend(mask.iter());
        let rd = Reader::new(&all);
        let (qx, kx, vx) = (
            elems::<C>(&rd, &qd)?,
            elems::<C>(&rd, &kd)?,
            elems::<C>(&rd, &vd)?,
        );
        let bools = match &mask {
            Some(m) if m.dtype() == DType::Bool => Some(rd.data::<bool>(m)?),
            _ => None,
        };
        let adds = match &mask {
            Some(m) if m.dtype() != DType::Bool => Some(rd.data::<C>(m)?),
            _ => None,
        };
        let moff = mask.as_ref().map_or(0, |m| m.offset());
        let scale = C::from_f64(this.scale);
        let row_of = |bq: usize, i: usize| match &mst {
            Some(st) => moff + lead_offset(bq, lead, st) + i * st[r - 2],
            None => 0,
        };
        let vals = match (bools, adds) {
            (Some(b), _) => Some(simd_rows::MaskVals::Keep(b)),
            (None, Some(a)) => Some(simd_rows::MaskVals::Add(a)),
            _ => None,
        };
        let mask = vals.map(|vals| simd_rows::AttnMask {
            vals,
            row: &row_of,
            sj: mst.as_ref().map_or(0, |st| st[r - 1]),
        });
        let a = simd_rows::Attn {
            q: qx,
            k: kx,
            v: vx,
            l,
            s,
            e,
            ev,
            hq,
            hk,
            scale,
            causal,
            mask,
        };
        let t = emit_overwrite::<C>(&outputs[0], &device, &dev, |o| attn_run(&dev, &a, o))?;
        Ok(vec![t])
    })
}
