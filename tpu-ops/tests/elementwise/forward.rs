//! Elementwise ops: property tests against naive reference kernels, values from PyTorch, type
//! promotion, operators, and errors for bad input.

// Literals are copied exactly as PyTorch prints them (f64 renderings of f32 values).
#![allow(clippy::excessive_precision)]

use crate::common::cpu;
use crate::common::test_device;
use proptest::prelude::*;
use tpu_ops::prelude::*;
use tpu_tensor::{DType, Device, Error, Generator, Tensor, bf16};

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

fn i64s(t: &Tensor) -> Vec<i64> {
    t.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap()
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs());
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

#[test]
fn activations_match_pytorch() {
    // x = torch.tensor([-3.0, -1.5, -0.5, 0.0, 0.5, 1.0, 2.5, 10.0])
    let x = Tensor::new([-3.0f32, -1.5, -0.5, 0.0, 0.5, 1.0, 2.5, 10.0], &cpu()).unwrap();
    // What, the op, and PyTorch's values from the call in the comment.
    type Activation = fn(&Tensor) -> tpu_tensor::Result<Tensor>;
    let cases: [(&str, Activation, [f32; 8]); 4] = [
        // [float(v) for v in torch.nn.functional.gelu(x)]
        (
            "gelu",
            |x| x.gelu(),
            [
                -0.004050225019454956,
                -0.10021086037158966,
                -0.1542687714099884,
                0.0,
                0.3457312285900116,
                0.8413447141647339,
                2.48447585105896,
                10.0,
            ],
        ),
        // torch.nn.functional.gelu(x, approximate='tanh')
        (
            "gelu_tanh",
            |x| x.gelu_tanh(),
            [
                -0.0036374330520629883,
                -0.10042843222618103,
                -0.1542859971523285,
                0.0,
                0.3457140028476715,
                0.8411920070648193,
                2.4849157333374023,
                10.0,
            ],
        ),
        // torch.nn.functional.silu(x)
        (
            "silu",
            |x| x.silu(),
            [
                -0.14227761328220367,
                -0.2736382782459259,
                -0.1887703388929367,
                0.0,
                0.3112296760082245,
                0.7310585975646973,
                2.310354471206665,
                9.99954605102539,
            ],
        ),
        // torch.nn.functional.softplus(x)
        (
            "softplus",
            |x| x.softplus(1.0, 20.0),
            [
                0.04858735203742981,
                0.20141328871250153,
                0.4740769863128662,
                0.6931471824645996,
                0.9740769863128662,
                1.31326162815094,
                2.578889846801758,
                10.000045776367188,
            ],
        ),
    ];
    for (what, f, want) in cases {
        close(what, &f32s(&f(&x).unwrap()), &want, 1e-6);
    }
    // torch.sigmoid(torch.tensor([-2.0, 0.3, 5.0], dtype=torch.float16))
    let h = Tensor::new([-2.0f32, 0.3, 5.0], &cpu())
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    assert_eq!(
        f32s(&h.sigmoid().unwrap()),
        [0.11920166015625, 0.57421875, 0.9931640625]
    );
    // torch.exp2(torch.tensor([0.5, -3.25]))
    let e = Tensor::new([0.5f32, -3.25], &cpu()).unwrap();
    close(
        "exp2",
        &f32s(&e.exp2().unwrap()),
        &[1.4142135381698608, 0.10511205345392227],
        1e-7,
    );
}

#[test]
fn integer_division_and_remainder_signs_match_pytorch() {
    // a = torch.tensor([-7, 7, -7, 7, -8, 0]); b = torch.tensor([2, -2, -2, 2, 3, 5])
    let a = Tensor::new([-7i64, 7, -7, 7, -8, 0], &cpu()).unwrap();
    let b = Tensor::new([2i64, -2, -2, 2, 3, 5], &cpu()).unwrap();
    // torch.div(a, b, rounding_mode='floor').tolist()
    assert_eq!(i64s(&a.div_floor(&b).unwrap()), [-4, -4, 3, 3, -3, 0]);
    // torch.div(a, b, rounding_mode='trunc').tolist()
    assert_eq!(i64s(&a.div_trunc(&b).unwrap()), [-3, -3, 3, 3, -2, 0]);
    // torch.remainder(a, b).tolist()
    assert_eq!(i64s(&a.remainder(&b).unwrap()), [1, -1, -1, 1, 1, 0]);
    assert_eq!(a.div_floor(&b).unwrap().dtype(), DType::I64);
    // (torch.tensor([7, -7]) / torch.tensor([2, 2])).tolist() -> [3.5, -3.5], float32
    let q = Tensor::new([7i64, -7], &cpu()).unwrap().div(2).unwrap();
    assert_eq!((q.dtype(), f32s(&q)), (DType::F32, vec![3.5, -3.5]));
    // torch.pow(torch.tensor([2, -1, 1, 3, 0]), torch.tensor([10, -3, -5, -1, 0])).tolist()
    let p = Tensor::new([2i64, -1, 1, 3, 0], &cpu())
        .unwrap()
        .pow(&Tensor::new([10i64, -3, -5, -1, 0], &cpu()).unwrap())
        .unwrap();
    assert_eq!(i64s(&p), [1024, -1, 1, 0, 1]);
    let e = a
        .div_floor(&Tensor::new([1i64, 0, 1, 1, 1, 1], &cpu()).unwrap())
        .unwrap_err();
    assert!(e.to_string().contains("division by zero"), "{e}");
}

#[test]
fn float_floor_division_and_remainder_match_pytorch() {
    // af = torch.tensor([-7.5, 7.5, -7.5, 5.0, -0.0, 1e-30]); bf = torch.tensor([2.0, -2.0, -2.0, 0.0, 3.0, -1e30])
    let a = Tensor::new([-7.5f32, 7.5, -7.5, 5.0, -0.0, 1e-30], &cpu()).unwrap();
    let b = Tensor::new([2.0f32, -2.0, -2.0, 0.0, 3.0, -1e30], &cpu()).unwrap();
    // torch.div(af, bf, rounding_mode='floor').tolist() -> [-4.0, -4.0, 3.0, inf, -0.0, -1.0]
    let q = f32s(&a.div_floor(&b).unwrap());
    assert_eq!(q, [-4.0, -4.0, 3.0, f32::INFINITY, -0.0, -1.0]);
    assert!(q[4].is_sign_negative());
    // torch.remainder(af, bf).tolist() -> [0.5, -0.5, -1.5, nan, -0.0, -1.0000000150474662e+30]
    let r = f32s(&a.remainder(&b).unwrap());
    assert_eq!(&r[..3], &[0.5, -0.5, -1.5]);
    assert!(r[3].is_nan());
    assert!(r[4] == 0.0 && r[4].is_sign_negative());
    assert_eq!(r[5], -1.0000000150474662e30);
}

