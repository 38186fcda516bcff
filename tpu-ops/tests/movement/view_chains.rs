//! Gradients through random chains of views and ops.
//!
//! Each case draws a chain of steps (expand, transpose, permute, flatten, reshape, narrow,
//! slice, select, unsqueeze, squeeze, split, as_strided, copies and elementwise ops) from one
//! seed and checks its gradient three ways:
//! - against central finite differences (f64, native CPU);
//! - against the same chain with every view taken of a fresh dense copy, which autograd
//!   differentiates without any view: a layout-dependent backward shows up as a difference;
//! - on the PJRT CPU plugin against the native CPU.
//!
//! The case count follows `PROPTEST_CASES` (the CI budget is the default below).

use proptest::prelude::*;
use tpu_ops::autograd::grad_of;
use tpu_ops::prelude::*;
use tpu_ops::testing::{SplitMix, assert_close, devices, gradcheck, pjrt_device, proptest_cases};
use tpu_tensor::{DType, Device, Result, Tensor};

/// Values in [-1, 1] on a grid of 1/1000.
fn value(rng: &mut SplitMix) -> f64 {
    rng.range(0, 2000) as f64 / 1000.0 - 1.0
}

/// One step of a chain, with every parameter resolved.
#[derive(Clone, Debug)]
enum Step {
    Transpose(usize, usize),
    Permute(Vec<usize>),
    Unsqueeze(usize),
    Expand(Vec<i64>),
    Flatten(usize, usize),
    Reshape(Vec<usize>),
    Narrow(usize, i64, usize),
    Slice(usize, i64, usize),
    Select(usize, i64),
    Squeeze,
    SplitPiece(usize, usize, usize),
    /// Overlapping windows of a dense tensor: `[count, width]` with strides `[step, 1]`.
    Windows(usize, usize, usize),
    Copy,
    /// Multiply by fixed values of the current shape.
    Mul(Vec<f64>),
    Square,
    Sin,
}

/// A step that fits a tensor of `shape`, keeping sizes small.
fn draw(rng: &mut SplitMix, shape: &[usize]) -> Step {
    let rank = shape.len();
    let numel: usize = shape.iter().product();
    loop {
        let step = match rng.range(0, 15) {
            0 if rank >= 2 => {
                let a = rng.range(0, rank - 1);
                Step::Transpose(a, rng.range(0, rank - 1))
            }
            1 if rank >= 1 => {
                let mut p: Vec<usize> = (0..rank).collect();
                for i in (1..rank).rev() {
                    p.swap(i, rng.range(0, i));
                }
                Step::Permute(p)
            }
            2 if rank < 5 => Step::Unsqueeze(rng.range(0, rank)),
            3 => {
                let ones = shape.iter().filter(|&&s| s == 1).count();
                let lead = if rank < 4 && rng.coin() { 1 } else { 0 };
                if ones == 0 && lead == 0 {
                    continue;
                }
                let mut want: Vec<i64> = Vec::new();
                let mut grow = 1;
                if lead == 1 {
                    let n = rng.range(1, 3);
                    grow *= n;
                    want.push(n as i64);
                }
                for &s in shape {
                    if s == 1 && rng.coin() {
                        let n = rng.range(1, 3);
                        grow *= n;
                        want.push(n as i64);
                    } else if rng.coin() {
                        want.push(-1);
                    } else {
                        want.push(s as i64);
                    }
                }
                if numel * grow > 96 {
                    continue;
                }
                Step::Expand(want)
            }
            4 if rank >= 1 => {
                let s = rng.range(0, rank - 1);
                Step::Flatten(s, rng.range(s, rank - 1))
            }
            5 => {
                // Two factors of the element count, in a random order.
                let divisors: Vec<usize> = (1..=numel.max(1))
                    .filter(|d| numel.max(1).is_multiple_of(*d))
                    .collect();
                let a = divisors[rng.range(0, divisors.len() - 1)];
                if numel == 0 {
                    Step::Reshape(vec![0, a])
                } else if rng.coin() {
                    Step::Reshape(vec![a, numel / a])
                } else {
                    Step::Reshape(vec![numel])
                }
            }
            6 if rank >= 1 => {
                let d = rng.range(0, rank - 1);
                let len = rng.range(0, shape[d]);
                let start = rng.range(0, shape[d] - len) as i64;
                Step::Narrow(d, start, len)
            }
            7 if rank >= 1 => {
                let d = rng.range(0, rank - 1);
                let start =
                    rng.range(0, shape[d]) as i64 - if rng.coin() { shape[d] as i64 } else { 0 };
                Step::Slice(d, start, rng.range(1, 3))
            }
            8 if rank >= 1 => {
                let d = rng.range(0, rank - 1);
                if shape[d] == 0 {
                    continue;
                }
                let i = rng.range(0, shape[d] - 1) as i64;
                Step::Select(d, if rng.coin() { i - shape[d] as i64 } else { i })
            }
            9 => Step::Squeeze,
            10 if rank >= 1 => {
                let d = rng.range(0, rank - 1);
                if shape[d] == 0 {
                    continue;
                }
                let size = rng.range(1, shape[d]);
                let pieces = shape[d].div_ceil(size);
                Step::SplitPiece(d, size, rng.range(0, pieces - 1))
            }
            11 if numel >= 1 => {
                let width = rng.range(1, numel.min(4));
                let step = rng.range(1, 2);
                let count = (numel - width) / step + 1;
                Step::Windows(rng.range(1, count.min(6)), width, step)
            }
            12 => Step::Copy,
            13 => Step::Mul((0..numel).map(|_| value(rng)).collect()),
            14 => Step::Square,
            15 => Step::Sin,
            _ => continue,
        };
        return step;
    }
}

