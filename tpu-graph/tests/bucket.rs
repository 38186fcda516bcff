//! Bucketing: varying sizes compile once per bucket, the function masks the padding with the
//! true size it receives, and the results equal unpadded eager execution.

use tpu_graph::{Buckets, CompileOptions, OnRecompileLimit, compile_with};
use tpu_ops::prelude::*;
use tpu_ops::tpu_tensor::{DType, Device, Generator, Result, Tensor};

fn pjrt() -> Option<Device> {
    tpu_ops::testing::pjrt_device("tpu-graph buckets")
}

fn randn(shape: &[usize], seed: u64, dev: &Device) -> Tensor {
    Generator::new(seed).randn(shape, DType::F32, dev).unwrap()
}

/// The mean over dim 1 of `x` `[b, s, d]`, of its first `len` positions only.
fn masked_mean(x: &Tensor, len: &Tensor) -> Result<Tensor> {
    let s = x.shape()[1];
    let pos = Tensor::arange(0i64, s as i64, 1i64, DType::I64, x.device())?;
    let mask = pos.lt(len)?.to(x.dtype())?.reshape([1i64, s as i64, 1])?;
    x.mul(&mask)?.sum(&[1], false)?.div(&len.to(x.dtype())?)
}

/// Row-wise softmax (rows bucketed: padding rows are independent and cut off) and a mean
/// over the bucketed sequence positions (masked with the true length).
fn function(a: &[Tensor]) -> Result<Vec<Tensor>> {
    // a: x [b, s, d], then the true size of the bucketed dim s.
    Ok(vec![a[0].softmax(2)?, masked_mean(&a[0], &a[1])?])
}

fn check(dev: &Device, tol: f32) {
    let f = compile_with(
        CompileOptions::default()
            .name("bucketed")
            .bucket(0, 1, Buckets::PowersOfTwo)
            .slice_output(0, 1, 0),
        function,
    );
    for (i, s) in [3usize, 4, 5, 7, 8, 6].into_iter().enumerate() {
        let x = randn(&[2, s, 5], i as u64, dev);
        let want = [x.softmax(2).unwrap(), x.mean(&[1], false).unwrap()];
        let got = f.call(std::slice::from_ref(&x)).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.shape(), w.shape());
            let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
            for (a, b) in g.iter().zip(&w) {
                assert!((a - b).abs() <= tol * (1.0 + b.abs()), "s {s}: {a} vs {b}");
            }
        }
    }
    // Sizes 3, 4 | 5, 7, 8, 6: the buckets 4 and 8.
    assert_eq!(f.programs(), 2);
}

#[test]
fn bucketed_sizes_compile_once_per_bucket_and_equal_unpadded_eager() {
    check(&Device::cpu(), 1e-6);
    if let Some(dev) = pjrt() {
        check(&dev, 1e-5);
    }
}

#[test]
fn the_pad_policy_compiles_exact_sizes_up_to_the_limit_then_buckets() {
    let dev = Device::cpu();
    let f = compile_with(
        CompileOptions::default()
            .bucket(0, 1, Buckets::Sizes(vec![16, 8]))
            .slice_output(0, 1, 0)
            .recompile_limit(2, OnRecompileLimit::Pad),
        function,
    );
    let mut programs = Vec::new();
    for (i, s) in [3usize, 5, 3, 6, 7, 8, 11].into_iter().enumerate() {
        let x = randn(&[2, s, 5], i as u64, &dev);
        let got = f.call(std::slice::from_ref(&x)).unwrap();
        assert_eq!(got[0].shape(), &[2, s, 5]);
        let want = x.mean(&[1], false).unwrap().to_vec::<f32>().unwrap();
        for (a, b) in got[1].to_vec::<f32>().unwrap().iter().zip(&want) {
            assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()));
        }
        programs.push(f.programs());
    }
    // 3 and 5 exactly; 3 again hits; 6, 7, 8 pad to 8 (one program); 11 pads to 16.
    assert_eq!(programs, vec![1, 2, 2, 3, 3, 3, 4]);
}

#[test]
fn a_size_past_the_largest_bucket_is_an_error() {
    let f = compile_with(
        CompileOptions::default().bucket(0, 1, Buckets::Sizes(vec![4])),
        function,
    );
    let e = f
        .call(&[randn(&[1, 5, 2], 0, &Device::cpu())])
        .unwrap_err()
        .to_string();
    assert!(e.contains("larger than the largest bucket"), "{e}");
}
