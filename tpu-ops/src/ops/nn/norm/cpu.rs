//! The CPU kernels of the normalisations: layer/RMS/group norm run one row per task through
//! `crate::cpu::simd::rows`; batch norm sums each channel's statistics in f64.

use tpu_tensor::{Element, Error, Result, Tensor};

use super::{BatchNorm, Norm, NormKind};
use crate::cpu::float::with_compute;
use crate::cpu::kernels::{Reader, launch, par_map, par_rows};
use crate::cpu::simd::rows::{self as simd_rows, RowKernels};
use crate::op::Meta;
use crate::ops::nn::args::take;
use crate::ops::nn::cpu::{contiguous_compute, elems, emit, emit_overwrite};

pub(super) fn norm(this: &Norm, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let mut i = 1;
    let w = take(inputs, this.weight, &mut i).copied();
    let bias = take(inputs, this.bias, &mut i).copied();
    let (op, dev, device) = launch(this, x)?;
    let (row_len, seg, groups) = this.layout(x.shape());
    // Parameters per group: one per segment (group norm) or per element.
    let per_group = row_len / seg.max(1);
    let (rms, eps) = (this.kind == NormKind::Rms, this.eps);
    with_compute!(op, x.dtype(), |C| {
        let xd = contiguous_compute::<C>(x)?;
        let wd = w.map(contiguous_compute::<C>).transpose()?;
        let bd = bias.map(contiguous_compute::<C>).transpose()?;
        let mut all = vec![&xd];
        all.extend(wd.iter());
        all.extend(bd.iter());
        let r = Reader::new(&all);
        let xs = elems::<C>(&r, &xd)?;
        let ws = wd.as_ref().map(|t| elems::<C>(&r, t)).transpose()?;
        let bs = bd.as_ref().map(|t| elems::<C>(&r, t)).transpose()?;
        let t = emit_overwrite::<C>(&outputs[0], &device, &dev, |o| {
            par_rows(&dev, o, row_len, 3 * row_len, |row, os| {
                let g = row % groups;
                let range = g * per_group..(g + 1) * per_group;
                let p = simd_rows::NormParams {
                    rms,
                    eps,
                    w: ws.map(|w| &w[range.clone()]),
                    b: bs.map(|b| &b[range.clone()]),
                    seg,
                };
                <C as RowKernels>::norm_row(&xs[row * row_len..(row + 1) * row_len], os, &p)
            })
        })?;
        Ok(vec![t])
    })
}

pub(super) fn batch_norm(
    this: &BatchNorm,
    inputs: &[&Tensor],
    outputs: &[Meta],
) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let mut i = 1;
    let rm = take(inputs, this.running, &mut i).copied();
    let rv = take(inputs, this.running, &mut i).copied();
    let w = take(inputs, this.weight, &mut i).copied();
    let bias = take(inputs, this.bias, &mut i).copied();
    let (op, dev, device) = launch(this, x)?;
    let shape = x.shape();
    let (n, ch) = (shape[0], shape[1]);
    let s: usize = shape[2..].iter().product();
    let count = n * s;
    let (training, momentum, eps) = (this.training, this.momentum, this.eps);
    with_compute!(op, x.dtype(), |C| {
        let xd = contiguous_compute::<C>(x)?;
        let params: Vec<Option<Tensor>> = [rm, rv, w, bias]
            .into_iter()
            .map(|t| t.map(contiguous_compute::<C>).transpose())
            .collect::<Result<_>>()?;
        let mut all = vec![&xd];
        all.extend(params.iter().flatten());
        let r = Reader::new(&all);
        let xs = elems::<C>(&r, &xd)?;
        let p: Vec<Option<&[C]>> = params
            .iter()
            .map(|t| t.as_ref().map(|t| elems::<C>(&r, t)).transpose())
            .collect::<Result<_>>()?;
        let (rms, rvs, ws, bs) = (p[0], p[1], p[2], p[3]);
        let stats: Vec<(f64, f64)> = if training {
            par_map(&dev, ch, 2 * count, |c| {
                let seg = |b: usize| &xs[(b * ch + c) * s..(b * ch + c + 1) * s];
                let sum: f64 = (0..n).flat_map(seg).map(|v| v.to_f64()).sum();
                let mean = sum / count as f64;
                let sq: f64 = (0..n)
                    .flat_map(seg)
                    .map(|v| (v.to_f64() - mean) * (v.to_f64() - mean))
                    .sum();
                (mean, sq / count as f64)
            })?
        } else {
            let (m, v) = rms.zip(rvs).ok_or_else(|| {
                Error::invalid_argument(op, "running stats are required in evaluation mode")
            })?;
            (0..ch).map(|c| (m[c].to_f64(), v[c].to_f64())).collect()
        };
        let coef: Vec<(C, C)> = stats
            .iter()
            .map(|&(m, v)| (C::from_f64(m), C::from_f64(1.0 / (v + eps).sqrt())))
            .collect();
        let y = emit::<C>(&outputs[0], &device, &dev, |o| {
            par_rows(&dev, o, s, s, |row, os| {
                let c = row % ch;
                let (m, rstd) = coef[c];
                let xr = &xs[row * s..(row + 1) * s];
                for (o, &v) in os.iter_mut().zip(xr) {
                    let mut y = (v - m) * rstd;
                    if let Some(w) = ws {
                        y *= w[c];
                    }
                    if let Some(b) = bs {
                        y += b[c];
                    }
                    *o = y;
                }
            })
        })?;
        let mut outs = vec![y];
        if let (true, Some(rm), Some(rv)) = (training, rms, rvs) {
            let mom = C::from_f64(momentum);
            let keep = C::from_f64(1.0 - momentum);
            let unbias = count as f64 / (count as f64 - 1.0);
            outs.push(emit::<C>(&outputs[1], &device, &dev, |o| {
                for (c, o) in o.iter_mut().enumerate() {
                    *o = mom * C::from_f64(stats[c].0) + keep * rm[c];
                }
                Ok(())
            })?);
            outs.push(emit::<C>(&outputs[2], &device, &dev, |o| {
                for (c, o) in o.iter_mut().enumerate() {
                    *o = mom * C::from_f64(stats[c].1 * unbias) + keep * rv[c];
                }
                Ok(())
            })?);
        }
        Ok(outs)
    })
}
