//! 3-D pooling (`max_pool3d` with indices, `avg_pool3d`, `adaptive_avg_pool3d`): against
//! direct f64 loops that follow PyTorch's kernels (window starts, ties, NaN, divisors, indices)
//! on random shapes and options, forward and backward, on every device, and on bad input.

use crate::common::{cpu, devices, vals};
use proptest::prelude::*;
use tpu_ops::autograd::AutogradOps;
use tpu_ops::ops::conv::{
    AvgPoolOptions, MaxPoolOptions, adaptive_avg_pool3d, avg_pool3d, max_pool3d_with_indices,
};
use tpu_ops::ops::reduce::ReduceOps;
use tpu_ops::prelude::*;
use tpu_tensor::{DType, Device, Tensor};

/// PyTorch's `pooling_output_shape`.
fn out_len(len: usize, k: usize, s: usize, p: usize, d: usize, ceil: bool) -> Option<usize> {
    let (len, k, s, p, d) = (len as i64, k as i64, s as i64, p as i64, d as i64);
    let num = len + 2 * p - d * (k - 1) - 1 + if ceil { s - 1 } else { 0 };
    if num < 0 {
        return None;
    }
    let mut out = num / s + 1;
    if ceil && (out - 1) * s >= len + p {
        out -= 1;
    }
    (out >= 1).then_some(out as usize)
}

/// One problem: input `[n, c, D, H, W]` and per-dim kernel, stride, padding, dilation.
#[derive(Clone, Debug)]
struct Case {
    n: usize,
    c: usize,
    dims: [usize; 3],
    k: [usize; 3],
    s: [usize; 3],
    p: [usize; 3],
    d: [usize; 3],
    ceil: bool,
    include_pad: bool,
    divisor: Option<usize>,
    /// Values drawn from a few integers (ties), with some NaN.
    values: Vec<f64>,
}

impl Case {
    fn outs(&self) -> Option<[usize; 3]> {
        let o = [0, 1, 2].map(|i| {
            out_len(
                self.dims[i],
                self.k[i],
                self.s[i],
                self.p[i],
                self.d[i],
                self.ceil,
            )
        });
        Some([o[0]?, o[1]?, o[2]?])
    }

    fn input(&self, dev: &Device) -> Tensor {
        let [d, h, w] = self.dims;
        Tensor::from_vec(self.values.clone(), [self.n, self.c, d, h, w], &cpu())
            .unwrap()
            .to_device(dev)
            .unwrap()
    }

    fn max_opts(&self) -> MaxPoolOptions {
        MaxPoolOptions::new(self.k)
            .stride(self.s)
            .padding(self.p)
            .dilation(self.d)
            .ceil_mode(self.ceil)
    }

    fn avg_opts(&self) -> AvgPoolOptions {
        AvgPoolOptions::new(self.k)
            .stride(self.s)
            .padding(self.p)
            .ceil_mode(self.ceil)
            .count_include_pad(self.include_pad)
            .divisor_override(self.divisor)
    }

    /// Every output's taps per dim: `(start, valid taps)`, as PyTorch walks them.
    fn taps(&self, i: usize, o: usize) -> (i64, Vec<usize>) {
        let start = (o * self.s[i]) as i64 - self.p[i] as i64;
        let taps = (0..self.k[i])
            .map(|t| start + (t * self.d[i]) as i64)
            .filter(|&x| (0..self.dims[i] as i64).contains(&x))
            .map(|x| x as usize)
            .collect();
        (start, taps)
    }

