//! Backward rules of the reductions and scans: finite-difference checks on random shapes, dims
//! and keepdim; gradients PyTorch computes for the subtle cases (zeros in products, ties,
//! corrections, infinities); the rules on non-contiguous saved tensors; and the same backward on
//! the PJRT CPU plugin against the native CPU.
//!
//! The finite-difference checks use contiguous leaves (gradients through views are
//! `view_chain_grad`'s subject); `saved_views_match_dense_copies` calls the rules directly on
//! transposed and sliced saved tensors.

use crate::common::{agrees, cpu, pjrt};
use proptest::prelude::*;
use tpu_ops::autograd::{Saved, grad_of};
use tpu_ops::ops::reduce::{ArgReduce, ExtremeAll, Reduce, ReduceKind, Scan};
use tpu_ops::prelude::*;
use tpu_ops::testing::{assert_close, gradcheck};
use tpu_ops::{OpDef, op_table_parts};
use tpu_tensor::{DType, Device, Element, Generator, Result, Tensor};

const INF: f64 = f64::INFINITY;
const NAN: f64 = f64::NAN;

// ---- random cases ----------------------------------------------------------------------------

/// A random reduction: a shape of rank 1 to 3 with sizes 1 to 5, a seed for the values, a mask
/// choosing the reduced dims (none chosen: every dim), keepdim, and whether dims are written
/// negative.
#[derive(Clone, Debug)]
struct Case {
    shape: Vec<usize>,
    seed: u64,
    mask: u8,
    keepdim: bool,
    negative: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(1usize..=5, 1..=3),
        any::<u64>(),
        any::<u8>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(shape, seed, mask, keepdim, negative)| Case {
            shape,
            seed,
            mask,
            keepdim,
            negative,
        })
}

impl Case {
    /// Standard normal values, pushed at least `away` from 0 (so kinks of |x|, zero products
    /// and |x|^(p-1) near 0 stay out of the finite differences' reach).
    fn input(&self, away: f64) -> Tensor {
        let x = Generator::new(self.seed)
            .randn(&self.shape[..], DType::F64, &cpu())
            .unwrap();
        x.add(&x.sign().unwrap().mul(away).unwrap()).unwrap()
    }

    fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The dims the mask picks (empty: every dim).
    fn dims(&self) -> Vec<i64> {
        let r = self.rank() as i64;
        (0..r)
            .filter(|d| self.mask & (1 << d) != 0)
            .map(|d| if self.negative { d - r } else { d })
            .collect()
    }

    /// One dim for max/min and the scans.
    fn dim(&self) -> i64 {
        let r = self.rank() as i64;
        let d = self.mask as i64 % r;
        if self.negative { d - r } else { d }
    }

    /// Checks the gradient of `f(x, dims, keepdim)` at `input(away)`, over this case's dims.
    fn check_dims(
        &self,
        what: &str,
        away: f64,
        f: impl Fn(&Tensor, &[i64], bool) -> Result<Tensor>,
    ) -> Result<()> {
        let (d, k) = (self.dims(), self.keepdim);
        check(what, self.input(away), |x| f(x, &d, k))
    }

    /// Number of elements the reduction over `dims()` covers.
    fn count(&self) -> usize {
        let dims = self.dims();
        if dims.is_empty() {
            return self.shape.iter().product();
        }
        let r = self.rank() as i64;
        dims.iter()
            .map(|&d| self.shape[d.rem_euclid(r) as usize])
            .product()
    }
}

fn check(what: &str, x: Tensor, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<()> {
    gradcheck(what, |xs| f(&xs[0]), &[x], 1e-6, 1e-6)
}

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(24)
}

/// One finite-difference proptest per row: the test, the op's name, how far from 0 its inputs
/// stay, and the call on the case's dims and keepdim.
macro_rules! dims_grad_tests {
    ($($test:ident: $what:literal, $away:expr, |$x:ident, $d:ident, $k:ident| $call:expr;)*) => {
        proptest! {
            #![proptest_config(config())]
            $(
                #[test]
                fn $test(c in case()) {
                    c.check_dims($what, $away, |$x, $d, $k| $call).unwrap();
                }
            )*
        }
    };
}

