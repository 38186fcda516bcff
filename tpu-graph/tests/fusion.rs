//! Elementwise fusion: random elementwise programs over shapes of many sizes (below, at and
//! above the blocks and the parallel split) give the same bits fused and unfused, in the
//! native executor and through `compile`; what must not fuse stays; and the memory plan of
//! hand-made graphs.

use std::sync::Arc;
use tpu_ops::testing::f32_bits;

use proptest::prelude::*;
use tpu_graph::exec::{native, pjrt};
use tpu_graph::fusion::{FusedElementwise, Src, Step as FusedStep, StepOp};
use tpu_graph::passes::{fuse_for_cpu, optimize_counted, promote_constants};
use tpu_graph::{CompileOptions, Graph, InputKind, compile, compile_with, trace};
use tpu_ops::ops::elementwise::binary::{Binary, BinaryKind};
use tpu_ops::ops::elementwise::unary::{Unary, UnaryKind};
use tpu_ops::prelude::*;
use tpu_ops::tpu_tensor::tpu_runtime::CpuOptions;
use tpu_ops::tpu_tensor::{DType, Device, Generator, Result, Tensor};
use tpu_ops::{Meta, OpDef};

/// Output shapes: one element, lengths around the SIMD widths, the fused kernel's blocks
/// (2048) and the parallel split (32768 elements, in chunks of 16384).
const SHAPES: &[&[usize]] = &[
    &[],
    &[1],
    &[7],
    &[17],
    &[63],
    &[65],
    &[257],
    &[4099],
    &[3, 65],
    &[5, 8209],
];

/// Numbers the programs combine values with (signed zeros included).
const NUMBERS: &[f64] = &[0.5, -1.5, 2.0, 3.0, 0.0, -0.0, 1e-3, 7.25];

/// One step of a random program: an op on earlier values (indices count back from the latest,
/// modulo the number of values, so that most steps extend a chain).
#[derive(Clone, Debug)]
enum Step {
    Unary(u8, usize),
    Binary(u8, usize, usize),
    /// `x op number`.
    Number(u8, usize, usize),
    /// `number op x`, by a method or a 0-d tensor on the left.
    NumberLeft(u8, usize, usize),
    /// The mean of a value: a node that does not fuse, and a one-element operand later.
    Mean(usize),
    /// `where(x > 0, x, y)`: nodes that do not fuse between ones that do.
    Where(usize, usize),
}

fn unary(x: &Tensor, k: u8) -> Result<Tensor> {
    match k % 22 {
        0 => x.neg(),
        1 => x.exp(),
        2 => x.log(),
        3 => x.sqrt(),
        4 => x.rsqrt(),
        5 => x.tanh(),
        6 => x.sigmoid(),
        7 => x.relu(),
        8 => x.gelu(),
        9 => x.gelu_tanh(),
        10 => x.silu(),
        11 => x.abs(),
        12 => x.square(),
        13 => x.reciprocal(),
        14 => x.sin(),
        15 => x.erf(),
        16 => x.clamp(Some(-0.5), Some(0.5)),
        17 => x.pow_scalar(2),
        18 => x.pow_scalar(0.5),
        19 => x.softplus(1.0, 20.0),
        20 => x.floor(),
        _ => x.expm1(),
    }
}

fn binary<'a>(x: &Tensor, y: impl Into<Operand<'a>>, k: u8) -> Result<Tensor> {
    match k % 10 {
        0 => x.add(y),
        1 => x.sub(y),
        2 => x.mul(y),
        3 => x.div(y),
        4 => x.maximum(y),
        5 => x.minimum(y),
        6 => x.pow(y),
        7 => x.atan2(y),
        8 => x.remainder(y),
        _ => x.div_floor(y),
    }
}

fn run(steps: &[Step], outputs: &[usize], a: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut vals: Vec<Tensor> = a.to_vec();
    let dev = a[0].device().clone();
    for s in steps {
        let n = vals.len();
        let back = |i: usize| n - 1 - i % n;
        let v = match s.clone().at_positions(back) {
            Step::Unary(k, i) => unary(&vals[i % n], k)?,
            Step::Binary(k, i, j) => binary(&vals[i % n], &vals[j % n], k)?,
            Step::Number(k, i, c) => binary(&vals[i % n], NUMBERS[c % NUMBERS.len()], k)?,
            Step::NumberLeft(k, i, c) => {
                let (x, v) = (&vals[i % n], NUMBERS[c % NUMBERS.len()]);
                match k % 3 {
                    0 => x.rsub(v)?,
                    1 => x.rpow(v)?,
                    _ => Tensor::scalar(v as f32, &dev)?.div(x)?,
                }
            }
            Step::Mean(i) => vals[i % n].mean_all()?,
            Step::Where(i, j) => {
                let (x, y) = (&vals[i % n], &vals[j % n]);
                where_(&x.gt(0.0)?, x, y)?
            }
        };
        vals.push(v);
    }
    let n = vals.len();
    Ok(outputs
        .iter()
        .map(|o| vals[n - 1 - o % n].clone())
        .collect())
}

