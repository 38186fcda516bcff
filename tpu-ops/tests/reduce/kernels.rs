//! The reduction kernels' blocking and splitting edges: 2-D inputs with sides around the vector
//! width, the lane count and the block length (1, 7, 17, 31, 32, 33, 63, 65, 257, 1025, 2049),
//! plain, transposed and sliced, reduced over either dim or both, against naive f64 references;
//! and the same results, bit for bit, from the portable build and from 1 or 2 threads (the
//! summation order is fixed by the data's shape alone).

use crate::common::agrees;
use proptest::prelude::*;
use tpu_ops::cpu::isa::{self, Level};
use tpu_ops::prelude::*;
use tpu_ops::testing::epsilon;
use tpu_tensor::tpu_runtime::CpuOptions;
use tpu_tensor::{DType, Device, Tensor};

const SIDES: &[usize] = &[1, 7, 17, 31, 32, 33, 63, 65, 257, 1025, 2049];
const DTYPES: &[DType] = &[DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32];

fn device(threads: usize) -> Device {
    Device::new_cpu(&CpuOptions {
        num_threads: Some(threads),
        memory_limit: None,
    })
    .expect("a CPU device")
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .and_then(|t| t.to_vec::<f64>())
        .expect("readable tensor")
}

/// Bit patterns, NaNs made canonical.
fn bits(t: &Tensor) -> Vec<u64> {
    f64s(t)
        .into_iter()
        .map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() })
        .collect()
}

#[derive(Clone, Debug)]
struct Case {
    rows: usize,
    cols: usize,
    /// 0 plain, 1 transposed (a `[cols, rows]` tensor's `.t()`), 2 every other column of a
    /// wider tensor.
    view: u8,
    /// The dims reduced: `[0]`, `[1]` or both.
    dims: Vec<i64>,
    dtype: DType,
    seed: u64,
    /// Put NaNs and infinities among the floats.
    special: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..SIDES.len(),
        0..SIDES.len(),
        0u8..3,
        0u8..3,
        0..DTYPES.len(),
        any::<u64>(),
        prop::bool::weighted(0.2),
    )
        .prop_filter("at most 300k elements", |c| {
            SIDES[c.0] * SIDES[c.1] <= 300_000
        })
        .prop_map(|(r, c, view, d, di, seed, special)| Case {
            rows: SIDES[r],
            cols: SIDES[c],
            view,
            dims: [vec![0], vec![1], vec![0, 1]][d as usize].clone(),
            dtype: DTYPES[di],
            seed,
            special,
        })
}

impl Case {
    /// The logical values, row-major, already rounded to the dtype.
    fn values(&self) -> Vec<f64> {
        let mut s = self.seed;
        let float = self.dtype.is_float();
        let vals: Vec<f64> = (0..self.rows * self.cols)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = s >> 33;
                let v = (r % 2001) as f64 - 1000.0;
                if float && self.special && (r >> 12).is_multiple_of(97) {
                    [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][(r >> 20) as usize % 3]
                } else if float {
                    v / 64.0
                } else {
                    v
                }
            })
            .collect();
        let t = Tensor::from_vec(vals, [vals_len(self)], &Device::cpu()).expect("tensor");
        f64s(&t.to_dtype(self.dtype).expect("cast"))
    }

    fn input(&self, dev: &Device) -> Tensor {
        let v = self.values();
        let (r, c) = (self.rows, self.cols);
        let t = |vals: Vec<f64>, shape: [usize; 2]| {
            Tensor::from_vec(vals, shape, dev)
                .and_then(|t| t.to_dtype(self.dtype))
                .expect("tensor")
        };
        let x = match self.view {
            1 => {
                let mut tr = vec![0.0; r * c];
                for i in 0..r {
                    for j in 0..c {
                        tr[j * r + i] = v[i * c + j];
                    }
                }
                t(tr, [c, r]).t().expect("transpose")
            }
            2 => {
                let mut wide = vec![0.0; r * 2 * c];
                for i in 0..r {
                    for j in 0..c {
                        wide[i * 2 * c + 2 * j] = v[i * c + j];
                        wide[i * 2 * c + 2 * j + 1] = f64::NAN;
                    }
                }
                t(wide, [r, 2 * c]).slice(1, .., 2).expect("slice")
            }
            _ => t(v, [r, c]),
        };
        assert_eq!(x.shape(), &[r, c]);
        x
    }

    /// The groups of logical values each output element reduces, in output order.
    fn groups(&self) -> Vec<Vec<f64>> {
        let v = self.values();
        let (r, c) = (self.rows, self.cols);
        match self.dims[..] {
            [0] => (0..c)
                .map(|j| (0..r).map(|i| v[i * c + j]).collect())
                .collect(),
            [1] => v.chunks(c).map(|g| g.to_vec()).collect(),
            _ => vec![v],
        }
    }
}