#[test]
fn promotion_and_number_precision_match_pytorch() {
    // xb = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    let xb = Tensor::new([1.0f32, 2.0, 3.0], &cpu())
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    // [float(v) for v in (xb + 0.1)] -> [1.1015625, 2.09375, 3.09375]
    let s = xb.add(0.1).unwrap();
    assert_eq!(s.dtype(), DType::BF16);
    assert_eq!(f32s(&s), [1.1015625, 2.09375, 3.09375]);
    // [float(v) for v in (xb * 1.1)] -> [1.1015625, 2.203125, 3.296875]
    assert_eq!(f32s(&xb.mul(1.1).unwrap()), [1.1015625, 2.203125, 3.296875]);
    // (torch.tensor([250], dtype=torch.uint8) + 10).tolist() -> [4]
    let u = Tensor::new([250u8], &cpu()).unwrap().add(10).unwrap();
    assert_eq!((u.dtype(), i64s(&u)), (DType::U8, vec![4]));
    // (torch.tensor([1], dtype=torch.int32) + 2.5).dtype -> torch.float32
    assert_eq!(
        Tensor::new([1i32], &cpu())
            .unwrap()
            .add(2.5)
            .unwrap()
            .dtype(),
        DType::F32
    );
    let mixed = Tensor::new([1i32], &cpu())
        .unwrap()
        .add(&xb.narrow(0, 0, 1).unwrap())
        .unwrap();
    assert_eq!(mixed.dtype(), DType::BF16);
    assert_eq!(
        xb.to_dtype(DType::F16).unwrap().add(&xb).unwrap().dtype(),
        DType::F32
    );
    // torch.round(torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5])) -> [0., 2., 2., -0., -2.]
    let r = Tensor::new([0.5f32, 1.5, 2.5, -0.5, -1.5], &cpu())
        .unwrap()
        .round()
        .unwrap();
    assert_eq!(f32s(&r), [0.0, 2.0, 2.0, -0.0, -2.0]);
    // torch.clamp(torch.tensor([nan, -2.0, 2.0]), -1, 1) -> [nan, -1.0, 1.0]
    let c = Tensor::new([f32::NAN, -2.0, 2.0], &cpu())
        .unwrap()
        .clamp(Some(-1.0), Some(1.0))
        .unwrap();
    let c = f32s(&c);
    assert!(c[0].is_nan() && c[1] == -1.0 && c[2] == 1.0);
    // torch.maximum(torch.tensor([nan, 1.0]), torch.tensor([0.0, nan])) -> [nan, nan]
    let m = Tensor::new([f32::NAN, 1.0], &cpu())
        .unwrap()
        .maximum(&Tensor::new([0.0f32, f32::NAN], &cpu()).unwrap())
        .unwrap();
    assert!(f32s(&m).iter().all(|v| v.is_nan()));
    // torch.sign(torch.tensor([nan, -0.0, -2.0])) -> [0.0, 0.0, -1.0]
    let s = Tensor::new([f32::NAN, -0.0, -2.0], &cpu())
        .unwrap()
        .sign()
        .unwrap();
    assert_eq!(f32s(&s), [0.0, 0.0, -1.0]);
}

#[test]
fn operators_do_what_the_methods_do() {
    tpu_ops::init();
    let a = Tensor::new([[1.0f32, 2.0], [3.0, 4.0]], &cpu()).unwrap();
    let b = Tensor::new([10.0f32, 20.0], &cpu()).unwrap();
    assert_eq!(f32s(&(&a + &b).unwrap()), f32s(&a.add(&b).unwrap()));
    assert_eq!(f32s(&(&a - &b).unwrap()), [-9.0, -18.0, -7.0, -16.0]);
    assert_eq!(f32s(&(&a * 2.0).unwrap()), [2.0, 4.0, 6.0, 8.0]);
    assert_eq!(f32s(&(1.0 - &a).unwrap()), [0.0, -1.0, -2.0, -3.0]);
    assert_eq!(f32s(&(&a / &b).unwrap()), [0.1, 0.1, 0.3, 0.2]);
    assert_eq!(f32s(&(-&a).unwrap()), [-1.0, -2.0, -3.0, -4.0]);
    assert_eq!(f32s(&(&a % 3.0).unwrap()), [1.0, 2.0, 0.0, 1.0]);
    let x = Tensor::new([6i64, 3], &cpu()).unwrap();
    assert_eq!(i64s(&(&x & 5i64).unwrap()), [4, 1]);
    assert_eq!(i64s(&(&x | &x).unwrap()), [6, 3]);
    assert_eq!(i64s(&(&x ^ 1i64).unwrap()), [7, 2]);
    let chained = ((&a + 1.0).unwrap() * &b).unwrap();
    assert_eq!(f32s(&chained), [20.0, 60.0, 40.0, 100.0]);
}

#[test]
fn bad_input_is_an_error() {
    let a = Tensor::zeros([2, 3], DType::F32, &cpu()).unwrap();
    let b = Tensor::zeros([4], DType::F32, &cpu()).unwrap();
    let e = a.add(&b).unwrap_err().to_string();
    assert!(e.contains("[2, 3]") && e.contains("[4]"), "{e}");
    let flags = Tensor::zeros([2], DType::Bool, &cpu()).unwrap();
    assert!(matches!(
        flags.sub(&flags),
        Err(Error::UnsupportedDType { .. })
    ));
    let e = flags.gelu().unwrap_err().to_string();
    assert!(e.contains("gelu") && e.contains("bool"), "{e}");
    assert!(a.bitwise_and(&a).is_err());
    let ints = Tensor::new([2i64], &cpu()).unwrap();
    let e = ints.pow_scalar(-1).unwrap_err().to_string();
    assert!(e.contains("negative integer powers"), "{e}");
    let other = Device::new_cpu(&Default::default()).unwrap();
    let c = Tensor::zeros([2, 3], DType::F32, &other).unwrap();
    let e = a.add(&c).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains("cpu") && e.to_string().contains("cpu:"),
        "{e}"
    );
    let cond = Tensor::zeros([2, 3], DType::F32, &cpu()).unwrap();
    assert!(tpu_ops::where_(&cond, &a, &a).is_err());
}

#[test]
fn large_tensors_use_the_pool_and_agree() {
    let n = 1 << 17;
    let mut g = Generator::new(1);
    let x = g.randn([n], DType::F32, &cpu()).unwrap();
    let y = g.randn([n], DType::F32, &cpu()).unwrap();
    let s = x.add(&y).unwrap().to_vec::<f32>().unwrap();
    let (xv, yv) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
    assert!(
        s.iter()
            .zip(xv.iter().zip(&yv))
            .all(|(s, (a, b))| *s == a + b)
    );
    // A large strided view (transposed) goes through the same pool path.
    let m = x.reshape([256, 512]).unwrap().t().unwrap();
    let e = m.exp().unwrap().to_vec::<f32>().unwrap();
    let mv = m.to_vec::<f32>().unwrap();
    // exp is within 1 ulp of libm (see tpu_ops::cpu::math).
    assert!(
        e.iter()
            .zip(&mv)
            .all(|(e, v)| (e - v.exp()).abs() <= v.exp() * 1.2e-7)
    );
}

fn unary_ref(name: &str, x: f64) -> f64 {
    match name {
        "neg" => -x,
        "abs" => x.abs(),
        "exp" => x.exp(),
        "tanh" => x.tanh(),
        "sigmoid" => 1.0 / (1.0 + (-x).exp()),
        "silu" => x / (1.0 + (-x).exp()),
        "gelu" => 0.5 * x * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2),
        "gelu_tanh" => {
            x / (1.0 + (-2.0 * 0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).exp())
        }
        "erf" => libm::erf(x),
        "relu" => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        "square" => x * x,
        "floor" => x.floor(),
        _ => x.sin(),
    }
}

