//! The PJRT layer against a real plugin (XLA's CPU plugin, installed by
//! scripts/install-pjrt-cpu.sh). Without a plugin each test prints why it was skipped.

use std::sync::Arc;

use tpu_runtime::pjrt::testing::client_or_skip;
use tpu_runtime::pjrt::{
    Client, CompileOptions, OptionValue, find_pjrt_plugin, set_launch_blocking,
};
use tpu_runtime::{Buffer, DType, Device, DeviceKind, Error, MemorySource, PjrtBuffer, bf16, f16};

const ADD_MUL: &str = r#"module @add_mul {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    %1 = stablehlo.multiply %0, %a : tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}"#;

const DOT_REDUCE: &str = r#"module @dot_reduce {
  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>) -> (tensor<2x2xf32>, tensor<2xf32>) {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<2xf32>
    return %0, %1 : tensor<2x2xf32>, tensor<2xf32>
  }
}"#;

/// The shared client, or a return from the test (which `client_or_skip` reports as skipped).
macro_rules! client_or_return {
    ($test:literal) => {
        match client_or_skip($test) {
            Some(c) => c,
            None => return,
        }
    };
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn upload(c: &Client, dev: usize, v: &[f32], dims: &[usize]) -> PjrtBuffer {
    PjrtBuffer::from_host(c, dev, DType::F32, dims, &f32s(v)).unwrap()
}

#[test]
fn client_lists_four_cpu_devices() {
    let c = client_or_return!("client_lists_four_cpu_devices");
    assert_eq!(c.platform_name(), "cpu");
    assert_eq!(c.api_version(), (0, 115));
    assert_eq!(c.device_count(), 4);
    let devs = c.devices();
    assert_eq!(devs[2].name(), "pjrt:2");
    assert_eq!(devs[2].kind(), DeviceKind::Pjrt);
    assert_eq!(devs[2].platform(), "cpu");
    assert_ne!(devs[0], devs[1]);
    assert_eq!(devs[1], c.device(1).unwrap());
    let e = c.device(4).unwrap_err().to_string();
    assert!(e.contains("4 addressable devices"), "{e}");
    let info = c.device_info(3).unwrap();
    assert_eq!(info.kind, "cpu");
}

#[test]
fn every_dtype_round_trips_bit_exact_on_every_device() {
    let c = client_or_return!("every_dtype_round_trips_bit_exact_on_every_device");
    // 24 bytes fit every dtype's element size; bools must be 0/1.
    let raw: Vec<u8> = (0..24u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(11))
        .collect();
    for dtype in DType::ALL {
        let n = 24 / dtype.size_in_bytes();
        let bytes: Vec<u8> = if dtype == DType::Bool {
            raw.iter().map(|b| b & 1).collect()
        } else {
            raw.clone()
        };
        let bytes = &bytes[..n * dtype.size_in_bytes()];
        for dev in 0..4 {
            let b = PjrtBuffer::from_host(&c, dev, dtype, &[n], bytes).unwrap();
            assert_eq!(b.dtype(), dtype);
            assert_eq!(b.to_host().unwrap(), bytes, "{dtype} on pjrt:{dev}");
        }
    }
    // NaN payloads, -0.0 and subnormals survive too.
    let special = [
        f32::NAN,
        -0.0,
        f32::from_bits(1),
        f32::from_bits(0x7fc0_1234),
    ];
    let b = upload(&c, 0, &special, &[4]);
    let back = to_f32s(&b.to_host().unwrap());
    let bits: Vec<u32> = back.iter().map(|v| v.to_bits()).collect();
    assert_eq!(
        bits,
        special.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let h = [bf16::from_f32(1.5), bf16::NAN, bf16::NEG_INFINITY];
    let hb: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
    let b = PjrtBuffer::from_host(&c, 1, DType::BF16, &[3], &hb).unwrap();
    assert_eq!(b.to_host().unwrap(), hb);
    let g = [f16::from_f32(-2.25), f16::MIN_POSITIVE_SUBNORMAL];
    let gb: Vec<u8> = g.iter().flat_map(|v| v.to_le_bytes()).collect();
    let b = PjrtBuffer::from_host(&c, 2, DType::F16, &[1, 2], &gb).unwrap();
    assert_eq!((b.dims(), b.to_host().unwrap()), (&[1usize, 2][..], gb));
}

#[test]
fn sizes_are_checked_before_pjrt() {
    let c = client_or_return!("sizes_are_checked_before_pjrt");
    let e = PjrtBuffer::from_host(&c, 0, DType::F32, &[3], &[0u8; 8]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                expected: 12,
                given: 8,
                ..
            }
        ),
        "{e}"
    );
    let e = PjrtBuffer::from_host(&c, 9, DType::F32, &[1], &[0u8; 4]).unwrap_err();
    assert!(e.to_string().contains("pjrt:9"), "{e}");
    let e = PjrtBuffer::from_host(&c, 0, DType::Bool, &[2], &[1, 7]).unwrap_err();
    assert!(e.to_string().contains("0 or 1"), "{e}");
    let b = upload(&c, 0, &[1.0, 2.0], &[2]);
    let mut small = [0u8; 4];
    assert!(b.copy_to_host(&mut small).is_err());
    // Zero-sized arrays work.
    let z = PjrtBuffer::from_host(&c, 0, DType::F32, &[0, 3], &[]).unwrap();
    assert!(z.to_host().unwrap().is_empty());
}