impl Step {
    /// The step with its indices made positions in the value list by `at`.
    fn at_positions(self, at: impl Fn(usize) -> usize) -> Step {
        match self {
            Step::Unary(k, i) => Step::Unary(k, at(i)),
            Step::Binary(k, i, j) => Step::Binary(k, at(i), at(j)),
            Step::Number(k, i, c) => Step::Number(k, at(i), c),
            Step::NumberLeft(k, i, c) => Step::NumberLeft(k, at(i), c),
            Step::Mean(i) => Step::Mean(at(i)),
            Step::Where(i, j) => Step::Where(at(i), at(j)),
        }
    }
}

/// An operand: mostly one of the latest two values.
fn index() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 0usize..2, 1 => 0usize..32]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..22, index()).prop_map(|(k, i)| Step::Unary(k, i)),
        4 => (0u8..10, index(), index()).prop_map(|(k, i, j)| Step::Binary(k, i, j)),
        3 => (0u8..10, index(), 0usize..8).prop_map(|(k, i, c)| Step::Number(k, i, c)),
        1 => (0u8..3, index(), 0usize..8).prop_map(|(k, i, c)| Step::NumberLeft(k, i, c)),
        1 => index().prop_map(Step::Mean),
        1 => (index(), index()).prop_map(|(i, j)| Step::Where(i, j)),
    ]
}

/// The arguments: three values of `shape` (the third a transposed view where `shape` has two
/// dims) and a 0-d value.
fn args(shape: &[usize], seed: u64, dev: &Device) -> Vec<Tensor> {
    let mut g = Generator::new(seed);
    let third = if let [r, c] = shape {
        g.randn([*c, *r], DType::F32, dev).unwrap().t().unwrap()
    } else {
        g.randn(shape, DType::F32, dev).unwrap().mul(2.0).unwrap()
    };
    vec![
        g.randn(shape, DType::F32, dev).unwrap(),
        g.randn(shape, DType::F32, dev).unwrap().abs().unwrap(),
        third,
        Tensor::scalar(0.75f32, dev).unwrap(),
    ]
}

fn bits(ts: &[Tensor]) -> Vec<Vec<u32>> {
    ts.iter().map(|t| f32_bits(t).unwrap()).collect()
}

fn cpu2() -> Device {
    Device::new_cpu(&CpuOptions {
        num_threads: Some(2),
        memory_limit: None,
    })
    .unwrap()
}

fn fused_nodes(g: &Graph) -> usize {
    g.nodes()
        .iter()
        .filter(|n| n.op.as_any().is::<FusedElementwise>())
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn fusion_keeps_every_output_bit(
        steps in prop::collection::vec(step(), 1..20),
        outputs in prop::collection::vec(index(), 1..4),
        shape in 0usize..SHAPES.len(),
        seed in 0u64..1000,
        two_threads in any::<bool>(),
    ) {
        let dev = if two_threads { cpu2() } else { Device::cpu() };
        let args = args(SHAPES[shape], seed, &dev);
        let (s, o) = (steps.clone(), outputs.clone());
        let f = move |a: &[Tensor]| run(&s, &o, a);
        let t = trace(&f, &args).unwrap();
        // The trace computes nothing: the eager values come from running the function.
        let eager = bits(&f(&args).unwrap());
        let (mut g, captured) = (t.graph, t.captured);
        drop(t.outputs);
        promote_constants(&mut g, &captured).unwrap();
        optimize_counted(&mut g).unwrap();
        let unfused = bits(&native::run(&g, &args, &captured, &dev, &[]).unwrap());
        prop_assert_eq!(&unfused, &eager);
        let mut fused = g.clone();
        let n = fuse_for_cpu(&mut fused).unwrap();
        fused.validate().unwrap();
        prop_assert_eq!(fused.nodes().len() + n, g.nodes().len() + fused_nodes(&fused));
        let got = bits(&native::run(&fused, &args, &captured, &dev, &[]).unwrap());
        prop_assert_eq!(&got, &eager, "fusion changed the bits:\n{}\nbefore:\n{}", fused, g);
        // Fusing again finds nothing more: a fused node is not an elementwise op.
        prop_assert_eq!(fuse_for_cpu(&mut fused).unwrap(), 0);
    }

    #[test]
    fn compiled_functions_fuse_and_keep_every_output_bit(
        steps in prop::collection::vec(step(), 1..16),
        outputs in prop::collection::vec(index(), 1..4),
        shape in 0usize..SHAPES.len(),
        seed in 0u64..1000,
    ) {
        let dev = cpu2();
        let args = args(SHAPES[shape], seed, &dev);
        let (s1, o1) = (steps.clone(), outputs.clone());
        let plain = compile_with(CompileOptions::default().optimize(false), move |a: &[Tensor]| {
            run(&s1, &o1, a)
        });
        let (s2, o2) = (steps.clone(), outputs.clone());
        let opt = compile_with(CompileOptions::default(), move |a: &[Tensor]| run(&s2, &o2, a));
        let want = bits(&run(&steps, &outputs, &args).unwrap());
        // The first call traces (eagerly); the second runs the program.
        for _ in 0..2 {
            prop_assert_eq!(&bits(&plain.call(&args).unwrap()), &want);
            prop_assert_eq!(&bits(&opt.call(&args).unwrap()), &want);
        }
        prop_assert_eq!(fused_nodes(&plain.graph(&args).unwrap()), 0);
    }
}

