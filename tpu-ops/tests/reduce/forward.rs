//! Reductions and scans: property tests against naive reference kernels (f64, or wrapping i64
//! for integers) on random shapes with 0-sized dims, random dims and keepdim, permuted and
//! sliced views, for every dtype; values computed by PyTorch for the subtle cases, checked on the
//! CPU and through XLA when the PJRT plugin loads; errors for bad input; and the parallel paths
//! on a 4-thread device.

use crate::common::{agrees, test_device};
use proptest::prelude::*;
use tpu_ops::prelude::*;
use tpu_ops::testing::epsilon;
use tpu_tensor::tpu_runtime::CpuOptions;
use tpu_tensor::{DType, Device, Error, Result, Tensor};

// ---- reading results and references ---------------------------------------------------------

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_device(&Device::cpu())
        .and_then(|t| t.to_dtype(DType::F64))
        .and_then(|t| t.to_vec::<f64>())
        .expect("readable tensor")
}

fn i64s(t: &Tensor) -> Vec<i64> {
    t.to_device(&Device::cpu())
        .and_then(|t| t.to_dtype(DType::I64))
        .and_then(|t| t.to_vec::<i64>())
        .expect("readable tensor")
}

/// Reference values rounded to `dtype` the way a kernel's result is.
fn rounded(v: &[f64], dtype: DType) -> Vec<f64> {
    let t = Tensor::from_vec(v.to_vec(), [v.len()], &Device::cpu()).expect("tensor");
    f64s(&t.to_dtype(dtype).expect("cast"))
}

/// Relative precision of the type a dtype accumulates in (f32 for the 16-bit floats).
fn acc_eps(d: DType) -> f64 {
    if d == DType::F64 {
        epsilon(DType::F64)
    } else {
        epsilon(DType::F32)
    }
}

/// Floats against references: NaN matches NaN, infinities match exactly, finite values within
/// `tol[i]` plus two units in the last place of the result's dtype.
fn assert_floats(what: &str, got: &Tensor, want: &[f64], tol: &[f64]) {
    let g = f64s(got);
    assert_eq!(g.len(), want.len(), "{what}: element count");
    let e = epsilon(got.dtype());
    for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
        let ok = agrees(a, b, tol[i] + 2.0 * e * b.abs());
        assert!(
            ok,
            "{what}: element {i} of {:?} {}: got {a}, want {b} (tolerance {})",
            got.shape(),
            got.dtype(),
            tol[i]
        );
    }
}

/// Exact comparison where NaN matches NaN (and -0 matches 0).
fn assert_exact(what: &str, got: &Tensor, want: &[f64]) {
    let g = f64s(got);
    assert_eq!(g.len(), want.len(), "{what}: element count");
    for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
        assert!(
            a == b || (a.is_nan() && b.is_nan()),
            "{what}: element {i} of {:?} {}: got {a}, want {b}",
            got.shape(),
            got.dtype()
        );
    }
}

fn assert_err<T>(r: Result<T>, needle: &str) -> Error {
    match r {
        Ok(_) => panic!("expected an error mentioning {needle:?}"),
        Err(e) => {
            assert!(
                e.to_string().contains(needle),
                "error {e:?} does not mention {needle:?}"
            );
            e
        }
    }
}

fn mask_of(dims: &[i64], rank: usize) -> Vec<bool> {
    if rank == 0 {
        return Vec::new();
    }
    let mut m = vec![dims.is_empty(); rank];
    for &d in dims {
        m[d.rem_euclid(rank as i64) as usize] = true;
    }
    m
}

fn out_shape(shape: &[usize], mask: &[bool], keepdim: bool) -> Vec<usize> {
    shape
        .iter()
        .zip(mask)
        .filter_map(|(&s, &m)| {
            if !m {
                Some(s)
            } else if keepdim {
                Some(1)
            } else {
                None
            }
        })
        .collect()
}

/// The elements each output element reduces, in logical row-major order (row-major `vals`).
fn groups<T: Copy>(vals: &[T], shape: &[usize], mask: &[bool]) -> Vec<Vec<T>> {
    let kept: Vec<usize> = (0..shape.len()).filter(|&d| !mask[d]).collect();
    let n: usize = kept.iter().map(|&d| shape[d]).product();
    let mut g = vec![Vec::new(); n];
    let mut idx = vec![0usize; shape.len()];
    for &v in vals {
        let o = kept.iter().fold(0, |acc, &d| acc * shape[d] + idx[d]);
        g[o].push(v);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    g
}

fn abs_sum(g: &[f64]) -> f64 {
    g.iter().map(|v| v.abs()).sum()
}

/// The first NaN, else the first extreme element, and its index.
fn arg_ref(g: &[f64], max: bool) -> (f64, i64) {
    let mut best = 0;
    for (i, &b) in g.iter().enumerate().skip(1) {
        let a = g[best];
        if a.is_nan() {
            break;
        }
        if b.is_nan() || (max && b > a) || (!max && b < a) {
            best = i;
        }
    }
    (g[best], best as i64)
}

// ---- random cases ----------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum View {
    Plain,
    /// The input is a permuted view of a dense tensor.
    Permuted(Vec<usize>),
    /// The input takes every other element of this dim of a dense tensor.
    Sliced(usize),
}

#[derive(Clone, Debug)]
struct Case {
    shape: Vec<usize>,
    view: View,
    seed: u64,
    dims: Vec<i64>,
    keepdim: bool,
    dtype: DType,
    /// Values are in `[-amp, amp]` (halved for floats).
    amp: u64,
    /// Floats include NaN and infinities.
    special: bool,
}

fn next(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

fn case(dtypes: &'static [DType], amp: u64) -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(0usize..=4, 0..=4),
        any::<u64>(),
        any::<u32>(),
        any::<bool>(),
        0..dtypes.len(),
        any::<bool>(),
        0u8..3,
    )
        .prop_map(move |(shape, seed, pick, keepdim, di, special, vk)| {
            let rank = shape.len();
            let mut s = seed;
            let view = match vk {
                1 if rank >= 2 => {
                    let mut p: Vec<usize> = (0..rank).collect();
                    for i in (1..rank).rev() {
                        p.swap(i, next(&mut s) as usize % (i + 1));
                    }
                    View::Permuted(p)
                }
                2 if rank >= 1 => View::Sliced(next(&mut s) as usize % rank),
                _ => View::Plain,
            };
            let dims = (0..rank)
                .filter(|d| pick >> d & 1 == 1)
                .map(|d| {
                    if pick >> (8 + d) & 1 == 1 {
                        d as i64 - rank as i64
                    } else {
                        d as i64
                    }
                })
                .collect();
            Case {
                shape,
                view,
                seed,
                dims,
                keepdim,
                dtype: dtypes[di],
                amp,
                special,
            }
        })
}

