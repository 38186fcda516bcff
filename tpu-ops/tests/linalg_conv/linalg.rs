//! Matrix products against a naive reference (proptest), against values PyTorch printed, on bad
//! input, and through XLA on the edge cases the op table's samples do not reach.

use crate::common::test_device;
use crate::common::{cpu, pjrt};
use proptest::prelude::*;
use tpu_ops::cpu::isa::{Level, detected_level, with_level};
use tpu_ops::exec::pjrt::module_for;
use tpu_ops::hlo::{Precision, TensorType};
use tpu_ops::ops::linalg::{
    LinalgOps, Matmul, ProductKind, bmm, dot, einsum, linear, matmul, matmul_precision, mm,
    set_matmul_precision,
};
use tpu_ops::testing::{assert_close, epsilon, special_halves};
use tpu_ops::{Meta, OpDef, TensorOps};
use tpu_tensor::{DType, Generator, Layout, Tensor};

/// Every dtype but bool.
const NUMERIC: &[DType] = DType::ALL.split_at(1).1;

fn f32s(values: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape, &cpu()).unwrap()
}

/// `start, start + 1, ...` of `shape`, as PyTorch's `torch.arange(n).reshape(shape) + start`.
fn arange(shape: &[usize], start: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| i as f32 + start).collect();
    f32s(&v, shape)
}

/// PyTorch's `%` on floats (the result takes the divisor's sign).
fn pymod(x: f32, m: f32) -> f32 {
    x - m * (x / m).floor()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

fn expect(t: &Tensor, shape: &[usize], want: &[f64]) {
    assert_eq!(t.shape(), shape, "shape");
    assert_eq!(values(t), want);
}

fn err_text<T: std::fmt::Debug>(r: tpu_tensor::Result<T>) -> String {
    r.expect_err("expected an error").to_string()
}

// ---- the reference ---------------------------------------------------------------------------

/// `torch.matmul` by the definition, with `mul_add(acc, x, y)` accumulating.
fn reference<T: Copy + Default>(
    a: &[T],
    a_shape: &[usize],
    b: &[T],
    b_shape: &[usize],
    mul_add: impl Fn(T, T, T) -> T,
) -> (Vec<T>, Vec<usize>) {
    let (a_vec, b_vec) = (a_shape.len() == 1, b_shape.len() == 1);
    let a_shape: Vec<usize> = if a_vec {
        vec![1, a_shape[0]]
    } else {
        a_shape.to_vec()
    };
    let b_shape: Vec<usize> = if b_vec {
        vec![b_shape[0], 1]
    } else {
        b_shape.to_vec()
    };
    let (ra, rb) = (a_shape.len(), b_shape.len());
    let (m, k, n) = (a_shape[ra - 2], a_shape[ra - 1], b_shape[rb - 1]);
    let nb = (ra - 2).max(rb - 2);
    let dim = |s: &[usize], r: usize, d: usize| {
        if d + (r - 2) >= nb {
            s[d + (r - 2) - nb]
        } else {
            1
        }
    };
    let batch: Vec<usize> = (0..nb)
        .map(|d| dim(&a_shape, ra, d).max(dim(&b_shape, rb, d)))
        .collect();
    let count: usize = batch.iter().product();
    let mut out = vec![T::default(); count * m * n];
    for bi in 0..count {
        // Batch index -> each operand's matrix number, with size-1 dims broadcast.
        let (mut rem, mut ia, mut ib, mut sa, mut sb) = (bi, 0, 0, 1, 1);
        for d in (0..nb).rev() {
            let i = rem % batch[d];
            rem /= batch[d];
            let (da, db) = (dim(&a_shape, ra, d), dim(&b_shape, rb, d));
            ia += if da == 1 { 0 } else { i * sa };
            ib += if db == 1 { 0 } else { i * sb };
            sa *= da;
            sb *= db;
        }
        for i in 0..m {
            for j in 0..n {
                let mut acc = T::default();
                for p in 0..k {
                    acc = mul_add(acc, a[ia * m * k + i * k + p], b[ib * k * n + p * n + j]);
                }
                out[bi * m * n + i * n + j] = acc;
            }
        }
    }
    let mut shape = batch;
    if !a_vec {
        shape.push(m);
    }
    if !b_vec {
        shape.push(n);
    }
    (out, shape)
}

/// Checks `got` against the reference product of `a` and `b` (whose values it reads through
/// their views): exactly for integers (wrapped to the dtype), and for floats within the
/// rounding of one final conversion to the dtype plus the accumulation error of `k` terms in
/// the compute precision.
fn check_product(what: &str, a: &Tensor, b: &Tensor, got: &Tensor) {
    let d = got.dtype();
    assert_eq!(a.dtype(), d, "{what}: dtype");
    if d.is_int() {
        let av = a.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap();
        let bv = b.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap();
        let (want, shape) = reference(&av, a.shape(), &bv, b.shape(), |acc, x, y| {
            acc.wrapping_add(x.wrapping_mul(y))
        });
        assert_eq!(got.shape(), &shape[..], "{what}: shape");
        let want = Tensor::from_vec(want, &shape[..], &cpu())
            .unwrap()
            .to_dtype(d)
            .unwrap();
        assert_eq!(values(got), values(&want), "{what}");
        return;
    }
    let (av, bv) = (values(a), values(b));
    let (want, shape) = reference(&av, a.shape(), &bv, b.shape(), |acc, x, y| acc + x * y);
    let abs_a: Vec<f64> = av.iter().map(|x| x.abs()).collect();
    let abs_b: Vec<f64> = bv.iter().map(|x| x.abs()).collect();
    let (mag, _) = reference(&abs_a, a.shape(), &abs_b, b.shape(), |acc, x, y| {
        acc + x * y
    });
    assert_eq!(got.shape(), &shape[..], "{what}: shape");
    let k = *a.shape().last().unwrap_or(&0) as f64;
    let compute = if d == DType::F64 { d } else { DType::F32 };
    let round = if d == DType::F32 || d == DType::F64 {
        0.0
    } else {
        epsilon(d)
    };
    for (i, ((g, w), m)) in values(got).iter().zip(&want).zip(&mag).enumerate() {
        let tol = round * w.abs() + (k + 2.0) * epsilon(compute) * m + 1e-7;
        assert!(
            (g - w).abs() <= tol,
            "{what}: element {i} is {g}, the reference {w} (tolerance {tol})"
        );
    }
}

// ---- proptest --------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    /// Batch shape both operands broadcast to; each operand keeps a suffix of it, with some dims
    /// set to 1.
    batch: Vec<usize>,
    a_batch: Vec<usize>,
    b_batch: Vec<usize>,
    m: usize,
    k: usize,
    n: usize,
    a_vec: bool,
    b_vec: bool,
    /// 0 dense, 1 transposed, 2 every other element of a wider tensor, 3 batch dims expanded.
    a_layout: u8,
    b_layout: u8,
    seed: u64,
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => 1usize..6,
        1 => Just(0usize),
        1 => Just(1usize),
        2 => Just(7usize),
        2 => Just(17usize),
        1 => Just(65usize),
    ]
}

