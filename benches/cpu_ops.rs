//! The native CPU device against the hardware's limits: matrix products (f32, bf16, f16),
//! elementwise ops, per-op dispatch, row normalisations, reductions, convolution and attention,
//! and products with quantised matrices (`quant_linear`, SmolLM2's shapes; GB/s of the packed
//! matrix read).
//! Each group prints its throughput (GFLOP/s or GB/s, as criterion's elements or bytes).
//!
//! `cargo bench --bench cpu_ops` (all groups) or `cargo bench --bench cpu_ops -- matmul` (one group);
//! `benches/cpu_peers.py` measures PyTorch and numpy on the same shapes (benches/README.md).

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use tpu_rs::device::CpuOptions;
use tpu_rs::ops::conv::ConvOptions;
use tpu_rs::ops::linalg::matmul;
use tpu_rs::prelude::*;

fn device(threads: usize) -> Device {
    Device::new_cpu(&CpuOptions {
        num_threads: Some(threads),
        memory_limit: None,
    })
    .expect("a CPU device")
}

fn randn(shape: &[usize], dtype: DType, dev: &Device) -> Tensor {
    Generator::new(7)
        .randn(shape, DType::F32, &Device::cpu())
        .and_then(|t| t.to_dtype(dtype))
        .and_then(|t| t.to_device(dev))
        .expect("random input")
}

/// A group of long cases: criterion's fewest samples (10), on a two-thread device.
fn heavy_group<'a>(c: &'a mut Criterion, name: &str) -> (BenchmarkGroup<'a, WallTime>, Device) {
    let mut g = c.benchmark_group(name);
    g.sample_size(10);
    (g, device(2))
}

fn matmuls(c: &mut Criterion) {
    let (mut g, two) = heavy_group(c, "matmul");
    let one = device(1);
    let cases: &[(&str, DType, usize, usize, usize, usize, &Device)] = &[
        ("f32_1024_2t", DType::F32, 1, 1024, 1024, 1024, &two),
        ("f32_2048_2t", DType::F32, 1, 2048, 2048, 2048, &two),
        ("f32_1024_1t", DType::F32, 1, 1024, 1024, 1024, &one),
        ("f32_4096x1024x64", DType::F32, 1, 4096, 1024, 64, &two),
        ("f32_4096x64x1024", DType::F32, 1, 4096, 64, 1024, &two),
        ("f32_32x128x64x128", DType::F32, 32, 128, 64, 128, &two),
        ("bf16_1024_2t", DType::BF16, 1, 1024, 1024, 1024, &two),
        ("bf16_2048_2t", DType::BF16, 1, 2048, 2048, 2048, &two),
        ("f16_1024_2t", DType::F16, 1, 1024, 1024, 1024, &two),
    ];
    for &(name, dtype, batch, m, k, n, dev) in cases {
        let (a, b) = if batch == 1 {
            (randn(&[m, k], dtype, dev), randn(&[k, n], dtype, dev))
        } else {
            (
                randn(&[batch, m, k], dtype, dev),
                randn(&[batch, k, n], dtype, dev),
            )
        };
        g.throughput(Throughput::Elements((2 * batch * m * k * n) as u64));
        g.bench_function(BenchmarkId::new("flops", name), |bch| {
            bch.iter(|| matmul(&a, &b).unwrap())
        });
    }
    // Matrix-vector: memory-bound, so report bytes of the matrix read.
    let a = randn(&[4096, 4096], DType::F32, &two);
    let x = randn(&[4096], DType::F32, &two);
    g.throughput(Throughput::Bytes((4096 * 4096 * 4) as u64));
    g.bench_function(BenchmarkId::new("bytes", "f32_matvec_4096"), |bch| {
        bch.iter(|| matmul(&a, &x).unwrap())
    });
    g.finish();
}

