//! The op table's rows for the nn ops, with their seeded sample inputs (non-contiguous views,
//! -inf logits, ignored targets, grouped heads and masks).

use std::sync::Arc;

use tpu_tensor::{DType, Device, Generator, Result, Tensor};

use super::functional::{self, DEFAULT_IGNORE_INDEX, Reduction};
use super::{NormKind, PointKind};
use crate::op::samples::{host_map, randn_affine};
use crate::op::{DTypeSet, OpInfo};

fn positive(g: &mut Generator, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
    let t = g.randn(shape, DType::F64, &Device::cpu())?;
    host_map(&t, |v| v.abs() + 0.5)?
        .to_dtype(dtype)?
        .to_device(device)
}

fn sample_softmax(log: bool, d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(21);
    let base = g.randn([3, 5, 4], DType::F64, &Device::cpu())?;
    let mut x = host_map(&base, |v| v * 3.0)?.to_vec::<f64>()?;
    // One -inf logit, and a row that is -inf but for one element.
    x[7] = f64::NEG_INFINITY;
    for j in [0, 4, 8, 12] {
        x[40 + j] = f64::NEG_INFINITY;
    }
    let x = Tensor::from_vec(x, [3, 5, 4], &Device::cpu())?
        .to_dtype(d)?
        .to_device(dev)?;
    let xt = x.transpose(0, 2)?;
    let f = |t: &Tensor, dim: i64| {
        if log {
            functional::log_softmax(t, dim)
        } else {
            functional::softmax(t, dim)
        }
    };
    Ok(vec![f(&x, -1)?, f(&xt, 1)?])
}

fn sample_norms(kind: NormKind, d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    use functional::{
        NormOptions, RmsNormOptions, group_norm, group_norm_with, layer_norm_with, rms_norm_with,
    };
    let mut g = Generator::new(22);
    // [2, 6, 5] seen through a transpose: non-contiguous.
    let x = randn_affine(&mut g, &[2, 5, 6], 2.0, 0.5, d, dev)?.transpose(1, 2)?;
    Ok(match kind {
        NormKind::Layer => {
            let w = randn_affine(&mut g, &[5], 1.0, 0.0, d, dev)?;
            let b = randn_affine(&mut g, &[5], 1.0, 0.0, d, dev)?;
            vec![
                layer_norm_with(&x, &[5], &NormOptions::new().weight(&w).bias(&b))?,
                layer_norm_with(&x, &[6, 5], &NormOptions::new().eps(1e-3))?,
            ]
        }
        NormKind::Rms => {
            let w = randn_affine(&mut g, &[5], 1.0, 0.0, d, dev)?;
            vec![
                rms_norm_with(&x, &[5], &RmsNormOptions::new().weight(&w))?,
                rms_norm_with(&x, &[6, 5], &RmsNormOptions::new().eps(1e-3))?,
            ]
        }
        NormKind::Group(_) => {
            let w = randn_affine(&mut g, &[6], 1.0, 0.0, d, dev)?;
            let b = randn_affine(&mut g, &[6], 1.0, 0.0, d, dev)?;
            vec![
                group_norm_with(&x, 3, &NormOptions::new().weight(&w).bias(&b))?,
                group_norm(&x, 2)?,
            ]
        }
    })
}

fn sample_batch_norm(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(23);
    let x = randn_affine(&mut g, &[4, 5, 3], 2.0, 0.0, d, dev)?.transpose(1, 2)?;
    let rm = randn_affine(&mut g, &[3], 1.0, 0.0, d, dev)?;
    let rv = positive(&mut g, &[3], d, dev)?;
    let w = randn_affine(&mut g, &[3], 1.0, 0.0, d, dev)?;
    let b = randn_affine(&mut g, &[3], 1.0, 0.0, d, dev)?;
    let train = functional::batch_norm(
        &x,
        &functional::BatchNormOptions::new()
            .running_mean(&rm)
            .running_var(&rv)
            .weight(&w)
            .bias(&b)
            .training(true),
    )?;
    let eval = functional::batch_norm(
        &x,
        &functional::BatchNormOptions::new()
            .running_mean(&rm)
            .running_var(&rv)
            .bias(&b),
    )?;
    let mut out = vec![train.output];
    out.extend(train.running_mean);
    out.extend(train.running_var);
    out.push(eval.output);
    Ok(out)
}

fn sample_dropout(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(24);
    let x = randn_affine(&mut g, &[16, 8], 1.0, 0.0, d, dev)?.t()?;
    Ok(vec![
        functional::dropout_seeded(&x, 0.3, true, 7)?,
        functional::dropout_seeded(&x, 1.0, true, 7)?,
    ])
}

fn sample_rotary(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(25);
    // [batch, seq, heads, dim] transposed to [batch, heads, seq, dim].
    let x = randn_affine(&mut g, &[2, 4, 3, 8], 1.0, 0.0, d, dev)?.transpose(1, 2)?;
    let (cos, sin) = functional::rotary_cos_sin(&[0, 1, 2, 3], 8, 10000.0, d, dev)?;
    Ok(vec![functional::apply_rotary_emb(&x, &cos, &sin)?])
}