fn operand_batch(full: &[usize], keep: usize, ones: u8) -> Vec<usize> {
    let keep = keep.min(full.len());
    full[full.len() - keep..]
        .iter()
        .enumerate()
        .map(|(i, &s)| if ones & (1 << i) != 0 { 1 } else { s })
        .collect()
}

fn case() -> impl Strategy<Value = Case> {
    (
        (
            prop::sample::select(NUMERIC.to_vec()),
            prop::collection::vec(1usize..4, 0..=2),
            0usize..3,
            0usize..3,
            any::<u8>(),
            any::<u8>(),
        ),
        (size(), size(), size()),
        (prop::bool::weighted(0.2), prop::bool::weighted(0.2)),
        (0u8..4, 0u8..4, any::<u64>()),
    )
        .prop_map(
            |((dtype, batch, ka, kb, oa, ob), (m, k, n), (a_vec, b_vec), (la, lb, seed))| {
                // Keep the reference quick: shrink the batch of the largest products.
                let batch = if m * k * n > 20_000 {
                    batch.into_iter().take(1).collect()
                } else {
                    batch
                };
                let a_batch = if a_vec {
                    vec![]
                } else {
                    operand_batch(&batch, ka, oa)
                };
                let b_batch = if b_vec {
                    vec![]
                } else {
                    operand_batch(&batch, kb, ob)
                };
                Case {
                    dtype,
                    batch,
                    a_batch,
                    b_batch,
                    m,
                    k,
                    n,
                    a_vec,
                    b_vec,
                    a_layout: la,
                    b_layout: lb,
                    seed,
                }
            },
        )
}

#[allow(clippy::too_many_arguments)]
/// A tensor of logical shape `batch + [rows, cols]` (or `[cols]` when `vec`) laid out as
/// `layout` says.
fn operand(
    g: &mut Generator,
    dtype: DType,
    batch: &[usize],
    full_batch: &[usize],
    rows: usize,
    cols: usize,
    vec: bool,
    layout: u8,
) -> Tensor {
    let mut shape: Vec<usize> = batch.to_vec();
    if !vec {
        shape.push(rows);
    }
    shape.push(cols);
    let make = |g: &mut Generator, s: &[usize]| {
        let t = if dtype.is_float() {
            g.randn(s, DType::F64, &cpu()).unwrap()
        } else {
            g.randint(-100, 100, s, DType::I64, &cpu()).unwrap()
        };
        t.to_dtype(dtype).unwrap()
    };
    let r = shape.len();
    match layout {
        1 if r >= 2 => {
            let mut s = shape.clone();
            s.swap(r - 1, r - 2);
            make(g, &s).transpose(-1, -2).unwrap()
        }
        2 => {
            let mut s = shape.clone();
            s[r - 1] *= 2;
            s[0] += 1;
            make(g, &s)
                .slice(-1, .., 2)
                .unwrap()
                .narrow(0, 1, shape[0])
                .unwrap()
        }
        3 if !batch.is_empty() => {
            // Expanded batch dims (stride 0), where the batch broadcasts to them.
            let lead = full_batch.len() - batch.len();
            let mut ones = shape.clone();
            for (d, s) in ones.iter_mut().take(batch.len()).enumerate() {
                if batch[d] == full_batch[lead + d] {
                    *s = 1;
                }
            }
            make(g, &ones).expand(&shape[..]).unwrap()
        }
        _ => make(g, &shape),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn matmul_matches_the_reference(c in case()) {
        let mut g = Generator::new(c.seed);
        let a = operand(&mut g, c.dtype, &c.a_batch, &c.batch, c.m, c.k, c.a_vec, c.a_layout);
        // A vector right operand has the k elements.
        let (rows, cols) = if c.b_vec { (1, c.k) } else { (c.k, c.n) };
        let b = operand(&mut g, c.dtype, &c.b_batch, &c.batch, rows, cols, c.b_vec, c.b_layout);
        let got = a.matmul(&b).unwrap();
        check_product(&format!("{c:?}"), &a, &b, &got);
        if !c.a_vec && !c.b_vec {
            let e = einsum("...ij,...jk->...ik", &[&a, &b]).unwrap();
            check_product(&format!("einsum {c:?}"), &a, &b, &e);
        }
    }

    #[test]
    fn linear_matches_the_reference(c in case()) {
        let mut g = Generator::new(c.seed);
        let x = operand(&mut g, c.dtype, &c.a_batch, &c.batch, c.m, c.k, c.a_vec, c.a_layout);
        let w = operand(&mut g, c.dtype, &[], &[], c.n, c.k, false, c.b_layout);
        let got = x.linear(&w, None).unwrap();
        check_product(&format!("{c:?}"), &x, &w.t().unwrap(), &got);
        // With a bias of ones: the product plus one (exact for the integers; for floats
        // against the same product, within one rounding of the dtype).
        let bias = Tensor::ones([c.n], c.dtype, &cpu()).unwrap();
        let with = x.linear(&w, Some(&bias)).unwrap();
        prop_assert_eq!(with.shape(), got.shape());
        let (gv, wv) = (values(&got), values(&with));
        for (i, (p, q)) in gv.iter().zip(&wv).enumerate() {
            let want = if c.dtype.is_int() {
                values(&Tensor::scalar(*p as i64 + 1, &cpu()).unwrap().to_dtype(c.dtype).unwrap())[0]
            } else {
                p + 1.0
            };
            let tol = 2.0 * epsilon(c.dtype) * (1.0 + want.abs()) + 1e-5;
            prop_assert!((q - want).abs() <= tol, "element {}: {} vs {} ({:?})", i, q, want, c);
        }
    }
}

// ---- special values ---------------------------------------------------------------------------

/// The naive product of the 2-D `x` and `y` as they are viewed, by the definition in f64: the
/// sums in order, and the sums of the products' magnitudes (bounding finite rounding).
fn naive(x: &Tensor, y: &Tensor) -> (Vec<f64>, Vec<f64>) {
    let (m, k, n) = (x.shape()[0], x.shape()[1], y.shape()[1]);
    let (a, b) = (values(x), values(y));
    let mut want = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let t = a[i * k + p] * b[p * n + j];
                want[i * n + j] += t;
                mag[i * n + j] += t.abs();
            }
        }
    }
    (want, mag)
}

