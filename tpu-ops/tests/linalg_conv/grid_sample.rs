//! `grid_sample` (Core ATen's `grid_sampler_2d`): against a direct f64 port of the scalar
//! steps of PyTorch's CPU kernel (proptest), finite differences for the input and the grid,
//! values worked out by hand on every device, XLA against the native CPU, and bad input.

use crate::common::{Rng, check_near, cpu, f32s, gradcheck_or_panic, has, pjrt, randn, vals};
use proptest::prelude::*;
use tpu_ops::ops::conv::{GridMode, GridPadding, GridSampleOptions, grid_sample};
use tpu_ops::prelude::*;
use tpu_tensor::{DType, Device, Tensor};

const MODES: [GridMode; 3] = [GridMode::Bilinear, GridMode::Nearest, GridMode::Bicubic];
const PADS: [GridPadding; 3] = [
    GridPadding::Zeros,
    GridPadding::Border,
    GridPadding::Reflection,
];

fn unnormalize(g: f64, size: usize, ac: bool) -> f64 {
    let s = size as f64;
    if ac {
        (g + 1.0) / 2.0 * (s - 1.0)
    } else {
        ((g + 1.0) * s - 1.0) / 2.0
    }
}

fn reflect(v: f64, twice_low: f64, twice_high: f64) -> f64 {
    if twice_low == twice_high {
        return 0.0;
    }
    let min = twice_low / 2.0;
    let span = (twice_high - twice_low) / 2.0;
    let v = (v - min).abs();
    let extra = v % span;
    if (v / span).floor() as i64 % 2 == 0 {
        extra + min
    } else {
        span - extra + min
    }
}

fn pad(v: f64, size: usize, o: &GridSampleOptions) -> f64 {
    let clip = |v: f64| v.max(0.0).min(size as f64 - 1.0);
    match o.padding_mode {
        GridPadding::Zeros => v,
        GridPadding::Border => clip(v),
        GridPadding::Reflection if o.align_corners => {
            clip(reflect(v, 0.0, 2.0 * (size as f64 - 1.0)))
        }
        GridPadding::Reflection => clip(reflect(v, -1.0, 2.0 * size as f64 - 1.0)),
    }
}