fn apply_unary(name: &str, t: &Tensor) -> tpu_tensor::Result<Tensor> {
    match name {
        "neg" => t.neg(),
        "abs" => t.abs(),
        "exp" => t.exp(),
        "tanh" => t.tanh(),
        "sigmoid" => t.sigmoid(),
        "silu" => t.silu(),
        "gelu" => t.gelu(),
        "gelu_tanh" => t.gelu_tanh(),
        "erf" => t.erf(),
        "relu" => t.relu(),
        "square" => t.square(),
        "floor" => t.floor(),
        _ => t.sin(),
    }
}

fn view_of(t: &Tensor, choice: u8) -> Tensor {
    match (choice % 3, t.rank()) {
        (1, r) if r >= 2 => t.transpose(0, r - 1).unwrap(),
        (2, r) if r >= 1 && t.shape()[0] > 1 => t.slice(0, 0.., 2).unwrap(),
        _ => t.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn unary_matches_reference(
        shape in proptest::collection::vec(0usize..6, 0..4),
        op in prop::sample::select(vec!["neg", "abs", "exp", "tanh", "sigmoid", "silu", "gelu", "gelu_tanh", "erf", "relu", "square", "floor", "sin"]),
        dtype in prop::sample::select(vec![DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64]),
        view in 0u8..3,
        seed in 0u64..1000,
    ) {
        let float_only = matches!(op, "exp" | "tanh" | "sigmoid" | "erf" | "sin");
        // silu and gelu are defined on float tensors only.
        if matches!(op, "silu" | "gelu" | "gelu_tanh") && !dtype.is_float() {
            return Ok(());
        }
        let base = Generator::new(seed).randn(&shape, DType::F64, &cpu()).unwrap();
        let base = (&base * 3.0).unwrap().round().unwrap();
        let x = view_of(&base.to_dtype(dtype).unwrap(), view);
        let got = apply_unary(op, &x).unwrap();
        let want_dtype = if float_only && !dtype.is_float() { DType::F32 } else { dtype };
        prop_assert_eq!(got.dtype(), want_dtype);
        prop_assert_eq!(got.shape(), x.shape());
        let xs = x.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        let gs = got.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        let tol = match want_dtype { DType::BF16 => 1e-2, DType::F16 => 1e-3, DType::F32 => 1e-6, _ => 1e-12 };
        for (x, g) in xs.iter().zip(&gs) {
            let w = unary_ref(op, *x);
            prop_assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{op}({x}) = {g}, want {w}");
        }
    }

    #[test]
    fn binary_matches_reference_with_broadcasting(
        a_shape in proptest::collection::vec(1usize..5, 0..4),
        drop in proptest::collection::vec(any::<bool>(), 4),
        op in 0usize..6,
        dtype in prop::sample::select(vec![DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64, DType::U8]),
        view in 0u8..3,
        seed in 0u64..1000,
    ) {
        // b's shape: a suffix of a's with some dims set to 1 (broadcast).
        let b_shape: Vec<usize> = a_shape.iter().enumerate().skip(a_shape.len() / 2)
            .map(|(i, &d)| if drop[i % 4] { 1 } else { d }).collect();
        let mut g = Generator::new(seed);
        let unsigned = dtype == DType::U8;
        let a = g.randint(if unsigned { 0 } else { -20 }, 20, &a_shape, DType::I64, &cpu()).unwrap();
        let b = g.randint(1, 9, &b_shape, DType::I64, &cpu()).unwrap();
        // Divisors of both signs (never zero) for signed dtypes.
        let sign = g.randint(0, 2, &b_shape, DType::I64, &cpu()).unwrap();
        let b = if unsigned { b } else { b.mul(&sign.mul(2).unwrap().sub(1).unwrap()).unwrap() };
        let (a, b) = (a.to_dtype(dtype).unwrap(), b.to_dtype(dtype).unwrap());
        let a = view_of(&a, view);
        let a = if a.shape() != a_shape.as_slice() { a.contiguous().unwrap().reshape(&a_shape).unwrap_or(a) } else { a };
        let a = if a.shape() == a_shape.as_slice() { a } else { return Ok(()) };
        let (name, got) = match op {
            0 => ("add", a.add(&b).unwrap()),
            1 => ("mul", a.mul(&b).unwrap()),
            2 => ("maximum", a.maximum(&b).unwrap()),
            3 => ("lt", a.lt(&b).unwrap()),
            4 => ("floor_divide", a.div_floor(&b).unwrap()),
            _ => ("remainder", a.remainder(&b).unwrap()),
        };
        let out_shape = tpu_tensor::shape::broadcast_shapes("t", &a_shape, &b_shape).unwrap();
        prop_assert_eq!(got.shape(), &out_shape[..]);
        let ae = a.broadcast_to(&out_shape).unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        let be = b.broadcast_to(&out_shape).unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        let gs = got.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        for i in 0..gs.len() {
            let (x, y) = (ae[i], be[i]);
            let mut w = match name {
                "add" => x + y,
                "mul" => x * y,
                "maximum" => x.max(y),
                "lt" => (x < y) as u8 as f64,
                "floor_divide" => (x / y).floor(),
                _ => x - (x / y).floor() * y,
            };
            if dtype == DType::U8 && name != "lt" { w = (w as i64 as u8) as f64; }
            if dtype == DType::BF16 { w = bf16::from_f64(w).to_f64(); }
            prop_assert!((gs[i] - w).abs() <= 1e-9 * (1.0 + w.abs()), "{name}({x}, {y}) = {}, want {w}", gs[i]);
        }
    }
}

/// Distance in units in the last place between two f32 values.
fn ulps(a: f32, b: f32) -> u32 {
    if a == b || (a.is_nan() && b.is_nan()) {
        return 0;
    }
    let key = |v: f32| {
        let bits = v.to_bits() as i32;
        if bits < 0 { i32::MIN - bits } else { bits }
    };
    (key(a) as i64 - key(b) as i64).unsigned_abs() as u32
}

/// The vectorised transcendentals, each with its exact value in f64.
const TRANSCENDENTALS: [&str; 7] = ["exp", "tanh", "sigmoid", "silu", "gelu", "gelu_tanh", "erf"];

/// Sizes that leave every tail length of 4-, 8- and 16-lane loops, and one that goes to the pool.
const SIZES: [usize; 8] = [1, 7, 17, 63, 65, 257, 1000, 40_000];

#[test]
fn transcendentals_are_within_two_ulp_at_every_level() {
    use tpu_ops::cpu::isa::{Level, with_level};
    for (k, &n) in SIZES.iter().enumerate() {
        let mut g = Generator::new(k as u64);
        // Normal values scaled to reach the tails of every function (exp's overflow too).
        let scale = [1.0, 4.0, 30.0, 100.0][k % 4];
        let x = g
            .randn([n], DType::F32, &cpu())
            .unwrap()
            .mul(scale)
            .unwrap();
        let xs = x.to_vec::<f32>().unwrap();
        for op in TRANSCENDENTALS {
            let fast = apply_unary(op, &x).unwrap().to_vec::<f32>().unwrap();
            let portable = with_level(Level::Portable, || apply_unary(op, &x))
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            for i in 0..n {
                let want = unary_ref(op, xs[i] as f64) as f32;
                // exp flushes results below f32's normal range to zero (see tpu_ops::cpu::math).
                let flushed = op == "exp" && want.abs() < f32::MIN_POSITIVE;
                let e = ulps(fast[i], want);
                assert!(
                    flushed || e <= 2,
                    "{op}({:e}) = {:e}, want {want:e} ({e} ulp)",
                    xs[i],
                    fast[i]
                );
                // Plain multiply-adds, or fused ones (correctly rounded in software where the
                // processor lacks them): every level rounds alike.
                assert_eq!(
                    fast[i].to_bits(),
                    portable[i].to_bits(),
                    "{op}({:e}): levels differ",
                    xs[i]
                );
            }
        }
    }
}

#[test]
fn transcendentals_of_strided_and_16_bit_inputs() {
    // Transposed and sliced views take the walk path; bf16 and f16 round the f32 result once.
    let base = Generator::new(3)
        .randn([33, 17], DType::F32, &cpu())
        .unwrap()
        .mul(3.0)
        .unwrap();
    for view in [base.t().unwrap(), base.slice(1, 1.., 3).unwrap()] {
        let dense = view.contiguous().unwrap();
        for op in TRANSCENDENTALS {
            let got = apply_unary(op, &view).unwrap().to_vec::<f32>().unwrap();
            let want = apply_unary(op, &dense).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(got, want, "{op} of a view");
            for dtype in [DType::BF16, DType::F16] {
                let low = view.to_dtype(dtype).unwrap();
                let got = apply_unary(op, &low).unwrap();
                assert_eq!(got.dtype(), dtype);
                let got = got.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
                let xs = low.to_dtype(DType::F32).unwrap();
                let want = apply_unary(op, &xs).unwrap().to_dtype(dtype).unwrap();
                let want = want.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
                assert_eq!(got, want, "{op} in {dtype}");
            }
        }
    }
}

#[test]
fn small_dense_fast_path_keeps_semantics() {
    let a = Tensor::new([1.5f32, -2.0, f32::NAN, 4.0], &cpu()).unwrap();
    let b = Tensor::new([0.5f32, 3.0, 1.0, -0.0], &cpu()).unwrap();
    assert_eq!(f32s(&a.add(&b).unwrap())[..2], [2.0, 1.0]);
    assert!(f32s(&a.maximum(&b).unwrap())[2].is_nan());
    assert_eq!(f32s(&a.div(&b).unwrap())[3], f32::NEG_INFINITY);
    // Both operands one storage.
    assert_eq!(f32s(&b.mul(&b).unwrap()), [0.25, 9.0, 1.0, 0.0]);
    // Gradients are still recorded.
    let x = a.requires_grad_(true).unwrap();
    let y = x.mul(&b).unwrap();
    assert!(y.requires_grad());
    y.sum(&[0], false).unwrap().backward().unwrap();
    assert_eq!(f32s(&x.grad().unwrap()), [0.5, 3.0, 1.0, -0.0]);
    // Mismatched shapes broadcast or fail exactly as before.
    let c = Tensor::new([[1.0f32], [2.0]], &cpu()).unwrap();
    assert_eq!(a.add(&c).unwrap().shape(), [2, 4]);
    let d = Tensor::new([1.0f32, 2.0, 3.0], &cpu()).unwrap();
    assert!(a.add(&d).is_err());
    // f32 with f64 still promotes.
    let e = Tensor::new([1.0f64, 2.0, 3.0, 4.0], &cpu()).unwrap();
    assert_eq!(b.add(&e).unwrap().dtype(), DType::F64);
}

#[test]
fn small_dense_fast_paths_give_the_general_paths_bits() {
    use crate::common::same_as_general;
    use tpu_ops::ops::elementwise::binary::{BinaryKind, binary, binary_scalar, scalar_binary};
    use tpu_ops::ops::elementwise::unary::{UnaryKind, unary};
    use tpu_tensor::Scalar;
    let mut g = Generator::new(5);
    for n in [1, 4, 7, 33] {
        let x = g.randn([n], DType::F32, &cpu()).unwrap().mul(3.0).unwrap();
        let y = g.randn([n], DType::F32, &cpu()).unwrap();
        // Every unary kind, on values of both signs and on positive ones (the logarithms' and
        // roots' domain).
        for input in [x.clone(), x.abs().unwrap().add(0.25).unwrap()] {
            for kind in UnaryKind::all() {
                same_as_general(&format!("{kind:?} of {n}"), || unary(&input, kind));
            }
        }
        let numbers = [
            Scalar::Float(0.1),
            Scalar::Float(-2.5),
            Scalar::Float(1e300),
            Scalar::Int(3),
            Scalar::Int(16_777_217),
            Scalar::Bool(true),
        ];
        for kind in [
            BinaryKind::Add,
            BinaryKind::Sub,
            BinaryKind::Mul,
            BinaryKind::Div,
            BinaryKind::Maximum,
            BinaryKind::Minimum,
            BinaryKind::Eq,
            BinaryKind::Ne,
            BinaryKind::Lt,
            BinaryKind::Le,
            BinaryKind::Gt,
            BinaryKind::Ge,
        ] {
            same_as_general(&format!("{kind:?} of {n}"), || binary(&x, &y, kind));
            same_as_general(&format!("{kind:?} of x and x"), || binary(&x, &x, kind));
            for v in numbers {
                same_as_general(&format!("x {kind:?} {v:?}"), || binary_scalar(&x, v, kind));
                same_as_general(&format!("{v:?} {kind:?} x"), || scalar_binary(v, &x, kind));
            }
        }
    }
    // The fast paths leave what they do not cover to the general path: other dtypes, views,
    // gradients.
    let x = Tensor::new([1.0f32, -2.0, 3.0, 4.0], &cpu()).unwrap();
    assert_eq!(
        x.add(1.5).unwrap().to_vec::<f32>().unwrap(),
        [2.5, -0.5, 4.5, 5.5]
    );
    assert_eq!(
        x.to_dtype(DType::F64).unwrap().add(1).unwrap().dtype(),
        DType::F64
    );
    assert_eq!(
        x.to_dtype(DType::I32).unwrap().mul(2.5).unwrap().dtype(),
        DType::F32
    );
    let col = Tensor::new([[1.0f32, 2.0], [3.0, 4.0]], &cpu())
        .unwrap()
        .t()
        .unwrap();
    assert_eq!(col.exp().unwrap().to_vec::<f32>().unwrap()[1], 3.0f32.exp());
    let w = x.requires_grad_(true).unwrap();
    let y = w.mul(2.0).unwrap().exp().unwrap();
    assert!(y.requires_grad());
    y.sum(&[0], false).unwrap().backward().unwrap();
    let want: Vec<f32> = [1.0f32, -2.0, 3.0, 4.0]
        .iter()
        .map(|v| 2.0 * (2.0 * v).exp())
        .collect();
    assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), want);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]

    #[test]
    fn dense_binary_matches_reference_at_every_level(
        n in prop::sample::select(SIZES.to_vec()),
        op in 0usize..6,
        offset in 0usize..3,
        portable in any::<bool>(),
        seed in 0u64..1000,
    ) {
        use tpu_ops::cpu::isa::{Level, with_level};
        let mut g = Generator::new(seed);
        // Views at an offset into their storage, as slices of a longer tensor.
        let a = g.randn([n + offset], DType::F32, &cpu()).unwrap().slice(0, offset as i64.., 1).unwrap();
        let b = g.randn([n], DType::F32, &cpu()).unwrap();
        let run = || match op {
            0 => a.add(&b),
            1 => a.sub(&b),
            2 => a.mul(&b),
            3 => a.div(&b),
            4 => a.maximum(&b),
            _ => a.minimum(&b),
        };
        let got = if portable { with_level(Level::Portable, run) } else { run() }.unwrap();
        let (av, bv, gv) = (f32s(&a), f32s(&b), f32s(&got));
        for i in 0..n {
            let (x, y) = (av[i], bv[i]);
            let want = [x + y, x - y, x * y, x / y, x.max(y), x.min(y)][op];
            prop_assert_eq!(gv[i].to_bits(), want.to_bits(), "op {} at {}", op, i);
        }
    }
}