    /// Direct max pooling: values and indices in `D·H·W`.
    fn max(&self) -> (Vec<f64>, Vec<i64>) {
        let [od, oh, ow] = self.outs().unwrap();
        let [_, h, w] = self.dims;
        let vol = self.dims.iter().product::<usize>();
        let (mut vs, mut is) = (Vec::new(), Vec::new());
        for plane in 0..self.n * self.c {
            let x = &self.values[plane * vol..(plane + 1) * vol];
            for a in 0..od {
                for b in 0..oh {
                    for e in 0..ow {
                        let ((s0, t0), (s1, t1), (s2, t2)) =
                            (self.taps(0, a), self.taps(1, b), self.taps(2, e));
                        // The first tap at or past 0 of each dim starts the index.
                        let first = |s: i64, dil: usize| {
                            if s >= 0 {
                                s
                            } else {
                                s + ((-s) as usize).div_ceil(dil) as i64 * dil as i64
                            }
                        };
                        let (z, y, xx) = (
                            first(s0, self.d[0]),
                            first(s1, self.d[1]),
                            first(s2, self.d[2]),
                        );
                        let mut best =
                            (f64::NEG_INFINITY, (z * (h * w) as i64) + y * w as i64 + xx);
                        for &i in &t0 {
                            for &j in &t1 {
                                for &k in &t2 {
                                    let at = (i * h + j) * w + k;
                                    if x[at] > best.0 || x[at].is_nan() {
                                        best = (x[at], at as i64);
                                    }
                                }
                            }
                        }
                        vs.push(best.0);
                        is.push(best.1);
                    }
                }
            }
        }
        (vs, is)
    }

    /// PyTorch's divisor along dim `i` for output `o`.
    fn divisor(&self, i: usize, o: usize) -> f64 {
        let start = (o * self.s[i]) as i64 - self.p[i] as i64;
        let end = (start + self.k[i] as i64).min((self.dims[i] + self.p[i]) as i64);
        if self.include_pad {
            (end - start) as f64
        } else {
            (end.min(self.dims[i] as i64) - start.max(0)).max(0) as f64
        }
    }

    /// Direct average pooling, and each output's cells with their weights (for the gradient).
    fn avg(&self) -> (Vec<f64>, Vec<Vec<(usize, f64)>>) {
        let [od, oh, ow] = self.outs().unwrap();
        let [_, h, w] = self.dims;
        let vol = self.dims.iter().product::<usize>();
        let (mut out, mut cells) = (Vec::new(), Vec::new());
        for plane in 0..self.n * self.c {
            for a in 0..od {
                for b in 0..oh {
                    for e in 0..ow {
                        let div = match self.divisor {
                            Some(d) => d as f64,
                            None => self.divisor(0, a) * self.divisor(1, b) * self.divisor(2, e),
                        };
                        let mut sum = 0.0;
                        let mut mine = Vec::new();
                        for i in self.taps(0, a).1 {
                            for j in self.taps(1, b).1 {
                                for k in self.taps(2, e).1 {
                                    let at = plane * vol + (i * h + j) * w + k;
                                    sum += self.values[at];
                                    mine.push((at, 1.0 / div));
                                }
                            }
                        }
                        out.push(sum / div);
                        cells.push(mine);
                    }
                }
            }
        }
        (out, cells)
    }
}

/// A random case; with `nan`, some values are NaN; without `dilate`, dilation is 1 (average
/// pooling has none).
fn case(nan: bool, dilate: bool) -> impl Strategy<Value = Case> {
    (
        (1usize..3, 1usize..3, [1usize..6, 1..6, 1..6]),
        (
            [1usize..4, 1..4, 1..4],
            [1usize..3, 1..3, 1..3],
            [0usize..2, 0..2, 0..2],
            [1usize..3, 1..3, 1..3],
        ),
        (
            any::<bool>(),
            any::<bool>(),
            prop::option::of(1usize..5),
            any::<u64>(),
        ),
    )
        .prop_filter_map(
            "a window fits",
            move |((n, c, dims), (k, s, p, d), (ceil, include_pad, divisor, seed))| {
                let d = if dilate { d } else { [1; 3] };
                let p = [0, 1, 2].map(|i| p[i].min(((k[i] - 1) * d[i]).div_ceil(2)));
                let vol = n * c * dims.iter().product::<usize>();
                let mut r = seed;
                let values = (0..vol)
                    .map(|_| {
                        r = r
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        match (r >> 33) % 16 {
                            0 if nan => f64::NAN,
                            v => (v % 5) as f64 - 2.0,
                        }
                    })
                    .collect();
                let case = Case {
                    n,
                    c,
                    dims,
                    k,
                    s,
                    p,
                    d,
                    ceil,
                    include_pad,
                    divisor,
                    values,
                };
                case.outs().map(|_| case)
            },
        )
}

