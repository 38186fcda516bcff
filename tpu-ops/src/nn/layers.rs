//! The layers.

use tpu_tensor::{Result, Tensor};

use super::{Module, prefixed};
use crate::tensor_ext::TensorOps;

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
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| prefixed(&i.to_string(), l.named_parameters()))
            .collect()
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| prefixed(&i.to_string(), l.named_buffers()))
            .collect()
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
