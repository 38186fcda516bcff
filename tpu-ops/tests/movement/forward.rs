//! The movement ops: against naive references on `Vec`s (proptest, CPU), against values printed
//! by PyTorch (CPU and, when a plugin is found, XLA), and on bad input.

use crate::common::{Rng, devices, numel, test_device, vals as read};
use proptest::collection::vec;
use proptest::prelude::*;
use tpu_ops::ops::movement::{MovementOps, PadMode, ScatterReduction, cat, embedding, stack};
use tpu_tensor::tpu_runtime::f16;
use tpu_tensor::{DType, Device, Element, Tensor};

// ---- helpers -----------------------------------------------------------------------------------

const DTYPES: [DType; 6] = [
    DType::I64,
    DType::I32,
    DType::F32,
    DType::F16,
    DType::U8,
    DType::Bool,
];

fn unravel(mut i: usize, s: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; s.len()];
    for d in (0..s.len()).rev() {
        if s[d] > 0 {
            idx[d] = i % s[d];
            i /= s[d];
        }
    }
    idx
}

fn ravel(idx: &[usize], s: &[usize]) -> usize {
    idx.iter().zip(s).fold(0, |a, (&i, &n)| a * n + i)
}

/// A CPU tensor of `shape` holding `vals` (row-major) as `dtype`. With `strided`, the tensor is
/// a non-contiguous view: a permutation of one stored in reverse dim order, or (1-D) every
/// other element of a longer one.
fn make(vals: &[f64], shape: &[usize], dtype: DType, strided: bool) -> Tensor {
    let cpu = Device::cpu();
    if !strided || shape.is_empty() {
        return Tensor::from_slice(vals, shape, &cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
    }
    if shape.len() == 1 {
        let mut phys = vec![77.0; 2 * vals.len()];
        for (i, &v) in vals.iter().enumerate() {
            phys[2 * i] = v;
        }
        return Tensor::from_slice(&phys, [phys.len()], &cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
            .slice(0, .., 2)
            .unwrap();
    }
    let rshape: Vec<usize> = shape.iter().rev().copied().collect();
    let phys: Vec<f64> = (0..vals.len())
        .map(|p| {
            let q: Vec<usize> = unravel(p, &rshape).into_iter().rev().collect();
            vals[ravel(&q, shape)]
        })
        .collect();
    let perm: Vec<usize> = (0..shape.len()).rev().collect();
    Tensor::from_slice(&phys, &rshape[..], &cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .permute(&perm[..])
        .unwrap()
}

/// The dim of a gather/scatter into `xshape` (`dim_sel` modulo the rank), and the shape of its
/// index: `iraw[dim]` along that dim, and at most `xshape[k]` elsewhere.
fn index_shape(xshape: &[usize], iraw: &[usize], dim_sel: usize) -> (usize, Vec<usize>) {
    let dim = dim_sel % xshape.len();
    let ishape = (0..xshape.len())
        .map(|k| {
            if k == dim {
                iraw[k]
            } else {
                iraw[k] % (xshape[k] + 1)
            }
        })
        .collect();
    (dim, ishape)
}

const REDUCTIONS: [ScatterReduction; 5] = [
    ScatterReduction::Sum,
    ScatterReduction::Prod,
    ScatterReduction::Mean,
    ScatterReduction::Amax,
    ScatterReduction::Amin,
];

/// PyTorch's `scatter_reduce` of the values that meet at one position (small non-negative
/// integers) in `dtype`: u8 wraps, bool sums and maxes are `or`, products and mins `and`, an
/// integer mean is floored and a float one is divided in f32 (then rounded to f16).
fn reduce_ref(vals: &[f64], reduce: ScatterReduction, dtype: DType) -> f64 {
    let wrap = |v: f64| match dtype {
        DType::U8 => (v as i64 & 0xff) as f64,
        DType::Bool => (v != 0.0) as u8 as f64,
        _ => v,
    };
    let max = vals.iter().copied().fold(f64::MIN, f64::max);
    let min = vals.iter().copied().fold(f64::MAX, f64::min);
    match reduce {
        ScatterReduction::Sum => wrap(vals.iter().sum()),
        ScatterReduction::Prod => wrap(vals.iter().product()),
        ScatterReduction::Amax => max,
        ScatterReduction::Amin => min,
        ScatterReduction::Mean => {
            let (sum, n) = (wrap(vals.iter().sum()), vals.len() as f64);
            match dtype {
                DType::F32 => (sum as f32 / n as f32) as f64,
                DType::F16 => f16::from_f32(sum as f32 / n as f32).to_f64(),
                _ => (sum / n).floor(),
            }
        }
    }
}

/// `n` positions in `0..below`, drawn from `rng`.
fn positions(rng: &mut Rng, n: usize, below: usize) -> Vec<usize> {
    (0..n).map(|_| rng.below(below)).collect()
}

/// What every reference test draws besides its shapes: the dtype, whether the inputs are
/// strided views, and the seed of their values.
#[derive(Clone, Debug)]
struct Draw {
    d: DType,
    strided: bool,
    seed: u64,
}

/// [`Draw`]s with a dtype among the first `n` of [`DTYPES`].
fn draws(n: usize) -> impl Strategy<Value = Draw> {
    (0..n, any::<bool>(), any::<u64>()).prop_map(|(dt, strided, seed)| Draw {
        d: DTYPES[dt],
        strided,
        seed,
    })
}

impl Draw {
    /// The stream the case's values come from.
    fn rng(&self) -> Rng {
        Rng::new(self.seed)
    }

    /// An input of `shape` holding the stream's first values (below 100), and those values.
    fn input(&self, shape: &[usize]) -> (Vec<f64>, Tensor) {
        let v = self.rng().values(numel(shape), 100);
        let x = make(&v, shape, self.d, self.strided);
        (v, x)
    }
}

fn index_tensor(vals: &[usize], shape: &[usize], strided: bool) -> Tensor {
    let v: Vec<f64> = vals.iter().map(|&v| v as f64).collect();
    make(&v, shape, DType::I64, strided)
}

/// The elements of `t`, of dtype `T`, copied to the host.
fn host<T: Element>(t: &Tensor) -> Vec<T> {
    t.to_device(&Device::cpu()).unwrap().to_vec::<T>().unwrap()
}

fn read_i64(t: &Tensor) -> Vec<i64> {
    t.to_device(&Device::cpu())
        .unwrap()
        .to_dtype(DType::I64)
        .unwrap()
        .to_vec::<i64>()
        .unwrap()
}

/// What a small non-negative integer becomes in `dtype`, read back as f64.
fn through(v: f64, d: DType) -> f64 {
    if d == DType::Bool {
        (v != 0.0) as u8 as f64
    } else {
        v
    }
}

/// The values of a tensor of `shape` whose element at `idx` is `at(idx)`, in row-major order.
fn reference(shape: &[usize], at: impl Fn(Vec<usize>) -> f64) -> Vec<f64> {
    (0..numel(shape)).map(|o| at(unravel(o, shape))).collect()
}

/// Checks that `out` has `shape` and exactly the values `expect` (see [`same`]).
fn check(out: &Tensor, shape: &[usize], expect: &[f64]) -> Result<(), TestCaseError> {
    prop_assert_eq!(out.shape(), shape);
    prop_assert!(same(&read(out), expect));
    Ok(())
}

/// Exact equality that also matches NaN with NaN and tells -0.0 from 0.0.
fn same(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits())
}

fn t_i64(v: &[i64], shape: &[usize], dev: &Device) -> Tensor {
    Tensor::from_slice(v, shape, &Device::cpu())
        .unwrap()
        .to_device(dev)
        .unwrap()
}

fn t_f32(v: &[f32], shape: &[usize], dev: &Device) -> Tensor {
    Tensor::from_slice(v, shape, &Device::cpu())
        .unwrap()
        .to_device(dev)
        .unwrap()
}

fn err(r: tpu_tensor::Result<Tensor>) -> String {
    match r {
        Ok(t) => panic!("expected an error, got a tensor of shape {:?}", t.shape()),
        Err(e) => e.to_string(),
    }
}

fn has(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "{msg:?} does not mention {p:?}");
    }
}