fn devices() -> Vec<Device> {
    tpu_ops::testing::devices("elementwise")
}

/// dtype and values (as f64) of a result, read back to the host.
fn typed(t: &Tensor) -> (DType, Vec<f64>) {
    let v = t
        .to_device(&cpu())
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    (t.dtype(), v)
}

test_device!(
    /// clamp and pow with a number promote a bool tensor as PyTorch does (pow of bool by bool
    /// stays bool: a copy for true, ones for false), and refuse what it refuses:
    ///
    /// ```python
    /// b = torch.tensor([True, False])
    /// b.clamp(min=0.5)              # tensor([1.0000, 0.5000]) float32
    /// b.clamp(max=0.5)              # tensor([0.5000, 0.0000]) float32
    /// b.clamp(min=0.5, max=0.7)     # tensor([0.7000, 0.5000]) float32
    /// b.clamp(max=-2.5)             # tensor([-2.5000, -2.5000]) float32
    /// b.clamp(min=0)                # tensor([1, 0]) int64
    /// b.clamp(min=1, max=0)         # tensor([0, 0]) int64
    /// b.clamp(min=True)             # NotImplementedError: "clamp_min_scalar_cpu" not implemented for 'Bool'
    /// b.pow(2), b.pow(0)            # tensor([1, 0]), tensor([1, 1]) int64
    /// b.pow(0.5), b.pow(-0.5)       # tensor([1., 0.]), tensor([1., inf]) float32
    /// b.pow(True), b.pow(False)     # tensor([True, False]), tensor([True, True])
    /// b.pow(-2)                     # RuntimeError: Integers to negative integer powers are not allowed.
    /// torch.pow(2, b)               # tensor([2, 1]) int64
    /// ```
    clamp_and_pow_of_bool_promote_like_pytorch,
    |dev| {
        use tpu_ops::ops::elementwise::unary::{UnaryKind, unary};
        use tpu_tensor::Scalar;
        let clamp = |t: &Tensor, lo: Option<Scalar>, hi: Option<Scalar>| {
            unary(t, UnaryKind::Clamp { min: lo, max: hi })
        };
        let (i, f) = (Scalar::Int, Scalar::Float);
        let b = Tensor::new([true, false], &cpu())
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let cases: Vec<(Tensor, DType, Vec<f64>)> = vec![
            (
                b.clamp(Some(0.5), None).unwrap(),
                DType::F32,
                vec![1.0, 0.5],
            ),
            (
                b.clamp(None, Some(0.5)).unwrap(),
                DType::F32,
                vec![0.5, 0.0],
            ),
            (
                clamp(&b, Some(f(0.5)), Some(f(0.7))).unwrap(),
                DType::F32,
                vec![0.699999988079071, 0.5],
            ),
            (
                b.clamp(None, Some(-2.5)).unwrap(),
                DType::F32,
                vec![-2.5, -2.5],
            ),
            (
                clamp(&b, Some(i(0)), None).unwrap(),
                DType::I64,
                vec![1.0, 0.0],
            ),
            (
                clamp(&b, Some(i(1)), Some(i(0))).unwrap(),
                DType::I64,
                vec![0.0, 0.0],
            ),
            (b.pow_scalar(2).unwrap(), DType::I64, vec![1.0, 0.0]),
            (b.pow_scalar(0).unwrap(), DType::I64, vec![1.0, 1.0]),
            (b.pow_scalar(0.5).unwrap(), DType::F32, vec![1.0, 0.0]),
            (
                b.pow_scalar(-0.5).unwrap(),
                DType::F32,
                vec![1.0, f64::INFINITY],
            ),
            (b.pow_scalar(true).unwrap(), DType::Bool, vec![1.0, 0.0]),
            (b.pow_scalar(false).unwrap(), DType::Bool, vec![1.0, 1.0]),
            (b.rpow(2).unwrap(), DType::I64, vec![2.0, 1.0]),
        ];
        for (k, (t, dtype, want)) in cases.iter().enumerate() {
            assert_eq!(typed(t), (*dtype, want.clone()), "case {k} on {dev:?}");
        }
        let e = clamp(&b, Some(Scalar::Bool(true)), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("clamp") && e.contains("bool"), "{e}");
        let e = b.pow_scalar(-2).unwrap_err().to_string();
        assert!(e.contains("negative integer powers"), "{e}");
        assert!(b.pow(&b).is_err(), "pow of two bool tensors");
    }
);

