//! Optimizers and learning-rate schedules.
//!
//! Each optimizer follows PyTorch's update rule step for step (same order of operations, so
//! results agree to rounding). Steps run under `no_grad` and write the new values into the
//! parameters in place (`copy_`), so every handle to a parameter sees them and no graph is
//! built. Optimizer state is saved and loaded through safetensors so training can resume.
//!
//! What changes from step to step lives in tensors on the parameters' devices, as PyTorch's
//! "capturable" optimizers keep it: the learning rate (written in place by
//! [`Optimizer::set_lr`]) and Adam's step count (incremented in place by each step, with the
//! bias corrections computed from it on the device). A step compiled into a graph therefore
//! reads the current learning rate and count on every call instead of baking in the values it
//! saw when it was traced, and a schedule never causes a recompile.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use tpu_tensor::tpu_runtime::error::check_shape;
use tpu_tensor::{DType, Device, Error, Result, Tensor, load_safetensors, save_safetensors};

use crate::autograd::{AutogradOps, no_grad};
use crate::ops::elementwise::methods::TensorOps;

/// What every optimizer offers.
pub trait Optimizer {
    /// Applies one update to every parameter that has a gradient.
    fn step(&mut self) -> Result<()>;
    /// Clears the parameters' gradients.
    fn zero_grad(&self);
    /// The learning rate.
    fn lr(&self) -> f64;
    /// Changes the learning rate (schedules call this): the new value is written into the
    /// learning-rate tensors that steps, compiled ones included, read.
    fn set_lr(&mut self, lr: f64) -> Result<()>;
    /// The optimizer's state as named tensors (moment buffers, step counts).
    fn state(&self) -> Result<Vec<(String, Tensor)>>;
    /// Restores state saved by [`Optimizer::state`]; names and shapes must match.
    fn load_state(&mut self, state: &BTreeMap<String, Tensor>) -> Result<()>;

    /// Saves the state to a safetensors file.
    fn save(&self, path: impl AsRef<Path>) -> Result<()>
    where
        Self: Sized,
    {
        let state = self.state()?;
        let meta = HashMap::from([("lr".to_string(), self.lr().to_string())]);
        save_safetensors(state.iter().map(|(n, t)| (n.as_str(), t)), path, Some(meta))
    }

    /// Loads state saved by [`Optimizer::save`].
    fn load(&mut self, path: impl AsRef<Path>, device: &Device) -> Result<()>
    where
        Self: Sized,
    {
        let state = load_safetensors(path, device)?;
        self.load_state(&state)
    }
}

/// Writes the [`Optimizer`] methods that only read or set an optimizer's `params` and `lr`
/// fields, which every optimizer here has.
macro_rules! params_and_lr {
    () => {
        fn zero_grad(&self) {
            zero_grads(&self.params);
        }

        fn lr(&self) -> f64 {
            self.lr.value
        }

        fn set_lr(&mut self, lr: f64) -> Result<()> {
            self.lr.set(lr)
        }
    };
}

/// A hyperparameter that may change between steps, with one 0-d tensor per parameter (made on
/// the parameter's device at its first step) holding its current value.
struct Hyper {
    value: f64,
    tensors: Vec<Option<Tensor>>,
}

impl Hyper {
    fn new(value: f64, params: usize) -> Hyper {
        Hyper {
            value,
            tensors: vec![None; params],
        }
    }

    /// The tensor for parameter `i`, which lives like `p`.
    fn get(&mut self, i: usize, p: &Tensor) -> Result<Tensor> {
        if let Some(t) = &self.tensors[i] {
            return Ok(t.clone());
        }
        let t = Tensor::full([0usize; 0], self.value, scalar_dtype(p), p.device())?;
        self.tensors[i] = Some(t.clone());
        Ok(t)
    }

    fn set(&mut self, value: f64) -> Result<()> {
        self.value = value;
        for t in self.tensors.iter().flatten() {
            t.fill_(value)?;
        }
        Ok(())
    }
}

