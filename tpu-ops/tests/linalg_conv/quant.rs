//! Quantised matrices (`tpu_ops::ops::quant`) against the dequantised matrix: the decode
//! kernel (few rows) and the prefill path (dequantised panels) at every level the processor
//! has (portable, AVX2, AVX-512), for every format, with row counts on either side of
//! the 16-row groups; dequantisation and embedding rows bit for bit as GGUF's; and the errors.

use proptest::prelude::*;
use tpu_ops::cpu::isa::{Level, with_level};
use tpu_ops::ops::quant::{QuantFormat, QuantMatrix, quant_embedding, quant_linear};
use tpu_tensor::gguf::{GgmlType, dequantize};
use tpu_tensor::{Device, Tensor, f16};

const FORMATS: [QuantFormat; 3] = [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0];

fn ggml(f: QuantFormat) -> GgmlType {
    match f {
        QuantFormat::Q4_0 => GgmlType::Q4_0,
        QuantFormat::Q4_1 => GgmlType::Q4_1,
        QuantFormat::Q8_0 => GgmlType::Q8_0,
    }
}

/// A splitmix64 stream: the blocks of one case from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-a, a)`.
    fn uniform(&mut self, a: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
    }
}

/// `rows × cols` weights as GGML blocks of `f`, random scales, minimums and values.
fn blocks(f: QuantFormat, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows * cols / 32 {
        out.extend(f16::from_f32(rng.uniform(0.1)).to_bits().to_le_bytes());
        if f == QuantFormat::Q4_1 {
            out.extend(f16::from_f32(rng.uniform(0.5)).to_bits().to_le_bytes());
        }
        let n = if f == QuantFormat::Q8_0 { 32 } else { 16 };
        out.extend((0..n).map(|_| rng.next() as u8));
    }
    out
}

/// `x · wᵀ` in f64 over the dequantised weights, and the sum of `|w x|` per output (the scale
/// of its rounding error).
fn reference(w: &[f32], x: &[f32], m: usize, rows: usize, cols: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut out, mut mag) = (vec![0f64; m * rows], vec![0f64; m * rows]);
    for i in 0..m {
        for j in 0..rows {
            for k in 0..cols {
                let p = w[j * cols + k] as f64 * x[i * cols + k] as f64;
                out[i * rows + j] += p;
                mag[i * rows + j] += p.abs();
            }
        }
    }
    (out, mag)
}

/// Every level this processor runs.
fn levels() -> Vec<Level> {
    [Level::Portable, Level::Avx2, Level::Avx512]
        .into_iter()
        .filter(|&l| l <= tpu_ops::cpu::isa::detected_level())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn products_equal_the_dequantised_matrix(
        fi in 0usize..3,
        rows in prop::sample::select(vec![1usize, 7, 16, 17, 33, 63]),
        nb in prop::sample::select(vec![1usize, 3, 18]),
        m in prop::sample::select(vec![1usize, 2, 3, 4, 5, 8, 9, 17]),
        seed in any::<u64>(),
    ) {
        let f = FORMATS[fi];
        let cols = nb * 32;
        let mut rng = Rng(seed);
        let raw = blocks(f, rows, cols, &mut rng);
        let w = dequantize(ggml(f), &raw, rows * cols).unwrap();
        let x: Vec<f32> = (0..m * cols).map(|_| rng.uniform(2.0)).collect();
        let (want, mag) = reference(&w, &x, m, rows, cols);
        let q = QuantMatrix::from_blocks(f, rows, cols, &raw).unwrap();
        let xt = Tensor::from_vec(x, [m, cols], &Device::cpu()).unwrap();
        for level in levels() {
            let got = with_level(level, || quant_linear(&xt, &q)).unwrap();
            prop_assert_eq!(got.shape(), &[m, rows]);
            for (i, g) in got.to_vec::<f32>().unwrap().iter().enumerate() {
                let tol = 2e-6 * mag[i] + 1e-6;
                prop_assert!(
                    (*g as f64 - want[i]).abs() <= tol,
                    "{:?} {:?} {}x{} m {}: output {} is {}, want {} (tolerance {})",
                    level, f, rows, cols, m, i, g, want[i], tol
                );
            }
        }
    }
}