/// The products and the ReLU backward of the MLP 784-1024-1024-10 training step at batch 128
/// (benches/graph.rs), on 2 threads, with the operands laid out as the step has them: the
/// forward reads the `[out, in]` weights transposed, the weight gradients the activations'
/// gradients transposed.
fn mlp_step_ops(c: &mut Criterion) {
    let (mut g, dev) = heavy_group(c, "mlp_step_ops_b128");
    let x = randn(&[128, 784], DType::F32, &dev);
    let w1 = randn(&[1024, 784], DType::F32, &dev);
    let h = randn(&[128, 1024], DType::F32, &dev);
    let w2 = randn(&[1024, 1024], DType::F32, &dev);
    let t = |v: &Tensor| v.t().expect("a transpose");
    let products = [
        ("x_w1t_128x784x1024", x.clone(), t(&w1), 128 * 784 * 1024),
        ("h_w2t_128x1024x1024", h.clone(), t(&w2), 128 * 1024 * 1024),
        ("h_w2_128x1024x1024", h.clone(), w2, 128 * 1024 * 1024),
        ("ht_h_1024x128x1024", t(&h), h.clone(), 1024 * 128 * 1024),
        ("ht_x_1024x128x784", t(&h), x.clone(), 1024 * 128 * 784),
    ];
    for (name, a, b, macs) in products {
        g.throughput(Throughput::Elements(2 * macs as u64));
        g.bench_function(BenchmarkId::new("flops", name), |bch| {
            bch.iter(|| matmul(&a, &b).unwrap())
        });
    }
    let mask = h.le(0.0).unwrap();
    // Bytes: the f32 input read and the bool mask written; then f32 and mask read, f32 written.
    g.throughput(Throughput::Bytes((5 * 128 * 1024) as u64));
    g.bench_function(BenchmarkId::new("bytes", "le_scalar_128x1024"), |bch| {
        bch.iter(|| h.le(0.0).unwrap())
    });
    g.throughput(Throughput::Bytes((9 * 128 * 1024) as u64));
    g.bench_function(BenchmarkId::new("bytes", "masked_fill_128x1024"), |bch| {
        bch.iter(|| h.masked_fill(&mask, 0.0).unwrap())
    });
    g.finish();
}

const N16M: usize = 1 << 24;

fn elementwise(c: &mut Criterion) {
    let (mut g, dev) = heavy_group(c, "elementwise_16M_f32");
    let a = randn(&[N16M], DType::F32, &dev);
    let b = randn(&[N16M], DType::F32, &dev);
    // Bytes moved: inputs read plus the output written.
    g.throughput(Throughput::Bytes((3 * 4 * N16M) as u64));
    g.bench_function("add", |bch| bch.iter(|| a.add(&b).unwrap()));
    g.bench_function("mul", |bch| bch.iter(|| a.mul(&b).unwrap()));
    g.throughput(Throughput::Bytes((2 * 4 * N16M) as u64));
    g.bench_function("mul_scalar", |bch| bch.iter(|| a.mul(1.5).unwrap()));
    g.bench_function("exp", |bch| bch.iter(|| a.exp().unwrap()));
    g.bench_function("tanh", |bch| bch.iter(|| a.tanh().unwrap()));
    g.bench_function("sigmoid", |bch| bch.iter(|| a.sigmoid().unwrap()));
    g.bench_function("silu", |bch| bch.iter(|| a.silu().unwrap()));
    g.bench_function("gelu", |bch| bch.iter(|| a.gelu().unwrap()));
    g.bench_function("gelu_tanh", |bch| bch.iter(|| a.gelu_tanh().unwrap()));
    g.bench_function("relu", |bch| bch.iter(|| a.relu().unwrap()));
    g.finish();
}

