//! Eager execution on a PJRT device: outputs stay on the device, compiled modules are cached per
//! (op, attributes, layouts, dtypes, device), views are read correctly, and errors name devices.

use tpu_ops::prelude::*;
use tpu_tensor::tpu_runtime::pjrt::testing::client_or_skip;
use tpu_tensor::{DType, Device, Error, Tensor};

#[test]
fn ops_run_on_the_device_and_the_cache_is_reused() {
    let Some(c) = client_or_skip("ops_run_on_the_device_and_the_cache_is_reused") else {
        return;
    };
    let dev = c.device(2).unwrap();
    let x = Tensor::arange(0, 6, 1, DType::F32, &Device::cpu())
        .unwrap()
        .reshape([2, 3])
        .unwrap();
    let xd = x.to_device(&dev).unwrap();
    let before = tpu_ops::cache_stats();
    let y = xd.mul(2.0).unwrap().add(&xd).unwrap();
    assert_eq!(y.device(), &dev);
    assert_eq!(y.to_vec::<f32>().unwrap(), [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]);
    let mid = tpu_ops::cache_stats();
    assert!(mid.misses >= before.misses);
    // The same ops on the same shapes again: only cache hits.
    let z = xd.mul(2.0).unwrap().add(&xd).unwrap();
    let after = tpu_ops::cache_stats();
    assert_eq!(after.misses, mid.misses);
    assert!(after.hits >= mid.hits + 2);
    assert!(after.entries > 0 && after.compile_time > std::time::Duration::ZERO);
    assert_eq!(z.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
    dev.synchronize().unwrap();
}

#[test]
fn strided_views_are_read_on_the_device() {
    let Some(c) = client_or_skip("strided_views_are_read_on_the_device") else {
        return;
    };
    let dev = c.device(1).unwrap();
    let x = Tensor::arange(0, 24, 1, DType::I64, &Device::cpu())
        .unwrap()
        .reshape([2, 3, 4])
        .unwrap();
    let xd = x.to_device(&dev).unwrap();
    let views = [
        (
            x.permute([2, 0, 1]).unwrap(),
            xd.permute([2, 0, 1]).unwrap(),
        ),
        (x.slice(2, 1.., 2).unwrap(), xd.slice(2, 1.., 2).unwrap()),
        (x.select(1, 2).unwrap(), xd.select(1, 2).unwrap()),
        (
            x.narrow(0, 1, 1).unwrap().expand([3, 3, 4]).unwrap(),
            xd.narrow(0, 1, 1).unwrap().expand([3, 3, 4]).unwrap(),
        ),
    ];
    for (h, d) in &views {
        let want = h.add(1).unwrap().to_vec::<i64>().unwrap();
        let got = d.add(1).unwrap();
        assert_eq!(got.device(), &dev);
        assert_eq!(got.to_vec::<i64>().unwrap(), want);
    }
    // Casts and copies of views happen on the device too.
    let t = xd.t_view();
    assert_eq!(t.to(DType::F32).unwrap().device(), &dev);
    assert_eq!(
        t.contiguous().unwrap().to_vec::<i64>().unwrap(),
        x.permute([2, 1, 0]).unwrap().to_vec::<i64>().unwrap()
    );
}

trait TView {
    fn t_view(&self) -> Tensor;
}

impl TView for Tensor {
    fn t_view(&self) -> Tensor {
        self.permute([2, 1, 0]).unwrap()
    }
}

#[test]
fn mixed_devices_are_an_error_naming_both() {
    let Some(c) = client_or_skip("mixed_devices_are_an_error_naming_both") else {
        return;
    };
    let a = Tensor::ones([2], DType::F32, &c.device(0).unwrap()).unwrap();
    let b = Tensor::ones([2], DType::F32, &c.device(3).unwrap()).unwrap();
    let e = a.add(&b).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }));
    let text = e.to_string();
    assert!(text.contains("pjrt:0") && text.contains("pjrt:3"), "{text}");
    let h = Tensor::ones([2], DType::F32, &Device::cpu()).unwrap();
    let text = a.mul(&h).unwrap_err().to_string();
    assert!(text.contains("pjrt:0") && text.contains("cpu"), "{text}");
}

#[test]
fn launch_blocking_waits_and_async_does_not_lose_results() {
    let Some(c) = client_or_skip("launch_blocking_waits_and_async_does_not_lose_results") else {
        return;
    };
    let dev = c.device(0).unwrap();
    let x = Tensor::ones([64, 64], DType::F32, &dev).unwrap();
    let mut y = x.clone();
    for _ in 0..20 {
        y = y.add(&x).unwrap();
    }
    dev.synchronize().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap()[0], 21.0);
    tpu_ops::set_launch_blocking(true);
    assert!(tpu_ops::launch_blocking());
    let z = y.exp().unwrap();
    tpu_ops::set_launch_blocking(false);
    assert!(z.to_vec::<f32>().unwrap()[0] > 1e9);
    // Errors found when the shape rule runs are reported at the call in either mode.
    let e = y
        .add(&Tensor::ones([3], DType::F32, &dev).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("[64, 64]") && e.contains("[3]"), "{e}");
}
