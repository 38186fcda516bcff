//! What the tests share: the devices to run on, seeded inputs, and comparing tensors (the CPU
//! kernels against XLA, and against reference values).

use tpu_tensor::{DType, Device, Error, Result, Tensor};

/// The first device of the PJRT plugin, or `None` after a line saying that `test` skips it (a
/// panic instead when `TPU_RS_REQUIRE_PJRT=1`, as in CI).
pub fn pjrt_device(test: &str) -> Option<Device> {
    tpu_tensor::tpu_runtime::pjrt::testing::client_or_skip(test).and_then(|c| c.device(0).ok())
}

/// The devices every op is tested on: the native CPU, and the PJRT plugin's first device.
pub fn devices(test: &str) -> Vec<Device> {
    let mut d = vec![Device::cpu()];
    d.extend(pjrt_device(test));
    d
}

/// The elements of `t` as f64, read back to the host.
pub fn host_f64(t: &Tensor) -> Result<Vec<f64>> {
    t.to_device(&Device::cpu())?
        .to_dtype(DType::F64)?
        .to_vec::<f64>()
}

/// The bit patterns of an f32 tensor's elements, read back to the host: what bit-for-bit
/// comparisons compare.
pub fn f32_bits(t: &Tensor) -> Result<Vec<u32>> {
    Ok(t.to_device(&Device::cpu())?
        .to_vec::<f32>()?
        .iter()
        .map(|x| x.to_bits())
        .collect())
}

/// True when `got` is what IEEE arithmetic gives for a result whose exact value is `want`: NaN
/// exactly where `want` is NaN, the same infinity where it is infinite, and within `bound` of
/// it where it is finite.
pub fn matches_ieee(got: f64, want: f64, bound: f64) -> bool {
    if want.is_nan() {
        got.is_nan()
    } else if want.is_infinite() {
        got == want
    } else {
        (got - want).abs() <= bound
    }
}

/// The fields of the `Error::IndexOutOfRange` that `r` should be (op, index, dim, size, shape),
/// or a description of what came instead.
pub fn index_error_of(
    r: Result<Tensor>,
) -> std::result::Result<(String, i64, usize, usize, Vec<usize>), String> {
    match r {
        Err(Error::IndexOutOfRange {
            op,
            index,
            dim,
            size,
            shape,
        }) => Ok((op, index, dim, size, shape)),
        Err(e) => Err(format!("expected an index error, got {e}")),
        Ok(t) => Err(format!(
            "expected an index error, got a tensor of shape {:?}",
            t.shape()
        )),
    }
}

/// splitmix64: a small seeded generator, for property tests that derive many choices (shapes,
/// ops, values) from one proptest seed.
#[derive(Clone, Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi` (`lo` when `hi < lo`).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        if hi <= lo {
            return lo;
        }
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// A fair coin.
    pub fn coin(&mut self) -> bool {
        self.next_u64().is_multiple_of(2)
    }
}

/// `len` values that stress IEEE arithmetic: halves in `[-2, 2]` (exact in every float dtype,
/// so finite sums of a few are exact even in f16) with +inf, -inf, NaN, -0.0 and 0.0 at a rate
/// of `rate` in 64, from a xorshift stream seeded with `seed`.
pub fn special_halves(seed: u64, len: usize, rate: u64) -> Vec<f64> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if s % 64 < rate {
                [f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -0.0, 0.0][(s >> 6) as usize % 5]
            } else {
                ((s >> 8) % 9) as f64 * 0.5 - 2.0
            }
        })
        .collect()
}

/// The number of cases a property test runs: `PROPTEST_CASES` when set (for a long run), else
/// `ci_default`, the budget that keeps CI fast.
pub fn proptest_cases(ci_default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ci_default)
}

/// The relative precision of a dtype (one unit in the last place at 1.0).
pub fn epsilon(d: DType) -> f64 {
    match d {
        DType::BF16 => 2f64.powi(-7),
        DType::F16 => 2f64.powi(-10),
        DType::F32 => 2f64.powi(-23),
        DType::F64 => 2f64.powi(-52),
        _ => 0.0,
    }
}