impl Case {
    fn input(&self) -> Tensor {
        let rank = self.shape.len();
        let base_shape: Vec<usize> = match &self.view {
            View::Plain => self.shape.clone(),
            View::Permuted(p) => {
                let mut b = vec![0; rank];
                for (i, &d) in p.iter().enumerate() {
                    b[d] = self.shape[i];
                }
                b
            }
            View::Sliced(d) => {
                let mut b = self.shape.clone();
                b[*d] *= 2;
                b
            }
        };
        let n: usize = base_shape.iter().product();
        let mut s = self.seed;
        let float = self.dtype.is_float();
        let vals: Vec<f64> = (0..n)
            .map(|_| {
                let r = next(&mut s);
                let v = (r % (2 * self.amp + 1)) as f64 - self.amp as f64;
                if float && self.special && (r >> 8).is_multiple_of(6) {
                    [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][(r >> 12) as usize % 3]
                } else if float {
                    v / 2.0
                } else {
                    v
                }
            })
            .collect();
        let base = Tensor::from_vec(vals, &base_shape[..], &Device::cpu())
            .and_then(|t| t.to_dtype(self.dtype))
            .expect("input");
        let x = match &self.view {
            View::Plain => base,
            View::Permuted(p) => base.permute(&p[..]).expect("permute"),
            View::Sliced(d) => base.slice(*d, .., 2).expect("slice"),
        };
        assert_eq!(x.shape(), &self.shape[..]);
        x
    }

    fn mask(&self) -> Vec<bool> {
        mask_of(&self.dims, self.shape.len())
    }

    /// One dim for the single-dim ops.
    fn dim(&self) -> i64 {
        self.dims.first().copied().unwrap_or(0)
    }
}

const ALL: &[DType] = &DType::ALL;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---- property tests --------------------------------------------------------------------------

fn check_sum_mean(c: &Case) {
    let x = c.input();
    let mask = c.mask();
    let shape = out_shape(x.shape(), &mask, c.keepdim);
    let s = x.sum(&c.dims, c.keepdim).expect("sum");
    assert_eq!(s.shape(), &shape[..]);
    if !c.dtype.is_float() {
        assert_eq!(s.dtype(), DType::I64);
        let want: Vec<i64> = groups(&i64s(&x), x.shape(), &mask)
            .iter()
            .map(|g| g.iter().fold(0i64, |a, &v| a.wrapping_add(v)))
            .collect();
        assert_eq!(i64s(&s), want, "sum of {c:?}");
        let e = assert_err(x.mean(&c.dims, c.keepdim), "not supported");
        assert!(matches!(e, Error::UnsupportedDType { .. }));
        return;
    }
    assert_eq!(s.dtype(), c.dtype);
    let g = groups(&f64s(&x), x.shape(), &mask);
    let eps = acc_eps(c.dtype);
    let tol: Vec<f64> = g
        .iter()
        .map(|g| 4.0 * eps * g.len() as f64 * abs_sum(g))
        .collect();
    let sums: Vec<f64> = g.iter().map(|g| g.iter().sum()).collect();
    assert_floats("sum", &s, &rounded(&sums, c.dtype), &tol);
    let m = x.mean(&c.dims, c.keepdim).expect("mean");
    assert_eq!((m.shape(), m.dtype()), (&shape[..], c.dtype));
    let means: Vec<f64> = g
        .iter()
        .map(|g| g.iter().sum::<f64>() / g.len() as f64)
        .collect();
    let tol: Vec<f64> = tol
        .iter()
        .zip(&g)
        .map(|(t, g)| t / g.len().max(1) as f64)
        .collect();
    assert_floats("mean", &m, &rounded(&means, c.dtype), &tol);
}

fn check_prod(c: &Case) {
    let x = c.input();
    let mask = c.mask();
    let p = x.prod(&c.dims, c.keepdim).expect("prod");
    assert_eq!(p.shape(), &out_shape(x.shape(), &mask, c.keepdim)[..]);
    if !c.dtype.is_float() {
        assert_eq!(p.dtype(), DType::I64);
        let want: Vec<i64> = groups(&i64s(&x), x.shape(), &mask)
            .iter()
            .map(|g| g.iter().fold(1i64, |a, &v| a.wrapping_mul(v)))
            .collect();
        assert_eq!(i64s(&p), want, "prod of {c:?}");
        return;
    }
    let g = groups(&f64s(&x), x.shape(), &mask);
    let want: Vec<f64> = g.iter().map(|g| g.iter().product()).collect();
    let tol: Vec<f64> = g
        .iter()
        .zip(&want)
        .map(|(g, w)| 4.0 * acc_eps(c.dtype) * g.len() as f64 * w.abs())
        .collect();
    assert_floats("prod", &p, &rounded(&want, c.dtype), &tol);
}