/// Checks a product of special values against `(want, mag)` from [`naive`]: NaN exactly where
/// the naive sum is NaN, the same infinity where it is infinite, finite values within the
/// rounding of the dtype.
fn agree(
    what: &str,
    got: &Tensor,
    (want, mag): &(Vec<f64>, Vec<f64>),
) -> Result<(), TestCaseError> {
    let tol = match got.dtype() {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        _ => 1e-2,
    };
    let got = values(got);
    prop_assert_eq!(got.len(), want.len(), "{}: number of elements", what);
    for (i, ((g, w), m)) in got.iter().zip(want).zip(mag).enumerate() {
        let ok = tpu_ops::testing::matches_ieee(*g, *w, tol * (1.0 + m));
        prop_assert!(ok, "{}: element {} is {}, the naive sum {}", what, i, g, w);
    }
    Ok(())
}

/// Every contraction path on the special values of one case, in every float dtype.
fn special_products(
    m: usize,
    k: usize,
    n: usize,
    seed: u64,
    rate: u64,
) -> Result<(), TestCaseError> {
    let tensor = |v: Vec<f64>, shape: &[usize], d: DType| {
        Tensor::from_vec(v, shape, &cpu())
            .unwrap()
            .to_dtype(d)
            .unwrap()
    };
    let level = tpu_ops::cpu::isa::level();
    for d in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let what =
            |op: &str| format!("{op} of {m}x{k}x{n} {d} at {level:?} (seed {seed}, rate {rate})");
        let a = tensor(special_halves(seed, m * k, rate), &[m, k], d);
        let b = tensor(
            special_halves(seed ^ 0x9e37_79b9_7f4a_7c15, k * n, rate),
            &[k, n],
            d,
        );
        let want = naive(&a, &b);
        agree(&what("mm"), &a.mm(&b).unwrap(), &want)?;
        // The same matrices stored transposed.
        let (at, bt) = (
            a.t().unwrap().contiguous().unwrap(),
            b.t().unwrap().contiguous().unwrap(),
        );
        agree(
            &what("mm of transposed"),
            &at.t().unwrap().mm(&bt.t().unwrap()).unwrap(),
            &want,
        )?;
        // Stride-0 operands: a's first row and b's first column repeated.
        let a0 = a.narrow(0, 0, 1).unwrap().expand([m, k]).unwrap();
        let b0 = b.narrow(1, 0, 1).unwrap().expand([k, n]).unwrap();
        agree(
            &what("mm of expanded"),
            &a0.mm(&b0).unwrap(),
            &naive(&a0, &b0),
        )?;
        // Batches: a broadcast (stride 0) against two copies of b, two copies of a against
        // the shared b (one tall product), and bmm of the copies.
        let twice =
            |(w, g): &(Vec<f64>, Vec<f64>)| ([&w[..], &w[..]].concat(), [&g[..], &g[..]].concat());
        let a2 = a.unsqueeze(0).unwrap().expand([2, m, k]).unwrap();
        let b2 = b
            .unsqueeze(0)
            .unwrap()
            .expand([2, k, n])
            .unwrap()
            .contiguous()
            .unwrap();
        agree(
            &what("matmul of a broadcast batch"),
            &a.matmul(&b2).unwrap(),
            &twice(&want),
        )?;
        agree(
            &what("matmul against a shared matrix"),
            &a2.matmul(&b).unwrap(),
            &twice(&want),
        )?;
        agree(
            &what("bmm"),
            &a2.contiguous().unwrap().bmm(&b2).unwrap(),
            &twice(&want),
        )?;
        // Matrix-vector, vector-matrix and dot, with b's first column and a's first row
        // (strided views), and the dot of an expanded element.
        let v = b.narrow(1, 0, 1).unwrap().squeeze_dim(1).unwrap();
        let u = a.narrow(0, 0, 1).unwrap().squeeze_dim(0).unwrap();
        let col0 = naive(&a, &b.narrow(1, 0, 1).unwrap());
        agree(&what("matrix-vector"), &a.matmul(&v).unwrap(), &col0)?;
        let row0 = naive(&a.narrow(0, 0, 1).unwrap(), &b);
        agree(&what("vector-matrix"), &u.matmul(&b).unwrap(), &row0)?;
        let uv = naive(&u.unsqueeze(0).unwrap(), &v.unsqueeze(1).unwrap());
        agree(&what("dot"), &u.dot(&v).unwrap(), &uv)?;
        let e = a
            .narrow(0, 0, 1)
            .unwrap()
            .narrow(1, 0, 1)
            .unwrap()
            .reshape([1])
            .unwrap()
            .expand([k])
            .unwrap();
        let ev = naive(&e.unsqueeze(0).unwrap(), &v.unsqueeze(1).unwrap());
        agree(&what("dot of an expanded vector"), &e.dot(&v).unwrap(), &ev)?;
        // einsum: the product, and sums (products with ones) over either dim.
        agree(
            &what("einsum ij,jk->ik"),
            &einsum("ij,jk->ik", &[&a, &b]).unwrap(),
            &want,
        )?;
        let ones = |r: usize, c: usize| Tensor::ones([r, c], d, &cpu()).unwrap();
        let col_sums = naive(&ones(1, m), &a);
        agree(
            &what("einsum ij->j"),
            &einsum("ij->j", &[&a]).unwrap(),
            &col_sums,
        )?;
        let row_sums = naive(&a, &ones(k, 1));
        agree(
            &what("einsum ij->i"),
            &einsum("ij->i", &[&a]).unwrap(),
            &row_sums,
        )?;
        // linear: a · wᵀ + bias with w = bᵀ stored [n, k] and a bias of special values.
        let bias = tensor(special_halves(seed.rotate_left(17), n, rate), &[n], d);
        let bv = values(&bias);
        let (mut lw, mut lm) = want.clone();
        for (i, (w, g)) in lw.iter_mut().zip(lm.iter_mut()).enumerate() {
            *w += bv[i % n];
            *g += bv[i % n].abs();
        }
        agree(
            &what("linear"),
            &a.linear(&bt, Some(&bias)).unwrap(),
            &(lw, lm),
        )?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(24)))]

    /// Every CPU contraction path gives IEEE results for ±inf, NaN and -0.0 operands: NaN only
    /// where the definition has a NaN, 0 · inf or inf - inf, in every float dtype and at every
    /// instruction-set level, with transposed, expanded (stride 0) and batch-broadcast operands
    /// and sizes on either side of the 12x32 register tile and its 16-lane vectors.
    #[test]
    fn products_of_special_values_are_ieee(
        m in prop::sample::select(vec![1usize, 2, 5, 12, 13, 25]),
        k in prop::sample::select(vec![1usize, 2, 3, 7, 16, 17, 33]),
        n in prop::sample::select(vec![1usize, 2, 5, 31, 32, 33]),
        seed in any::<u64>(),
        rate in prop::sample::select(vec![1u64, 4, 12]),
    ) {
        for level in [Level::Portable, Level::Avx2, Level::Avx512] {
            with_level(level, || special_products(m, k, n, seed, rate))?;
        }
    }
}