/// The elementwise ops of a 16-bit decoder layer (residual adds, SwiGLU, RMSNorm) on 128 rows
/// of 1536, in bf16 and f16: each reads and writes 16-bit floats, computing in f32.
fn elementwise_16bit(c: &mut Criterion) {
    for dtype in [DType::BF16, DType::F16] {
        let (mut g, dev) = heavy_group(c, &format!("elementwise_128x1536_{dtype}"));
        let a = randn(&[128, 1536], dtype, &dev);
        let b = randn(&[128, 1536], dtype, &dev);
        let w = randn(&[1536], dtype, &dev);
        g.throughput(Throughput::Elements((128 * 1536) as u64));
        g.bench_function("add", |bch| bch.iter(|| a.add(&b).unwrap()));
        g.bench_function("mul_row", |bch| bch.iter(|| a.mul(&w).unwrap()));
        g.bench_function("silu", |bch| bch.iter(|| a.silu().unwrap()));
        g.bench_function("rms_norm", |bch| {
            bch.iter(|| {
                F::rms_norm_with(&a, &[1536], &F::RmsNormOptions::new().weight(&w).eps(1e-5))
                    .unwrap()
            })
        });
        g.finish();
    }
}

fn dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch");
    let dev = Device::cpu();
    let a = Tensor::new([1.0f32, 2.0, 3.0, 4.0], &dev).unwrap();
    let b = Tensor::new([5.0f32, 6.0, 7.0, 8.0], &dev).unwrap();
    // The whole eager call on 4 elements, one row per kind of op (benches/cpu_peers.py
    // measures candle and PyTorch on the same rows).
    g.bench_function("add_4_f32", |bch| bch.iter(|| a.add(&b).unwrap()));
    g.bench_function("mul_4_f32", |bch| bch.iter(|| a.mul(&b).unwrap()));
    g.bench_function("add_scalar_4_f32", |bch| bch.iter(|| a.add(1.0).unwrap()));
    g.bench_function("exp_4_f32", |bch| bch.iter(|| a.exp().unwrap()));
    g.bench_function("relu_4_f32", |bch| bch.iter(|| a.relu().unwrap()));
    g.bench_function("sum_last_4_f32", |bch| {
        bch.iter(|| a.sum(&[-1], false).unwrap())
    });
    g.bench_function("max_last_4_f32", |bch| {
        bch.iter(|| a.amax(&[-1], false).unwrap())
    });
    g.bench_function("max_all_4_f32", |bch| bch.iter(|| a.max_all().unwrap()));
    g.bench_function("le_4_f32", |bch| bch.iter(|| a.le(&b).unwrap()));
    g.finish();
}

fn rows(c: &mut Criterion) {
    let (mut g, dev) = heavy_group(c, "rows_4096x4096_f32");
    let x = randn(&[4096, 4096], DType::F32, &dev);
    let w = randn(&[4096], DType::F32, &dev);
    let bias = randn(&[4096], DType::F32, &dev);
    g.throughput(Throughput::Bytes((2 * 4 * 4096 * 4096) as u64));
    g.bench_function("softmax", |bch| bch.iter(|| F::softmax(&x, -1).unwrap()));
    g.bench_function("log_softmax", |bch| {
        bch.iter(|| F::log_softmax(&x, -1).unwrap())
    });
    g.bench_function("layer_norm", |bch| {
        bch.iter(|| {
            F::layer_norm_with(&x, &[4096], &F::NormOptions::new().weight(&w).bias(&bias)).unwrap()
        })
    });
    g.bench_function("rms_norm", |bch| {
        bch.iter(|| {
            F::rms_norm_with(&x, &[4096], &F::RmsNormOptions::new().weight(&w).eps(1e-6)).unwrap()
        })
    });
    g.finish();
}

fn reductions(c: &mut Criterion) {
    let (mut g, dev) = heavy_group(c, "reduce_4096x4096_f32");
    let x = randn(&[4096, 4096], DType::F32, &dev);
    g.throughput(Throughput::Bytes((4 * 4096 * 4096) as u64));
    g.bench_function("sum_last", |bch| bch.iter(|| x.sum(&[-1], false).unwrap()));
    g.bench_function("sum_first", |bch| bch.iter(|| x.sum(&[0], false).unwrap()));
    g.bench_function("max_last", |bch| bch.iter(|| x.amax(&[-1], false).unwrap()));
    g.bench_function("max_first", |bch| bch.iter(|| x.amax(&[0], false).unwrap()));
    g.bench_function("mean_last", |bch| {
        bch.iter(|| x.mean(&[-1], false).unwrap())
    });
    g.bench_function("mean_first", |bch| {
        bch.iter(|| x.mean(&[0], false).unwrap())
    });
    g.finish();
}

