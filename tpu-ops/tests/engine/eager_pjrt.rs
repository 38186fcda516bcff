//! Eager execution on a PJRT device: outputs stay on the device, compiled modules are cached per
//! (op, attributes, layouts, dtypes, device), views are read correctly, and errors name devices.

use crate::common::{pjrt, pjrt_at};
use tpu_ops::prelude::*;
use tpu_tensor::tpu_runtime::pjrt::testing::client_or_skip;
use tpu_tensor::{DType, Device, Error, Tensor};

/// 0, 1, 2, ... in `shape` and `dtype` on the CPU.
fn counting(shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::arange(0, n as i64, 1, dtype, &Device::cpu())
        .unwrap()
        .reshape(shape)
        .unwrap()
}

#[test]
fn ops_run_on_the_device_and_the_cache_is_reused() {
    let Some(dev) = pjrt_at("ops_run_on_the_device_and_the_cache_is_reused", 2) else {
        return;
    };
    let x = counting(&[2, 3], DType::F32);
    let xd = x.to_device(&dev).unwrap();
    let before = tpu_ops::cache_stats();
    let y = xd.mul(2.0).unwrap().add(&xd).unwrap();
    assert_eq!(y.device(), &dev);
    assert_eq!(y.to_vec::<f32>().unwrap(), [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]);
    let mid = tpu_ops::cache_stats();
    assert!(mid.misses >= before.misses);
    // The same ops on the same shapes again: only cache hits. The counters are process-wide and
    // other tests of this binary compile programs meanwhile, so repeat until a round saw no
    // compilation at all: a round whose own ops missed the cache never could.
    let mut quiet_round = false;
    for _ in 0..100 {
        let mid = tpu_ops::cache_stats();
        let z = xd.mul(2.0).unwrap().add(&xd).unwrap();
        let after = tpu_ops::cache_stats();
        assert!(after.hits >= mid.hits + 2);
        assert!(after.entries > 0 && after.compile_time > std::time::Duration::ZERO);
        assert_eq!(z.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        if after.misses == mid.misses {
            quiet_round = true;
            break;
        }
    }
    assert!(
        quiet_round,
        "every repetition of the same ops compiled a program"
    );
    dev.synchronize().unwrap();
}

#[test]
fn strided_views_are_read_on_the_device() {
    let Some(dev) = pjrt_at("strided_views_are_read_on_the_device", 1) else {
        return;
    };
    let x = counting(&[2, 3, 4], DType::I64);
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
    let Some(dev) = pjrt("launch_blocking_waits_and_async_does_not_lose_results") else {
        return;
    };
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

// ---- zero-size tensors ------------------------------------------------------------------------

#[test]
fn ops_with_only_empty_outputs_run_no_program() {
    let Some(c) = client_or_skip("ops_with_only_empty_outputs_run_no_program") else {
        return;
    };
    // a = torch.zeros(0, 5, dtype=torch.int32).t()
    // torch.div(a, a, rounding_mode='trunc') -> tensor([], size=(5, 0), dtype=torch.int32)
    // a // a and torch.remainder(a, a) -> the same; likewise for int64 and uint8.
    // (XLA's compiler died with SIGFPE on this op: an integer division of empty constants.)
    for dev in [Device::cpu(), c.device(1).unwrap()] {
        for dt in [DType::I32, DType::I64, DType::U8] {
            let a = Tensor::zeros([0, 5], dt, &dev).unwrap().t().unwrap();
            for r in [a.div_trunc(&a), a.div_floor(&a), a.remainder(&a)] {
                let r = r.unwrap();
                assert_eq!(r.shape(), &[5, 0], "{dev} {dt}");
                assert_eq!(r.dtype(), dt);
                assert_eq!(r.device(), &dev);
                assert_eq!(
                    r.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
                    Vec::<i64>::new()
                );
            }
        }
    }
}

/// Runs `f` on the CPU and on `dev`; the results must agree (or both fail alike).
fn agree(what: &str, dev: &Device, f: impl Fn(&Device) -> tpu_tensor::Result<Vec<Tensor>>) {
    let want = f(&Device::cpu());
    let got = f(dev);
    match (want, got) {
        (Ok(w), Ok(g)) => {
            assert_eq!(w.len(), g.len(), "{what}");
            for (i, (w, g)) in w.iter().zip(&g).enumerate() {
                assert_eq!(g.device(), dev, "{what}");
                tpu_ops::testing::assert_close(&format!("{what} output {i}"), w, g, 1e-5).unwrap();
            }
        }
        (Err(w), Err(g)) => assert_eq!(w.to_string(), g.to_string(), "{what}"),
        (w, g) => panic!("{what}: cpu {:?}, {dev} {:?}", w.map(|_| ()), g.map(|_| ())),
    }
}

#[test]
fn zero_size_inputs_agree_with_the_cpu_in_every_family() {
    use tpu_ops::ops::conv::{ConvOptions, MaxPoolOptions};
    use tpu_ops::ops::movement::cat;
    use tpu_ops::ops::nn::functional as nnf;
    let Some(dev) = pjrt("zero_size_inputs_agree_with_the_cpu_in_every_family") else {
        return;
    };
    let z = |s: &[usize], dt: DType, d: &Device| Tensor::zeros(s.to_vec(), dt, d).unwrap();
    let o = |s: &[usize], dt: DType, d: &Device| Tensor::ones(s.to_vec(), dt, d).unwrap();
    for dt in [DType::F32, DType::I32, DType::BF16] {
        agree("unary", &dev, |d| Ok(vec![z(&[3, 0], dt, d).t()?.abs()?]));
        agree("binary", &dev, |d| {
            Ok(vec![z(&[0, 3], dt, d).t()?.maximum(&z(&[3, 1], dt, d))?])
        });
        agree("sum of a transposed empty", &dev, |d| {
            Ok(vec![z(&[0, 5], dt, d).t()?.sum(&[1], false)?])
        });
        agree("prod over an empty dim", &dev, |d| {
            Ok(vec![z(&[0, 5], dt, d).prod(&[0], false)?])
        });
        agree("max_dim of an empty", &dev, |d| {
            let (v, i) = z(&[0, 5], dt, d).max_dim(1, false)?;
            Ok(vec![v, i])
        });
        agree("cumsum", &dev, |d| Ok(vec![z(&[0, 5], dt, d).cumsum(0)?]));
        agree("matmul over k = 0", &dev, |d| {
            Ok(vec![z(&[2, 0], dt, d).matmul(&z(&[0, 3], dt, d))?])
        });
        agree("sort", &dev, |d| {
            let (v, i) = z(&[3, 0], dt, d).sort(1, true, true)?;
            Ok(vec![v, i])
        });
        agree("topk of none", &dev, |d| {
            let (v, i) = o(&[3, 4], dt, d).topk(0, 1, true, true)?;
            Ok(vec![v, i])
        });
        agree("cat with an empty view", &dev, |d| {
            Ok(vec![cat(
                &[&z(&[0, 3], dt, d).t()?, &o(&[3, 2], dt, d)],
                1,
            )?])
        });
        agree("gather of an empty index", &dev, |d| {
            Ok(vec![o(&[3], dt, d).gather(0, &z(&[0], DType::I64, d))?])
        });
        agree("repeat zero times", &dev, |d| {
            Ok(vec![o(&[2, 2], dt, d).repeat(&[0, 3])?])
        });
    }
    for dt in [DType::F32, DType::BF16] {
        // What, the input's shape, the weight's.
        let convs: [(&str, [usize; 4], [usize; 4]); 2] = [
            ("conv2d of no images", [0, 2, 5, 5], [3, 2, 3, 3]),
            ("conv2d without input channels", [1, 0, 5, 5], [3, 0, 3, 3]),
        ];
        for (what, xs, ws) in convs {
            agree(what, &dev, |d| {
                let (w, b) = (o(&ws, dt, d), o(&[3], dt, d));
                Ok(vec![z(&xs, dt, d).conv2d(
                    &w,
                    Some(&b),
                    &ConvOptions::new(),
                )?])
            });
        }
        agree("max_pool2d of no images", &dev, |d| {
            Ok(vec![
                z(&[0, 2, 4, 4], dt, d).max_pool2d(&MaxPoolOptions::new(2))?,
            ])
        });
        agree("softmax of no rows", &dev, |d| {
            Ok(vec![z(&[0, 3], dt, d).softmax(1)?])
        });
        agree("layer_norm of no rows", &dev, |d| {
            Ok(vec![z(&[0, 4], dt, d).layer_norm(&[4])?])
        });
        // F.cross_entropy(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)) -> nan
        agree("cross_entropy of no samples", &dev, |d| {
            Ok(vec![nnf::cross_entropy(
                &z(&[0, 3], dt, d),
                &z(&[0], DType::I64, d),
            )?])
        });
    }
    // Both fail alike: max of an empty extent has no identity.
    agree("amax over an empty dim", &dev, |d| {
        Ok(vec![z(&[0, 5], DType::F32, d).amax(&[0, 1], false)?])
    });
}

#[test]
fn writes_into_views_run_on_the_device_as_on_the_cpu() {
    let Some(dev) = pjrt("writes_into_views_run_on_the_device_as_on_the_cpu") else {
        return;
    };
    let run = |d: &Device| {
        let t = counting(&[3, 4], DType::F32).to_device(d).unwrap();
        let alias = t.clone();
        // A row, a transposed block, a broadcast scalar and a column through a narrowed view.
        t.select(0, 1).unwrap().fill_(-1.0).unwrap();
        let block = Tensor::new([[10.0f32, 11.0], [12.0, 13.0]], d).unwrap();
        t.narrow(1, 2, 2)
            .unwrap()
            .narrow(0, 0, 2)
            .unwrap()
            .t()
            .unwrap()
            .copy_(&block)
            .unwrap();
        t.narrow(0, 2, 1)
            .unwrap()
            .select(1, 0)
            .unwrap()
            .copy_(&Tensor::scalar(7.0f32, d).unwrap())
            .unwrap();
        alias.to_vec::<f32>().unwrap()
    };
    let cpu = run(&Device::cpu());
    assert_eq!(
        cpu,
        [
            0.0, 1.0, 10.0, 12.0, -1.0, -1.0, 11.0, 13.0, 7.0, 9.0, 10.0, 11.0
        ]
    );
    assert_eq!(run(&dev), cpu);
}
