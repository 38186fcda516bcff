//! Huge sizes are errors, never aborts: creation, random numbers, views, reading back and
//! transfers, with sizes near and past the limit of a small CPU device, past any machine's
//! memory on PJRT devices, and past the address space (element counts that overflow). Fill
//! values that do not fit the dtype are refused as PyTorch refuses them.
//!
//! The property tests run a few cases by default; `PROPTEST_CASES` sets how many.

use proptest::prelude::*;
use tpu_runtime::pjrt::testing::client_or_skip;
use tpu_tensor::tpu_runtime::CpuOptions;
use tpu_tensor::{DType, Device, Error, Generator, Result, Tensor};

/// The limit of the small CPU devices: a power of two, so that a request of at most this many
/// bytes never rounds up past it.
const LIMIT: usize = 4 << 20;

fn config(ci_cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ci_cases);
    ProptestConfig::with_cases(cases)
}

fn limited() -> Device {
    Device::new_cpu(&CpuOptions {
        num_threads: Some(1),
        memory_limit: Some(LIMIT),
    })
    .unwrap()
}

fn pjrt(test: &str) -> Option<Device> {
    client_or_skip(test).map(|c| c.device(0).unwrap())
}

fn is_oom<T>(r: &Result<T>) -> bool {
    matches!(r, Err(Error::OutOfMemory { .. }))
}

fn is_shape<T>(r: &Result<T>) -> bool {
    matches!(r, Err(Error::Shape { .. }))
}

/// One creation function, applied to a 1-D size `n` (2-D `n x m` for `eye`).
#[derive(Clone, Copy, Debug)]
enum Create {
    Zeros,
    Ones,
    Full,
    Arange,
    Linspace,
    Eye,
    Rand,
    Randn,
    Randint,
}

const CREATE: [Create; 9] = [
    Create::Zeros,
    Create::Ones,
    Create::Full,
    Create::Arange,
    Create::Linspace,
    Create::Eye,
    Create::Rand,
    Create::Randn,
    Create::Randint,
];

impl Create {
    /// Creates the tensor; for `Eye`, `n` is split into `rows x cols` with `rows` = `split`.
    fn run(self, n: usize, split: usize, dtype: DType, d: &Device) -> Result<Tensor> {
        let mut g = Generator::new(5);
        match self {
            Create::Zeros => Tensor::zeros([n], dtype, d),
            Create::Ones => Tensor::ones([n], dtype, d),
            Create::Full => Tensor::full([n], 3, dtype, d),
            Create::Arange => Tensor::arange(0, n as i64, 1, dtype, d),
            Create::Linspace => Tensor::linspace(0.0, 1.0, n, dtype, d),
            Create::Eye => Tensor::eye(split.max(1), Some(n / split.max(1)), dtype, d),
            Create::Rand => Tensor::rand([n], dtype, d, &mut g),
            Create::Randn => Tensor::randn([n], dtype, d, &mut g),
            Create::Randint => Tensor::randint(0, 7, [n], dtype, d, &mut g),
        }
    }

    /// The shape it makes for `n` and `split`.
    fn shape(self, n: usize, split: usize) -> Vec<usize> {
        match self {
            Create::Eye => vec![split.max(1), n / split.max(1)],
            _ => vec![n],
        }
    }

    /// The elements it makes for `n` and `split` (small sizes only).
    fn numel(self, n: usize, split: usize) -> usize {
        self.shape(n, split).iter().product()
    }

    /// True when the shape's bytes can be counted: every size and the element count fit an
    /// i64, and the bytes a usize. Such sizes are out-of-memory errors; others shape errors.
    fn countable(self, n: usize, split: usize, dtype: DType) -> bool {
        self.shape(n, split)
            .iter()
            .try_fold(1usize, |a, &d| {
                a.checked_mul(d).filter(|_| d <= i64::MAX as usize)
            })
            .filter(|&n| n <= i64::MAX as usize)
            .and_then(|n| n.checked_mul(dtype.size_in_bytes()))
            .is_some()
    }