/// Applies `step`; with `dense`, view steps are taken of a fresh dense copy instead.
fn apply(step: &Step, t: &Tensor, dense: bool) -> Result<Tensor> {
    let is_view = !matches!(step, Step::Copy | Step::Mul(_) | Step::Square | Step::Sin);
    let t = if dense && is_view {
        t.copy()?
    } else {
        t.clone()
    };
    match step {
        Step::Transpose(a, b) => t.transpose(*a, *b),
        Step::Permute(p) => t.permute(p.as_slice()),
        Step::Unsqueeze(d) => t.unsqueeze(*d),
        Step::Expand(w) => t.expand(w.as_slice()),
        Step::Flatten(s, e) => t.flatten(*s, *e),
        Step::Reshape(s) => t.reshape(s.as_slice()),
        Step::Narrow(d, s, l) => t.narrow(*d, *s, *l),
        Step::Slice(d, s, st) => t.slice(*d, *s.., *st),
        Step::Select(d, i) => t.select(*d, *i),
        Step::Squeeze => Ok(t.squeeze()),
        Step::SplitPiece(d, size, k) => Ok(t.split(*size, *d)?.remove(*k)),
        Step::Windows(count, width, step) => {
            let t = t.contiguous()?;
            t.as_strided(&[*count, *width], &[*step, 1], t.offset())
        }
        Step::Copy => t.copy(),
        Step::Mul(v) => {
            let m =
                Tensor::from_vec(v.clone(), t.shape(), &Device::cpu())?.to_device(t.device())?;
            t.mul(&m)
        }
        Step::Square => t.mul(&t),
        Step::Sin => t.sin(),
    }
}

fn run_chain(steps: &[Step], x: &Tensor, dense: bool) -> Result<Tensor> {
    let mut t = x.clone();
    for s in steps {
        t = apply(s, &t, dense)?;
    }
    Ok(t)
}

/// A chain of `len` steps from a random start shape, and that start's values.
fn draw_chain(seed: u64, len: usize) -> (Vec<usize>, Vec<f64>, Vec<Step>) {
    let mut rng = SplitMix(seed);
    let rank = rng.range(0, 3);
    let shape: Vec<usize> = (0..rank)
        .map(|_| {
            if rng.range(0, 3) == 0 {
                1
            } else {
                rng.range(1, 4)
            }
        })
        .collect();
    let numel: usize = shape.iter().product();
    let values: Vec<f64> = (0..numel).map(|_| value(&mut rng)).collect();
    // Shapes come from running the chain on data-free metadata: an f64 tensor of the start.
    let mut t = Tensor::from_vec(values.clone(), &shape[..], &Device::cpu()).unwrap();
    let mut steps = Vec::new();
    while steps.len() < len {
        let s = draw(&mut rng, t.shape());
        match apply(&s, &t, false) {
            Ok(next) => {
                t = next;
                steps.push(s);
            }
            // A draw that does not fit (transposing a dim with itself is fine; this is rare)
            // is drawn again.
            Err(_) => continue,
        }
    }
    (shape, values, steps)
}

fn gradient(steps: &[Step], x: &Tensor, w: &Tensor, dense: bool) -> Result<(Tensor, Tensor)> {
    let leaf = x.detach().copy()?.requires_grad_(true)?;
    let out = run_chain(steps, &leaf, dense)?;
    let loss = out.mul(&w.to_device(out.device())?)?.sum_all()?;
    let g = grad_of(&[&loss], &[&leaf], None, false)?.remove(0);
    let g = match g {
        Some(g) => g,
        None => leaf.zeros_like()?,
    };
    Ok((out.detach(), g))
}

