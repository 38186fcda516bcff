//! Backward rules of the movement ops: against central finite differences (proptest, f64, CPU),
//! against gradients printed by PyTorch, and on the PJRT CPU plugin against the native CPU.

use crate::common::{Rng, cpu, gradcheck_or_panic, numel, pjrt, randn, vals as read};
use proptest::prelude::*;
use tpu_ops::autograd::grad_of;
use tpu_ops::ops::movement::{MovementOps, PadMode, ScatterReduction, cat, embedding, stack};
use tpu_ops::prelude::*;
use tpu_ops::testing::assert_close;
use tpu_tensor::{DType, Device, Generator, Result, Tensor};

// ---- helpers -----------------------------------------------------------------------------------

/// Finite differences of these ops are exact up to rounding: they only move and add values.
const EPS: f64 = 1e-6;
const TOL: f64 = 1e-6;

/// Few cases per property: every case runs the function twice per input element.
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 20,
        ..ProptestConfig::default()
    }
}

fn f64s(vals: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(vals, shape, &cpu()).unwrap()
}

fn i64s(vals: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(vals, shape, &cpu()).unwrap()
}

/// A rank in `1..=3`, a shape of that rank with dims in `1..=3`, and one of its dims.
fn shape_and_dim(rng: &mut Rng) -> (usize, Vec<usize>, usize) {
    let rank = rng.range(1, 3);
    let shape = rng.shape(rank, 1, 3);
    let dim = rng.range(0, rank - 1);
    (rank, shape, dim)
}

/// Index values `0..n` (with repeats) for every element of `shape`.
fn rand_index(rng: &mut Rng, shape: &[usize], n: usize) -> Tensor {
    let v: Vec<i64> = (0..numel(shape))
        .map(|_| rng.range(0, n - 1) as i64)
        .collect();
    i64s(&v, shape)
}

fn check(what: &str, f: impl Fn(&[Tensor]) -> Result<Tensor>, inputs: &[Tensor]) {
    gradcheck_or_panic(what, f, inputs, EPS, TOL)
}

