//! The CPU kernels of the losses: the class losses one sample per task, the elementwise ones
//! over broadcast operands; reductions sum in f64, in an order that does not depend on the
//! threads.

use tpu_tensor::tpu_runtime::memory::try_host_vec;
use tpu_tensor::{DType, Element, Error, Result, Tensor};

use super::{ClassLoss, PointKind, PointLoss, Reduction, class_layout};
use crate::cpu::float::{Float, with_compute};
use crate::cpu::kernels::{MultiWalk, Reader, broadcast_strides, launch, par_map, par_rows};
use crate::op::Meta;
use crate::ops::nn::args::take;
use crate::ops::nn::cpu::{contiguous_compute, elems, emit};

/// Per target position of one sample: `[nll, smoothing term, target weight]`, zeros where
/// ignored.
#[allow(clippy::too_many_arguments)]
fn class_slab<C: Float>(
    x: &[C],
    tgt: &[i64],
    classes: usize,
    logits: bool,
    ignore: i64,
    w: Option<&[f64]>,
    smoothing: bool,
    out: &mut [[f64; 3]],
) {
    let inner = tgt.len();
    let lse: Vec<f64> = if logits {
        let mut m = vec![C::NEG_INF; inner];
        for c in 0..classes {
            for (mm, &v) in m.iter_mut().zip(&x[c * inner..(c + 1) * inner]) {
                if v > *mm {
                    *mm = v;
                }
            }
        }
        let mut s = vec![0f64; inner];
        for c in 0..classes {
            for d in 0..inner {
                s[d] += (x[c * inner + d] - m[d]).exp().to_f64();
            }
        }
        m.iter().zip(&s).map(|(m, s)| m.to_f64() + s.ln()).collect()
    } else {
        vec![0.0; inner]
    };
    for d in 0..inner {
        let t = tgt[d];
        out[d] = if t == ignore {
            [0.0; 3]
        } else {
            let wt = w.map_or(1.0, |w| w[t as usize]);
            let lp = x[t as usize * inner + d].to_f64() - lse[d];
            [-wt * lp, 0.0, wt]
        };
    }
    if smoothing {
        let mut acc = vec![0f64; inner];
        for c in 0..classes {
            let wc = w.map_or(1.0, |w| w[c]);
            for d in 0..inner {
                acc[d] += wc * (x[c * inner + d].to_f64() - lse[d]);
            }
        }
        for d in 0..inner {
            if tgt[d] != ignore {
                out[d][1] = -acc[d];
            }
        }
    }
}

pub(super) fn class_loss(
    this: &ClassLoss,
    inputs: &[&Tensor],
    outputs: &[Meta],
) -> Result<Vec<Tensor>> {
    let (x, target) = (inputs[0], inputs[1].contiguous()?);
    let (op, dev, device) = launch(this, x)?;
    let (n, classes, inner) = class_layout(x.shape());
    let tgt: Vec<i64> = {
        let r = Reader::new(&[&target]);
        r.data::<i64>(&target)?
            .get(target.offset()..target.offset() + target.numel())
            .ok_or_else(|| Error::invalid_argument(op, "target outside its storage"))?
            .to_vec()
    };
    let ignore = this.ignore_index;
    if let Some(&bad) = tgt
        .iter()
        .find(|&&t| t != ignore && (t < 0 || t as usize >= classes))
    {
        return Err(Error::IndexOutOfRange {
            op: op.into(),
            index: bad,
            dim: if x.rank() == 1 { 0 } else { 1 },
            size: classes,
            shape: x.shape().to_vec(),
        });
    }
    let weights: Option<Vec<f64>> = inputs
        .get(2)
        .map(|w| w.to_dtype(DType::F64)?.to_vec::<f64>())
        .transpose()?;
    let eps = this.label_smoothing;
    let (logits, smoothing) = (this.logits, this.logits && eps > 0.0);
    let reduction = this.reduction;
    with_compute!(op, x.dtype(), |C| {
        let xd = contiguous_compute::<C>(x)?;
        let r = Reader::new(&[&xd]);
        let xs = elems::<C>(&r, &xd)?;
        // Three sums per target: more than the (possibly scalar) output, so checked.
        let mut per = try_host_vec(n * inner, [0f64; 3], || {
            format!("{op} scratch for {} targets", n * inner)
        })?;
        let slab = classes * inner;
        par_rows(&dev, &mut per, inner, 3 * slab, |i, out| {
            class_slab(
                &xs[i * slab..(i + 1) * slab],
                &tgt[i * inner..(i + 1) * inner],
                classes,
                logits,
                ignore,
                weights.as_deref(),
                smoothing,
                out,
            )
        })?;
        let mix = |nll: f64, sm: f64| {
            if smoothing {
                (1.0 - eps) * nll + sm * (eps / classes as f64)
            } else {
                nll
            }
        };
        let t = emit::<C>(&outputs[0], &device, &dev, |o| {
            match reduction {
                Reduction::None => {
                    for (o, p) in o.iter_mut().zip(&per) {
                        *o = C::from_f64(mix(p[0], p[1]));
                    }
                }
                _ => {
                    let (mut a, mut sm, mut w) = (0.0, 0.0, 0.0);
                    for p in &per {
                        a += p[0];
                        sm += p[1];
                        w += p[2];
                    }
                    o[0] = C::from_f64(if reduction == Reduction::Mean {
                        mix(a / w, sm / w)
                    } else {
                        mix(a, sm)
                    });
                }
            }
            Ok(())
        })?;
        Ok(vec![t])
    })
}

