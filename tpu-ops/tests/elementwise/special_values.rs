//! Random chains of ops on inputs full of special values (NaN, ±inf, ±0.0, huge and tiny
//! numbers) and zero-sized dims, run on the native CPU and on the PJRT CPU plugin: both must
//! give the same values, or both an error.
//!
//! The native CPU follows PyTorch (each family's tests hold PyTorch's values); this test finds
//! lowerings that treat the edges differently. The case count follows `PROPTEST_CASES`.

use proptest::prelude::*;
use tpu_ops::ops::movement::{MovementOps, cat};
use tpu_ops::prelude::*;
use tpu_ops::testing::{SplitMix, assert_close, pjrt_device, proptest_cases};
use tpu_tensor::{DType, Device, Result, Tensor};

/// The draws of a case, from one proptest seed.
struct Rng(SplitMix);

impl Rng {
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        self.0.range(lo, hi)
    }

    /// Mostly ordinary numbers, with every special value often enough to meet every op. The
    /// huge values overflow when squared but not when summed, and their reciprocals stay
    /// normal: PJRT devices flush subnormal numbers to zero (XLA does on CPUs and TPUs), and
    /// XLA divides by a broadcast value through its reciprocal, so a divisor beyond 2^126
    /// gives 0 (and inf / it NaN) there; the native CPU keeps subnormals, as PyTorch does.
    /// Sums that overflow depend on the order of the additions, which differs by design.
    fn value(&mut self) -> f32 {
        const SPECIAL: [f32; 12] = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            1.0e30,
            -1.0e30,
            1.0e-30,
            -2.5,
        ];
        if self.range(0, 2) == 0 {
            SPECIAL[self.range(0, SPECIAL.len() - 1)]
        } else {
            (self.range(0, 4000) as f32 - 2000.0) / 500.0
        }
    }

    fn shape(&mut self) -> Vec<usize> {
        let rank = self.range(0, 3);
        (0..rank)
            .map(|_| match self.range(0, 6) {
                0 => 0,
                1 => 1,
                _ => self.range(2, 5),
            })
            .collect()
    }
}

/// An op applied to the current tensor; binary ops take a second tensor drawn beside it.
#[derive(Clone, Copy, Debug)]
enum Op {
    Unary(usize),
    Binary(usize),
    Reduce(usize),
    Move(usize),
}

const UNARY: usize = 33;
const BINARY: usize = 17;
const REDUCE: usize = 22;
const MOVE: usize = 10;

fn unary(k: usize, x: &Tensor) -> Result<Tensor> {
    Ok(match k {
        0 => x.neg()?,
        1 => x.abs()?,
        2 => x.sign()?,
        3 => x.exp()?,
        4 => x.log()?,
        5 => x.log1p()?,
        6 => x.expm1()?,
        7 => x.sqrt()?,
        8 => x.rsqrt()?,
        9 => x.square()?,
        10 => x.reciprocal()?,
        11 => x.sin()?,
        12 => x.cos()?,
        13 => x.tanh()?,
        14 => x.sigmoid()?,
        15 => x.relu()?,
        16 => x.gelu()?,
        17 => x.gelu_tanh()?,
        18 => x.silu()?,
        19 => x.erf()?,
        20 => x.floor()?,
        21 => x.ceil()?,
        22 => x.round()?,
        23 => x.trunc()?,
        24 => x.clamp(Some(-1.0), Some(2.0))?,
        25 => x.clamp(None, Some(0.0))?,
        26 => x.pow_scalar(2.0)?,
        27 => x.pow_scalar(0.5)?,
        28 => x.softplus(1.0, 20.0)?,
        29 => x.isnan()?.to(DType::F32)?,
        30 => x.isinf()?.to(DType::F32)?,
        31 => x.exp2()?,
        _ => x.log2()?,
    })
}

