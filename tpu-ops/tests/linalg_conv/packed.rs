//! `packed_linear` against `linear`: the same bits for every float dtype, batch shape, bias and
//! row count (one row included, where it is `linear` itself), a weight changed in place after it
//! was packed, gradients, and the errors.

use tpu_ops::autograd::{backward, grad, no_grad, set_requires_grad};
use tpu_ops::cpu::isa::{detected_level, with_level};
use tpu_ops::ops::linalg::{PackedWeight, linear, packed_linear};
use tpu_tensor::{DType, Tensor};

use crate::common::{bits, randn};

/// Runs `f` with the kernels' level held: other tests of this binary cap it for a while, and
/// the two products compared must run at the same level to give the same bits.
fn one_level(f: impl FnOnce()) {
    with_level(detected_level(), f)
}

fn same(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(bits(got), bits(want), "{what}: values");
}

#[test]
fn packed_linear_gives_linears_bits() {
    one_level(|| {
        // `k` past one bf16 block (512) and `n` off the 32-column panels; rows on either side of
        // the 12-row tile and the parallel threshold.
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (lead, k, n) in [
                (vec![2], 5, 3),
                (vec![1], 64, 40),
                (vec![13], 600, 70),
                (vec![3, 40], 96, 33),
                (vec![128], 576, 1536),
                (vec![2, 3, 5], 1100, 9),
            ] {
                let w = randn(1, &[n, k]).to_dtype(dtype).unwrap();
                let b = randn(2, &[n]).to_dtype(dtype).unwrap();
                let mut xs = lead.clone();
                xs.push(k);
                let x = randn(3, &xs).to_dtype(dtype).unwrap();
                let pw = PackedWeight::new(&w).unwrap();
                let what = format!("{dtype} {xs:?} x [{n}, {k}]");
                same(
                    &packed_linear(&x, &pw, None).unwrap(),
                    &linear(&x, &w, None).unwrap(),
                    &what,
                );
                same(
                    &packed_linear(&x, &pw, Some(&b)).unwrap(),
                    &linear(&x, &w, Some(&b)).unwrap(),
                    &format!("{what} with a bias"),
                );
                // A transposed weight packs from its strides.
                let wt = randn(4, &[k, n]).to_dtype(dtype).unwrap().t().unwrap();
                same(
                    &packed_linear(&x, &PackedWeight::new(&wt).unwrap(), None).unwrap(),
                    &linear(&x, &wt, None).unwrap(),
                    &format!("{what}, the weight transposed"),
                );
            }
        }
    });
}

#[test]
fn a_weight_changed_in_place_is_read_again() {
    one_level(|| {
        let w = randn(5, &[40, 64]).to_dtype(DType::F32).unwrap();
        let x = randn(6, &[16, 64]).to_dtype(DType::F32).unwrap();
        let pw = PackedWeight::new(&w).unwrap();
        let before = packed_linear(&x, &pw, None).unwrap();
        w.copy_(&randn(7, &[40, 64]).to_dtype(DType::F32).unwrap())
            .unwrap();
        let after = packed_linear(&x, &pw, None).unwrap();
        same(&after, &linear(&x, &w, None).unwrap(), "after copy_");
        assert_ne!(bits(&after), bits(&before), "the new weight counts");
    });
}

#[test]
fn gradients_flow_as_through_linear() {
    one_level(|| {
        let w = randn(8, &[6, 10]).to_dtype(DType::F32).unwrap();
        let b = randn(9, &[6]).to_dtype(DType::F32).unwrap();
        let x = randn(10, &[4, 10]).to_dtype(DType::F32).unwrap();
        let pw = PackedWeight::new(&w).unwrap();
        let mut got = Vec::new();
        for packed in [true, false] {
            for t in [&x, &w, &b] {
                set_requires_grad(t, false).unwrap();
            }
            let x = x.copy().unwrap();
            for t in [&x, &w, &b] {
                set_requires_grad(t, true).unwrap();
            }
            let y = if packed {
                packed_linear(&x, &pw, Some(&b)).unwrap()
            } else {
                linear(&x, &w, Some(&b)).unwrap()
            };
            let g = randn(14, y.shape()).to_dtype(DType::F32).unwrap();
            backward(&y, Some(&g), false).unwrap();
            got.push([&x, &w, &b].map(|t| bits(&grad(t).expect("a gradient"))));
            for t in [&w, &b] {
                set_requires_grad(t, false).unwrap();
            }
        }
        assert_eq!(got[0], got[1], "gradients of x, w and the bias");
        // Under no_grad the panels serve, with the same bits.
        let y = {
            let _off = no_grad();
            packed_linear(&x, &pw, None).unwrap()
        };
        same(&y, &linear(&x, &w, None).unwrap(), "under no_grad");
    });
}

#[test]
fn mismatches_are_linears_errors() {
    let w = randn(11, &[6, 10]).to_dtype(DType::F32).unwrap();
    let pw = PackedWeight::new(&w).unwrap();
    assert!(pw.is_packed() == tpu_ops::cpu::simd::gemm_accelerated());
    let cases = [
        randn(12, &[4, 9]).to_dtype(DType::F32).unwrap(),
        randn(12, &[4, 10]).to_dtype(DType::BF16).unwrap(),
    ];
    for x in &cases {
        let want = linear(x, &w, None).map(|_| ()).unwrap_err().to_string();
        let got = packed_linear(x, &pw, None)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert_eq!(got, want);
    }
    let e = PackedWeight::new(&randn(13, &[3, 4, 5]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("[out, in]") && e.contains("[3, 4, 5]"), "{e}");
}