// ---- finite differences ------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn cat_gradcheck(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (rank, base, dim) = shape_and_dim(&mut rng);
        let k = rng.range(1, 3);
        let mut inputs = Vec::new();
        for i in 0..k {
            let mut s = base.clone();
            s[dim] = rng.range(0, 3);
            inputs.push(randn(seed ^ i as u64, &s));
        }
        // A 1-D empty tensor (skipped by cat) and an integer one (promoted; no gradient).
        if rng.coin() {
            inputs.push(Tensor::zeros([0], DType::F64, &cpu()).unwrap());
        }
        if rng.coin() {
            inputs.push(rand_index(&mut rng, &base, 5));
        }
        let neg = rng.coin();
        let d = if neg { dim as i64 - rank as i64 } else { dim as i64 };
        check("cat", |x| cat(&x.iter().collect::<Vec<_>>(), d), &inputs);
    }

    #[test]
    fn stack_gradcheck(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let rank = rng.range(0, 2);
        let shape = rng.shape(rank, 1, 3);
        let k = rng.range(1, 3);
        let dim = rng.range(0, rank) as i64;
        let inputs: Vec<Tensor> = (0..k).map(|i| randn(seed ^ i as u64, &shape)).collect();
        check("stack", |x| stack(&x.iter().collect::<Vec<_>>(), dim), &inputs);
    }

    #[test]
    fn pad_gradcheck(seed in any::<u64>(), mode in 0usize..3) {
        let mut rng = Rng::new(seed);
        let rank = rng.range(1, 3);
        let shape = rng.shape(rank, 1, 4);
        let padded = rng.range(1, rank);
        let mode = match mode {
            0 => PadMode::Constant(1.5.into()),
            1 => PadMode::Reflect,
            _ => PadMode::Replicate,
        };
        // Pairs from the last dim; reflect padding must be smaller than the dim.
        let mut pads = Vec::new();
        for p in 0..padded {
            let n = shape[rank - 1 - p];
            let most = if mode == PadMode::Reflect { n - 1 } else { 3 };
            pads.push(rng.range(0, most));
            pads.push(rng.range(0, most));
        }
        check(
            "pad",
            |x| x[0].pad(&pads, mode),
            &[randn(seed, &shape)],
        );
    }

    #[test]
    fn gather_gradcheck(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (rank, shape, dim) = shape_and_dim(&mut rng);
        // No larger than the input except along dim; repeats accumulate.
        let ishape: Vec<usize> = (0..rank)
            .map(|d| if d == dim { rng.range(0, 4) } else { rng.range(1, shape[d]) })
            .collect();
        let index = rand_index(&mut rng, &ishape, shape[dim]);
        check(
            "gather",
            |x| x[0].gather(dim, &x[1]),
            &[randn(seed, &shape), index],
        );
    }

    #[test]
    fn scatter_gradcheck(seed in any::<u64>(), add in any::<bool>(), value in any::<bool>()) {
        let mut rng = Rng::new(seed);
        let (rank, shape, dim) = shape_and_dim(&mut rng);
        let ishape: Vec<usize> = (0..rank)
            .map(|d| rng.range(1, shape[d]))
            .collect();
        // Unique indices along dim for replace (which of two updates wins is unspecified);
        // repeats for scatter_add.
        let mut ix = vec![0i64; numel(&ishape)];
        let inner: usize = ishape[dim + 1..].iter().product();
        let outer: usize = ishape[..dim].iter().product();
        for o in 0..outer {
            for i in 0..inner {
                let p = rng.perm(shape[dim]);
                for j in 0..ishape[dim] {
                    let v = if add { rng.range(0, shape[dim] - 1) } else { p[j] };
                    ix[(o * ishape[dim] + j) * inner + i] = v as i64;
                }
            }
        }
        let index = i64s(&ix, &ishape);
        // src may be larger than the index: its other elements get no gradient.
        let sshape: Vec<usize> = ishape.iter().map(|&n| n + rng.range(0, 1)).collect();
        let x = randn(seed, &shape);
        let src = randn(seed ^ 1, &sshape);
        if add {
            check("scatter_add", |t| t[0].scatter_add(dim, &t[1], &t[2]), &[x, index, src]);
        } else if value {
            check("scatter(value)", |t| t[0].scatter_value(dim, &t[1], -2.5), &[x, index]);
        } else {
            check("scatter", |t| t[0].scatter(dim, &t[1], &t[2]), &[x, index, src]);
        }
    }

    #[test]
    fn scatter_reduce_gradcheck(
        seed in any::<u64>(),
        reduce_sel in 0usize..5,
        include_self in any::<bool>(),
    ) {
        let reduce = [
            ScatterReduction::Sum,
            ScatterReduction::Prod,
            ScatterReduction::Mean,
            ScatterReduction::Amax,
            ScatterReduction::Amin,
        ][reduce_sel];
        let mut rng = Rng::new(seed);
        let (rank, shape, dim) = shape_and_dim(&mut rng);
        // Repeats meet at one position; randn values leave no ties for amax and amin.
        let ishape: Vec<usize> = (0..rank)
            .map(|d| if d == dim { rng.range(1, 4) } else { rng.range(1, shape[d]) })
            .collect();
        let index = rand_index(&mut rng, &ishape, shape[dim]);
        let sshape: Vec<usize> = ishape.iter().map(|&n| n + rng.range(0, 1)).collect();
        check(
            "scatter_reduce",
            |t| t[0].scatter_reduce(dim, &t[1], &t[2], reduce, include_self),
            &[randn(seed, &shape), index, randn(seed ^ 1, &sshape)],
        );
    }

    #[test]
    fn index_select_gradcheck(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (_, shape, dim) = shape_and_dim(&mut rng);
        let len = rng.range(0, 5);
        let index = rand_index(&mut rng, &[len], shape[dim]);
        check(
            "index_select",
            |x| x[0].index_select(dim, &x[1]),
            &[randn(seed, &shape), index],
        );
    }

    #[test]
    fn index_add_gradcheck(seed in any::<u64>(), alpha in prop::sample::select(vec![1.0, -1.5, 2.0])) {
        let mut rng = Rng::new(seed);
        let (_, shape, dim) = shape_and_dim(&mut rng);
        let len = rng.range(0, 5);
        let index = rand_index(&mut rng, &[len], shape[dim]);
        let mut sshape = shape.clone();
        sshape[dim] = len;
        check(
            "index_add",
            |x| x[0].index_add(dim, &x[1], &x[2], alpha),
            &[randn(seed, &shape), index, randn(seed ^ 1, &sshape)],
        );
    }

    #[test]
    fn index_copy_gradcheck(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (_, shape, dim) = shape_and_dim(&mut rng);
        // Distinct indices: with duplicates, which slice stays is not specified.
        let picked: Vec<i64> = (0..shape[dim] as i64).filter(|_| rng.range(0, 1) == 1).collect();
        let mut sshape = shape.clone();
        sshape[dim] = picked.len();
        check(
            "index_copy",
            |x| x[0].index_copy(dim, &x[1], &x[2]),
            &[randn(seed, &shape), i64s(&picked, &[picked.len()]), randn(seed ^ 1, &sshape)],
        );
    }

    #[test]
    fn masked_fill_gradcheck(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let rank = rng.range(1, 3);
        let full = rng.shape(rank, 1, 3);
        // Either side may be broadcast: the input's gradient is summed back to its shape.
        let xshape: Vec<usize> = full.iter().map(|&n| if rng.range(0, 3) == 0 { 1 } else { n }).collect();
        let mshape: Vec<usize> = full.iter().map(|&n| if rng.range(0, 3) == 0 { 1 } else { n }).collect();
        let mask = Generator::new(seed ^ 7)
            .randint(0, 2, &mshape[..], DType::Bool, &cpu())
            .unwrap();
        check(
            "masked_fill",
            |x| x[0].masked_fill(&x[1], 0.25),
            &[randn(seed, &xshape), mask],
        );
    }

    #[test]
    fn embedding_gradcheck(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (v, e) = (rng.range(1, 4), rng.range(1, 3));
        let irank = rng.range(0, 2);
        let ishape = rng.shape(irank, 0, 3);
        let indices = rand_index(&mut rng, &ishape, v);
        check(
            "embedding",
            |x| embedding(&x[1], &x[0]),
            &[randn(seed, &[v, e]), indices],
        );
    }

    #[test]
    fn tril_triu_gradcheck(seed in any::<u64>(), upper in any::<bool>(), diagonal in -3i64..4) {
        let mut rng = Rng::new(seed);
        let rank = rng.range(2, 3);
        let shape = rng.shape(rank, 1, 4);
        check(
            "tril/triu",
            |x| if upper { x[0].triu(diagonal) } else { x[0].tril(diagonal) },
            &[randn(seed, &shape)],
        );
    }

    #[test]
    fn repeat_and_tile_gradcheck(seed in any::<u64>(), tile in any::<bool>()) {
        let mut rng = Rng::new(seed);
        let rank = rng.range(0, 2);
        let shape = rng.shape(rank, 1, 3);
        let extra = rng.range(0, 2);
        // Zero repetitions now and then: an empty result, a zero gradient.
        let reps: Vec<usize> = (0..rank + extra)
            .map(|_| if rng.range(0, 7) == 0 { 0 } else { rng.range(1, 3) })
            .collect();
        if tile {
            let short = reps[rng.range(0, reps.len())..].to_vec();
            check("tile", |x| x[0].tile(&short), &[randn(seed, &shape)]);
        } else {
            check("repeat", |x| x[0].repeat(&reps), &[randn(seed, &shape)]);
        }
    }

    #[test]
    fn flip_gradcheck(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let rank = rng.range(1, 3);
        let shape = rng.shape(rank, 1, 3);
        // A random subset of the dims, some counted from the end.
        let mut dims = Vec::new();
        for d in 0..rank as i64 {
            match rng.range(0, 2) {
                0 => {}
                1 => dims.push(d),
                _ => dims.push(d - rank as i64),
            }
        }
        check("flip", |x| x[0].flip(&dims), &[randn(seed, &shape)]);
    }

    #[test]
    fn roll_gradcheck(seed in any::<u64>(), flat in any::<bool>()) {
        let mut rng = Rng::new(seed);
        let rank = rng.range(1, 3);
        let shape = rng.shape(rank, 1, 4);
        let shift = |rng: &mut Rng| rng.range(0, 14) as i64 - 7;
        let (shifts, dims) = if flat {
            (vec![shift(&mut rng)], vec![])
        } else {
            // A dim may appear twice: its shifts add up.
            let n = rng.range(1, 3);
            let dims: Vec<i64> = (0..n).map(|_| rng.range(0, rank - 1) as i64).collect();
            ((0..n).map(|_| shift(&mut rng)).collect(), dims)
        };
        check("roll", |x| x[0].roll(&shifts, &dims), &[randn(seed, &shape)]);
    }

    #[test]
    fn sort_and_topk_gradcheck(seed in any::<u64>(), topk in any::<bool>(), descending in any::<bool>()) {
        let mut rng = Rng::new(seed);
        let rank = rng.range(0, 3);
        let shape = rng.shape(rank, 1, 4);
        // Distinct values, far apart next to the finite-difference step, so the order (and so
        // the gradient) is well defined.
        let n = numel(&shape);
        let vals: Vec<f64> = rng.perm(n).iter().map(|&p| p as f64 * 0.5 - 1.0).collect();
        let x = f64s(&vals, &shape);
        let dim = if rank == 0 { 0 } else { rng.range(0, rank - 1) };
        let size = shape.get(dim).copied().unwrap_or(1);
        // k = 0 of a 0-dim tensor is a forward quirk (PyTorch returns the element), not
        // a backward question.
        let k = rng.range(usize::from(rank == 0), size);
        check(
            "sort/topk",
            |t| {
                if topk {
                    Ok(t[0].topk(k, dim, descending, true)?.0)
                } else {
                    Ok(t[0].sort(dim, descending, true)?.0)
                }
            },
            &[x],
        );
    }
}