// ---- naive references on Vecs (CPU, proptest) --------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn cat_matches_reference(
        base in vec(0usize..4, 1..=3),
        sizes in vec(0usize..4, 1..=3),
        dim_sel in 0usize..6,
        draw in draws(6),
    ) {
        let r = base.len();
        let dim = dim_sel % r;
        let d = draw.d;
        let mut rng = draw.rng();
        let mut parts = vec![];
        let mut inputs = vec![];
        for (k, &s) in sizes.iter().enumerate() {
            let mut sh = base.clone();
            sh[dim] = s;
            let v = rng.values(numel(&sh), 100);
            inputs.push(make(&v, &sh, d, draw.strided && k % 2 == 0));
            parts.push((sh, v));
        }
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let dim_arg = if dim_sel >= 3 { dim as i64 - r as i64 } else { dim as i64 };
        let out = cat(&refs, dim_arg).unwrap();
        let mut oshape = base.clone();
        oshape[dim] = sizes.iter().sum();
        let expect = reference(&oshape, |mut idx| {
            let mut k = 0;
            while idx[dim] >= parts[k].0[dim] {
                idx[dim] -= parts[k].0[dim];
                k += 1;
            }
            through(parts[k].1[ravel(&idx, &parts[k].0)], d)
        });
        check(&out, &oshape, &expect)?;
        prop_assert_eq!(out.dtype(), d);
    }

    #[test]
    fn stack_matches_reference(
        shape in vec(0usize..4, 0..=3),
        k in 1usize..4,
        dim_sel in 0usize..4,
        draw in draws(6),
    ) {
        let dim = dim_sel % (shape.len() + 1);
        let d = draw.d;
        let mut rng = draw.rng();
        let vals: Vec<Vec<f64>> = (0..k).map(|_| rng.values(numel(&shape), 100)).collect();
        let ts: Vec<Tensor> = vals
            .iter()
            .enumerate()
            .map(|(i, v)| make(v, &shape, d, draw.strided && i == 0))
            .collect();
        let refs: Vec<&Tensor> = ts.iter().collect();
        let out = stack(&refs, dim).unwrap();
        let mut oshape = shape.clone();
        oshape.insert(dim, k);
        let expect = reference(&oshape, |mut idx| {
            let which = idx.remove(dim);
            through(vals[which][ravel(&idx, &shape)], d)
        });
        check(&out, &oshape, &expect)?;
    }

    #[test]
    fn pad_matches_reference(
        shape in vec(1usize..5, 1..=3),
        mode in 0usize..3,
        pairs in 1usize..4,
        raw in vec(0usize..4, 6),
        mut draw in draws(6),
    ) {
        let r = shape.len();
        let np = pairs.min(r);
        if mode > 0 && draw.d == DType::Bool {
            draw.d = DType::I32;
        }
        let d = draw.d;
        // Reflect padding must stay below the dim's size.
        let pads: Vec<usize> = (0..2 * np)
            .map(|i| if mode == 1 { raw[i] % shape[r - 1 - i / 2] } else { raw[i] })
            .collect();
        let (v, x) = draw.input(&shape);
        let pm = match mode {
            0 => PadMode::Constant(7.into()),
            1 => PadMode::Reflect,
            _ => PadMode::Replicate,
        };
        let out = x.pad(&pads, pm).unwrap();
        let pair = |k: usize| {
            let p = r - 1 - k;
            if p < np { (pads[2 * p], pads[2 * p + 1]) } else { (0, 0) }
        };
        let oshape: Vec<usize> = (0..r).map(|k| shape[k] + pair(k).0 + pair(k).1).collect();
        let expect = reference(&oshape, |idx| {
            let mut src = vec![0; r];
            for k in 0..r {
                let n = shape[k] as i64;
                let i = idx[k] as i64 - pair(k).0 as i64;
                let s = match mode {
                    0 if i < 0 || i >= n => return through(7.0, d),
                    1 if i < 0 => -i,
                    1 if i >= n => 2 * (n - 1) - i,
                    2 => i.clamp(0, n - 1),
                    _ => i,
                };
                src[k] = s as usize;
            }
            through(v[ravel(&src, &shape)], d)
        });
        check(&out, &oshape, &expect)?;
    }

    #[test]
    fn gather_matches_reference(
        xshape in vec(1usize..4, 1..=3),
        iraw in vec(0usize..4, 3),
        dim_sel in 0usize..3,
        draw in draws(6),
    ) {
        let (dim, ishape) = index_shape(&xshape, &iraw, dim_sel);
        let mut rng = draw.rng();
        let v = rng.values(numel(&xshape), 100);
        let ix = positions(&mut rng, numel(&ishape), xshape[dim]);
        let x = make(&v, &xshape, draw.d, draw.strided);
        let index = index_tensor(&ix, &ishape, !draw.strided);
        let out = x.gather(dim, &index).unwrap();
        let expect = reference(&ishape, |mut idx| {
            idx[dim] = ix[ravel(&idx, &ishape)];
            through(v[ravel(&idx, &xshape)], draw.d)
        });
        check(&out, &ishape, &expect)?;
    }

    #[test]
    fn scatter_add_matches_reference(
        xshape in vec(1usize..4, 1..=3),
        iraw in vec(0usize..5, 3),
        extra in vec(0usize..2, 3),
        dim_sel in 0usize..3,
        draw in draws(5),
    ) {
        let (dim, ishape) = index_shape(&xshape, &iraw, dim_sel);
        let sshape: Vec<usize> = ishape.iter().zip(&extra).map(|(i, e)| i + e).collect();
        let mut rng = draw.rng();
        let xv = rng.values(numel(&xshape), 60);
        let sv = rng.values(numel(&sshape), 60);
        let ix = positions(&mut rng, numel(&ishape), xshape[dim]);
        let x = make(&xv, &xshape, draw.d, draw.strided);
        let src = make(&sv, &sshape, draw.d, !draw.strided);
        let index = index_tensor(&ix, &ishape, draw.strided);
        let out = x.scatter_add(dim, &index, &src).unwrap();
        let mut expect = xv.clone();
        for (p, &i) in ix.iter().enumerate() {
            let idx = unravel(p, &ishape);
            let s = sv[ravel(&idx, &sshape)];
            let mut t = idx;
            t[dim] = i;
            expect[ravel(&t, &xshape)] += s;
        }
        if draw.d == DType::U8 {
            expect.iter_mut().for_each(|v| *v = (*v as i64 & 0xff) as f64);
        }
        check(&out, &xshape, &expect)?;
    }

    #[test]
    fn scatter_reduce_matches_reference(
        xshape in vec(1usize..4, 1..=3),
        iraw in vec(0usize..5, 3),
        extra in vec(0usize..2, 3),
        dim_sel in 0usize..3,
        draw in draws(6),
        reduce_sel in 0usize..5,
        include_self in any::<bool>(),
    ) {
        let reduce = REDUCTIONS[reduce_sel];
        let (dim, ishape) = index_shape(&xshape, &iraw, dim_sel);
        let sshape: Vec<usize> = ishape.iter().zip(&extra).map(|(i, e)| i + e).collect();
        let mut rng = draw.rng();
        // Small factors keep products exact in every dtype but u8, which wraps as PyTorch's.
        let high = if reduce == ScatterReduction::Prod { 4 } else { 60 };
        let xv = rng.values(numel(&xshape), high);
        let sv = rng.values(numel(&sshape), high);
        let ix = positions(&mut rng, numel(&ishape), xshape[dim]);
        let x = make(&xv, &xshape, draw.d, draw.strided);
        let src = make(&sv, &sshape, draw.d, !draw.strided);
        let index = index_tensor(&ix, &ishape, draw.strided);
        let out = x.scatter_reduce(dim, &index, &src, reduce, include_self);
        if reduce == ScatterReduction::Mean && draw.d == DType::Bool {
            prop_assert!(out.is_err());
            return Ok(());
        }
        let out = out.unwrap();
        // What meets at each position of x: x's own value (when included) and then the
        // updates in index order.
        let mut met: Vec<Vec<f64>> = vec![Vec::new(); xv.len()];
        for (p, &i) in ix.iter().enumerate() {
            let idx = unravel(p, &ishape);
            let s = through(sv[ravel(&idx, &sshape)], draw.d);
            let mut t = idx;
            t[dim] = i;
            met[ravel(&t, &xshape)].push(s);
        }
        let expect: Vec<f64> = xv
            .iter()
            .zip(&met)
            .map(|(&xe, m)| {
                let xe = through(xe, draw.d);
                if m.is_empty() {
                    return xe;
                }
                let mut vals = if include_self { vec![xe] } else { Vec::new() };
                vals.extend(m);
                reduce_ref(&vals, reduce, draw.d)
            })
            .collect();
        check(&out, &xshape, &expect)?;
    }

    #[test]
    fn index_select_matches_reference(
        shape in vec(1usize..4, 1..=3),
        n in 0usize..5,
        dim_sel in 0usize..6,
        draw in draws(6),
    ) {
        let r = shape.len();
        let dim = dim_sel % r;
        let mut rng = draw.rng();
        let v = rng.values(numel(&shape), 100);
        let ix = positions(&mut rng, n, shape[dim]);
        let x = make(&v, &shape, draw.d, draw.strided);
        let out = x.index_select(dim as i64 - r as i64, &index_tensor(&ix, &[n], draw.strided)).unwrap();
        let mut oshape = shape.clone();
        oshape[dim] = n;
        let expect = reference(&oshape, |mut idx| {
            idx[dim] = ix[idx[dim]];
            through(v[ravel(&idx, &shape)], draw.d)
        });
        check(&out, &oshape, &expect)?;
    }

    #[test]
    fn flip_matches_reference(
        shape in vec(0usize..4, 0..=3),
        mask in vec(any::<bool>(), 3),
        negative in any::<bool>(),
        draw in draws(6),
    ) {
        let r = shape.len();
        let d = draw.d;
        let (v, x) = draw.input(&shape);
        let dims: Vec<usize> = (0..r).filter(|&k| mask[k]).collect();
        let args: Vec<i64> = dims
            .iter()
            .map(|&k| if negative { k as i64 - r as i64 } else { k as i64 })
            .collect();
        let out = x.flip(&args).unwrap();
        let expect = reference(&shape, |mut idx| {
            for &k in &dims {
                idx[k] = shape[k] - 1 - idx[k];
            }
            through(v[ravel(&idx, &shape)], d)
        });
        check(&out, &shape, &expect)?;
    }

    #[test]
    fn roll_matches_reference(
        shape in vec(0usize..4, 1..=3),
        shifts in vec(-7i64..8, 1..4),
        dims_sel in vec(0usize..6, 1..4),
        flat in any::<bool>(),
        draw in draws(6),
    ) {
        let r = shape.len();
        let d = draw.d;
        let (v, x) = draw.input(&shape);
        let expect: Vec<f64>;
        let out;
        if flat {
            out = x.roll(&shifts[..1], &[]).unwrap();
            let n = numel(&shape) as i64;
            expect = (0..n)
                .map(|i| through(v[(i - shifts[0]).rem_euclid(n.max(1)) as usize], d))
                .collect();
        } else {
            let k = shifts.len().min(dims_sel.len());
            let dims: Vec<i64> = dims_sel[..k]
                .iter()
                .map(|&s| if s >= 3 { (s % r) as i64 - r as i64 } else { (s % r) as i64 })
                .collect();
            out = x.roll(&shifts[..k], &dims).unwrap();
            let mut total = vec![0i64; r];
            for (&s, &dd) in shifts.iter().zip(&dims) {
                total[dd.rem_euclid(r as i64) as usize] += s;
            }
            expect = (0..numel(&shape))
                .map(|o| {
                    let mut idx = unravel(o, &shape);
                    for k in 0..r {
                        let n = shape[k] as i64;
                        idx[k] = (idx[k] as i64 - total[k]).rem_euclid(n) as usize;
                    }
                    through(v[ravel(&idx, &shape)], d)
                })
                .collect();
        }
        check(&out, &shape, &expect)?;
    }

    #[test]
    fn repeat_matches_reference(
        shape in vec(0usize..4, 0..=3),
        extra in 0usize..3,
        reps in vec(0usize..3, 5),
        draw in draws(6),
    ) {
        let r = shape.len();
        let d = draw.d;
        let sizes = &reps[..r + extra];
        let (v, x) = draw.input(&shape);
        let out = x.repeat(sizes).unwrap();
        let oshape: Vec<usize> = (0..r + extra)
            .map(|k| sizes[k] * if k < extra { 1 } else { shape[k - extra] })
            .collect();
        let expect = reference(&oshape, |idx| {
            let src: Vec<usize> = (0..r).map(|k| idx[k + extra] % shape[k]).collect();
            through(v[ravel(&src, &shape)], d)
        });
        check(&out, &oshape, &expect)?;
    }

    #[test]
    fn tril_triu_match_reference(
        shape in vec(0usize..4, 2..=3),
        diagonal in -4i64..5,
        upper in any::<bool>(),
        draw in draws(6),
    ) {
        let r = shape.len();
        let d = draw.d;
        let (v, x) = draw.input(&shape);
        let out = if upper { x.triu(diagonal) } else { x.tril(diagonal) }.unwrap();
        let expect = reference(&shape, |idx| {
            let off = idx[r - 1] as i64 - idx[r - 2] as i64;
            let keep = if upper { off >= diagonal } else { off <= diagonal };
            if keep { through(v[ravel(&idx, &shape)], d) } else { 0.0 }
        });
        check(&out, &shape, &expect)?;
    }

    #[test]
    fn sort_is_stable_and_topk_is_its_prefix(
        shape in vec(0usize..5, 1..=3),
        dim_sel in 0usize..3,
        descending in any::<bool>(),
        k_sel in 0usize..6,
        draw in draws(6),
    ) {
        let dim = dim_sel % shape.len();
        let d = draw.d;
        // Few distinct values, so there are ties; 4 stands for NaN in the float dtypes.
        let v: Vec<f64> = draw
            .rng()
            .values(numel(&shape), 5)
            .into_iter()
            .map(|x| if x == 4.0 && d.is_float() { f64::NAN } else { x })
            .collect();
        let x = make(&v, &shape, d, draw.strided);
        let (vals, idx) = x.sort(dim, descending, true).unwrap();
        let n = shape[dim];
        let key = |x: f64| if x.is_nan() { f64::INFINITY } else { through(x, d) };
        let mut ev = vec![0.0; v.len()];
        let mut ei = vec![0i64; v.len()];
        for o in 0..numel(&shape) {
            let idx0 = unravel(o, &shape);
            if idx0[dim] != 0 {
                continue;
            }
            let at = |j: usize| {
                let mut t = idx0.clone();
                t[dim] = j;
                ravel(&t, &shape)
            };
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&a, &b| {
                let (ka, kb) = (key(v[at(a)]), key(v[at(b)]));
                if descending { kb.total_cmp(&ka) } else { ka.total_cmp(&kb) }
            });
            for (j, &s) in order.iter().enumerate() {
                let val = v[at(s)];
                ev[at(j)] = if val.is_nan() { val } else { through(val, d) };
                ei[at(j)] = s as i64;
            }
        }
        prop_assert!(same(&read(&vals), &ev));
        prop_assert_eq!(read_i64(&idx), ei.clone());
        if d != DType::Bool {
            let k = k_sel % (n + 1);
            let (tv, ti) = x.topk(k, dim, descending, true).unwrap();
            let prefix = |full: &Tensor| full.narrow(dim, 0, k).unwrap();
            let want_v = make(&ev, &shape, DType::F64, false);
            let want_i = make(&ei.iter().map(|&i| i as f64).collect::<Vec<_>>(), &shape, DType::F64, false);
            prop_assert!(same(&read(&tv), &read(&prefix(&want_v))));
            prop_assert!(same(&read(&ti), &read(&prefix(&want_i))));
        }
    }
}

#[test]
fn large_tensors_take_the_parallel_path() {
    let cpu = Device::cpu();
    let (rows, cols) = (96usize, 700usize);
    let v: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1009) as f32)
        .collect();
    let x = Tensor::from_slice(&v, [rows, cols], &cpu).unwrap();
    let xt = x.t().unwrap();
    // cat of two copies along dim 1.
    let c = cat(&[&x, &x], 1).unwrap();
    let cv = c.to_vec::<f32>().unwrap();
    for r in [0, 50, 95] {
        assert_eq!(
            &cv[r * 2 * cols..r * 2 * cols + cols],
            &v[r * cols..(r + 1) * cols]
        );
        assert_eq!(
            &cv[r * 2 * cols + cols..(r + 1) * 2 * cols],
            &v[r * cols..(r + 1) * cols]
        );
    }
    // flip of a transposed view.
    let f = xt.flip(&[0]).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(f[0], v[cols - 1]);
    assert_eq!(f[rows * cols - 1], v[(rows - 1) * cols]);
    // rows sorted ascending, indices consistent with the values.
    let (s, i) = x.sort(1, false, true).unwrap();
    let (s, i) = (s.to_vec::<f32>().unwrap(), i.to_vec::<i64>().unwrap());
    for r in 0..rows {
        let row = &s[r * cols..(r + 1) * cols];
        assert!(row.windows(2).all(|w| w[0] <= w[1]));
        for j in 0..cols {
            assert_eq!(row[j], v[r * cols + i[r * cols + j] as usize]);
        }
    }
    // scatter_add of ones into column 0 counts the columns.
    let idx = Tensor::zeros([rows, cols], DType::I64, &cpu).unwrap();
    let ones = Tensor::ones([rows, cols], DType::F32, &cpu).unwrap();
    let z = Tensor::zeros([rows, cols], DType::F32, &cpu).unwrap();
    let a = z
        .scatter_add(1, &idx, &ones)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!((0..rows).all(|r| a[r * cols] == cols as f32 && a[r * cols + 1] == 0.0));
    // roll of the flattened tensor by one.
    let rl = x.roll(&[1], &[]).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(rl[0], v[rows * cols - 1]);
    assert_eq!(&rl[1..], &v[..rows * cols - 1]);
}

// ---- PyTorch's values (CPU, and XLA when available) --------------------------------------------