dims_grad_tests! {
    sum_grad: "sum", 0.0, |x, d, k| x.sum(d, k);
    mean_grad: "mean", 0.0, |x, d, k| x.mean(d, k);
    prod_grad: "prod", 0.2, |x, d, k| x.prod(d, k);
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn amax_amin_grad(c in case()) {
        c.check_dims("amax", 0.0, |x, d, k| x.amax(d, k)).unwrap();
        c.check_dims("amin", 0.0, |x, d, k| x.amin(d, k)).unwrap();
    }

    #[test]
    fn max_min_dim_grad(c in case()) {
        let (d, k) = (c.dim(), c.keepdim);
        check("max_dim", c.input(0.0), |x| Ok(x.max_dim(d, k)?.0)).unwrap();
        check("min_dim", c.input(0.0), |x| Ok(x.min_dim(d, k)?.0)).unwrap();
    }

    #[test]
    fn var_grad(c in case(), corr in prop::sample::select(vec![0.0, 1.0, 0.5])) {
        // n <= correction makes the variance infinite; finite differences cannot see that.
        prop_assume!((c.count() as f64) > corr);
        c.check_dims("var", 0.0, |x, d, k| x.var(d, corr, k)).unwrap();
    }

    #[test]
    fn std_grad(c in case(), corr in prop::sample::select(vec![0.0, 1.0, 0.5])) {
        prop_assume!((c.count() as f64) > corr + 1.0);
        c.check_dims("std", 0.0, |x, d, k| x.std(d, corr, k)).unwrap();
    }

    #[test]
    fn logsumexp_grad(c in case()) {
        let (d, k) = (c.dims(), c.keepdim);
        check("logsumexp", c.input(0.0).mul(3.0).unwrap(), |x| x.logsumexp(&d, k)).unwrap();
    }

    #[test]
    fn norm_grad(
        c in case(),
        p in prop::sample::select(vec![2.0, 1.0, 3.0, 1.5, 0.5, 0.0, -1.0, INF, -INF]),
    ) {
        c.check_dims(&format!("norm p={p}"), 0.2, |x, d, k| x.norm(p, d, k)).unwrap();
    }

    #[test]
    fn cumsum_grad(c in case()) {
        let d = c.dim();
        check("cumsum", c.input(0.0), |x| x.cumsum(d)).unwrap();
    }

    #[test]
    fn cumprod_grad(c in case()) {
        let d = c.dim();
        check("cumprod", c.input(0.2), |x| x.cumprod(d)).unwrap();
    }

    /// Cumprod with exact zeros (the first, later and repeated zeros of a line take separate
    /// paths in the rule): the function is polynomial, so finite differences still apply.
    #[test]
    fn cumprod_with_zeros_grad(c in case()) {
        let d = c.dim();
        let x = c.input(0.0).round().unwrap();
        check("cumprod zeros", x, |x| x.cumprod(d)).unwrap();
    }

    /// Products with exact zeros, for the same reason.
    #[test]
    fn prod_with_zeros_grad(c in case()) {
        let (d, k) = (c.dims(), c.keepdim);
        let x = c.input(0.0).round().unwrap();
        check("prod zeros", x, |x| x.prod(&d, k)).unwrap();
    }
}

// ---- values from PyTorch ---------------------------------------------------------------------
//
// Generated with torch 2.15 on the CPU, in f64, by
//
//     def g(f, x):
//         x = torch.tensor(x, dtype=torch.float64, requires_grad=True)
//         y = f(x)
//         y.backward(torch.arange(1, y.numel() + 1, dtype=torch.float64).reshape(y.shape))
//         return x.grad.flatten().tolist() if x.grad is not None else None
//
// with the calls given at each case: the output gradient is 1, 2, 3, ... in order.

/// A leaf that requires a gradient, holding `v` in `shape` on `dev`.
fn leaf<T: Element>(v: Vec<T>, shape: &[usize], dev: &Device) -> Tensor {
    Tensor::from_vec(v, shape, &cpu())
        .unwrap()
        .to_device(dev)
        .unwrap()
        .requires_grad_(true)
        .unwrap()
}

