//! Modules: nested parameter names, state dicts through safetensors, train/eval, and
//! PyTorch-shaped layers.

use crate::common::cpu;
use tpu_ops::nn::{
    self, Activation, BatchNorm2d, Dropout, Embedding, Flatten, Init, LayerNorm, Linear, Mlp,
    Module, MultiheadAttention, Sequential,
};
use tpu_ops::prelude::*;
use tpu_tensor::{DType, Generator, Tensor};

/// A two-level model, to check PyTorch-style nested names.
struct Block {
    attention: MultiheadAttention,
    norm: LayerNorm,
    mlp: Mlp,
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> tpu_tensor::Result<Tensor> {
        let h = x.add(&self.attention.forward(&self.norm.forward(x)?)?)?;
        h.add(&self.mlp.forward(&h)?)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = nn::prefixed("attention", self.attention.named_parameters());
        v.extend(nn::prefixed("norm", self.norm.named_parameters()));
        v.extend(nn::prefixed("mlp", self.mlp.named_parameters()));
        v
    }
}

struct Encoder {
    layer: Vec<Block>,
}

impl Module for Encoder {
    fn forward(&self, x: &Tensor) -> tpu_tensor::Result<Tensor> {
        let mut h = x.clone();
        for b in &self.layer {
            h = b.forward(&h)?;
        }
        Ok(h)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.layer
            .iter()
            .enumerate()
            .flat_map(|(i, b)| nn::prefixed(&format!("encoder.layer.{i}"), b.named_parameters()))
            .collect()
    }
}

fn encoder(seed: u64) -> Encoder {
    let dev = cpu();
    let mut g = Generator::new(seed);
    let mut init = Init::new(&dev, &mut g);
    let layer = (0..2)
        .map(|_| Block {
            attention: MultiheadAttention::new(8, 4, 2, true, true, &mut init).unwrap(),
            norm: LayerNorm::new(&[8], &mut init).unwrap(),
            mlp: Mlp::new(&[8, 16, 8], Activation::Gelu, &mut init).unwrap(),
        })
        .collect();
    Encoder { layer }
}

#[test]
fn nested_names_and_state_dict_round_trip() {
    let m = encoder(1);
    let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert!(
        names.contains(&"encoder.layer.0.attention.q_proj.weight".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"encoder.layer.1.mlp.layers.1.bias".to_string()),
        "{names:?}"
    );
    assert!(names.contains(&"encoder.layer.1.norm.weight".to_string()));
    // q: 8x8+8, k: 4x8+4, v: 4x8+4, o: 8x8+8, norm 16, mlp 8*16+16+16*8+8.
    assert_eq!(m.num_parameters(), 2 * (72 + 36 + 36 + 72 + 16 + 280));
    let x = Generator::new(5)
        .randn([2, 3, 8], DType::F32, &cpu())
        .unwrap();
    // Outputs compared bit for bit are computed holding the kernels' level: other tests of
    // this binary cap it meanwhile (`with_level`, one at a time), which changes the bits.
    let level = tpu_ops::cpu::isa::detected_level();
    let y = tpu_ops::cpu::isa::with_level(level, || m.forward(&x).unwrap());
    assert_eq!(y.shape(), &[2, 3, 8]);

    let dir = std::env::temp_dir().join(format!("tpu-rs-modules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("enc.safetensors");
    nn::save(&m, &path).unwrap();
    let other = encoder(2);
    assert_ne!(
        other.forward(&x).unwrap().to_vec::<f32>().unwrap(),
        y.to_vec::<f32>().unwrap()
    );
    nn::load(&other, &path, true).unwrap();
    assert_eq!(
        tpu_ops::cpu::isa::with_level(level, || other.forward(&x).unwrap())
            .to_vec::<f32>()
            .unwrap(),
        y.to_vec::<f32>().unwrap()
    );

    // A mismatched shape or a missing tensor is an error naming it.
    let mut state = tpu_tensor::load_safetensors(&path, &cpu()).unwrap();
    let ones = |n: usize| Tensor::ones([n], DType::F32, &cpu()).unwrap();
    let strict_error = |state: &_| {
        nn::load_state_dict(&other, state, true)
            .unwrap_err()
            .to_string()
    };
    state.insert("encoder.layer.0.norm.weight".into(), ones(9));
    let e = strict_error(&state);
    assert!(
        e.contains("encoder.layer.0.norm.weight") && e.contains("[8]") && e.contains("[9]"),
        "{e}"
    );
    state.remove("encoder.layer.0.norm.weight");
    let e = strict_error(&state);
    assert!(
        e.contains("missing tensor \"encoder.layer.0.norm.weight\""),
        "{e}"
    );
    assert!(nn::load_state_dict(&other, &state, false).is_ok());
    state.insert("extra.weight".into(), ones(1));
    state.insert("encoder.layer.0.norm.weight".into(), ones(8));
    let e = strict_error(&state);
    assert!(e.contains("unexpected tensor \"extra.weight\""), "{e}");
}

#[test]
fn layers_have_pytorch_shapes_and_init() {
    let dev = cpu();
    let mut g = Generator::new(0);
    let mut init = Init::new(&dev, &mut g);
    let l = Linear::new(100, 7, true, &mut init).unwrap();
    assert_eq!(
        (l.weight.shape(), l.bias.as_ref().unwrap().shape()),
        (&[7usize, 100][..], &[7usize][..])
    );
    assert!(
        l.weight
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|v| v.abs() <= 0.1)
    );
    let e = Embedding::new(10, 4, &mut init).unwrap();
    let idx = Tensor::new([[1i64, 9], [0, 1]], &dev).unwrap();
    assert_eq!(e.forward(&idx).unwrap().shape(), &[2, 2, 4]);
    let conv = nn::Conv2d::new(
        3,
        6,
        [3, 3],
        tpu_ops::ops::conv::ConvOptions::new().padding(1),
        true,
        &mut init,
    )
    .unwrap();
    assert_eq!(conv.weight.shape(), &[6, 3, 3, 3]);
    let model = Sequential::new()
        .push(conv)
        .push(Activation::Relu)
        .push(Flatten::default())
        .push(Linear::new(6 * 4 * 4, 2, true, &mut init).unwrap());
    let x = Tensor::ones([2, 3, 4, 4], DType::F32, &dev).unwrap();
    assert_eq!(model.forward(&x).unwrap().shape(), &[2, 2]);
    let names: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["0.weight", "0.bias", "3.weight", "3.bias"]);
    assert!(
        nn::Conv2d::new(
            3,
            6,
            [3, 3],
            tpu_ops::ops::conv::ConvOptions::new().groups(2),
            true,
            &mut init
        )
        .is_err()
    );
    assert!(MultiheadAttention::new(8, 3, 1, true, false, &mut init).is_err());
}