test_device!(
    /// The products of the issue report, with PyTorch's values:
    ///
    /// ```python
    /// torch.einsum("ab->b", torch.tensor([[inf, 1.], [inf, 1.]]))          # [inf, 2.]
    /// torch.tensor([-inf]).expand(2).dot(torch.tensor([-1.5, -0.5]))         # inf
    /// ```
    infinite_sums_and_expanded_dots_match_pytorch,
    |dev| {
        let inf = f32::INFINITY;
        for level in [Level::Portable, Level::Avx2, Level::Avx512] {
            with_level(level, || {
                let a = f32s(&[inf, 1.0, inf, 1.0], &[2, 2])
                    .to_device(&dev)
                    .unwrap();
                let s = einsum("ab->b", &[&a]).unwrap();
                assert_eq!(values(&s), [f64::INFINITY, 2.0], "{dev:?} {level:?}");
                let x = f32s(&[-inf], &[1])
                    .to_device(&dev)
                    .unwrap()
                    .expand([2])
                    .unwrap();
                let y = f32s(&[-1.5, -0.5], &[2]).to_device(&dev).unwrap();
                assert_eq!(
                    values(&x.dot(&y).unwrap()),
                    [f64::INFINITY],
                    "{dev:?} {level:?}"
                );
            });
        }
    }
);

/// Products big enough for the thread pool: one large product (faer's own threads, and row
/// tasks for integers), and batches of small ones (a task each).
#[test]
fn parallel_products_match_the_reference() {
    let mut g = Generator::new(9);
    let mut r = |s: &[usize], d: DType| {
        g.randint(-50, 50, s, DType::I64, &cpu())
            .unwrap()
            .to_dtype(d)
            .unwrap()
    };
    for (a, b, d) in [
        (vec![150, 160], vec![170, 160], DType::F32),
        (vec![8, 40, 50], vec![8, 60, 50], DType::F64),
        (vec![120, 70], vec![130, 70], DType::I32),
        (vec![3, 70, 70], vec![1, 70, 70], DType::BF16),
    ] {
        let (x, y) = (r(&a, d), r(&b, d).transpose(-1, -2).unwrap());
        check_product(
            &format!("{a:?} {b:?} {d}"),
            &x,
            &y,
            &matmul(&x, &y).unwrap(),
        );
    }
}

// ---- PyTorch's values ------------------------------------------------------------------------
//
// Generated with torch 2.15 on the CPU:
//
//   a = torch.arange(6.).reshape(2,3) - 2
//   v = torch.tensor([1., -2., 3.])
//   w = torch.arange(12.).reshape(3,4) / 2 - 1
//   torch.matmul(v, v); torch.matmul(v, w); torch.matmul(a, v)
//   x = torch.arange(24.).reshape(2,1,3,4) % 5 - 2
//   y = torch.arange(40.).reshape(5,4,2) % 7 - 3
//   torch.matmul(x, y); torch.matmul(x, torch.tensor([1., 0., -1., 2.]))
//   torch.matmul(torch.tensor([1., 0., -1.]), y[:, :3, :])

#[test]
fn matmul_rank_rules_match_pytorch() {
    let a = arange(&[2, 3], -2.0);
    let v = f32s(&[1., -2., 3.], &[3]);
    let w = arange(&[3, 4], 0.0).mul(0.5).unwrap().sub(1.0).unwrap();
    expect(&matmul(&v, &v).unwrap(), &[], &[14.0]);
    expect(&matmul(&v, &w).unwrap(), &[4], &[6.0, 7.0, 8.0, 9.0]);
    expect(&matmul(&a, &v).unwrap(), &[2], &[0.0, 6.0]);
    expect(&dot(&v, &v).unwrap(), &[], &[14.0]);
}