// ---- values from PyTorch -----------------------------------------------------------------------

/// The gradient of `sum(f(x) * w)` with respect to `x`, on `x`'s device, read back.
fn grad_with(x: &Tensor, f: impl Fn(&Tensor) -> Result<Tensor>, w: &[f64]) -> Vec<f64> {
    let leaf = x.detach().requires_grad_(true).unwrap();
    let y = f(&leaf).unwrap();
    let w = f64s(w, y.shape())
        .to_dtype(y.dtype())
        .unwrap()
        .to_device(y.device())
        .unwrap();
    y.backward_with(Some(&w), false).unwrap();
    read(&leaf.grad().unwrap())
}

/// `0, 1, 2, ..` as weights for an output of `n` elements.
fn iota(n: usize) -> Vec<f64> {
    (0..n).map(|i| i as f64).collect()
}

/// The gradients of `sum(scatter_reduce(x, 0, index, src) * w)` for `x` and `src`, on `dev`.
fn scatter_reduce_grads(
    dev: &Device,
    x: &[f64],
    index: &[i64],
    src: &[f64],
    reduce: ScatterReduction,
    include_self: bool,
    w: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let leaf = |v: &[f64]| {
        f64s(v, &[v.len()])
            .to_dtype(DType::F32)
            .unwrap()
            .to_device(dev)
            .unwrap()
            .requires_grad_(true)
            .unwrap()
    };
    let (x, src) = (leaf(x), leaf(src));
    let index = i64s(index, &[index.len()]).to_device(dev).unwrap();
    let y = x
        .scatter_reduce(0, &index, &src, reduce, include_self)
        .unwrap();
    let w = f64s(w, &[w.len()])
        .to_dtype(DType::F32)
        .unwrap()
        .to_device(dev)
        .unwrap();
    y.backward_with(Some(&w), false).unwrap();
    (read(&x.grad().unwrap()), read(&src.grad().unwrap()))
}

