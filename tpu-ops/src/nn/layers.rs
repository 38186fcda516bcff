//! The layers, with PyTorch's parameter names, shapes and default initialisations.

use std::sync::Mutex;

use tpu_tensor::{DType, Device, Error, Generator, Result, Tensor};

use super::{Module, children_named, init, own_tensors};
use crate::ops::conv::{ConvOps, ConvOptions, MaxPoolOptions};
use crate::ops::elementwise::methods::TensorOps;
use crate::ops::linalg::linear;
use crate::ops::movement::embedding;
use crate::ops::nn::functional as f;

/// Where and in what dtype a layer's parameters are created, and the seeded generator that
/// initialises them.
pub struct Init<'a> {
    /// The device holding the parameters.
    pub device: &'a Device,
    /// Their dtype.
    pub dtype: DType,
    /// The seeded source of initial values.
    pub generator: &'a mut Generator,
}

impl<'a> Init<'a> {
    /// f32 parameters on `device`, initialised from `generator`.
    pub fn new(device: &'a Device, generator: &'a mut Generator) -> Init<'a> {
        Init {
            device,
            dtype: DType::F32,
            generator,
        }
    }
}

/// `y = x W^T + b` (PyTorch's `nn.Linear`): `weight` `[out, in]`, `bias` `[out]`, both
/// `U(-1/sqrt(in), 1/sqrt(in))`.
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Tensor,
    /// `[out_features]`, if any.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A new layer.
    pub fn new(
        in_features: usize,
        out_features: usize,
        bias: bool,
        init: &mut Init,
    ) -> Result<Linear> {
        let (weight, bias) =
            weight_and_bias(&[out_features, in_features], in_features, bias, init)?;
        Ok(Linear { weight, bias })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        linear(x, &self.weight, self.bias.as_ref())
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        own_tensors([("weight", Some(&self.weight)), ("bias", self.bias.as_ref())])
    }
}

/// A lookup table of vectors (PyTorch's `nn.Embedding`), initialised `N(0, 1)`.
pub struct Embedding {
    /// [num_embeddings, embedding_dim].
    pub weight: Tensor,
}

impl Embedding {
    /// A new table.
    pub fn new(num_embeddings: usize, dim: usize, init: &mut Init) -> Result<Embedding> {
        Ok(Embedding {
            weight: init::normal(&[num_embeddings, dim], 0.0, 1.0, init)?,
        })
    }
}

impl Module for Embedding {
    fn forward(&self, indices: &Tensor) -> Result<Tensor> {
        embedding(indices, &self.weight)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        own_tensors([("weight", Some(&self.weight))])
    }
}