#[test]
fn copy_between_devices() {
    let c = client_or_return!("copy_between_devices");
    let b = upload(&c, 0, &[1.0, 2.0, 3.0], &[3]);
    let moved = b.copy_to_device(3).unwrap();
    assert_eq!(moved.device_index(), 3);
    assert_eq!(moved.device(), c.device(3).unwrap());
    assert_eq!(to_f32s(&moved.to_host().unwrap()), [1.0, 2.0, 3.0]);
    // Through the device-neutral Buffer: PJRT -> PJRT, PJRT -> CPU, CPU -> PJRT.
    let buf = Buffer::Pjrt(moved);
    let on1 = buf.copy_to(&c.device(1).unwrap()).unwrap();
    let on_cpu = on1.copy_to(&Device::cpu()).unwrap();
    assert_eq!(to_f32s(on_cpu.host_bytes().unwrap()), [1.0, 2.0, 3.0]);
    let back = on_cpu.copy_to(&c.device(2).unwrap()).unwrap();
    assert_eq!(back.device().name(), "pjrt:2");
}

#[test]
fn compile_and_run_add_multiply() {
    let c = client_or_return!("compile_and_run_add_multiply");
    let exe = c.compile_for_device(ADD_MUL, 1).unwrap();
    assert_eq!(exe.num_outputs(), 1);
    assert_eq!(exe.devices(), &[1]);
    assert_eq!(exe.params().unwrap().len(), 2);
    let a = upload(&c, 1, &[1.0, 2.0, 3.0, 4.0], &[4]);
    let b = upload(&c, 1, &[10.0, 20.0, 30.0, 40.0], &[4]);
    let out = exe.execute(&[&a, &b]).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].dims(), &[4]);
    assert_eq!(
        to_f32s(&out[0].to_host().unwrap()),
        [11.0, 44.0, 99.0, 176.0]
    );
    c.device(1).unwrap().synchronize().unwrap();
    assert!(!exe.fingerprint().unwrap_or_default().is_empty() || exe.fingerprint().is_err());
}