fn vals_len(c: &Case) -> usize {
    c.rows * c.cols
}

/// NaN if any, else the extreme.
fn extreme(g: &[f64], max: bool) -> f64 {
    g.iter().fold(
        if max {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        },
        |a, &b| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else if max {
                a.max(b)
            } else {
                a.min(b)
            }
        },
    )
}

/// The first index of the extreme (of the first NaN, if any).
fn arg(g: &[f64], max: bool) -> i64 {
    if let Some(i) = g.iter().position(|v| v.is_nan()) {
        return i as i64;
    }
    let e = extreme(g, max);
    g.iter().position(|&v| v == e).unwrap_or(0) as i64
}

/// The results of every checked op, in a fixed order.
fn run_all(c: &Case, x: &Tensor) -> Vec<(&'static str, Tensor)> {
    let d = &c.dims[..];
    let mut out = vec![
        ("sum", x.sum(d, false).expect("sum")),
        ("amax", x.amax(d, false).expect("amax")),
        ("amin", x.amin(d, false).expect("amin")),
    ];
    if c.dtype.is_float() {
        out.push(("mean", x.mean(d, false).expect("mean")));
    }
    if d.len() == 1 {
        out.push(("argmax", x.argmax(Some(d[0]), false).expect("argmax")));
        out.push(("argmin", x.argmin(Some(d[0]), false).expect("argmin")));
    }
    out
}

fn check(c: &Case) {
    let x = c.input(&device(2));
    let groups = c.groups();
    let results = run_all(c, &x);
    let e = if c.dtype == DType::F64 {
        epsilon(DType::F64)
    } else {
        epsilon(DType::F32)
    };
    let out_eps = epsilon(c.dtype);
    for (name, got) in &results {
        let g = f64s(got);
        assert_eq!(g.len(), groups.len(), "{name}: output count");
        for (k, (&got, grp)) in g.iter().zip(&groups).enumerate() {
            let n = grp.len() as f64;
            let (want, tol) = match *name {
                "sum" | "mean" => {
                    let s: f64 = grp.iter().sum();
                    let abs: f64 = grp.iter().map(|v| v.abs()).sum();
                    // Pairwise over blocks, sequential within a lane: the error bound grows
                    // with the lane's share of a block plus the log of the block count.
                    let bound = abs * e * (40.0 + n.log2()) + s.abs() * out_eps;
                    if *name == "mean" {
                        (s / n, bound / n)
                    } else {
                        (s, bound)
                    }
                }
                "amax" => (extreme(grp, true), 0.0),
                "amin" => (extreme(grp, false), 0.0),
                "argmax" => (arg(grp, true) as f64, 0.0),
                _ => (arg(grp, false) as f64, 0.0),
            };
            let ok = agrees(got, want, tol);
            assert!(
                ok,
                "{name} #{k} of {c:?}: got {got}, want {want} (tol {tol})"
            );
        }
    }
    // The same bits from the portable build and from one thread.
    let portable = isa::with_level(Level::Portable, || run_all(c, &x));
    let one = run_all(c, &c.input(&device(1)));
    for (((name, a), (_, p)), (_, o)) in results.iter().zip(&portable).zip(&one) {
        assert_eq!(bits(a), bits(p), "{name}: portable build differs for {c:?}");
        assert_eq!(bits(a), bits(o), "{name}: one thread differs for {c:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn kernels_match_references_and_each_other(c in case()) {
        check(&c);
    }
}

/// The 4096-wide shapes of the benchmarks, once each way, with a NaN in one column and row.
#[test]
fn large_square_with_nan() {
    let c = Case {
        rows: 1031,
        cols: 4096,
        view: 0,
        dims: vec![0],
        dtype: DType::F32,
        seed: 5,
        special: false,
    };
    check(&c);
    check(&Case {
        dims: vec![1],
        ..c.clone()
    });
    let dev = device(2);
    let mut v = c.values();
    v[700 * 4096 + 33] = f64::NAN;
    let x = Tensor::from_vec(v, [1031, 4096], &dev)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let m0 = f64s(&x.amax(&[0], false).unwrap());
    assert!(m0[33].is_nan() && m0.iter().filter(|v| v.is_nan()).count() == 1);
    let m1 = f64s(&x.amin(&[1], false).unwrap());
    assert!(m1[700].is_nan() && m1.iter().filter(|v| v.is_nan()).count() == 1);
}
