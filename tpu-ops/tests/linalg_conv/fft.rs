//! The Fourier transforms (Core ATen's `_fft_r2c` and `_fft_c2r`, and `_fft_c2c`): against a
//! direct f64 DFT over random shapes, dims and scales (proptest, plain and strided inputs),
//! PyTorch's documented values, `torch.fft`'s sizes and round trips, finite differences, XLA
//! against the native CPU forward and backward, and bad input.

use std::f64::consts::PI;

use crate::common::{
    Rng, check_near, cpu, devices, gradcheck_or_panic, has, pjrt, randn, test_device, vals,
};
use proptest::prelude::*;
use tpu_ops::ops::fft::{
    FftNorm, FftScale, complex, fft, fft_c2c, fft_c2r, fft_r2c, fftn, ifft, irfft, irfftn,
    real_to_complex, rfft, rfftn,
};
use tpu_ops::prelude::*;
use tpu_tensor::{DType, Device, Tensor};

type C = (f64, f64);

fn split(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    let outer = shape[..dim].iter().product();
    let inner = shape[dim + 1..].iter().product();
    (outer, shape[dim], inner)
}

/// The unscaled DFT of `data` (complex, row-major `shape`) along `dim`, summed term by term.
fn dft(data: &[C], shape: &[usize], dim: usize, forward: bool) -> Vec<C> {
    let (outer, n, inner) = split(shape, dim);
    let sign = if forward { -1.0 } else { 1.0 };
    let mut out = vec![(0.0, 0.0); data.len()];
    for o in 0..outer {
        for k in 0..n {
            for j in 0..inner {
                let mut acc = (0.0, 0.0);
                for t in 0..n {
                    let (re, im) = data[(o * n + t) * inner + j];
                    let a = sign * 2.0 * PI * ((k * t) % n) as f64 / n as f64;
                    let (s, c) = a.sin_cos();
                    acc.0 += re * c - im * s;
                    acc.1 += re * s + im * c;
                }
                out[(o * n + k) * inner + j] = acc;
            }
        }
    }
    out
}

fn factor(scale: FftScale, points: usize) -> f64 {
    match scale {
        FftScale::None => 1.0,
        FftScale::ByRootN => 1.0 / (points as f64).sqrt(),
        FftScale::ByN => 1.0 / points as f64,
    }
}

fn pairs(data: &[C], f: f64) -> Vec<f64> {
    data.iter().flat_map(|&(re, im)| [re * f, im * f]).collect()
}

fn unpair(v: &[f64]) -> Vec<C> {
    v.chunks(2).map(|p| (p[0], p[1])).collect()
}

fn points(shape: &[usize], dims: &[usize]) -> usize {
    dims.iter().map(|&d| shape[d]).product()
}

/// `_fft_r2c` by definition: the full DFT over `dims`, the last of them cut to `n/2 + 1`.
fn r2c_ref(
    x: &[f64],
    shape: &[usize],
    dims: &[usize],
    scale: FftScale,
    onesided: bool,
) -> Vec<f64> {
    let mut data: Vec<C> = x.iter().map(|&v| (v, 0.0)).collect();
    for &d in dims {
        data = dft(&data, shape, d, true);
    }
    let l = *dims.last().unwrap();
    let (outer, n, inner) = split(shape, l);
    let keep = if onesided { n / 2 + 1 } else { n };
    let mut out = Vec::new();
    for o in 0..outer {
        for k in 0..keep {
            out.extend_from_slice(&data[(o * n + k) * inner..][..inner]);
        }
    }
    pairs(&out, factor(scale, points(shape, dims)))
}

/// `_fft_c2r` by definition: the backward DFT over all but the last dim, then along it
/// `y_t = Re X_0 + 2 Σ Re(X_k e^{2πi kt/n}) (+ Re X_{n/2} (-1)^t for even n)` with missing
/// frequencies read as zeros.
fn c2r_ref(z: &[f64], shape: &[usize], dims: &[usize], scale: FftScale, n: usize) -> Vec<f64> {
    let mut data = unpair(z);
    let (l, others) = dims.split_last().unwrap();
    for &d in others {
        data = dft(&data, shape, d, false);
    }
    let (outer, m, inner) = split(shape, *l);
    let mut out_shape = shape.to_vec();
    out_shape[*l] = n;
    let f = factor(scale, points(&out_shape, dims));
    let mut out = vec![0.0; outer * n * inner];
    for o in 0..outer {
        for j in 0..inner {
            let x = |k: usize| {
                if k < m {
                    data[(o * m + k) * inner + j]
                } else {
                    (0.0, 0.0)
                }
            };
            for t in 0..n {
                let mut y = x(0).0;
                for k in 1..=n / 2 {
                    let (re, im) = x(k);
                    let a = 2.0 * PI * ((k * t) % n) as f64 / n as f64;
                    let v = re * a.cos() - im * a.sin();
                    y += if 2 * k == n { v } else { 2.0 * v };
                }
                out[(o * n + t) * inner + j] = y * f;
            }
        }
    }
    out
}