test_device!(sort_matches_pytorch_with_nan_ties_and_signed_zeros, |dev| {
    // x = torch.tensor([3., nan, 1., 3., -0., 0., nan, 1., -inf])
    // x.sort(stable=True) -> values [-inf, -0., 0., 1., 1., 3., 3., nan, nan],
    //                        indices [8, 4, 5, 2, 7, 0, 3, 1, 6]
    // x.sort(descending=True, stable=True) -> values [nan, nan, 3., 3., 1., 1., -0., 0., -inf],
    //                                         indices [1, 6, 0, 3, 2, 7, 4, 5, 8]
    // torch.tensor([True, False, True, False]).sort(descending=True) -> indices [0, 2, 1, 3]
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let xs = [3., nan, 1., 3., -0., 0., nan, 1., -inf];
    for dt in [DType::F32, DType::BF16, DType::F64] {
        let x = t_f32(&xs, &[9], &dev).to_device(&Device::cpu()).unwrap();
        let x = x.to_dtype(dt).unwrap().to_device(&dev).unwrap();
        let (v, i) = x.sort(0, false, true).unwrap();
        let want = [-inf, -0., 0., 1., 1., 3., 3., nan, nan].map(f64::from);
        assert!(same(&read(&v), &want), "{dev} {dt}: {:?}", read(&v));
        assert_eq!(read_i64(&i), [8, 4, 5, 2, 7, 0, 3, 1, 6], "{dev} {dt}");
        let (v, i) = x.sort(-1, true, true).unwrap();
        let want = [nan, nan, 3., 3., 1., 1., -0., 0., -inf].map(f64::from);
        assert!(same(&read(&v), &want), "{dev} {dt}: {:?}", read(&v));
        assert_eq!(read_i64(&i), [1, 6, 0, 3, 2, 7, 4, 5, 8], "{dev} {dt}");
        assert_eq!(
            read_i64(&x.argsort(0, true, false).unwrap()),
            [1, 6, 0, 3, 2, 7, 4, 5, 8]
        );
    }
    let b = Tensor::new([true, false, true, false], &Device::cpu())
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let (v, i) = b.sort(0, true, true).unwrap();
    assert_eq!(read_i64(&v), [1, 1, 0, 0]);
    assert_eq!(read_i64(&i), [0, 2, 1, 3]);
});

test_device!(topk_matches_pytorch, |dev| {
    // y = torch.tensor([1., 5., 3., 5., 2., nan, 4., 5.])
    // y.topk(3) -> values [nan, 5., 5.], indices [5, 1, 7] (tpu-rs: [5, 1, 3], lower index
    //   first among ties)
    // y.topk(2, largest=False) -> values [1., 2.], indices [0, 4]
    // z = torch.tensor([[4, 1, 7], [2, 9, 0], [8, 3, 5]])
    // z.topk(2, dim=0) -> values [[8, 9, 7], [4, 3, 5]], indices [[2, 1, 0], [0, 2, 2]]
    let nan = f32::NAN;
    let y = t_f32(&[1., 5., 3., 5., 2., nan, 4., 5.], &[8], &dev);
    let (v, i) = y.topk(3, 0, true, true).unwrap();
    assert!(same(&read(&v), &[f64::NAN, 5., 5.]));
    assert_eq!(read_i64(&i), [5, 1, 3]);
    let (v, i) = y.topk(2, -1, false, true).unwrap();
    assert_eq!(read(&v), [1., 2.]);
    assert_eq!(read_i64(&i), [0, 4]);
    let z = t_i64(&[4, 1, 7, 2, 9, 0, 8, 3, 5], &[3, 3], &dev);
    let (v, i) = z.topk(2, 0, true, true).unwrap();
    assert_eq!(read_i64(&v), [8, 9, 7, 4, 3, 5]);
    assert_eq!(read_i64(&i), [2, 1, 0, 0, 2, 2]);
    assert_eq!(v.shape(), &[2, 3]);
});

test_device!(pad_matches_pytorch, |dev| {
    // r = torch.arange(12.).view(1, 3, 4)
    // F.pad(r, (2, 1, 1, 2), mode='reflect')[0] ->
    //   [[6, 5, 4, 5, 6, 7, 6], [2, 1, 0, 1, 2, 3, 2], [6, 5, 4, 5, 6, 7, 6],
    //    [10, 9, 8, 9, 10, 11, 10], [6, 5, 4, 5, 6, 7, 6], [2, 1, 0, 1, 2, 3, 2]]
    // F.pad(r, (2, 1, 1, 2), mode='replicate')[0] ->
    //   [[0, 0, 0, 1, 2, 3, 3], [0, 0, 0, 1, 2, 3, 3], [4, 4, 4, 5, 6, 7, 7],
    //    [8, 8, 8, 9, 10, 11, 11], [8, 8, 8, 9, 10, 11, 11], [8, 8, 8, 9, 10, 11, 11]]
    // F.pad(torch.arange(6).view(2, 3), (1, 0, 0, 1), value=-1) ->
    //   [[-1, 0, 1, 2], [-1, 3, 4, 5], [-1, -1, -1, -1]]
    let reflect = [
        6, 5, 4, 5, 6, 7, 6, 2, 1, 0, 1, 2, 3, 2, 6, 5, 4, 5, 6, 7, 6, 10, 9, 8, 9, 10, 11, 10, 6,
        5, 4, 5, 6, 7, 6, 2, 1, 0, 1, 2, 3, 2,
    ];
    let replicate = [
        0, 0, 0, 1, 2, 3, 3, 0, 0, 0, 1, 2, 3, 3, 4, 4, 4, 5, 6, 7, 7, 8, 8, 8, 9, 10, 11, 11, 8,
        8, 8, 9, 10, 11, 11, 8, 8, 8, 9, 10, 11, 11,
    ];
    let r = t_f32(
        &(0..12).map(|v| v as f32).collect::<Vec<_>>(),
        &[1, 3, 4],
        &dev,
    );
    let p = r.pad(&[2, 1, 1, 2], PadMode::Reflect).unwrap();
    assert_eq!(p.shape(), &[1, 6, 7]);
    assert_eq!(read_i64(&p), reflect);
    let p = r.pad(&[2, 1, 1, 2], PadMode::Replicate).unwrap();
    assert_eq!(read_i64(&p), replicate);
    let a = t_i64(&[0, 1, 2, 3, 4, 5], &[2, 3], &dev);
    let p = a
        .pad(&[1, 0, 0, 1], PadMode::Constant((-1).into()))
        .unwrap();
    assert_eq!(read_i64(&p), [-1, 0, 1, 2, -1, 3, 4, 5, -1, -1, -1, -1]);
    // Empty inputs: F.pad(torch.zeros(0), (1, 2), value=3.) -> [3., 3., 3.]
    let cpu = Device::cpu();
    let e = Tensor::zeros([0], DType::F32, &cpu)
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let p = e.pad(&[1, 2], PadMode::Constant(3.0.into())).unwrap();
    assert_eq!(read(&p), [3., 3., 3.]);
    let e = Tensor::zeros([0, 3], DType::F32, &cpu)
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let p = e.pad(&[1, 1], PadMode::Replicate).unwrap();
    assert_eq!(p.shape(), &[0, 5]);
    let (v, i) = e.sort(0, false, true).unwrap();
    assert_eq!((v.shape(), i.shape()), (&[0usize, 3][..], &[0usize, 3][..]));
    assert_eq!(cat(&[&e, &e], 1).unwrap().shape(), &[0, 6]);
});

test_device!(roll_matches_pytorch, |dev| {
    // a = torch.arange(12).view(3, 4)
    // a.roll((1, -3), (0, 1)) -> [[11, 8, 9, 10], [3, 0, 1, 2], [7, 4, 5, 6]]
    // a.roll(5) -> [[7, 8, 9, 10], [11, 0, 1, 2], [3, 4, 5, 6]]
    // a.roll((1, 2), (1, -1)) -> [[1, 2, 3, 0], [5, 6, 7, 4], [9, 10, 11, 8]]
    let a = t_i64(&(0..12).collect::<Vec<_>>(), &[3, 4], &dev);
    let r = a.roll(&[1, -3], &[0, 1]).unwrap();
    assert_eq!(read_i64(&r), [11, 8, 9, 10, 3, 0, 1, 2, 7, 4, 5, 6]);
    let r = a.roll(&[5], &[]).unwrap();
    assert_eq!(read_i64(&r), [7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6]);
    let r = a.roll(&[1, 2], &[1, -1]).unwrap();
    assert_eq!(read_i64(&r), [1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8]);
});

test_device!(one_hot_tril_triu_match_pytorch, |dev| {
    // F.one_hot(torch.tensor([[0, 3], [2, 1]]), -1) ->
    //   [[[1, 0, 0, 0], [0, 0, 0, 1]], [[0, 0, 1, 0], [0, 1, 0, 0]]]
    // F.one_hot(torch.tensor([4, 0]), 5) -> [[0, 0, 0, 0, 1], [1, 0, 0, 0, 0]]
    // a = torch.arange(12).view(3, 4)
    // a.tril(-1) -> [[0, 0, 0, 0], [4, 0, 0, 0], [8, 9, 0, 0]]
    // a.tril(2) -> [[0, 1, 2, 0], [4, 5, 6, 7], [8, 9, 10, 11]]
    // a.triu(1) -> [[0, 1, 2, 3], [0, 0, 6, 7], [0, 0, 0, 11]]
    // a.triu(-2) -> a
    let h = t_i64(&[0, 3, 2, 1], &[2, 2], &dev).one_hot(-1).unwrap();
    assert_eq!(h.shape(), &[2, 2, 4]);
    assert_eq!(h.dtype(), DType::I64);
    assert_eq!(
        read_i64(&h),
        [1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0]
    );
    let h = t_i64(&[4, 0], &[2], &dev).one_hot(5).unwrap();
    assert_eq!(read_i64(&h), [0, 0, 0, 0, 1, 1, 0, 0, 0, 0]);
    let a = t_i64(&(0..12).collect::<Vec<_>>(), &[3, 4], &dev);
    let all: Vec<i64> = (0..12).collect();
    assert_eq!(
        read_i64(&a.tril(-1).unwrap()),
        [0, 0, 0, 0, 4, 0, 0, 0, 8, 9, 0, 0]
    );
    assert_eq!(
        read_i64(&a.tril(2).unwrap()),
        [0, 1, 2, 0, 4, 5, 6, 7, 8, 9, 10, 11]
    );
    assert_eq!(
        read_i64(&a.triu(1).unwrap()),
        [0, 1, 2, 3, 0, 0, 6, 7, 0, 0, 0, 11]
    );
    assert_eq!(read_i64(&a.triu(-2).unwrap()), all);
});