#[test]
fn dot_general_reduce_and_two_outputs() {
    let c = client_or_return!("dot_general_reduce_and_two_outputs");
    let exe = c.compile_for_device(DOT_REDUCE, 0).unwrap();
    assert_eq!(exe.num_outputs(), 2);
    let a = upload(&c, 0, &[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let b = upload(&c, 0, &[1., 0., 0., 1., 1., 1.], &[3, 2]);
    let out = exe.execute(&[&a, &b]).unwrap();
    assert_eq!(out[0].dims(), &[2, 2]);
    assert_eq!(to_f32s(&out[0].to_host().unwrap()), [4., 5., 10., 11.]);
    assert_eq!(to_f32s(&out[1].to_host().unwrap()), [9., 21.]);
}

#[test]
fn one_executable_on_four_devices() {
    let c = client_or_return!("one_executable_on_four_devices");
    let exe = c.compile_replicated(ADD_MUL, &[0, 1, 2, 3]).unwrap();
    assert_eq!(exe.devices(), &[0, 1, 2, 3]);
    let inputs: Vec<(PjrtBuffer, PjrtBuffer)> = (0..4)
        .map(|d| {
            let s = d as f32;
            (
                upload(&c, d, &[s, s, s, s], &[4]),
                upload(&c, d, &[1.0, 2.0, 3.0, 4.0], &[4]),
            )
        })
        .collect();
    let args: Vec<Vec<&PjrtBuffer>> = inputs.iter().map(|(a, b)| vec![a, b]).collect();
    let outs = exe.execute_replicated(&args).unwrap();
    assert_eq!(outs.len(), 4);
    for (d, o) in outs.iter().enumerate() {
        let s = d as f32;
        assert_eq!(o[0].device_index(), d);
        let want: Vec<f32> = [1.0, 2.0, 3.0, 4.0].iter().map(|x| (s + x) * s).collect();
        assert_eq!(to_f32s(&o[0].to_host().unwrap()), want);
    }
    // Wrong number of argument lists.
    assert!(exe.execute_replicated(&args[..3]).is_err());
    assert!(exe.execute(&args[0]).is_err());
}

#[test]
fn portable_executable_runs_on_any_device() {
    let c = client_or_return!("portable_executable_runs_on_any_device");
    let exe = match c.compile_portable(ADD_MUL) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("note: the plugin does not build portable executables: {e}");
            return;
        }
    };
    for d in [0, 3] {
        let a = upload(&c, d, &[1.0, 1.0, 1.0, 1.0], &[4]);
        let out = exe.execute_on(d, &[&a, &a]).unwrap();
        assert_eq!(out[0].device_index(), d);
        assert_eq!(to_f32s(&out[0].to_host().unwrap()), [2.0; 4]);
    }
}

#[test]
fn bad_program_reports_xla_message() {
    let c = client_or_return!("bad_program_reports_xla_message");
    let bad = "module @broken {\n  func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n    %0 = stablehlo.frobnicate %a : tensor<4xf32>\n    return %0 : tensor<4xf32>\n  }\n}";
    let e = c.compile(bad, &CompileOptions::default()).unwrap_err();
    match &e {
        Error::Compile {
            message,
            program_head,
        } => {
            assert!(message.contains("frobnicate"), "XLA's message: {message}");
            assert!(program_head.starts_with("module @broken"));
        }
        other => panic!("expected a compile error, got {other}"),
    }
    let text = e.to_string();
    assert!(
        text.contains("the program begins:\nmodule @broken"),
        "{text}"
    );
    // A type error inside an otherwise valid module.
    let mismatch = "func.func public @main(%a: tensor<4xf32>, %b: tensor<3xf32>) -> tensor<4xf32> {\n  %0 = stablehlo.add %a, %b : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}";
    assert!(matches!(
        c.compile(mismatch, &CompileOptions::default()),
        Err(Error::Compile { .. })
    ));
}

#[test]
fn wrong_arguments_are_errors_not_crashes() {
    let c = client_or_return!("wrong_arguments_are_errors_not_crashes");
    let exe = c.compile_for_device(ADD_MUL, 0).unwrap();
    let a = upload(&c, 0, &[1.0, 2.0, 3.0, 4.0], &[4]);
    let e = exe.execute(&[&a]).unwrap_err().to_string();
    assert!(e.contains("expected 2 arguments, got 1"), "{e}");
    let short = upload(&c, 0, &[1.0, 2.0, 3.0], &[3]);
    let e = exe.execute(&[&a, &short]).unwrap_err().to_string();
    assert!(
        e.contains("argument 1: expected tensor<4xf32>, got tensor<3xf32>"),
        "{e}"
    );
    let ints = PjrtBuffer::from_host(&c, 0, DType::I32, &[4], &[0u8; 16]).unwrap();
    let e = exe.execute(&[&ints, &a]).unwrap_err().to_string();
    assert!(
        e.contains("expected tensor<4xf32>, got tensor<4xi32>"),
        "{e}"
    );
    let elsewhere = upload(&c, 2, &[1.0, 2.0, 3.0, 4.0], &[4]);
    let e = exe.execute(&[&a, &elsewhere]).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    // After all that, the executable still works.
    let out = exe.execute(&[&a, &a]).unwrap();
    assert_eq!(to_f32s(&out[0].to_host().unwrap()), [2.0, 8.0, 18.0, 32.0]);
}