#[test]
fn scatter_reduce_grads_match_pytorch() {
    use ScatterReduction::*;
    let mut devs = vec![cpu()];
    devs.extend(pjrt("scatter_reduce_grads_match_pytorch"));
    for dev in &devs {
        let g = |x: &[f64], src: &[f64], reduce, include_self, w: &[f64]| {
            scatter_reduce_grads(dev, x, &[0, 0, 1], src, reduce, include_self, w)
        };
        // x = torch.tensor([2., 3.], requires_grad=True)
        // src = torch.tensor([0., 5., 4.], requires_grad=True)
        // x.scatter_reduce(0, torch.tensor([0, 0, 1]), src, "prod").sum().backward()
        // x.grad -> [0., 4.]; src.grad -> [10., 0., 3.]
        // (one zero among the factors gets the product of the others)
        let want = (vec![0., 4.], vec![10., 0., 3.]);
        assert_eq!(
            g(&[2., 3.], &[0., 5., 4.], Prod, true, &[1., 1.]),
            want,
            "{dev}"
        );
        // Two zeros: every factor's gradient is 0.
        // x = torch.tensor([2., 3.]); src = torch.tensor([0., 0., 4.]) -> prod [0., 12.]
        // x.grad -> [0., 4.]; src.grad -> [0., 0., 3.]
        let want = (vec![0., 4.], vec![0., 0., 3.]);
        assert_eq!(
            g(&[2., 3.], &[0., 0., 4.], Prod, true, &[1., 1.]),
            want,
            "{dev}"
        );
        // include_self=False: x.scatter_reduce(0, index, src, "prod", include_self=False)
        // with x = [2., 3.], src = [7., 5., 4.], weights [1., 2.] -> [35., 4.]
        // x.grad -> [0., 0.]; src.grad -> [5., 7., 2.]
        let want = (vec![0., 0.], vec![5., 7., 2.]);
        assert_eq!(
            g(&[2., 3.], &[7., 5., 4.], Prod, false, &[1., 2.]),
            want,
            "{dev}"
        );
        // Ties share the gradient evenly:
        // x = torch.tensor([1., 5.]); src = torch.tensor([3., 3., 5.])
        // x.scatter_reduce(0, index, src, "amax") -> [3., 5.]; weights [2., 4.]
        // x.grad -> [0., 2.]; src.grad -> [1., 1., 2.]
        let want = (vec![0., 2.], vec![1., 1., 2.]);
        assert_eq!(
            g(&[1., 5.], &[3., 3., 5.], Amax, true, &[2., 4.]),
            want,
            "{dev}"
        );
        // An input left out is no tie: "amax", include_self=False, x = [3., 5.],
        // src = [3., 1., 6.] -> [3., 6.]; weights [2., 4.]; x.grad -> [0., 0.];
        // src.grad -> [2., 0., 4.] (PyTorch counts x[0] as a tie and gives src[0] 1.)
        let want = (vec![0., 0.], vec![2., 0., 4.]);
        assert_eq!(
            g(&[3., 5.], &[3., 1., 6.], Amax, false, &[2., 4.]),
            want,
            "{dev}"
        );
        // A NaN result has no winner: no gradient rather than NaN (as PyTorch since its fix
        // for NaN gradients of amax/amin). x = [1., 2.], src = [nan, 1., 0.] -> [nan, 2.]
        let want = (vec![0., 4.], vec![0., 0., 0.]);
        assert_eq!(
            g(&[1., 2.], &[f64::NAN, 1., 0.], Amax, true, &[2., 4.]),
            want,
            "{dev}"
        );
        // "amin" with x = [1., 5.], src = [3., 1., 6.] -> [1., 5.]; weights [2., 4.]
        // x.grad -> [1., 4.]; src.grad -> [0., 1., 0.]
        let want = (vec![1., 4.], vec![0., 1., 0.]);
        assert_eq!(
            g(&[1., 5.], &[3., 1., 6.], Amin, true, &[2., 4.]),
            want,
            "{dev}"
        );
        // "mean": x = [1., 5.], src = [3., 1., 6.] -> [5/3, 5.5]; weights [3., 4.]
        // x.grad -> [1., 2.]; src.grad -> [1., 1., 2.]
        let want = (vec![1., 2.], vec![1., 1., 2.]);
        assert_eq!(
            g(&[1., 5.], &[3., 1., 6.], Mean, true, &[3., 4.]),
            want,
            "{dev}"
        );
        // include_self=False: "mean" -> [2., 6.]; x.grad -> [0., 0.]; src.grad -> [1.5, 1.5, 4.]
        let want = (vec![0., 0.], vec![1.5, 1.5, 4.]);
        assert_eq!(
            g(&[1., 5.], &[3., 1., 6.], Mean, false, &[3., 4.]),
            want,
            "{dev}"
        );
    }
}