test_device!(accumulating_ops_match_pytorch, |dev| {
    // torch.zeros(2, 4).scatter_add(1, torch.tensor([[0, 0, 3, 3], [1, 1, 1, 2]]),
    //     torch.tensor([[1., 2, 3, 4], [5, 6, 7, 8]])) -> [[3, 0, 0, 7], [0, 18, 8, 0]]
    // torch.ones(3, 2, dtype=torch.long).scatter_add(0, torch.tensor([[2, 0], [2, 2]]),
    //     torch.tensor([[10, 20], [30, 40]])) -> [[1, 21], [1, 1], [41, 41]]
    // torch.ones(3, 2).index_add(0, torch.tensor([2, 0, 2]),
    //     torch.tensor([[1., 2], [3, 4], [5, 6]]), alpha=2) -> [[7, 9], [1, 1], [13, 17]]
    // bf16 sums are kept in f32 and rounded once:
    // torch.zeros(1, dtype=torch.bfloat16).scatter_add(0, torch.tensor([0, 0, 0]),
    //     torch.tensor([1.0, 2**-8, 2**-8], dtype=torch.bfloat16)) -> [1.0078125]
    // torch.tensor([True, False, False]).scatter_add(0, torch.tensor([1, 1, 2]),
    //     torch.tensor([True, True, False])) -> [True, True, False]
    let z = t_f32(&[0.0; 8], &[2, 4], &dev);
    let i = t_i64(&[0, 0, 3, 3, 1, 1, 1, 2], &[2, 4], &dev);
    let s = t_f32(&[1., 2., 3., 4., 5., 6., 7., 8.], &[2, 4], &dev);
    let r = z.scatter_add(1, &i, &s).unwrap();
    assert_eq!(read(&r), [3., 0., 0., 7., 0., 18., 8., 0.]);
    let o = t_i64(&[1; 6], &[3, 2], &dev);
    let i = t_i64(&[2, 0, 2, 2], &[2, 2], &dev);
    let s = t_i64(&[10, 20, 30, 40], &[2, 2], &dev);
    assert_eq!(
        read_i64(&o.scatter_add(0, &i, &s).unwrap()),
        [1, 21, 1, 1, 41, 41]
    );
    let o = t_f32(&[1.0; 6], &[3, 2], &dev);
    let i = t_i64(&[2, 0, 2], &[3], &dev);
    let s = t_f32(&[1., 2., 3., 4., 5., 6.], &[3, 2], &dev);
    let r = o.index_add(0, &i, &s, 2).unwrap();
    assert_eq!(read(&r), [7., 9., 1., 1., 13., 17.]);
    // torch.ones(3, 2).index_copy(0, torch.tensor([2, 0]), torch.tensor([[1., 2], [3, 4]]))
    //     -> [[3, 4], [1, 1], [1, 2]]
    let i = t_i64(&[2, 0], &[2], &dev);
    let s = t_f32(&[1., 2., 3., 4.], &[2, 2], &dev);
    assert_eq!(
        read(&o.index_copy(0, &i, &s).unwrap()),
        [3., 4., 1., 1., 1., 2.]
    );
    // Along the last dim of a transposed view, i64:
    // torch.arange(6).reshape(2, 3).t().index_copy(1, torch.tensor([1]),
    //     torch.tensor([[7], [8], [9]])) -> [[0, 7], [1, 8], [2, 9]]
    let a = t_i64(&[0, 1, 2, 3, 4, 5], &[2, 3], &dev).t().unwrap();
    let r = a
        .index_copy(
            1,
            &t_i64(&[1], &[1], &dev),
            &t_i64(&[7, 8, 9], &[3, 1], &dev),
        )
        .unwrap();
    assert_eq!(read_i64(&r), [0, 7, 1, 8, 2, 9]);
    let cpu = Device::cpu();
    let zb = Tensor::zeros([1], DType::BF16, &cpu).unwrap();
    let sb = Tensor::new([1.0f32, 1.0 / 256.0, 1.0 / 256.0], &cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let (zb, sb) = (zb.to_device(&dev).unwrap(), sb.to_device(&dev).unwrap());
    let i = t_i64(&[0, 0, 0], &[3], &dev);
    assert_eq!(read(&zb.scatter_add(0, &i, &sb).unwrap()), [1.0078125]);
    assert_eq!(read(&zb.index_add(0, &i, &sb, 1).unwrap()), [1.0078125]);
    let b = Tensor::new([true, false, false], &cpu)
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let sb = Tensor::new([true, true, false], &cpu)
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let i = t_i64(&[1, 1, 2], &[3], &dev);
    assert_eq!(read_i64(&b.scatter_add(0, &i, &sb).unwrap()), [1, 1, 0]);
});

test_device!(scatter_reduce_matches_pytorch, |dev| {
    use ScatterReduction::*;
    // The example of torch.scatter_reduce's documentation, and the other reductions on it:
    // src = torch.tensor([1., 2., 3., 4., 5., 6.]); index = torch.tensor([0, 1, 0, 1, 2, 1])
    // input = torch.tensor([1., 2., 3., 4.]); input2 = torch.tensor([5., 4., 3., 2.])
    let src = t_f32(&[1., 2., 3., 4., 5., 6.], &[6], &dev);
    let index = t_i64(&[0, 1, 0, 1, 2, 1], &[6], &dev);
    let input = t_f32(&[1., 2., 3., 4.], &[4], &dev);
    let input2 = t_f32(&[5., 4., 3., 2.], &[4], &dev);
    let cases: [(&Tensor, ScatterReduction, bool, [f32; 4]); 12] = [
        // input.scatter_reduce(0, index, src, reduce="sum") -> [5., 14., 8., 4.]
        (&input, Sum, true, [5., 14., 8., 4.]),
        // ..., reduce="sum", include_self=False) -> [4., 12., 5., 4.]
        (&input, Sum, false, [4., 12., 5., 4.]),
        // input2.scatter_reduce(0, index, src, reduce="amax") -> [5., 6., 5., 2.]
        (&input2, Amax, true, [5., 6., 5., 2.]),
        // ..., reduce="amax", include_self=False) -> [3., 6., 5., 2.]
        (&input2, Amax, false, [3., 6., 5., 2.]),
        // input2 ... reduce="amin" -> [1., 2., 3., 2.]; include_self=False -> [1., 2., 5., 2.]
        (&input2, Amin, true, [1., 2., 3., 2.]),
        (&input2, Amin, false, [1., 2., 5., 2.]),
        // input ... reduce="prod" -> [3., 96., 15., 4.]; include_self=False -> [3., 48., 5., 4.]
        (&input, Prod, true, [3., 96., 15., 4.]),
        (&input, Prod, false, [3., 48., 5., 4.]),
        // input ... reduce="mean" -> [1.6667, 3.5, 4., 4.]; include_self=False -> [2., 4., 5., 4.]
        (&input, Mean, true, [5. / 3., 3.5, 4., 4.]),
        (&input, Mean, false, [2., 4., 5., 4.]),
        // input2 ... reduce="mean" -> [3., 4., 4., 2.]; include_self=False -> [2., 4., 5., 2.]
        (&input2, Mean, true, [3., 4., 4., 2.]),
        (&input2, Mean, false, [2., 4., 5., 2.]),
    ];
    for (x, reduce, include_self, want) in cases {
        let r = x
            .scatter_reduce(0, &index, &src, reduce, include_self)
            .unwrap();
        let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
        assert_eq!(
            read(&r),
            want,
            "{reduce:?} include_self={include_self} on {dev}"
        );
    }
    // Integers: the mean is floored.
    // torch.tensor([1, 2, 3, 4]).scatter_reduce(0, index, src.long(), "mean") -> [1, 3, 4, 4]
    // ... "mean", include_self=False -> [2, 4, 5, 4]; "prod" on int32 -> [3, 96, 15, 4]
    let src_i = t_i64(&[1, 2, 3, 4, 5, 6], &[6], &dev);
    let input_i = t_i64(&[1, 2, 3, 4], &[4], &dev);
    let mean = |include_self| {
        read_i64(
            &input_i
                .scatter_reduce(0, &index, &src_i, Mean, include_self)
                .unwrap(),
        )
    };
    assert_eq!(mean(true), [1, 3, 4, 4]);
    assert_eq!(mean(false), [2, 4, 5, 4]);
    let to_i32 = |t: &Tensor| t.to_dtype(DType::I32).unwrap();
    let r = to_i32(&input_i)
        .scatter_reduce(0, &index, &to_i32(&src_i), Prod, true)
        .unwrap();
    assert_eq!((r.dtype(), read_i64(&r)), (DType::I32, vec![3, 96, 15, 4]));
    // i32 bounds are the starts of max and min without the input:
    // torch.zeros(2, dtype=torch.int32).scatter_reduce(0, torch.tensor([0, 1]),
    //     torch.tensor([-7, 9], dtype=torch.int32), "amax", include_self=False) -> [-7, 9]
    let z = to_i32(&t_i64(&[0, 0], &[2], &dev));
    let s = to_i32(&t_i64(&[-7, 9], &[2], &dev));
    let i = t_i64(&[0, 1], &[2], &dev);
    for reduce in [Amax, Amin] {
        let r = z.scatter_reduce(0, &i, &s, reduce, false).unwrap();
        assert_eq!(read_i64(&r), [-7, 9], "{reduce:?} on {dev}");
    }
    // NaN wins max and min:
    // torch.tensor([0., nan]).scatter_reduce(0, torch.tensor([0, 0, 1]),
    //     torch.tensor([nan, 1., 2.]), "amax") -> [nan, nan]
    // ... "amin", include_self=False -> [nan, 2.]
    let x = t_f32(&[0., f32::NAN], &[2], &dev);
    let s = t_f32(&[f32::NAN, 1., 2.], &[3], &dev);
    let i = t_i64(&[0, 0, 1], &[3], &dev);
    let r = read(&x.scatter_reduce(0, &i, &s, Amax, true).unwrap());
    assert!(r[0].is_nan() && r[1].is_nan(), "{r:?} on {dev}");
    let r = read(&x.scatter_reduce(0, &i, &s, Amin, false).unwrap());
    assert!(r[0].is_nan() && r[1] == 2.0, "{r:?} on {dev}");
    // bool: sum and amax are `or`, prod and amin `and`.
    // torch.tensor([True, False]).scatter_reduce(0, torch.tensor([0, 1, 1]),
    //     torch.tensor([False, True, False]), "prod") -> [False, False]; "amax" -> [True, True]
    let cpu = Device::cpu();
    let b = |v: [bool; 2]| Tensor::new(v, &cpu).unwrap().to_device(&dev).unwrap();
    let bx = b([true, false]);
    let bs = Tensor::new([false, true, false], &cpu)
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let i = t_i64(&[0, 1, 1], &[3], &dev);
    let r = bx.scatter_reduce(0, &i, &bs, Prod, true).unwrap();
    assert_eq!((r.dtype(), read_i64(&r)), (DType::Bool, vec![0, 0]));
    let r = bx.scatter_reduce(0, &i, &bs, Amax, true).unwrap();
    assert_eq!(read_i64(&r), [1, 1]);
    let r = bx.scatter_reduce(0, &i, &bs, Amin, false).unwrap();
    assert_eq!(read_i64(&r), [0, 0]);
    let e = err(bx.scatter_reduce(0, &i, &bs, Mean, true));
    has(&e, &["scatter_reduce", "mean", "bool"]);
    // Bad input names the op.
    let e = err(input.scatter_reduce(0, &t_i64(&[4], &[1], &dev), &src, Prod, false));
    has(&e, &["scatter_reduce", "index 4"]);
    let e = err(input.scatter_reduce(0, &index, &src_i, Amax, true));
    has(
        &e,
        &["scatter_reduce", "src", "expected dtype f32, got i64"],
    );
    let e = "median"
        .parse::<ScatterReduction>()
        .unwrap_err()
        .to_string();
    has(&e, &["sum, prod, mean, amax, amin", "median"]);
});

test_device!(indexing_and_copies_match_pytorch, |dev| {
    // torch.tensor([[1, 2], [3, 4]]).gather(1, torch.tensor([[0, 0], [1, 0]])) -> [[1, 1], [4, 3]]
    // torch.arange(6).view(2, 3).index_select(-1, torch.tensor([2, 2, 0])) -> [[2, 2, 0], [5, 5, 3]]
    // F.embedding(torch.tensor([[2, 0], [1, 2]]), torch.tensor([[1., 2], [3, 4], [5, 6]]))
    //   -> [[[5, 6], [1, 2]], [[3, 4], [5, 6]]]
    // torch.tensor([[1., 2, 3], [4, 5, 6]]).masked_fill(torch.tensor([True, False, True]), -0.5)
    //   -> [[-0.5, 2, -0.5], [-0.5, 5, -0.5]]
    // torch.tensor([[1, 2]]).repeat(2, 1, 2) -> [[[1, 2, 1, 2]], [[1, 2, 1, 2]]]
    // torch.tensor([[1, 2], [3, 4]]).tile((2,)) -> [[1, 2, 1, 2], [3, 4, 3, 4]]
    // torch.arange(8).view(2, 2, 2).flip(0, 2) -> [[[5, 4], [7, 6]], [[1, 0], [3, 2]]]
    // torch.cat([torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([-1], dtype=torch.int8)])
    //   -> [1, 2, -1] (int16; tpu-rs has no int16 and gives i32)
    // torch.cat([torch.tensor([], dtype=torch.float64), torch.ones(2, 3, dtype=torch.int32)])
    //   -> float64 of shape [2, 3]
    // torch.zeros(3, dtype=torch.long).scatter(0, torch.tensor([1]), 2.7) -> [0, 2, 0]
    let a = t_i64(&[1, 2, 3, 4], &[2, 2], &dev);
    let g = a.gather(1, &t_i64(&[0, 0, 1, 0], &[2, 2], &dev)).unwrap();
    assert_eq!(read_i64(&g), [1, 1, 4, 3]);
    let s = t_i64(&(0..6).collect::<Vec<_>>(), &[2, 3], &dev);
    let r = s.index_select(-1, &t_i64(&[2, 2, 0], &[3], &dev)).unwrap();
    assert_eq!(read_i64(&r), [2, 2, 0, 5, 5, 3]);
    let w = t_f32(&[1., 2., 3., 4., 5., 6.], &[3, 2], &dev);
    let e = embedding(&t_i64(&[2, 0, 1, 2], &[2, 2], &dev), &w).unwrap();
    assert_eq!(e.shape(), &[2, 2, 2]);
    assert_eq!(read(&e), [5., 6., 1., 2., 3., 4., 5., 6.]);
    let m = Tensor::new([true, false, true], &Device::cpu())
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let x = t_f32(&[1., 2., 3., 4., 5., 6.], &[2, 3], &dev);
    let f = x.masked_fill(&m, -0.5).unwrap();
    assert_eq!(read(&f), [-0.5, 2., -0.5, -0.5, 5., -0.5]);
    let r = t_i64(&[1, 2], &[1, 2], &dev).repeat(&[2, 1, 2]).unwrap();
    assert_eq!(r.shape(), &[2, 1, 4]);
    assert_eq!(read_i64(&r), [1, 2, 1, 2, 1, 2, 1, 2]);
    let t = a.tile(&[2]).unwrap();
    assert_eq!(t.shape(), &[2, 4]);
    assert_eq!(read_i64(&t), [1, 2, 1, 2, 3, 4, 3, 4]);
    let f = t_i64(&(0..8).collect::<Vec<_>>(), &[2, 2, 2], &dev)
        .flip(&[0, 2])
        .unwrap();
    assert_eq!(read_i64(&f), [5, 4, 7, 6, 1, 0, 3, 2]);
    let cpu = Device::cpu();
    let u = Tensor::new([1u8, 2], &cpu)
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let i = Tensor::new([-1i8], &cpu).unwrap().to_device(&dev).unwrap();
    let c = cat(&[&u, &i], 0).unwrap();
    assert_eq!(c.dtype(), DType::I32);
    assert_eq!(read_i64(&c), [1, 2, -1]);
    let e = Tensor::zeros([0], DType::F64, &cpu)
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let o = Tensor::ones([2, 3], DType::I32, &cpu)
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let c = cat(&[&e, &o], 1).unwrap();
    assert_eq!((c.shape(), c.dtype()), (&[2usize, 3][..], DType::F64));
    assert_eq!(read(&c), [1.0; 6]);
    let z = t_i64(&[0, 0, 0], &[3], &dev);
    let s = z.scatter_value(0, &t_i64(&[1], &[1], &dev), 2.7).unwrap();
    assert_eq!(read_i64(&s), [0, 2, 0]);
});

// ---- bad input (CPU) ---------------------------------------------------------------------------

#[test]
fn out_of_range_indices_name_the_index_dim_and_shape() {
    let cpu = Device::cpu();
    let x = t_f32(&[1., 2., 3., 4., 5., 6.], &[2, 3], &cpu);
    let e = err(x.gather(1, &t_i64(&[0, 3, 1, 1], &[2, 2], &cpu)));
    has(&e, &["gather", "index 3", "dim 1", "size 3", "[2, 3]"]);
    let e = err(x.gather(0, &t_i64(&[-1], &[1, 1], &cpu)));
    has(&e, &["index -1", "dim 0", "size 2"]);
    let e = err(x.scatter(1, &t_i64(&[5], &[1, 1], &cpu), &x));
    has(&e, &["scatter", "index 5", "dim 1"]);
    let e = err(x.scatter_add(0, &t_i64(&[2], &[1, 1], &cpu), &x));
    has(&e, &["scatter_add", "index 2", "dim 0", "size 2"]);
    let e = err(x.index_select(0, &t_i64(&[0, -1], &[2], &cpu)));
    has(&e, &["index_select", "index -1", "dim 0"]);
    let s = t_f32(&[1., 1., 1.], &[1, 3], &cpu);
    let e = err(x.index_add(0, &t_i64(&[7], &[1], &cpu), &s, 1));
    has(&e, &["index_add", "index 7", "dim 0", "size 2"]);
    let e = err(x.index_copy(0, &t_i64(&[0], &[1], &cpu), &x));
    has(&e, &["index_copy", "source of shape [1, 3]", "got [2, 3]"]);
    let e = err(embedding(&t_i64(&[0, 3], &[2], &cpu), &x));
    has(&e, &["embedding", "index 3", "size 2", "[2, 3]"]);
    let e = err(t_i64(&[0, 5], &[2], &cpu).one_hot(3));
    has(&e, &["one_hot", "5", "[0, 3)"]);
    let e = err(t_i64(&[-1, 1], &[2], &cpu).one_hot(-1));
    has(&e, &["one_hot", "-1"]);
    let e = err(Tensor::zeros([0], DType::I64, &cpu).unwrap().one_hot(-1));
    has(&e, &["one_hot", "empty"]);
}

#[test]
fn index_dtype_must_be_i64() {
    let cpu = Device::cpu();
    let x = t_f32(&[1., 2., 3.], &[3], &cpu);
    let i32s = Tensor::new([0i32, 1], &cpu).unwrap();
    has(
        &err(x.gather(0, &i32s)),
        &["gather", "index", "expected dtype i64, got i32"],
    );
    has(
        &err(x.index_select(0, &i32s)),
        &["index_select", "expected dtype i64"],
    );
    has(
        &err(x.scatter(0, &i32s, &x)),
        &["scatter", "expected dtype i64"],
    );
    has(
        &err(embedding(&i32s, &x.reshape([3, 1]).unwrap())),
        &["embedding", "i64"],
    );
    has(
        &err(i32s.one_hot(3)),
        &["one_hot", "expected dtype i64, got i32"],
    );
    let f = t_f32(&[1.], &[1], &cpu);
    has(
        &err(x.masked_fill(&f, 0.0)),
        &["masked_fill", "mask", "expected dtype bool"],
    );
    let d = Tensor::ones([1], DType::F64, &cpu).unwrap();
    has(
        &err(x.scatter(0, &t_i64(&[0], &[1], &cpu), &d)),
        &["scatter", "src", "expected dtype f32, got f64"],
    );
}

#[test]
fn shape_errors_name_the_shapes() {
    let cpu = Device::cpu();
    let a = Tensor::ones([2, 3], DType::F32, &cpu).unwrap();
    let b = Tensor::ones([2, 4], DType::F32, &cpu).unwrap();
    let e = err(cat(&[&a, &b], 0));
    has(
        &e,
        &["cat", "tensor 0", "[2, 3]", "tensor 1", "[2, 4]", "dim 0"],
    );
    let c = Tensor::ones([2, 3, 1], DType::F32, &cpu).unwrap();
    has(&err(cat(&[&a, &c], 1)), &["tensor 1", "[2, 3, 1]"]);
    has(&err(cat(&[&a, &a], 2)), &["cat", "dim 2", "[2, 3]"]);
    has(&err(cat(&[], 0)), &["cat", "non-empty"]);
    let s = Tensor::scalar(1.0f32, &cpu).unwrap();
    has(
        &err(cat(&[&s, &s], 0)),
        &["cat", "tensor 0", "zero-dimensional"],
    );
    has(
        &err(stack(&[&a, &b], 0)),
        &["stack", "[2, 3]", "tensor 1", "[2, 4]"],
    );
    has(&err(stack(&[], 0)), &["stack", "non-empty"]);
    let e = err(a.topk(4, 1, true, true).map(|p| p.0));
    has(&e, &["topk", "k = 4", "size 3", "[2, 3]"]);
    let x = Tensor::ones([1, 3], DType::F32, &cpu).unwrap();
    let e = err(x.pad(&[3, 0], PadMode::Reflect));
    has(&e, &["pad", "reflect", "(3, 0)", "size 3", "[1, 3]"]);
    has(&err(x.pad(&[1], PadMode::Reflect)), &["pad", "pairs"]);
    has(
        &err(x.pad(&[1, 1, 1, 1, 1, 1], PadMode::Replicate)),
        &["pad", "[1, 3]"],
    );
    let u = Tensor::ones([2], DType::U8, &cpu).unwrap();
    has(
        &err(u.pad(&[1, 1], PadMode::Constant((-1.5).into()))),
        &["pad", "-1.5", "u8"],
    );
    let bl = Tensor::ones([2], DType::Bool, &cpu).unwrap();
    has(&err(bl.pad(&[1, 1], PadMode::Reflect)), &["pad", "bool"]);
    has(
        &err(bl.topk(1, 0, true, true).map(|p| p.0)),
        &["topk", "bool"],
    );
    let i = t_i64(&[0, 1, 0], &[1, 3], &cpu);
    let e = err(Tensor::ones([3, 2], DType::F32, &cpu)
        .unwrap()
        .gather(0, &i));
    has(&e, &["gather", "[1, 3]", "[3, 2]", "dim 1"]);
    let e = err(a.scatter(0, &i, &Tensor::ones([1, 2], DType::F32, &cpu).unwrap()));
    has(&e, &["scatter", "[1, 3]", "[1, 2]"]);
    let e = err(a.index_add(0, &t_i64(&[0], &[1], &cpu), &a, 1));
    has(&e, &["index_add", "[1, 3]", "[2, 3]"]);
    has(
        &err(Tensor::ones([3], DType::F32, &cpu).unwrap().tril(0)),
        &["tril", "[3]"],
    );
    has(&err(a.repeat(&[2])), &["repeat", "[2, 3]"]);
    has(&err(a.flip(&[0, -2])), &["flip", "dim 0", "more than once"]);
    has(&err(a.roll(&[1, 2], &[0])), &["roll", "[1, 2]", "[0]"]);
    has(&err(a.roll(&[1, 2], &[])), &["roll", "one shift"]);
    has(
        &err(a.masked_fill(&Tensor::ones([4], DType::Bool, &cpu).unwrap(), 1)),
        &["masked_fill", "[2, 3]", "[4]"],
    );
    has(
        &err(embedding(
            &t_i64(&[0], &[1], &cpu),
            &Tensor::ones([3], DType::F32, &cpu).unwrap(),
        )),
        &["embedding", "2-D", "[3]"],
    );
    has(&err(a.gather(2, &i)), &["gather", "dim 2"]);
    let e = Tensor::zeros([0, 2], DType::F32, &cpu).unwrap();
    let huge = 1usize << 40;
    assert_eq!(
        e.pad(&[huge, huge], PadMode::Constant(0.into()))
            .unwrap()
            .shape(),
        &[0, 2 + 2 * huge]
    );
    assert_eq!(e.repeat(&[1, huge]).unwrap().shape(), &[0, 2 * huge]);
    has(
        &err(a.pad(&[usize::MAX, 1], PadMode::Replicate)),
        &["pad", "too large"],
    );
    has(
        &err(t_i64(&[1], &[1], &cpu).one_hot(i64::MAX)),
        &["9223372036854775807"],
    );
}

test_device!(
    /// Sorting a 0-dim tensor gives the value and index 0, for topk with k = 0 too (the output
    /// keeps the input's empty shape, so it holds the element), and the gradient passes through;
    /// k = 2 is out of range. On both devices:
    ///
    /// ```python
    /// x = torch.tensor(5., requires_grad=True)
    /// x.topk(0), x.topk(1), x.topk(1, dim=-1), x.topk(1, largest=False)
    /// # each: values=tensor(5.), indices=tensor(0)
    /// x.sort(), x.sort(descending=True)   # values=tensor(5.), indices=tensor(0)
    /// x.argsort()                         # tensor(0)
    /// x.topk(2)                           # RuntimeError: selected index k out of range
    /// x.topk(0).values.backward(); x.grad # tensor(1.)
    /// ```
    sorting_a_0_dim_tensor_matches_pytorch,
    |dev| {
        use tpu_ops::autograd::{AutogradOps, grad_of};
        let x = t_f32(&[5.0], &[], &dev);
        let sorted = [
            x.topk(0, 0, true, true).unwrap(),
            x.topk(1, 0, true, true).unwrap(),
            x.topk(1, -1, true, true).unwrap(),
            x.topk(1, 0, false, true).unwrap(),
            x.topk(0, -1, false, true).unwrap(),
            x.sort(0, false, true).unwrap(),
            x.sort(-1, true, true).unwrap(),
        ];
        for (k, (v, i)) in sorted.iter().enumerate() {
            assert_eq!(
                (v.shape(), i.shape()),
                (&[][..], &[][..]),
                "case {k} on {dev:?}"
            );
            let (v, i) = (host::<f32>(v), host::<i64>(i));
            assert_eq!((v, i), (vec![5.0], vec![0]), "case {k} on {dev:?}");
        }
        let a = x.argsort(0, false, true).unwrap();
        assert_eq!(host::<i64>(&a), [0]);
        assert!(err_pair(x.topk(2, 0, true, true)).contains("k = 2"));
        for k in [0, 1] {
            let leaf = x.detach().requires_grad_(true).unwrap();
            let (v, _) = leaf.topk(k, 0, true, true).unwrap();
            let g = grad_of(&[&v], &[&leaf], None, false).unwrap()[0]
                .clone()
                .unwrap();
            assert_eq!(host::<f32>(&g), [1.0], "topk({k}) gradient on {dev:?}");
        }
    }
);

fn err_pair(r: tpu_tensor::Result<(Tensor, Tensor)>) -> String {
    match r {
        Ok((t, _)) => panic!("expected an error, got a tensor of shape {:?}", t.shape()),
        Err(e) => e.to_string(),
    }
}

// ---- out-of-range indices on every device (device checks on PJRT) ------------------------------

/// The fields of an index error.
fn index_err(r: tpu_tensor::Result<Tensor>) -> (String, i64, usize, usize, Vec<usize>) {
    tpu_ops::testing::index_error_of(r).unwrap_or_else(|e| panic!("{e}"))
}

test_device!(out_of_range_indices_are_errors_on_every_device, |dev| {
    let x = t_i64(&[10, 20, 30], &[3], &dev);
    // x = torch.tensor([10, 20, 30])
    // x.gather(0, torch.tensor([5, -1])) -> RuntimeError: index 5 is out of bounds for
    //   dimension 0 with size 3
    let e = index_err(x.gather(0, &t_i64(&[5, -1], &[2], &dev)));
    assert_eq!(e, ("gather".into(), 5, 0, 3, vec![3]), "{dev}");
    // x.gather(0, torch.tensor([2, 0])) -> tensor([30, 10])
    assert_eq!(
        read_i64(&x.gather(0, &t_i64(&[2, 0], &[2], &dev)).unwrap()),
        [30, 10]
    );
    // x.gather(0, torch.tensor([1, -1])) -> RuntimeError: index -1 is out of bounds ...
    let e = index_err(x.gather(0, &t_i64(&[1, -1], &[2], &dev)));
    assert_eq!(e.1, -1, "{dev}");
    // x.index_select(0, torch.tensor([-1])) -> IndexError: index out of range in self
    let e = index_err(x.index_select(0, &t_i64(&[-1], &[1], &dev)));
    assert_eq!(e, ("index_select".into(), -1, 0, 3, vec![3]), "{dev}");
    // x.index_select(0, torch.tensor([2, 0, 1])) -> tensor([30, 10, 20])
    let r = x.index_select(0, &t_i64(&[2, 0, 1], &[3], &dev)).unwrap();
    assert_eq!(read_i64(&r), [30, 10, 20]);
    // F.embedding(torch.tensor([[0, 4]]), torch.ones(4, 2)) -> IndexError: index out of range
    let w = Tensor::ones([4, 2], DType::F32, &dev).unwrap();
    let e = index_err(embedding(&t_i64(&[0, 4], &[1, 2], &dev), &w));
    assert_eq!(e, ("embedding".into(), 4, 0, 4, vec![4, 2]), "{dev}");
    // torch.zeros(3).scatter(0, torch.tensor([0, 3]), torch.ones(2)) -> RuntimeError: index 3
    //   is out of bounds for dimension 0 with size 3
    let z = Tensor::zeros([3], DType::F32, &dev).unwrap();
    let ones = Tensor::ones([2], DType::F32, &dev).unwrap();
    let e = index_err(z.scatter(0, &t_i64(&[0, 3], &[2], &dev), &ones));
    assert_eq!(e, ("scatter".into(), 3, 0, 3, vec![3]), "{dev}");
    let e = index_err(z.scatter_value(0, &t_i64(&[0, 3], &[2], &dev), 1.0));
    assert_eq!(e.1, 3, "{dev}");
    // torch.zeros(3).scatter_add(0, torch.tensor([-1, 0]), torch.ones(2)) -> RuntimeError:
    //   index -1 is out of bounds for dimension 0 with size 3
    let e = index_err(z.scatter_add(0, &t_i64(&[-1, 0], &[2], &dev), &ones));
    assert_eq!(e, ("scatter_add".into(), -1, 0, 3, vec![3]), "{dev}");
    // torch.zeros(3, 2).index_add(0, torch.tensor([0, 7]), torch.ones(2, 2)) -> RuntimeError:
    //   index 7 is out of bounds for dimension 0 with size 3
    let z2 = Tensor::zeros([3, 2], DType::F32, &dev).unwrap();
    let s = Tensor::ones([2, 2], DType::F32, &dev).unwrap();
    let e = index_err(z2.index_add(0, &t_i64(&[0, 7], &[2], &dev), &s, 1));
    assert_eq!(e, ("index_add".into(), 7, 0, 3, vec![3, 2]), "{dev}");
    // torch.zeros(3, 2).index_copy(0, torch.tensor([0, 3]), torch.ones(2, 2)) -> RuntimeError:
    //   index 3 is out of bounds for dimension 0 with size 3
    let e = index_err(z2.index_copy(0, &t_i64(&[0, 3], &[2], &dev), &s));
    assert_eq!(e, ("index_copy".into(), 3, 0, 3, vec![3, 2]), "{dev}");
    // The first offending index in row-major order of a 2-D index is reported.
    let y = Tensor::ones([2, 3], DType::F32, &dev).unwrap();
    let ix = t_i64(&[0, 1, 9, 7, -4, 0], &[2, 3], &dev);
    assert_eq!(index_err(y.gather(1, &ix)).1, 9, "{dev}");
    let ixt = t_i64(&[0, 1, 9, 7, -4, 0], &[3, 2], &dev).t().unwrap();
    assert_eq!(
        index_err(y.gather(0, &ixt)),
        ("gather".into(), 9, 0, 2, vec![2, 3])
    );

    // F.one_hot(torch.tensor([0, 3]), 3) -> RuntimeError: Class values must be smaller than
    //   num_classes.; F.one_hot(torch.tensor([0, -1]), 3) -> Class values must be non-negative.
    let e = err(t_i64(&[0, 3], &[2], &dev).one_hot(3));
    assert_eq!(
        e,
        "one_hot: class values must lie in [0, 3), got 3 at element 1 of the input of shape [2]"
    );
    let e = err(t_i64(&[0, 1, 2, 4, -1, 1], &[2, 3], &dev).one_hot(3));
    has(&e, &["got 4 at element 3", "[2, 3]"]);
    // F.one_hot(torch.tensor([2]), 0) -> RuntimeError: Class values must be smaller than
    //   num_classes. (an empty result, still checked)
    has(
        &err(t_i64(&[2], &[1], &dev).one_hot(0)),
        &["[0, 0)", "got 2"],
    );

    // torch.zeros(0, 3).index_select(1, torch.tensor([5])) -> RuntimeError: INDICES element
    //   is out of DATA bounds, id=5 axis_dim=3 (an empty result, still checked)
    let e0 = Tensor::zeros([0, 3], DType::F32, &dev).unwrap();
    let e = index_err(e0.index_select(1, &t_i64(&[5], &[1], &dev)));
    assert_eq!(e, ("index_select".into(), 5, 1, 3, vec![0, 3]), "{dev}");
    // torch.zeros(0, 3).index_add(1, torch.tensor([5]), torch.zeros(0, 1)) -> tensor([],
    //   size=(0, 3)) (nothing is added, nothing is checked)
    let src = Tensor::zeros([0, 1], DType::F32, &dev).unwrap();
    let r = e0.index_add(1, &t_i64(&[5], &[1], &dev), &src, 1).unwrap();
    assert_eq!(r.shape(), &[0, 3]);
});

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(48)))]

    /// Index tensors with values around the valid range: the CPU fails exactly when an index is
    /// out of range, naming the first in row-major order, and XLA fails alike or agrees.
    #[test]
    fn random_indices_fail_alike_on_every_device(
        xshape in vec(1usize..4, 1..=3),
        iraw in vec(0usize..4, 3),
        dim_sel in 0usize..3,
        op in 0usize..7,
        seed in any::<u64>(),
    ) {
        let (dim, gather_ishape) = index_shape(&xshape, &iraw, dim_sel);
        let mut rng = Rng::new(seed);
        let size = xshape[dim] as i64;
        // Mostly valid, sometimes just outside on either side.
        let mut pick = || {
            let v = rng.below(xshape[dim] + 4) as i64 - 2;
            if rng.below(3) == 0 { v } else { v.clamp(0, size - 1) }
        };
        let cpu = Device::cpu();
        let x = make(&Rng::new(seed ^ 1).values(numel(&xshape), 50), &xshape, DType::F32, false);
        let (idx, ishape, checked_dim, checked_size): (Vec<i64>, Vec<usize>, usize, i64) = match op {
            // gather, scatter, scatter_add: an index of x's rank, no larger than x off `dim`
            0..=2 => {
                let n = numel(&gather_ishape);
                ((0..n).map(|_| pick()).collect(), gather_ishape, dim, size)
            }
            // index_select, index_add: a vector
            3 | 4 => {
                let n = iraw[0];
                ((0..n).map(|_| pick()).collect(), vec![n], dim, size)
            }
            // embedding of the flattened x as rows of `xshape[0]`: any index shape
            5 => {
                let ishape = vec![iraw[0], iraw[1]];
                let s = xshape[0] as i64;
                let mut p = || {
                    let v = rng.below(xshape[0] + 4) as i64 - 2;
                    if rng.below(3) == 0 { v } else { v.clamp(0, s - 1) }
                };
                ((0..numel(&ishape)).map(|_| p()).collect(), ishape, 0, s)
            }
            // one_hot with `size` classes
            _ => {
                let n = iraw[0] + 1;
                ((0..n).map(|_| pick()).collect(), vec![n], 0, size)
            }
        };
        let run = |dev: &Device| -> tpu_tensor::Result<Tensor> {
            let x = x.to_device(dev)?;
            let ix = Tensor::from_slice(&idx, &ishape[..], &cpu)?.to_device(dev)?;
            match op {
                0 => x.gather(dim, &ix),
                1 => {
                    let src = Tensor::ones(ishape.clone(), DType::F32, dev)?;
                    x.scatter(dim, &ix, &src)
                }
                2 => {
                    let src = Tensor::ones(ishape.clone(), DType::F32, dev)?;
                    x.scatter_add(dim, &ix, &src)
                }
                3 => x.index_select(dim, &ix),
                4 => {
                    let mut s = xshape.clone();
                    s[dim] = ishape[0];
                    let src = Tensor::ones(s, DType::F32, dev)?;
                    x.index_add(dim, &ix, &src, 2.0)
                }
                5 => {
                    let w = x.reshape([xshape[0], numel(&xshape) / xshape[0]])?;
                    embedding(&ix, &w)
                }
                _ => ix.one_hot(size),
            }
        };
        let want = run(&cpu);
        let bad = idx.iter().find(|&&v| v < 0 || v >= checked_size);
        match (&want, bad) {
            (Err(e), Some(&b)) => {
                let text = e.to_string();
                prop_assert!(
                    text.contains(&format!(" {b} ")) && text.contains(&format!("{checked_dim}")),
                    "{}",
                    text
                );
            }
            (Ok(_), None) => {}
            (w, b) => prop_assert!(false, "cpu gave {:?} with first bad index {:?}", w.as_ref().map(|t| t.shape().to_vec()), b),
        }
        for dev in devices().iter().skip(1) {
            match (&want, run(dev)) {
                (Ok(w), Ok(g)) => prop_assert!(same(&read(w), &read(&g))),
                (Err(w), Err(g)) => prop_assert_eq!(w.to_string(), g.to_string()),
                (w, g) => prop_assert!(false, "cpu {:?}, {} {:?}", w.is_ok(), dev, g.err()),
            }
        }
    }
}