fn check_extremes(c: &Case) {
    let x = c.input();
    let rank = x.rank();
    let vals = f64s(&x);
    let mask = c.mask();
    let empty = |mask: &[bool]| mask.iter().zip(x.shape()).any(|(&m, &s)| m && s == 0);
    for max in [true, false] {
        let r = if max {
            x.amax(&c.dims, c.keepdim)
        } else {
            x.amin(&c.dims, c.keepdim)
        };
        if empty(&mask) {
            assert_err(r, &format!("{:?}", x.shape()));
        } else {
            let r = r.expect("amax");
            assert_eq!(r.dtype(), c.dtype);
            assert_eq!(r.shape(), &out_shape(x.shape(), &mask, c.keepdim)[..]);
            let want: Vec<f64> = groups(&vals, x.shape(), &mask)
                .iter()
                .map(|g| arg_ref(g, max).0)
                .collect();
            assert_exact(if max { "amax" } else { "amin" }, &r, &want);
        }
        // Along one dim, with indices.
        let dmask = mask_of(&[c.dim()], rank);
        let shape = out_shape(x.shape(), &dmask, c.keepdim);
        let r = if max {
            x.max_dim(c.dim(), c.keepdim)
        } else {
            x.min_dim(c.dim(), c.keepdim)
        };
        let a = if max {
            x.argmax(Some(c.dim()), c.keepdim)
        } else {
            x.argmin(Some(c.dim()), c.keepdim)
        };
        if empty(&dmask) {
            assert_err(r, &format!("{:?}", x.shape()));
            assert!(a.is_err());
        } else {
            let (v, i) = r.expect("max_dim");
            assert_eq!((v.shape(), v.dtype()), (&shape[..], c.dtype));
            assert_eq!((i.shape(), i.dtype()), (&shape[..], DType::I64));
            let refs: Vec<(f64, i64)> = groups(&vals, x.shape(), &dmask)
                .iter()
                .map(|g| arg_ref(g, max))
                .collect();
            let want_v: Vec<f64> = refs.iter().map(|r| r.0).collect();
            let want_i: Vec<i64> = refs.iter().map(|r| r.1).collect();
            assert_exact("max_dim values", &v, &want_v);
            assert_eq!(i64s(&i), want_i, "max_dim indices ({max}) of {c:?}");
            if c.dtype == DType::Bool {
                assert_err(a, "not supported");
            } else {
                assert_eq!(i64s(&a.expect("argmax")), want_i, "argmax of {c:?}");
            }
        }
        // Over the flattened tensor.
        let a = if max {
            x.argmax(None, c.keepdim)
        } else {
            x.argmin(None, c.keepdim)
        };
        if c.dtype == DType::Bool {
            assert!(a.is_err());
        } else if x.numel() == 0 {
            assert_err(a, &format!("{:?}", x.shape()));
        } else {
            let a = a.expect("argmax(None)");
            let shape = if c.keepdim { vec![1; rank] } else { vec![] };
            assert_eq!(a.shape(), &shape[..]);
            assert_eq!(i64s(&a), vec![arg_ref(&vals, max).1], "flat arg of {c:?}");
        }
    }
}

fn check_stats(c: &Case, correction: f64, p: f64) {
    let x = c.input();
    let mask = c.mask();
    let shape = out_shape(x.shape(), &mask, c.keepdim);
    let vals = f64s(&x);
    let g = groups(&vals, x.shape(), &mask);
    let eps = acc_eps(c.dtype);
    let nanmax = |g: &[f64]| {
        g.iter()
            .fold(f64::NEG_INFINITY, |a, &v| arg_ref(&[a, v], true).0)
    };
    // logsumexp takes every dtype: integers and bool give f32.
    let l = x.logsumexp(&c.dims, c.keepdim).expect("logsumexp");
    let out = if c.dtype.is_float() {
        c.dtype
    } else {
        DType::F32
    };
    assert_eq!((l.shape(), l.dtype()), (&shape[..], out));
    let want: Vec<f64> = g
        .iter()
        .map(|g| {
            let m = nanmax(g);
            let m = if m.is_infinite() { 0.0 } else { m };
            g.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m
        })
        .collect();
    let tol: Vec<f64> = g
        .iter()
        .map(|g| 8.0 * acc_eps(out) * (g.len() as f64 + 1.0 + nanmax(g).abs()))
        .collect();
    assert_floats("logsumexp", &l, &rounded(&want, out), &tol);
    if !c.dtype.is_float() {
        assert_err(x.var(&c.dims, correction, c.keepdim), "not supported");
        assert_err(x.std(&c.dims, correction, c.keepdim), "not supported");
        assert_err(x.norm(p, &c.dims, c.keepdim), "not supported");
        return;
    }
    // var and std.
    let var: Vec<f64> = g
        .iter()
        .map(|g| {
            let n = g.len() as f64;
            let m = g.iter().sum::<f64>() / n;
            g.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (n - correction).max(0.0)
        })
        .collect();
    let var_tol: Vec<f64> = g
        .iter()
        .map(|g| {
            let n = g.len() as f64;
            16.0 * eps * (n + 1.0) * g.iter().map(|v| v * v).sum::<f64>()
                / (n - correction).max(1.0)
        })
        .collect();
    let v = x.var(&c.dims, correction, c.keepdim).expect("var");
    assert_eq!((v.shape(), v.dtype()), (&shape[..], c.dtype));
    assert_floats("var", &v, &rounded(&var, c.dtype), &var_tol);
    let s = x.std(&c.dims, correction, c.keepdim).expect("std");
    let std: Vec<f64> = var.iter().map(|v| v.sqrt()).collect();
    // |sqrt(a) - sqrt(b)| <= sqrt(|a - b|).
    let std_tol: Vec<f64> = var_tol.iter().map(|t| t.sqrt()).collect();
    assert_floats("std", &s, &rounded(&std, c.dtype), &std_tol);
    // norm.
    let r = x.norm(p, &c.dims, c.keepdim);
    let no_identity = p == f64::INFINITY || p < 0.0;
    if no_identity && mask.iter().zip(x.shape()).any(|(&m, &s)| m && s == 0) {
        assert_err(r, &format!("{:?}", x.shape()));
        return;
    }
    let r = r.expect("norm");
    assert_eq!((r.shape(), r.dtype()), (&shape[..], c.dtype));
    let want: Vec<f64> = g
        .iter()
        .map(|g| {
            let mags = g.iter().map(|v| v.abs());
            if p == f64::INFINITY {
                nanmax(&mags.collect::<Vec<_>>())
            } else if p == f64::NEG_INFINITY {
                let m: Vec<f64> = mags.collect();
                arg_ref(&m, false).0
            } else if p == 0.0 {
                g.iter().filter(|&&v| v != 0.0).count() as f64
            } else {
                mags.map(|v| v.powf(p)).sum::<f64>().powf(1.0 / p)
            }
        })
        .collect();
    let tol: Vec<f64> = g
        .iter()
        .zip(&want)
        .map(|(g, w)| 16.0 * eps * (g.len() as f64 + 1.0) * w.abs())
        .collect();
    assert_floats(&format!("norm p={p}"), &r, &rounded(&want, c.dtype), &tol);
}

fn check_logic(c: &Case) {
    let x = c.input();
    let mask = c.mask();
    let g = groups(&f64s(&x), x.shape(), &mask);
    for all in [true, false] {
        let r = if all {
            x.all(&c.dims, c.keepdim)
        } else {
            x.any(&c.dims, c.keepdim)
        }
        .expect("all/any");
        assert_eq!(r.dtype(), DType::Bool);
        assert_eq!(r.shape(), &out_shape(x.shape(), &mask, c.keepdim)[..]);
        let want: Vec<f64> = g
            .iter()
            .map(|g| {
                let b = if all {
                    g.iter().all(|&v| v != 0.0)
                } else {
                    g.iter().any(|&v| v != 0.0)
                };
                b as u8 as f64
            })
            .collect();
        assert_exact(if all { "all" } else { "any" }, &r, &want);
    }
}