    /// Checks the result of a creation far past the limit: out of memory while the bytes can be
    /// counted, a shape (or argument) error after.
    fn check_past_the_limit(
        self,
        r: &Result<Tensor>,
        n: usize,
        split: usize,
        dtype: DType,
    ) -> Result<(), TestCaseError> {
        let err = r.as_ref().err();
        if self.countable(n, split, dtype) {
            prop_assert!(is_oom(r), "{:?} {} x {}: {:?}", self, n, dtype, err);
        } else {
            prop_assert!(
                matches!(r, Err(Error::Shape { .. } | Error::InvalidArgument { .. })),
                "{:?} {} x {}: {:?}",
                self,
                n,
                dtype,
                err
            );
        }
        Ok(())
    }

    fn dtype(self, pick: usize) -> DType {
        const FLOATS: [DType; 3] = [DType::F32, DType::F64, DType::BF16];
        const ANY: [DType; 5] = [DType::F32, DType::I64, DType::U8, DType::F16, DType::I32];
        match self {
            Create::Rand | Create::Randn | Create::Linspace => FLOATS[pick % FLOATS.len()],
            _ => ANY[pick % ANY.len()],
        }
    }
}

/// A creation function and a dtype it accepts.
fn creation() -> impl Strategy<Value = (Create, DType)> {
    (0..CREATE.len(), 0usize..8)
        .prop_map(|(which, pick)| (CREATE[which], CREATE[which].dtype(pick)))
}

proptest! {
    #![proptest_config(config(24))]

    /// On a device with a small limit, sizes just under the limit succeed and sizes past it are
    /// out-of-memory errors; the device is left with nothing in use either way.
    #[test]
    fn creation_near_a_small_limit(
        (op, dtype) in creation(),
        delta in -4096i64..4096,
        split in 1usize..64,
    ) {
        let size = dtype.size_in_bytes();
        let n = ((LIMIT / size) as i64 + delta).max(1) as usize;
        let d = limited();
        let bytes = op.numel(n, split) * size;
        let r = op.run(n, split, dtype, &d);
        if bytes <= LIMIT {
            let t = r.unwrap();
            prop_assert_eq!(t.numel(), op.numel(n, split));
        } else {
            prop_assert!(is_oom(&r), "{:?} {} x {}: {:?}", op, n, dtype, r.err());
        }
        prop_assert_eq!(d.memory_stats().unwrap().bytes_in_use, 0);
    }

    /// Far past the limit, up to the largest sizes a shape can name, and past what a shape can
    /// name: out-of-memory errors while the bytes can be counted, shape errors after.
    #[test]
    fn creation_far_past_the_limit(
        (op, dtype) in creation(),
        log2 in 23u32..64,
        frac in any::<u64>(),
        split in 1usize..64,
    ) {
        // A size between 2^log2 and 2^(log2 + 1), past the limit in elements.
        let n = (1usize << log2) | (frac as usize & ((1usize << log2) - 1));
        let d = limited();
        let r = op.run(n, split, dtype, &d);
        op.check_past_the_limit(&r, n, split, dtype)?;
        prop_assert_eq!(d.memory_stats().unwrap().bytes_in_use, 0);
    }

    /// Shapes whose element count overflows (such as `[2^32, 2^32, 16]`) are shape errors for
    /// creation, for views that would cost nothing (`expand`), and on every device.
    #[test]
    fn overflowing_shapes_are_shape_errors(
        a in 20u32..40,
        b in 20u32..40,
        c in 1usize..64,
    ) {
        let shape = [1usize << a, 1usize << b, c << 64u32.saturating_sub(a + b)];
        prop_assume!(
            shape.iter().try_fold(1usize, |x, &y| x.checked_mul(y)).is_none_or(|n| n > i64::MAX as usize)
        );
        let d = limited();
        prop_assert!(is_shape(&Tensor::zeros(shape, DType::U8, &d)));
        prop_assert!(is_shape(&Tensor::full(shape, 1.5, DType::F32, &d)));
        prop_assert!(is_shape(&Tensor::randn(shape, DType::F32, &d, &mut Generator::new(0))));
        let one = Tensor::ones([1, 1, 1], DType::F32, &d).unwrap();
        prop_assert!(is_shape(&one.expand(shape)));
        prop_assert!(is_shape(&one.as_strided(&shape, &[0, 0, 0], 0)));
    }

    /// A cheap view of many elements (`expand`) cannot be gathered, copied or moved past the
    /// limit: out-of-memory errors on this device, on another CPU device and in host memory.
    #[test]
    fn expanded_views_past_the_limit(log2 in 23u32..62, pick in 0usize..3) {
        let dtype = [DType::F32, DType::U8, DType::F64][pick];
        let n = 1usize << log2;
        let d = limited();
        let v = Tensor::ones([1], dtype, &d).unwrap().expand([n]).unwrap();
        let fits = n.checked_mul(dtype.size_in_bytes()).is_some();
        let expect = |r: &Result<Tensor>| if fits { is_oom(r) } else { is_shape(r) };
        prop_assert!(expect(&v.contiguous()), "{:?}", v.contiguous().err());
        prop_assert!(expect(&v.to_device(&limited())));
        // Reading back goes to host memory: refused when the host has too little.
        if n.saturating_mul(dtype.size_in_bytes()) > (1 << 50) {
            prop_assert!(v.to_host_bytes().is_err());
            if dtype == DType::U8 {
                prop_assert!(v.to_vec::<u8>().is_err());
            }
        }
        prop_assert_eq!(d.memory_stats().unwrap().bytes_in_use, 64);
    }
}