test_device!(
    /// `diagonal` as PyTorch gives it, a view (offsets above and below, negative dims, an
    /// empty diagonal, the default dims of a 3-D tensor), and its gradient into the diagonal's
    /// storage positions:
    ///
    /// ```python
    /// x = torch.arange(24.).reshape(2, 3, 4)
    /// x.diagonal()            # [[0, 16], [1, 17], [2, 18], [3, 19]], shape [4, 2]
    /// x.diagonal(1, 1, 2)     # [[1, 6, 11], [13, 18, 23]]
    /// x.diagonal(-1, 0, 2)    # [[12], [16], [20]]
    /// x.diagonal(2, -1, -2)   # [[8], [20]]
    /// x.diagonal(5, 1, 2).shape   # [2, 0]
    /// xg = torch.arange(12., requires_grad=True)
    /// (xg.reshape(3, 4).diagonal(1) * torch.tensor([1., 2., 3.])).sum().backward()
    /// xg.grad   # [0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 3]
    /// ```
    diagonal_matches_pytorch,
    |dev| {
        use tpu_ops::prelude::*;
        let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32, &dev)
            .unwrap()
            .view([2, 3, 4])
            .unwrap();
        // (offset, dim1, dim2, shape, values)
        type Case = (i64, i64, i64, Vec<usize>, Vec<f64>);
        let cases: [Case; 5] = [
            (0, 0, 1, vec![4, 2], vec![0., 16., 1., 17., 2., 18., 3., 19.]),
            (1, 1, 2, vec![2, 3], vec![1., 6., 11., 13., 18., 23.]),
            (-1, 0, 2, vec![3, 1], vec![12., 16., 20.]),
            (2, -1, -2, vec![2, 1], vec![8., 20.]),
            (5, 1, 2, vec![2, 0], vec![]),
        ];
        for (offset, d1, d2, shape, want) in cases {
            let d = x.diagonal(offset, d1, d2).unwrap();
            assert_eq!(d.shape(), shape.as_slice(), "diagonal({offset}, {d1}, {d2})");
            assert!(std::sync::Arc::ptr_eq(d.storage(), x.storage()), "a view");
            assert_eq!(read(&d), want, "diagonal({offset}, {d1}, {d2})");
        }
        assert!(x.diagonal(0, 1, 1).is_err());
        assert!(x.diagonal(0, 0, 3).is_err());
        let v = Tensor::arange(0.0, 3.0, 1.0, DType::F32, &dev).unwrap();
        assert!(v.diagonal(0, 0, -1).is_err(), "a vector has no diagonal");

        let xg = Tensor::arange(0.0, 12.0, 1.0, DType::F32, &dev)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], &Device::cpu())
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let y = xg.view([3, 4]).unwrap().diagonal(1, 0, 1).unwrap();
        y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        let g = read(&xg.grad().expect("a gradient"));
        assert_eq!(g, [0., 1., 0., 0., 0., 0., 2., 0., 0., 0., 0., 3.]);
    }
);