/// Checks that `a` and `b` have the same shape and dtype and agree elementwise: exactly for
/// integers and bool, and for floats within `tol` (absolute and relative), widened to two units
/// in the last place of the dtype when `tol` is not 0. NaNs must match NaNs.
pub fn assert_close(what: &str, a: &Tensor, b: &Tensor, tol: f64) -> Result<()> {
    let fail = |why: String| Err(Error::invalid_argument(what, why));
    if a.shape() != b.shape() || a.dtype() != b.dtype() {
        return fail(format!(
            "shape/dtype differ: {:?} {} vs {:?} {}",
            a.shape(),
            a.dtype(),
            b.shape(),
            b.dtype()
        ));
    }
    let x = a
        .to_device(&tpu_tensor::Device::cpu())?
        .to_dtype(DType::F64)?
        .to_vec::<f64>()?;
    let y = b
        .to_device(&tpu_tensor::Device::cpu())?
        .to_dtype(DType::F64)?
        .to_vec::<f64>()?;
    let tol = if a.dtype().is_float() && tol > 0.0 {
        tol.max(2.0 * epsilon(a.dtype()))
    } else {
        tol
    };
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        let same = (p.is_nan() && q.is_nan())
            || p == q
            || (tol > 0.0 && (p - q).abs() <= tol * (1.0 + p.abs().max(q.abs())));
        if !same {
            return fail(format!(
                "element {i} differs: {p} vs {q} (tolerance {tol}); shape {:?}, dtype {}",
                a.shape(),
                a.dtype()
            ));
        }
    }
    Ok(())
}

/// Checks a function's backward rules against central finite differences, in f64.
///
/// `f` maps the inputs to one output tensor; the check differentiates `sum(f(x) * w)` for a
/// fixed random weight `w` (so every output element matters) with respect to every input that
/// is a float tensor, perturbing each element by `eps` both ways. Inputs must be f64 (the caller
/// converts). Returns an error describing the first element whose analytic and numeric
/// gradients differ by more than `tol` (absolute plus relative).
pub fn gradcheck(
    what: &str,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    eps: f64,
    tol: f64,
) -> Result<()> {
    use crate::autograd::{AutogradOps, grad_of, no_grad};
    use crate::ops::elementwise::methods::TensorOps;
    let fail = |why: String| Err(Error::invalid_argument(what, why));
    let leaves: Vec<Tensor> = inputs
        .iter()
        .map(|t| {
            if t.dtype() == DType::F64 {
                t.detach().copy()?.requires_grad_(true)
            } else {
                Ok(t.clone())
            }
        })
        .collect::<Result<_>>()?;
    let out = f(&leaves)?;
    let w = tpu_tensor::Generator::new(1234)
        .randn(out.shape(), DType::F64, &tpu_tensor::Device::cpu())?
        .to_device(out.device())?;
    let loss_of = |xs: &[Tensor]| -> Result<f64> {
        let o = f(xs)?;
        let v = o.to_dtype(DType::F64)?.mul(&w)?;
        let v = v.to_device(&tpu_tensor::Device::cpu())?.to_vec::<f64>()?;
        Ok(v.iter().sum())
    };
    let diff: Vec<usize> = (0..leaves.len())
        .filter(|&i| leaves[i].dtype() == DType::F64)
        .collect();
    let targets: Vec<&Tensor> = diff.iter().map(|&i| &leaves[i]).collect();
    let weighted = out.mul(&w)?;
    let grads = grad_of(&[&weighted], &targets, None, false)?;
    let _g = no_grad();
    for (k, &i) in diff.iter().enumerate() {
        let analytic = match &grads[k] {
            Some(g) => g.to_device(&tpu_tensor::Device::cpu())?.to_vec::<f64>()?,
            None => vec![0.0; leaves[i].numel()],
        };
        let base = leaves[i]
            .to_device(&tpu_tensor::Device::cpu())?
            .contiguous()?
            .to_vec::<f64>()?;
        for j in 0..base.len() {
            let probe = |delta: f64| -> Result<f64> {
                let mut v = base.clone();
                v[j] += delta;
                let t = Tensor::from_vec(v, leaves[i].shape(), leaves[i].device())?;
                let mut xs: Vec<Tensor> = leaves.iter().map(|l| l.detach()).collect();
                xs[i] = t;
                loss_of(&xs)
            };
            let numeric = (probe(eps)? - probe(-eps)?) / (2.0 * eps);
            let a = analytic[j];
            if (a - numeric).abs() > tol * (1.0 + numeric.abs()) {
                return fail(format!(
                    "input {i} element {j}: backward gives {a}, finite differences give {numeric} (shape {:?})",
                    leaves[i].shape()
                ));
            }
        }
    }
    Ok(())
}
