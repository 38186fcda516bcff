//! The slice forms of the elementwise kernels (`ops::elementwise::fused`) give the bits of the
//! ops on tensors, for every kind they cover, at every instruction-set level, over lengths
//! around the vector widths and the parallel split, with special values among the inputs.

use tpu_ops::cpu::isa::{Level, with_level};
use tpu_ops::ops::elementwise::binary::{BinaryKind, binary, binary_scalar, scalar_binary};
use tpu_ops::ops::elementwise::fused::{
    Cond, Operand, binary_f32, binary_fuses, unary_f32, unary_fuses, where_f32,
};
use tpu_ops::ops::elementwise::unary::{UnaryKind, unary};
use tpu_ops::testing::SplitMix;
use tpu_ops::where_;
use tpu_tensor::{Device, Scalar, Tensor};

const LENGTHS: [usize; 8] = [0, 1, 7, 17, 65, 257, 4099, 40_000];

const LEVELS: [Level; 3] = [Level::Portable, Level::Avx2, Level::Avx512];

fn values(n: usize, seed: u64) -> Vec<f32> {
    const SPECIAL: [f32; 8] = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e30,
        -1e-30,
        0.5,
    ];
    let mut r = SplitMix(seed);
    (0..n)
        .map(|i| {
            if i % 13 == 5 {
                SPECIAL[r.range(0, SPECIAL.len() - 1)]
            } else {
                (r.range(0, 20_001) as f32 - 10_000.0) / 1000.0
            }
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn tensor_bits(t: &Tensor) -> Vec<u32> {
    bits(&t.to_vec::<f32>().unwrap())
}

#[test]
fn unary_slices_give_the_ops_bits() {
    let dev = Device::cpu();
    let kinds: Vec<UnaryKind> = UnaryKind::all()
        .into_iter()
        .chain([UnaryKind::PowScalar(Scalar::Float(0.5))])
        .filter(|k| unary_fuses(*k))
        .collect();
    assert!(kinds.len() >= 25, "{kinds:?}");
    assert!(!unary_fuses(UnaryKind::IsNan));
    for level in LEVELS {
        with_level(level, || {
            for n in LENGTHS {
                let x = values(n, n as u64);
                let t = Tensor::from_vec(x.clone(), [n], &dev).unwrap();
                for &k in &kinds {
                    let mut out = vec![0f32; n];
                    unary_f32(k, &x, &mut out).unwrap();
                    let want = tensor_bits(&unary(&t, k).unwrap());
                    assert_eq!(bits(&out), want, "{k:?}, {n} elements, {level:?}");
                }
            }
        });
    }
    let mut short = [0f32; 3];
    assert!(unary_f32(UnaryKind::Exp, &[1.0; 4], &mut short).is_err());
    assert!(unary_f32(UnaryKind::IsNan, &[1.0; 3], &mut short).is_err());
}

#[test]
fn binary_slices_give_the_ops_bits() {
    let dev = Device::cpu();
    let kinds: Vec<BinaryKind> = BinaryKind::all()
        .into_iter()
        .filter(|k| binary_fuses(*k))
        .collect();
    assert_eq!(kinds.len(), 13, "{kinds:?}");
    for level in LEVELS {
        with_level(level, || {
            for n in LENGTHS {
                let (a, b) = (values(n, 2 * n as u64), values(n, 2 * n as u64 + 1));
                let ta = Tensor::from_vec(a.clone(), [n], &dev).unwrap();
                let tb = Tensor::from_vec(b.clone(), [n], &dev).unwrap();
                for &k in &kinds {
                    let mut out = vec![0f32; n];
                    binary_f32(k, Operand::Slice(&a), Operand::Slice(&b), &mut out).unwrap();
                    let want = tensor_bits(&binary(&ta, &tb, k).unwrap());
                    assert_eq!(bits(&out), want, "{k:?}, {n} elements, {level:?}");
                    // A Rust number on either side (of f64 precision, rounded to f32 by the
                    // kernel), and a 0-d f32 tensor.
                    for v in [2.5f64, -0.0, 0.1, f64::NAN] {
                        let s = v as f32;
                        binary_f32(k, Operand::Slice(&a), Operand::Scalar(s), &mut out).unwrap();
                        let want = tensor_bits(&binary_scalar(&ta, v, k).unwrap());
                        assert_eq!(bits(&out), want, "{k:?} by {v}, {n}, {level:?}");
                        binary_f32(k, Operand::Scalar(s), Operand::Slice(&b), &mut out).unwrap();
                        let want = tensor_bits(&scalar_binary(v, &tb, k).unwrap());
                        assert_eq!(bits(&out), want, "{v} {k:?}, {n}, {level:?}");
                        let zero_d = Tensor::scalar(s, &dev).unwrap();
                        let want = tensor_bits(&binary(&zero_d, &tb, k).unwrap());
                        assert_eq!(bits(&out), want, "0-d {v} {k:?}, {n}, {level:?}");
                    }
                }
            }
        });
    }
    let mut out = [0f32; 3];
    let long = Operand::Slice(&[1.0; 4]);
    assert!(binary_f32(BinaryKind::Add, long, Operand::Scalar(1.0), &mut out).is_err());
    let ok = Operand::Slice(&[1.0; 3]);
    assert!(binary_f32(BinaryKind::Lt, ok, ok, &mut out).is_err());
    binary_f32(
        BinaryKind::Mul,
        Operand::Scalar(3.0),
        Operand::Scalar(-2.0),
        &mut out,
    )
    .unwrap();
    assert_eq!(out, [-6.0; 3]);
}

#[test]
fn where_slices_pick_as_where_does() {
    let dev = Device::cpu();
    for n in LENGTHS {
        let (a, b) = (values(n, 7 * n as u64), values(n, 7 * n as u64 + 1));
        let c: Vec<bool> = a.iter().map(|x| *x > 0.0).collect();
        let ta = Tensor::from_vec(a.clone(), [n], &dev).unwrap();
        let tb = Tensor::from_vec(b.clone(), [n], &dev).unwrap();
        let tc = Tensor::from_vec(c.clone(), [n], &dev).unwrap();
        let mut out = vec![0f32; n];
        where_f32(
            Cond::Slice(&c),
            Operand::Slice(&a),
            Operand::Slice(&b),
            &mut out,
        )
        .unwrap();
        assert_eq!(bits(&out), tensor_bits(&where_(&tc, &ta, &tb).unwrap()));
        let s = Tensor::scalar(-0.0f32, &dev).unwrap();
        where_f32(
            Cond::Slice(&c),
            Operand::Scalar(-0.0),
            Operand::Slice(&b),
            &mut out,
        )
        .unwrap();
        assert_eq!(bits(&out), tensor_bits(&where_(&tc, &s, &tb).unwrap()));
        where_f32(
            Cond::Slice(&c),
            Operand::Slice(&a),
            Operand::Scalar(-0.0),
            &mut out,
        )
        .unwrap();
        assert_eq!(bits(&out), tensor_bits(&where_(&tc, &ta, &s).unwrap()));
        for k in [true, false] {
            let tk = Tensor::scalar(k, &dev).unwrap();
            where_f32(
                Cond::Scalar(k),
                Operand::Slice(&a),
                Operand::Slice(&b),
                &mut out,
            )
            .unwrap();
            assert_eq!(bits(&out), tensor_bits(&where_(&tk, &ta, &tb).unwrap()));
        }
    }
    let mut out = [0f32; 2];
    let c = Cond::Slice(&[true; 3]);
    assert!(where_f32(c, Operand::Scalar(1.0), Operand::Scalar(2.0), &mut out).is_err());
}