#[test]
fn train_and_eval_modes() {
    let dev = cpu();
    let mut g = Generator::new(0);
    let mut init = Init::new(&dev, &mut g);
    let mut bn = BatchNorm2d::new(2, &mut init).unwrap();
    let x = Generator::new(3)
        .randn([4, 2, 3, 3], DType::F32, &dev)
        .unwrap()
        .mul(2.0)
        .unwrap()
        .add(1.0)
        .unwrap();
    let before = bn.running_mean.to_vec::<f32>().unwrap();
    bn.forward(&x).unwrap();
    let after = bn.running_mean.to_vec::<f32>().unwrap();
    assert_ne!(before, after);
    assert_eq!(bn.num_batches_tracked.to_scalar::<i64>().unwrap(), 1);
    let names: Vec<String> = bn.state_dict().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "weight",
            "bias",
            "running_mean",
            "running_var",
            "num_batches_tracked"
        ]
    );
    bn.set_training(false);
    bn.forward(&x).unwrap();
    assert_eq!(bn.running_mean.to_vec::<f32>().unwrap(), after);

    let mut d = Dropout::new(0.5, 7);
    let ones = Tensor::ones([1000], DType::F32, &dev).unwrap();
    let y = d.forward(&ones).unwrap().to_vec::<f32>().unwrap();
    assert!(y.iter().all(|v| *v == 0.0 || *v == 2.0));
    let kept = y.iter().filter(|v| **v == 2.0).count();
    assert!((400..600).contains(&kept), "{kept}");
    d.set_training(false);
    assert_eq!(
        d.forward(&ones).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0; 1000]
    );
}

#[test]
fn a_small_model_learns() {
    // y = 3x - 1 on a few points, with an MLP and SGD; the loss must fall.
    let dev = cpu();
    let mut g = Generator::new(11);
    let mut init = Init::new(&dev, &mut g);
    let model = Mlp::new(&[1, 16, 1], Activation::Tanh, &mut init).unwrap();
    let x = Tensor::linspace(-1.0, 1.0, 16, DType::F32, &dev)
        .unwrap()
        .reshape([16, 1])
        .unwrap();
    let y = x.mul(3.0).unwrap().sub(1.0).unwrap();
    let mut opt = tpu_ops::optim::Sgd::new(model.parameters(), 0.1);
    use tpu_ops::optim::Optimizer;
    let mut losses = vec![];
    for _ in 0..60 {
        opt.zero_grad();
        let loss = tpu_ops::ops::nn::functional::mse_loss(
            &model.forward(&x).unwrap(),
            &y,
            Default::default(),
        )
        .unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap());
        loss.backward().unwrap();
        opt.step().unwrap();
    }
    assert!(losses[59] < losses[0] * 0.05, "{losses:?}");
}