#[test]
fn broadcast_batches_match_pytorch() {
    let x = arange(&[2, 1, 3, 4], 0.0);
    let x = host(&x, |v| pymod(v, 5.0) - 2.0);
    let y = host(&arange(&[5, 4, 2], 0.0), |v| pymod(v, 7.0) - 3.0);
    #[rustfmt::skip]
    let want = [
        10.0, 1.0, -5.0, -6.0, -10.0, -3.0, 1.0, -1.0, -6.0, -7.0, -3.0, -3.0, -1.0, -3.0, -7.0,
        -1.0, -3.0, 11.0, -3.0, -5.0, -1.0, -2.0, 11.0, 11.0, -5.0, 0.0, -2.0, 11.0, 11.0, -3.0,
        -5.0, 10.0, 10.0, -2.0, 10.0, 1.0, 10.0, 11.0, -2.0, 0.0, 1.0, -1.0, 11.0, -2.0, 0.0,
        -5.0, -1.0, -3.0, -2.0, -1.0, -5.0, -3.0, -3.0, -5.0, -1.0, -7.0, -3.0, -1.0, -5.0, 0.0,
    ];
    expect(&matmul(&x, &y).unwrap(), &[2, 5, 3, 2], &want);
    let u = f32s(&[1., 0., -1., 2.], &[4]);
    expect(
        &matmul(&x, &u).unwrap(),
        &[2, 1, 3],
        &[0.0, 3.0, 1.0, -6.0, 2.0, 0.0],
    );
    let y3 = y.narrow(1, 0, 3).unwrap();
    let r = matmul(&f32s(&[1., 0., -1.], &[3]), &y3).unwrap();
    expect(
        &r,
        &[5, 2],
        &[-4.0, -4.0, -4.0, -4.0, -4.0, 3.0, 3.0, 3.0, 3.0, 3.0],
    );
}

fn host(t: &Tensor, f: impl Fn(f32) -> f32) -> Tensor {
    let v: Vec<f32> = t.to_vec::<f32>().unwrap().into_iter().map(f).collect();
    f32s(&v, t.shape())
}

// lx = torch.arange(12.).reshape(2,2,3) - 5
// lw = torch.tensor([[1., 0., -1.], [0.5, 2., 1.]]); lb = torch.tensor([10., -3.])
// torch.nn.functional.linear(lx, lw, lb)
#[test]
fn linear_with_bias_matches_pytorch() {
    let x = arange(&[2, 2, 3], -5.0);
    let w = f32s(&[1., 0., -1., 0.5, 2., 1.], &[2, 3]);
    let b = f32s(&[10., -3.], &[2]);
    expect(
        &linear(&x, &w, Some(&b)).unwrap(),
        &[2, 2, 2],
        &[8.0, -16.5, 8.0, -6.0, 8.0, 4.5, 8.0, 15.0],
    );
    expect(
        &linear(&f32s(&[1., 2., 3.], &[3]), &w, Some(&b)).unwrap(),
        &[2],
        &[8.0, 4.5],
    );
}

// ba = (torch.arange(16.).reshape(2,8) / 8 + 1).to(torch.bfloat16)
// bb = ((torch.arange(24.).reshape(8,3) - 11) / 16).to(torch.bfloat16)
// torch.matmul(ba, bb)  # equal to (ba.float() @ bb.float()).bfloat16(); rounding after every
//                       # step would give 1.578125 for element 4
// torch.nn.functional.linear(ba, bb.t(), torch.tensor([0.3, -0.7, 1.1]).bfloat16())
// torch.matmul(ba.half(), bb.half())  # equal to (ba.float() @ bb.float()).half()
#[test]
fn bf16_matmul_rounds_once_like_pytorch() {
    let ba = arange(&[2, 8], 0.0)
        .div(8.0)
        .unwrap()
        .add(1.0)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let bb = arange(&[8, 3], -11.0)
        .div(16.0)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let r = matmul(&ba, &bb).unwrap();
    assert_eq!(r.dtype(), DType::BF16);
    expect(
        &r,
        &[2, 3],
        &[0.625, 1.34375, 2.0625, 0.375, 1.59375, 2.8125],
    );
    let bias = f32s(&[0.3, -0.7, 1.1], &[3]).to_dtype(DType::BF16).unwrap();
    let l = linear(&ba, &bb.t().unwrap(), Some(&bias)).unwrap();
    expect(
        &l,
        &[2, 3],
        &[
            0.92578125, 0.64453125, 3.15625, 0.67578125, 0.89453125, 3.90625,
        ],
    );
    let once = matmul(
        &ba.to_dtype(DType::F32).unwrap(),
        &bb.to_dtype(DType::F32).unwrap(),
    )
    .unwrap()
    .to_dtype(DType::F16)
    .unwrap();
    let h = matmul(
        &ba.to_dtype(DType::F16).unwrap(),
        &bb.to_dtype(DType::F16).unwrap(),
    )
    .unwrap();
    assert_eq!(values(&h), values(&once));
}

// ia = torch.tensor([[100, 50], [-7, 3]]); ib = torch.tensor([[3, 2], [5, -1]])
// torch.matmul(ia.to(torch.uint8), ib.to(torch.uint8)); same with torch.int8
// torch.matmul(torch.tensor([[2**30, 3]], dtype=torch.int32), torch.tensor([[4], [5]], dtype=torch.int32))
#[test]
fn integer_matmul_wraps_like_pytorch() {
    let ia = Tensor::from_vec(vec![100i64, 50, -7, 3], [2, 2], &cpu()).unwrap();
    let ib = Tensor::from_vec(vec![3i64, 2, 5, -1], [2, 2], &cpu()).unwrap();
    let r = |d| matmul(&ia.to_dtype(d).unwrap(), &ib.to_dtype(d).unwrap()).unwrap();
    expect(&r(DType::U8), &[2, 2], &[38.0, 150.0, 250.0, 239.0]);
    expect(&r(DType::I8), &[2, 2], &[38.0, -106.0, -6.0, -17.0]);
    let a = Tensor::from_vec(vec![1i32 << 30, 3], [1, 2], &cpu()).unwrap();
    let b = Tensor::from_vec(vec![4i32, 5], [2, 1], &cpu()).unwrap();
    expect(&matmul(&a, &b).unwrap(), &[1, 1], &[15.0]);
}