#[test]
fn eight_threads_compile_and_execute_at_once() {
    let c = client_or_return!("eight_threads_compile_and_execute_at_once");
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let dev = t % 4;
                // Each thread compiles its own program (a distinct constant) and runs it.
                let program = ADD_MUL.replace("@add_mul", &format!("@add_mul_{t}"));
                let exe = c.compile_for_device(&program, dev).unwrap();
                let mut last = Vec::new();
                for i in 0..20 {
                    let x = (t * 100 + i) as f32;
                    let a = upload(&c, dev, &[x; 4], &[4]);
                    let b = upload(&c, dev, &[1.0; 4], &[4]);
                    let out = exe.execute(&[&a, &b]).unwrap();
                    last = to_f32s(&out[0].to_host().unwrap());
                    assert_eq!(last, vec![(x + 1.0) * x; 4]);
                }
                last[0]
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn client_dropped_while_buffers_and_executables_live() {
    if find_pjrt_plugin().is_err() {
        let _ = client_or_skip("client_dropped_while_buffers_and_executables_live");
        return;
    }
    let path = find_pjrt_plugin().unwrap();
    let c = Client::create(&path, &[("cpu_device_count".into(), OptionValue::Int(2))]).unwrap();
    assert_eq!(c.device_count(), 2);
    let exe = c.compile_for_device(ADD_MUL, 0).unwrap();
    let a = upload(&c, 0, &[1.0, 2.0, 3.0, 4.0], &[4]);
    let dev = c.device(0).unwrap();
    drop(c);
    let out = exe.execute(&[&a, &a]).unwrap();
    drop(exe);
    drop(a);
    assert_eq!(to_f32s(&out[0].to_host().unwrap()), [2.0, 8.0, 18.0, 32.0]);
    dev.synchronize().unwrap();
    drop(dev);
    drop(out); // the last handle: the client is destroyed here
}

#[test]
fn asynchronous_by_default_and_blocking_on_request() {
    let c = client_or_return!("asynchronous_by_default_and_blocking_on_request");
    let exe = c.compile_for_device(DOT_REDUCE, 3).unwrap();
    let a = upload(&c, 3, &[1.; 6], &[2, 3]);
    let b = upload(&c, 3, &[1.; 6], &[3, 2]);
    let outs: Vec<_> = (0..10).map(|_| exe.execute(&[&a, &b]).unwrap()).collect();
    c.device(3).unwrap().synchronize().unwrap();
    for o in &outs {
        o[1].wait_ready().unwrap();
        assert_eq!(to_f32s(&o[1].to_host().unwrap()), [6.0, 6.0]);
    }
    set_launch_blocking(true);
    let o = exe.execute(&[&a, &b]).unwrap();
    assert!(o[0].ready_event().unwrap().is_ready().unwrap());
    set_launch_blocking(false);
}

#[test]
fn serialize_and_reload_executable() {
    let c = client_or_return!("serialize_and_reload_executable");
    let exe = c.compile_for_device(ADD_MUL, 0).unwrap();
    let bytes = exe.serialize().unwrap();
    let again = c.deserialize(&bytes).unwrap();
    assert_eq!(again.params(), exe.params());
    let a = upload(&c, 0, &[1.0, 2.0, 3.0, 4.0], &[4]);
    let out = again.execute(&[&a, &a]).unwrap();
    assert_eq!(to_f32s(&out[0].to_host().unwrap()), [2.0, 8.0, 18.0, 32.0]);
    assert!(c.deserialize(b"not an executable").is_err());
    let mut cut = bytes.clone();
    cut.truncate(40);
    assert!(c.deserialize(&cut).is_err());
}

#[test]
fn memory_figures_and_limits() {
    let c = client_or_return!("memory_figures_and_limits");
    let path = find_pjrt_plugin().unwrap();
    // A client of its own, so other tests' buffers do not count.
    let c2 = Client::create(&path, &[("cpu_device_count".into(), OptionValue::Int(1))]).unwrap();
    drop(c);
    let dev = c2.device(0).unwrap();
    let stats = dev.memory_stats().unwrap();
    let before = stats.bytes_in_use;
    let a = upload(&c2, 0, &[0.0; 256], &[256]);
    let stats = dev.memory_stats().unwrap();
    if stats.source == MemorySource::TrackedBuffers {
        assert_eq!(stats.bytes_in_use, before + 1024);
        assert!(
            stats
                .to_string()
                .contains("the plugin reports no memory statistics")
        );
    }
    dev.set_memory_limit(Some(stats.bytes_in_use + 100))
        .unwrap();
    let e = PjrtBuffer::from_host(&c2, 0, DType::F32, &[64], &[0u8; 256]).unwrap_err();
    assert!(
        matches!(e, Error::OutOfMemory { requested: 256, .. }),
        "{e}"
    );
    drop(a);
    PjrtBuffer::from_host(&c2, 0, DType::F32, &[64], &[0u8; 256]).unwrap();
    dev.set_memory_limit(None).unwrap();
}

#[test]
fn loader_errors_are_distinct() {
    let e = Client::create("/nonexistent/plugin.so", &[]).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    let e = Client::create("libc.so.6", &[]).unwrap_err();
    assert!(e.to_string().contains("GetPjrtApi"), "{e}");
}

#[test]
fn tpu_is_detected_not_guessed() {
    // No machine here has TPU chips: detection must fail before libtpu is asked for a client.
    if libtpu_sys_detect_finds_chips() {
        return;
    }
    let e = Device::parse("tpu").unwrap_err();
    assert!(matches!(e, Error::NoTpuFound { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("/sys/bus/pci/devices"), "{text}");
    let e = Device::parse("tpu:1").unwrap_err();
    assert!(matches!(e, Error::NoTpuFound { .. }), "{e}");
}

fn libtpu_sys_detect_finds_chips() -> bool {
    // The runtime re-exports detection through NoTpuFound; a machine with chips skips the test.
    std::path::Path::new("/dev/accel0").exists()
}

#[test]
fn parse_pjrt_devices() {
    let _ = client_or_return!("parse_pjrt_devices");
    // `pjrt` uses the process-wide default client of the same plugin.
    let d = Device::parse("pjrt:1").unwrap();
    assert_eq!(d.name(), "pjrt:1");
    assert_eq!(Device::parse("pjrt").unwrap().name(), "pjrt:0");
    let e = Device::parse("pjrt:99").unwrap_err().to_string();
    assert!(e.contains("addressable devices"), "{e}");
    let shared = Arc::new(d);
    assert_eq!(*shared, Device::parse("pjrt:1").unwrap());
}

#[test]
fn libtpu_version_is_read_without_a_client() {
    let Ok(path) = std::env::var("TPU_LIBRARY_PATH") else {
        eprintln!("skipped: libtpu_version_is_read_without_a_client: TPU_LIBRARY_PATH is not set");
        return;
    };
    // Opening the library and reading GetPjrtApi's version needs no client and no network.
    let lib = libtpu_sys::PjrtLibrary::open(&path).unwrap();
    let (major, minor) = lib.version();
    assert_eq!(major, 0);
    assert!(minor >= 115, "libtpu reports 0.{minor}");
}

#[test]
fn huge_uploads_are_errors_before_the_plugin_is_called() {
    let c = client_or_return!("huge_uploads_are_errors_before_the_plugin_is_called");
    // A size past i64 beside a 0: no bytes, but PJRT would read it as negative.
    let e = PjrtBuffer::from_host(&c, 0, DType::F32, &[1 << 63, 0], &[]).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    // Zero-filled buffers are staged in host memory only once the device and the host could
    // take them; what was asked is named.
    let dev = c.device(2).unwrap();
    for dims in [&[1usize << 40][..], &[1 << 20, 1 << 20, 1 << 10]] {
        let e = Buffer::zeroed(&dev, DType::F32, dims).unwrap_err();
        match &e {
            Error::OutOfMemory { what, .. } => assert!(what.starts_with("f32["), "{e}"),
            other => panic!("expected OutOfMemory, got {other}"),
        }
    }
    let e = Buffer::zeroed(&dev, DType::F64, &[1 << 62]).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    dev.set_memory_limit(Some(1 << 10)).unwrap();
    let e = Buffer::zeroed(&dev, DType::F32, &[1 << 10]).unwrap_err();
    dev.set_memory_limit(None).unwrap();
    assert!(
        matches!(
            &e,
            Error::OutOfMemory { device, requested: 4096, limit: Some(1024), .. }
                if device == &dev.name()
        ),
        "{e}"
    );
    assert!(dev.check_alloc(1 << 50, String::new).is_err());
    dev.check_alloc(1 << 10, String::new).unwrap();
}