test_device!(
    /// `select_scatter` and `slice_scatter` as PyTorch gives them (negative index and bounds,
    /// a step, an end past the dim), their gradients into both inputs, and a wrong `src` shape
    /// refused:
    ///
    /// ```python
    /// x = torch.arange(12.).reshape(3, 4)
    /// torch.select_scatter(x, torch.tensor([-1., -2., -3., -4.]), 0, 1)
    /// torch.select_scatter(x, torch.tensor([-1., -2., -3.]), 1, -1)
    /// torch.slice_scatter(x, -torch.ones(3, 2), 1, 0, 4, 2)
    /// torch.slice_scatter(x, -torch.ones(2, 4), 0, -2)
    /// torch.slice_scatter(x, -torch.ones(3, 1), 1, 1, 100, 5)
    /// xg = torch.arange(12., requires_grad=True); sg = torch.tensor([1., 2., 3.], requires_grad=True)
    /// y = torch.slice_scatter(xg.reshape(3, 4), sg.reshape(3, 1), 1, 1, 3, 2)
    /// (y * (torch.arange(12.).reshape(3, 4) + 1)).sum().backward()
    /// xg.grad, sg.grad   # [1, 0, 3, 4, 5, 0, 7, 8, 9, 0, 11, 12], [2, 6, 10]
    /// ```
    select_and_slice_scatter_match_pytorch,
    |dev| {
        use tpu_ops::prelude::*;
        let t = |v: Vec<f32>, shape: &[usize]| {
            Tensor::from_vec(v, shape, &Device::cpu())
                .unwrap()
                .to_device(&dev)
                .unwrap()
        };
        let x = Tensor::arange(0.0, 12.0, 1.0, DType::F32, &dev)
            .unwrap()
            .view([3, 4])
            .unwrap();
        let got = x.select_scatter(&t(vec![-1., -2., -3., -4.], &[4]), 0, 1).unwrap();
        assert_eq!(read(&got), [0., 1., 2., 3., -1., -2., -3., -4., 8., 9., 10., 11.]);
        let got = x.select_scatter(&t(vec![-1., -2., -3.], &[3]), 1, -1).unwrap();
        assert_eq!(read(&got), [0., 1., 2., -1., 4., 5., 6., -2., 8., 9., 10., -3.]);
        let got = x.slice_scatter(&t(vec![-1.; 6], &[3, 2]), 1, Some(0), Some(4), 2).unwrap();
        assert_eq!(read(&got), [-1., 1., -1., 3., -1., 5., -1., 7., -1., 9., -1., 11.]);
        let got = x.slice_scatter(&t(vec![-1.; 8], &[2, 4]), 0, Some(-2), None, 1).unwrap();
        assert_eq!(read(&got), [0., 1., 2., 3., -1., -1., -1., -1., -1., -1., -1., -1.]);
        let got = x.slice_scatter(&t(vec![-1.; 3], &[3, 1]), 1, Some(1), Some(100), 5).unwrap();
        assert_eq!(read(&got), [0., -1., 2., 3., 4., -1., 6., 7., 8., -1., 10., 11.]);
        assert_eq!(read(&x), (0..12).map(|v| v as f64).collect::<Vec<_>>(), "x untouched");
        assert!(x.select_scatter(&t(vec![1.; 3], &[3]), 0, 1).is_err());
        assert!(x.select_scatter(&t(vec![1.; 4], &[4]), 0, 3).is_err());
        assert!(x.slice_scatter(&t(vec![1.; 6], &[3, 2]), 1, None, None, 0).is_err());

        let xg = Tensor::arange(0.0, 12.0, 1.0, DType::F32, &dev)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let sg = t(vec![1., 2., 3.], &[3]).requires_grad_(true).unwrap();
        let w = Tensor::arange(1.0, 13.0, 1.0, DType::F32, &dev)
            .unwrap()
            .view([3, 4])
            .unwrap();
        let y = xg
            .view([3, 4])
            .unwrap()
            .slice_scatter(&sg.view([3, 1]).unwrap(), 1, Some(1), Some(3), 2)
            .unwrap();
        y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        assert_eq!(
            read(&xg.grad().expect("x's gradient")),
            [1., 0., 3., 4., 5., 0., 7., 8., 9., 0., 11., 12.]
        );
        assert_eq!(read(&sg.grad().expect("src's gradient")), [2., 6., 10.]);
    }
);