/// `((x * a + b).gelu() * 0.5 + r).relu()`, the bench's chain.
fn chain(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let (x, w, b, r) = (&a[0], &a[1], &a[2], &a[3]);
    Ok(vec![x.mul(w)?.add(b)?.gelu()?.mul(0.5)?.add(r)?.relu()?])
}

fn chain_args(n: usize, dev: &Device) -> Vec<Tensor> {
    let mut g = Generator::new(1);
    (0..4)
        .map(|_| g.randn([n], DType::F32, dev).unwrap())
        .collect()
}

/// Traces `f`, runs the passes and fusion; the graph before and after fusion, the captured
/// tensors, the eager outputs' bits and the count fusion returned.
fn fuse_traced(
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    args: &[Tensor],
) -> (Graph, Graph, Vec<Tensor>, Vec<Vec<u32>>, usize) {
    let t = trace(&f, args).unwrap();
    // The trace computes nothing: the eager values come from running the function.
    let eager: Vec<Vec<u32>> = f(args)
        .unwrap()
        .iter()
        .map(|o| match o.dtype() {
            DType::F32 => bits(std::slice::from_ref(o)).remove(0),
            _ => o
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec::<f64>()
                .unwrap()
                .iter()
                .map(|x| *x as f32)
                .map(f32::to_bits)
                .collect(),
        })
        .collect();
    let (mut g, captured) = (t.graph, t.captured);
    promote_constants(&mut g, &captured).unwrap();
    optimize_counted(&mut g).unwrap();
    let mut fused = g.clone();
    let n = fuse_for_cpu(&mut fused).unwrap();
    (g, fused, captured, eager, n)
}

#[test]
fn a_chain_becomes_one_node() {
    let dev = Device::cpu();
    let args = chain_args(4099, &dev);
    let (g, fused, captured, eager, n) = fuse_traced(chain, &args);
    assert_eq!(g.nodes().len(), 6, "{g}");
    assert_eq!(n, 6);
    assert_eq!(fused.nodes().len(), 1, "{fused}");
    assert_eq!(fused.nodes()[0].op.name(), "fused_elementwise");
    // Inputs: the four arguments and the two numbers (0.5 and the chain's own constants).
    assert!(fused.nodes()[0].inputs.len() >= 5, "{fused}");
    let text = fused.to_string();
    for op in ["mul", "add", "gelu", "relu"] {
        assert!(
            text.contains(&format!("= {op}(")),
            "{op} missing from {text}"
        );
    }
    let got = bits(&native::run(&fused, &args, &captured, &dev, &[]).unwrap());
    assert_eq!(got, eager);
    // The dump, and so the fingerprint, is the same for the same program traced again.
    let (_, again, ..) = fuse_traced(chain, &args);
    assert_eq!(again.to_string(), text);
    assert_eq!(again.fingerprint(), fused.fingerprint());
}