proptest! {
    #![proptest_config(config(12))]

    /// On a PJRT device, sizes past any machine's memory (2^40 to 2^62 elements) are
    /// out-of-memory errors and larger ones shape errors, before any host memory is staged.
    #[test]
    fn pjrt_creation_past_any_memory(
        (op, dtype) in creation(),
        log2 in 40u32..64,
        split in 1usize..64,
    ) {
        let Some(d) = pjrt("pjrt_creation_past_any_memory") else {
            return Ok(());
        };
        let n = 1usize << log2;
        let r = op.run(n, split, dtype, &d);
        op.check_past_the_limit(&r, n, split, dtype)?;
    }

    /// Moving a cheap huge view to a PJRT device, or copying one there, is an error.
    #[test]
    fn pjrt_transfers_of_huge_views(log2 in 40u32..62) {
        let Some(d) = pjrt("pjrt_transfers_of_huge_views") else {
            return Ok(());
        };
        let v = Tensor::ones([1], DType::F32, &Device::cpu())
            .unwrap()
            .expand([1usize << log2])
            .unwrap();
        let r = v.to_device(&d);
        prop_assert!(is_oom(&r), "{:?}", r.err());
        let on = Tensor::ones([1], DType::F32, &d).unwrap().expand([1usize << log2]).unwrap();
        let r = on.to_device(&Device::cpu());
        prop_assert!(is_oom(&r), "{:?}", r.err());
    }
}

// ---- the reported cases ------------------------------------------------------------------------

const BIG: usize = 1 << 40;