fn cubic(t: f64) -> [f64; 4] {
    let a = -0.75;
    let near = |d: f64| ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0;
    let far = |d: f64| ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

/// PyTorch's CPU `grid_sampler_2d` one output element at a time.
fn reference(
    x: &[f64],
    xs: [usize; 4],
    grid: &[f64],
    gs: [usize; 3],
    o: &GridSampleOptions,
) -> Vec<f64> {
    let [n, c, h, w] = xs;
    let [_, ho, wo] = gs;
    let read = |b: usize, ch: usize, px: f64, py: f64| {
        if px >= 0.0 && px <= w as f64 - 1.0 && py >= 0.0 && py <= h as f64 - 1.0 {
            x[((b * c + ch) * h + py as usize) * w + px as usize]
        } else {
            0.0
        }
    };
    let mut out = Vec::new();
    for b in 0..n {
        for ch in 0..c {
            for p in 0..ho * wo {
                let gx = grid[(b * ho * wo + p) * 2];
                let gy = grid[(b * ho * wo + p) * 2 + 1];
                let (ix, iy) = (
                    unnormalize(gx, w, o.align_corners),
                    unnormalize(gy, h, o.align_corners),
                );
                let v = match o.mode {
                    GridMode::Bilinear => {
                        let (ix, iy) = (pad(ix, w, o), pad(iy, h, o));
                        let (x0, y0) = (ix.floor(), iy.floor());
                        let (e, s) = (ix - x0, iy - y0);
                        read(b, ch, x0, y0) * (1.0 - e) * (1.0 - s)
                            + read(b, ch, x0 + 1.0, y0) * e * (1.0 - s)
                            + read(b, ch, x0, y0 + 1.0) * (1.0 - e) * s
                            + read(b, ch, x0 + 1.0, y0 + 1.0) * e * s
                    }
                    GridMode::Nearest => {
                        let (ix, iy) = (pad(ix, w, o), pad(iy, h, o));
                        read(b, ch, ix.round_ties_even(), iy.round_ties_even())
                    }
                    GridMode::Bicubic => {
                        let (x0, y0) = (ix.floor(), iy.floor());
                        let (wx, wy) = (cubic(ix - x0), cubic(iy - y0));
                        let mut acc = 0.0;
                        for (j, wy) in wy.iter().enumerate() {
                            for (i, wx) in wx.iter().enumerate() {
                                let px = pad(x0 - 1.0 + i as f64, w, o);
                                let py = pad(y0 - 1.0 + j as f64, h, o);
                                acc += read(b, ch, px, py) * wx * wy;
                            }
                        }
                        acc
                    }
                };
                out.push(v);
            }
        }
    }
    out
}

#[derive(Clone, Debug)]
struct Case {
    xs: [usize; 4],
    gs: [usize; 3],
    opts: GridSampleOptions,
    seed: u64,
}

fn cases() -> impl Strategy<Value = Case> {
    (any::<u64>(), 0usize..3, 0usize..3, any::<bool>()).prop_map(|(seed, m, p, ac)| {
        let mut r = Rng::new(seed);
        let xs = [r.range(1, 2), r.range(1, 2), r.range(1, 4), r.range(1, 4)];
        Case {
            xs,
            gs: [xs[0], r.range(1, 3), r.range(1, 3)],
            opts: GridSampleOptions {
                mode: MODES[m],
                padding_mode: PADS[p],
                align_corners: ac,
            },
            seed,
        }
    })
}

impl Case {
    fn inputs(&self) -> [Tensor; 2] {
        let [n, ho, wo] = self.gs;
        // Grid values reach past [-1, 1], where the padding modes differ.
        let grid = randn(self.seed ^ 3, &[n, ho, wo, 2]).mul(1.3).unwrap();
        [randn(self.seed, &self.xs), grid]
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(96)))]

    #[test]
    fn grid_sample_matches_pytorchs_steps(c in cases()) {
        let [x, grid] = c.inputs();
        let got = grid_sample(&x, &grid, &c.opts).unwrap();
        let [n, ch, _, _] = c.xs;
        prop_assert_eq!(got.shape(), &[n, ch, c.gs[1], c.gs[2]][..]);
        let want = reference(&vals(&x), c.xs, &vals(&grid), c.gs, &c.opts);
        check_near(&format!("{c:?}"), &vals(&got), &want, 1e-12);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(24)))]

    #[test]
    fn grid_sample_gradcheck(c in cases()) {
        // Finite differences cross no pixel boundary unless a grid value lies within 1e-6 of
        // one, which randn values do not.
        gradcheck_or_panic(
            "grid_sample",
            |t| grid_sample(&t[0], &t[1], &c.opts),
            &c.inputs(),
            1e-6,
            1e-5,
        );
    }
}

#[test]
fn hand_worked_values_on_every_device() {
    let mut devs = vec![cpu()];
    devs.extend(pjrt("grid_sample hand_worked_values_on_every_device"));
    for dev in &devs {
        // x = torch.tensor([[[[1., 2.], [3., 4.]]]])
        let x = f32s(&[1., 2., 3., 4.], &[1, 1, 2, 2], dev);
        let at = |gx: f64, gy: f64, mode, padding_mode, align_corners| {
            let grid = f32s(&[gx, gy], &[1, 1, 1, 2], dev);
            let opts = GridSampleOptions {
                mode,
                padding_mode,
                align_corners,
            };
            let y = grid_sample(&x, &grid, &opts).unwrap();
            assert_eq!(y.device(), dev);
            vals(&y)[0]
        };
        use GridMode::*;
        use GridPadding::*;
        // The centre averages all four pixels.
        assert_eq!(at(0., 0., Bilinear, Zeros, false), 2.5, "{dev}");
        // (-1, -1) is the outer corner without align_corners: a quarter of pixel (0, 0) and
        // zeros; the border repeats it; reflection mirrors onto it.
        assert_eq!(at(-1., -1., Bilinear, Zeros, false), 0.25, "{dev}");
        assert_eq!(at(-1., -1., Bilinear, Border, false), 1.0, "{dev}");
        assert_eq!(at(-1., -1., Bilinear, Reflection, false), 1.0, "{dev}");
        // With align_corners it is the centre of pixel (0, 0).
        assert_eq!(at(-1., -1., Bilinear, Zeros, true), 1.0, "{dev}");
        // Nearest at x = 1.0, y = 0.5 (halves round to even): pixel (1, 0).
        assert_eq!(at(0.5, 0., Nearest, Zeros, false), 2.0, "{dev}");
        // Bicubic at the centre: weights [-0.09375, 0.59375, 0.59375, -0.09375] per axis; with
        // zeros outside, 0.59375² · (1 + 2 + 3 + 4); with the border, 0.5 per pixel and axis.
        assert_eq!(at(0., 0., Bicubic, Zeros, false), 3.525390625, "{dev}");
        assert_eq!(at(0., 0., Bicubic, Border, false), 2.5, "{dev}");
    }
}