fn same(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-12 * (1.0 + b.abs());
        assert!(
            ok,
            "{what}: element {i} is {a}, expected {b}\n{got:?}\n{want:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Values, indices and the gradient (into each maximum) against direct loops.
    #[test]
    fn max_pool3d_matches_direct_loops(case in case(true, true)) {
        let x = case.input(&cpu()).requires_grad_(true).unwrap();
        let (v, i) = max_pool3d_with_indices(&x, &case.max_opts()).unwrap();
        let (want_v, want_i) = case.max();
        let [od, oh, ow] = case.outs().unwrap();
        prop_assert_eq!(v.shape(), &[case.n, case.c, od, oh, ow][..]);
        same("max values", &vals(&v), &want_v);
        prop_assert_eq!(i.to_vec::<i64>().unwrap(), want_i.clone());
        if !want_v.iter().any(|v| v.is_nan() || v.is_infinite()) {
            let up: Vec<f64> = (0..want_v.len()).map(|k| k as f64 + 1.0).collect();
            let up_t = Tensor::from_vec(up.clone(), v.shape(), &cpu()).unwrap();
            v.mul(&up_t).unwrap().sum_all().unwrap().backward().unwrap();
            let vol = case.dims.iter().product::<usize>();
            let per_plane = od * oh * ow;
            let mut grad = vec![0.0; case.values.len()];
            for (k, &idx) in want_i.iter().enumerate() {
                grad[(k / per_plane) * vol + idx as usize] += up[k];
            }
            same("max grad", &vals(&x.grad().unwrap()), &grad);
        }
    }

    /// Values and the gradient against direct loops.
    #[test]
    fn avg_pool3d_matches_direct_loops(case in case(false, false)) {
        let x = case.input(&cpu()).requires_grad_(true).unwrap();
        let a = avg_pool3d(&x, &case.avg_opts()).unwrap();
        let (want, cells) = case.avg();
        same("avg values", &vals(&a), &want);
        let up: Vec<f64> = (0..want.len()).map(|k| k as f64 - 3.0).collect();
        a.mul(&Tensor::from_vec(up.clone(), a.shape(), &cpu()).unwrap())
            .unwrap().sum_all().unwrap().backward().unwrap();
        let mut grad = vec![0.0; case.values.len()];
        for (k, mine) in cells.iter().enumerate() {
            for &(at, wgt) in mine {
                grad[at] += up[k] * wgt;
            }
        }
        same("avg grad", &vals(&x.grad().unwrap()), &grad);
    }

    /// Adaptive pooling against direct loops over PyTorch's windows.
    #[test]
    fn adaptive_avg_pool3d_matches_direct_loops(
        dims in [1usize..7, 1..7, 1..7],
        out in [1usize..5, 1..5, 1..5],
        seed in 0u64..1000,
    ) {
        let vol: usize = dims.iter().product();
        let x: Vec<f64> = (0..2 * vol).map(|i| ((i as u64 * 2654435761 + seed) % 97) as f64 / 7.0).collect();
        let t = Tensor::from_vec(x.clone(), [2, dims[0], dims[1], dims[2]], &cpu()).unwrap();
        let got = adaptive_avg_pool3d(&t, out).unwrap();
        prop_assert_eq!(got.shape(), &[2, out[0], out[1], out[2]][..]);
        let win = |len: usize, o: usize, i: usize| (i * len / o, ((i + 1) * len).div_ceil(o));
        let mut want = Vec::new();
        for c in 0..2 {
            for a in 0..out[0] {
                for b in 0..out[1] {
                    for e in 0..out[2] {
                        let ((d0, d1), (h0, h1), (w0, w1)) =
                            (win(dims[0], out[0], a), win(dims[1], out[1], b), win(dims[2], out[2], e));
                        let mut s = 0.0;
                        for i in d0..d1 { for j in h0..h1 { for k in w0..w1 {
                            s += x[c * vol + (i * dims[1] + j) * dims[2] + k];
                        } } }
                        want.push(s / ((d1 - d0) * (h1 - h0) * (w1 - w0)) as f64);
                    }
                }
            }
        }
        same("adaptive", &vals(&got), &want);
    }
}

/// The three on every device (f32, so PJRT runs them through XLA) against the loops, with
/// padding, dilation, ceil mode, ties and a NaN.
#[test]
fn pool3d_gives_the_loops_values_on_every_device() {
    let dims = [5, 4, 6];
    let vol: usize = dims.iter().product();
    let mut values: Vec<f64> = (0..2 * vol).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
    values[17] = f64::NAN;
    let case = Case {
        n: 1,
        c: 2,
        dims,
        k: [3, 2, 3],
        s: [2, 1, 2],
        p: [1, 0, 1],
        d: [1, 2, 1],
        ceil: true,
        include_pad: false,
        divisor: None,
        values,
    };
    let (mv, mi) = case.max();
    let (avg, _) = Case {
        d: [1, 1, 1],
        ..case.clone()
    }
    .avg();
    for dev in devices() {
        let x = case.input(&dev).to_dtype(DType::F32).unwrap();
        let (v, i) = max_pool3d_with_indices(&x, &case.max_opts()).unwrap();
        same(&format!("max on {dev}"), &vals(&v), &mv);
        assert_eq!(
            i.to_device(&cpu()).unwrap().to_vec::<i64>().unwrap(),
            mi,
            "{dev}"
        );
        let a = avg_pool3d(&x, &case.avg_opts()).unwrap();
        let got = vals(&a);
        for (k, (g, w)) in got.iter().zip(&avg).enumerate() {
            assert!(
                (g.is_nan() && w.is_nan()) || (g - w).abs() < 1e-5,
                "avg on {dev}: {k}: {g} vs {w}"
            );
        }
        // Unbatched input keeps its rank.
        let one = x.squeeze_dim(0).unwrap();
        assert_eq!(
            adaptive_avg_pool3d(&one, [2, 3, 1]).unwrap().shape(),
            [2, 2, 3, 1]
        );
    }
}

#[test]
fn pool3d_refuses_bad_input() {
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &cpu()).unwrap();
    let e = max_pool3d_with_indices(&z(&[2, 3, 3]), &MaxPoolOptions::new(2)).unwrap_err();
    assert!(
        e.to_string().contains("expected a 4-D [C, D, H, W] or 5-D"),
        "{e}"
    );
    let e = avg_pool3d(&z(&[1, 1, 1, 3, 3]), &AvgPoolOptions::new(2)).unwrap_err();
    assert!(e.to_string().contains("a depth of 1"), "{e}");
    let e = avg_pool3d(&z(&[1, 1, 4, 4, 4]), &AvgPoolOptions::new(2).padding(2)).unwrap_err();
    assert!(
        e.to_string().contains("padding must be at most half"),
        "{e}"
    );
    let e =
        max_pool3d_with_indices(&z(&[1, 1, 4, 4, 4]), &MaxPoolOptions::new([2, 2])).unwrap_err();
    assert!(
        e.to_string().contains("kernel_size to have 1 or 3 values"),
        "{e}"
    );
    let ints = Tensor::zeros([1, 2, 2, 2], DType::I64, &cpu()).unwrap();
    assert!(adaptive_avg_pool3d(&ints, 1).is_err());
    let e = adaptive_avg_pool3d(&z(&[1, 2, 2, 2]), [0, 1, 1]).unwrap_err();
    assert!(e.to_string().contains("non-zero output depth"), "{e}");
}
