//! Neural-network building blocks: the `Module` trait with PyTorch-style nested parameter
//! names, state dicts in safetensors, train/eval mode, PyTorch's default initialisations, and
//! the layers.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use tpu_tensor::tpu_runtime::error::check_shape;
use tpu_tensor::{DType, Device, Error, Result, Tensor, load_safetensors, save_safetensors};

use crate::autograd::{AutogradOps, no_grad};
use crate::ops::elementwise::methods::TensorOps;

pub mod layers;

pub use layers::*;

/// A layer or a model: a forward function plus named parameters and buffers.
pub trait Module: Send + Sync {
    /// Runs the module.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Trainable parameters with their names (`weight`, `layers.0.bias`, ...).
    fn named_parameters(&self) -> Vec<(String, Tensor)>;

    /// Non-trainable state saved with the parameters (running statistics).
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// Switches between training (`true`) and evaluation mode.
    fn set_training(&mut self, training: bool) {
        let _ = training;
    }

    /// The parameters, without names (for optimizers).
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    /// Parameters and buffers by name, as PyTorch's `state_dict`.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut all = self.named_parameters();
        all.extend(self.named_buffers());
        all
    }

    /// Total number of parameter elements.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|t| t.numel()).sum()
    }
}

/// Prefixes child names: `prefixed("encoder", [("weight", t)])` gives `encoder.weight`.
pub fn prefixed(prefix: &str, named: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    named
        .into_iter()
        .map(|(n, t)| (format!("{prefix}.{n}"), t))
        .collect()
}

/// The named tensors of child modules, each name prefixed with its child's name (see
/// [`prefixed`]); `named` picks which tensors (`Module::named_parameters` or
/// `Module::named_buffers`).
pub fn children_named<'a, M: ?Sized + 'a, P: AsRef<str>>(
    children: impl IntoIterator<Item = (P, &'a M)>,
    named: impl Fn(&M) -> Vec<(String, Tensor)>,
) -> Vec<(String, Tensor)> {
    children
        .into_iter()
        .flat_map(|(p, c)| prefixed(p.as_ref(), named(c)))
        .collect()
}

/// `(name, tensor)` pairs for a layer's own tensors in order, skipping absent ones (a bias the
/// layer was built without).
pub fn own_tensors<const N: usize>(tensors: [(&str, Option<&Tensor>); N]) -> Vec<(String, Tensor)> {
    tensors
        .into_iter()
        .filter_map(|(n, t)| t.map(|t| (n.to_string(), t.clone())))
        .collect()
}

/// Saves a module's state dict to a safetensors file.
pub fn save(module: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    let sd = module.state_dict();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    save_safetensors(sd.iter().map(|(n, t)| (n.as_str(), t)), path, Some(meta))
}

/// Copies named tensors into a module's parameters and buffers (in place, so optimizers keep
/// working). With `strict`, every entry of the module must be present and nothing extra may
/// be; shapes must always match. Errors name the tensor.
pub fn load_state_dict(
    module: &dyn Module,
    state: &BTreeMap<String, Tensor>,
    strict: bool,
) -> Result<()> {
    let _g = no_grad();
    let own = module.state_dict();
    for (name, t) in &own {
        match state.get(name) {
            None if strict => {
                return Err(Error::invalid_argument(
                    "load_state_dict",
                    format!("missing tensor {name:?} (expected shape {:?})", t.shape()),
                ));
            }
            None => {}
            Some(src) => {
                check_shape(
                    "load_state_dict",
                    format_args!("{name} in the state dict"),
                    t.shape(),
                    src.shape(),
                )?;
                t.copy_(src)?;
            }
        }
    }
    if strict {
        let known: std::collections::HashSet<&str> = own.iter().map(|(n, _)| n.as_str()).collect();
        if let Some(extra) = state.keys().find(|k| !known.contains(k.as_str())) {
            return Err(Error::invalid_argument(
                "load_state_dict",
                format!("unexpected tensor {extra:?}: the module has no such parameter or buffer"),
            ));
        }
    }
    Ok(())
}

/// Loads a safetensors file into a module (see [`load_state_dict`]).
pub fn load(module: &dyn Module, path: impl AsRef<Path>, strict: bool) -> Result<()> {
    let state = load_safetensors(path, &Device::cpu())?;
    load_state_dict(module, &state, strict)
}

/// Modules applied one after another; parameters are named by position (`0.weight`).
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// An empty sequence.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends a module.
    pub fn push(mut self, m: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(m));
        self
    }

    /// Number of modules.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True when there is no module.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The modules with their names (their positions).
    fn children(&self) -> impl Iterator<Item = (String, &dyn Module)> {
        self.layers
            .iter()
            .enumerate()
            .map(|(i, l)| (i.to_string(), l.as_ref()))
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for l in &self.layers {
            h = l.forward(&h)?;
        }
        Ok(h)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        children_named(self.children(), |l| l.named_parameters())
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        children_named(self.children(), |l| l.named_buffers())
    }

    fn set_training(&mut self, training: bool) {
        for l in &mut self.layers {
            l.set_training(training);
        }
    }
}