/// Layer normalisation over the last dims (PyTorch's `nn.LayerNorm`): weight ones, bias zeros.
pub struct LayerNorm {
    /// The normalised trailing shape.
    pub shape: Vec<usize>,
    /// Scale.
    pub weight: Tensor,
    /// Shift.
    pub bias: Tensor,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// A new layer (eps 1e-5).
    pub fn new(shape: &[usize], init: &mut Init) -> Result<LayerNorm> {
        Ok(LayerNorm {
            shape: shape.to_vec(),
            weight: init::constant(shape, 1.0, init)?,
            bias: init::constant(shape, 0.0, init)?,
            eps: 1e-5,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        f::layer_norm_with(
            x,
            &self.shape,
            &f::NormOptions::new()
                .weight(&self.weight)
                .bias(&self.bias)
                .eps(self.eps),
        )
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        own_tensors([("weight", Some(&self.weight)), ("bias", Some(&self.bias))])
    }
}

/// Root-mean-square normalisation (PyTorch's `nn.RMSNorm`): weight ones.
pub struct RmsNorm {
    /// The normalised trailing shape.
    pub shape: Vec<usize>,
    /// Scale.
    pub weight: Tensor,
    /// Added to the mean square; `None` uses the dtype's machine epsilon.
    pub eps: Option<f64>,
}

impl RmsNorm {
    /// A new layer.
    pub fn new(shape: &[usize], eps: Option<f64>, init: &mut Init) -> Result<RmsNorm> {
        Ok(RmsNorm {
            shape: shape.to_vec(),
            weight: init::constant(shape, 1.0, init)?,
            eps,
        })
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        f::rms_norm_with(
            x,
            &self.shape,
            &f::RmsNormOptions::new().weight(&self.weight).eps(self.eps),
        )
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        own_tensors([("weight", Some(&self.weight))])
    }
}

/// 2-D convolution (PyTorch's `nn.Conv2d`): weight [out, in/groups, kh, kw] and bias, both
/// `U(-1/sqrt(fan_in), 1/sqrt(fan_in))` with `fan_in = in/groups * kh * kw`.
pub struct Conv2d {
    /// The kernel.
    pub weight: Tensor,
    /// The bias, if any.
    pub bias: Option<Tensor>,
    /// Stride, padding, dilation and groups.
    pub options: ConvOptions,
}

impl Conv2d {
    /// A new layer.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        options: ConvOptions,
        bias: bool,
        init: &mut Init,
    ) -> Result<Conv2d> {
        let groups = options.groups.max(1);
        if !in_channels.is_multiple_of(groups) || !out_channels.is_multiple_of(groups) {
            return Err(Error::invalid_argument(
                "Conv2d",
                format!(
                    "groups {groups} must divide in_channels {in_channels} and out_channels {out_channels}"
                ),
            ));
        }
        // Saturating: an impossible size fails below, when the weight is made.
        let fan_in = (in_channels / groups)
            .saturating_mul(kernel[0])
            .saturating_mul(kernel[1]);
        let weight_shape = [out_channels, in_channels / groups, kernel[0], kernel[1]];
        let (weight, bias) = weight_and_bias(&weight_shape, fan_in, bias, init)?;
        Ok(Conv2d {
            weight,
            bias,
            options,
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.conv2d(&self.weight, self.bias.as_ref(), &self.options)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        own_tensors([("weight", Some(&self.weight)), ("bias", self.bias.as_ref())])
    }
}

/// Batch normalisation over the channels of NCHW input (PyTorch's `nn.BatchNorm2d`), with
/// running statistics updated in place in training mode.
pub struct BatchNorm2d {
    /// Scale (ones).
    pub weight: Tensor,
    /// Shift (zeros).
    pub bias: Tensor,
    /// Running mean (zeros), a buffer.
    pub running_mean: Tensor,
    /// Running variance (ones), a buffer.
    pub running_var: Tensor,
    /// Batches seen in training, a buffer.
    pub num_batches_tracked: Tensor,
    /// Weight of the newest batch in the running statistics.
    pub momentum: f64,
    /// Added to the variance.
    pub eps: f64,
    training: bool,
}

impl BatchNorm2d {
    /// A new layer (momentum 0.1, eps 1e-5), in training mode.
    pub fn new(channels: usize, init: &mut Init) -> Result<BatchNorm2d> {
        Ok(BatchNorm2d {
            weight: init::constant(&[channels], 1.0, init)?,
            bias: init::constant(&[channels], 0.0, init)?,
            running_mean: Tensor::zeros([channels], init.dtype, init.device)?,
            running_var: Tensor::ones([channels], init.dtype, init.device)?,
            num_batches_tracked: Tensor::zeros([0usize; 0], DType::I64, init.device)?,
            momentum: 0.1,
            eps: 1e-5,
            training: true,
        })
    }
}

impl Module for BatchNorm2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let out = f::batch_norm(
            x,
            &f::BatchNormOptions::new()
                .running_mean(&self.running_mean)
                .running_var(&self.running_var)
                .weight(&self.weight)
                .bias(&self.bias)
                .training(self.training)
                .momentum(self.momentum)
                .eps(self.eps),
        )?;
        if self.training {
            let _g = crate::autograd::no_grad();
            if let (Some(m), Some(v)) = (&out.running_mean, &out.running_var) {
                self.running_mean.copy_(m)?;
                self.running_var.copy_(v)?;
            }
            self.num_batches_tracked
                .copy_(&self.num_batches_tracked.add(1)?)?;
        }
        Ok(out.output)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        own_tensors([("weight", Some(&self.weight)), ("bias", Some(&self.bias))])
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        own_tensors([
            ("running_mean", Some(&self.running_mean)),
            ("running_var", Some(&self.running_var)),
            ("num_batches_tracked", Some(&self.num_batches_tracked)),
        ])
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// Zeroes elements with probability `p` in training mode and scales the rest by `1/(1-p)`;
/// the identity in evaluation mode. Seeded: the same seed gives the same masks.
pub struct Dropout {
    /// Drop probability.
    pub p: f64,
    generator: Mutex<Generator>,
    training: bool,
}

impl Dropout {
    /// A new layer with its own generator seeded with `seed`.
    pub fn new(p: f64, seed: u64) -> Dropout {
        Dropout {
            p,
            generator: Mutex::new(Generator::new(seed)),
            training: true,
        }
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut g = self.generator.lock().unwrap_or_else(|e| e.into_inner());
        f::dropout(x, self.p, self.training, &mut g)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// 2-D max pooling as a module.
pub struct MaxPool2d {
    /// Kernel, stride, padding, dilation and ceil mode.
    pub options: MaxPoolOptions,
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d(&self.options)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// Flattens dims `start..=end` (PyTorch's `nn.Flatten`, default `1..=-1`).
pub struct Flatten {
    /// First dim merged.
    pub start: i64,
    /// Last dim merged.
    pub end: i64,
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten { start: 1, end: -1 }
    }
}

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.flatten(self.start, self.end)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// Multi-head self-attention with grouped-query heads (the Llama layout): `q_proj`, `k_proj`,
/// `v_proj` and `o_proj` linear maps; `num_kv_heads` must divide `num_heads`.
pub struct MultiheadAttention {
    /// Query projection [heads * head_dim, embed].
    pub q_proj: Linear,
    /// Key projection [kv_heads * head_dim, embed].
    pub k_proj: Linear,
    /// Value projection [kv_heads * head_dim, embed].
    pub v_proj: Linear,
    /// Output projection [embed, heads * head_dim].
    pub o_proj: Linear,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Causal masking in `forward`.
    pub causal: bool,
}

impl MultiheadAttention {
    /// A new layer over `embed` features.
    pub fn new(
        embed: usize,
        num_heads: usize,
        num_kv_heads: usize,
        bias: bool,
        causal: bool,
        init: &mut Init,
    ) -> Result<MultiheadAttention> {
        if num_heads == 0
            || num_kv_heads == 0
            || !embed.is_multiple_of(num_heads)
            || !num_heads.is_multiple_of(num_kv_heads)
        {
            return Err(Error::invalid_argument(
                "MultiheadAttention",
                format!(
                    "expected heads dividing embed and kv heads dividing heads, got embed {embed}, heads {num_heads}, kv heads {num_kv_heads}"
                ),
            ));
        }
        let hd = embed / num_heads;
        Ok(MultiheadAttention {
            q_proj: Linear::new(embed, num_heads * hd, bias, init)?,
            k_proj: Linear::new(embed, num_kv_heads * hd, bias, init)?,
            v_proj: Linear::new(embed, num_kv_heads * hd, bias, init)?,
            o_proj: Linear::new(num_heads * hd, embed, bias, init)?,
            num_heads,
            num_kv_heads,
            causal,
        })
    }

    /// Attention of `q` over `k`/`v` (all [batch, seq, embed]) with an optional mask
    /// (broadcast to [batch, heads, q_len, k_len]; bool: true keeps).
    pub fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let split = |t: Tensor, heads: usize| -> Result<Tensor> {
            let (b, s) = (t.size(0)?, t.size(1)?);
            t.reshape([b as i64, s as i64, heads as i64, -1])?
                .transpose(1, 2)
        };
        let qh = split(self.q_proj.forward(q)?, self.num_heads)?;
        let kh = split(self.k_proj.forward(k)?, self.num_kv_heads)?;
        let vh = split(self.v_proj.forward(v)?, self.num_kv_heads)?;
        let gqa = self.num_kv_heads != self.num_heads;
        let causal = self.causal && mask.is_none();
        let o = f::scaled_dot_product_attention_with(
            &qh,
            &kh,
            &vh,
            &f::AttentionOptions::new()
                .attn_mask(mask)
                .is_causal(causal)
                .enable_gqa(gqa),
        )?;
        let (b, s) = (o.size(0)?, o.size(2)?);
        let o = o.transpose(1, 2)?.reshape([b as i64, s as i64, -1])?;
        self.o_proj.forward(&o)
    }
}

impl Module for MultiheadAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, x, x, None)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let projections = [
            ("q_proj", &self.q_proj),
            ("k_proj", &self.k_proj),
            ("v_proj", &self.v_proj),
            ("o_proj", &self.o_proj),
        ];
        children_named(projections, Linear::named_parameters)
    }
}

/// A multilayer perceptron: linear layers with an activation between them (none after the
/// last), parameters named `layers.<i>.weight`.
pub struct Mlp {
    /// The linear layers.
    pub layers: Vec<Linear>,
    /// The activation.
    pub activation: super::Activation,
}

impl Mlp {
    /// Layers of sizes `dims[0] -> dims[1] -> ... -> dims[n]`.
    pub fn new(dims: &[usize], activation: super::Activation, init: &mut Init) -> Result<Mlp> {
        if dims.len() < 2 {
            return Err(Error::invalid_argument(
                "Mlp",
                format!("expected at least two sizes, got {dims:?}"),
            ));
        }
        let layers = dims
            .windows(2)
            .map(|w| Linear::new(w[0], w[1], true, init))
            .collect::<Result<Vec<_>>>()?;
        Ok(Mlp { layers, activation })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = self.activation.forward(&h)?;
            }
        }
        Ok(h)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let layers = self.layers.iter().enumerate();
        children_named(
            layers.map(|(i, l)| (format!("layers.{i}"), l)),
            Linear::named_parameters,
        )
    }
}

/// PyTorch's default initialisation of a layer's weight (`[out, ...]`, Kaiming-uniform over
/// `fan_in`) and, when `bias`, its bias (uniform within `1 / sqrt(fan_in)`).
fn weight_and_bias(
    weight_shape: &[usize],
    fan_in: usize,
    bias: bool,
    init: &mut Init,
) -> Result<(Tensor, Option<Tensor>)> {
    let weight = init::kaiming_uniform_default(weight_shape, fan_in, init)?;
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    let bias = if bias {
        Some(init::uniform(&weight_shape[..1], bound, init)?)
    } else {
        None
    };
    Ok((weight, bias))
}