#[test]
fn pjrt_creation_of_two_to_the_forty_elements_is_out_of_memory() {
    let Some(d) = pjrt("pjrt_creation_of_two_to_the_forty_elements_is_out_of_memory") else {
        return;
    };
    let mut g = Generator::new(0);
    let results = [
        Tensor::zeros([BIG], DType::F32, &d),
        Tensor::ones([BIG], DType::F32, &d),
        Tensor::full([BIG], 2.5, DType::F32, &d),
        Tensor::arange(0, BIG as i64, 1, DType::F32, &d),
        Tensor::linspace(0.0, 1.0, BIG, DType::F32, &d),
        Tensor::eye(1 << 20, None, DType::F32, &d),
        Tensor::randn([BIG], DType::F32, &d, &mut g),
    ];
    for r in results {
        match r {
            Err(Error::OutOfMemory {
                requested, what, ..
            }) => {
                assert_eq!(requested, 4 * BIG);
                assert!(what.starts_with("f32["), "{what}");
            }
            other => panic!("expected OutOfMemory, got {:?}", other.err()),
        }
    }
    // A failed draw leaves the generator where it was.
    assert_eq!(g.offset(), 0);
    assert!(Tensor::randn([4], DType::F32, &d, &mut g).is_ok());
    assert_eq!(g.offset(), 2);
}

#[test]
fn cpu_randn_of_two_to_the_forty_elements_is_out_of_memory() {
    let mut g = Generator::new(0);
    let e = Tensor::randn([BIG], DType::F32, &Device::cpu(), &mut g).unwrap_err();
    assert!(
        matches!(&e, Error::OutOfMemory { requested, .. } if *requested == 4 * BIG),
        "{e}"
    );
    assert_eq!(g.offset(), 0);
    let d = limited();
    let e = Tensor::randn([BIG], DType::F32, &d, &mut g).unwrap_err();
    match e {
        Error::OutOfMemory {
            device,
            requested,
            limit,
            ..
        } => assert_eq!((device, requested, limit), (d.name(), 4 * BIG, Some(LIMIT))),
        other => panic!("expected OutOfMemory, got {other}"),
    }
}

#[test]
fn huge_expanded_view_to_another_device_is_out_of_memory() {
    let cpu = Device::cpu();
    let v = Tensor::from_vec(vec![1f32], [1], &cpu)
        .unwrap()
        .expand([BIG])
        .unwrap();
    let other = Device::new_cpu(&CpuOptions::default()).unwrap();
    let e = v.to_device(&other).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    assert!(e.to_string().contains("f32[1099511627776]"), "{e}");
    assert_eq!(other.memory_stats().unwrap().bytes_in_use, 0);
    let e = v.to_device(&limited()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfMemory {
                limit: Some(LIMIT),
                ..
            }
        ),
        "{e}"
    );
    if let Some(p) = pjrt("huge_expanded_view_to_another_device_is_out_of_memory") {
        let e = v.to_device(&p).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
        assert!(e.to_string().contains("f32[1099511627776]"), "{e}");
    }
}

#[test]
fn a_pjrt_limit_is_applied_before_host_memory_is_staged() {
    let Some(c) = client_or_skip("a_pjrt_limit_is_applied_before_host_memory_is_staged") else {
        return;
    };
    let d = c.device(3).unwrap();
    d.set_memory_limit(Some(1 << 20)).unwrap();
    let e = Tensor::zeros([1 << 19], DType::F32, &d).unwrap_err();
    d.set_memory_limit(None).unwrap();
    match e {
        Error::OutOfMemory {
            device,
            requested,
            limit,
            ..
        } => assert_eq!(
            (device, requested, limit),
            (d.name(), 1 << 21, Some(1 << 20))
        ),
        other => panic!("expected OutOfMemory, got {other}"),
    }
}

#[test]
fn element_counts_past_i64_are_shape_errors_everywhere() {
    let shape = [1usize << 32, 1 << 32, 16];
    let mut devices = vec![Device::cpu(), limited()];
    devices.extend(pjrt("element_counts_past_i64_are_shape_errors_everywhere"));
    for d in &devices {
        assert!(is_shape(&Tensor::zeros(shape, DType::F32, d)), "{d}");
        assert!(is_shape(&Tensor::ones(shape, DType::U8, d)), "{d}");
        let one = Tensor::ones([1, 1, 1], DType::F32, d).unwrap();
        let e = one.expand(shape).unwrap_err();
        assert!(e.to_string().contains("too many elements"), "{e}");
    }
    // Bytes that overflow though the count does not.
    let d = limited();
    assert!(is_shape(&Tensor::zeros([1usize << 62], DType::F64, &d)));
}