/// Walks the lines along `dim` of a row-major `shape`, calling `f(i, previous_i)` in order.
fn along(shape: &[usize], dim: usize, mut f: impl FnMut(usize, Option<usize>)) {
    let stride: usize = shape[dim + 1..].iter().product();
    let n: usize = shape.iter().product();
    for i in 0..n {
        let coord = (i / stride) % shape[dim];
        f(i, (coord > 0).then(|| i - stride));
    }
}

fn check_scans(c: &Case) {
    let x = c.input();
    let rank = x.rank();
    let shape: Vec<usize> = if rank == 0 {
        vec![1]
    } else {
        x.shape().to_vec()
    };
    let dim = c.dim().rem_euclid(rank.max(1) as i64) as usize;
    for prod in [false, true] {
        let r = if prod {
            x.cumprod(c.dim())
        } else {
            x.cumsum(c.dim())
        }
        .expect("scan");
        assert_eq!(r.shape(), x.shape());
        if !c.dtype.is_float() {
            assert_eq!(r.dtype(), DType::I64);
            let v = i64s(&x);
            let mut want = vec![0i64; v.len()];
            along(&shape, dim, |i, prev| {
                want[i] = match prev {
                    None => v[i],
                    Some(j) if prod => want[j].wrapping_mul(v[i]),
                    Some(j) => want[j].wrapping_add(v[i]),
                }
            });
            assert_eq!(i64s(&r), want, "scan (prod {prod}) of {c:?}");
            continue;
        }
        assert_eq!(r.dtype(), c.dtype);
        let v = f64s(&x);
        let mut want = vec![0.0; v.len()];
        let mut scale = vec![0.0; v.len()];
        along(&shape, dim, |i, prev| {
            (want[i], scale[i]) = match prev {
                None => (v[i], v[i].abs()),
                Some(j) if prod => (want[j] * v[i], (want[j] * v[i]).abs() * 4.0),
                Some(j) => (want[j] + v[i], scale[j] + v[i].abs()),
            }
        });
        let tol: Vec<f64> = scale.iter().map(|s| 8.0 * acc_eps(c.dtype) * s).collect();
        assert_floats("scan", &r, &rounded(&want, c.dtype), &tol);
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn sum_and_mean_match_reference(c in case(ALL, 6)) {
        check_sum_mean(&c);
    }

    #[test]
    fn prod_matches_reference(c in case(ALL, 3)) {
        check_prod(&c);
    }

    #[test]
    fn max_min_and_their_indices_match_reference(c in case(ALL, 4)) {
        check_extremes(&c);
    }

    #[test]
    fn var_std_logsumexp_norm_match_reference(
        c in case(ALL, 6),
        correction in prop_oneof![Just(0.0), Just(1.0), Just(2.0), Just(0.5)],
        p in prop_oneof![
            Just(2.0), Just(1.0), Just(f64::INFINITY), Just(f64::NEG_INFINITY),
            Just(0.0), Just(0.5), Just(3.0), Just(-1.0)
        ],
    ) {
        check_stats(&c, correction, p);
    }

    #[test]
    fn all_and_any_match_reference(c in case(ALL, 1)) {
        check_logic(&c);
    }

    #[test]
    fn cumsum_and_cumprod_match_reference(c in case(ALL, 3)) {
        check_scans(&c);
    }
}

// ---- values from PyTorch ---------------------------------------------------------------------

fn t(vals: &[f64], shape: &[usize], dtype: DType, dev: &Device) -> Tensor {
    Tensor::from_vec(vals.to_vec(), shape, &Device::cpu())
        .and_then(|x| x.to_dtype(dtype))
        .and_then(|x| x.to_device(dev))
        .expect("tensor")
}

/// `got` has `dtype` and `shape` and holds `want` (floats to 1e-6 relative; NaN, infinities
/// and integers exactly).
fn expect(what: &str, got: &Tensor, dtype: DType, shape: &[usize], want: &[f64]) {
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    assert_eq!(got.shape(), shape, "{what}: shape");
    let tol: Vec<f64> = want.iter().map(|w| 1e-6 * w.abs()).collect();
    assert_floats(what, got, want, &tol);
}

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

test_device!(var_and_std_corrections_match_pytorch, |dev| {
    use DType::*;
    let x = t(&[1., 2., 4., 7., 3., -1., 0.5, 2.], &[2, 4], F32, &dev);
    // x = torch.tensor([[1., 2., 4., 7.], [3., -1., 0.5, 2.]])
    // torch.var(x, dim=1, correction=1) -> [7.0, 3.0625]
    expect(
        "var c1",
        &x.var(&[1], 1.0, false).unwrap(),
        F32,
        &[2],
        &[7.0, 3.0625],
    );
    // torch.var(x, dim=1, correction=0, keepdim=True) -> [[5.25], [2.296875]]
    let v = x.var(&[1], 0.0, true).unwrap();
    expect("var c0", &v, F32, &[2, 1], &[5.25, 2.296875]);
    // torch.var(x, dim=0, correction=2) -> [inf, inf, inf, inf]  (divisor max(0, 2 - 2))
    expect(
        "var c2",
        &x.var(&[0], 2.0, false).unwrap(),
        F32,
        &[4],
        &[INF; 4],
    );
    // torch.std(x, dim=(0, 1), correction=1, keepdim=True) -> [[2.4339489936828613]]
    let s = x.std(&[0, 1], 1.0, true).unwrap();
    expect("std all", &s, F32, &[1, 1], &[2.4339489936828613]);
    // torch.var(x, dim=1, correction=1.5) -> [8.399999618530273, 3.674999952316284]
    let v = x.var(&[1], 1.5, false).unwrap();
    expect(
        "var c1.5",
        &v,
        F32,
        &[2],
        &[8.399999618530273, 3.674999952316284],
    );
    // torch.std(torch.tensor([2.5], dtype=torch.float64), dim=0, correction=1) -> nan
    let one = t(&[2.5], &[1], F64, &dev);
    expect(
        "std of one",
        &one.std(&[0], 1.0, false).unwrap(),
        F64,
        &[],
        &[NAN],
    );
});

test_device!(argmax_ties_and_nan_match_pytorch, |dev| {
    use DType::*;
    // a = torch.tensor([1., 3., 3., nan, 2., nan])
    let a = t(&[1., 3., 3., NAN, 2., NAN], &[6], F32, &dev);
    // a.argmax() -> 3; a.argmin() -> 3; a.max(0) -> (nan, 3)
    expect(
        "argmax nan",
        &a.argmax(None, false).unwrap(),
        I64,
        &[],
        &[3.],
    );
    expect(
        "argmin nan",
        &a.argmin(None, false).unwrap(),
        I64,
        &[],
        &[3.],
    );
    let (v, i) = a.max_dim(0, false).unwrap();
    expect("max nan", &v, F32, &[], &[NAN]);
    expect("max nan index", &i, I64, &[], &[3.]);
    // b = torch.tensor([[1, 5, 5], [2, 2, 0]], dtype=torch.int32)
    let b = t(&[1., 5., 5., 2., 2., 0.], &[2, 3], I32, &dev);
    // b.argmax(1) -> [1, 0]; b.argmin(1) -> [0, 2]; b.argmax() -> 1
    expect(
        "argmax ties",
        &b.argmax(Some(1), false).unwrap(),
        I64,
        &[2],
        &[1., 0.],
    );
    expect(
        "argmin ties",
        &b.argmin(Some(-1), false).unwrap(),
        I64,
        &[2],
        &[0., 2.],
    );
    expect(
        "argmax flat",
        &b.argmax(None, false).unwrap(),
        I64,
        &[],
        &[1.],
    );
    // b.max(0, keepdim=True) -> values [[2, 5, 5]] (int32), indices [[1, 0, 0]]
    let (v, i) = b.max_dim(0, true).unwrap();
    expect("max i32", &v, I32, &[1, 3], &[2., 5., 5.]);
    expect("max i32 index", &i, I64, &[1, 3], &[1., 0., 0.]);
    // torch.tensor([0.5, -1., 0.5], dtype=torch.float16).argmax() -> 0
    let h = t(&[0.5, -1., 0.5], &[3], F16, &dev);
    expect("f16 tie", &h.argmax(None, false).unwrap(), I64, &[], &[0.]);
    // torch.tensor([-0., 0.]).max(0) -> (-0., 0)
    let z = t(&[-0.0, 0.0], &[2], F32, &dev);
    let (v, i) = z.max_dim(0, false).unwrap();
    assert!(f64s(&v)[0].is_sign_negative(), "max of [-0, 0] on {dev}");
    expect("signed zero index", &i, I64, &[], &[0.]);
    // torch.tensor([True, False]).min(0) -> (False, 1)
    let c = t(&[1., 0.], &[2], Bool, &dev);
    let (v, i) = c.min_dim(0, false).unwrap();
    expect("bool min", &v, Bool, &[], &[0.]);
    expect("bool min index", &i, I64, &[], &[1.]);
});

test_device!(nan_wins_every_extreme_on_every_device, |dev| {
    use DType::*;
    // x = torch.tensor([[1, nan, 3], [2, 0, -inf]])
    let x = t(&[1., NAN, 3., 2., 0., -INF], &[2, 3], F32, &dev);
    // x.amax(0) -> [2.0, nan, 3.0]; x.amin(1) -> [nan, -inf]
    expect(
        "amax",
        &x.amax(&[0], false).unwrap(),
        F32,
        &[3],
        &[2., NAN, 3.],
    );
    expect(
        "amin",
        &x.amin(&[1], false).unwrap(),
        F32,
        &[2],
        &[NAN, -INF],
    );
    // x.max(1) -> values [nan, 2.], indices [1, 0]
    let (v, i) = x.max_dim(1, false).unwrap();
    expect("max values", &v, F32, &[2], &[NAN, 2.]);
    expect("max indices", &i, I64, &[2], &[1., 0.]);
    // x.min(0) -> values [1., nan, -inf], indices [0, 0, 1]
    let (v, i) = x.min_dim(0, false).unwrap();
    expect("min values", &v, F32, &[3], &[1., NAN, -INF]);
    expect("min indices", &i, I64, &[3], &[0., 0., 1.]);
    // x.argmax(1) -> [1, 0]; x.argmin(0) -> [0, 0, 1]
    expect(
        "argmax",
        &x.argmax(Some(1), false).unwrap(),
        I64,
        &[2],
        &[1., 0.],
    );
    expect(
        "argmin",
        &x.argmin(Some(0), false).unwrap(),
        I64,
        &[3],
        &[0., 0., 1.],
    );
});

// Integer max and min reach the dtype's bounds on every device: the lowering must start from a
// value no element is below (above), which a narrower literal of i64::MIN would not be.
test_device!(integer_extremes_start_from_the_dtypes_bounds, |dev| {
    use DType::*;
    for (dtype, lo, hi) in [
        (I8, -128., 127.),
        (I32, -2147483648., 2147483647.),
        (I64, -9007199254740992., 9007199254740992.),
    ] {
        // x = torch.tensor([[-5, -3, -9], [4, 7, 2], [lo, lo, lo], [hi, hi, hi]], dtype=dtype)
        let x = t(
            &[-5., -3., -9., 4., 7., 2., lo, lo, lo, hi, hi, hi],
            &[4, 3],
            dtype,
            &dev,
        );
        // x.amax(1) -> [-3, 7, lo, hi]; x.amin(1) -> [-9, 2, lo, hi]
        let what = format!("{dtype:?}");
        expect(
            &what,
            &x.amax(&[1], false).unwrap(),
            dtype,
            &[4],
            &[-3., 7., lo, hi],
        );
        expect(
            &what,
            &x.amin(&[1], false).unwrap(),
            dtype,
            &[4],
            &[-9., 2., lo, hi],
        );
        // x.argmax(1) -> [1, 1, 0, 0]; x.argmin(1) -> [2, 2, 0, 0]
        let argmax = x.argmax(Some(1), false).unwrap();
        expect(&what, &argmax, I64, &[4], &[1., 1., 0., 0.]);
        let argmin = x.argmin(Some(1), false).unwrap();
        expect(&what, &argmin, I64, &[4], &[2., 2., 0., 0.]);
        let (v, i) = x.max_dim(1, false).unwrap();
        expect(&what, &v, dtype, &[4], &[-3., 7., lo, hi]);
        expect(&what, &i, I64, &[4], &[1., 1., 0., 0.]);
    }
    // u8: x = torch.tensor([[255, 254], [0, 3]], dtype=torch.uint8); x.amin(1) -> [254, 0]
    let x = t(&[255., 254., 0., 3.], &[2, 2], U8, &dev);
    expect(
        "u8 amin",
        &x.amin(&[1], false).unwrap(),
        U8,
        &[2],
        &[254., 0.],
    );
    expect(
        "u8 amax",
        &x.amax(&[1], false).unwrap(),
        U8,
        &[2],
        &[255., 3.],
    );
});

test_device!(logsumexp_with_infinities_matches_pytorch, |dev| {
    use DType::*;
    // l = torch.tensor([[-inf, -inf], [0., -inf], [inf, 1.], [1., 2.], [nan, 1.]])
    // torch.logsumexp(l, 1) -> [-inf, 0.0, inf, 2.3132617473602295, nan]
    let l = t(
        &[-INF, -INF, 0., -INF, INF, 1., 1., 2., NAN, 1.],
        &[5, 2],
        F32,
        &dev,
    );
    let r = l.logsumexp(&[1], false).unwrap();
    expect(
        "lse",
        &r,
        F32,
        &[5],
        &[-INF, 0.0, INF, 2.3132617473602295, NAN],
    );
    // torch.logsumexp(torch.tensor([1, 2, 3]), 0) -> 3.4076058864593506 (float32)
    let i = t(&[1., 2., 3.], &[3], I64, &dev);
    expect(
        "lse i64",
        &i.logsumexp(&[0], false).unwrap(),
        F32,
        &[],
        &[3.4076058864593506],
    );
    // torch.zeros(2, 0).logsumexp(1) -> [-inf, -inf]
    let e = t(&[], &[2, 0], F32, &dev);
    expect(
        "lse empty",
        &e.logsumexp(&[1], false).unwrap(),
        F32,
        &[2],
        &[-INF; 2],
    );
});

test_device!(norm_orders_match_pytorch, |dev| {
    use DType::*;
    // n = torch.tensor([3., -4., 0., 1.5]); torch.linalg.vector_norm(n, p)
    let n = t(&[3., -4., 0., 1.5], &[4], F32, &dev);
    for (p, want) in [
        (2.0, 5.220153331756592),
        (1.0, 8.5),
        (INF, 4.0),
        (-INF, 0.0),
        (0.0, 3.0),
        (0.5, 24.56982421875),
        (3.0, 4.552874565124512),
        (-1.0, 0.0),
    ] {
        let r = n.norm(p, &[], false).unwrap();
        // XLA's pow differs from libm's by an ulp or so.
        let tol = [4e-7 * want];
        assert_eq!(r.shape(), &[] as &[usize]);
        assert_floats(&format!("norm p={p} on {dev}"), &r, &[want], &tol);
    }
    // m = torch.tensor([[3., -4., 0.], [1., 2., -2.]])
    let m = t(&[3., -4., 0., 1., 2., -2.], &[2, 3], F32, &dev);
    // torch.linalg.vector_norm(m, 2, dim=1, keepdim=True) -> [[5.], [3.]]
    expect(
        "norm 2 d1",
        &m.norm(2.0, &[1], true).unwrap(),
        F32,
        &[2, 1],
        &[5., 3.],
    );
    // torch.linalg.vector_norm(m, inf, dim=0) -> [3., 4., 2.]
    expect(
        "norm inf d0",
        &m.norm(INF, &[0], false).unwrap(),
        F32,
        &[3],
        &[3., 4., 2.],
    );
    // torch.linalg.vector_norm(m, 0, dim=0) -> [2., 2., 1.]
    expect(
        "norm 0 d0",
        &m.norm(0.0, &[-2], false).unwrap(),
        F32,
        &[3],
        &[2., 2., 1.],
    );
});

test_device!(integer_and_bool_result_dtypes_match_pytorch, |dev| {
    use DType::*;
    // torch.tensor([100, 100, 100], dtype=torch.int8).cumsum(0) -> [100, 200, 300] (int64)
    let a = t(&[100., 100., 100.], &[3], I8, &dev);
    expect(
        "cumsum i8",
        &a.cumsum(0).unwrap(),
        I64,
        &[3],
        &[100., 200., 300.],
    );
    // torch.tensor([200, 100], dtype=torch.uint8).cumsum(0) -> [200, 300] (int64)
    let u = t(&[200., 100.], &[2], U8, &dev);
    expect(
        "cumsum u8",
        &u.cumsum(-1).unwrap(),
        I64,
        &[2],
        &[200., 300.],
    );
    // torch.tensor([200, 100], dtype=torch.uint8).sum() -> 300 (int64)
    expect("sum u8", &u.sum_all().unwrap(), I64, &[], &[300.]);
    // torch.tensor([True, False, True]).cumsum(0) -> [1, 1, 2] (int64)
    let b = t(&[1., 0., 1.], &[3], Bool, &dev);
    expect(
        "cumsum bool",
        &b.cumsum(0).unwrap(),
        I64,
        &[3],
        &[1., 1., 2.],
    );
    // torch.tensor([3, -2, 4], dtype=torch.int32).cumprod(0) -> [3, -6, -24] (int64)
    let c = t(&[3., -2., 4.], &[3], I32, &dev);
    expect(
        "cumprod i32",
        &c.cumprod(0).unwrap(),
        I64,
        &[3],
        &[3., -6., -24.],
    );
    // bb = torch.tensor([[True, False, True], [True, True, True]])
    let bb = t(&[1., 0., 1., 1., 1., 1.], &[2, 3], Bool, &dev);
    // bb.sum(1) -> [2, 3]; bb.sum() -> 5; bb.prod(0) -> [1, 0, 1] (all int64)
    expect(
        "sum bool",
        &bb.sum(&[1], false).unwrap(),
        I64,
        &[2],
        &[2., 3.],
    );
    expect("sum bool all", &bb.sum_all().unwrap(), I64, &[], &[5.]);
    expect(
        "prod bool",
        &bb.prod(&[0], false).unwrap(),
        I64,
        &[3],
        &[1., 0., 1.],
    );
    // torch.tensor([1, 2], dtype=torch.int32).amax(0) -> 2 (int32)
    let i = t(&[1., 2.], &[2], I32, &dev);
    expect("amax i32", &i.amax(&[0], false).unwrap(), I32, &[], &[2.]);
});

test_device!(half_types_accumulate_in_f32_as_pytorch, |dev| {
    use DType::*;
    let tiny = 2f64.powi(-8);
    // torch.tensor([1.0, 2**-8, 2**-8], dtype=torch.bfloat16).sum() -> 1.0078125
    // (adding in bf16 would round each 1 + 2**-8 back to 1)
    let b = t(&[1.0, tiny, tiny], &[3], BF16, &dev);
    let s = b.sum_all().unwrap();
    assert_eq!((s.dtype(), s.shape()), (BF16, &[] as &[usize]));
    assert_exact(&format!("sum bf16 on {dev}"), &s, &[1.0078125]);
    // torch.tensor([1.0, 2**-8, 2**-8], dtype=torch.bfloat16).cumsum(0) -> [1., 1., 1.0078125]
    let c = b.cumsum(0).unwrap();
    assert_eq!(c.dtype(), BF16);
    assert_exact(&format!("cumsum bf16 on {dev}"), &c, &[1., 1., 1.0078125]);
    // torch.tensor([2048., 1., 1.], dtype=torch.float16).sum() -> 2050.
    let h = t(&[2048., 1., 1.], &[3], F16, &dev);
    let s = h.sum(&[0], false).unwrap();
    assert_eq!(s.dtype(), F16);
    assert_exact(&format!("sum f16 on {dev}"), &s, &[2050.]);
    // torch.tensor([1.0, 2**-8, 2**-8, 0.], dtype=torch.bfloat16).mean() -> 0.251953125
    let m = t(&[1.0, tiny, tiny, 0.], &[4], BF16, &dev);
    let r = m.mean_all().unwrap();
    assert_eq!(r.dtype(), BF16);
    assert_exact(&format!("mean bf16 on {dev}"), &r, &[0.251953125]);
});

test_device!(empty_reductions_match_pytorch, |dev| {
    use DType::*;
    // e = torch.zeros(2, 0)
    let e = t(&[], &[2, 0], F32, &dev);
    // e.sum(1) -> [0., 0.]; e.mean(1) -> [nan, nan]; e.prod(1) -> [1., 1.]
    expect("sum", &e.sum(&[1], false).unwrap(), F32, &[2], &[0., 0.]);
    expect(
        "mean",
        &e.mean(&[1], false).unwrap(),
        F32,
        &[2],
        &[NAN, NAN],
    );
    expect("prod", &e.prod(&[1], false).unwrap(), F32, &[2], &[1., 1.]);
    // e.var(1) -> [nan, nan]; torch.linalg.vector_norm(e, 2, 1) -> [0., 0.]
    expect(
        "var",
        &e.var(&[1], 1.0, false).unwrap(),
        F32,
        &[2],
        &[NAN, NAN],
    );
    expect(
        "norm",
        &e.norm(2.0, &[1], false).unwrap(),
        F32,
        &[2],
        &[0., 0.],
    );
    // e.all(1) -> [True, True]; e.any(1) -> [False, False]
    expect("all", &e.all(&[1], false).unwrap(), Bool, &[2], &[1., 1.]);
    expect("any", &e.any(&[1], false).unwrap(), Bool, &[2], &[0., 0.]);
    // e.max(0) -> values [] and indices []; torch.zeros(2, 0).cumsum(1) -> shape (2, 0)
    let (v, i) = e.max_dim(0, false).unwrap();
    expect("max over a non-empty dim", &v, F32, &[0], &[]);
    expect("its indices", &i, I64, &[0], &[]);
    expect("cumsum", &e.cumsum(1).unwrap(), F32, &[2, 0], &[]);
    // a = torch.zeros(0, 5, dtype=torch.int32).t()  (an empty view, not a dense buffer)
    // a.sum(1) -> [0, 0, 0, 0, 0] (int64); a.prod(1) -> [1, 1, 1, 1, 1] (int64)
    // a.amax(0) -> tensor([], dtype=torch.int32); a.all(1) -> [True] * 5
    let a = t(&[], &[0, 5], I32, &dev).t().unwrap();
    expect("int sum", &a.sum(&[1], false).unwrap(), I64, &[5], &[0.; 5]);
    expect(
        "int prod",
        &a.prod(&[1], false).unwrap(),
        I64,
        &[5],
        &[1.; 5],
    );
    expect("int amax", &a.amax(&[0], false).unwrap(), I32, &[0], &[]);
    expect(
        "int all",
        &a.all(&[1], false).unwrap(),
        Bool,
        &[5],
        &[1.; 5],
    );
});

// ---- bad input -------------------------------------------------------------------------------

#[test]
fn bad_input_is_an_error_naming_the_shape() {
    let cpu = Device::cpu();
    let x = Tensor::ones([2, 3], DType::F32, &cpu).unwrap();
    let e = assert_err(x.sum(&[2], false), "[2, 3]");
    assert!(matches!(e, Error::DimOutOfRange { .. }));
    assert_err(x.amax(&[-3], true), "[2, 3]");
    assert_err(x.max_dim(2, false), "[2, 3]");
    assert_err(x.argmax(Some(-3), false), "[2, 3]");
    assert_err(x.cumsum(2), "[2, 3]");
    let e = assert_err(x.sum(&[0, -2], false), "[2, 3]");
    assert!(e.to_string().contains("more than once"), "{e}");
    assert_err(x.var(&[1, 1], 1.0, false), "[2, 3]");
    // torch.tensor(3.).sum([0, -1]) -> "dim 0 appears multiple times"
    let s = Tensor::scalar(3f32, &cpu).unwrap();
    assert_err(s.sum(&[0, -1], false), "[]");
    assert_eq!(f64s(&s.sum(&[-1], true).unwrap()), vec![3.0]);

    let i = Tensor::ones([2, 3], DType::I64, &cpu).unwrap();
    for r in [
        i.mean(&[], false),
        i.var(&[0], 1.0, false),
        i.std(&[0], 1.0, false),
        i.norm(2.0, &[0], false),
    ] {
        let e = assert_err(r, "[2, 3]");
        assert!(matches!(e, Error::UnsupportedDType { .. }), "{e}");
    }
    let b = Tensor::ones([4], DType::Bool, &cpu).unwrap();
    assert!(matches!(
        assert_err(b.argmax(None, false), "[4]"),
        Error::UnsupportedDType { .. }
    ));
    assert_err(b.mean(&[0], false), "[4]");

    // Reductions without an identity refuse empty extents.
    let e = Tensor::zeros([2, 0], DType::F32, &cpu).unwrap();
    assert_err(e.max_dim(1, false), "[2, 0]");
    assert_err(e.min_dim(-1, true), "[2, 0]");
    assert_err(e.max_all(), "[2, 0]");
    assert_err(e.amin(&[0, 1], false), "[2, 0]");
    assert_err(e.argmax(None, false), "[2, 0]");
    assert_err(e.argmin(Some(1), false), "[2, 0]");
    assert_err(e.norm(f64::INFINITY, &[1], false), "[2, 0]");
    assert_err(e.norm(-2.0, &[], false), "[2, 0]");
    // ... but not empty outputs of non-empty extents.
    assert_eq!(e.amax(&[0], false).unwrap().shape(), &[0]);
    assert_eq!(
        e.norm(f64::NEG_INFINITY, &[0], true).unwrap().shape(),
        &[1, 0]
    );
}

// ---- the parallel paths ----------------------------------------------------------------------

#[test]
fn parallel_kernels_match_references() {
    let dev = Device::new_cpu(&CpuOptions {
        num_threads: Some(4),
        memory_limit: None,
    })
    .unwrap();
    // Few long rows (split into pieces) and one long column block (split into row pieces), with
    // many ties so that merging pieces must keep the first index.
    let n = 120_000;
    let vals: Vec<i64> = (0..3 * n).map(|i| (i as i64 * 7919) % 5).collect();
    let rows = Tensor::from_vec(vals.clone(), [3, n], &dev).unwrap();
    let cols = Tensor::from_vec(vals.clone(), [n, 3], &dev).unwrap();
    for (x, dim) in [(&rows, 1), (&cols, 0), (&rows.t().unwrap(), 0)] {
        let mask = mask_of(&[dim], 2);
        let g = groups(&i64s(x), x.shape(), &mask);
        let sums: Vec<i64> = g.iter().map(|g| g.iter().sum()).collect();
        assert_eq!(i64s(&x.sum(&[dim], false).unwrap()), sums);
        let gf: Vec<Vec<f64>> = g
            .iter()
            .map(|g| g.iter().map(|&v| v as f64).collect())
            .collect();
        for max in [true, false] {
            let want: Vec<i64> = gf.iter().map(|g| arg_ref(g, max).1).collect();
            let got = if max {
                x.argmax(Some(dim), false)
            } else {
                x.argmin(Some(dim), false)
            };
            assert_eq!(i64s(&got.unwrap()), want, "arg (max {max}) over dim {dim}");
        }
        // Floats: the sum of a long f32 row stays accurate (cascaded), var and logsumexp agree.
        let xf = x.to_dtype(DType::F32).unwrap().mul(0.1).unwrap();
        let gf: Vec<Vec<f64>> = groups(&f64s(&xf), x.shape(), &mask);
        let s = xf.sum(&[dim], false).unwrap();
        let want: Vec<f64> = gf.iter().map(|g| g.iter().sum()).collect();
        let tol: Vec<f64> = gf.iter().map(|g| 1e-6 * abs_sum(g)).collect();
        assert_floats("parallel f32 sum", &s, &want, &tol);
        let v = xf.var(&[dim], 1.0, false).unwrap();
        let want: Vec<f64> = gf
            .iter()
            .map(|g| {
                let m = g.iter().sum::<f64>() / g.len() as f64;
                g.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (g.len() - 1) as f64
            })
            .collect();
        assert_floats("parallel var", &v, &want, &[1e-5; 3]);
        let l = xf.logsumexp(&[dim], false).unwrap();
        let want: Vec<f64> = gf
            .iter()
            .map(|g| g.iter().map(|x| x.exp()).sum::<f64>().ln())
            .collect();
        assert_floats("parallel logsumexp", &l, &want, &[1e-5; 3]);
    }
    // Many rows, and columns wider than one block.
    let m: Vec<i64> = (0..400 * 300).map(|i| (i as i64 * 31) % 17 - 8).collect();
    let x = Tensor::from_vec(m, [400, 300], &dev).unwrap();
    for dim in [0, 1] {
        let g = groups(&i64s(&x), x.shape(), &mask_of(&[dim], 2));
        let want: Vec<i64> = g.iter().map(|g| g.iter().sum()).collect();
        assert_eq!(i64s(&x.sum(&[dim], false).unwrap()), want);
        let want: Vec<i64> = g.iter().map(|g| *g.iter().max().unwrap()).collect();
        assert_eq!(i64s(&x.amax(&[dim], false).unwrap()), want);
    }
    let c = x.cumsum(1).unwrap();
    let v = i64s(&x);
    let mut want = vec![0i64; v.len()];
    along(&[400, 300], 1, |i, prev| {
        want[i] = prev.map_or(v[i], |j| want[j] + v[i])
    });
    assert_eq!(i64s(&c), want);
    let b = x.gt(0).unwrap();
    let any: Vec<f64> = groups(&f64s(&b), b.shape(), &[true, false])
        .iter()
        .map(|g| g.iter().any(|&v| v != 0.0) as u8 as f64)
        .collect();
    assert_exact("parallel any", &b.any(&[0], false).unwrap(), &any);
}

#[test]
fn small_dense_fast_paths_give_the_general_paths_bits() {
    use crate::common::same_as_general;
    use tpu_ops::ops::reduce::{ReduceKind, reduce};
    let mut g = tpu_tensor::Generator::new(9);
    let kinds = [
        ReduceKind::Sum,
        ReduceKind::Mean,
        ReduceKind::Amax,
        ReduceKind::Amin,
    ];
    // Rows shorter and longer than the loops' lanes and cascade blocks, NaNs and infinities,
    // every dim list the fast path takes and some it leaves, with and without keepdim.
    for shape in [
        vec![],
        vec![1],
        vec![4],
        vec![7],
        vec![3, 17],
        vec![2, 3, 65],
        vec![5, 257],
        vec![1000],
    ] {
        let x = g.randn(&shape[..], DType::F32, &Device::cpu()).unwrap();
        let mut v = x.to_vec::<f32>().unwrap();
        if v.len() > 3 {
            v[1] = f32::NAN;
            v[2] = f32::INFINITY;
        }
        let special = Tensor::from_slice(&v, &shape[..], &Device::cpu()).unwrap();
        let r = shape.len() as i64;
        for input in [&x, &special] {
            same_as_general(&format!("max of {shape:?}"), || input.max_all());
            same_as_general(&format!("min of {shape:?}"), || input.min_all());
            for kind in kinds {
                for dims in [vec![], vec![-1], vec![r - 1], vec![0], vec![-1, 0], vec![r]] {
                    for keepdim in [false, true] {
                        same_as_general(&format!("{kind:?} {dims:?} of {shape:?}"), || {
                            reduce(input, kind, &dims, keepdim)
                        });
                    }
                }
            }
        }
    }
    // Views, other dtypes and gradients take the general path.
    let m = Tensor::new([[1.0f32, 2.0], [3.0, 4.0]], &Device::cpu()).unwrap();
    let by_col = m.t().unwrap().sum(&[-1], false).unwrap();
    assert_eq!(by_col.to_vec::<f32>().unwrap(), [4.0, 6.0]);
    let w = m.requires_grad_(true).unwrap();
    w.mean(&[-1], false)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), [0.5; 4]);
}