#[test]
fn reflect_and_replicate_pad_grads_match_pytorch() {
    // x = torch.arange(12., dtype=torch.float64).view(1, 3, 4).requires_grad_()
    // y = F.pad(x, (3, 2, 1, 2), mode='reflect')            # shape [1, 6, 9]
    // (y * torch.arange(54.).view(y.shape)).sum().backward(); x.grad
    //   -> [[[60, 190, 188, 120], [63, 204, 201, 126], [30, 95, 94, 60]]]
    let x = f64s(&iota(12), &[1, 3, 4]);
    let g = grad_with(&x, |x| x.pad(&[3, 2, 1, 2], PadMode::Reflect), &iota(54));
    assert_eq!(
        g,
        [
            60., 190., 188., 120., 63., 204., 201., 126., 30., 95., 94., 60.
        ]
    );
    // x = torch.arange(6., dtype=torch.float64).view(1, 2, 3).requires_grad_()
    // y = F.pad(x, (2, 1, 0, 3), mode='replicate')          # shape [1, 5, 6]
    // (y * torch.arange(30.).view(y.shape)).sum().backward(); x.grad
    //   -> [[[3, 3, 9], [192, 72, 156]]]
    let x = f64s(&iota(6), &[1, 2, 3]);
    let g = grad_with(&x, |x| x.pad(&[2, 1, 0, 3], PadMode::Replicate), &iota(30));
    assert_eq!(g, [3., 3., 9., 192., 72., 156.]);
}