test_device!(
    /// `nonzero` and `masked_scatter` as PyTorch gives them (NaN is non-zero, -0.0 is not; 0-d
    /// and empty inputs; a broadcast mask), and `masked_scatter`'s gradients into both inputs:
    ///
    /// ```python
    /// torch.nonzero(torch.tensor([[0., 1.5, 0.], [nan, 0., -0.0]]))   # [[0, 1], [1, 0]]
    /// torch.nonzero(torch.tensor(3.)).shape, torch.nonzero(torch.tensor(0)).shape  # [1, 0], [0, 0]
    /// torch.nonzero(torch.zeros(2, 0)).shape                           # [0, 2]
    /// x = torch.arange(6.).reshape(2, 3); s = torch.tensor([10., 20., 30., 40., 50.])
    /// m = torch.tensor([[True, False, True], [False, True, True]])
    /// x.masked_scatter(m, s)                          # [[10, 1, 20], [3, 30, 40]]
    /// x.masked_scatter(torch.tensor([True, False, True]), s)   # [[10, 1, 20], [30, 4, 40]]
    /// xg = torch.arange(6., requires_grad=True); sg = s.clone().requires_grad_()
    /// (xg.reshape(2, 3).masked_scatter(m, sg) * (torch.arange(6.).reshape(2, 3) + 1)).sum().backward()
    /// xg.grad, sg.grad   # [0, 2, 0, 4, 0, 0], [1, 3, 5, 6, 0]
    /// ```
    nonzero_and_masked_scatter_match_pytorch,
    |dev| {
        use tpu_ops::prelude::*;
        let on = |t: Tensor| t.to_device(&dev).unwrap();
        let x = on(Tensor::from_vec(vec![0.0f32, 1.5, 0.0, f32::NAN, 0.0, -0.0], [2, 3], &Device::cpu()).unwrap());
        let nz = x.nonzero().unwrap();
        assert_eq!(nz.shape(), [2, 2]);
        assert_eq!(nz.dtype(), DType::I64);
        assert_eq!(read(&nz), [0., 1., 1., 0.]);
        assert_eq!(on(Tensor::scalar(3.0f32, &Device::cpu()).unwrap()).nonzero().unwrap().shape(), [1, 0]);
        assert_eq!(on(Tensor::scalar(0i64, &Device::cpu()).unwrap()).nonzero().unwrap().shape(), [0, 0]);
        assert_eq!(on(Tensor::zeros([2, 0], DType::F32, &Device::cpu()).unwrap()).nonzero().unwrap().shape(), [0, 2]);

        let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &dev).unwrap().view([2, 3]).unwrap();
        let s = on(Tensor::from_vec(vec![10.0f32, 20., 30., 40., 50.], [5], &Device::cpu()).unwrap());
        let m = on(Tensor::from_vec(vec![true, false, true, false, true, true], [2, 3], &Device::cpu()).unwrap());
        assert_eq!(read(&x.masked_scatter(&m, &s).unwrap()), [10., 1., 20., 3., 30., 40.]);
        let row = on(Tensor::from_vec(vec![true, false, true], [3], &Device::cpu()).unwrap());
        assert_eq!(read(&x.masked_scatter(&row, &s).unwrap()), [10., 1., 20., 30., 4., 40.]);
        let none = on(Tensor::zeros([2, 3], DType::Bool, &Device::cpu()).unwrap());
        let empty = on(Tensor::zeros([0], DType::F32, &Device::cpu()).unwrap());
        assert_eq!(read(&x.masked_scatter(&none, &empty).unwrap()), [0., 1., 2., 3., 4., 5.]);
        assert!(x.masked_scatter(&m, &empty).is_err(), "an empty source for selected positions");
        assert!(x.masked_scatter(&x, &s).is_err(), "a float mask");

        let xg = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &dev).unwrap().requires_grad_(true).unwrap();
        let sg = s.copy().unwrap().requires_grad_(true).unwrap();
        let w = Tensor::arange(1.0, 7.0, 1.0, DType::F32, &dev).unwrap().view([2, 3]).unwrap();
        let y = xg.view([2, 3]).unwrap().masked_scatter(&m, &sg).unwrap();
        y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        assert_eq!(read(&xg.grad().expect("x's gradient")), [0., 2., 0., 4., 0., 0.]);
        assert_eq!(read(&sg.grad().expect("source's gradient")), [1., 3., 5., 6., 0.]);
    }
);

test_device!(
    /// `constant_pad_nd` with negative amounts crops, as `F.pad` in constant mode does, and
    /// returns a new tensor; its gradient reaches the kept elements:
    ///
    /// ```python
    /// x = torch.arange(12.).reshape(3, 4)
    /// F.pad(x, (-1, 2, 1, -2), value=9.)   # [[9, 9, 9, 9, 9], [1, 2, 3, 9, 9]]
    /// F.pad(x, (-2, -2)).shape             # [3, 0]
    /// xg = torch.arange(12., requires_grad=True)
    /// y = F.pad(xg.reshape(3, 4), (-1, 2, 1, -2), value=9.)
    /// (y * torch.arange(1., 11.).reshape(2, 5)).sum().backward()
    /// xg.grad   # [0, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0]
    /// ```
    constant_pad_nd_crops_with_negative_pads_like_pytorch,
    |dev| {
        use tpu_ops::prelude::*;
        let x = Tensor::arange(0.0, 12.0, 1.0, DType::F32, &dev).unwrap().view([3, 4]).unwrap();
        let y = x.constant_pad_nd(&[-1, 2, 1, -2], 9.0).unwrap();
        assert_eq!(y.shape(), [2, 5]);
        assert_eq!(read(&y), [9., 9., 9., 9., 9., 1., 2., 3., 9., 9.]);
        assert_eq!(x.constant_pad_nd(&[-2, -2], 0.0).unwrap().shape(), [3, 0]);
        let c = x.constant_pad_nd(&[-1, -1], 0.0).unwrap();
        assert_eq!(read(&c), [1., 2., 5., 6., 9., 10.]);
        assert!(!std::sync::Arc::ptr_eq(c.storage(), x.storage()), "a new tensor");
        assert_eq!(read(&x.constant_pad_nd(&[1, 0], 7.0).unwrap())[..5], [7., 0., 1., 2., 3.]);
        assert!(x.constant_pad_nd(&[-3, -2], 0.0).is_err(), "a negative size");
        assert!(x.constant_pad_nd(&[1, 1, 1], 0.0).is_err(), "not pairs");
        assert!(x.constant_pad_nd(&[0, 0, 0, 0, 1, 1], 0.0).is_err(), "more pairs than dims");

        let xg = Tensor::arange(0.0, 12.0, 1.0, DType::F32, &dev).unwrap().requires_grad_(true).unwrap();
        let w = Tensor::arange(1.0, 11.0, 1.0, DType::F32, &dev).unwrap().view([2, 5]).unwrap();
        let y = xg.view([3, 4]).unwrap().constant_pad_nd(&[-1, 2, 1, -2], 9.0).unwrap();
        y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        assert_eq!(read(&xg.grad().unwrap()), [0., 6., 7., 8., 0., 0., 0., 0., 0., 0., 0., 0.]);
    }
);

test_device!(
    /// Advanced indexing as PyTorch places and fills it: a tensor index on a later dim, indices
    /// that broadcast on non-adjacent dims (the index dims go in front) and on adjacent ones
    /// (they stay in place), bool masks over one and two dims, negative indices, gradients with
    /// a repeated index, and the errors:
    ///
    /// ```python
    /// x = torch.arange(24.).reshape(2, 3, 4)
    /// x[:, torch.tensor([2, 0, -1])]                                   # shape [2, 3, 4]
    /// x[torch.tensor([1, 0]), :, torch.tensor([[3], [0]])]             # shape [2, 2, 3]
    /// x[:, torch.tensor([[0], [2]]), torch.tensor([1, 3])]             # shape [2, 2, 2]
    /// x[torch.tensor([[True, False, True], [False, False, True]])]     # shape [3, 4]
    /// x[:, :, torch.tensor([True, False, True, True])]                 # shape [2, 3, 3]
    /// xg = torch.arange(12., requires_grad=True)
    /// (xg.reshape(3, 4)[torch.tensor([0, 2, 0]), torch.tensor([1, 1, 1])] * torch.tensor([1., 2., 3.])).sum().backward()
    /// xg.grad   # [0, 4, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0]
    /// x[:, torch.tensor([3])]    # IndexError: index 3 is out of bounds for dimension 0 with size 3
    /// x[torch.tensor([0, 1]), torch.tensor([0, 1, 2])]   # shapes [2], [3] do not broadcast
    /// ```
    advanced_indexing_matches_pytorch,
    |dev| {
        use tpu_ops::prelude::*;
        let on = |t: Tensor| t.to_device(&dev).unwrap();
        let ints = |v: Vec<i64>, shape: &[usize]| on(Tensor::from_vec(v, shape, &Device::cpu()).unwrap());
        let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32, &dev).unwrap().view([2, 3, 4]).unwrap();
        let i = ints(vec![2, 0, -1], &[3]);
        let y = x.index(&[None, Some(&i)]).unwrap();
        assert_eq!(y.shape(), [2, 3, 4]);
        assert_eq!(read(&y), [8., 9., 10., 11., 0., 1., 2., 3., 8., 9., 10., 11., 20., 21., 22., 23., 12., 13., 14., 15., 20., 21., 22., 23.]);
        let (a, c) = (ints(vec![1, 0], &[2]), ints(vec![3, 0], &[2, 1]));
        let y = x.index(&[Some(&a), None, Some(&c)]).unwrap();
        assert_eq!(y.shape(), [2, 2, 3]);
        assert_eq!(read(&y), [15., 19., 23., 3., 7., 11., 12., 16., 20., 0., 4., 8.]);
        let (b, c) = (ints(vec![0, 2], &[2, 1]), ints(vec![1, 3], &[2]));
        let y = x.index(&[None, Some(&b), Some(&c)]).unwrap();
        assert_eq!(y.shape(), [2, 2, 2]);
        assert_eq!(read(&y), [1., 3., 9., 11., 13., 15., 21., 23.]);
        let m = on(Tensor::from_vec(vec![true, false, true, false, false, true], [2, 3], &Device::cpu()).unwrap());
        let y = x.index(&[Some(&m)]).unwrap();
        assert_eq!(y.shape(), [3, 4]);
        assert_eq!(read(&y), [0., 1., 2., 3., 8., 9., 10., 11., 20., 21., 22., 23.]);
        let m1 = on(Tensor::from_vec(vec![true, false, true, true], [4], &Device::cpu()).unwrap());
        let y = x.index(&[None, None, Some(&m1)]).unwrap();
        assert_eq!(y.shape(), [2, 3, 3]);
        assert_eq!(read(&y), [0., 2., 3., 4., 6., 7., 8., 10., 11., 12., 14., 15., 16., 18., 19., 20., 22., 23.]);

        let xg = Tensor::arange(0.0, 12.0, 1.0, DType::F32, &dev).unwrap().requires_grad_(true).unwrap();
        let (r, k) = (ints(vec![0, 2, 0], &[3]), ints(vec![1, 1, 1], &[3]));
        let w = on(Tensor::from_vec(vec![1.0f32, 2., 3.], [3], &Device::cpu()).unwrap());
        let y = xg.view([3, 4]).unwrap().index(&[Some(&r), Some(&k)]).unwrap();
        y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        assert_eq!(read(&xg.grad().unwrap()), [0., 4., 0., 0., 0., 0., 0., 0., 0., 2., 0., 0.]);

        let e = x.index(&[None, Some(&ints(vec![3], &[1]))]).unwrap_err().to_string();
        assert!(e.contains('3') && e.contains("index"), "{e}");
        let e = x.index(&[Some(&ints(vec![0, 1], &[2])), Some(&ints(vec![0, 1, 2], &[3]))]).unwrap_err().to_string();
        assert!(e.contains("broadcast"), "{e}");
        assert!(x.index(&[Some(&x)]).is_err(), "float indices");
        assert!(x.index(&[None, None, None, Some(&i)]).is_err(), "more indices than dims");
        assert!(x.index(&[Some(&m1)]).is_err(), "a mask of the wrong shape");
    }
);