fn weights(out_shape: &[usize], seed: u64) -> Result<Tensor> {
    tpu_tensor::Generator::new(seed).randn(out_shape, DType::F64, &Device::cpu())
}

fn check_chain(seed: u64, len: usize) -> Result<()> {
    let (shape, values, steps) = draw_chain(seed, len);
    let what = format!("chain {steps:?} from shape {shape:?}");
    let cpu = Device::cpu();
    let x = Tensor::from_vec(values, &shape[..], &cpu)?;
    let out_shape = run_chain(&steps, &x, false)?.shape().to_vec();
    let w = weights(&out_shape, seed ^ 7)?;
    let (out_v, g_v) = gradient(&steps, &x, &w, false)?;
    let (out_d, g_d) = gradient(&steps, &x, &w, true)?;
    assert_close(
        &format!("forward, views vs dense: {what}"),
        &out_v,
        &out_d,
        0.0,
    )?;
    assert_close(
        &format!("gradient, views vs dense: {what}"),
        &g_v,
        &g_d,
        1e-12,
    )?;
    gradcheck(
        &what,
        |xs| run_chain(&steps, &xs[0], false),
        &[x],
        1e-6,
        1e-6,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(proptest_cases(256)))]

    /// Views and ops chained at random: the gradient matches finite differences and the same
    /// chain over dense copies.
    #[test]
    fn view_chains_match_finite_differences_and_dense_copies(seed in any::<u64>(), len in 1usize..7) {
        check_chain(seed, len).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(proptest_cases(24)))]

    /// The same chains on the PJRT CPU plugin give the native CPU's values and gradients.
    #[test]
    fn view_chains_agree_on_pjrt(seed in any::<u64>(), len in 1usize..6) {
        let Some(pjrt) = pjrt_device("view_chains_agree_on_pjrt") else { return Ok(()) };
        let run = || -> Result<()> {
            let (shape, values, steps) = draw_chain(seed, len);
            let what = format!("chain {steps:?} from shape {shape:?}");
            let x = Tensor::from_vec(values, &shape[..], &Device::cpu())?;
            let out_shape = run_chain(&steps, &x, false)?.shape().to_vec();
            let w = weights(&out_shape, seed ^ 7)?;
            let (out_c, g_c) = gradient(&steps, &x, &w, false)?;
            let (out_p, g_p) = gradient(&steps, &x.to_device(&pjrt)?, &w, false)?;
            assert_close(&format!("forward on pjrt: {what}"), &out_p, &out_c, 1e-12)?;
            assert_close(&format!("gradient on pjrt: {what}"), &g_p, &g_c, 1e-12)
        };
        run().map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

// ---- the reproducers, with PyTorch's values ------------------------------------------------

/// x = torch.tensor([1.0], requires_grad=True)
/// x.expand(2, 2).flatten(1, 1).sum().backward(); x.grad  -> tensor([4.])
/// x = torch.ones(2, 1, requires_grad=True)
/// x.expand(2, 3).t().sum().backward(); x.grad  -> tensor([[3.], [3.]])
#[test]
fn views_of_expanded_tensors_have_pytorchs_gradients() -> Result<()> {
    for d in &devices("view_chain_grad") {
        let x = Tensor::from_vec(vec![1f32], [1], d)?.requires_grad_(true)?;
        x.expand([2, 2])?.flatten(1, 1)?.sum_all()?.backward()?;
        assert_eq!(x.grad().unwrap().to_vec::<f32>()?, [4.0], "{d}");

        let x = Tensor::ones([2, 1], DType::F32, d)?.requires_grad_(true)?;
        x.expand([2, 3])?.t()?.sum_all()?.backward()?;
        assert_eq!(x.grad().unwrap().to_vec::<f32>()?, [3.0, 3.0], "{d}");
    }
    Ok(())
}

/// as_strided addresses storage, so over an expanded base the sum at a storage position is
/// shared among the elements that read it (PyTorch's as_strided backward):
/// x = torch.tensor([2.0], requires_grad=True)
/// e = x.expand(3); v = e.as_strided((2,), (0,)); (v * torch.tensor([1., 10.])).sum().backward()
/// x.grad  -> tensor([11.])
#[test]
fn as_strided_over_an_expanded_base_shares_the_storage_gradient() -> Result<()> {
    for d in &devices("view_chain_grad") {
        let x = Tensor::from_vec(vec![2f32], [1], d)?.requires_grad_(true)?;
        let v = x.expand([3])?.as_strided(&[2], &[0], 0)?;
        let w = Tensor::from_vec(vec![1f32, 10.0], [2], d)?;
        v.mul(&w)?.sum_all()?.backward()?;
        assert_eq!(x.grad().unwrap().to_vec::<f32>()?, [11.0], "{d}");
    }
    Ok(())
}