test_device!(
    /// Subtraction with any bool operand and negation of a bool tensor are refused, as PyTorch
    /// refuses them (whatever the other operand, tensor or number), with its advice:
    ///
    /// ```python
    /// b, i = torch.tensor([True, False]), torch.tensor([1, 2], dtype=torch.int32)
    /// b - i, i - b, b - 1, 1 - b, b - 1.5, i - True, torch.tensor([1.5]) - True
    /// # Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to
    /// # invert a mask, use the `~` or `logical_not()` operator instead.
    /// b - b     # ... with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead.
    /// -b        # Negation, the `-` operator, on a bool tensor is not supported. ... `logical_not()` ...
    /// ```
    subtraction_and_negation_of_bool_are_refused_like_pytorch,
    |dev| {
        let on = |t: Tensor| t.to_device(&dev).unwrap();
        let b = on(Tensor::new([true, false], &cpu()).unwrap());
        let i = on(Tensor::new([1i32, 2], &cpu()).unwrap());
        let f = on(Tensor::new([1.5f32], &cpu()).unwrap());
        let refused = [
            b.sub(&i),
            i.sub(&b),
            b.sub(1),
            b.rsub(1),
            b.sub(1.5),
            i.sub(true),
            f.sub(true),
            i.rsub(true),
        ];
        for (k, r) in refused.into_iter().enumerate() {
            let e = r.unwrap_err();
            assert!(matches!(e, Error::UnsupportedDType { .. }), "case {k}: {e}");
            let e = e.to_string();
            assert!(
                e.contains("sub") && e.contains("bool") && e.contains("logical_not()"),
                "case {k}: {e}"
            );
        }
        let e = b.sub(&b).unwrap_err().to_string();
        assert!(e.contains("logical_xor()"), "{e}");
        for e in [b.neg().unwrap_err(), (-&b).unwrap_err()] {
            let e = e.to_string();
            assert!(
                e.contains("neg") && e.contains("bool") && e.contains("logical_not()"),
                "{e}"
            );
        }
        // Addition and multiplication of bool stay allowed.
        assert_eq!(typed(&b.add(&b).unwrap()), (DType::Bool, vec![1.0, 0.0]));
        assert_eq!(typed(&b.mul(2).unwrap()), (DType::I64, vec![2.0, 0.0]));
    }
);

