//! The passes on random programs: every program gives the same bits with and without them (each
//! pass alone and all of them to a fixed point), and never has more nodes after them. The
//! programs are built to contain what the passes look for: products and sums with identities,
//! transposes, view chains broken by an identity, products of transposes, and subgraphs over
//! constants the program makes itself.

use proptest::prelude::*;
use tpu_graph::exec::{native, pjrt};
use tpu_graph::passes::{
    cse, dce, fold_constants, matmul_transposes, optimize_counted, promote_constants, simplify,
};
use tpu_graph::{CompileOptions, Graph, compile_with, trace};
use tpu_ops::ops::linalg::linear;
use tpu_ops::prelude::*;
use tpu_ops::testing::f32_bits;
use tpu_ops::tpu_tensor::{DType, Device, Generator, Result, Tensor};

/// The side of every value: all values are `[N, N]` f32, so any step applies to any value.
const N: usize = 4;

/// One step of a random program: an op on earlier values (indices taken modulo their count).
#[derive(Clone, Debug)]
enum Step {
    Unary(u8, usize),
    Binary(u8, usize, usize),
    /// An identity, or a near-identity that must stay (`x + 0.0`).
    Ident(u8, usize),
    /// A view, an identity, then a view back to `[N, N]`.
    Views(u8, u8, usize),
    /// A product with a transposed operand.
    Product(u8, usize, usize),
    /// A value computed from constants the program makes, combined with an earlier value.
    Constant(u8, usize),
}

fn view(x: &Tensor, k: u8) -> Result<Tensor> {
    match k % 5 {
        0 => x.t(),
        1 => x.reshape([2, 2 * N]),
        2 => x.reshape([N * N]),
        3 => x.narrow(0, 1, 1)?.expand([N, N]),
        _ => x.reshape([N, N]),
    }
}

fn back(x: &Tensor, k: u8) -> Result<Tensor> {
    match k % 3 {
        0 if x.rank() == 2 && x.shape()[0] == x.shape()[1] => x.t(),
        1 => x.reshape([N * N]),
        _ => Ok(x.clone()),
    }
    .and_then(|y| y.reshape([N, N]))
}

fn run(steps: &[Step], outputs: &[usize], a: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut vals: Vec<Tensor> = a.to_vec();
    let dev = a[0].device().clone();
    for s in steps {
        let n = vals.len();
        let v = match *s {
            Step::Unary(k, i) => {
                let x = &vals[i % n];
                match k % 4 {
                    0 => x.tanh()?,
                    1 => x.neg()?,
                    2 => x.mul(0.5)?,
                    _ => x.sigmoid()?,
                }
            }
            Step::Binary(k, i, j) => {
                let (x, y) = (&vals[i % n], &vals[j % n]);
                match k % 3 {
                    0 => x.add(y)?,
                    1 => x.mul(y)?,
                    _ => x.sub(y)?,
                }
            }
            Step::Ident(k, i) => {
                let x = &vals[i % n];
                match k % 8 {
                    0 => x.mul(1.0)?,
                    1 => Tensor::scalar(1.0f32, &dev)?.mul(x)?,
                    2 => x.div(1.0)?,
                    3 => x.sub(0.0)?,
                    4 => x.add(-0.0)?,
                    5 => x.mul(&Tensor::ones([1, N], DType::F32, &dev)?)?,
                    // Not identities: the first maps -0.0 to +0.0, the second broadcasts.
                    6 => x.add(0.0)?,
                    _ => x
                        .narrow(0, 0, 1)?
                        .mul(&Tensor::ones([N, N], DType::F32, &dev)?)?,
                }
            }
            Step::Views(k, m, i) => {
                let x = view(&vals[i % n], k)?;
                back(&x.mul(1.0)?, m)?.mul(1.0)?
            }
            Step::Product(k, i, j) => {
                let (x, y) = (&vals[i % n], &vals[j % n]);
                match k % 4 {
                    0 => x.matmul(&y.t()?)?,
                    1 => x.t()?.matmul(y)?,
                    2 => linear(x, &y.t()?, None)?,
                    _ => linear(x, y, None)?,
                }
            }
            Step::Constant(k, i) => {
                let x = &vals[i % n];
                let c = Tensor::from_vec(
                    (0..N * N).map(|e| e as f32 * 0.25 - 1.0).collect(),
                    [N, N],
                    &dev,
                )?;
                // A view of a captured tensor is captured too, sharing its storage (and so
                // never a constant): the views here are of a node's result.
                let d = c.mul(1.0)?;
                let c = match k % 3 {
                    0 => c.mul(2.0)?.add(1.0)?,
                    1 => d.t()?.tanh()?.mul(&c)?,
                    _ => d.matmul(&d.t()?)?.sub(0.0)?,
                };
                x.add(&c)?
            }
        };
        vals.push(v);
    }
    let n = vals.len();
    Ok(outputs.iter().map(|o| vals[o % n].clone()).collect())
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u8..4, 0usize..32).prop_map(|(k, i)| Step::Unary(k, i)),
        (0u8..3, 0usize..32, 0usize..32).prop_map(|(k, i, j)| Step::Binary(k, i, j)),
        (0u8..8, 0usize..32).prop_map(|(k, i)| Step::Ident(k, i)),
        (0u8..5, 0u8..3, 0usize..32).prop_map(|(k, m, i)| Step::Views(k, m, i)),
        (0u8..4, 0usize..32, 0usize..32).prop_map(|(k, i, j)| Step::Product(k, i, j)),
        (0u8..3, 0usize..32).prop_map(|(k, i)| Step::Constant(k, i)),
    ]
}