fn sample_sdpa(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    use functional::{AttentionOptions, scaled_dot_product_attention_with as sdpa};
    let mut g = Generator::new(26);
    // Queries [B, L, H, E] viewed as [B, H, L, E]; 4 query heads over 2 key/value heads.
    let q = randn_affine(&mut g, &[2, 5, 4, 8], 1.0, 0.0, d, dev)?.transpose(1, 2)?;
    let k = randn_affine(&mut g, &[2, 2, 7, 8], 1.0, 0.0, d, dev)?;
    let v = randn_affine(&mut g, &[2, 2, 7, 6], 1.0, 0.0, d, dev)?;
    let mut keep = g
        .randint(0, 2, [5, 7], DType::Bool, &Device::cpu())?
        .to_vec::<bool>()?;
    keep[7..14].iter_mut().for_each(|b| *b = false);
    let keep = Tensor::from_vec(keep, [5, 7], dev)?;
    let bias = randn_affine(&mut g, &[2, 1, 5, 7], 1.0, 0.0, d, dev)?;
    Ok(vec![
        sdpa(
            &q,
            &k,
            &v,
            &AttentionOptions::new().is_causal(true).enable_gqa(true),
        )?,
        sdpa(
            &q,
            &k,
            &v,
            &AttentionOptions::new()
                .attn_mask(&keep)
                .scale(0.5)
                .enable_gqa(true),
        )?,
        sdpa(
            &q,
            &k,
            &v,
            &AttentionOptions::new().attn_mask(&bias).enable_gqa(true),
        )?,
    ])
}

fn sample_class_loss(logits: bool, d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(27);
    let cpu = Device::cpu();
    let x = randn_affine(&mut g, &[4, 5], 2.0, 0.0, d, dev)?.t()?;
    let mut t = g.randint(0, 4, [5], DType::I64, &cpu)?.to_vec::<i64>()?;
    t[2] = DEFAULT_IGNORE_INDEX;
    let t = Tensor::from_vec(t, [5], dev)?;
    let w = positive(&mut g, &[4], d, dev)?;
    let x3 = randn_affine(&mut g, &[3, 4, 2], 2.0, 0.0, d, dev)?;
    let t3 = g.randint(0, 4, [3, 2], DType::I64, &cpu)?.to_device(dev)?;
    Ok(if logits {
        use functional::{CrossEntropyOptions as Opts, cross_entropy_with as ce};
        vec![
            ce(&x, &t, &Opts::new().weight(&w).label_smoothing(0.1))?,
            ce(
                &x,
                &t,
                &Opts::new().reduction(Reduction::None).label_smoothing(0.2),
            )?,
            ce(
                &x3,
                &t3,
                &Opts::new()
                    .weight(&w)
                    .ignore_index(1)
                    .reduction(Reduction::Sum),
            )?,
        ]
    } else {
        use functional::{NllLossOptions as Opts, nll_loss_with as nll};
        vec![
            nll(&x, &t, &Opts::new().weight(&w))?,
            nll(
                &x3,
                &t3,
                &Opts::new().ignore_index(1).reduction(Reduction::None),
            )?,
        ]
    })
}

fn sample_point_loss(kind: PointKind, d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(28);
    let x = randn_affine(&mut g, &[3, 4], 2.0, 0.0, d, dev)?.t()?;
    Ok(match kind {
        PointKind::Mse => {
            let t = randn_affine(&mut g, &[4, 3], 1.0, 0.0, d, dev)?;
            use functional::mse_loss;
            vec![
                mse_loss(&x, &t, Reduction::None)?,
                mse_loss(&x, &t, Reduction::Mean)?,
                mse_loss(&x, &t, Reduction::Sum)?,
            ]
        }
        PointKind::BceWithLogits => {
            let t = g
                .rand([4, 3], DType::F64, &Device::cpu())?
                .to_dtype(d)?
                .to_device(dev)?;
            let w = positive(&mut g, &[4, 1], d, dev)?;
            let pw = positive(&mut g, &[3], d, dev)?;
            use functional::{
                BceWithLogitsOptions as Opts, binary_cross_entropy_with_logits_with as bce,
            };
            vec![
                bce(
                    &x,
                    &t,
                    &Opts::new()
                        .weight(&w)
                        .pos_weight(&pw)
                        .reduction(Reduction::None),
                )?,
                bce(&x, &t, &Opts::new().pos_weight(&pw))?,
                bce(&x, &t, &Opts::new().weight(&w).reduction(Reduction::Sum))?,
            ]
        }
    })
}

/// The rows of the op table for this file's ops.
pub fn table() -> Vec<OpInfo> {
    fn row(
        name: &'static str,
        tolerance: f64,
        f: impl Fn(DType, &Device) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    ) -> OpInfo {
        OpInfo {
            name,
            cpu: DTypeSet::FLOAT,
            hlo: DTypeSet::FLOAT,
            sample: Arc::new(f),
            tolerance,
            // Every op of this file has a backward rule (see `grad`).
        }
    }
    vec![
        row("softmax", 1e-5, |d, dev| sample_softmax(false, d, dev)),
        row("log_softmax", 1e-5, |d, dev| sample_softmax(true, d, dev)),
        row("layer_norm", 1e-5, |d, dev| {
            sample_norms(NormKind::Layer, d, dev)
        }),
        row("rms_norm", 1e-5, |d, dev| {
            sample_norms(NormKind::Rms, d, dev)
        }),
        row("group_norm", 1e-5, |d, dev| {
            sample_norms(NormKind::Group(0), d, dev)
        }),
        row("batch_norm", 1e-5, sample_batch_norm),
        row("dropout", 1e-6, sample_dropout),
        row("apply_rotary_emb", 1e-6, sample_rotary),
        row("scaled_dot_product_attention", 1e-5, sample_sdpa),
        row("cross_entropy", 1e-5, |d, dev| {
            sample_class_loss(true, d, dev)
        }),
        row("nll_loss", 1e-5, |d, dev| sample_class_loss(false, d, dev)),
        row("mse_loss", 1e-5, |d, dev| {
            sample_point_loss(PointKind::Mse, d, dev)
        }),
        row("binary_cross_entropy_with_logits", 1e-5, |d, dev| {
            sample_point_loss(PointKind::BceWithLogits, d, dev)
        }),
    ]
}