fn binary(k: usize, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    Ok(match k {
        0 => x.add(y)?,
        1 => x.sub(y)?,
        2 => x.mul(y)?,
        3 => x.div(y)?,
        4 => x.maximum(y)?,
        5 => x.minimum(y)?,
        6 => x.pow(y)?,
        7 => x.atan2(y)?,
        8 => x.remainder(y)?,
        9 => x.div_floor(y)?,
        10 => x.div_trunc(y)?,
        11 => x.lt(y)?.to(DType::F32)?,
        12 => x.eq(y)?.to(DType::F32)?,
        13 => x.ge(y)?.to(DType::F32)?,
        14 => tpu_ops::where_(&x.gt(y)?, x, y)?,
        15 => x.masked_fill(&y.isnan()?, f64::INFINITY)?,
        _ => x.ne(y)?.to(DType::F32)?,
    })
}

fn reduce(k: usize, x: &Tensor, dim: i64) -> Result<Tensor> {
    Ok(match k {
        0 => x.sum(&[dim], false)?,
        1 => x.mean(&[dim], true)?,
        2 => x.amax(&[dim], false)?,
        3 => x.amin(&[dim], false)?,
        4 => x.prod(&[dim], false)?,
        5 => x.argmax(Some(dim), false)?.to(DType::F32)?,
        6 => x.argmin(Some(dim), false)?.to(DType::F32)?,
        7 => x.logsumexp(&[dim], false)?,
        8 => x.softmax(dim)?,
        9 => x.log_softmax(dim)?,
        10 => x.cumsum(dim)?,
        // Products stay finite: the CPU accumulates f32 products in f64 as PyTorch's CPU
        // does, XLA in f32 as PyTorch's CUDA does, so an overflowing partial product differs.
        11 => x.clamp(Some(-100.0), Some(100.0))?.cumprod(dim)?,
        12 => x.max_dim(dim, false)?.0,
        13 => x.max_dim(dim, false)?.1.to(DType::F32)?,
        14 => x.min_dim(dim, true)?.1.to(DType::F32)?,
        15 => x.sort(dim, false, true)?.0,
        16 => x.sort(dim, true, true)?.1.to(DType::F32)?,
        17 => x.var(&[dim], 1.0, false)?,
        18 => x.norm(2.0, &[dim], false)?,
        19 => x.max_all()?,
        20 => x.sum_all()?,
        _ => x.isnan()?.any(&[dim], false)?.to(DType::F32)?,
    })
}

fn movement(k: usize, x: &Tensor, dim: i64) -> Result<Tensor> {
    Ok(match k {
        0 => x.flip(&[dim])?,
        1 => cat(&[x, x], dim)?,
        2 => x.transpose(0, dim)?,
        3 => x.roll(&[1], &[dim])?,
        4 => x.repeat(&vec![2; x.rank()])?,
        5 => x.tril(0)?,
        6 => x.copy()?,
        // Products and norms: XLA's dot and reductions against the SIMD kernels.
        7 if x.rank() >= 1 => x.matmul(&x.transpose(-1, -2)?)?,
        8 if x.rank() >= 1 => {
            let last = x.shape()[x.rank() - 1];
            tpu_ops::ops::nn::functional::layer_norm(x, &[last])?
        }
        _ => x.unsqueeze(0)?.expand(
            std::iter::once(2i64)
                .chain(x.shape().iter().map(|&s| s as i64))
                .collect::<Vec<_>>()
                .as_slice(),
        )?,
    })
}

struct Case {
    start: (Vec<usize>, Vec<f32>),
    /// Each op with its dim and, for binary ops, the second operand's shape and values.
    steps: Vec<(Op, i64, Vec<usize>, Vec<f32>)>,
}

fn draw(seed: u64, len: usize) -> Case {
    let mut rng = Rng(SplitMix(seed));
    let shape = rng.shape();
    let n: usize = shape.iter().product();
    let values = (0..n).map(|_| rng.value()).collect();
    let mut steps = Vec::new();
    for _ in 0..len {
        let op = match rng.range(0, 3) {
            0 => Op::Unary(rng.range(0, UNARY - 1)),
            1 => Op::Binary(rng.range(0, BINARY - 1)),
            2 => Op::Reduce(rng.range(0, REDUCE - 1)),
            _ => Op::Move(rng.range(0, MOVE - 1)),
        };
        let dim = rng.range(0, 3) as i64 - 1;
        // The second operand: the current shape or a broadcastable one is chosen at run
        // time; draw enough values for any.
        let other_shape = vec![rng.range(0, 1)];
        let other: Vec<f32> = (0..64).map(|_| rng.value()).collect();
        steps.push((op, dim, other_shape, other));
    }
    Case {
        start: (shape, values),
        steps,
    }
}