/// The gradient of `f` at `x` (shape `shape`) for the output gradient 1, 2, 3, ...
fn grad_at(
    x: &[f64],
    shape: &[usize],
    dev: &Device,
    f: impl Fn(&Tensor) -> Result<Tensor>,
) -> Option<Tensor> {
    let x = leaf(x.to_vec(), shape, dev);
    let y = f(&x).unwrap();
    let w = Tensor::arange(1.0, y.numel() as f64 + 1.0, 1.0, DType::F64, &cpu())
        .unwrap()
        .reshape(y.shape())
        .unwrap()
        .to_dtype(y.dtype())
        .unwrap()
        .to_device(dev)
        .unwrap();
    grad_of(&[&y], &[&x], Some(&[&w]), false).unwrap().remove(0)
}

/// Checks the gradient of `f` at `x` against PyTorch's `want` (NaN matches NaN, infinities
/// match exactly, finite values within 1e-12 relative).
fn expect(
    what: &str,
    x: &[f64],
    shape: &[usize],
    f: impl Fn(&Tensor) -> Result<Tensor>,
    want: &[f64],
) {
    let got = grad_at(x, shape, &cpu(), f)
        .unwrap_or_else(|| panic!("{what}: no gradient"))
        .to_vec::<f64>()
        .unwrap();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        let ok = agrees(a, b, 1e-12 * (1.0 + b.abs()));
        assert!(ok, "{what}: element {i}: got {a}, want {b} (all: {got:?})");
    }
}

#[test]
fn prod_with_zeros_matches_pytorch() {
    // g(lambda x: x.prod(1), [[0., 2, 3], [0, 0, 4], [1, 2, 3], [5, 0, -2]])
    expect(
        "prod dim",
        &[0., 2., 3., 0., 0., 4., 1., 2., 3., 5., 0., -2.],
        &[4, 3],
        |x| x.prod(&[1], false),
        &[
            6.0, 0.0, 0.0, 0.0, 0.0, 0.0, 18.0, 9.0, 6.0, -0.0, -40.0, 0.0,
        ],
    );
    // g(lambda x: x.prod(), [1.5, 0, -2, 4]); g(lambda x: x.prod(), [1.5, 0, -2, 0])
    expect(
        "prod one zero",
        &[1.5, 0., -2., 4.],
        &[4],
        |x| x.prod_all(),
        &[-0.0, -12.0, 0.0, -0.0],
    );
    expect(
        "prod two zeros",
        &[1.5, 0., -2., 0.],
        &[4],
        |x| x.prod_all(),
        &[0.0; 4],
    );
    // Over two dims at once (PyTorch reduces one dim or all): the same as over the flattened
    // dims, [[0, 2, 3], [0, 0, 4], ...] seen as [2, 2, 3] with dims (1, 2) is two groups of 6.
    expect(
        "prod two dims",
        &[0., 2., 3., 5., 1., 4., 0., 0., 4., 1., 2., 3.],
        &[2, 2, 3],
        |x| x.prod(&[1, 2], true),
        &[120.0, 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0.],
    );
}

#[test]
fn ties_and_index_routing_match_pytorch() {
    // g(lambda x: x.amax(1), [[1., 3, 3, 2], [4, 4, 4, -1]])
    expect(
        "amax ties",
        &[1., 3., 3., 2., 4., 4., 4., -1.],
        &[2, 4],
        |x| x.amax(&[1], false),
        &[0.0, 0.5, 0.5, 0.0, 2.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0, 0.0],
    );
    // g(lambda x: x.amin((0, 1)), [[1., 1], [1, 2]])
    expect(
        "amin ties over all",
        &[1., 1., 1., 2.],
        &[2, 2],
        |x| x.amin(&[0, 1], false),
        &[1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.0],
    );
    // g(lambda x: x.amax(1), [[1., nan, 2.], [3, 3, 1]])
    expect(
        "amax nan",
        &[1., NAN, 2., 3., 3., 1.],
        &[2, 3],
        |x| x.amax(&[1], false),
        &[NAN, NAN, NAN, 1.0, 1.0, 0.0],
    );
    // g(lambda x: x.max(1)[0], [[1., 3, 3, 2], [4, 4, 4, -1]])
    expect(
        "max_dim ties go to the first index",
        &[1., 3., 3., 2., 4., 4., 4., -1.],
        &[2, 4],
        |x| Ok(x.max_dim(1, false)?.0),
        &[0.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0],
    );
    // g(lambda x: x.min(0)[0], [[1., 2], [nan, 5], [-1, 5]])
    expect(
        "min_dim nan",
        &[1., 2., NAN, 5., -1., 5.],
        &[3, 2],
        |x| Ok(x.min_dim(0, false)?.0),
        &[0.0, 2.0, 1.0, 0.0, 0.0, 0.0],
    );
    // keepdim gives the same routing.
    expect(
        "max_dim keepdim",
        &[1., 3., 3., 2., 4., 4., 4., -1.],
        &[2, 4],
        |x| Ok(x.max_dim(-1, true)?.0),
        &[0.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0],
    );
}