// ---- fill values -------------------------------------------------------------------------------

#[test]
fn fill_values_that_do_not_fit_the_dtype_are_errors_on_every_device() {
    let mut devices = vec![Device::cpu()];
    devices.extend(pjrt(
        "fill_values_that_do_not_fit_the_dtype_are_errors_on_every_device",
    ));
    for d in &devices {
        // torch.full([2], 300, dtype=torch.uint8): "value cannot be converted to type uint8_t
        // without overflow".
        let e = Tensor::full([2], 300, DType::U8, d).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "full: value 300 cannot be converted to u8 without overflow"
        );
        for (v, dtype) in [
            (-0.5f64, DType::U8),
            (256.0, DType::U8),
            (128.0, DType::I8),
            (f64::NAN, DType::I32),
            (f64::INFINITY, DType::I64),
            (70000.0, DType::F16),
            (3.4e38, DType::BF16),
            (1e39, DType::F32),
        ] {
            let e = Tensor::full([2], v, dtype, d).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument { .. }),
                "{v} {dtype}: {e}"
            );
        }
        // torch.full([2], -1, dtype=torch.uint8) -> [255, 255]; 2.7 -> [2, 2]; bool takes
        // anything; floats take infinities and NaN.
        let t = Tensor::full([2], -1, DType::U8, d).unwrap();
        assert_eq!(t.to_vec::<u8>().unwrap(), [255, 255]);
        let t = Tensor::full([2], 255.9, DType::U8, d).unwrap();
        assert_eq!(t.to_vec::<u8>().unwrap(), [255, 255]);
        let t = Tensor::full([2], 2, DType::Bool, d).unwrap();
        assert_eq!(t.to_vec::<bool>().unwrap(), [true, true]);
        let t = Tensor::full([2], f64::INFINITY, DType::F16, d).unwrap();
        assert!(t.to_vec::<tpu_tensor::f16>().unwrap()[0].is_infinite());
        // Empty tensors still check the value, as PyTorch does.
        assert!(Tensor::full([0], 300, DType::U8, d).is_err());
        // fill_ and full_like go through the same check.
        let z = Tensor::zeros([2], DType::I8, d).unwrap();
        assert!(z.full_like(200).is_err());
        assert!(z.fill_(200).is_err());
    }
}

#[test]
fn linspace_checks_the_ends_it_writes() {
    let d = Device::cpu();
    // torch.linspace(0, 300, 4, dtype=torch.uint8) and (0, 1e5, 2, float16) raise; one step
    // writes only the start; no step writes nothing.
    assert!(Tensor::linspace(0.0, 300.0, 4, DType::U8, &d).is_err());
    assert!(Tensor::linspace(0.0, 1e5, 2, DType::F16, &d).is_err());
    assert!(Tensor::linspace(300.0, 0.0, 1, DType::U8, &d).is_err());
    let t = Tensor::linspace(0.0, 300.0, 1, DType::U8, &d).unwrap();
    assert_eq!(t.to_vec::<u8>().unwrap(), [0]);
    assert_eq!(
        Tensor::linspace(300.0, 0.0, 0, DType::U8, &d)
            .unwrap()
            .numel(),
        0
    );
}

#[test]
fn arange_of_integers_far_apart_does_not_overflow() {
    // Every value lies between the ends, even when `i * step` alone would pass i64.
    let d = Device::cpu();
    let t = Tensor::arange(-(1i64 << 62) * 2, i64::MAX, 1i64 << 62, DType::I64, &d).unwrap();
    assert_eq!(
        t.to_vec::<i64>().unwrap(),
        [i64::MIN, -(1 << 62), 0, 1 << 62]
    );
}