#[test]
fn compile_fuses_on_the_cpu_only_when_optimising() {
    let dev = cpu2();
    let args = chain_args(100_003, &dev);
    let want = bits(&chain(&args).unwrap());
    let f = compile_with(CompileOptions::default(), chain);
    for _ in 0..2 {
        assert_eq!(bits(&f.call(&args).unwrap()), want);
    }
    let g = f.graph(&args).unwrap();
    assert_eq!(g.nodes().len(), 1, "{g}");
    assert_eq!(fused_nodes(&g), 1);
    let plain = compile_with(CompileOptions::default().optimize(false), chain);
    assert_eq!(bits(&plain.call(&args).unwrap()), want);
    assert_eq!(fused_nodes(&plain.graph(&args).unwrap()), 0);
}

#[test]
fn an_intermediate_read_elsewhere_or_returned_stays() {
    let dev = Device::cpu();
    let args = chain_args(257, &dev);
    // `t` is returned: it stays, and what reads it fuses apart from what defines it.
    let returned = |a: &[Tensor]| -> Result<Vec<Tensor>> {
        let t = a[0].mul(&a[1])?.add(1.0)?;
        Ok(vec![t.exp()?.mul(&a[2])?, t])
    };
    let (g, fused, captured, eager, n) = fuse_traced(returned, &args);
    assert_eq!(n, 4, "{g}\n{fused}");
    assert_eq!(fused_nodes(&fused), 2, "{fused}");
    assert_eq!(
        bits(&native::run(&fused, &args, &captured, &dev, &[]).unwrap()),
        eager
    );
    // `t` is also read by a sum: it stays, and so does the sum.
    let summed = |a: &[Tensor]| -> Result<Vec<Tensor>> {
        let t = a[0].tanh()?;
        Ok(vec![t.sigmoid()?.mul(&t.sum_all()?)?.neg()?])
    };
    let (_, fused, captured, eager, n) = fuse_traced(summed, &args);
    // sigmoid, mul and neg fuse (the sum is a one-element operand); tanh and the sum stay.
    assert_eq!(n, 3, "{fused}");
    assert_eq!(fused.nodes().len(), 3, "{fused}");
    assert_eq!(fused.nodes()[0].op.name(), "tanh", "{fused}");
    assert_eq!(
        bits(&native::run(&fused, &args, &captured, &dev, &[]).unwrap()),
        eager
    );
}

#[test]
fn where_fuses_with_its_condition_read_as_bools() {
    let dev = Device::cpu();
    let args = chain_args(5000, &dev);
    // A leaky relu: the comparison stays (it gives bools), the product and the choice fuse.
    let leaky = |a: &[Tensor]| -> Result<Vec<Tensor>> {
        let x = a[0].add(&a[1])?;
        Ok(vec![where_(&x.gt(0.0)?, &x, &x.mul(0.01)?)?.tanh()?])
    };
    let (g, fused, captured, eager, n) = fuse_traced(leaky, &args);
    assert_eq!(n, 3, "{g}\n{fused}");
    let names: Vec<&str> = fused.nodes().iter().map(|n| n.op.name()).collect();
    assert_eq!(names, ["add", "gt", "fused_elementwise"], "{fused}");
    assert!(fused.to_string().contains("bools"), "{fused}");
    assert_eq!(
        bits(&native::run(&fused, &args, &captured, &dev, &[]).unwrap()),
        eager
    );
    // One bool for every element, from a 0-d comparison.
    let pick = |a: &[Tensor]| -> Result<Vec<Tensor>> {
        let c = a[0].sum_all()?.gt(0.0)?;
        Ok(vec![where_(&c, &a[1].exp()?, &a[2])?.neg()?])
    };
    let (_, fused, captured, eager, n) = fuse_traced(pick, &args);
    assert_eq!(n, 3, "{fused}");
    assert_eq!(
        bits(&native::run(&fused, &args, &captured, &dev, &[]).unwrap()),
        eager
    );
}

