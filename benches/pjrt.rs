//! PJRT runtime overheads on XLA's CPU plugin: execute-and-wait latency of a 4-element add, and
//! host-to-device / device-to-host bandwidth for 64 MiB.
//!
//! `cargo bench --bench pjrt`; `benches/pjrt_pypjrt.py` measures the same operations through
//! pypjrt for comparison (see benches/README.md).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tpu_rs::tpu_runtime::pjrt::{Client, OptionValue, find_pjrt_plugin};
use tpu_rs::tpu_runtime::{DType, PjrtBuffer};

const ADD: &str = r#"module @add4 {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}"#;

const BIG: usize = 64 << 20;

fn client() -> Option<Client> {
    match find_pjrt_plugin() {
        Ok(path) => Some(
            Client::create(path, &[("cpu_device_count".into(), OptionValue::Int(1))])
                .expect("the PJRT plugin failed to create a client"),
        ),
        Err(e) => {
            eprintln!("skipped: PJRT benchmarks: {e}");
            None
        }
    }
}

fn bench(c: &mut Criterion) {
    let Some(client) = client() else { return };
    let exe = client.compile_for_device(ADD, 0).unwrap();
    let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let a = PjrtBuffer::from_host(&client, 0, DType::F32, &[4], &bytes).unwrap();
    let b = PjrtBuffer::from_host(&client, 0, DType::F32, &[4], &bytes).unwrap();

    let mut g = c.benchmark_group("pjrt_cpu");
    g.bench_function("execute_and_wait_add4", |bench| {
        bench.iter(|| {
            let out = exe.execute(&[&a, &b]).unwrap();
            out[0].wait_ready().unwrap();
            out
        })
    });

    let host = vec![7u8; BIG];
    g.throughput(Throughput::Bytes(BIG as u64));
    g.sample_size(20);
    g.bench_function("host_to_device_64MiB", |bench| {
        bench.iter(|| PjrtBuffer::from_host(&client, 0, DType::F32, &[BIG / 4], &host).unwrap())
    });
    let on_device = PjrtBuffer::from_host(&client, 0, DType::F32, &[BIG / 4], &host).unwrap();
    let mut back = vec![0u8; BIG];
    g.bench_function("device_to_host_64MiB", |bench| {
        bench.iter(|| on_device.copy_to_host(&mut back).unwrap())
    });
    g.finish();
    assert_eq!(back, host);
}

criterion_group!(benches, bench);
criterion_main!(benches);