// ---- on every device: the CPU, and XLA through the PJRT CPU plugin when it loads ---------------

/// `v` as `dtype` on `dev`.
fn on(dev: &Device, v: &[f64], dtype: DType) -> Tensor {
    Tensor::from_slice(v, [v.len()], &cpu())
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

fn f64s_of(t: &Tensor) -> Vec<f64> {
    tpu_ops::testing::host_f64(t).unwrap()
}

/// Exactly `want`, NaN matching NaN.
fn exactly(what: &str, got: &Tensor, want: &[f64]) {
    let g = f64s_of(got);
    let ok = g.len() == want.len()
        && g.iter()
            .zip(want)
            .all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
    assert!(ok, "{what}: got {g:?}, want {want:?}");
}

test_device!(nan_propagates_from_either_operand_on_every_device, |dev| {
    const NAN: f64 = f64::NAN;
    const INF: f64 = f64::INFINITY;
    // a = torch.tensor([nan, 1., -inf, inf, 2., nan, -3.])
    // b = torch.tensor([1., nan, nan, 5., -inf, nan, inf])
    let a = [NAN, 1., -INF, INF, 2., NAN, -3.];
    let b = [1., NAN, NAN, 5., -INF, NAN, INF];
    // torch.tensor([nan, 1.]).maximum(torch.tensor([1., nan])) -> [nan, nan]
    let m = on(&dev, &[NAN, 1.], DType::F32)
        .maximum(&on(&dev, &[1., NAN], DType::F32))
        .unwrap();
    exactly(&format!("the report on {dev}"), &m, &[NAN, NAN]);
    for dt in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        let (x, y) = (on(&dev, &a, dt), on(&dev, &b, dt));
        let what = |op: &str| format!("{op} {dt} on {dev}");
        // torch.maximum(a.to(dt), b.to(dt)) -> [nan, nan, nan, inf, 2.0, nan, inf]
        let r = x.maximum(&y).unwrap();
        assert_eq!(r.dtype(), dt);
        exactly(&what("maximum"), &r, &[NAN, NAN, NAN, INF, 2., NAN, INF]);
        // torch.minimum(a.to(dt), b.to(dt)) -> [nan, nan, nan, 5.0, -inf, nan, -3.0]
        let r = x.minimum(&y).unwrap();
        exactly(&what("minimum"), &r, &[NAN, NAN, NAN, 5., -INF, NAN, -3.]);
        // torch.clamp(a, min=-1., max=1.5) -> [nan, 1.0, -1.0, 1.5, 1.5, nan, -1.0]
        let r = x.clamp(Some(-1.0), Some(1.5)).unwrap();
        exactly(&what("clamp"), &r, &[NAN, 1., -1., 1.5, 1.5, NAN, -1.]);
        // torch.clamp(a, min=0.5) -> [nan, 1.0, 0.5, inf, 2.0, nan, 0.5]
        let r = x.clamp(Some(0.5), None).unwrap();
        exactly(&what("clamp min"), &r, &[NAN, 1., 0.5, INF, 2., NAN, 0.5]);
        // torch.clamp(a, max=0.5) -> [nan, 0.5, -inf, 0.5, 0.5, nan, -3.0]
        let r = x.clamp(None, Some(0.5)).unwrap();
        exactly(
            &what("clamp max"),
            &r,
            &[NAN, 0.5, -INF, 0.5, 0.5, NAN, -3.],
        );
        // torch.clamp(a, min=nan, max=1.) and torch.clamp(a, min=-1., max=nan) -> [nan] * 7
        let r = x.clamp(Some(NAN), Some(1.0)).unwrap();
        exactly(&what("clamp to a NaN min"), &r, &[NAN; 7]);
        let r = x.clamp(Some(-1.0), Some(NAN)).unwrap();
        exactly(&what("clamp to a NaN max"), &r, &[NAN; 7]);
    }
    // torch.maximum(a, torch.tensor(nan)) -> [nan] * 7; the same for minimum
    let x = on(&dev, &a, DType::F32);
    exactly("maximum with NaN", &x.maximum(NAN).unwrap(), &[NAN; 7]);
    exactly("minimum with NaN", &x.minimum(NAN).unwrap(), &[NAN; 7]);
});

test_device!(
    integer_division_by_zero_is_an_error_on_every_device,
    |dev| {
        let msg = |r: tpu_tensor::Result<Tensor>| match r {
            Ok(t) => panic!("expected an error, got {:?}", f64s_of(&t)),
            Err(e) => {
                assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
                e.to_string()
            }
        };
        let i = |v: &[f64], dt: DType| on(&dev, v, dt);
        // torch.tensor([7, -7]) // torch.tensor([0, 2]) -> RuntimeError: ZeroDivisionError
        let e = msg(i(&[7., -7.], DType::I64).div_floor(&i(&[0., 2.], DType::I64)));
        assert_eq!(
            e,
            "floor_divide: integer division by zero (divisor of dtype i64)"
        );
        // torch.div(torch.tensor([7]), 0, rounding_mode='trunc') -> ZeroDivisionError
        let e = msg(i(&[7.], DType::I64).div_trunc(0));
        assert!(e.starts_with("div_trunc: integer division by zero"), "{e}");
        // torch.remainder(torch.tensor([7, 3], dtype=torch.int32),
        //                 torch.tensor([1, 0], dtype=torch.int32)) -> ZeroDivisionError
        let e = msg(i(&[7., 3.], DType::I32).remainder(&i(&[1., 0.], DType::I32)));
        assert!(e.contains("remainder") && e.contains("dtype i32"), "{e}");
        // torch.remainder(torch.tensor([7, 3], dtype=torch.uint8), 0) -> ZeroDivisionError
        let e = msg(i(&[7., 3.], DType::U8).remainder(0));
        assert!(e.contains("dtype u8"), "{e}");
        // i8 divisors broadcast over rows.
        let m = i(&[7., 3., 5., 6.], DType::I8).reshape([2, 2]).unwrap();
        msg(m.div_floor(&i(&[2., 0.], DType::I8)));

        // torch.zeros(0, dtype=torch.int64) // 0 -> tensor([], dtype=torch.int64)
        let r = i(&[], DType::I64).div_floor(0).unwrap();
        assert_eq!(r.shape(), &[0]);
        // torch.zeros(0, 1, dtype=torch.int64) // torch.tensor([0]) -> shape (0, 1)
        let e0 = Tensor::zeros([0, 1], DType::I64, &dev).unwrap();
        let r = e0.div_trunc(&i(&[0.], DType::I64)).unwrap();
        assert_eq!(r.shape(), &[0, 1]);
        // torch.tensor([7.]) // 0 -> tensor([inf])
        exactly(
            "float",
            &i(&[7.], DType::F32).div_floor(0).unwrap(),
            &[f64::INFINITY],
        );
        // a = torch.tensor([7, -7, 7, -7]); b = torch.tensor([2, 2, -2, -2])
        // a // b -> [3, -4, -4, 3]; torch.remainder(a, b) -> [1, 1, -1, -1];
        // torch.div(a, b, rounding_mode='trunc') -> [3, -3, -3, 3]
        let (a, b) = (
            i(&[7., -7., 7., -7.], DType::I64),
            i(&[2., 2., -2., -2.], DType::I64),
        );
        exactly("floor", &a.div_floor(&b).unwrap(), &[3., -4., -4., 3.]);
        exactly("remainder", &a.remainder(&b).unwrap(), &[1., 1., -1., -1.]);
        exactly("trunc", &a.div_trunc(&b).unwrap(), &[3., -3., -3., 3.]);
    }
);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(48)))]

    /// Integer divisors with some zeros: every device fails with the CPU's error, or agrees with
    /// it exactly.
    #[test]
    fn integer_division_agrees_on_every_device(
        a in prop::collection::vec(-20i64..20, 1..5),
        b in prop::collection::vec(-3i64..3, 1..5),
        kind in 0usize..3,
        dt in 0usize..4,
    ) {
        let dt = [DType::I64, DType::I32, DType::I8, DType::U8][dt];
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let fa: Vec<f64> = a.iter().map(|&v| if dt == DType::U8 { v.abs() } else { v } as f64).collect();
        let fb: Vec<f64> = b.iter().map(|&v| if dt == DType::U8 { v.abs() } else { v } as f64).collect();
        let run = |dev: &Device| {
            let (x, y) = (on(dev, &fa, dt), on(dev, &fb, dt));
            match kind {
                0 => x.div_floor(&y),
                1 => x.div_trunc(&y),
                _ => x.remainder(&y),
            }
        };
        let want = run(&cpu());
        prop_assert_eq!(want.is_err(), fb.contains(&0.0));
        for dev in devices().iter().skip(1) {
            match (&want, run(dev)) {
                (Ok(w), Ok(g)) => prop_assert_eq!(f64s_of(w), f64s_of(&g)),
                (Err(w), Err(g)) => prop_assert_eq!(w.to_string(), g.to_string()),
                (w, g) => prop_assert!(false, "cpu {:?}, {} {:?}", w.is_ok(), dev, g.is_ok()),
            }
        }
    }
}