/// An activation function as a module.
#[derive(Clone, Copy, Debug)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// GELU (erf form).
    Gelu,
    /// GELU (tanh approximation).
    GeluTanh,
    /// `x * sigmoid(x)`.
    Silu,
    /// Hyperbolic tangent.
    Tanh,
    /// Logistic sigmoid.
    Sigmoid,
}

impl Module for Activation {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(),
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Silu => x.silu(),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => x.sigmoid(),
        }
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// Parameter initialisations with PyTorch's defaults, seeded.
pub mod init {
    use super::*;

    /// A parameter filled with `U(-bound, bound)`.
    pub fn uniform(shape: &[usize], bound: f64, init: &mut Init) -> Result<Tensor> {
        let u = init.generator.rand(shape, DType::F64, &Device::cpu())?;
        parameter(u.mul(2.0 * bound)?.sub(bound)?, init)
    }

    /// A parameter filled with `N(mean, std^2)`.
    pub fn normal(shape: &[usize], mean: f64, std: f64, init: &mut Init) -> Result<Tensor> {
        let n = init.generator.randn(shape, DType::F64, &Device::cpu())?;
        parameter(n.mul(std)?.add(mean)?, init)
    }

    // Draws are made and scaled in f64 on the CPU, so a seed gives the same values for every
    // dtype and device; only the finished values are cast and moved.
    fn parameter(values: Tensor, init: &Init) -> Result<Tensor> {
        values
            .to(init.dtype)?
            .to_device(init.device)?
            .requires_grad_(true)
    }

    /// A parameter filled with a constant.
    pub fn constant(shape: &[usize], value: f64, init: &Init) -> Result<Tensor> {
        Tensor::full(shape, value, init.dtype, init.device)?.requires_grad_(true)
    }

    /// PyTorch's `kaiming_uniform_(a = sqrt(5))`, the default of Linear and Conv weights:
    /// `U(-1/sqrt(fan_in), 1/sqrt(fan_in))`.
    pub fn kaiming_uniform_default(
        shape: &[usize],
        fan_in: usize,
        init: &mut Init,
    ) -> Result<Tensor> {
        // gain = sqrt(2 / (1 + a^2)) with a = sqrt(5); bound = gain * sqrt(3 / fan_in).
        let bound = (2.0f64 / 6.0).sqrt() * (3.0 / fan_in.max(1) as f64).sqrt();
        uniform(shape, bound, init)
    }
}

#[cfg(test)]
mod tests {
    use tpu_tensor::Generator;

    use super::*;

    #[test]
    fn kaiming_bound_is_one_over_sqrt_fan_in() {
        let mut g = Generator::new(0);
        let dev = Device::cpu();
        let w =
            init::kaiming_uniform_default(&[64, 100], 100, &mut Init::new(&dev, &mut g)).unwrap();
        let v = w.to_vec::<f32>().unwrap();
        assert!(v.iter().all(|x| x.abs() <= 0.1 + 1e-6));
        assert!(v.iter().any(|x| x.abs() > 0.09));
        assert!(w.requires_grad());
    }
}