#[test]
fn other_dtypes_and_broadcasts_do_not_fuse() {
    let dev = Device::cpu();
    for dtype in [DType::F64, DType::F16, DType::BF16, DType::I32] {
        let x = Generator::new(2)
            .randn([65], DType::F32, &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let f = |a: &[Tensor]| -> Result<Vec<Tensor>> {
            Ok(vec![a[0].mul(&a[0])?.add(&a[0])?.abs()?.neg()?])
        };
        let (_, fused, ..) = fuse_traced(f, &[x]);
        assert_eq!(fused_nodes(&fused), 0, "{dtype}: {fused}");
    }
    // A row broadcast over a matrix is not a one-element operand.
    let mut g = Generator::new(3);
    let m = g.randn([3, 4], DType::F32, &dev).unwrap();
    let row = g.randn([4], DType::F32, &dev).unwrap();
    let f = |a: &[Tensor]| -> Result<Vec<Tensor>> { Ok(vec![a[0].exp()?.add(&a[1])?.tanh()?]) };
    let (_, fused, _, _, n) = fuse_traced(f, &[m.clone(), row]);
    assert_eq!(n, 0, "{fused}");
    // Nor is a value of another shape defined inside a chain: `r` is [4], the rest [3, 4].
    let f = |a: &[Tensor]| -> Result<Vec<Tensor>> {
        let r = a[1].exp()?.neg()?;
        Ok(vec![a[0].mul(&r)?.relu()?])
    };
    let row = Generator::new(4).randn([4], DType::F32, &dev).unwrap();
    let (_, fused, captured, eager, n) = fuse_traced(f, &[m.clone(), row.clone()]);
    assert_eq!(n, 2, "{fused}");
    assert_eq!(fused_nodes(&fused), 1, "{fused}");
    assert_eq!(
        bits(&native::run(&fused, &[m, row], &captured, &dev, &[]).unwrap()),
        eager
    );
    // An f32 result of an f16 operand is a cast inside the kernel: it stays.
    let h = Generator::new(5)
        .randn([9], DType::F32, &dev)
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    let x = Generator::new(6).randn([9], DType::F32, &dev).unwrap();
    let f = |a: &[Tensor]| -> Result<Vec<Tensor>> { Ok(vec![a[0].add(&a[1])?.exp()?]) };
    let (_, fused, _, _, n) = fuse_traced(f, &[h, x]);
    assert_eq!(n, 0, "{fused}");
}

#[test]
fn bad_programs_are_errors() {
    let s = [7usize];
    let f32s = Meta::new(&s, DType::F32);
    let exp = || StepOp::Unary(Unary(UnaryKind::Exp));
    let step = |op, args| FusedStep { op, args };
    // A later step, a missing input, a bool-valued op, a unary over one element, no steps.
    assert!(
        FusedElementwise::new(
            &s,
            std::slice::from_ref(&f32s),
            vec![step(exp(), vec![Src::Step(0)])]
        )
        .is_err()
    );
    assert!(
        FusedElementwise::new(
            &s,
            std::slice::from_ref(&f32s),
            vec![step(exp(), vec![Src::Input(1)])]
        )
        .is_err()
    );
    assert!(
        FusedElementwise::new(
            &s,
            std::slice::from_ref(&f32s),
            vec![step(
                StepOp::Unary(Unary(UnaryKind::IsNan)),
                vec![Src::Input(0)]
            )]
        )
        .is_err()
    );
    let one = Meta::new(&[], DType::F32);
    assert!(
        FusedElementwise::new(
            &s,
            std::slice::from_ref(&one),
            vec![step(exp(), vec![Src::Input(0)])]
        )
        .is_err()
    );
    assert!(FusedElementwise::new(&s, std::slice::from_ref(&f32s), vec![]).is_err());
    // A condition that is an f32 step, or bools read as an f32 operand.
    let bools = Meta::new(&s, DType::Bool);
    assert!(
        FusedElementwise::new(
            &s,
            std::slice::from_ref(&f32s),
            vec![
                step(exp(), vec![Src::Input(0)]),
                step(
                    StepOp::Where,
                    vec![Src::Step(0), Src::Input(0), Src::Input(0)]
                ),
            ]
        )
        .is_err()
    );
    assert!(
        FusedElementwise::new(
            &s,
            &[bools.clone(), f32s.clone()],
            vec![step(
                StepOp::Where,
                vec![Src::Input(0), Src::Input(0), Src::Input(1)]
            )]
        )
        .is_err()
    );
    assert!(
        FusedElementwise::new(
            &s,
            &[bools, f32s.clone()],
            vec![step(
                StepOp::Where,
                vec![Src::Input(0), Src::Input(1), Src::Input(1)]
            )]
        )
        .is_ok()
    );
    let f64s = Meta::new(&s, DType::F64);
    assert!(FusedElementwise::new(&s, &[f64s], vec![step(exp(), vec![Src::Input(0)])]).is_err());
    // A good one refuses inputs of other types when it runs.
    let op = FusedElementwise::new(
        &s,
        &[f32s.clone(), one],
        vec![
            step(exp(), vec![Src::Input(0)]),
            step(
                StepOp::Binary(Binary {
                    kind: BinaryKind::Mul,
                    numbers: [false, false],
                }),
                vec![Src::Step(0), Src::Input(1)],
            ),
        ],
    )
    .unwrap();
    assert!(op.infer(&[f32s.clone(), f32s.clone()]).is_err());
    let dev = Device::cpu();
    let x = Tensor::zeros([8], DType::F32, &dev).unwrap();
    let c = Tensor::scalar(2.0f32, &dev).unwrap();
    assert!(op.cpu(&[&x, &c], std::slice::from_ref(&f32s)).is_err());
    let x = Tensor::from_vec(vec![0.0f32, 1.0, -1.0, 2.0, 0.5, -0.5, 3.0], [7], &dev).unwrap();
    let got = op.cpu(&[&x, &c], &[f32s]).unwrap();
    assert_eq!(
        got[0].to_vec::<f32>().unwrap(),
        x.exp().unwrap().mul(&c).unwrap().to_vec::<f32>().unwrap()
    );
}

/// The output bits of `g` run as one PJRT program on `dev`.
fn pjrt_bits(g: &Graph, args: &[Tensor], captured: &[Tensor], dev: &Device) -> Vec<Vec<u32>> {
    let inputs = pjrt::gather(g, args, captured).unwrap();
    let lowered = pjrt::lower(g, &pjrt::input_specs(&inputs).unwrap(), false, &[]).unwrap();
    let (p, _) = pjrt::Program::compile(g, lowered, dev, None).unwrap();
    bits(&p.run(&inputs, dev).unwrap())
}

/// A fused graph still lowers: one PJRT program of it gives the bits of the unfused one.
#[test]
fn fused_nodes_lower_to_their_steps() {
    let Some(dev) = tpu_ops::testing::pjrt_device("tpu-graph fusion") else {
        return;
    };
    let args: Vec<Tensor> = chain_args(1000, &Device::cpu())
        .iter()
        .map(|t| t.to_device(&dev).unwrap())
        .collect();
    let (g, fused, captured, _, n) = fuse_traced(chain, &args);
    assert!(n > 0);
    let run_on = |g: &Graph| pjrt_bits(g, &args, &captured, &dev);
    assert_eq!(run_on(&fused), run_on(&g));
}

// ---- updates in products' stores ---------------------------------------------------------------

/// An SGD-style update from a weight gradient's product: `w - (gᵀ · x) * lr`.
fn sgd_update(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let (g, x, w, lr) = (&a[0], &a[1], &a[2], &a[3]);
    Ok(vec![w.sub(&g.t()?.matmul(x)?.mul(lr)?)?])
}

fn sgd_args(batch: usize, m: usize, n: usize, dev: &Device) -> Vec<Tensor> {
    let mut g = Generator::new(3);
    vec![
        g.randn([batch, m], DType::F32, dev).unwrap(),
        g.randn([batch, n], DType::F32, dev).unwrap(),
        g.randn([m, n], DType::F32, dev).unwrap(),
        Tensor::scalar(0.01f32, dev).unwrap(),
    ]
}

/// The product, the scaling and the subtraction become one node with the eager bits, whether
/// the product's kernel takes the one-pass path (`k` of one block) or not (a longer `k`, a
/// vector result).
#[test]
fn an_sgd_update_fuses_into_its_product_with_eager_bits() {
    let dev = cpu2();
    for (batch, m, n) in [(128, 65, 257), (1100, 17, 40), (5, 1, 33)] {
        let args = sgd_args(batch, m, n, &dev);
        let (g, fused, captured, eager, n_fused) = fuse_traced(sgd_update, &args);
        assert_eq!(n_fused, 3, "{fused}");
        assert_eq!(
            fused.nodes().len(),
            2,
            "a view and the fused node:\n{fused}"
        );
        assert!(fused.to_string().contains("sub_scaled_product("), "{fused}");
        let run = |g: &Graph| bits(&native::run(g, &args, &captured, &dev, &[]).unwrap());
        assert_eq!(run(&fused), eager, "{batch}x{m}x{n}");
        assert_eq!(run(&g), eager);
    }
}

/// A product read elsewhere too stays a product.
#[test]
fn a_product_read_twice_keeps_its_update_apart() {
    let f = |a: &[Tensor]| {
        let p = a[0].t()?.matmul(&a[1])?;
        Ok(vec![a[2].sub(&p.mul(&a[3])?)?, p])
    };
    let (_, fused, _, _, _) = fuse_traced(f, &sgd_args(8, 16, 24, &Device::cpu()));
    assert!(!fused.to_string().contains("sub_scaled_product"), "{fused}");
}

/// The graph input index of argument `i`.
fn arg_input(g: &Graph, i: usize) -> usize {
    g.inputs()
        .iter()
        .position(|(_, k)| *k == InputKind::Arg(i))
        .expect("the argument is an input")
}

/// A donated weight read last by its fused update is updated in its own memory: the output
/// is the weight's tensor, holding the eager bits, on the one-pass kernel and on the paths
/// that multiply and then subtract.
#[test]
fn a_donated_weight_is_updated_in_its_own_memory() {
    let dev = cpu2();
    for (batch, m, n) in [(128, 65, 257), (1100, 17, 40), (5, 1, 33)] {
        let args = sgd_args(batch, m, n, &dev);
        let (_, fused, captured, eager, _) = fuse_traced(sgd_update, &args);
        let w = arg_input(&fused, 2);
        let out = native::run(&fused, &args, &captured, &dev, &[(w, 0)]).unwrap();
        assert!(
            Arc::ptr_eq(out[0].storage(), args[2].storage()),
            "{batch}x{m}x{n}: the update wrote a new buffer"
        );
        assert_eq!(bits(&out), eager, "{batch}x{m}x{n}");
        assert_eq!(bits(&args[2..3]), eager, "{batch}x{m}x{n}");
    }
}

/// A weight is not overwritten where something else would see it: read again after its
/// update, donated to another output, returned twice, or sharing its storage with an operand.
#[test]
fn a_weight_read_elsewhere_is_not_updated_in_place() {
    let dev = cpu2();
    type Case = (&'static str, fn(&[Tensor]) -> Result<Vec<Tensor>>, usize);
    let cases: [Case; 3] = [
        (
            "read after",
            |a| {
                let mut out = sgd_update(a)?;
                out.push(a[2].mul(&a[3])?);
                Ok(out)
            },
            0,
        ),
        (
            "twice",
            |a| {
                let u = sgd_update(a)?.remove(0);
                Ok(vec![u.clone(), u])
            },
            0,
        ),
        (
            "another output",
            |a| Ok(vec![sgd_update(a)?.remove(0), a[3].clone()]),
            1,
        ),
    ];
    for (name, f, out) in cases {
        let args = sgd_args(64, 24, 40, &dev);
        let before = bits(&args[2..3]);
        let (_, fused, captured, eager, _) = fuse_traced(f, &args);
        let w = arg_input(&fused, 2);
        let got = native::run(&fused, &args, &captured, &dev, &[(w, out)]).unwrap();
        assert_eq!(bits(&got), eager, "{name}");
        assert_eq!(bits(&args[2..3]), before, "{name}: the weight changed");
    }
    // `x` a view of the weight's storage: the update would read what it writes.
    let mut args = sgd_args(24, 24, 24, &dev);
    args[1] = args[2].clone();
    let before = bits(&args[2..3]);
    let (_, fused, captured, eager, _) = fuse_traced(sgd_update, &args);
    let w = arg_input(&fused, 2);
    let got = native::run(&fused, &args, &captured, &dev, &[(w, 0)]).unwrap();
    assert_eq!(bits(&got), eager);
    assert_eq!(
        bits(&args[2..3]),
        before,
        "shared storage: the weight changed"
    );
}

/// A compiled SGD step on a captured weight keeps the weight's buffer (it is updated where it
/// lies, not replaced) and gives the eager step's bits.
#[test]
fn a_compiled_sgd_step_updates_its_weight_where_it_lies() {
    let dev = cpu2();
    let args = sgd_args(128, 96, 200, &dev);
    let w = args[2].copy().unwrap();
    let address = |t: &Tensor| {
        t.storage()
            .with_host_bytes(|b| Ok(b.as_ptr() as usize))
            .unwrap()
    };
    let at = address(&w);
    let want = bits(&sgd_update(&args).unwrap());
    let wc = w.clone();
    let step = compile(move |a: &[Tensor]| {
        let new = sgd_update(&[a[0].clone(), a[1].clone(), wc.clone(), a[2].clone()])?.remove(0);
        wc.copy_(&new)?;
        Ok(vec![])
    });
    step.call(&[args[0].clone(), args[1].clone(), args[3].clone()])
        .unwrap();
    assert_eq!(bits(std::slice::from_ref(&w)), want);
    assert_eq!(address(&w), at, "the step replaced the weight's buffer");
}

/// The fused update lowers to its three ops: one PJRT program gives the unfused bits.
#[test]
fn a_fused_update_lowers_to_its_ops() {
    let Some(dev) = tpu_ops::testing::pjrt_device("tpu-graph fusion") else {
        return;
    };
    let args: Vec<Tensor> = sgd_args(32, 20, 48, &Device::cpu())
        .iter()
        .map(|t| t.to_device(&dev).unwrap())
        .collect();
    let (g, fused, captured, _, n) = fuse_traced(sgd_update, &args);
    assert_eq!(n, 3);
    let run_on = |g: &Graph| pjrt_bits(g, &args, &captured, &dev);
    assert_eq!(run_on(&fused), run_on(&g));
}

// ---- memory plans -------------------------------------------------------------------------------

fn unary_op(kind: UnaryKind) -> Arc<dyn OpDef> {
    Arc::new(Unary(kind))
}

fn add_op() -> Arc<dyn OpDef> {
    Arc::new(Binary {
        kind: BinaryKind::Add,
        numbers: [false, false],
    })
}

#[test]
fn a_chain_plans_two_buffers() {
    let mut g = Graph::new();
    let m = Meta::new(&[1024], DType::F32);
    let x = g.add_input(m.clone(), InputKind::Arg(0));
    let mut v = x;
    for _ in 0..4 {
        v = g
            .add_node(unary_op(UnaryKind::Exp), &[v], std::slice::from_ref(&m))
            .unwrap()[0];
    }
    g.set_outputs(vec![v]);
    let plan = g.memory_plan();
    assert_eq!(plan.total_bytes, 4 * 4096);
    assert_eq!(plan.peak_bytes, 2 * 4096);
    assert_eq!(plan.live_peak_bytes, 2 * 4096);
    let offsets: Vec<usize> = plan.placements.iter().map(|p| p.offset).collect();
    assert_eq!(offsets, vec![0, 4096, 0, 4096]);
    assert_eq!(plan.placements[3].last_use, None);
}

#[test]
fn freed_ranges_are_reused_best_fit_and_merged() {
    let mut g = Graph::new();
    let big = Meta::new(&[1000], DType::F32); // 4000 bytes, 4032 aligned
    let small = Meta::new(&[10], DType::F32); // 40 bytes, 64 aligned
    let x = g.add_input(big.clone(), InputKind::Arg(0));
    let s = g.add_input(small.clone(), InputKind::Arg(1));
    let one = |g: &mut Graph, kind, v, m: &Meta| {
        g.add_node(unary_op(kind), &[v], std::slice::from_ref(m))
            .unwrap()[0]
    };
    let a = one(&mut g, UnaryKind::Exp, x, &big); // node 0 at 0
    let b = one(&mut g, UnaryKind::Exp, s, &small); // node 1 at 4032
    let c = one(&mut g, UnaryKind::Neg, a, &big); // node 2 at 4096; a freed after it
    let d = one(&mut g, UnaryKind::Neg, b, &small); // node 3 best fit: a's range at 0; b freed
    // Dead: freed at once, after its node.
    let _dead = one(&mut g, UnaryKind::Tanh, c, &big); // node 4
    let e = g
        .add_node(add_op(), &[c, c], std::slice::from_ref(&big))
        .unwrap()[0]; // node 5
    g.set_outputs(vec![d, e]);
    let plan = g.memory_plan();
    let at: Vec<(usize, usize)> = plan
        .placements
        .iter()
        .map(|p| (p.offset, p.bytes))
        .collect();
    // node 4: free are [64, 4032) (a's rest) and [4032, 4096) (b's), merged into [64, 4096):
    // the dead value of 4032 bytes fits there.
    // node 5: the dead value's range is free again after node 4.
    assert_eq!(
        at,
        vec![
            (0, 4032),
            (4032, 64),
            (4096, 4032),
            (0, 64),
            (64, 4032),
            (64, 4032)
        ]
    );
    assert_eq!(plan.peak_bytes, 8128);
    assert_eq!(plan.total_bytes, 4 * 4032 + 2 * 64);
    assert_eq!(plan.live_peak_bytes, 2 * 4032 + 64);
    assert_eq!(plan.placements[4].last_use, Some(4));
}

#[test]
fn fusion_lowers_the_planned_peak() {
    let dev = Device::cpu();
    let args = chain_args(4096, &dev);
    let (g, fused, ..) = fuse_traced(chain, &args);
    let (before, after) = (g.memory_plan(), fused.memory_plan());
    assert_eq!(before.peak_bytes, 2 * 4096 * 4, "{g}");
    assert_eq!(before.total_bytes, 6 * 4096 * 4);
    assert_eq!(after.peak_bytes, 4096 * 4);
    assert_eq!(after.total_bytes, 4096 * 4);
}