/// The dtype of the scalars an update of `p` uses: f64 for f64 parameters, f32 otherwise (a
/// 0-d tensor does not change the dtype of the tensors it meets, as in PyTorch).
fn scalar_dtype(p: &Tensor) -> DType {
    if p.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

fn zero_grads(params: &[Tensor]) {
    for p in params {
        p.zero_grad();
    }
}

fn take_state(state: &BTreeMap<String, Tensor>, name: &str, like: &Tensor) -> Result<Tensor> {
    let t = state.get(name).ok_or_else(|| {
        Error::invalid_argument(
            "load_state",
            format!("the saved state has no tensor named {name:?}"),
        )
    })?;
    check_shape(
        "load_state",
        format_args!("{name} in the saved state"),
        like.shape(),
        t.shape(),
    )?;
    t.to_device(like.device())?.to(like.dtype())
}

fn step_of(state: &BTreeMap<String, Tensor>, name: &str) -> Result<u64> {
    let t = state.get(name).ok_or_else(|| {
        Error::invalid_argument(
            "load_state",
            format!("the saved state has no tensor named {name:?}"),
        )
    })?;
    Ok(t.to_dtype(DType::I64)?.to_scalar::<i64>()?.max(0) as u64)
}

/// Stochastic gradient descent with momentum, dampening, Nesterov and weight decay (PyTorch's
/// `torch.optim.SGD`).
pub struct Sgd {
    params: Vec<Tensor>,
    lr: Hyper,
    /// Momentum factor (0 disables momentum).
    pub momentum: f64,
    /// Dampening of the momentum.
    pub dampening: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Momentum buffers (zeros until the first step writes them) and, per buffer, a 0-d bool
    /// that says whether a step has written it: the first step takes the gradient itself, as
    /// PyTorch's does, and the same program serves every step.
    buffers: Vec<Option<(Tensor, Tensor)>>,
}

impl Sgd {
    /// SGD over `params` with learning rate `lr` and no momentum.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Sgd {
        let n = params.len();
        Sgd {
            params,
            lr: Hyper::new(lr, n),
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            buffers: vec![None; n],
        }
    }

    /// Sets momentum (and Nesterov), checking PyTorch's constraints.
    pub fn with_momentum(mut self, momentum: f64, dampening: f64, nesterov: bool) -> Result<Sgd> {
        if nesterov && (momentum <= 0.0 || dampening != 0.0) {
            return Err(Error::invalid_argument(
                "Sgd",
                format!(
                    "Nesterov momentum needs momentum > 0 and dampening 0, got {momentum} and {dampening}"
                ),
            ));
        }
        self.momentum = momentum;
        self.dampening = dampening;
        self.nesterov = nesterov;
        Ok(self)
    }

    /// Sets the weight decay.
    pub fn with_weight_decay(mut self, wd: f64) -> Sgd {
        self.weight_decay = wd;
        self
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        let _g = no_grad();
        for (i, (p, buf)) in self.params.iter().zip(&mut self.buffers).enumerate() {
            let Some(mut g) = p.grad() else { continue };
            let pd = p.detach();
            if self.weight_decay != 0.0 {
                g = g.add(&pd.mul(self.weight_decay)?)?;
            }
            if self.momentum != 0.0 {
                let (b, started) = match buf {
                    Some(state) => state.clone(),
                    None => buf
                        .insert((
                            p.detach().zeros_like()?,
                            Tensor::full([0usize; 0], false, DType::Bool, p.device())?,
                        ))
                        .clone(),
                };
                let later = b.mul(self.momentum)?.add(&g.mul(1.0 - self.dampening)?)?;
                let next = crate::where_(&started, &later, &g)?;
                b.copy_(&next)?;
                started.fill_(true)?;
                g = if self.nesterov {
                    g.add(&next.mul(self.momentum)?)?
                } else {
                    next
                };
            }
            let lr = self.lr.get(i, p)?;
            p.copy_(&pd.sub(&g.mul(&lr)?)?)?;
        }
        Ok(())
    }

    params_and_lr!();

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        Ok(self
            .buffers
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                b.as_ref()
                    .map(|(b, _)| (format!("state.{i}.momentum_buffer"), b.clone()))
            })
            .collect())
    }

    fn load_state(&mut self, state: &BTreeMap<String, Tensor>) -> Result<()> {
        for (i, p) in self.params.iter().enumerate() {
            let name = format!("state.{i}.momentum_buffer");
            if !state.contains_key(&name) {
                self.buffers[i] = None;
                continue;
            }
            let value = take_state(state, &name, p)?;
            match &self.buffers[i] {
                // In place, so a compiled step that holds these tensors sees the new state.
                Some((b, started)) => {
                    b.copy_(&value)?;
                    started.fill_(true)?;
                }
                None => {
                    let started = Tensor::full([0usize; 0], true, DType::Bool, p.device())?;
                    self.buffers[i] = Some((value, started));
                }
            }
        }
        Ok(())
    }
}