/// `x[indices]` by the definition: the output's shape (the broadcast index shape in place of
/// adjacent indexed dims, else in front) and the flat position in `x` of each element.
fn index_reference(
    shape: &[usize],
    indices: &[Option<(Vec<i64>, Vec<usize>)>],
) -> (Vec<usize>, Vec<usize>) {
    let dims: Vec<usize> = (0..indices.len())
        .filter(|&d| indices[d].is_some())
        .collect();
    let b = dims.iter().fold(Vec::new(), |acc: Vec<usize>, &d| {
        let s = &indices[d].as_ref().unwrap().1;
        let r = acc.len().max(s.len());
        (0..r)
            .map(|i| {
                let get = |v: &[usize]| {
                    if i + v.len() >= r {
                        v[i + v.len() - r]
                    } else {
                        1
                    }
                };
                get(&acc).max(get(s))
            })
            .collect()
    });
    let rest: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
    let adjacent = dims.windows(2).all(|w| w[1] == w[0] + 1);
    let at = if adjacent { dims[0] } else { 0 };
    let rest_shape: Vec<usize> = rest.iter().map(|&d| shape[d]).collect();
    let mut out_shape = rest_shape[..at].to_vec();
    out_shape.extend(&b);
    out_shape.extend(&rest_shape[at..]);
    let n: usize = out_shape.iter().product();
    let mut out = Vec::with_capacity(n);
    for flat in 0..n {
        let mut o = vec![0; out_shape.len()];
        let mut r = flat;
        for k in (0..out_shape.len()).rev() {
            o[k] = r % out_shape[k];
            r /= out_shape[k];
        }
        let bo = &o[at..at + b.len()];
        let ro: Vec<usize> = o[..at].iter().chain(&o[at + b.len()..]).copied().collect();
        let mut coord = vec![0usize; shape.len()];
        for (i, &d) in rest.iter().enumerate() {
            coord[d] = ro[i];
        }
        for &d in &dims {
            let (vals, s) = indices[d].as_ref().unwrap();
            let mut lin = 0;
            for (k, &sz) in s.iter().enumerate() {
                let bk = bo[b.len() - s.len() + k];
                lin = lin * sz + if sz == 1 { 0 } else { bk };
            }
            let v = vals[lin];
            coord[d] = if v < 0 {
                (v + shape[d] as i64) as usize
            } else {
                v as usize
            };
        }
        out.push(coord.iter().zip(shape).fold(0, |acc, (&c, &s)| acc * s + c));
    }
    (out_shape, out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(64)))]

    /// Advanced indexing against the definition, for every placement of indexed and whole
    /// dims and index shapes that broadcast: reading, and writing with accumulation.
    #[test]
    fn advanced_indexing_matches_the_definition(
        shape in vec(1usize..4, 1..4),
        which in vec(any::<bool>(), 1..4),
        base in vec(1usize..4, 0..3),
        seed in any::<u64>(),
    ) {
        use tpu_ops::prelude::*;
        let mut rng = Rng::new(seed);
        let n: usize = shape.iter().product();
        let xs: Vec<f64> = (0..n).map(|v| v as f64).collect();
        let x = Tensor::from_vec(xs.clone(), shape.as_slice(), &Device::cpu()).unwrap();
        let mut which: Vec<bool> = which.into_iter().take(shape.len()).collect();
        if !which.contains(&true) {
            which[0] = true;
        }
        let mut spec = Vec::new();
        for (d, &on) in which.iter().enumerate() {
            if !on {
                spec.push(None);
                continue;
            }
            // The base shape with some dims at 1 and, sometimes, leading dims dropped.
            let drop = rng.below(base.len() + 1);
            let s: Vec<usize> = base[drop..].iter().map(|&k| if rng.coin() { 1 } else { k }).collect();
            let count: usize = s.iter().product();
            let size = shape[d] as i64;
            let vals: Vec<i64> = (0..count).map(|_| rng.below(2 * size as usize) as i64 - size).collect();
            spec.push(Some((vals, s)));
        }
        let tensors: Vec<Option<Tensor>> = spec
            .iter()
            .map(|s| s.as_ref().map(|(v, sh)| Tensor::from_vec(v.clone(), sh.as_slice(), &Device::cpu()).unwrap()))
            .collect();
        let refs: Vec<Option<&Tensor>> = tensors.iter().map(|t| t.as_ref()).collect();
        let got = x.index(&refs).unwrap();
        let (want_shape, positions) = index_reference(&shape, &spec);
        prop_assert_eq!(got.shape(), want_shape.as_slice());
        prop_assert_eq!(read(&got), positions.iter().map(|&p| xs[p]).collect::<Vec<_>>());
        let m = positions.len();
        let vals: Vec<f64> = (0..m).map(|k| 100.0 * (k + 1) as f64).collect();
        let v = Tensor::from_vec(vals.clone(), want_shape.as_slice(), &Device::cpu()).unwrap();
        let put = x.index_put(&refs, &v, true).unwrap();
        let mut want = xs.clone();
        for (&p, &val) in positions.iter().zip(&vals) {
            want[p] += val;
        }
        prop_assert_eq!(put.shape(), shape.as_slice());
        prop_assert_eq!(read(&put), want);
    }
}

test_device!(
    /// `index_put` as `x[...] = v` and `index_put_(..., accumulate=True)` give it: values
    /// broadcast to the indexed shape (index dims in place or in front), bool masks, repeated
    /// positions adding up with `accumulate`, gradients into both tensors, and `x` unchanged:
    ///
    /// ```python
    /// y = torch.arange(24.).reshape(2, 3, 4)
    /// r = y.clone(); r[:, torch.tensor([[0], [2]]), torch.tensor([1, 3])] = torch.tensor([-1., -2.])
    /// r = y.clone(); r[torch.tensor([1, 0]), :, torch.tensor([[3], [0]])] = torch.tensor([-1., -2., -3.])
    /// r = y.clone(); r[torch.tensor([[True, False, True], [False, False, True]])] = torch.tensor([[-1.], [-2.], [-3.]])
    /// r = y.clone(); r.index_put_((torch.tensor([0, 0]), torch.tensor([1, 1])), torch.tensor([[10.], [20.]]), accumulate=True)
    /// xg = torch.zeros(12, requires_grad=True); vg = torch.tensor([1., 2., 3.], requires_grad=True)
    /// o = torch.index_put(xg.reshape(3, 4), (torch.tensor([0, 2, 0]), torch.tensor([1, 1, 2])), vg, accumulate=True)
    /// (o * torch.arange(1., 13.).reshape(3, 4)).sum().backward()   # xg.grad 1..12, vg.grad [2, 10, 3]
    /// xg2, vg2 = torch.zeros(12, requires_grad=True), torch.tensor([1., 2.], requires_grad=True)
    /// o = torch.index_put(xg2.reshape(3, 4), (torch.tensor([0, 2]), torch.tensor([1, 1])), vg2)
    /// (o * torch.arange(1., 13.).reshape(3, 4)).sum().backward()   # xg2.grad 0 at 1 and 9, vg2.grad [2, 10]
    /// ```
    index_put_matches_pytorch,
    |dev| {
        use tpu_ops::prelude::*;
        let on = |t: Tensor| t.to_device(&dev).unwrap();
        let ints = |v: Vec<i64>, shape: &[usize]| on(Tensor::from_vec(v, shape, &Device::cpu()).unwrap());
        let floats = |v: Vec<f32>, shape: &[usize]| on(Tensor::from_vec(v, shape, &Device::cpu()).unwrap());
        let y = Tensor::arange(0.0, 24.0, 1.0, DType::F32, &dev).unwrap().view([2, 3, 4]).unwrap();
        let (b, c) = (ints(vec![0, 2], &[2, 1]), ints(vec![1, 3], &[2]));
        let r = y.index_put(&[None, Some(&b), Some(&c)], &floats(vec![-1., -2.], &[2]), false).unwrap();
        assert_eq!(r.shape(), [2, 3, 4]);
        assert_eq!(read(&r), [0., -1., 2., -2., 4., 5., 6., 7., 8., -1., 10., -2., 12., -1., 14., -2., 16., 17., 18., 19., 20., -1., 22., -2.]);
        let (a, c) = (ints(vec![1, 0], &[2]), ints(vec![3, 0], &[2, 1]));
        let r = y.index_put(&[Some(&a), None, Some(&c)], &floats(vec![-1., -2., -3.], &[3]), false).unwrap();
        assert_eq!(read(&r), [-1., 1., 2., -1., -2., 5., 6., -2., -3., 9., 10., -3., -1., 13., 14., -1., -2., 17., 18., -2., -3., 21., 22., -3.]);
        let m = on(Tensor::from_vec(vec![true, false, true, false, false, true], [2, 3], &Device::cpu()).unwrap());
        let r = y.index_put(&[Some(&m)], &floats(vec![-1., -2., -3.], &[3, 1]), false).unwrap();
        assert_eq!(read(&r), [-1., -1., -1., -1., 4., 5., 6., 7., -2., -2., -2., -2., 12., 13., 14., 15., 16., 17., 18., 19., -3., -3., -3., -3.]);
        let (i, j) = (ints(vec![0, 0], &[2]), ints(vec![1, 1], &[2]));
        let r = y.index_put(&[Some(&i), Some(&j)], &floats(vec![10., 20.], &[2, 1]), true).unwrap();
        let mut want: Vec<f64> = (0..24).map(|v| v as f64).collect();
        for w in &mut want[4..8] {
            *w += 30.0;
        }
        assert_eq!(read(&r), want);
        assert_eq!(read(&y), (0..24).map(|v| v as f64).collect::<Vec<_>>(), "y unchanged");
        assert!(y.index_put(&[Some(&i)], &floats(vec![1., 2., 3.], &[3]), false).is_err(), "values that do not broadcast");
        assert!(y.index_put(&[Some(&i)], &ints(vec![1], &[1]), false).is_err(), "values of another dtype");

        for (accumulate, rows, cols, vals, want_x, want_v) in [
            (true, vec![0i64, 2, 0], vec![1i64, 1, 2], vec![1.0f32, 2., 3.], (1..=12).map(|v| v as f64).collect::<Vec<_>>(), vec![2., 10., 3.]),
            (false, vec![0, 2], vec![1, 1], vec![1., 2.], vec![1., 0., 3., 4., 5., 6., 7., 8., 9., 0., 11., 12.], vec![2., 10.]),
        ] {
            let n = rows.len();
            let xg = Tensor::zeros([12], DType::F32, &dev).unwrap().requires_grad_(true).unwrap();
            let vg = floats(vals, &[n]).requires_grad_(true).unwrap();
            let w = Tensor::arange(1.0, 13.0, 1.0, DType::F32, &dev).unwrap().view([3, 4]).unwrap();
            let (r, c) = (ints(rows, &[n]), ints(cols, &[n]));
            let o = xg.view([3, 4]).unwrap().index_put(&[Some(&r), Some(&c)], &vg, accumulate).unwrap();
            o.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
            assert_eq!(read(&xg.grad().unwrap()), want_x, "accumulate {accumulate}");
            assert_eq!(read(&vg.grad().unwrap()), want_v, "accumulate {accumulate}");
        }
    }
);