fn c2c_ref(z: &[f64], shape: &[usize], dims: &[usize], scale: FftScale, forward: bool) -> Vec<f64> {
    let mut data = unpair(z);
    for &d in dims {
        data = dft(&data, shape, d, forward);
    }
    pairs(&data, factor(scale, points(shape, dims)))
}

const SCALES: [FftScale; 3] = [FftScale::None, FftScale::ByRootN, FftScale::ByN];

/// A random input of `shape` on the CPU, as a transposed view half of the time.
fn input(rng: &mut Rng, shape: &[usize]) -> Tensor {
    let seed = rng.next();
    if shape.len() >= 2 && rng.coin() {
        let r = shape.len() - 1;
        let mut stored = shape.to_vec();
        stored.swap(0, r);
        randn(seed, &stored).transpose(0, r as i64).unwrap()
    } else {
        randn(seed, shape)
    }
}

fn check_case(seed: u64) {
    let mut rng = Rng::new(seed);
    let rank = rng.range(1, 3);
    let shape = rng.shape(rank, 1, 9);
    let k = rng.range(1, rank);
    let dims: Vec<usize> = rng.perm(rank)[..k].to_vec();
    let idims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let scale = SCALES[rng.below(3)];
    let what = format!("seed {seed}: shape {shape:?} dims {dims:?} {scale:?}");
    let tol = |d: DType| if d == DType::F64 { 1e-9 } else { 1e-4 };
    match rng.below(3) {
        0 => {
            let onesided = rng.coin();
            let x = input(&mut rng, &shape);
            let want = r2c_ref(&vals(&x), &shape, &dims, scale, onesided);
            for d in [DType::F64, DType::F32] {
                let got = fft_r2c(&x.to_dtype(d).unwrap(), &idims, scale, onesided).unwrap();
                check_near(
                    &format!("r2c {what} {onesided} {d}"),
                    &vals(&got),
                    &want,
                    tol(d),
                );
            }
        }
        1 => {
            let n = rng.range(1, 2 * shape[dims[k - 1]] + 1);
            let mut paired = shape.clone();
            paired.push(2);
            let z = input(&mut rng, &paired);
            let want = c2r_ref(&vals(&z), &shape, &dims, scale, n);
            for d in [DType::F64, DType::F32] {
                let got = fft_c2r(&z.to_dtype(d).unwrap(), &idims, scale, n).unwrap();
                check_near(&format!("c2r {what} n {n} {d}"), &vals(&got), &want, tol(d));
            }
        }
        _ => {
            let forward = rng.coin();
            let mut paired = shape.clone();
            paired.push(2);
            let z = input(&mut rng, &paired);
            let want = c2c_ref(&vals(&z), &shape, &dims, scale, forward);
            for d in [DType::F64, DType::F32] {
                let got = fft_c2c(&z.to_dtype(d).unwrap(), &idims, scale, forward).unwrap();
                check_near(
                    &format!("c2c {what} {forward} {d}"),
                    &vals(&got),
                    &want,
                    tol(d),
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn transforms_match_the_definition(seed in any::<u64>()) {
        check_case(seed);
    }
}

/// Lengths the FFT splits differently (primes, powers of two, mixed radices) and one large
/// enough to be shared out over the threads, against the definition.
#[test]
fn long_and_prime_lengths_match_the_definition() {
    for n in [1usize, 2, 3, 16, 17, 60, 97, 128, 257] {
        let x = randn(n as u64, &[3, n]);
        let want = r2c_ref(&vals(&x), &[3, n], &[1], FftScale::None, true);
        let got = fft_r2c(&x, &[1], FftScale::None, true).unwrap();
        check_near(&format!("r2c n {n}"), &vals(&got), &want, 1e-9);
        let back = fft_c2r(&got, &[1], FftScale::ByN, n).unwrap();
        check_near(&format!("round trip n {n}"), &vals(&back), &vals(&x), 1e-12);
    }
    // 64 lines of 2048 along a dim that is not the last: transposed, split over tasks.
    let x = randn(5, &[2048, 64]);
    let got = fft_r2c(&x, &[0], FftScale::ByN, false).unwrap();
    let back = fft_c2c(&got, &[0], FftScale::None, false).unwrap();
    check_near(
        "2048-point round trip",
        &vals(&back.select(-1, 0).unwrap()),
        &vals(&x),
        1e-12,
    );
    check_near(
        "2048-point imaginary parts",
        &vals(&back.select(-1, 1).unwrap()),
        &vec![0.0; 2048 * 64],
        1e-12,
    );
}

fn f64s(v: &[f64], shape: &[usize], dev: &Device) -> Tensor {
    Tensor::from_slice(v, shape, &cpu())
        .unwrap()
        .to_device(dev)
        .unwrap()
}

// PyTorch's values, from its documentation and these lines (torch 2.x):
//
// ```python
// import torch
// torch.fft.rfft(torch.arange(4.))            # [6, -2+2j, -2]
// torch.fft.fft(torch.arange(4.))             # [6, -2+2j, -2, -2-2j]
// torch.fft.rfft(torch.arange(4.), norm="ortho")  # [3, -1+1j, -1]
// t = torch.linspace(0, 1, 5)
// T = torch.fft.rfft(t)                       # [2.5, -0.6250+0.8602j, -0.6250+0.2031j]
// torch.fft.irfft(T)                          # [0.1562, 0.3511, 0.7812, 1.2114]
// torch.fft.irfft(T, t.numel())               # [0, 0.25, 0.5, 0.75, 1]
// x = torch.arange(4., requires_grad=True)
// torch.view_as_real(torch.fft.rfft(x)).sum().backward(); x.grad   # [3, -1, 1, 1]
// ```
mod torch_values {
    use super::*;

    test_device!(documented_values, |dev| {
        let x = f64s(&[0.0, 1.0, 2.0, 3.0], &[4], &dev);
        let r = rfft(&x, None, -1, FftNorm::Backward).unwrap();
        assert_eq!(r.shape(), &[3, 2]);
        check_near("rfft", &vals(&r), &[6.0, 0.0, -2.0, 2.0, -2.0, 0.0], 1e-12);
        let f = fft(&real_to_complex(&x).unwrap(), None, 0, FftNorm::Backward).unwrap();
        check_near(
            "fft",
            &vals(&f),
            &[6.0, 0.0, -2.0, 2.0, -2.0, 0.0, -2.0, -2.0],
            1e-12,
        );
        let o = rfft(&x, None, 0, "ortho".parse().unwrap()).unwrap();
        check_near(
            "rfft ortho",
            &vals(&o),
            &[3.0, 0.0, -1.0, 1.0, -1.0, 0.0],
            1e-12,
        );

        let t = f64s(&[0.0, 0.25, 0.5, 0.75, 1.0], &[5], &dev);
        let tt = rfft(&t, None, 0, FftNorm::Backward).unwrap();
        check_near(
            "rfft of linspace",
            &vals(&tt),
            &[
                2.5,
                0.0,
                -0.625,
                0.8602387002944835,
                -0.625,
                0.20307481014556616,
            ],
            1e-12,
        );
        let short = irfft(&tt, None, 0, FftNorm::Backward).unwrap();
        check_near(
            "irfft, default length",
            &vals(&short),
            &[0.15625, 0.3511306498527583, 0.78125, 1.2113693501472418],
            1e-12,
        );
        let back = irfft(&tt, Some(5), 0, FftNorm::Backward).unwrap();
        check_near(
            "irfft, n = 5",
            &vals(&back),
            &[0.0, 0.25, 0.5, 0.75, 1.0],
            1e-12,
        );
    });

    test_device!(documented_gradient, |dev| {
        let x = f64s(&[0.0, 1.0, 2.0, 3.0], &[4], &dev)
            .requires_grad_(true)
            .unwrap();
        let y = rfft(&x, None, 0, FftNorm::Backward).unwrap();
        y.sum_all().unwrap().backward().unwrap();
        check_near(
            "grad",
            &vals(&x.grad().unwrap()),
            &[3.0, -1.0, 1.0, 1.0],
            1e-12,
        );
    });
}

/// `torch.fft`'s sizes: `n` cuts or zero-pads the input, `s` per dim, the default length of an
/// inverse, and round trips over several dims in every norm.
#[test]
fn torch_fft_sizes_and_round_trips() {
    let x = randn(3, &[3, 4, 5]);
    for norm in [FftNorm::Backward, FftNorm::Ortho, FftNorm::Forward] {
        let spec = rfftn(&x, None, &[], norm).unwrap();
        assert_eq!(spec.shape(), &[3, 4, 3, 2]);
        let back = irfftn(&spec, Some(&[3, 4, 5]), &[], norm).unwrap();
        check_near(
            &format!("rfftn round trip {norm:?}"),
            &vals(&back),
            &vals(&x),
            1e-12,
        );
        let z = complex(&x, &x.neg().unwrap()).unwrap();
        let back =
            tpu_ops::ops::fft::ifftn(&fftn(&z, None, &[0, 2], norm).unwrap(), None, &[0, 2], norm)
                .unwrap();
        check_near(
            &format!("fftn round trip {norm:?}"),
            &vals(&back),
            &vals(&z),
            1e-12,
        );
        let back = ifft(&fft(&z, None, 1, norm).unwrap(), None, 1, norm).unwrap();
        check_near(
            &format!("fft round trip {norm:?}"),
            &vals(&back),
            &vals(&z),
            1e-12,
        );
    }
    // n past the length pads with zeros, n short of it cuts.
    let padded = rfft(&x, Some(8), -1, FftNorm::Backward).unwrap();
    let by_hand = rfft(
        &x.constant_pad_nd(&[0, 3], 0.0).unwrap(),
        None,
        -1,
        FftNorm::Backward,
    )
    .unwrap();
    assert_eq!(padded.shape(), &[3, 4, 5, 2]);
    check_near("rfft n = 8", &vals(&padded), &vals(&by_hand), 1e-12);
    let cut = rfft(&x, Some(3), 1, FftNorm::Backward).unwrap();
    let by_hand = rfft(&x.narrow(1, 0, 3).unwrap(), None, 1, FftNorm::Backward).unwrap();
    check_near("rfft n = 3", &vals(&cut), &vals(&by_hand), 1e-12);
    // irfft's default length is 2 (m - 1); a given n reads n/2 + 1 frequencies.
    let spec = rfft(&x, None, -1, FftNorm::Backward).unwrap();
    assert_eq!(
        irfft(&spec, None, 2, FftNorm::Backward).unwrap().shape(),
        &[3, 4, 4]
    );
    let long = irfft(&spec, Some(11), 2, FftNorm::Backward).unwrap();
    let want = c2r_ref(&vals(&spec), &[3, 4, 3], &[2], FftScale::ByN, 11);
    check_near("irfft n = 11", &vals(&long), &want, 1e-12);
    let s = rfftn(&x, Some(&[2, 6]), &[0, 2], FftNorm::Backward).unwrap();
    assert_eq!(s.shape(), &[2, 4, 4, 2]);
}

/// A transform of one tensor, named, with its input's shape.
type Case = (
    &'static str,
    Vec<usize>,
    Box<dyn Fn(&Tensor) -> tpu_tensor::Result<Tensor>>,
);

fn grad_cases() -> Vec<Case> {
    vec![
        (
            "r2c onesided",
            vec![3, 6],
            Box::new(|x| fft_r2c(x, &[1], FftScale::ByRootN, true)),
        ),
        (
            "r2c odd, two dims",
            vec![3, 5],
            Box::new(|x| fft_r2c(x, &[0, 1], FftScale::None, true)),
        ),
        (
            "r2c full",
            vec![4, 3],
            Box::new(|x| fft_r2c(x, &[0], FftScale::ByN, false)),
        ),
        (
            "c2r even",
            vec![3, 4, 2],
            Box::new(|z| fft_c2r(z, &[1], FftScale::ByN, 6)),
        ),
        (
            "c2r odd, two dims",
            vec![3, 4, 2],
            Box::new(|z| fft_c2r(z, &[0, 1], FftScale::None, 7)),
        ),
        (
            "c2r, frequencies past n/2 left out",
            vec![2, 5, 2],
            Box::new(|z| fft_c2r(z, &[1], FftScale::ByRootN, 4)),
        ),
        (
            "c2r n = 3 and n = 1",
            vec![3, 2, 2],
            Box::new(|z| {
                fft_c2r(z, &[1], FftScale::None, 3)?
                    .add(&fft_c2r(z, &[1], FftScale::None, 1)?.mul(2.0)?)
            }),
        ),
        (
            "c2c forward",
            vec![3, 4, 2],
            Box::new(|z| fft_c2c(z, &[0, 1], FftScale::ByRootN, true)),
        ),
        (
            "c2c backward",
            vec![5, 2],
            Box::new(|z| fft_c2c(z, &[0], FftScale::ByN, false)),
        ),
    ]
}

#[test]
fn gradients_match_finite_differences() {
    for (i, (what, shape, f)) in grad_cases().into_iter().enumerate() {
        let x = randn(40 + i as u64, &shape);
        gradcheck_or_panic(what, |t| f(&t[0]), &[x], 1e-6, 1e-6);
    }
}

/// XLA's transforms against the native CPU's, forward and backward, in f32.
#[test]
fn pjrt_matches_cpu_forward_and_backward() {
    let Some(dev) = pjrt("fft/pjrt_matches_cpu_forward_and_backward") else {
        return;
    };
    for (i, (what, shape, f)) in grad_cases().into_iter().enumerate() {
        let x = randn(60 + i as u64, &shape).to_dtype(DType::F32).unwrap();
        let run = |d: &Device| {
            let x = x.to_device(d).unwrap().requires_grad_(true).unwrap();
            let y = f(&x).unwrap();
            let w = randn(90 + i as u64, y.shape())
                .to_dtype(DType::F32)
                .unwrap();
            y.mul(&w.to_device(d).unwrap())
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            (vals(&y), vals(&x.grad().unwrap()))
        };
        let (y0, g0) = run(&cpu());
        let (y1, g1) = run(&dev);
        check_near(&format!("{what}: forward"), &y1, &y0, 1e-5);
        check_near(&format!("{what}: gradient"), &g1, &g0, 1e-5);
    }
}

/// 16-bit inputs compute in f32 and round once, on every device.
#[test]
fn half_precision_rounds_the_f32_result_once() {
    for dev in devices() {
        let x = randn(8, &[2, 6]);
        for d in [DType::F16, DType::BF16] {
            let h = x.to_dtype(d).unwrap();
            let want = fft_r2c(&h.to_dtype(DType::F32).unwrap(), &[1], FftScale::None, true)
                .unwrap()
                .to_dtype(d)
                .unwrap();
            let got = fft_r2c(&h.to_device(&dev).unwrap(), &[1], FftScale::None, true).unwrap();
            assert_eq!(got.dtype(), d);
            // XLA's FFT may sum in another order: one unit in the last place.
            let tol = if dev.is_cpu() { 0.0 } else { 1e-2 };
            check_near(&format!("{d} on {dev}"), &vals(&got), &vals(&want), tol);
        }
    }
}

#[test]
fn bad_input_is_an_error_that_says_why() {
    let x = randn(1, &[3, 4]);
    let err = |r: tpu_tensor::Result<Tensor>| r.unwrap_err().to_string();
    has(
        err(fft_r2c(&x, &[], FftScale::None, true)),
        &["fft_r2c", "at least one dim"],
    );
    has(
        err(fft_r2c(&x, &[1, 1], FftScale::None, true)),
        &["fft_r2c", "distinct", "[1, 1]"],
    );
    has(
        err(fft_r2c(&x, &[2], FftScale::None, true)),
        &["fft_r2c", "2"],
    );
    has(
        err(fft_r2c(
            &x.to_dtype(DType::I32).unwrap(),
            &[0],
            FftScale::None,
            true,
        )),
        &["fft_r2c", "i32"],
    );
    has(
        err(fft_r2c(&randn(1, &[3, 0]), &[1], FftScale::None, true)),
        &["fft_r2c", "at least one point", "[3, 0]"],
    );
    has(
        err(fft_c2r(&x, &[0], FftScale::None, 4)),
        &["fft_c2r", "pairs", "[3, 4]"],
    );
    has(
        err(fft_c2c(&randn(1, &[2]), &[0], FftScale::None, true)),
        &["fft_c2c", "pairs"],
    );
    has(
        err(fft_c2r(&randn(1, &[3, 2]), &[0], FftScale::None, 0)),
        &["fft_c2r", "at least one point"],
    );
    has(
        err(rfft(&x, Some(0), 0, FftNorm::Backward)),
        &["rfftn", "at least 1"],
    );
    has(
        err(rfftn(&x, Some(&[4]), &[0, 1], FftNorm::Backward)),
        &["rfftn", "2 dims", "1 sizes"],
    );
    has(
        err(irfft(&x, None, 0, FftNorm::Backward)),
        &["irfftn", "pairs"],
    );
    has(
        err("sideways".parse::<FftNorm>().map(|_| x.clone())),
        &["backward", "sideways"],
    );
}