#[test]
fn var_std_and_logsumexp_match_pytorch() {
    let x = [1., 2., 4., -3., 0.5, 2.];
    // g(lambda x: x.var(1, correction=1), [[1., 2, 4], [-3, 0.5, 2]])
    expect(
        "var correction 1",
        &x,
        &[2, 3],
        |x| x.var(&[1], 1.0, false),
        &[
            -1.333333333333333,
            -0.333333333333333,
            1.666666666666667,
            -5.666666666666667,
            1.333333333333333,
            4.333333333333333,
        ],
    );
    // g(lambda x: x.var(0, correction=0), [[1., 2, 4], [-3, 0.5, 2]])
    expect(
        "var correction 0",
        &x,
        &[2, 3],
        |x| x.var(&[0], 0.0, false),
        &[2.0, 1.5, 3.0, -2.0, -1.5, -3.0],
    );
    // g(lambda x: x.std(1, correction=1), [[1., 2, 4], [-3, 0.5, 2]])
    expect(
        "std correction 1",
        &x,
        &[2, 3],
        |x| x.std(&[1], 1.0, false),
        &[
            -0.436435780471985,
            -0.109108945117996,
            0.545544725589981,
            -1.104268664184773,
            0.259827920984652,
            0.84444074320012,
        ],
    );
    // g(lambda x: x.std(1, correction=0), [[2., 2, 2], [1, 0, 3]]): 0 where std is 0.
    expect(
        "std of a constant",
        &[2., 2., 2., 1., 0., 3.],
        &[2, 3],
        |x| x.std(&[1], 0.0, false),
        &[
            0.0,
            0.0,
            0.0,
            -0.17817416127495,
            -0.712696645099798,
            0.890870806374748,
        ],
    );
    // g(lambda x: x.var(0, correction=1), [[2., 2, 2]]): 0 * 2 / 0.
    expect(
        "var of one element",
        &[2., 2., 2.],
        &[1, 3],
        |x| x.var(&[0], 1.0, false),
        &[NAN, NAN, NAN],
    );
    // g(lambda x: x.var(0, correction=3), [2., 3.]) with output gradient 1: PyTorch divides
    // by n - correction = -1 in the backward although the forward is inf.
    expect(
        "var correction above n",
        &[2., 3.],
        &[2],
        |x| x.var(&[0], 3.0, false),
        &[1.0, -1.0],
    );
    // g(lambda x: x.logsumexp(1), [[-inf, 0., 1.], [-inf, -inf, -inf], [inf, 0, 1]])
    expect(
        "logsumexp with infinities",
        &[-INF, 0., 1., -INF, -INF, -INF, INF, 0., 1.],
        &[3, 3],
        |x| x.logsumexp(&[1], false),
        &[
            0.0,
            0.268941421369995,
            0.731058578630005,
            NAN,
            NAN,
            NAN,
            NAN,
            0.0,
            0.0,
        ],
    );
}

