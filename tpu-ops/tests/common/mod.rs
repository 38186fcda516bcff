//! What the test binaries of tpu-ops share: the devices to run on, reading values back, seeded
//! inputs, and [`test_device!`], which runs one test body on every device as separate tests.
//! Helpers that the library's users may want too live in `tpu_ops::testing`.

// Each binary uses a part of this module.
#![allow(dead_code, unused_macros, unused_imports)]

use tpu_ops::testing::SplitMix;
use tpu_tensor::{DType, Device, Generator, Result, Tensor};

/// The native CPU device.
pub fn cpu() -> Device {
    Device::cpu()
}

/// The native CPU device, and PJRT device 0 when a plugin is found (in CI, where
/// `TPU_RS_REQUIRE_PJRT=1`, a missing plugin fails the test instead).
pub fn devices() -> Vec<Device> {
    tpu_ops::testing::devices("a test on every device")
}

/// PJRT device 0, or `None` after a line saying that `test` skips it; a plugin that loads but
/// has no device 0 fails the test rather than skipping it.
pub fn pjrt(test: &str) -> Option<Device> {
    pjrt_at(test, 0)
}

/// PJRT device `index` (the CPU plugin has several), or `None` after a line saying that `test`
/// skips it; a plugin that loads but lacks that device fails the test.
pub fn pjrt_at(test: &str, index: usize) -> Option<Device> {
    tpu_tensor::tpu_runtime::pjrt::testing::client_or_skip(test).map(|c| c.device(index).unwrap())
}

/// Asserts that `got` and `want` agree elementwise within `tol`, absolute plus relative to
/// `want`; NaN matches NaN.
pub fn check_near(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs());
        assert!(
            ok,
            "{what}: element {i}: got {g}, want {w} (tolerance {tol})"
        );
    }
}

/// Whether `got` stands for `want`: NaN for NaN, the same infinity for an infinity, and within
/// `tol` of a finite value (the library's own rule for IEEE results).
pub use tpu_ops::testing::matches_ieee as agrees;

/// [`tpu_ops::testing::gradcheck`] with step `eps` and tolerance `tol`, failing the test on a
/// mismatch.
pub fn gradcheck_or_panic(
    what: &str,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    eps: f64,
    tol: f64,
) {
    if let Err(e) = tpu_ops::testing::gradcheck(what, f, inputs, eps, tol) {
        panic!("{e}");
    }
}

/// `v` (row-major) as an f32 tensor of `shape` on `dev`.
pub fn f32s(v: &[f64], shape: &[usize], dev: &Device) -> Tensor {
    Tensor::from_slice(v, shape, &cpu())
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

/// Asserts that an error message names every one of `parts`.
pub fn has(msg: String, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "{msg:?} does not mention {p:?}");
    }
}

/// The values of `t` (on any device, of any dtype) as f64, in row-major order.
pub fn vals(t: &Tensor) -> Vec<f64> {
    t.to_device(&cpu())
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
}

/// Standard normal f64 values of `shape` on the CPU, from generator seed `seed`.
pub fn randn(seed: u64, shape: &[usize]) -> Tensor {
    Generator::new(seed)
        .randn(shape, DType::F64, &cpu())
        .unwrap()
}

/// An f64 tensor of `shape` whose element `i` is `((i * a mod m) - off) / div`: distinct,
/// exactly representable values in a scrambled order, without a generator.
pub fn seq(shape: &[usize], a: usize, m: usize, off: f64, div: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| ((i * a % m) as f64 - off) / div).collect();
    Tensor::from_vec(v, shape, &cpu()).unwrap()
}

/// splitmix64 ([`SplitMix`]), for shapes, index values and choices derived from one proptest
/// seed. Every draw takes one step of the stream (even `range(n, n)`), so a seed always gives
/// the same sequence of cases.
pub struct Rng(SplitMix);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix(seed))
    }

    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number in `0..n` (0 when `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    /// `n` whole numbers in `0..high`, as f64.
    pub fn values(&mut self, n: usize, high: usize) -> Vec<f64> {
        (0..n).map(|_| self.below(high) as f64).collect()
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    pub fn coin(&mut self) -> bool {
        self.next().is_multiple_of(2)
    }

    /// A shape of `rank` dims, each in `lo..=hi`.
    pub fn shape(&mut self, rank: usize, lo: usize, hi: usize) -> Vec<usize> {
        (0..rank).map(|_| self.range(lo, hi)).collect()
    }

    /// `0..n` in random order.
    pub fn perm(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            p.swap(i, self.range(0, i));
        }
        p
    }
}

/// The number of elements of `shape`.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// `test_device!(name, |dev| { ... })` defines the module `name` with the tests `name::on_cpu`
/// and `name::on_pjrt`, each running the body with `dev: Device` set to that device. The PJRT test
/// skips with a message when no plugin is found, and fails instead in CI. Doc comments before
/// the name document the module.
macro_rules! test_device {
    ($(#[$m:meta])* $name:ident, |$dev:ident| $body:block) => {
        $(#[$m])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn body($dev: tpu_tensor::Device) $body

            #[test]
            fn on_cpu() {
                body(tpu_tensor::Device::cpu())
            }

            #[test]
            fn on_pjrt() {
                if let Some(d) = tpu_ops::testing::pjrt_device(module_path!()) {
                    body(d)
                }
            }
        }
    };
}
pub(crate) use test_device;

/// Sees every op and lets it run as usual: while it watches, no fast path may skip dispatch, so
/// the general path computes.
pub struct Watch;

impl tpu_ops::DispatchHook for Watch {
    fn dispatch(
        &self,
        _: &dyn tpu_ops::OpDef,
        _: &[&Tensor],
        _: &[tpu_ops::Meta],
    ) -> Option<tpu_tensor::Result<Vec<Tensor>>> {
        None
    }
}

/// The bits of every element, widened to f64 exactly (NaN payloads kept), for comparisons
/// that must be exact.
pub fn bits(t: &Tensor) -> Vec<u64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// `f` computed by the small-tensor fast paths and by the general path: the same dtype, shape
/// and bits (NaNs included), or an error from both.
pub fn same_as_general(what: &str, f: impl Fn() -> tpu_tensor::Result<Tensor>) {
    let fast = f();
    let slow = tpu_ops::with_dispatch_hook(std::sync::Arc::new(Watch), &f);
    match (fast, slow) {
        (Ok(a), Ok(b)) => {
            assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()), "{what}");
            assert_eq!(bits(&a), bits(&b), "{what}");
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!(
            "{what}: fast path {:?}, general path {:?}",
            a.err(),
            b.err()
        ),
    }
}