/// Adam and AdamW (decoupled weight decay), as PyTorch's `torch.optim.Adam` / `AdamW`.
pub struct Adam {
    params: Vec<Tensor>,
    lr: Hyper,
    /// Coefficients of the running averages of the gradient and its square.
    pub betas: (f64, f64),
    /// Added to the denominator for numerical stability.
    pub eps: f64,
    /// Weight decay: an L2 term on the gradient for Adam, a decoupled decay for AdamW.
    pub weight_decay: f64,
    /// True for AdamW.
    pub decoupled: bool,
    /// Steps taken per parameter: 0-d tensors, as PyTorch keeps them.
    steps: Vec<Option<Tensor>>,
    exp_avg: Vec<Option<Tensor>>,
    exp_avg_sq: Vec<Option<Tensor>>,
}

impl Adam {
    /// Adam with PyTorch's defaults (betas 0.9/0.999, eps 1e-8, no weight decay).
    pub fn new(params: Vec<Tensor>, lr: f64) -> Adam {
        let n = params.len();
        Adam {
            params,
            lr: Hyper::new(lr, n),
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            steps: vec![None; n],
            exp_avg: vec![None; n],
            exp_avg_sq: vec![None; n],
        }
    }

    /// AdamW with PyTorch's defaults (weight decay 0.01).
    pub fn adamw(params: Vec<Tensor>, lr: f64) -> Adam {
        Adam {
            weight_decay: 0.01,
            decoupled: true,
            ..Adam::new(params, lr)
        }
    }

    /// Sets betas, eps and weight decay.
    pub fn with(mut self, betas: (f64, f64), eps: f64, weight_decay: f64) -> Adam {
        self.betas = betas;
        self.eps = eps;
        self.weight_decay = weight_decay;
        self
    }
}

impl Optimizer for Adam {
    fn step(&mut self) -> Result<()> {
        let _g = no_grad();
        let (b1, b2) = self.betas;
        for i in 0..self.params.len() {
            let p = &self.params[i];
            let Some(mut g) = p.grad() else { continue };
            let pd = p.detach();
            let lr = self.lr.get(i, p)?;
            let step = match &self.steps[i] {
                Some(t) => t.clone(),
                None => Tensor::zeros([0usize; 0], scalar_dtype(p), p.device())?,
            };
            step.copy_(&step.add(1.0)?)?;
            self.steps[i] = Some(step.clone());
            let mut base = pd.clone();
            if self.weight_decay != 0.0 {
                if self.decoupled {
                    base = pd.mul(&lr.mul(-self.weight_decay)?.add(1.0)?)?;
                } else {
                    g = g.add(&pd.mul(self.weight_decay)?)?;
                }
            }
            let m = state_slot(&mut self.exp_avg[i], p)?;
            let v = state_slot(&mut self.exp_avg_sq[i], p)?;
            m.copy_(&m.mul(b1)?.add(&g.mul(1.0 - b1)?)?)?;
            v.copy_(&v.mul(b2)?.add(&g.mul(&g)?.mul(1.0 - b2)?)?)?;
            // 1 - b^t as -expm1(t ln b): no cancellation when b^t is close to 1.
            let bc1 = step.mul(b1.ln())?.expm1()?.neg()?;
            let bc2 = step.mul(b2.ln())?.expm1()?.neg()?;
            let step_size = lr.div(&bc1)?;
            let denom = v.sqrt()?.div(&bc2.sqrt()?)?.add(self.eps)?;
            p.copy_(&base.sub(&m.div(&denom)?.mul(&step_size)?)?)?;
        }
        Ok(())
    }

    params_and_lr!();

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        for i in 0..self.params.len() {
            if let (Some(m), Some(v), Some(t)) =
                (&self.exp_avg[i], &self.exp_avg_sq[i], &self.steps[i])
            {
                out.push((format!("state.{i}.exp_avg"), m.clone()));
                out.push((format!("state.{i}.exp_avg_sq"), v.clone()));
                out.push((format!("state.{i}.step"), t.clone()));
            }
        }
        Ok(out)
    }

    fn load_state(&mut self, state: &BTreeMap<String, Tensor>) -> Result<()> {
        for i in 0..self.params.len() {
            let name = format!("state.{i}.exp_avg");
            let p = &self.params[i];
            if state.contains_key(&name) {
                let m = take_state(state, &name, p)?;
                let v = take_state(state, &format!("state.{i}.exp_avg_sq"), p)?;
                let step = step_of(state, &format!("state.{i}.step"))?;
                let step = Tensor::full([0usize; 0], step as f64, scalar_dtype(p), p.device())?;
                put_state(&mut self.exp_avg[i], m)?;
                put_state(&mut self.exp_avg_sq[i], v)?;
                put_state(&mut self.steps[i], step)?;
            } else {
                self.exp_avg[i] = None;
                self.exp_avg_sq[i] = None;
                self.steps[i] = None;
            }
        }
        Ok(())
    }
}