#[test]
fn norms_match_pytorch() {
    let norm = |p: f64| move |x: &Tensor| x.norm(p, &[1], false);
    // V = torch.linalg.vector_norm; g(lambda x: V(x, inf, dim=1), [[1., -3, 3, 2], [0, 0, 0, 0]])
    expect(
        "norm inf",
        &[1., -3., 3., 2., 0., 0., 0., 0.],
        &[2, 4],
        norm(INF),
        &[0.0, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0],
    );
    // g(lambda x: V(x, -inf, dim=1), [[1., -1, 3, 2], [0, 5, 0, 1]])
    expect(
        "norm -inf",
        &[1., -1., 3., 2., 0., 5., 0., 1.],
        &[2, 4],
        norm(-INF),
        &[0.5, -0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    );
    // g(lambda x: V(x, p, dim=1), [[0., 0, 0], [3, -4, 0]]) for p = 2, 1, 3, 1.5, 0.5
    let x = [0., 0., 0., 3., -4., 0.];
    let cases: [(f64, [f64; 6]); 5] = [
        (2.0, [0.0, 0.0, 0.0, 1.2, -1.6, 0.0]),
        (1.0, [0.0, 0.0, 0.0, 2.0, -2.0, 0.0]),
        (
            3.0,
            [0.0, 0.0, 0.0, 0.889702703461071, -1.581693695041904, 0.0],
        ),
        (
            1.5,
            [0.0, 0.0, 0.0, 1.46591295165795, -1.692690474496552, 0.0],
        ),
        (
            0.5,
            [0.0, 0.0, 0.0, 4.309401076758504, -3.732050807568877, 0.0],
        ),
    ];
    for (p, want) in cases {
        expect(&format!("norm {p} at zero"), &x, &[2, 3], norm(p), &want);
    }
    // g(lambda x: V(x, -1, dim=1), [[0., 2, 1], [3, -4, 1]])
    expect(
        "norm -1",
        &[0., 2., 1., 3., -4., 1.],
        &[2, 3],
        norm(-1.0),
        &[
            0.0,
            0.0,
            0.0,
            0.088642659279778,
            -0.049861495844875,
            0.797783933518006,
        ],
    );
    // g(lambda x: V(x, 0, dim=1), ...) is None: the 0-norm has no gradient.
    let g = grad_at(&[0., 2., 1.], &[1, 3], &cpu(), norm(0.0));
    assert!(g.is_none(), "the 0-norm gives no gradient");
}

#[test]
fn scans_and_sums_match_pytorch() {
    // g(lambda x: x.cumprod(1), [[2., 0, 3, 0, 5], [1, 2, 0, 4, 5], [0, 0, 1, 2, 3],
    //                            [1, 2, 3, -1, 0.5]])
    expect(
        "cumprod with zeros",
        &[
            2., 0., 3., 0., 5., 1., 2., 0., 4., 5., 0., 0., 1., 2., 3., 1., 2., 3., -1., 0.5,
        ],
        &[4, 5],
        |x| x.cumprod(1),
        &[
            1.0, 22.0, 0.0, 0.0, 0.0, 20.0, 7.0, 488.0, 0.0, 0.0, 11.0, 0.0, 0.0, 0.0, 0.0, -16.0,
            -16.0, -22.0, 174.0, -120.0,
        ],
    );
    // g(lambda x: x.cumsum(0), [[2., 0], [3, 0], [5, 1]])
    expect(
        "cumsum",
        &[2., 0., 3., 0., 5., 1.],
        &[3, 2],
        |x| x.cumsum(0),
        &[9.0, 12.0, 8.0, 10.0, 5.0, 6.0],
    );
    // g(lambda x: x.sum((0, 2)), [[[1., 2], [3, 4]], [[5, 6], [7, 8]]])
    expect(
        "sum",
        &[1., 2., 3., 4., 5., 6., 7., 8.],
        &[2, 2, 2],
        |x| x.sum(&[0, 2], false),
        &[1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0],
    );
    // g(lambda x: x.mean(1, keepdim=True), [[1., 2, 3], [4, 5, 6]])
    expect(
        "mean",
        &[1., 2., 3., 4., 5., 6.],
        &[2, 3],
        |x| x.mean(&[1], true),
        &[1. / 3., 1. / 3., 1. / 3., 2. / 3., 2. / 3., 2. / 3.],
    );
}

#[test]
fn zero_dim_inputs() {
    // A 0-dim tensor reduces (and scans) as itself.
    let x = || {
        Tensor::from_vec(vec![-1.5f64], [0usize; 0], &cpu())
            .unwrap()
            .requires_grad_(true)
            .unwrap()
    };
    type F = fn(&Tensor) -> Result<Tensor>;
    let ops: [(&str, F); 8] = [
        ("sum", |x| x.sum(&[], false)),
        ("prod", |x| x.prod(&[0], true)),
        ("amax", |x| x.amax(&[-1], false)),
        ("max_dim", |x| Ok(x.max_dim(0, false)?.0)),
        ("logsumexp", |x| x.logsumexp(&[], false)),
        ("norm", |x| x.norm(3.0, &[], false)),
        ("cumsum", |x| x.cumsum(0)),
        ("cumprod", |x| x.cumprod(-1)),
    ];
    for (name, f) in &ops {
        let x = x();
        let y = f(&x).unwrap();
        y.backward().unwrap();
        let g = x.grad().unwrap();
        assert_eq!(g.shape(), &[] as &[usize], "{name}");
        let want = if *name == "norm" { -1.0 } else { 1.0 };
        assert_eq!(g.to_vec::<f64>().unwrap(), [want], "{name}");
    }
}

// ---- non-contiguous saved tensors ------------------------------------------------------------

/// Every rule, called directly with a transposed (or sliced) saved input and output gradient,
/// agrees with the rule on dense copies: the rules read strided views correctly.
#[test]
fn saved_views_match_dense_copies() {
    let mut rng = Generator::new(7);
    let base = rng.randn([5, 4, 6], DType::F64, &cpu()).unwrap();
    // A few exact zeros, for the prod and cumprod paths.
    let base = base.mul(&base.abs().unwrap().gt(0.3).unwrap()).unwrap();
    let views = [
        base.permute([2, 0, 1]).unwrap(),
        base.slice(1, 1.., 2).unwrap().transpose(0, 2).unwrap(),
    ];
    let reduce = |kind, dims: &[i64], keepdim| -> Box<dyn OpDef> {
        Box::new(Reduce {
            kind,
            dims: dims.to_vec(),
            keepdim,
        })
    };
    use ReduceKind::*;
    let ops: Vec<Box<dyn OpDef>> = vec![
        reduce(Sum, &[0, 2], false),
        reduce(Mean, &[1], true),
        reduce(Prod, &[-1], false),
        reduce(Prod, &[], true),
        reduce(Amax, &[0], false),
        reduce(Amin, &[1, 2], true),
        reduce(Var { correction: 1.0 }, &[0], false),
        reduce(Std { correction: 0.0 }, &[2, 0], true),
        reduce(LogSumExp, &[1], false),
        reduce(Norm { p: 2.0 }, &[0, 1], false),
        reduce(Norm { p: INF }, &[2], true),
        reduce(Norm { p: 0.5 }, &[1], false),
        Box::new(ArgReduce {
            max: true,
            dim: Some(1),
            keepdim: false,
            with_values: true,
        }),
        Box::new(ArgReduce {
            max: false,
            dim: Some(-1),
            keepdim: true,
            with_values: true,
        }),
        Box::new(ExtremeAll { max: true }),
        Box::new(ExtremeAll { max: false }),
        Box::new(Scan {
            prod: false,
            dim: 1,
        }),
        Box::new(Scan { prod: true, dim: 0 }),
        Box::new(Scan {
            prod: true,
            dim: -1,
        }),
    ];
    let _g = no_grad();
    for view in &views {
        assert!(!view.is_contiguous());
        let dense = view.contiguous().unwrap();
        for op in &ops {
            let what = format!("{} {op:?}", op.name());
            let outputs = tpu_ops::run(op.as_ref(), &[view]).unwrap();
            let y = &outputs[0];
            // A transposed output gradient: the rule must not assume a dense one either.
            let gt = rng
                .randn(
                    &y.shape().iter().rev().copied().collect::<Vec<_>>()[..],
                    DType::F64,
                    &cpu(),
                )
                .unwrap();
            let perm: Vec<usize> = (0..y.rank()).rev().collect();
            let g = gt.permute(&perm[..]).unwrap();
            let grads = [Some(g.clone()), None];
            let grads = &grads[..outputs.len()];
            let on_view = op
                .backward(&Saved::new(vec![view.clone()], outputs.clone()), grads)
                .unwrap();
            let dense_grads = [Some(g.contiguous().unwrap()), None];
            let on_dense = op
                .backward(
                    &Saved::new(
                        vec![dense.clone()],
                        outputs.iter().map(|t| t.contiguous().unwrap()).collect(),
                    ),
                    &dense_grads[..outputs.len()],
                )
                .unwrap();
            let (a, b) = (on_view[0].as_ref().unwrap(), on_dense[0].as_ref().unwrap());
            assert_eq!(a.shape(), view.shape(), "{what}");
            assert_close(&what, a, b, 1e-12).unwrap();
        }
    }
}

// ---- max and min of every element --------------------------------------------------------------

/// `x.max()` and `x.min()` split the gradient among the elements equal to the result (the
/// NaN ones for a NaN result) and select it into zeros elsewhere, so a NaN or infinite output
/// gradient reaches only them; amax and amin multiply by a 0/1 mask and leak it everywhere.
/// On both devices:
///
/// ```python
/// nan, inf = float('nan'), float('inf')
/// def g(f, x, go):
///     x = torch.tensor(x, requires_grad=True); y = f(x)
///     y.backward(torch.full_like(y, go)); return x.grad
/// g(torch.max, [nan, 1., nan], 1.), g(torch.max, [nan, 1., nan], nan)  # [0.5, 0, 0.5], [nan, 0, nan]
/// g(torch.max, [2., 0., 2.], inf)                                      # [inf, 0, inf]
/// g(torch.max, [1., 2., 3.], nan)                                      # [0, 0, nan]
/// g(torch.min, [-inf, -inf, 1.], 1.), g(torch.min, [-inf, -inf, 1.], nan)  # [0.5, 0.5, 0], [nan, nan, 0]
/// g(torch.min, [2., 0., 2.], inf)                                      # [0, inf, 0]
/// g(torch.amax, [1., 2., 3.], nan)                                     # [nan, nan, nan]
/// g(torch.amax, [2., 0., 2.], inf)                                     # [inf, nan, inf]
/// g(torch.max, 3., 1.)                                                 # 1
/// ```
#[test]
fn max_and_min_of_all_elements_select_their_gradient_like_pytorch() {
    let (nan, inf) = (f64::NAN, f64::INFINITY);
    let mut devices = vec![cpu()];
    devices.extend(pjrt("max_and_min_of_all_elements"));
    type F = fn(&Tensor) -> Result<Tensor>;
    let (max, min, amax): (F, F, F) = (|t| t.max_all(), |t| t.min_all(), |t| t.amax(&[], false));
    // What, the op, the input, the output gradient, PyTorch's input gradient.
    type Case = (&'static str, F, Vec<f64>, f64, Vec<f64>);
    let cases: [Case; 10] = [
        ("max", max, vec![nan, 1.0, nan], 1.0, vec![0.5, 0.0, 0.5]),
        ("max", max, vec![nan, 1.0, nan], nan, vec![nan, 0.0, nan]),
        ("max", max, vec![2.0, 0.0, 2.0], inf, vec![inf, 0.0, inf]),
        ("max", max, vec![1.0, 2.0, 3.0], nan, vec![0.0, 0.0, nan]),
        ("min", min, vec![-inf, -inf, 1.0], 1.0, vec![0.5, 0.5, 0.0]),
        ("min", min, vec![-inf, -inf, 1.0], nan, vec![nan, nan, 0.0]),
        ("min", min, vec![2.0, 0.0, 2.0], inf, vec![0.0, inf, 0.0]),
        ("amax", amax, vec![1.0, 2.0, 3.0], nan, vec![nan, nan, nan]),
        ("amax", amax, vec![2.0, 0.0, 2.0], inf, vec![inf, nan, inf]),
        ("max of a 0-dim tensor", max, vec![3.0], 1.0, vec![1.0]),
    ];
    for dev in &devices {
        for (what, f, x, go, want) in &cases {
            let shape: &[usize] = if x.len() == 1 { &[] } else { &[3] };
            let xs: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            let x = leaf(xs, shape, dev);
            let y = f(&x).unwrap();
            let g = Tensor::full(y.shape(), *go, DType::F32, dev).unwrap();
            let got = grad_of(&[&y], &[&x], Some(&[&g]), false).unwrap()[0]
                .clone()
                .unwrap();
            assert_eq!(got.shape(), shape, "{what}");
            let got = got.to_device(&cpu()).unwrap().to_dtype(DType::F64).unwrap();
            let got = got.to_vec::<f64>().unwrap();
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g.is_nan() && w.is_nan()) || g == w,
                    "{what} of {x:?} with gradient {go} on {dev:?}: element {i} is {g}, PyTorch gives {w}"
                );
            }
        }
    }
}