const SUM_CHUNK: usize = 1 << 14;

#[inline]
fn bce<C: Float>(x: C, t: C, w: C, pw: C) -> C {
    let neg = if x < C::ZERO { x } else { C::ZERO };
    let log_sig = (neg - (-x.abs()).exp().ln_1p()) * ((pw - C::ONE) * t + C::ONE);
    ((C::ONE - t) * x - log_sig) * w
}

pub(super) fn point_loss(
    this: &PointLoss,
    inputs: &[&Tensor],
    outputs: &[Meta],
) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let (op, dev, device) = launch(this, x)?;
    let shape = x.shape();
    let mut i = 2;
    let w = take(inputs, this.weight, &mut i).copied();
    let pw = take(inputs, this.pos_weight, &mut i).copied();
    let (kind, reduction) = (this.kind, this.reduction);
    with_compute!(op, x.dtype(), |C| {
        let conv = |t: Option<&Tensor>| t.map(|t| t.to_dtype(C::DTYPE)).transpose();
        let ops: [Option<Tensor>; 4] = [
            Some(x.to_dtype(C::DTYPE)?),
            Some(inputs[1].to_dtype(C::DTYPE)?),
            conv(w)?,
            conv(pw)?,
        ];
        let all: Vec<&Tensor> = ops.iter().flatten().collect();
        let r = Reader::new(&all);
        let one = [C::ONE];
        let zeros = vec![0usize; shape.len()];
        let mut data: [&[C]; 4] = [&one; 4];
        let mut strides: [tpu_tensor::Dims; 4] = std::array::from_fn(|_| zeros[..].into());
        let mut offsets = [0usize; 4];
        for (k, t) in ops.iter().enumerate() {
            if let Some(t) = t {
                data[k] = r.data::<C>(t)?;
                strides[k] = broadcast_strides(t, shape);
                offsets[k] = t.offset();
            }
        }
        let walk = MultiWalk::<4>::new(
            shape,
            [
                &strides[0][..],
                &strides[1][..],
                &strides[2][..],
                &strides[3][..],
            ],
            offsets,
        );
        let f = |a: C, b: C, c: C, d: C| match kind {
            PointKind::Mse => (a - b) * (a - b),
            PointKind::BceWithLogits => bce(a, b, c, d),
        };
        let at = |off: [usize; 4], st: [usize; 4], j: usize| {
            f(
                data[0][off[0] + j * st[0]],
                data[1][off[1] + j * st[1]],
                data[2][off[2] + j * st[2]],
                data[3][off[3] + j * st[3]],
            )
        };
        let numel = walk.numel();
        let t = emit::<C>(&outputs[0], &device, &dev, |o| {
            if reduction == Reduction::None {
                return crate::cpu::kernels::par_chunks(&dev, o, |chunk, base| {
                    walk.spans(base, base + chunk.len(), |start, len, off, st| {
                        for j in 0..len {
                            chunk[start - base + j] = at(off, st, j);
                        }
                    })
                });
            }
            // Fixed chunks summed in order: the result does not depend on the threads.
            let parts = par_map(&dev, numel.div_ceil(SUM_CHUNK), SUM_CHUNK, |c| {
                let mut acc = 0f64;
                let hi = ((c + 1) * SUM_CHUNK).min(numel);
                walk.spans(c * SUM_CHUNK, hi, |_, len, off, st| {
                    for j in 0..len {
                        acc += at(off, st, j).to_f64();
                    }
                });
                acc
            })?;
            let total: f64 = parts.iter().sum();
            o[0] = C::from_f64(if reduction == Reduction::Mean {
                total / numel as f64
            } else {
                total
            });
            Ok(())
        })?;
        Ok(vec![t])
    })
}