// e1 = torch.arange(24.).reshape(2,3,4) - 10; e2 = torch.arange(40.).reshape(2,4,5) % 6 - 2
// sq = torch.arange(9.).reshape(3,3); then torch.einsum(eq, ...) for each equation below.
#[test]
fn einsum_matches_pytorch() {
    let e1 = arange(&[2, 3, 4], -10.0);
    let e2 = host(&arange(&[2, 4, 5], 0.0), |v| pymod(v, 6.0) - 2.0);
    let sq = arange(&[3, 3], 0.0);
    let ein = |eq: &str, ops: &[&Tensor]| einsum(eq, ops).unwrap();
    #[rustfmt::skip]
    let bik = [
        -30.0, -10.0, 4.0, 12.0, -22.0, -14.0, -2.0, 4.0, 4.0, -14.0, 2.0, 6.0, 4.0, -4.0, -6.0,
        4.0, -12.0, 2.0, 16.0, 18.0, 4.0, -20.0, 10.0, 40.0, 34.0, 4.0, -28.0, 18.0, 64.0, 50.0,
    ];
    expect(&ein("bij,bjk->bik", &[&e1, &e2]), &[2, 3, 5], &bik);
    #[rustfmt::skip]
    let kib = [
        -30.0, 4.0, -14.0, 4.0, 2.0, 4.0, -10.0, -12.0, -2.0, -20.0, 6.0, -28.0, 4.0, 2.0, 4.0,
        10.0, 4.0, 18.0, 12.0, 16.0, 4.0, 40.0, -4.0, 64.0, -22.0, 18.0, -14.0, 34.0, -6.0, 50.0,
    ];
    expect(&ein("bij,bjk->kib", &[&e1, &e2]), &[5, 3, 2], &kib);
    expect(&ein("ii", &[&sq]), &[], &[12.0]);
    expect(&ein("ii->i", &[&sq]), &[3], &[0.0, 4.0, 8.0]);
    expect(&ein("ij->", &[&sq]), &[], &[36.0]);
    expect(
        &ein("ji", &[&sq]),
        &[3, 3],
        &[0.0, 3.0, 6.0, 1.0, 4.0, 7.0, 2.0, 5.0, 8.0],
    );
    expect(
        &ein(
            "i,j",
            &[&f32s(&[1., 2.], &[2]), &f32s(&[3., -1., 0.5], &[3])],
        ),
        &[2, 3],
        &[3.0, -1.0, 0.5, 6.0, -2.0, 1.0],
    );
    expect(
        &ein("...ij,...jk", &[&e1, &arange(&[4, 2], 0.0)]),
        &[2, 3, 2],
        &[
            -92.0, -126.0, -44.0, -62.0, 4.0, 2.0, 52.0, 66.0, 100.0, 130.0, 148.0, 194.0,
        ],
    );
    expect(
        &ein("bij,j->i", &[&e1, &f32s(&[1., -1., 2., 0.], &[4])]),
        &[3],
        &[-10.0, 6.0, 22.0],
    );
    expect(
        &ein("ij,jk,kl->il", &[&sq, &sq, &f32s(&[1., 0., -1.], &[3, 1])]),
        &[3, 1],
        &[-6.0, -24.0, -42.0],
    );
    let ones = |s: &[usize]| Tensor::ones(s, DType::F32, &cpu()).unwrap();
    expect(
        &ein("bA,Ab", &[&ones(&[2, 3]), &ones(&[3, 2])]),
        &[],
        &[6.0],
    );
    expect(
        &ein("bA", &[&arange(&[2, 3], 0.0)]),
        &[3, 2],
        &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0],
    );
    expect(
        &ein("i,i->i", &[&f32s(&[2.], &[1]), &f32s(&[1., 2., 3.], &[3])]),
        &[3],
        &[2.0, 4.0, 6.0],
    );
    expect(
        &ein(" i i j -> j ", &[&arange(&[3, 3, 2], 0.0)]),
        &[2],
        &[24.0, 27.0],
    );
    // A permutation gets its own storage.
    let p = ein("ij->ji", &[&sq]);
    assert!(!p.shares_storage(&sq) && p.is_contiguous());
}

// ---- bad input -------------------------------------------------------------------------------

#[test]
fn bad_shapes_and_dtypes_are_errors_naming_them() {
    let t = |s: &[usize]| Tensor::zeros(s, DType::F32, &cpu()).unwrap();
    let e = err_text(matmul(&t(&[2, 3]), &t(&[4, 5])));
    assert!(e.contains("[2, 3]") && e.contains("[4, 5]"), "{e}");
    let e = err_text(matmul(&t(&[3]), &t(&[4])));
    assert!(e.contains("[3]") && e.contains("[4]"), "{e}");
    let e = err_text(matmul(&t(&[2, 2, 3, 4]), &t(&[5, 4, 6])));
    assert!(e.contains("[2, 2, 3, 4]") && e.contains("[5, 4, 6]"), "{e}");
    let e = err_text(matmul(&t(&[]), &t(&[2])));
    assert!(e.contains("[]") && e.contains("[2]"), "{e}");
    let e = err_text(matmul(&t(&[2]), &t(&[])));
    assert!(e.contains("at least 1 dim"), "{e}");
    let e = err_text(bmm(&t(&[2, 3]), &t(&[3, 2])));
    assert!(e.contains("3-D") && e.contains("[2, 3]"), "{e}");
    let e = err_text(bmm(&t(&[2, 2, 3]), &t(&[3, 3, 2])));
    assert!(e.contains("batch") && e.contains("[3, 3, 2]"), "{e}");
    let e = err_text(mm(&t(&[2, 2, 3]), &t(&[3, 2])));
    assert!(e.contains("2-D") && e.contains("[2, 2, 3]"), "{e}");
    let e = err_text(dot(&t(&[2, 2]), &t(&[2])));
    assert!(e.contains("1-D") && e.contains("[2, 2]"), "{e}");
    let e = err_text(linear(&t(&[2, 3]), &t(&[4, 2]), None));
    assert!(e.contains("[2, 3]") && e.contains("[4, 2]"), "{e}");
    let e = err_text(linear(&t(&[2, 3]), &t(&[4, 3]), Some(&t(&[3]))));
    assert!(e.contains("bias [3]") && e.contains("[2, 4]"), "{e}");
    let d = Tensor::zeros([3, 2], DType::F64, &cpu()).unwrap();
    let e = err_text(matmul(&t(&[2, 3]), &d));
    assert!(
        e.contains("f32") && e.contains("f64") && e.contains("[3, 2]"),
        "{e}"
    );
    let e = err_text(einsum("ij,jk", &[&t(&[2, 3]), &d]));
    assert!(e.contains("f32") && e.contains("f64"), "{e}");
    let bools = Tensor::zeros([2, 2], DType::Bool, &cpu()).unwrap();
    let e = err_text(matmul(&bools, &bools));
    assert!(e.contains("bool"), "{e}");
}