#[test]
fn dequantised_values_and_embedding_rows_are_gguf_s_bit_for_bit() {
    let mut rng = Rng(7);
    for f in FORMATS {
        let (rows, cols) = (19, 96);
        let raw = blocks(f, rows, cols, &mut rng);
        let want = dequantize(ggml(f), &raw, rows * cols).unwrap();
        let q = QuantMatrix::from_blocks(f, rows, cols, &raw).unwrap();
        let got = q.dequantize(&Device::cpu()).unwrap();
        assert_eq!(got.shape(), &[rows, cols]);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got.to_vec::<f32>().unwrap()), bits(&want), "{f:?}");
        let ids = Tensor::from_vec(vec![18i64, 0, 5, 5], [2, 2], &Device::cpu()).unwrap();
        let e = quant_embedding(&ids, &q).unwrap();
        assert_eq!(e.shape(), &[2, 2, cols]);
        let e = e.to_vec::<f32>().unwrap();
        for (n, &r) in [18usize, 0, 5, 5].iter().enumerate() {
            assert_eq!(
                bits(&e[n * cols..(n + 1) * cols]),
                bits(&want[r * cols..(r + 1) * cols])
            );
        }
    }
}

#[test]
fn many_rows_take_the_dequantised_panels_and_match_linear() {
    // 40 activation rows go through the f32 product over dequantised panels: the same bits
    // as `linear` over the dequantised matrix.
    let mut rng = Rng(11);
    let (rows, cols, m) = (50, 64, 40);
    let raw = blocks(QuantFormat::Q4_1, rows, cols, &mut rng);
    let q = QuantMatrix::from_blocks(QuantFormat::Q4_1, rows, cols, &raw).unwrap();
    let x: Vec<f32> = (0..m * cols).map(|_| rng.uniform(1.0)).collect();
    let x = Tensor::from_vec(x, [2, m / 2, cols], &Device::cpu()).unwrap();
    let w = q.dequantize(&Device::cpu()).unwrap();
    for level in levels() {
        let got = with_level(level, || quant_linear(&x, &q)).unwrap();
        assert_eq!(got.shape(), &[2, m / 2, rows]);
        let want = with_level(level, || tpu_ops::ops::linalg::linear(&x, &w, None)).unwrap();
        let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        for (a, b) in g.iter().zip(&w) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "{level:?}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn wrong_inputs_are_errors_that_say_what_was_expected() {
    let raw = blocks(QuantFormat::Q8_0, 4, 64, &mut Rng(3));
    let e = QuantMatrix::from_blocks(QuantFormat::Q8_0, 4, 64, &raw[..raw.len() - 1]).unwrap_err();
    assert!(e.to_string().contains("takes 272 bytes, got 271"), "{e}");
    let e = QuantMatrix::from_blocks(QuantFormat::Q8_0, 4, 48, &raw).unwrap_err();
    assert!(e.to_string().contains("blocks of 32"), "{e}");
    let q = QuantMatrix::from_blocks(QuantFormat::Q8_0, 4, 64, &raw).unwrap();
    let x = Tensor::from_vec(vec![0f32; 96], [3, 32], &Device::cpu()).unwrap();
    let e = quant_linear(&x, &q).unwrap_err();
    assert!(
        e.to_string().contains("expected f32 input [..., 64]"),
        "{e}"
    );
    let x = Tensor::from_vec(vec![0f32; 64], [1, 64], &Device::cpu()).unwrap();
    tpu_ops::autograd::set_requires_grad(&x, true).unwrap();
    let e = quant_linear(&x, &q).unwrap_err();
    assert!(e.to_string().contains("no backward rule"), "{e}");
    let ids = Tensor::from_vec(vec![4i64], [1], &Device::cpu()).unwrap();
    let e = quant_embedding(&ids, &q).unwrap_err();
    assert!(e.to_string().contains("index 4 is out of range"), "{e}");
}

#[test]
fn a_matrix_taller_than_one_panel_is_multiplied_panel_by_panel() {
    // Panels hold 2^16 values: 1024 rows of 64; 3 panels and a partial fourth.
    let (rows, cols, m) = (3 * 1024 + 17, 64, 9);
    let mut rng = Rng(5);
    let raw = blocks(QuantFormat::Q8_0, rows, cols, &mut rng);
    let q = QuantMatrix::from_blocks(QuantFormat::Q8_0, rows, cols, &raw).unwrap();
    let x: Vec<f32> = (0..m * cols).map(|_| rng.uniform(1.0)).collect();
    let x = Tensor::from_vec(x, [m, cols], &Device::cpu()).unwrap();
    let got = quant_linear(&x, &q).unwrap().to_vec::<f32>().unwrap();
    let w = q.dequantize(&Device::cpu()).unwrap();
    let want = tpu_ops::ops::linalg::linear(&x, &w, None).unwrap();
    let want = want.to_vec::<f32>().unwrap();
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "output {i}: {a} vs {b}"
        );
    }
}