#[test]
fn repeat_grad_matches_pytorch() {
    // x = torch.tensor([[1., 2, 3], [4, 5, 6]], dtype=torch.float64, requires_grad=True)
    // y = x.repeat(2, 1, 3)                                  # shape [2, 2, 9]
    // (y * torch.arange(36.).view(y.shape)).sum().backward(); x.grad
    //   -> [[72, 78, 84], [126, 132, 138]]
    let x = f64s(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let g = grad_with(&x, |x| x.repeat(&[2, 1, 3]), &iota(36));
    assert_eq!(g, [72., 78., 84., 126., 132., 138.]);
}

#[test]
fn gather_with_duplicate_indices_matches_pytorch() {
    // x = torch.tensor([[1., 2, 3], [4, 5, 6]], dtype=torch.float64, requires_grad=True)
    // y = x.gather(1, torch.tensor([[0, 0, 2, 0], [1, 1, 1, 2]]))
    // (y * torch.arange(1., 9.).view(2, 4)).sum().backward(); x.grad
    //   -> [[7, 0, 3], [0, 18, 8]]
    let x = f64s(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let i = i64s(&[0, 0, 2, 0, 1, 1, 1, 2], &[2, 4]);
    let w: Vec<f64> = (1..9).map(f64::from).collect();
    let g = grad_with(&x, |x| x.gather(1, &i), &w);
    assert_eq!(g, [7., 0., 3., 0., 18., 8.]);
}

#[test]
fn index_add_with_duplicate_indices_matches_pytorch() {
    // x = torch.zeros(3, 2, dtype=torch.float64, requires_grad=True)
    // s = torch.tensor([[1., 2], [3, 4], [5, 6], [7, 8]], dtype=torch.float64, requires_grad=True)
    // y = x.index_add(0, torch.tensor([2, 0, 2, 2]), s, alpha=-1.5)
    // (y * torch.tensor([[1., 10], [100, 1000], [-1, -10]])).sum().backward()
    // x.grad -> [[1, 10], [100, 1000], [-1, -10]]
    // s.grad -> [[1.5, 15], [-1.5, -15], [1.5, 15], [1.5, 15]]
    let x = Tensor::zeros([3, 2], DType::F64, &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let s = f64s(&[1., 2., 3., 4., 5., 6., 7., 8.], &[4, 2])
        .requires_grad_(true)
        .unwrap();
    let i = i64s(&[2, 0, 2, 2], &[4]);
    let y = x.index_add(0, &i, &s, -1.5).unwrap();
    let w = f64s(&[1., 10., 100., 1000., -1., -10.], &[3, 2]);
    let gs = grad_of(&[&y], &[&x, &s], Some(&[&w]), false).unwrap();
    assert_eq!(
        read(gs[0].as_ref().unwrap()),
        [1., 10., 100., 1000., -1., -10.]
    );
    assert_eq!(
        read(gs[1].as_ref().unwrap()),
        [1.5, 15., -1.5, -15., 1.5, 15., 1.5, 15.]
    );
}

#[test]
fn embedding_with_repeated_indices_matches_pytorch() {
    // wt = torch.arange(8., dtype=torch.float64).view(4, 2).requires_grad_()
    // y = F.embedding(torch.tensor([[3, 1, 3], [3, 0, 1]]), wt)      # shape [2, 3, 2]
    // (y * torch.arange(1., 13.).view(y.shape)).sum().backward(); wt.grad
    //   -> [[9, 10], [14, 16], [0, 0], [13, 16]]
    let wt = f64s(&iota(8), &[4, 2]);
    let i = i64s(&[3, 1, 3, 3, 0, 1], &[2, 3]);
    let w: Vec<f64> = (1..13).map(f64::from).collect();
    let g = grad_with(&wt, |wt| embedding(&i, wt), &w);
    assert_eq!(g, [9., 10., 14., 16., 0., 0., 13., 16.]);
}

#[test]
fn topk_grad_matches_pytorch() {
    // x = torch.tensor([[0.5, -1, 3, 2, 0], [4, 1, -2, 7, 6]], dtype=torch.float64,
    //                  requires_grad=True)
    // v, i = x.topk(2, dim=1)                 # i -> [[2, 3], [3, 4]]
    // (v * torch.tensor([[10., 20], [30, 40]])).sum().backward(); x.grad
    //   -> [[0, 0, 10, 20, 0], [0, 0, 0, 30, 40]]
    // x.grad = None; v, i = x.topk(1, dim=0, largest=False)
    // (v * torch.tensor([[1., 2, 3, 4, 5]])).sum().backward(); x.grad
    //   -> [[1, 2, 0, 4, 5], [0, 0, 3, 0, 0]]
    let x = f64s(&[0.5, -1., 3., 2., 0., 4., 1., -2., 7., 6.], &[2, 5]);
    let g = grad_with(
        &x,
        |x| Ok(x.topk(2, 1, true, true)?.0),
        &[10., 20., 30., 40.],
    );
    assert_eq!(g, [0., 0., 10., 20., 0., 0., 0., 0., 30., 40.]);
    let g = grad_with(
        &x,
        |x| Ok(x.topk(1, 0, false, true)?.0),
        &[1., 2., 3., 4., 5.],
    );
    assert_eq!(g, [1., 2., 0., 4., 5., 0., 0., 3., 0., 0.]);
}

// ---- what gets a gradient ----------------------------------------------------------------------

#[test]
fn indices_and_masks_get_no_gradient_and_the_table_says_which_ops_have_rules() {
    let x = randn(1, &[2, 3]).requires_grad_(true).unwrap();
    let (v, i) = x.sort(1, false, true).unwrap();
    assert!(v.requires_grad() && !i.requires_grad());
    assert!(!x.argsort(1, false, true).unwrap().requires_grad());
    let e = embedding(&i64s(&[1, 0], &[2]), &x).unwrap();
    assert!(e.requires_grad());
    assert!(stack(&[&x, &x], 0).unwrap().requires_grad());
    // The gradient of an input used twice adds up.
    let y = stack(&[&x, &x], 2).unwrap();
    let gs = grad_of(&[&y], &[&x], None, false).unwrap();
    assert_eq!(read(gs[0].as_ref().unwrap()), [2.0; 6]);
    for r in tpu_ops::op_table_parts()
        .into_iter()
        .find(|(n, _)| *n == "movement")
        .unwrap()
        .1
    {
        let want = !matches!(r.name, "one_hot" | "argsort");
        assert_eq!(r.backward(), want, "{}", r.name);
    }
}

// ---- the PJRT CPU plugin -----------------------------------------------------------------------

/// Gradients of `sum(f(inputs) * w)` with respect to the float inputs, computed on `dev`.
fn grads_on(
    dev: &Device,
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
) -> Vec<Tensor> {
    let leaves: Vec<Tensor> = inputs
        .iter()
        .map(|t| {
            let t = t.to_device(dev).unwrap();
            if t.dtype().is_float() {
                t.requires_grad_(true).unwrap()
            } else {
                t
            }
        })
        .collect();
    let y = f(&leaves).unwrap();
    let w = Generator::new(99)
        .randn(y.shape(), y.dtype(), &cpu())
        .unwrap()
        .to_device(dev)
        .unwrap();
    y.backward_with(Some(&w), false).unwrap();
    leaves
        .iter()
        .filter(|t| t.dtype().is_float())
        .map(|t| {
            let g = t.grad().unwrap();
            assert_eq!(
                g.device(),
                dev,
                "the gradient stays on the forward's device"
            );
            g.to_device(&cpu()).unwrap()
        })
        .collect()
}

#[test]
fn backward_on_pjrt_matches_the_cpu() {
    let Some(dev) = pjrt("backward_on_pjrt_matches_the_cpu") else {
        return;
    };
    let f32s = |seed: u64, shape: &[usize]| randn(seed, shape).to_dtype(DType::F32).unwrap();
    type Case = (
        &'static str,
        Box<dyn Fn(&[Tensor]) -> Result<Tensor>>,
        Vec<Tensor>,
    );
    let cases: Vec<Case> = vec![
        (
            "cat",
            Box::new(|x| cat(&[&x[0], &x[1], &x[2]], 1)),
            vec![f32s(1, &[2, 3]), f32s(2, &[2, 1]), i64s(&[1, 2], &[2, 1])],
        ),
        (
            "stack",
            Box::new(|x| stack(&[&x[0], &x[1]], 1)),
            vec![f32s(3, &[2, 3]), f32s(4, &[2, 3])],
        ),
        (
            "gather",
            Box::new(|x| x[0].gather(0, &x[1])),
            vec![f32s(5, &[3, 2]), i64s(&[2, 0, 2, 2, 1, 0], &[3, 2])],
        ),
        (
            "embedding",
            Box::new(|x| embedding(&x[1], &x[0])),
            vec![f32s(6, &[4, 3]), i64s(&[3, 1, 3, 0], &[2, 2])],
        ),
        (
            "pad(constant)",
            Box::new(|x| x[0].pad(&[1, 2, 0, 1], PadMode::Constant(2.0.into()))),
            vec![f32s(7, &[2, 3])],
        ),
        (
            "pad(reflect)",
            Box::new(|x| x[0].pad(&[2, 1, 1, 1], PadMode::Reflect)),
            vec![f32s(8, &[2, 3, 4])],
        ),
        (
            "pad(replicate)",
            Box::new(|x| x[0].pad(&[2, 1, 0, 3], PadMode::Replicate)),
            vec![f32s(9, &[2, 3])],
        ),
        (
            "scatter",
            Box::new(|x| x[0].scatter(1, &x[1], &x[2])),
            vec![
                f32s(10, &[2, 3]),
                i64s(&[2, 0, 1, 2], &[2, 2]),
                f32s(11, &[2, 3]),
            ],
        ),
        (
            "scatter_reduce(prod)",
            Box::new(|x| x[0].scatter_reduce(1, &x[1], &x[2], ScatterReduction::Prod, true)),
            vec![
                f32s(17, &[2, 3]),
                i64s(&[2, 0, 2, 2], &[2, 2]),
                f32s(18, &[2, 3]),
            ],
        ),
        (
            "scatter_reduce(amax)",
            Box::new(|x| x[0].scatter_reduce(0, &x[1], &x[2], ScatterReduction::Amax, false)),
            vec![
                f32s(19, &[3, 2]),
                i64s(&[2, 0, 2, 2, 0, 0], &[3, 2]),
                f32s(20, &[3, 2]),
            ],
        ),
        (
            "index_add",
            Box::new(|x| x[0].index_add(0, &x[1], &x[2], 2.0)),
            vec![f32s(12, &[3, 2]), i64s(&[2, 2, 0], &[3]), f32s(13, &[3, 2])],
        ),
        (
            "index_copy",
            Box::new(|x| x[0].index_copy(1, &x[1], &x[2])),
            vec![f32s(15, &[2, 3]), i64s(&[2, 0], &[2]), f32s(16, &[2, 2])],
        ),
        (
            "repeat",
            Box::new(|x| x[0].repeat(&[2, 1, 3])),
            vec![f32s(14, &[2, 2])],
        ),
        (
            "roll+flip+tril",
            Box::new(|x| x[0].roll(&[1, -2], &[0, 1])?.flip(&[0])?.tril(0)),
            vec![f32s(15, &[3, 4])],
        ),
        (
            "topk",
            Box::new(|x| Ok(x[0].topk(2, 1, true, true)?.0)),
            vec![f32s(16, &[3, 4])],
        ),
    ];
    for (name, f, inputs) in &cases {
        let on_cpu = grads_on(&cpu(), f.as_ref(), inputs);
        let on_dev = grads_on(&dev, f.as_ref(), inputs);
        for (a, b) in on_cpu.iter().zip(&on_dev) {
            if let Err(e) = assert_close(name, a, b, 1e-6) {
                panic!("{e}");
            }
        }
    }
}