#[test]
fn malformed_einsum_equations_are_errors() {
    let t = |s: &[usize]| Tensor::zeros(s, DType::F32, &cpu()).unwrap();
    let (a, b, v) = (t(&[2, 3]), t(&[4, 2]), t(&[2]));
    let cases: [(&str, Vec<&Tensor>, &[&str]); 10] = [
        (
            "ij,jk->ik",
            vec![&a, &b],
            &["subscript j", "[2, 3]", "[4, 2]"],
        ),
        ("ii", vec![&a], &["repeated", "[2, 3]"]),
        ("ij->ii", vec![&a], &["more than once"]),
        ("ij->k", vec![&a], &["subscript k"]),
        ("ijk", vec![&a], &["[2, 3]", "3 subscripts"]),
        ("ij,jk", vec![&a], &["2 operand terms", "1 operands"]),
        ("i$j", vec![&a], &["index 1", "'$'"]),
        ("i->i->i", vec![&v], &["index 4"]),
        ("i..j", vec![&a], &["'...'"]),
        ("ij->...ij", vec![&a], &["'...'"]),
    ];
    for (eq, ops, needles) in cases {
        let e = err_text(einsum(eq, &ops));
        for n in needles {
            assert!(e.contains(n), "{eq}: {e:?} lacks {n:?}");
        }
    }
    assert!(einsum("i", &[]).is_err());
}

// ---- precision and XLA -----------------------------------------------------------------------

#[test]
fn precision_reaches_every_dot_general() {
    assert_eq!(matmul_precision(), Precision::Default);
    set_matmul_precision(Precision::Highest);
    let op = Matmul::new(ProductKind::Matmul);
    set_matmul_precision(Precision::Default);
    assert_eq!(op.precision, Precision::Highest);
    assert_eq!(matmul_precision(), Precision::Default);
    let ins = [
        (
            TensorType::new(&[2, 3, 4], DType::BF16),
            Layout::contiguous(&[2, 3, 4]),
        ),
        (
            TensorType::new(&[2, 4, 5], DType::BF16),
            Layout::contiguous(&[2, 4, 5]),
        ),
    ];
    let metas: Vec<Meta> = ins
        .iter()
        .map(|(t, _)| Meta::new(&t.dims, t.dtype))
        .collect();
    let outs = op.infer(&metas).unwrap();
    let text = module_for(&op, &ins, &outs).unwrap();
    assert!(text.contains("precision HIGHEST"), "{text}");
    assert!(!text.contains("precision DEFAULT"), "{text}");
    // 16-bit operands multiply in f32.
    assert!(text.contains("-> tensor<2x3x5xf32>"), "{text}");
}

#[test]
fn xla_agrees_with_the_cpu_on_edge_cases() {
    let Some(dev) = pjrt("xla_agrees_with_the_cpu_on_edge_cases") else {
        return;
    };
    let mut g = Generator::new(3);
    let mut r = |s: &[usize], d: DType| {
        g.randn(s, DType::F64, &cpu())
            .unwrap()
            .mul(3.0)
            .unwrap()
            .to_dtype(d)
            .unwrap()
    };
    type Case = (&'static str, Vec<Tensor>);
    let cases: Vec<Case> = vec![
        (
            "matmul",
            vec![r(&[0, 3], DType::F32), r(&[3, 4], DType::F32)],
        ),
        (
            "matmul",
            vec![r(&[2, 0], DType::F32), r(&[0, 3], DType::F32)],
        ),
        (
            "matmul",
            vec![r(&[3, 1, 2, 5], DType::BF16), r(&[4, 5, 2], DType::BF16)],
        ),
        (
            "matmul",
            vec![r(&[2, 5], DType::I8), r(&[3, 5, 2], DType::I8)],
        ),
        ("matmul", vec![r(&[7], DType::U8), r(&[2, 7, 3], DType::U8)]),
        (
            "linear",
            vec![
                r(&[4], DType::F16),
                r(&[3, 4], DType::F16),
                r(&[1], DType::F16),
            ],
        ),
        (
            "einsum:...i,...i->...",
            vec![r(&[2, 1, 3], DType::F32), r(&[4, 3], DType::F32)],
        ),
        (
            "einsum:iij,j,k->ik",
            vec![
                r(&[2, 2, 3], DType::I64),
                r(&[3], DType::I64),
                r(&[2], DType::I64),
            ],
        ),
        (
            "einsum:ab,ab->",
            vec![r(&[3, 1], DType::F64), r(&[3, 4], DType::F64)],
        ),
    ];
    for (what, ins) in cases {
        let run = |ins: &[Tensor]| -> Tensor {
            let refs: Vec<&Tensor> = ins.iter().collect();
            match what {
                "matmul" => matmul(refs[0], refs[1]).unwrap(),
                "linear" => linear(refs[0], refs[1], refs.get(2).copied()).unwrap(),
                _ => einsum(&what["einsum:".len()..], &refs).unwrap(),
            }
        };
        let on_cpu = run(&ins);
        let moved: Vec<Tensor> = ins.iter().map(|t| t.to_device(&dev).unwrap()).collect();
        let on_xla = run(&moved);
        assert_close(what, &on_cpu, &on_xla, 1e-5).unwrap();
    }
}

test_device!(
    /// `cdist` and `pdist` at PyTorch's values for several `p` (a zero distance included), and
    /// their gradients (zero at a zero distance):
    ///
    /// ```python
    /// x1 = torch.tensor([[0., 1.], [2., -1.], [1., 1.]], dtype=torch.float64, requires_grad=True)
    /// x2 = torch.tensor([[1., 1.], [0., 0.]], dtype=torch.float64, requires_grad=True)
    /// torch.cdist(x1, x2, p)   # p = 2, 1, 0, inf, 3
    /// (torch.cdist(x1, x2) * torch.tensor([[1., 2.], [3., 4.], [5., 6.]])).sum().backward()
    /// x = torch.tensor([[0., 1.], [2., -1.], [1., 1.], [0., 1.]], dtype=torch.float64, requires_grad=True)
    /// torch.pdist(x), torch.pdist(x, 1)
    /// (torch.pdist(x) * torch.arange(1., 7.)).sum().backward()
    /// torch.cdist(torch.zeros(2, 3, 4), torch.zeros(1, 5, 4)).shape   # [2, 3, 5]
    /// ```
    cdist_and_pdist_match_pytorch,
    |dev| {
        use crate::common::{check_near, vals};
        use tpu_ops::autograd::AutogradOps;
        use tpu_ops::ops::linalg::{cdist, pdist};
        use tpu_ops::ops::reduce::ReduceOps;
        let t = |v: Vec<f64>, shape: &[usize]| {
            Tensor::from_vec(v, shape, &cpu()).unwrap().to_device(&dev).unwrap()
        };
        let x1 = t(vec![0., 1., 2., -1., 1., 1.], &[3, 2]);
        let x2 = t(vec![1., 1., 0., 0.], &[2, 2]);
        let s5 = 5f64.sqrt();
        let cases = [
            (2.0, vec![1.0, 1.0, s5, s5, 0.0, 2f64.sqrt()]),
            (1.0, vec![1.0, 1.0, 3.0, 3.0, 0.0, 2.0]),
            (0.0, vec![1.0, 1.0, 2.0, 2.0, 0.0, 2.0]),
            (f64::INFINITY, vec![1.0, 1.0, 2.0, 2.0, 0.0, 1.0]),
            (3.0, vec![1.0, 1.0, 2.080083823051904, 2.080083823051904, 0.0, 1.2599210498948732]),
        ];
        for (p, want) in cases {
            let d = cdist(&x1, &x2, p).unwrap();
            assert_eq!(d.shape(), [3, 2]);
            check_near(&format!("cdist p={p}"), &vals(&d), &want, 1e-12);
        }
        let a = x1.requires_grad_(true).unwrap();
        let b = x2.requires_grad_(true).unwrap();
        let w = t(vec![1., 2., 3., 4., 5., 6.], &[3, 2]);
        cdist(&a, &b, 2.0).unwrap().mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        check_near("cdist x1 grad", &vals(&a.grad().unwrap()), &[-1.0, 2.0, 4.919349550499537, -4.47213595499958, 4.242640687119285, 4.242640687119285], 1e-12);
        check_near("cdist x2 grad", &vals(&b.grad().unwrap()), &[-0.34164078649987384, 2.6832815729997477, -7.820349451118949, -4.453786305119453], 1e-12);

        let x = t(vec![0., 1., 2., -1., 1., 1., 0., 1.], &[4, 2]);
        let r8 = 8f64.sqrt();
        check_near("pdist", &vals(&pdist(&x, 2.0).unwrap()), &[r8, 1.0, 0.0, s5, r8, 1.0], 1e-12);
        check_near("pdist p=1", &vals(&pdist(&x, 1.0).unwrap()), &[4.0, 1.0, 0.0, 3.0, 4.0, 1.0], 1e-12);
        let xg = x.requires_grad_(true).unwrap();
        let w = t(vec![1., 2., 3., 4., 5., 6.], &[6]);
        pdist(&xg, 2.0).unwrap().mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        check_near(
            "pdist grad",
            &vals(&xg.grad().unwrap()),
            &[-2.7071067811865475, 0.7071067811865475, 6.031495069119117, -7.820349451118949, 6.2111456180001685, 3.5777087639996634, -9.535533905932738, 3.5355339059327373],
            1e-12,
        );

        let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &dev).unwrap();
        assert_eq!(cdist(&z(&[2, 3, 4]), &z(&[1, 5, 4]), 2.0).unwrap().shape(), [2, 3, 5]);
        assert_eq!(pdist(&z(&[1, 3]), 2.0).unwrap().shape(), [0]);
        assert!(cdist(&z(&[3, 4]), &z(&[3, 5]), 2.0).is_err());
        assert!(cdist(&z(&[3, 4]), &z(&[3, 4]), -1.0).is_err());
        assert!(pdist(&z(&[2, 3, 4]), 2.0).is_err());
    }
);