// ---- the op table ----------------------------------------------------------------------------

#[test]
fn table_marks_the_ops_with_rules() {
    let parts = op_table_parts();
    let (_, rows) = parts.iter().find(|(n, _)| *n == "reduce").unwrap();
    for r in rows {
        let want = !matches!(r.name, "all" | "any" | "argmax" | "argmin");
        assert_eq!(r.backward(), want, "{}", r.name);
    }
}

#[test]
fn non_differentiable_ops_record_nothing() {
    let x = Tensor::new([1.0f64, -2.0, 3.0], &cpu())
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    for t in [
        x.argmax(None, false).unwrap(),
        x.argmin(Some(0), true).unwrap(),
        x.all(&[], false).unwrap(),
        x.any(&[0], true).unwrap(),
        x.max_dim(0, false).unwrap().1,
    ] {
        assert!(!t.requires_grad(), "{:?}", t.dtype());
    }
}

// ---- the PJRT CPU plugin ---------------------------------------------------------------------

/// The rules run on the device the forward ran on and agree with the native CPU.
#[test]
fn backward_on_pjrt_matches_cpu() {
    let Some(dev) = pjrt("backward_on_pjrt_matches_cpu") else {
        return;
    };
    type F = fn(&Tensor) -> Result<Tensor>;
    let ops: [(&str, F); 14] = [
        ("sum", |x| x.sum(&[0, 2], false)),
        ("max_all", |x| x.max_all()),
        ("min_all", |x| x.min_all()),
        ("mean", |x| x.mean(&[1], true)),
        ("prod", |x| x.prod(&[2], false)),
        ("amax", |x| x.amax(&[1], true)),
        ("max_dim", |x| Ok(x.max_dim(2, false)?.0)),
        ("min_dim", |x| Ok(x.min_dim(0, true)?.0)),
        ("var", |x| x.var(&[0, 2], 1.0, false)),
        ("std", |x| x.std(&[2], 0.0, true)),
        ("logsumexp", |x| x.logsumexp(&[1, 2], false)),
        ("norm inf", |x| x.norm(INF, &[2], false)),
        ("norm 3", |x| x.norm(3.0, &[0], false)),
        ("cumprod", |x| x.cumprod(2)),
    ];
    // Rounded values: exact zeros and ties for the prod, max and norm paths.
    let x = Generator::new(3)
        .randn([3, 4, 5], DType::F64, &cpu())
        .unwrap()
        .mul(2.0)
        .unwrap()
        .round()
        .unwrap();
    let values = x.to_vec::<f64>().unwrap();
    for (name, f) in ops {
        for dtype in [DType::F32, DType::F64] {
            let run = |d: &Device| {
                let x = Tensor::from_vec(values.clone(), [3, 4, 5], &cpu())
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
                    .to_device(d)
                    .unwrap()
                    .requires_grad_(true)
                    .unwrap();
                let y = f(&x).unwrap();
                let w = Generator::new(9)
                    .randn(y.shape(), dtype, &cpu())
                    .unwrap()
                    .to_device(d)
                    .unwrap();
                y.backward_with(Some(&w), false).unwrap();
                x.grad().unwrap()
            };
            let on_cpu = run(&cpu());
            let on_dev = run(&dev);
            assert_eq!(on_dev.device(), &dev, "{name}");
            assert_close(&format!("{name} {dtype}"), &on_cpu, &on_dev, 1e-5).unwrap();
        }
    }
    // cumsum in f64 through `grad_of`, whose reversed scan is exact on both devices.
    let y = |d: &Device| grad_at(&values, &[3, 4, 5], d, |x| x.cumsum(1)).unwrap();
    assert_close("cumsum", &y(&cpu()), &y(&dev), 1e-12).unwrap();
}
