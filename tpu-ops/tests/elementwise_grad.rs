//! Gradient checks of every differentiable elementwise op against central finite differences
//! (f64), with broadcasting for the binary ones.

use proptest::prelude::*;
use tpu_ops::OpDef;
use tpu_ops::ops::binary::{Binary, BinaryKind, binary};
use tpu_ops::ops::unary::{Unary, UnaryKind, unary};
use tpu_ops::prelude::*;
use tpu_ops::testing::gradcheck;
use tpu_tensor::{DType, Device, Generator, Tensor};

fn cpu() -> Device {
    Device::cpu()
}

/// Inputs inside each function's domain, away from its kinks and jumps.
fn input_for(kind: UnaryKind, shape: &[usize], seed: u64) -> Tensor {
    let x = Generator::new(seed)
        .randn(shape, DType::F64, &cpu())
        .unwrap();
    match kind {
        UnaryKind::Log
        | UnaryKind::Log2
        | UnaryKind::Sqrt
        | UnaryKind::Rsqrt
        | UnaryKind::Log1p
        | UnaryKind::Reciprocal => x.abs().unwrap().add(0.5).unwrap(),
        UnaryKind::Tan => x.mul(0.4).unwrap(),
        // Keep clear of 0 and of the clamp bounds, where the derivative jumps.
        UnaryKind::Abs | UnaryKind::Relu | UnaryKind::Clamp { .. } => {
            let s = x.sign().unwrap();
            x.abs()
                .unwrap()
                .add(0.05)
                .unwrap()
                .mul(&s)
                .unwrap()
                .mul(0.7)
                .unwrap()
        }
        _ => x.mul(1.5).unwrap(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn unary_gradients(shape in proptest::collection::vec(1usize..4, 1..3), seed in 0u64..500) {
        for kind in UnaryKind::all() {
            if !Unary(kind).has_backward() {
                continue;
            }
            let x = input_for(kind, &shape, seed);
            let r = gradcheck(&format!("{kind:?}"), |t| unary(&t[0], kind), &[x], 1e-6, 1e-5);
            prop_assert!(r.is_ok(), "{:?}", r.err());
        }
    }

    #[test]
    fn binary_gradients_with_broadcasting(
        shape in proptest::collection::vec(1usize..4, 1..3),
        seed in 0u64..500,
        broadcast in any::<bool>(),
    ) {
        let mut g = Generator::new(seed);
        let a = g.randn(&shape, DType::F64, &cpu()).unwrap();
        let bshape: Vec<usize> = if broadcast { shape[shape.len() - 1..].to_vec() } else { shape.clone() };
        // Positive, away from a: keeps pow, div and remainder smooth and max/min untied.
        let b = g.rand(&bshape, DType::F64, &cpu()).unwrap().add(0.75).unwrap();
        for kind in BinaryKind::all() {
            if !(Binary { kind, numbers: [false, false] }).has_backward() {
                continue;
            }
            let (a, b) = match kind {
                BinaryKind::Pow => (a.abs().unwrap().add(0.5).unwrap(), b.clone()),
                BinaryKind::Remainder => (a.mul(0.3).unwrap().add(0.1).unwrap().abs().unwrap(), b.add(1.0).unwrap()),
                _ => (a.clone(), b.clone()),
            };
            let r = gradcheck(&format!("{kind:?}"), |t| binary(&t[0], &t[1], kind), &[a, b], 1e-6, 1e-5);
            prop_assert!(r.is_ok(), "{:?}", r.err());
        }
        // where: gradients reach both branches.
        let c = g.randint(0, 2, &shape, DType::Bool, &cpu()).unwrap();
        let r = gradcheck("where", |t| tpu_ops::where_(&c, &t[0], &t[1]), &[a.clone(), g.randn(&bshape, DType::F64, &cpu()).unwrap()], 1e-6, 1e-6);
        prop_assert!(r.is_ok(), "{:?}", r.err());
        // A cast to f32 and back passes gradients through.
        let r = gradcheck("to(f32)", |t| t[0].to(DType::F32)?.mul(2.0)?.to(DType::F64), std::slice::from_ref(&a), 1e-3, 1e-4);
        prop_assert!(r.is_ok(), "{:?}", r.err());
    }
}