/// Runs one step on `x` (on its device).
fn step(x: &Tensor, (op, dim, bshape, other): &(Op, i64, Vec<usize>, Vec<f32>)) -> Result<Tensor> {
    let rank = x.rank().max(1) as i64;
    let dim = dim.rem_euclid(rank);
    match *op {
        Op::Unary(k) => unary(k, x),
        Op::Binary(k) => {
            // The other operand has x's shape, or x's shape with its last dim 1, or is 0-d.
            let shape: Vec<usize> = match bshape[0] {
                0 => x.shape().to_vec(),
                _ if x.rank() > 0 => {
                    let mut s = x.shape().to_vec();
                    *s.last_mut().unwrap() = 1;
                    s
                }
                _ => vec![],
            };
            let m: usize = shape.iter().product();
            let vals: Vec<f32> = (0..m).map(|i| other[i % other.len()]).collect();
            let y = Tensor::from_vec(vals, &shape[..], &Device::cpu())?.to_device(x.device())?;
            binary(k, x, &y)
        }
        Op::Reduce(k) => reduce(k, x, dim),
        Op::Move(k) => movement(k, x, dim),
    }
}

/// `x` with subnormal numbers replaced by zeros of their sign, as PJRT devices read them: a
/// step may make them (`1e-30 * 1e-11`), and the next would then differ by design.
fn flush_subnormals(x: Tensor) -> Result<Tensor> {
    if x.dtype() != DType::F32 {
        return Ok(x);
    }
    let v: Vec<f32> = x
        .to_vec::<f32>()?
        .into_iter()
        .map(|v| {
            if v.is_subnormal() {
                0f32.copysign(v)
            } else {
                v
            }
        })
        .collect();
    Tensor::from_vec(v, x.shape(), x.device())
}

/// Runs the chain on the native CPU and each step also on `pjrt`, from the CPU's input to
/// that step: rounding differences of one step are not amplified by the next, while later
/// steps still meet the NaNs and infinities earlier ones made. Both devices must give the
/// same values, or both an error.
fn check(case: &Case, pjrt: &Device) -> Result<()> {
    let fail = |why: String| Err(tpu_tensor::Error::invalid_argument("special values", why));
    let mut x = Tensor::from_vec(case.start.1.clone(), &case.start.0[..], &Device::cpu())?;
    for s in &case.steps {
        let what = format!(
            "{:?} (dim {}) of {:?} {:?}",
            s.0,
            s.1,
            x.shape(),
            x.to_vec::<f32>()?
        );
        let on_cpu = step(&x, s);
        let on_pjrt = step(&x.to_device(pjrt)?, s);
        x = match (on_cpu, on_pjrt) {
            (Ok(a), Ok(b)) => {
                assert_close(&what, &b, &a, 1e-5)?;
                flush_subnormals(a)?
            }
            (Err(_), Err(_)) => return Ok(()),
            (Ok(_), Err(e)) => return fail(format!("{what}: cpu ran, pjrt failed: {e}")),
            (Err(e), Ok(_)) => return fail(format!("{what}: pjrt ran, cpu failed: {e}")),
        };
        if x.numel() > 4096 {
            break;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(proptest_cases(64)))]

    /// Chains of up to four ops over special values agree between the devices.
    #[test]
    fn op_chains_over_special_values_agree_on_cpu_and_pjrt(seed in any::<u64>(), len in 1usize..5) {
        let Some(pjrt) = pjrt_device("op_chains_over_special_values") else { return Ok(()) };
        check(&draw(seed, len), &pjrt).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}
