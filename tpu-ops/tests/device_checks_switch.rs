//! The device-check switch, and which ops compile at all. One test in a binary of its own: the
//! switch is process-wide and the tests of one binary run in parallel threads, so a test that
//! flips it would change what the others check; the compile figures are process-wide too.

use tpu_ops::prelude::*;
use tpu_ops::{ENV_DEVICE_CHECKS, cache_stats, device_checks, set_device_checks};
use tpu_tensor::tpu_runtime::pjrt::testing::client_or_skip;
use tpu_tensor::{DType, Device, Error, Tensor};

fn i64s(t: &Tensor) -> Vec<i64> {
    t.to_device(&Device::cpu())
        .unwrap()
        .to_vec::<i64>()
        .unwrap()
}

fn on(v: &[i64], dev: &Device) -> Tensor {
    Tensor::from_slice(v, [v.len()], &Device::cpu())
        .unwrap()
        .to_device(dev)
        .unwrap()
}

#[test]
fn switching_checks_off_skips_them_and_on_restores_them() {
    let Some(c) = client_or_skip("switching_checks_off_skips_them_and_on_restores_them") else {
        return;
    };
    let dev = c.device(0).unwrap();
    let default = std::env::var(ENV_DEVICE_CHECKS).map_or(true, |v| v.trim() != "0");
    assert_eq!(device_checks(), default);
    set_device_checks(true);

    // x = torch.tensor([10, 20, 30]); x.gather(0, torch.tensor([5, -1])) -> RuntimeError:
    //   index 5 is out of bounds for dimension 0 with size 3
    let x = on(&[10, 20, 30], &dev);
    let bad = on(&[5, -1], &dev);
    let gather_fails = || {
        assert!(matches!(
            x.gather(0, &bad),
            Err(Error::IndexOutOfRange { index: 5, .. })
        ));
    };
    gather_fails();
    let before = cache_stats();

    // Off: no error, and what the switch's documentation says XLA does.
    set_device_checks(false);
    assert!(!device_checks());
    assert_eq!(i64s(&x.gather(0, &bad).unwrap()), [30, 10], "clamped");
    assert_eq!(i64s(&x.index_select(0, &bad).unwrap()), [30, 10]);
    let z = Tensor::zeros([3], DType::I64, &dev).unwrap();
    let s = on(&[1, 2], &dev);
    assert_eq!(
        i64s(&z.scatter(0, &on(&[0, 3], &dev), &s).unwrap()),
        [1, 0, 0],
        "dropped"
    );
    assert_eq!(
        i64s(&z.scatter_add(0, &on(&[-1, 2], &dev), &s).unwrap()),
        [0, 0, 2]
    );
    assert_eq!(
        i64s(&on(&[3, 1], &dev).one_hot(3).unwrap()),
        [0, 0, 0, 0, 1, 0]
    );
    let num = on(&[7, -7], &dev);
    let zero = on(&[0, 0], &dev);
    assert_eq!(i64s(&num.div_trunc(&zero).unwrap()), [-1, -1]);
    assert_eq!(i64s(&num.remainder(&zero).unwrap()), [7, -7]);
    // The CPU kernels check whatever the switch says.
    let cpu = Device::cpu();
    assert!(on(&[10, 20, 30], &cpu).gather(0, &on(&[5], &cpu)).is_err());

    // On again: the checked programs compiled before are found in the cache.
    set_device_checks(true);
    gather_fails();
    let after = cache_stats();
    assert!(after.hits > before.hits);

    // Ops whose outputs are all empty compile nothing, checks on or off; their outputs are
    // empty buffers on the device.
    // a = torch.zeros(0, 5, dtype=torch.int64).t(); a // a -> tensor([], size=(5, 0))
    for checks in [true, false] {
        set_device_checks(checks);
        let a = Tensor::zeros([0, 5], DType::I64, &dev)
            .unwrap()
            .t()
            .unwrap();
        let before = cache_stats();
        let r = a.div_floor(&a).unwrap();
        let (m, e) = a.max_dim(0, false).unwrap();
        let g = x
            .gather(0, &Tensor::zeros([0], DType::I64, &dev).unwrap())
            .unwrap();
        let after = cache_stats();
        assert_eq!(after.misses, before.misses, "checks {checks}");
        assert_eq!(after.compile_time, before.compile_time);
        assert_eq!((r.shape(), r.device()), (&[5, 0][..], &dev));
        assert_eq!((m.shape(), e.dtype()), (&[0][..], DType::I64));
        assert_eq!((g.shape(), g.dtype()), (&[0][..], DType::I64));
    }
    set_device_checks(default);
}