test_device!(
    /// The inverse trigonometric and hyperbolic functions and `log10` at PyTorch's values,
    /// edges of their domains included (NaN outside, ±inf at the poles, signed zeros):
    ///
    /// ```python
    /// x = torch.tensor([-1.5, -1.0, -0.5, -0.0, 0.0, 0.3, 1.0, 2.0, float('inf'), float('nan')])
    /// [float(v) for v in torch.asin(x)]   # and acos, atan, sinh, cosh, asinh, acosh, atanh, log10
    /// xh = torch.tensor([0.5, -2.0, 3.0], dtype=torch.bfloat16)
    /// [float(v) for v in torch.sinh(xh)]  # and atan, cosh, asinh, log10: bfloat16 results
    /// torch.asin(torch.tensor([0, 1]))    # float32 [0.0, 1.5707963705062866]
    /// ```
    inverse_trig_hyperbolic_and_log10_match_pytorch,
    |dev| {
        let (nan, inf) = (f32::NAN, f32::INFINITY);
        let x = Tensor::from_vec(
            vec![-1.5f32, -1.0, -0.5, -0.0, 0.0, 0.3, 1.0, 2.0, inf, nan],
            [10],
            &cpu(),
        )
        .unwrap()
        .to_device(&dev)
        .unwrap();
        type F = fn(&Tensor) -> tpu_tensor::Result<Tensor>;
        let cases: [(&str, F, [f32; 10]); 9] = [
            ("asin", |t| t.asin(), [nan, -1.5707963705062866, -0.5235987901687622, -0.0, 0.0, 0.30469265580177307, 1.5707963705062866, nan, nan, nan]),
            ("acos", |t| t.acos(), [nan, 3.1415927410125732, 2.094395160675049, 1.5707963705062866, 1.5707963705062866, 1.2661036252975464, 0.0, nan, nan, nan]),
            ("atan", |t| t.atan(), [-0.9827936887741089, -0.7853981852531433, -0.46364760398864746, -0.0, 0.0, 0.29145681858062744, 0.7853981852531433, 1.1071487665176392, 1.5707963705062866, nan]),
            ("sinh", |t| t.sinh(), [-2.129279375076294, -1.175201177597046, -0.5210952758789062, -0.0, 0.0, 0.30452030897140503, 1.175201177597046, 3.6268603801727295, inf, nan]),
            ("cosh", |t| t.cosh(), [2.352409601211548, 1.5430805683135986, 1.1276259422302246, 1.0, 1.0, 1.04533851146698, 1.5430805683135986, 3.7621958255767822, inf, nan]),
            ("asinh", |t| t.asinh(), [-1.19476318359375, -0.8813735842704773, -0.4812118411064148, -0.0, 0.0, 0.29567307233810425, 0.8813735842704773, 1.4436354637145996, inf, nan]),
            ("acosh", |t| t.acosh(), [nan, nan, nan, nan, nan, nan, 0.0, 1.316957950592041, inf, nan]),
            ("atanh", |t| t.atanh(), [nan, -inf, -0.5493061542510986, -0.0, 0.0, 0.30951961874961853, inf, nan, nan, nan]),
            ("log10", |t| t.log10(), [nan, nan, nan, -inf, -inf, -0.5228787064552307, 0.0, 0.3010300099849701, inf, nan]),
        ];
        for (name, f, want) in cases {
            let got = f(&x).unwrap();
            assert_eq!(got.dtype(), DType::F32, "{name}");
            let got = f32s(&got);
            close(&format!("{name} on {dev}"), &got, &want, 2e-7);
            // Signed zeros and infinities exactly.
            for (g, w) in got.iter().zip(&want) {
                if *w == 0.0 || w.is_infinite() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{name} on {dev}: {g} for {w}");
                }
            }
        }
        let xh = Tensor::from_vec(vec![0.5f32, -2.0, 3.0], [3], &cpu())
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let half: [(&str, F, [f32; 3]); 5] = [
            ("atan", |t| t.atan(), [0.462890625, -1.109375, 1.25]),
            ("sinh", |t| t.sinh(), [0.51953125, -3.625, 10.0]),
            ("cosh", |t| t.cosh(), [1.125, 3.765625, 10.0625]),
            ("asinh", |t| t.asinh(), [0.48046875, -1.4453125, 1.8203125]),
            ("log10", |t| t.log10(), [-0.30078125, nan, 0.4765625]),
        ];
        for (name, f, want) in half {
            let got = f(&xh).unwrap();
            assert_eq!(got.dtype(), DType::BF16, "{name}");
            close(&format!("bf16 {name} on {dev}"), &f32s(&got), &want, 0.0);
        }
        let ints = Tensor::from_vec(vec![0i64, 1], [2], &cpu())
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let got = ints.asin().unwrap();
        assert_eq!(got.dtype(), DType::F32);
        close("asin of integers", &f32s(&got), &[0.0, 1.5707963705062866], 0.0);
    }
);