#[test]
fn xla_matches_the_native_cpu() {
    let Some(dev) = pjrt("grid_sample xla_matches_the_native_cpu") else {
        return;
    };
    for mode in MODES {
        for padding_mode in PADS {
            for align_corners in [false, true] {
                let opts = GridSampleOptions {
                    mode,
                    padding_mode,
                    align_corners,
                };
                let run = |dev: &Device| {
                    let leaf = |t: Tensor| {
                        t.to_dtype(DType::F32)
                            .unwrap()
                            .to_device(dev)
                            .unwrap()
                            .requires_grad_(true)
                            .unwrap()
                    };
                    let x = leaf(randn(1, &[2, 3, 5, 4]));
                    let grid = leaf(randn(2, &[2, 3, 4, 2]).mul(1.3).unwrap());
                    let y = grid_sample(&x, &grid, &opts).unwrap();
                    y.mul(&y).unwrap().sum_all().unwrap().backward().unwrap();
                    // Nearest sampling's weights do not depend on the grid: no gradient
                    // reaches it (PyTorch gives zeros).
                    let grid_grad = match grid.grad() {
                        Some(g) => g,
                        None if mode == GridMode::Nearest => grid.zeros_like().unwrap(),
                        None => panic!("no gradient for the grid under {opts:?}"),
                    };
                    [y, x.grad().unwrap(), grid_grad].map(|t| vals(&t))
                };
                let (a, b) = (run(&cpu()), run(&dev));
                for i in 0..3 {
                    check_near(&format!("{opts:?} output {i}"), &b[i], &a[i], 1e-4);
                }
            }
        }
    }
}

#[test]
fn bad_input_is_refused() {
    let dev = cpu();
    let x = f32s(&[0.; 8], &[2, 1, 2, 2], &dev);
    let grid = f32s(&[0.; 4], &[2, 1, 1, 2], &dev);
    let o = GridSampleOptions::default();
    let err = |r: tpu_tensor::Result<Tensor>| r.unwrap_err().to_string();
    has(
        err(grid_sample(&x.reshape([2, 2, 2]).unwrap(), &grid, &o)),
        &["grid_sampler_2d", "4-D [N, C, H, W]", "[2, 2, 2]"],
    );
    has(
        err(grid_sample(&x, &grid.reshape([1, 2, 1, 2]).unwrap(), &o)),
        &["grid of shape [2, Ho, Wo, 2]", "got [1, 2, 1, 2]"],
    );
    has(
        err(grid_sample(&x, &grid.reshape([2, 1, 2, 1]).unwrap(), &o)),
        &["[2, 1, 2, 1]"],
    );
    let g64 = grid.to_dtype(DType::F64).unwrap();
    has(err(grid_sample(&x, &g64, &o)), &["grid", "f32", "f64"]);
    let xi = x.to_dtype(DType::I64).unwrap();
    has(
        err(grid_sample(&xi, &grid, &o)),
        &["floating-point input", "i64"],
    );
    let empty = f32s(&[], &[2, 1, 0, 2], &dev);
    has(err(grid_sample(&empty, &grid, &o)), &["non-zero H and W"]);
}