/// The arguments: two random matrices and one of signed zeros (which `x + 0.0` must keep
/// apart) and small numbers.
fn args(seed: u64, dev: &Device) -> Vec<Tensor> {
    let mut g = Generator::new(seed);
    let zeros: Vec<f32> = (0..N * N)
        .map(|e| match e % 3 {
            0 => -0.0,
            1 => 0.0,
            _ => e as f32 * -0.5,
        })
        .collect();
    vec![
        g.randn([N, N], DType::F32, dev).unwrap(),
        g.randn([N, N], DType::F32, dev).unwrap(),
        Tensor::from_vec(zeros, [N, N], dev).unwrap(),
    ]
}

fn bits(ts: &[Tensor]) -> Vec<Vec<u32>> {
    ts.iter().map(|t| f32_bits(t).unwrap()).collect()
}

type Pass = fn(&mut Graph) -> Result<usize>;

fn passes() -> Vec<(&'static str, Pass)> {
    vec![
        ("simplify", simplify),
        ("matmul_transposes", matmul_transposes),
        ("fold_constants", fold_constants),
        ("cse", |g| cse(g).map(usize::from)),
        ("dce", |g| dce(g).map(usize::from)),
        ("optimize", |g| {
            optimize_counted(g).map(|(r, _)| r.nodes_after)
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn every_pass_keeps_every_output_bit(
        steps in prop::collection::vec(step(), 1..24),
        outputs in prop::collection::vec(0usize..64, 1..4),
        seed in 0u64..1000,
    ) {
        let dev = Device::cpu();
        let args = args(seed, &dev);
        let (s, o) = (steps.clone(), outputs.clone());
        let f = move |a: &[Tensor]| run(&s, &o, a);
        let t = trace(&f, &args).unwrap();
        // The trace computes nothing: the eager values come from running the function.
        let eager = bits(&f(&args).unwrap());
        let (plain, captured) = (t.graph, t.captured);
        drop(t.outputs);
        prop_assert_eq!(&bits(&native::run(&plain, &args, &captured, &dev, &[]).unwrap()), &eager);
        let mut promoted = plain.clone();
        promote_constants(&mut promoted, &captured).unwrap();
        for (name, pass) in passes() {
            let mut g = promoted.clone();
            pass(&mut g).unwrap();
            g.validate().unwrap();
            let got = bits(&native::run(&g, &args, &captured, &dev, &[]).unwrap());
            prop_assert_eq!(&got, &eager, "{} changed the bits:\n{}\nbefore:\n{}", name, g, plain);
            prop_assert!(g.nodes().len() <= plain.nodes().len(), "{} grew the graph", name);
        }
    }

    #[test]
    fn compiled_functions_keep_every_output_bit(
        steps in prop::collection::vec(step(), 1..16),
        outputs in prop::collection::vec(0usize..64, 1..4),
        seed in 0u64..1000,
    ) {
        let dev = Device::cpu();
        let args = args(seed, &dev);
        let (s1, o1) = (steps.clone(), outputs.clone());
        let plain = compile_with(CompileOptions::default().optimize(false), move |a: &[Tensor]| run(&s1, &o1, a));
        let (s2, o2) = (steps.clone(), outputs.clone());
        let opt = compile_with(CompileOptions::default(), move |a: &[Tensor]| run(&s2, &o2, a));
        let want = bits(&plain.call(&args).unwrap());
        prop_assert_eq!(&bits(&opt.call(&args).unwrap()), &want);
        prop_assert_eq!(&bits(&run(&steps, &outputs, &args).unwrap()), &want);
        let before = plain.graph(&args).unwrap().nodes().len();
        let after = opt.graph(&args).unwrap().nodes().len();
        prop_assert!(after <= before);
    }
}

/// The patterns the random programs hold are found: each pass has work on them.
#[test]
fn every_pattern_is_found() {
    let dev = Device::cpu();
    let steps = vec![
        Step::Ident(0, 0),
        Step::Ident(1, 3),
        Step::Ident(5, 4),
        Step::Views(0, 0, 1),
        Step::Views(3, 1, 6),
        Step::Product(0, 0, 1),
        Step::Product(2, 1, 8),
        Step::Constant(1, 9),
    ];
    let outputs: Vec<usize> = (3..3 + steps.len()).collect();
    let args = args(5, &dev);
    let (s, o) = (steps.clone(), outputs.clone());
    let f = move |a: &[Tensor]| run(&s, &o, a);
    let t = trace(&f, &args).unwrap();
    // The trace computes nothing: the eager values come from running the function.
    let eager = bits(&f(&args).unwrap());
    let (mut g, captured) = (t.graph, t.captured);
    drop(t.outputs);
    assert!(promote_constants(&mut g, &captured).unwrap() > 0);
    let (report, counts) = optimize_counted(&mut g).unwrap();
    assert!(counts.simplify >= 5, "{counts:?}\n{g}");
    assert_eq!(counts.matmul_transposes, 2, "{counts:?}\n{g}");
    assert!(counts.folded >= 3, "{counts:?}\n{g}");
    assert!(counts.constants_dropped > 0, "{counts:?}\n{g}");
    assert!(
        report.nodes_after * 2 < report.nodes_before,
        "{report:?}\n{g}"
    );
    assert_eq!(
        bits(&native::run(&g, &args, &captured, &dev, &[]).unwrap()),
        eager
    );
}

/// A program of every pattern, run as one PJRT program before and after the passes.
#[test]
fn the_passes_keep_the_bits_of_pjrt_programs() {
    let Some(dev) = tpu_ops::testing::pjrt_device("tpu-graph passes") else {
        return;
    };
    let programs: Vec<Vec<Step>> = vec![
        vec![
            Step::Ident(0, 0),
            Step::Ident(3, 3),
            Step::Ident(4, 4),
            Step::Ident(6, 2),
        ],
        vec![
            Step::Views(0, 0, 0),
            Step::Views(1, 2, 1),
            Step::Views(3, 1, 4),
        ],
        vec![
            Step::Product(0, 0, 1),
            Step::Product(2, 1, 3),
            Step::Binary(0, 3, 4),
        ],
        vec![
            Step::Constant(0, 0),
            Step::Constant(1, 3),
            Step::Binary(1, 3, 4),
        ],
    ];
    for steps in programs {
        let outputs: Vec<usize> = (3..3 + steps.len()).collect();
        let args = args(3, &dev);
        let (s, o) = (steps.clone(), outputs.clone());
        let f = move |a: &[Tensor]| run(&s, &o, a);
        let t = trace(&f, &args).unwrap();
        let (plain, captured) = (t.graph, t.captured);
        drop(t.outputs);
        let mut g = plain.clone();
        promote_constants(&mut g, &captured).unwrap();
        let (report, counts) = optimize_counted(&mut g).unwrap();
        assert!(
            report.nodes_after < report.nodes_before,
            "{steps:?}: {counts:?}\n{g}"
        );
        let run_on = |g: &Graph| {
            let inputs = pjrt::gather(g, &args, &captured).unwrap();
            let lowered = pjrt::lower(g, &pjrt::input_specs(&inputs).unwrap(), false, &[]).unwrap();
            let (p, _) = pjrt::Program::compile(g, lowered, &dev, None).unwrap();
            bits(&p.run(&inputs, &dev).unwrap())
        };
        assert_eq!(
            run_on(&plain),
            run_on(&g),
            "{steps:?}:\n{g}\nbefore:\n{plain}"
        );
    }
}