fn conv(c: &mut Criterion) {
    let (mut g, dev) = heavy_group(c, "conv2d");
    let x = randn(&[32, 64, 56, 56], DType::F32, &dev);
    let w = randn(&[64, 64, 3, 3], DType::F32, &dev);
    let opts = ConvOptions::new().padding(1);
    g.throughput(Throughput::Elements(2u64 * 32 * 64 * 56 * 56 * 64 * 9));
    g.bench_function("f32_b32_64x64_56x56_3x3", |bch| {
        bch.iter(|| x.conv2d(&w, None, &opts).unwrap())
    });
    let xb = x.to_dtype(DType::BF16).unwrap();
    let wb = w.to_dtype(DType::BF16).unwrap();
    g.bench_function("bf16_b32_64x64_56x56_3x3", |bch| {
        bch.iter(|| xb.conv2d(&wb, None, &opts).unwrap())
    });
    g.finish();
}

fn attention(c: &mut Criterion) {
    let (mut g, dev) = heavy_group(c, "sdpa_b4_h8_s256_d64_f32");
    let q = randn(&[4, 8, 256, 64], DType::F32, &dev);
    let k = randn(&[4, 8, 256, 64], DType::F32, &dev);
    let v = randn(&[4, 8, 256, 64], DType::F32, &dev);
    g.throughput(Throughput::Elements(4u64 * 4 * 8 * 256 * 256 * 64));
    g.bench_function("full", |bch| {
        bch.iter(|| F::scaled_dot_product_attention(&q, &k, &v).unwrap())
    });
    g.bench_function("causal", |bch| {
        bch.iter(|| {
            F::scaled_dot_product_attention_with(
                &q,
                &k,
                &v,
                &F::AttentionOptions::new().is_causal(true),
            )
            .unwrap()
        })
    });
    g.finish();
}

/// `x · Wᵀ` with `W` in GGML blocks, at SmolLM2's shapes: decode (1 row) and 8 rows; the
/// throughput is the packed matrix's bytes per second.
fn quant(c: &mut Criterion) {
    use tpu_rs::ops::quant::{QuantFormat, QuantMatrix, quant_linear};
    let (mut g, dev) = heavy_group(c, "quant_linear");
    let mut state = 1u64;
    let mut byte = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        (state >> 56) as u8
    };
    for (fmt, rows, cols) in [
        (QuantFormat::Q4_1, 1536, 576),
        (QuantFormat::Q4_1, 576, 1536),
        (QuantFormat::Q8_0, 49152, 576),
    ] {
        let bb = fmt.block_bytes();
        let mut raw: Vec<u8> = (0..rows * cols / 32 * bb).map(|_| byte()).collect();
        // Small finite scales (f16 0.01) in every block.
        for blk in raw.chunks_exact_mut(bb) {
            blk[..2].copy_from_slice(&0x211eu16.to_le_bytes());
            if fmt == QuantFormat::Q4_1 {
                blk[2..4].copy_from_slice(&0x211eu16.to_le_bytes());
            }
        }
        let w = QuantMatrix::from_blocks(fmt, rows, cols, &raw).expect("a matrix");
        for (m, threads) in [(1, 1), (1, 2), (8, 2)] {
            let dev = if threads == 2 { dev.clone() } else { device(1) };
            let x = randn(&[m, cols], DType::F32, &dev);
            g.throughput(Throughput::Bytes(w.nbytes() as u64));
            let name = format!("{}/{m}x{cols}x{rows}/t{threads}", fmt.name());
            g.bench_function(name, |b| b.iter(|| quant_linear(&x, &w).unwrap()));
        }
    }
    g.finish();
}

criterion_group!(
    benches,
    quant,
    matmuls,
    mlp_step_ops,
    elementwise,
    elementwise_16bit,
    dispatch,
    rows,
    reductions,
    conv,
    attention
);
criterion_main!(benches);