/// The fused SGD update, new and in place, against the ops it stands for (`w - (a · b) * s`,
/// the same bits), on the one-pass kernel (`k` of one block) and past it; the in-place form
/// declines where `w` shares its storage with an operand or is not contiguous, and both refuse
/// mismatched shapes and dtypes.
#[test]
fn sub_scaled_product_new_and_in_place_keep_the_ops_bits() {
    // The level held: other tests of this binary cap it for a while, and the fused update
    // and the ops it stands for must run at the same level to give the same bits.
    with_level(detected_level(), || {
        use tpu_ops::ops::linalg::{sub_scaled_product, sub_scaled_product_};
        let dev = cpu();
        let bits = |t: &Tensor| -> Vec<u32> {
            t.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        let mut g = Generator::new(11);
        for (m, k, n) in [(40, 64, 72), (9, 1500, 33), (1, 16, 8)] {
            let a = g.randn([m, k], DType::F32, &dev).unwrap();
            let b = g.randn([k, n], DType::F32, &dev).unwrap();
            let w = g.randn([m, n], DType::F32, &dev).unwrap();
            let s = Tensor::scalar(0.01f32, &dev).unwrap();
            let want = bits(&w.sub(&a.matmul(&b).unwrap().mul(&s).unwrap()).unwrap());
            assert_eq!(
                bits(&sub_scaled_product(&w, &a, &b, &s).unwrap()),
                want,
                "{m}x{k}x{n}"
            );
            assert!(sub_scaled_product_(&w, &a, &b, &s).unwrap(), "{m}x{k}x{n}");
            assert_eq!(bits(&w), want, "{m}x{k}x{n}");
        }
        // `w` read as the product's own operand.
        let w = g.randn([16, 16], DType::F32, &dev).unwrap();
        let a = g.randn([16, 16], DType::F32, &dev).unwrap();
        let s = Tensor::scalar(0.5f32, &dev).unwrap();
        let before = bits(&w);
        assert!(!sub_scaled_product_(&w, &a, &w, &s).unwrap());
        assert_eq!(bits(&w), before);
        // A transposed `w` is not written in place.
        let wt = w.t().unwrap();
        assert!(!sub_scaled_product_(&wt, &a, &a, &s).unwrap());
        assert_eq!(bits(&w), before);
        let bad = Tensor::zeros([3, 3], DType::F32, &dev).unwrap();
        assert!(sub_scaled_product_(&bad, &a, &a, &s).is_err());
        assert!(sub_scaled_product(&bad, &a, &a, &s).is_err());
        let ints = Tensor::zeros([16, 16], DType::I32, &dev).unwrap();
        assert!(sub_scaled_product_(&ints, &a, &a, &s).is_err());
    });
}