test_device!(
    /// `leaky_relu` and `elu` at PyTorch's values, with ATen's `elu(x, alpha, scale,
    /// input_scale)` through the kind:
    ///
    /// ```python
    /// x = torch.tensor([-3.0, -1.0, -0.5, -0.0, 0.0, 0.5, 2.0, -inf, inf, nan])
    /// F.leaky_relu(x); F.leaky_relu(x, 0.2); F.elu(x); F.elu(x, 0.5)
    /// torch.ops.aten.elu(x, 1.5, 2.0, 0.5)
    /// ```
    leaky_relu_and_elu_match_pytorch,
    |dev| {
        use tpu_ops::ops::elementwise::unary::{UnaryKind, unary};
        let (nan, inf) = (f32::NAN, f32::INFINITY);
        let x = Tensor::from_vec(
            vec![-3.0f32, -1.0, -0.5, -0.0, 0.0, 0.5, 2.0, -inf, inf, nan],
            [10],
            &cpu(),
        )
        .unwrap()
        .to_device(&dev)
        .unwrap();
        let cases: [(&str, tpu_tensor::Result<Tensor>, [f32; 10]); 5] = [
            ("leaky_relu", x.leaky_relu(0.01), [-0.029999999329447746, -0.009999999776482582, -0.004999999888241291, -0.0, 0.0, 0.5, 2.0, -inf, inf, nan]),
            ("leaky_relu 0.2", x.leaky_relu(0.2), [-0.6000000238418579, -0.20000000298023224, -0.10000000149011612, -0.0, 0.0, 0.5, 2.0, -inf, inf, nan]),
            ("elu", x.elu(1.0), [-0.9502129554748535, -0.6321205496788025, -0.39346933364868164, -0.0, 0.0, 0.5, 2.0, -1.0, inf, nan]),
            ("elu 0.5", x.elu(0.5), [-0.47510647773742676, -0.31606027483940125, -0.19673466682434082, -0.0, 0.0, 0.5, 2.0, -0.5, inf, nan]),
            (
                "aten elu",
                unary(&x, UnaryKind::Elu { alpha: 1.5, scale: 2.0, input_scale: 0.5 }),
                [-2.3306095600128174, -1.180408000946045, -0.6635976433753967, -0.0, 0.0, 1.0, 4.0, -3.0, inf, nan],
            ),
        ];
        for (name, got, want) in cases {
            let got = f32s(&got.unwrap());
            close(&format!("{name} on {dev}"), &got, &want, 2e-7);
            for (g, w) in got.iter().zip(&want) {
                if *w == 0.0 {
                    assert_eq!(g.to_bits(), w.to_bits(), "{name} on {dev}: signed zero");
                }
            }
        }
        // Integers are refused, as PyTorch refuses them.
        let ints = Tensor::from_vec(vec![1i64, -2], [2], &cpu()).unwrap();
        assert!(ints.leaky_relu(0.01).is_err() && ints.elu(1.0).is_err());
    }
);

test_device!(
    /// `bitwise_not` and `fmod` at PyTorch's values: two's complement on every integer width,
    /// logical not on bool; the dividend's sign, NaN for a zero or NaN divisor or an infinite
    /// dividend, the dividend for an infinite divisor, and integer division by zero an error:
    ///
    /// ```python
    /// torch.bitwise_not(torch.tensor([0, 5, -6, 127], dtype=torch.int8))    # [-1, -6, 5, -128]
    /// torch.bitwise_not(torch.tensor([0, 5, 250], dtype=torch.uint8))       # [255, 250, 5]
    /// torch.bitwise_not(torch.tensor([0, 1, -1, 2**40]))                    # [-1, -2, 0, -1099511627777]
    /// torch.bitwise_not(torch.tensor([True, False]))                        # [False, True]
    /// a = torch.tensor([-7.5, 7.5, -7.5, 5.0, -0.0, 3.0, inf, 2.0])
    /// b = torch.tensor([2.0, -2.0, -2.0, 0.0, 3.0, inf, 2.0, nan])
    /// torch.fmod(a, b)   # [-1.5, 1.5, -1.5, nan, -0.0, 3.0, nan, nan]
    /// torch.fmod(torch.tensor([-7, 7, -7, 7]), torch.tensor([2, -2, -2, 3]))  # [-1, 1, -1, 1]
    /// torch.fmod(torch.tensor([5, -5]), 2.5)   # float32 [0.0, -0.0]
    /// torch.fmod(torch.tensor([1]), torch.tensor([0]))   # ZeroDivisionError
    /// ```
    bitwise_not_and_fmod_match_pytorch,
    |dev| {
        let on = |t: Tensor| t.to_device(&dev).unwrap();
        let i8s = on(Tensor::from_vec(vec![0i8, 5, -6, 127], [4], &cpu()).unwrap());
        assert_eq!(i64s(&i8s.bitwise_not().unwrap()), [-1, -6, 5, -128]);
        let u8s = on(Tensor::from_vec(vec![0u8, 5, 250], [3], &cpu()).unwrap());
        let got = u8s.bitwise_not().unwrap();
        assert_eq!(got.dtype(), DType::U8);
        assert_eq!(i64s(&got), [255, 250, 5]);
        let big = on(Tensor::from_vec(vec![0i64, 1, -1, 1 << 40], [4], &cpu()).unwrap());
        assert_eq!(i64s(&big.bitwise_not().unwrap()), [-1, -2, 0, -1_099_511_627_777]);
        let bools = on(Tensor::from_vec(vec![true, false], [2], &cpu()).unwrap());
        let got = bools.bitwise_not().unwrap();
        assert_eq!(got.dtype(), DType::Bool);
        assert_eq!(got.to_device(&cpu()).unwrap().to_vec::<bool>().unwrap(), [false, true]);
        assert!(on(Tensor::from_vec(vec![1.0f32], [1], &cpu()).unwrap()).bitwise_not().is_err());

        let (nan, inf) = (f32::NAN, f32::INFINITY);
        let a = on(Tensor::from_vec(vec![-7.5f32, 7.5, -7.5, 5.0, -0.0, 3.0, inf, 2.0], [8], &cpu()).unwrap());
        let b = on(Tensor::from_vec(vec![2.0f32, -2.0, -2.0, 0.0, 3.0, inf, 2.0, nan], [8], &cpu()).unwrap());
        let got = f32s(&a.fmod(&b).unwrap());
        let want = [-1.5, 1.5, -1.5, nan, -0.0, 3.0, nan, nan];
        close("fmod", &got, &want, 0.0);
        assert_eq!(got[4].to_bits(), (-0.0f32).to_bits(), "fmod keeps the dividend's sign");
        let ia = on(Tensor::from_vec(vec![-7i64, 7, -7, 7], [4], &cpu()).unwrap());
        let ib = on(Tensor::from_vec(vec![2i64, -2, -2, 3], [4], &cpu()).unwrap());
        assert_eq!(i64s(&ia.fmod(&ib).unwrap()), [-1, 1, -1, 1]);
        let got = on(Tensor::from_vec(vec![5i64, -5], [2], &cpu()).unwrap()).fmod(2.5).unwrap();
        assert_eq!(got.dtype(), DType::F32);
        let got = f32s(&got);
        assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), [0.0f32.to_bits(), (-0.0f32).to_bits()]);
        let zero = on(Tensor::from_vec(vec![0i64], [1], &cpu()).unwrap());
        let one = on(Tensor::from_vec(vec![1i64], [1], &cpu()).unwrap());
        let e = one.fmod(&zero).map(|t| i64s(&t)).unwrap_err().to_string();
        assert!(e.contains("fmod") && e.contains("zero"), "{e}");
    }
);
