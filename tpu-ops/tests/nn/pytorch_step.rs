//! One full training step (forward, cross-entropy, backward, AdamW) of a fixed small MLP and of
//! a fixed small transformer block (layer norms, grouped-query causal attention, GELU MLP,
//! label smoothing), compared with PyTorch's step to 1e-5. The parameters are filled from a
//! formula both sides share; the reference values and the script that printed them are in
//! tests/data/pytorch_step_values.rs.

#![allow(clippy::excessive_precision)]

use crate::common::pjrt;
use tpu_ops::nn::{Activation, Init, LayerNorm, Linear, Mlp, Module, MultiheadAttention};
use tpu_ops::ops::nn::functional::{CrossEntropyOptions, cross_entropy, cross_entropy_with};
use tpu_ops::optim::{Adam, Optimizer};
use tpu_ops::prelude::*;
use tpu_tensor::{DType, Device, Generator, Tensor};

include!("../data/pytorch_step_values.rs");

fn fill(shape: &[usize], k: f64, device: &Device) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| (0.37 * i as f64 + k).sin() * 0.3).collect();
    Tensor::from_vec(v, shape, device).unwrap()
}

fn set(p: &Tensor, k: f64) {
    let _g = no_grad();
    p.copy_(&fill(p.shape(), k, p.device())).unwrap();
}

fn check(named: &[(String, Tensor)], want: &[(&str, &[f64])]) {
    assert_eq!(named.len(), want.len());
    for (name, values) in want {
        let (_, t) = named
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no parameter {name}"));
        let got = t
            .to_device(&Device::cpu())
            .unwrap()
            .to_vec::<f64>()
            .unwrap();
        assert_eq!(got.len(), values.len(), "{name}");
        for (i, (g, w)) in got.iter().zip(values.iter()).enumerate() {
            assert!((g - w).abs() < 1e-5, "{name}[{i}]: {g} vs PyTorch {w}");
        }
    }
}

/// Backpropagates `loss`, takes one step of `opt`, and checks the loss against `want_loss`
/// (the value before the step) and the parameters `named` against `want` (after it).
fn step_and_check(
    loss: &Tensor,
    opt: &mut impl Optimizer,
    want_loss: f64,
    named: &[(String, Tensor)],
    want: &[(&str, &[f64])],
) {
    loss.backward().unwrap();
    opt.step().unwrap();
    let l = loss
        .to_device(&Device::cpu())
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    assert!((l - want_loss).abs() < 1e-10, "{l} vs {want_loss}");
    check(named, want);
}

/// f64 parameters on `device`, initialised from `g`: the dtype the PyTorch values were made in.
fn f64_init<'a>(device: &'a Device, g: &'a mut Generator) -> Init<'a> {
    Init {
        dtype: DType::F64,
        ..Init::new(device, g)
    }
}

fn mlp_step(device: &Device) {
    let mut g = Generator::new(0);
    let mut init = f64_init(device, &mut g);
    let model = Mlp::new(&[6, 8, 4], Activation::Relu, &mut init).unwrap();
    for ((_, p), k) in model.named_parameters().iter().zip([1.0, 2.0, 3.0, 4.0]) {
        set(p, k);
    }
    let x = fill(&[5, 6], 5.0, device).mul(3.0).unwrap();
    let y = Tensor::new([0i64, 3, 1, 2, 3], &Device::cpu())
        .unwrap()
        .to_device(device)
        .unwrap();
    let mut opt = Adam::adamw(model.parameters(), 0.01).with((0.9, 0.999), 1e-8, 0.1);
    let loss = cross_entropy(&model.forward(&x).unwrap(), &y).unwrap();
    step_and_check(
        &loss,
        &mut opt,
        MLP_LOSS,
        &model.named_parameters(),
        MLP_AFTER,
    );
}

struct Block {
    ln1: LayerNorm,
    attn: MultiheadAttention,
    ln2: LayerNorm,
    mlp: Mlp,
    head: Linear,
}

impl Block {
    fn named(&self) -> Vec<(String, Tensor)> {
        let mut v = tpu_ops::nn::prefixed("ln1", self.ln1.named_parameters());
        v.extend(tpu_ops::nn::prefixed("attn", self.attn.named_parameters()));
        v.extend(tpu_ops::nn::prefixed("ln2", self.ln2.named_parameters()));
        v.extend(tpu_ops::nn::prefixed("mlp", self.mlp.named_parameters()));
        v.extend(tpu_ops::nn::prefixed("head", self.head.named_parameters()));
        v
    }

    fn logits(&self, x: &Tensor) -> tpu_tensor::Result<Tensor> {
        let h = x.add(&self.attn.forward(&self.ln1.forward(x)?)?)?;
        let h2 = h.add(&self.mlp.forward(&self.ln2.forward(&h)?)?)?;
        self.head.forward(&h2.mean(&[1], false)?)
    }
}

fn block_step(device: &Device) {
    let mut g = Generator::new(0);
    let mut init = f64_init(device, &mut g);
    let block = Block {
        ln1: LayerNorm::new(&[8], &mut init).unwrap(),
        attn: MultiheadAttention::new(8, 4, 2, true, true, &mut init).unwrap(),
        ln2: LayerNorm::new(&[8], &mut init).unwrap(),
        mlp: Mlp::new(&[8, 16, 8], Activation::Gelu, &mut init).unwrap(),
        head: Linear::new(8, 3, true, &mut init).unwrap(),
    };
    let named = block.named();
    let order = [
        "ln1.weight",
        "ln1.bias",
        "attn.q_proj.weight",
        "attn.q_proj.bias",
        "attn.k_proj.weight",
        "attn.k_proj.bias",
        "attn.v_proj.weight",
        "attn.v_proj.bias",
        "attn.o_proj.weight",
        "attn.o_proj.bias",
        "ln2.weight",
        "ln2.bias",
        "mlp.layers.0.weight",
        "mlp.layers.0.bias",
        "mlp.layers.1.weight",
        "mlp.layers.1.bias",
        "head.weight",
        "head.bias",
    ];
    for (i, name) in order.iter().enumerate() {
        let (_, p) = named.iter().find(|(n, _)| n == name).unwrap();
        set(p, 10.0 + i as f64);
        if name.starts_with("ln") && name.ends_with("weight") {
            let _g = no_grad();
            p.copy_(&p.add(1.0).unwrap()).unwrap();
        }
    }
    let x = fill(&[2, 3, 8], 30.0, device).mul(2.0).unwrap();
    let y = Tensor::new([2i64, 0], &Device::cpu())
        .unwrap()
        .to_device(device)
        .unwrap();
    let params: Vec<Tensor> = order
        .iter()
        .map(|n| named.iter().find(|(m, _)| m == n).unwrap().1.clone())
        .collect();
    let mut opt = Adam::adamw(params, 0.01).with((0.9, 0.999), 1e-8, 0.1);
    let loss = cross_entropy_with(
        &block.logits(&x).unwrap(),
        &y,
        &CrossEntropyOptions::new().label_smoothing(0.1),
    )
    .unwrap();
    step_and_check(&loss, &mut opt, BLOCK_LOSS, &named, BLOCK_AFTER);
}

#[test]
fn mlp_training_step_matches_pytorch() {
    mlp_step(&Device::cpu());
}

#[test]
fn transformer_block_training_step_matches_pytorch() {
    block_step(&Device::cpu());
}

#[test]
fn the_same_steps_through_pjrt_match_pytorch() {
    let Some(dev) = pjrt("the_same_steps_through_pjrt_match_pytorch") else {
        return;
    };
    mlp_step(&dev);
    block_step(&dev);
}