/// The state tensor in `slot`, made as zeros like `p` when there is none yet. State is updated
/// in place, so a compiled step that captured it keeps reading the current values.
fn state_slot(slot: &mut Option<Tensor>, p: &Tensor) -> Result<Tensor> {
    match slot {
        Some(t) => Ok(t.clone()),
        None => Ok(slot.insert(p.detach().zeros_like()?).clone()),
    }
}

/// Puts loaded state into `slot`: into the tensor already there (in place, for compiled steps
/// holding it), or as a new one.
fn put_state(slot: &mut Option<Tensor>, value: Tensor) -> Result<()> {
    match slot {
        Some(t) => t.copy_(&value),
        None => {
            *slot = Some(value);
            Ok(())
        }
    }
}

/// A learning-rate schedule: the learning rate for a step (0-based).
pub trait LrSchedule {
    /// The learning rate at `step`.
    fn lr_at(&self, step: u64) -> f64;

    /// Sets `optimizer`'s learning rate for `step`.
    fn apply(&self, optimizer: &mut dyn Optimizer, step: u64) -> Result<()> {
        optimizer.set_lr(self.lr_at(step))
    }
}

/// Linear warm-up from 0 to `base_lr` over `warmup` steps, then constant.
#[derive(Clone, Copy, Debug)]
pub struct LinearWarmup {
    /// The peak learning rate.
    pub base_lr: f64,
    /// Steps to reach it.
    pub warmup: u64,
}

impl LrSchedule for LinearWarmup {
    fn lr_at(&self, step: u64) -> f64 {
        if self.warmup == 0 || step >= self.warmup {
            self.base_lr
        } else {
            self.base_lr * (step + 1) as f64 / self.warmup as f64
        }
    }
}

/// Optional linear warm-up, then cosine decay from `base_lr` to `min_lr` over `total` steps.
#[derive(Clone, Copy, Debug)]
pub struct CosineDecay {
    /// The peak learning rate.
    pub base_lr: f64,
    /// The final learning rate.
    pub min_lr: f64,
    /// Warm-up steps (part of `total`).
    pub warmup: u64,
    /// Total steps.
    pub total: u64,
}

impl LrSchedule for CosineDecay {
    fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup {
            return LinearWarmup {
                base_lr: self.base_lr,
                warmup: self.warmup,
            }
            .lr_at(step);
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let progress = ((step - self.warmup) as f64 / span).min(1.0);
        self.min_lr
            + 0.5 * (self.base_lr - self.min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// Multiplies the learning rate by `gamma` every `step_size` steps (PyTorch's `StepLR`).
#[derive(Clone, Copy, Debug)]
pub struct StepDecay {
    /// The initial learning rate.
    pub base_lr: f64,
    /// Steps between decays.
    pub step_size: u64,
    /// The factor.
    pub gamma: f64,
}

impl LrSchedule for StepDecay {
    fn lr_at(&self, step: u64) -> f64 {
        self.base_lr * self.gamma.powi((step / self.step_size.max(1)) as i32)
    }
}

/// Scales the gradients of `params` so that their global norm (the `norm_type`-norm of all of
/// them together) is at most `max_norm`, as PyTorch's `clip_grad_norm_`; returns the norm
/// before clipping. Runs under `no_grad`, on the gradients' device.
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64, norm_type: f64) -> Result<f64> {
    use crate::ops::reduce::ReduceOps;
    let _g = no_grad();
    let grads: Vec<Tensor> = params.iter().filter_map(|p| p.grad()).collect();
    if grads.is_empty() {
        return Ok(0.0);
    }
    let per: Vec<Tensor> = grads
        .iter()
        .map(|g| g.to(DType::F32)?.norm(norm_type, &[], false))
        .collect::<Result<_>>()?;
    let stacked = crate::ops::movement::stack(&per.iter().collect::<Vec<_>>(), 0)?;
    let total = stacked.norm(norm_type, &[], false)?;
    let total_v = total
        .to_device(&Device::cpu())?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?;
    let coef = (max_norm / (total_v + 1e-6)).min(1.0);
    if coef < 1.0 {
        for p in params {
            if let Some(g) = p.grad() {
                crate::autograd::set_grad(p, Some(g.mul(coef)?))?;
            }
        }
    }
    Ok(total_v)
}
