//! Tensors shared across threads, and the memory limit seen through tensors.

use std::sync::Arc;

use tpu_runtime::{CpuOptions, Error};
use tpu_tensor::{DType, Device, Generator, Tensor};

#[test]
fn tensors_are_send_sync_and_shareable() {
    fn check<T: Send + Sync + Clone>() {}
    check::<Tensor>();
    check::<Device>();
    let base = Tensor::arange(0, 1000, 1, DType::I64, &Device::cpu())
        .unwrap()
        .reshape([10, 100])
        .unwrap();
    let shared = Arc::new(base.clone());
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let t = base.clone();
            let s = Arc::clone(&shared);
            std::thread::spawn(move || {
                let row = t.select(0, i).unwrap().to_vec::<i64>().unwrap();
                let col = s
                    .t()
                    .unwrap()
                    .select(0, i)
                    .unwrap()
                    .to_vec::<i64>()
                    .unwrap();
                (row[0], col[9])
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let (r, c) = h.join().unwrap();
        assert_eq!((r, c), (i as i64 * 100, 900 + i as i64));
    }
}

#[test]
fn out_of_memory_then_recovers() {
    let dev = Device::new_cpu(&CpuOptions {
        num_threads: Some(1),
        memory_limit: Some(1 << 20),
    })
    .unwrap();
    let a = Tensor::zeros([128, 1024], DType::F32, &dev).unwrap(); // 512 KiB
    let err = Tensor::zeros([256, 1024], DType::F32, &dev).unwrap_err();
    match &err {
        Error::OutOfMemory {
            requested,
            in_use,
            limit,
            ..
        } => assert_eq!(
            (*requested, *in_use, *limit),
            (1 << 20, 1 << 19, Some(1 << 20))
        ),
        other => panic!("expected OutOfMemory, got {other}"),
    }
    assert!(err.to_string().contains("limit 1048576 bytes"));
    // Views cost nothing; a copy is counted.
    let v = a.t().unwrap();
    assert_eq!(dev.memory_stats().unwrap().bytes_in_use, 1 << 19);
    assert!(v.contiguous().is_ok());
    drop((a, v));
    let stats = dev.memory_stats().unwrap();
    assert_eq!(stats.bytes_in_use, 0);
    assert_eq!(stats.peak_bytes_in_use, 1 << 20);
    dev.reset_peak().unwrap();
    assert_eq!(dev.memory_stats().unwrap().peak_bytes_in_use, 0);
    let b = Tensor::zeros([256, 1024], DType::F32, &dev).unwrap();
    assert_eq!(b.numel(), 1 << 18);
    dev.set_memory_limit(None).unwrap();
    let mut g = Generator::new(1);
    assert!(Tensor::rand([512, 1024], DType::F32, &dev, &mut g).is_ok());
}
