//! Convolutions, pooling and interpolation: against direct f64 loops on random small shapes
//! (proptest), against values computed by PyTorch, through XLA (the PJRT CPU plugin), and on
//! bad input.

use crate::ConvCase;
use crate::common::{cpu, devices, pjrt, seq, vals};
use proptest::prelude::*;
use tpu_ops::cpu::isa::{Level, with_level};
use tpu_ops::ops::conv::{
    AvgPoolOptions, ConvOps, ConvOptions, ConvTransposeOptions, InterpolateMode, MaxPoolOptions,
    Padding, Resize,
};
use tpu_ops::testing::special_halves;
use tpu_tensor::{DType, Device, Error, Generator, Tensor};

// ---- helpers ----------------------------------------------------------------------------------

/// Asserts that `got` and `want` agree within `tol` (absolute and relative); NaN matches NaN.
fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let ok = (a.is_nan() && b.is_nan())
            || a == b
            || (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()));
        assert!(
            ok,
            "{what}: element {i} is {a}, expected {b}\ngot  {got:?}\nwant {want:?}"
        );
    }
}

/// Seeded normal values of `shape` (f64 on the CPU); with `transposed`, a view of the same
/// shape whose last two dims are swapped in memory.
fn input(seed: u64, shape: &[usize], transposed: bool) -> Tensor {
    let mut g = Generator::new(seed);
    if !transposed || shape.len() < 2 {
        return g.randn(shape, DType::F64, &cpu()).unwrap();
    }
    let r = shape.len();
    let mut stored = shape.to_vec();
    stored.swap(r - 1, r - 2);
    let t = g.randn(&stored[..], DType::F64, &cpu()).unwrap();
    let t = t.transpose(r - 1, r - 2).unwrap();
    assert!(!t.is_contiguous() || shape[r - 1] == 1 || shape[r - 2] == 1);
    t
}

// ---- direct reference loops (f64) -------------------------------------------------------------

/// `out[n, o, y, x] = bias[o] + sum x[n, g * cg + c, y * s - p + ki * d, ...] * w[o, c, ki, kj]`.
fn ref_conv(x: &[f64], w: &[f64], b: Option<&[f64]>, c: &ConvCase) -> Vec<f64> {
    let [oh, ow] = c.out().unwrap();
    let (cin, o) = (c.cg * c.groups, c.og * c.groups);
    let mut out = Vec::new();
    for n in 0..c.n {
        for oc in 0..o {
            let grp = oc / c.og;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b[oc]);
                    for ci in 0..c.cg {
                        for ki in 0..c.kh {
                            for kj in 0..c.kw {
                                let iy = (oy * c.s[0] + ki * c.d[0]) as i64 - c.p[0][0] as i64;
                                let ix = (ox * c.s[1] + kj * c.d[1]) as i64 - c.p[1][0] as i64;
                                if iy < 0 || ix < 0 || iy >= c.h as i64 || ix >= c.w as i64 {
                                    continue;
                                }
                                let xc = grp * c.cg + ci;
                                let xv =
                                    x[((n * cin + xc) * c.h + iy as usize) * c.w + ix as usize];
                                let wv = w[((oc * c.cg + ci) * c.kh + ki) * c.kw + kj];
                                acc += xv * wv;
                            }
                        }
                    }
                    out.push(acc);
                }
            }
        }
    }
    out
}

/// Transposed convolution by scattering every input element times the kernel.
fn ref_conv_t(
    x: &[f64],
    w: &[f64],
    b: Option<&[f64]>,
    c: &ConvCase,
    op: [usize; 2],
) -> (Vec<f64>, [usize; 2]) {
    let [oh, ow] = c.transposed_out(op).map(|n| n as usize);
    let (cin, o) = (c.cg * c.groups, c.og * c.groups);
    let mut out = vec![0.0; c.n * o * oh * ow];
    for n in 0..c.n {
        for ic in 0..cin {
            let grp = ic / c.cg;
            for iy in 0..c.h {
                for ix in 0..c.w {
                    let xv = x[((n * cin + ic) * c.h + iy) * c.w + ix];
                    for oc in 0..c.og {
                        for ki in 0..c.kh {
                            for kj in 0..c.kw {
                                let y = (iy * c.s[0] + ki * c.d[0]) as i64 - c.p[0][0] as i64;
                                let xx = (ix * c.s[1] + kj * c.d[1]) as i64 - c.p[1][0] as i64;
                                if y < 0 || xx < 0 || y >= oh as i64 || xx >= ow as i64 {
                                    continue;
                                }
                                let wv = w[((ic * c.og + oc) * c.kh + ki) * c.kw + kj];
                                let och = grp * c.og + oc;
                                out[((n * o + och) * oh + y as usize) * ow + xx as usize] +=
                                    xv * wv;
                            }
                        }
                    }
                }
            }
        }
    }
    if let Some(b) = b {
        for (i, v) in out.iter_mut().enumerate() {
            *v += b[(i / (oh * ow)) % o];
        }
    }
    (out, [oh, ow])
}

/// PyTorch's `pooling_output_shape`.
fn pool_len(len: usize, k: usize, s: usize, p: usize, d: usize, ceil: bool) -> i64 {
    let (len, k, s, p, d) = (len as i64, k as i64, s as i64, p as i64, d as i64);
    let num = len + 2 * p - d * (k - 1) - 1 + if ceil { s - 1 } else { 0 };
    let mut o = num.div_euclid(s) + 1;
    if ceil && (o - 1) * s >= len + p {
        o -= 1;
    }
    o
}

#[derive(Clone, Debug)]
struct PoolCase {
    planes: usize,
    h: usize,
    w: usize,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    ceil: bool,
}

impl PoolCase {
    /// `planes` planes of `[h, w]`, pooled by windows `k` with stride `s`, padding `p` and
    /// dilation `d` per dim, rounding the output size up with `ceil`.
    fn new(
        planes: usize,
        [h, w]: [usize; 2],
        k: [usize; 2],
        s: [usize; 2],
        p: [usize; 2],
        d: [usize; 2],
        ceil: bool,
    ) -> Self {
        PoolCase {
            planes,
            h,
            w,
            k,
            s,
            p,
            d,
            ceil,
        }
    }

    fn out(&self) -> [i64; 2] {
        [
            pool_len(
                self.h, self.k[0], self.s[0], self.p[0], self.d[0], self.ceil,
            ),
            pool_len(
                self.w, self.k[1], self.s[1], self.p[1], self.d[1], self.ceil,
            ),
        ]
    }

    fn valid(&self) -> bool {
        let pad_ok = (0..2).all(|i| self.p[i] <= ((self.k[i] - 1) * self.d[i]).div_ceil(2));
        pad_ok && self.out().iter().all(|&o| o >= 1)
    }
}

/// Max pooling over the taps in row-major order: a larger value or any NaN replaces the best.
fn ref_max_pool(x: &[f64], c: &PoolCase) -> (Vec<f64>, Vec<i64>) {
    let [oh, ow] = c.out().map(|v| v as usize);
    let (mut vals, mut idx) = (Vec::new(), Vec::new());
    for pl in 0..c.planes {
        for oy in 0..oh {
            for ox in 0..ow {
                // A window whose taps all fall in the padding gives -inf at its first tap
                // inside the input's bounds, as PyTorch.
                let first = |o: usize, i: usize| {
                    let mut t = (o * c.s[i]) as i64 - c.p[i] as i64;
                    while t < 0 {
                        t += c.d[i] as i64;
                    }
                    t
                };
                let mut best: Option<(f64, i64)> = None;
                for ki in 0..c.k[0] {
                    for kj in 0..c.k[1] {
                        let iy = (oy * c.s[0] + ki * c.d[0]) as i64 - c.p[0] as i64;
                        let ix = (ox * c.s[1] + kj * c.d[1]) as i64 - c.p[1] as i64;
                        if iy < 0 || ix < 0 || iy >= c.h as i64 || ix >= c.w as i64 {
                            continue;
                        }
                        let i = iy * c.w as i64 + ix;
                        let v = x[pl * c.h * c.w + i as usize];
                        match best {
                            Some((b, _)) if !(v > b || v.is_nan()) => {}
                            _ => best = Some((v, i)),
                        }
                    }
                }
                let (v, i) =
                    best.unwrap_or((f64::NEG_INFINITY, first(oy, 0) * c.w as i64 + first(ox, 1)));
                vals.push(v);
                idx.push(i);
            }
        }
    }
    (vals, idx)
}

/// Average pooling with PyTorch's divisors.
fn ref_avg_pool(x: &[f64], c: &PoolCase, include_pad: bool, divisor: Option<usize>) -> Vec<f64> {
    let [oh, ow] = c.out().map(|v| v as usize);
    let mut out = Vec::new();
    for pl in 0..c.planes {
        for oy in 0..oh {
            for ox in 0..ow {
                let (mut sum, mut inside, mut padded) = (0.0, 0usize, 0usize);
                for ki in 0..c.k[0] {
                    for kj in 0..c.k[1] {
                        let iy = (oy * c.s[0] + ki) as i64 - c.p[0] as i64;
                        let ix = (ox * c.s[1] + kj) as i64 - c.p[1] as i64;
                        let in_pad = iy < (c.h + c.p[0]) as i64 && ix < (c.w + c.p[1]) as i64;
                        if in_pad {
                            padded += 1;
                        }
                        if iy >= 0 && ix >= 0 && iy < c.h as i64 && ix < c.w as i64 {
                            inside += 1;
                            sum += x[pl * c.h * c.w + iy as usize * c.w + ix as usize];
                        }
                    }
                }
                let div = divisor.unwrap_or(if include_pad { padded } else { inside });
                out.push(sum / div as f64);
            }
        }
    }
    out
}

fn ref_adaptive(x: &[f64], planes: usize, h: usize, w: usize, oh: usize, ow: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for pl in 0..planes {
        for oy in 0..oh {
            let (y0, y1) = (oy * h / oh, ((oy + 1) * h).div_ceil(oh));
            for ox in 0..ow {
                let (x0, x1) = (ox * w / ow, ((ox + 1) * w).div_ceil(ow));
                let mut sum = 0.0;
                for iy in y0..y1 {
                    for ix in x0..x1 {
                        sum += x[pl * h * w + iy * w + ix];
                    }
                }
                out.push(sum / ((y1 - y0) * (x1 - x0)) as f64);
            }
        }
    }
    out
}

// ---- proptests --------------------------------------------------------------------------------

fn conv_case(spatial: usize) -> impl Strategy<Value = ConvCase> {
    let hk = if spatial == 1 { 1..=1usize } else { 1..=3usize };
    let hh = if spatial == 1 { 1..=1usize } else { 1..=7usize };
    let hp = if spatial == 1 { 0..=0usize } else { 0..=2usize };
    let hs = if spatial == 1 { 1..=1usize } else { 1..=3usize };
    let hd = if spatial == 1 { 1..=1usize } else { 1..=2usize };
    (
        (1..=2usize, 1..=3usize, 1..=2usize, 1..=2usize),
        (hh, 1..=7usize, hk, 1..=3usize),
        (hs, 1..=3usize, hp.clone(), hp, 0..=2usize, 0..=2usize),
        (hd, 1..=2usize),
    )
        .prop_map(
            |((n, groups, cg, og), (h, w, kh, kw), (s0, s1, p0, p1, q0, q1), (d0, d1))| {
                ConvCase::new(
                    [n, groups, cg, og, h, w, kh, kw],
                    [s0, s1],
                    [[p0, p1], [q0, q1]],
                    [d0, d1],
                )
            },
        )
}

/// Runs a conv case through `conv2d` (or `conv1d`) in every float dtype against the reference.
fn check_conv(c: &ConvCase, spatial: usize, bias: bool, transposed: bool, seed: u64) {
    // 16-bit inputs against the loops over their rounded values: f32 sums rounded once.
    let cases = [
        (DType::F64, 1e-12),
        (DType::F32, 1e-5),
        (DType::BF16, 2f64.powi(-8)),
        (DType::F16, 2f64.powi(-11)),
    ];
    check_conv_in(c, spatial, bias, transposed, seed, &cases);
}

/// [`check_conv`] in the dtypes of `cases`, each within its tolerance.
fn check_conv_in(
    c: &ConvCase,
    spatial: usize,
    bias: bool,
    transposed: bool,
    seed: u64,
    cases: &[(DType, f64)],
) {
    let cin = c.cg * c.groups;
    let o = c.og * c.groups;
    let (xs, ws): (Vec<usize>, Vec<usize>) = if spatial == 2 {
        (vec![c.n, cin, c.h, c.w], vec![o, c.cg, c.kh, c.kw])
    } else {
        (vec![c.n, cin, c.w], vec![o, c.cg, c.kw])
    };
    let x = input(seed, &xs, transposed);
    let w = input(seed + 1, &ws, false);
    let b = input(seed + 2, &[o], false);
    let symmetric = c.p.iter().all(|p| p[0] == p[1]);
    let padding = if symmetric && spatial == 2 {
        Padding::Symmetric([c.p[0][0], c.p[1][0]].into())
    } else if spatial == 2 {
        Padding::Sides(c.p.to_vec())
    } else {
        Padding::Sides(vec![c.p[1]])
    };
    let (s, d) = if spatial == 2 {
        (c.s.to_vec(), c.d.to_vec())
    } else {
        (vec![c.s[1]], vec![c.d[1]])
    };
    let opts = ConvOptions::new()
        .stride(s)
        .padding(padding)
        .dilation(d)
        .groups(c.groups);
    for &(dtype, tol) in cases {
        let (x, w, b) = (
            x.to_dtype(dtype).unwrap(),
            w.to_dtype(dtype).unwrap(),
            b.to_dtype(dtype).unwrap(),
        );
        let want = ref_conv(&vals(&x), &vals(&w), bias.then(|| vals(&b)).as_deref(), c);
        let bias = bias.then_some(&b);
        let y = if spatial == 2 {
            x.conv2d(&w, bias, &opts)
        } else {
            x.conv1d(&w, bias, &opts)
        }
        .unwrap();
        let [oh, ow] = c.out().unwrap();
        let shape: Vec<usize> = if spatial == 2 {
            vec![c.n, o, oh, ow]
        } else {
            vec![c.n, o, ow]
        };
        assert_eq!(y.shape(), &shape[..], "{c:?}");
        assert_eq!(y.dtype(), dtype);
        close(&format!("{c:?} {dtype}"), &vals(&y), &want, tol);
    }
}

// ---- special values ---------------------------------------------------------------------------

/// One convolution of special values at the current level, in every float dtype: NaN exactly
/// where the direct f64 loop gives NaN, the same infinity where it is infinite, and finite
/// values within the dtype's rounding.
fn special_conv(c: &ConvCase, seed: u64, rate: u64) -> Result<(), TestCaseError> {
    let (cin, o) = (c.cg * c.groups, c.og * c.groups);
    let xs = [c.n, cin, c.h, c.w];
    let ws = [o, c.cg, c.kh, c.kw];
    let opts = ConvOptions::new().stride(c.s).groups(c.groups);
    let level = tpu_ops::cpu::isa::level();
    for d in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let t = |v: Vec<f64>, shape: &[usize]| {
            Tensor::from_vec(v, shape, &cpu())
                .unwrap()
                .to_dtype(d)
                .unwrap()
        };
        let x = t(special_halves(seed, xs.iter().product(), rate), &xs);
        let w = t(special_halves(!seed, ws.iter().product(), rate), &ws);
        let b = t(special_halves(seed.rotate_left(9), o, rate), &[o]);
        let (xv, wv, bv) = (vals(&x), vals(&w), vals(&b));
        let want = ref_conv(&xv, &wv, Some(&bv), c);
        let abs = |v: &[f64]| v.iter().map(|e| e.abs()).collect::<Vec<f64>>();
        let mag = ref_conv(&abs(&xv), &abs(&wv), Some(&abs(&bv)), c);
        let got = vals(&x.conv2d(&w, Some(&b), &opts).unwrap());
        let tol = match d {
            DType::F64 => 1e-12,
            DType::F32 => 1e-5,
            _ => 1e-2,
        };
        prop_assert_eq!(got.len(), want.len());
        for (i, ((g, w), m)) in got.iter().zip(&want).zip(&mag).enumerate() {
            let ok = tpu_ops::testing::matches_ieee(*g, *w, tol * (1.0 + m));
            prop_assert!(
                ok,
                "{:?} {} at {:?}, element {}: got {}, the direct loop {}",
                c,
                d,
                level,
                i,
                g,
                w
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(16)))]

    /// Convolutions (im2col blocks into the f32 product, the 16-bit products, the implicit
    /// bf16 product, the pointwise path) give IEEE results for ±inf, NaN and -0.0 at every instruction-set level. Without
    /// padding: PyTorch's result for an infinite weight over zero padding differs between its
    /// dtypes (NaN in f32 and f64, the padding skipped in bf16).
    #[test]
    fn convolutions_of_special_values_are_ieee(
        (groups, cg, og) in (1usize..3, 1usize..4, 1usize..4),
        (h, w, kh, kw) in (1usize..7, 1usize..7, 1usize..4, 1usize..4),
        (s, seed, rate) in (1usize..3, any::<u64>(), prop::sample::select(vec![1u64, 4, 12])),
        n in 1usize..3,
    ) {
        // One image splits by output planes, which bf16 with a stride of one runs as the
        // implicit product on AVX512_BF16; two batch their small planes into one product.
        let c = ConvCase {
            n,
            groups,
            cg,
            og,
            h,
            w,
            kh: kh.min(h),
            kw: kw.min(w),
            s: [s, s],
            p: [[0, 0], [0, 0]],
            d: [1, 1],
        };
        for level in [Level::Portable, Level::Avx2, Level::Avx512] {
            with_level(level, || special_conv(&c, seed, rate))?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(48)))]

    #[test]
    fn conv2d_matches_direct_loops(
        c in conv_case(2), bias in any::<bool>(), transposed in any::<bool>(), seed in 0u64..1000,
    ) {
        prop_assume!(c.out().is_some());
        check_conv(&c, 2, bias, transposed, seed);
    }

    /// Stride-one convolutions of one image, or of images with large planes, which bf16 runs
    /// as the implicit product on processors with AVX512_BF16, or on AMX tiles where the input
    /// channels fill their steps of 16 pairs (32 and 64) (odd channel counts, channel blocks
    /// past one 32-lane panel, widths below and past the 14- and 32-position tiles, rows of
    /// whole tiles, padding and dilation on either side), in the 16-bit dtypes; other
    /// processors take the general path.
    #[test]
    fn stride_one_convolutions_match_direct_loops(
        (n, groups) in (1usize..3, 1usize..3),
        (cg, og) in (
            prop::sample::select(vec![1usize, 2, 3, 7, 17, 32, 64]),
            prop::sample::select(vec![1usize, 5, 31, 33, 65]),
        ),
        (h, w) in (
            prop::sample::select(vec![1usize, 2, 7, 17]),
            prop::sample::select(vec![1usize, 7, 13, 17, 28, 63]),
        ),
        (kh, kw, d0, d1) in (1usize..4, 1usize..4, 1usize..3, 1usize..3),
        (p0, p1, q0, q1) in (0usize..3, 0usize..3, 0usize..3, 0usize..3),
        bias in any::<bool>(), transposed in any::<bool>(), seed in 0u64..1000,
    ) {
        let c = ConvCase::new(
            [n, groups, cg, og, h, w, kh, kw],
            [1, 1],
            [[p0, p1], [q0, q1]],
            [d0, d1],
        );
        prop_assume!(c.out().is_some());
        // The 16-bit dtypes (sums of up to 153 products: f32's tolerance is for fewer).
        let cases = [(DType::BF16, 2f64.powi(-8)), (DType::F16, 2f64.powi(-11))];
        check_conv_in(&c, 2, bias, transposed, seed, &cases);
    }

    #[test]
    fn conv1d_matches_direct_loops(
        c in conv_case(1), bias in any::<bool>(), transposed in any::<bool>(), seed in 0u64..1000,
    ) {
        prop_assume!(c.out().is_some());
        check_conv(&c, 1, bias, transposed, seed);
    }

    #[test]
    fn conv_transpose2d_matches_direct_loops(
        c in conv_case(2), op in (0..=2usize, 0..=2usize), bias in any::<bool>(),
        transposed in any::<bool>(), seed in 0u64..1000,
    ) {
        // Symmetric padding only, output padding below stride or dilation.
        let c = c.symmetric();
        let op = [op.0, op.1];
        prop_assume!(c.transpose_fits(op));
        let (cin, o) = (c.cg * c.groups, c.og * c.groups);
        let x = input(seed, &[c.n, cin, c.h, c.w], transposed);
        let w = input(seed + 1, &[cin, c.og, c.kh, c.kw], false);
        let b = input(seed + 2, &[o], false);
        let opts = c.transpose_options(op);
        let (want, [oh, ow]) =
            ref_conv_t(&vals(&x), &vals(&w), bias.then(|| vals(&b)).as_deref(), &c, op);
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let (x, w, b) = (
                x.to_dtype(dtype).unwrap(),
                w.to_dtype(dtype).unwrap(),
                b.to_dtype(dtype).unwrap(),
            );
            let y = x.conv_transpose2d(&w, bias.then_some(&b), &opts).unwrap();
            prop_assert_eq!(y.shape(), &[c.n, o, oh, ow][..]);
            close(&format!("{c:?} {op:?} {dtype}"), &vals(&y), &want, tol);
        }
    }

    #[test]
    fn pools_match_direct_loops(
        (n, ch, h, w) in (1..=2usize, 1..=2usize, 1..=7usize, 1..=7usize),
        (k, s, p, d) in ((1..=3usize, 1..=3usize), (1..=4usize, 1..=4usize),
            (0..=1usize, 0..=1usize), (1..=2usize, 1..=2usize)),
        ceil in any::<bool>(), include_pad in any::<bool>(), divisor in proptest::option::of(1..=5usize),
        transposed in any::<bool>(), seed in 0u64..1000,
    ) {
        let c = PoolCase {
            planes: n * ch, h, w, k: [k.0, k.1], s: [s.0, s.1], p: [p.0, p.1], d: [d.0, d.1], ceil,
        };
        prop_assume!(c.valid());
        // Rounded values make ties common.
        let x = input(seed, &[n, ch, h, w], transposed);
        let xv: Vec<f64> = vals(&x).iter().map(|v| (v * 2.0).round()).collect();
        let x = Tensor::from_vec(xv.clone(), [n, ch, h, w], &cpu()).unwrap();
        let x = if transposed {
            x.transpose(2, 3).unwrap().contiguous().unwrap().transpose(2, 3).unwrap()
        } else {
            x
        };
        let mo = MaxPoolOptions::new(c.k).stride(c.s).padding(c.p).dilation(c.d).ceil_mode(ceil);
        let (wv, wi) = ref_max_pool(&xv, &c);
        let (v, i) = x.max_pool2d_with_indices(&mo).unwrap();
        let [oh, ow] = c.out().map(|v| v as usize);
        prop_assert_eq!(v.shape(), &[n, ch, oh, ow][..]);
        close("max_pool2d", &vals(&v), &wv, 0.0);
        prop_assert_eq!(i.to_vec::<i64>().unwrap(), wi);
        close("max_pool2d f32", &vals(&x.to_dtype(DType::F32).unwrap().max_pool2d(&mo).unwrap()), &wv, 0.0);
        // Average pooling has no dilation.
        let c = PoolCase { d: [1, 1], ..c };
        if c.valid() {
            let ao = AvgPoolOptions::new(c.k)
                .stride(c.s)
                .padding(c.p)
                .ceil_mode(ceil)
                .count_include_pad(include_pad)
                .divisor_override(divisor);
            let want = ref_avg_pool(&xv, &c, include_pad, divisor);
            close("avg_pool2d", &vals(&x.avg_pool2d(&ao).unwrap()), &want, 1e-12);
            let y = x.to_dtype(DType::BF16).unwrap().avg_pool2d(&ao).unwrap();
            prop_assert_eq!(y.dtype(), DType::BF16);
            close("avg_pool2d bf16", &vals(&y), &want, 2f64.powi(-8));
        }
    }

    #[test]
    fn adaptive_avg_pool2d_matches_direct_loops(
        (n, ch, h, w) in (1..=2usize, 1..=2usize, 1..=9usize, 1..=9usize),
        (oh, ow) in (1..=9usize, 1..=9usize), transposed in any::<bool>(), seed in 0u64..1000,
    ) {
        let x = input(seed, &[n, ch, h, w], transposed);
        let want = ref_adaptive(&vals(&x), n * ch, h, w, oh, ow);
        let y = x.adaptive_avg_pool2d([oh, ow]).unwrap();
        prop_assert_eq!(y.shape(), &[n, ch, oh, ow][..]);
        close("adaptive_avg_pool2d", &vals(&y), &want, 1e-12);
    }
}

// ---- through XLA ------------------------------------------------------------------------------

/// Fixed cases (groups, dilation, stride beyond the kernel, padding, batch 2, strided inputs,
/// NaN and ties in max pooling) through the PJRT CPU plugin in f64, against the reference.
#[test]
fn xla_matches_direct_loops() {
    let Some(dev) = pjrt("conv") else { return };
    let on = |t: &Tensor| t.to_device(&dev).unwrap();
    // conv2d: groups 2, dilation 2, stride 3 with a 2x2 kernel, asymmetric padding.
    let c = ConvCase::new([2, 2, 2, 3, 7, 6, 2, 3], [3, 1], [[1, 2], [0, 1]], [2, 2]);
    let x = input(1, &[2, 4, 7, 6], true);
    let w = input(2, &[6, 2, 2, 3], false);
    let b = input(3, &[6], false);
    let opts = ConvOptions::new()
        .stride([3, 1])
        .padding(Padding::Sides(vec![[1, 2], [0, 1]]))
        .dilation(2)
        .groups(2);
    let want = ref_conv(&vals(&x), &vals(&w), Some(&vals(&b)), &c);
    let y = on(&x).conv2d(&on(&w), Some(&on(&b)), &opts).unwrap();
    assert!(!y.device().is_cpu());
    close("xla conv2d", &vals(&y), &want, 1e-12);

    // conv1d, unbatched, kernel 1.
    let x1 = input(4, &[4, 5], true);
    let w1 = input(5, &[3, 4, 1], false);
    let c1 = ConvCase::new([1, 1, 4, 3, 1, 5, 1, 1], [1, 2], [[0, 0], [1, 1]], [1, 1]);
    let y = on(&x1)
        .conv1d(&on(&w1), None, &ConvOptions::new().stride(2).padding(1))
        .unwrap();
    assert_eq!(y.shape(), &[3, 4]);
    close(
        "xla conv1d",
        &vals(&y),
        &ref_conv(&vals(&x1), &vals(&w1), None, &c1),
        1e-12,
    );

    // conv_transpose2d: groups 2, output padding, and padding beyond the kernel's reach.
    let ct = ConvCase::new([2, 2, 1, 2, 3, 4, 3, 2], [2, 3], [[1, 1], [2, 2]], [1, 2]);
    let xt = input(6, &[2, 2, 3, 4], true);
    let wt = input(7, &[2, 2, 3, 2], false);
    let bt = input(8, &[4], false);
    let topts = ct.transpose_options([1, 1]);
    let (want, _) = ref_conv_t(&vals(&xt), &vals(&wt), Some(&vals(&bt)), &ct, [1, 1]);
    let y = on(&xt)
        .conv_transpose2d(&on(&wt), Some(&on(&bt)), &topts)
        .unwrap();
    close("xla conv_transpose2d", &vals(&y), &want, 1e-12);

    // Pools with ties and NaNs.
    let pc = PoolCase::new(4, [6, 7], [3, 2], [2, 3], [1, 1], [1, 2], true);
    let mut xv: Vec<f64> = vals(&input(9, &[2, 2, 6, 7], false))
        .iter()
        .map(|v| v.round())
        .collect();
    xv[3] = f64::NAN;
    xv[9] = f64::NAN;
    xv[50] = f64::NEG_INFINITY;
    let xp = Tensor::from_vec(xv.clone(), [2, 2, 6, 7], &cpu()).unwrap();
    let mo = MaxPoolOptions::new([3, 2])
        .stride([2, 3])
        .padding(1)
        .dilation([1, 2])
        .ceil_mode(true);
    let (wv, wi) = ref_max_pool(&xv, &pc);
    let (v, i) = on(&xp).max_pool2d_with_indices(&mo).unwrap();
    close("xla max_pool2d", &vals(&v), &wv, 0.0);
    assert_eq!(i.to_vec::<i64>().unwrap(), wi);
    let pc = PoolCase { d: [1, 1], ..pc };
    let ao = AvgPoolOptions::new([3, 2])
        .stride([2, 3])
        .padding(1)
        .ceil_mode(true)
        .count_include_pad(false);
    let xa = input(10, &[2, 2, 6, 7], true);
    let want = ref_avg_pool(&vals(&xa), &pc, false, None);
    close(
        "xla avg_pool2d",
        &vals(&on(&xa).avg_pool2d(&ao).unwrap()),
        &want,
        1e-12,
    );
    let want = ref_adaptive(&vals(&xa), 4, 6, 7, 4, 3);
    let y = on(&xa).adaptive_avg_pool2d([4, 3]).unwrap();
    close("xla adaptive_avg_pool2d", &vals(&y), &want, 1e-12);
}

// ---- PyTorch's values -------------------------------------------------------------------------

// Generated with torch 2.15 (CPU) in float64:
//
//   import torch, torch.nn.functional as F
//   torch.set_default_dtype(torch.float64)
//   def seq(shape, a, m, off, div):
//       n = 1
//       for s in shape: n *= s
//       return torch.tensor([((i * a) % m - off) / div for i in range(n)]).reshape(shape)
//   x = seq([1,4,5,5], 7, 13, 6, 4); w = seq([4,2,2,2], 5, 11, 5, 8); b = torch.tensor([.5,-.25,.125,1.])
//   CONV2D = F.conv2d(x, w, b, stride=(1,2), padding=1, dilation=2, groups=2)
//   x = seq([1,2,6], 7, 13, 6, 4); w = seq([4,1,2], 5, 11, 5, 8)
//   CONV1D_SAME = F.conv1d(x, w, None, padding="same", groups=2)
//   x = seq([1,2,3,3], 7, 13, 6, 4); w = seq([2,3,3,3], 5, 11, 5, 8); b = torch.tensor([.5,-.25,1.])
//   CONV_T = F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1)
//   x = seq([1,1,5,5], 3, 4, 0, 1)
//   MAX_VALS, MAX_IDX = F.max_pool2d(x, 2, ceil_mode=True, return_indices=True)
//   x = seq([1,1,4,4], 5, 7, 3, 2); x[0,0,1,1] = float('nan'); x[0,0,2,2] = float('nan')
//   NAN_VALS, NAN_IDX = F.max_pool2d(x, 3, stride=1, padding=1, return_indices=True)
//   x = seq([1,1,5,6], 7, 13, 6, 4)
//   AVG = F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
//   ADAPTIVE = F.adaptive_avg_pool2d(seq([1,2,5,7], 7, 13, 6, 4), (3,4))
//   x = seq([1,1,3,4], 7, 13, 6, 4)
//   BILINEAR = F.interpolate(x, size=(5,7), mode="bilinear", align_corners=False)
//   BILINEAR_ALIGNED = F.interpolate(x, size=(5,7), mode="bilinear", align_corners=True)
//   BILINEAR_SCALE = F.interpolate(x, scale_factor=1.7, mode="bilinear", align_corners=False)
//   NEAREST = F.interpolate(x, size=(5,7), mode="nearest")
//   NEAREST_SCALE = F.interpolate(seq([1,1,3,5], 7, 13, 6, 4), scale_factor=1.3, mode="nearest")
//   print(", ".join(repr(v) for v in t.flatten().tolist()))  # for each t above

/// Runs `f` on the inputs in f64 and f32 on every device and compares with PyTorch's values.
fn check_torch(what: &str, inputs: &[Tensor], want: &[f64], f: impl Fn(&[Tensor]) -> Tensor) {
    for dev in devices() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
            let ins: Vec<Tensor> = inputs
                .iter()
                .map(|t| t.to_dtype(dtype).unwrap().to_device(&dev).unwrap())
                .collect();
            let y = f(&ins);
            assert_eq!(y.dtype(), dtype);
            close(&format!("{what} {dtype} on {dev}"), &vals(&y), want, tol);
        }
    }
}

#[test]
fn conv_matches_pytorch() {
    let x = seq(&[1, 4, 5, 5], 7, 13, 6.0, 4.0);
    let w = seq(&[4, 2, 2, 2], 5, 11, 5.0, 8.0);
    let b = Tensor::from_vec(vec![0.5, -0.25, 0.125, 1.0], [4], &cpu()).unwrap();
    let o = ConvOptions::new()
        .stride([1, 2])
        .padding(1)
        .dilation(2)
        .groups(2);
    check_torch("conv2d", &[x, w, b], &CONV2D, |t| {
        let y = t[0].conv2d(&t[1], Some(&t[2]), &o).unwrap();
        assert_eq!(y.shape(), &[1, 4, 5, 3]);
        y
    });
    let x = seq(&[1, 2, 6], 7, 13, 6.0, 4.0);
    let w = seq(&[4, 1, 2], 5, 11, 5.0, 8.0);
    let o = ConvOptions::new().padding(Padding::Same).groups(2);
    check_torch("conv1d same", &[x, w], &CONV1D_SAME, |t| {
        t[0].conv1d(&t[1], None, &o).unwrap()
    });
    let x = seq(&[1, 2, 3, 3], 7, 13, 6.0, 4.0);
    let w = seq(&[2, 3, 3, 3], 5, 11, 5.0, 8.0);
    let b = Tensor::from_vec(vec![0.5, -0.25, 1.0], [3], &cpu()).unwrap();
    let o = ConvTransposeOptions::new()
        .stride(2)
        .padding(1)
        .output_padding(1);
    check_torch("conv_transpose2d", &[x, w, b], &CONV_T, |t| {
        let y = t[0].conv_transpose2d(&t[1], Some(&t[2]), &o).unwrap();
        assert_eq!(y.shape(), &[1, 3, 6, 6]);
        y
    });
}

#[test]
fn pools_match_pytorch() {
    // Max pooling with indices of `x` on every device.
    let with_indices = |x: &Tensor, o: &MaxPoolOptions| -> Vec<(Device, Tensor, Tensor)> {
        let on = |dev: Device| {
            let (v, i) = x
                .to_device(&dev)
                .unwrap()
                .max_pool2d_with_indices(o)
                .unwrap();
            (dev, v, i)
        };
        devices().into_iter().map(on).collect()
    };
    let x = seq(&[1, 1, 5, 5], 3, 4, 0.0, 1.0);
    let o = MaxPoolOptions::new(2).ceil_mode(true);
    check_torch(
        "max_pool2d ties",
        std::slice::from_ref(&x),
        &MAX_VALS,
        |t| t[0].max_pool2d(&o).unwrap(),
    );
    for (dev, _, i) in with_indices(&x, &o) {
        let want: Vec<i64> = MAX_IDX.iter().map(|&v| v as i64).collect();
        assert_eq!(i.to_vec::<i64>().unwrap(), want, "indices on {dev}");
    }
    let mut xv = vals(&seq(&[1, 1, 4, 4], 5, 7, 3.0, 2.0));
    xv[5] = f64::NAN;
    xv[10] = f64::NAN;
    let x = Tensor::from_vec(xv, [1, 1, 4, 4], &cpu()).unwrap();
    let o = MaxPoolOptions::new(3).stride(1).padding(1);
    check_torch("max_pool2d nan", std::slice::from_ref(&x), &NAN_VALS, |t| {
        t[0].max_pool2d(&o).unwrap()
    });
    for (dev, _, i) in with_indices(&x, &o) {
        let want: Vec<i64> = NAN_IDX.iter().map(|&v| v as i64).collect();
        assert_eq!(i.to_vec::<i64>().unwrap(), want, "NaN indices on {dev}");
    }
    // Windows whose taps all land in the padding:
    //   F.max_pool2d(torch.arange(3.).reshape(1,1,1,3), (2,1), stride=1, padding=(1,0),
    //                dilation=(2,1), return_indices=True)
    //   -> values [-inf, -inf, -inf], indices [3, 4, 5]
    let x = seq(&[1, 1, 1, 3], 1, 3, 0.0, 1.0);
    let o = MaxPoolOptions::new([2, 1])
        .stride(1)
        .padding([1, 0])
        .dilation([2, 1]);
    for (dev, v, i) in with_indices(&x, &o) {
        assert_eq!(vals(&v), [f64::NEG_INFINITY; 3], "on {dev}");
        assert_eq!(i.to_vec::<i64>().unwrap(), [3, 4, 5], "on {dev}");
    }
    let x = seq(&[1, 1, 5, 6], 7, 13, 6.0, 4.0);
    let o = AvgPoolOptions::new(3)
        .stride(2)
        .padding(1)
        .ceil_mode(true)
        .count_include_pad(false);
    check_torch("avg_pool2d", &[x], &AVG, |t| t[0].avg_pool2d(&o).unwrap());
    let x = seq(&[1, 2, 5, 7], 7, 13, 6.0, 4.0);
    check_torch("adaptive_avg_pool2d", &[x], &ADAPTIVE, |t| {
        t[0].adaptive_avg_pool2d([3, 4]).unwrap()
    });
}

#[test]
fn interpolate_matches_pytorch() {
    let x = seq(&[1, 1, 3, 4], 7, 13, 6.0, 4.0);
    let bil = |align_corners| InterpolateMode::Bilinear { align_corners };
    let cases: [(&str, Resize, InterpolateMode, &[f64]); 4] = [
        ("bilinear", Resize::Size([5, 7]), bil(false), &BILINEAR),
        (
            "bilinear aligned",
            Resize::Size([5, 7]),
            bil(true),
            &BILINEAR_ALIGNED,
        ),
        (
            "bilinear scale",
            Resize::Scale([1.7, 1.7]),
            bil(false),
            &BILINEAR_SCALE,
        ),
        (
            "nearest",
            Resize::Size([5, 7]),
            InterpolateMode::Nearest,
            &NEAREST,
        ),
    ];
    for (what, to, mode, want) in cases {
        check_torch(what, std::slice::from_ref(&x), want, |t| {
            t[0].interpolate(to, mode).unwrap()
        });
    }
    let x = seq(&[1, 1, 3, 5], 7, 13, 6.0, 4.0);
    check_torch("nearest scale", &[x], &NEAREST_SCALE, |t| {
        let y = t[0]
            .interpolate(Resize::Scale([1.3, 1.3]), InterpolateMode::Nearest)
            .unwrap();
        assert_eq!(y.shape(), &[1, 1, 3, 6]);
        y
    });
}

// ---- bad input --------------------------------------------------------------------------------

fn shape_err(r: tpu_tensor::Result<Tensor>, needles: &[&str]) {
    let e = r.expect_err("expected an error");
    assert!(
        matches!(e, Error::Shape { .. }),
        "expected a shape error, got {e:?}"
    );
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "{msg:?} does not mention {n:?}");
    }
}

fn arg_err(r: tpu_tensor::Result<Tensor>, needle: &str) {
    let e = r.expect_err("expected an error");
    assert!(
        matches!(e, Error::InvalidArgument { .. }),
        "expected an invalid-argument error, got {e:?}"
    );
    assert!(
        e.to_string().contains(needle),
        "{e} does not mention {needle:?}"
    );
}

#[test]
fn bad_inputs_are_refused_with_shapes() {
    let z = |s: &[usize]| Tensor::zeros(s, DType::F32, &cpu()).unwrap();
    let o = ConvOptions::new();
    // Channel mismatch.
    shape_err(
        z(&[1, 3, 5, 5]).conv2d(&z(&[2, 2, 2, 2]), None, &o),
        &["[2, 2, 2, 2]", "[1, 3, 5, 5]", "2 channels"],
    );
    // Groups not dividing the output or the input channels.
    shape_err(
        z(&[1, 4, 5, 5]).conv2d(&z(&[3, 2, 2, 2]), None, &o.clone().groups(2)),
        &["groups=2", "[3, 2, 2, 2]"],
    );
    shape_err(
        z(&[1, 3, 5, 5]).conv2d(&z(&[4, 1, 2, 2]), None, &o.clone().groups(2)),
        &["groups=2", "[1, 3, 5, 5]"],
    );
    shape_err(
        z(&[1, 3, 5, 5]).conv_transpose2d(
            &z(&[3, 1, 2, 2]),
            None,
            &ConvTransposeOptions::new().groups(2),
        ),
        &["groups=2", "[3, 1, 2, 2]"],
    );
    // Kernel larger than the padded input.
    shape_err(
        z(&[1, 1, 2, 2]).conv2d(&z(&[1, 1, 3, 3]), None, &o),
        &["2 x 2", "3 x 3", "[1, 1, 2, 2]"],
    );
    assert!(
        z(&[1, 1, 2, 2])
            .conv2d(&z(&[1, 1, 3, 3]), None, &o.clone().padding(1))
            .is_ok()
    );
    shape_err(
        z(&[1, 1, 3]).conv1d(&z(&[1, 1, 2]), None, &o.clone().dilation(3)),
        &["(3)", "(4)"],
    );
    // Wrong ranks and bias shapes.
    shape_err(z(&[2, 4]).conv2d(&z(&[1, 4, 1, 1]), None, &o), &["[2, 4]"]);
    shape_err(
        z(&[1, 4, 5, 5]).conv2d(&z(&[1, 4, 1]), None, &o),
        &["[1, 4, 1]"],
    );
    shape_err(
        z(&[1, 4, 5, 5]).conv2d(&z(&[2, 4, 1, 1]), Some(&z(&[3])), &o),
        &["[3]", "[2]"],
    );
    shape_err(z(&[5, 5]).max_pool2d(&MaxPoolOptions::new(2)), &["[5, 5]"]);
    shape_err(
        z(&[1, 1, 4, 4]).max_pool2d(&MaxPoolOptions::new(5)),
        &["[1, 1, 4, 4]"],
    );
    shape_err(
        z(&[1, 4, 4]).interpolate(Resize::Size([2, 2]), InterpolateMode::Nearest),
        &["[1, 4, 4]"],
    );
    shape_err(z(&[4, 4]).adaptive_avg_pool2d(2), &["[4, 4]"]);
    // Arguments PyTorch refuses.
    arg_err(
        z(&[1, 1, 4, 4]).conv2d(
            &z(&[1, 1, 3, 3]),
            None,
            &o.clone().stride(2).padding(Padding::Same),
        ),
        "same",
    );
    arg_err(
        z(&[1, 1, 4, 4]).conv2d(&z(&[1, 1, 3, 3]), None, &o.clone().groups(0)),
        "groups",
    );
    arg_err(
        z(&[1, 1, 4, 4]).conv2d(&z(&[1, 1, 3, 3]), None, &o.clone().stride([1, 2, 3])),
        "stride",
    );
    arg_err(
        z(&[1, 1, 4, 4]).conv_transpose2d(
            &z(&[1, 1, 3, 3]),
            None,
            &ConvTransposeOptions::new().stride(2).output_padding(2),
        ),
        "output padding",
    );
    arg_err(
        z(&[1, 1, 5, 5]).max_pool2d(&MaxPoolOptions::new(3).padding(2)),
        "half",
    );
    arg_err(
        z(&[1, 1, 5, 5]).avg_pool2d(&AvgPoolOptions::new(2).divisor_override(Some(0))),
        "divisor",
    );
    // Integer and mixed dtypes.
    for d in [DType::I64, DType::I32, DType::U8, DType::Bool] {
        let x = Tensor::zeros([1, 1, 4, 4], d, &cpu()).unwrap();
        let w = Tensor::zeros([1, 1, 2, 2], d, &cpu()).unwrap();
        for r in [
            x.conv2d(&w, None, &o),
            x.max_pool2d(&MaxPoolOptions::new(2)),
            x.avg_pool2d(&AvgPoolOptions::new(2)),
            x.adaptive_avg_pool2d(2),
            x.interpolate(Resize::Size([8, 8]), InterpolateMode::Nearest),
        ] {
            let e = r.expect_err("integer input must be refused");
            assert!(
                matches!(e, Error::UnsupportedDType { .. }),
                "{d}: expected UnsupportedDType, got {e:?}"
            );
        }
    }
    let e = z(&[1, 1, 4, 4])
        .conv2d(
            &Tensor::zeros([1, 1, 2, 2], DType::F64, &cpu()).unwrap(),
            None,
            &o,
        )
        .unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { .. }), "{e:?}");
}

#[test]
fn sixteen_bit_floats_round_once() {
    // 16-bit inputs compute in f32 and round the f32 result once.
    let x = input(40, &[1, 2, 5, 5], true);
    let w = input(41, &[3, 2, 3, 3], false);
    let o = ConvOptions::new().padding(1);
    let want = x
        .to_dtype(DType::F32)
        .unwrap()
        .conv2d(&w.to_dtype(DType::F32).unwrap(), None, &o)
        .unwrap();
    for d in [DType::F16, DType::BF16] {
        let xs = x.to_dtype(d).unwrap();
        let ws = w.to_dtype(d).unwrap();
        let exact = xs
            .to_dtype(DType::F32)
            .unwrap()
            .conv2d(&ws.to_dtype(DType::F32).unwrap(), None, &o)
            .unwrap()
            .to_dtype(d)
            .unwrap();
        let y = xs.conv2d(&ws, None, &o).unwrap();
        assert_eq!(y.dtype(), d);
        assert_eq!(vals(&y), vals(&exact), "{d}");
        close(&format!("{d} vs f32"), &vals(&y), &vals(&want), 0.05);
    }
}

#[test]
fn large_inputs_use_the_thread_pool_and_agree() {
    // Big enough to cross the parallel thresholds (batch x groups blocks and inner products).
    let x = input(50, &[2, 8, 34, 30], false);
    let w = input(51, &[16, 4, 3, 3], false);
    let c = ConvCase::new([2, 2, 4, 8, 34, 30, 3, 3], [1, 1], [[1, 1], [1, 1]], [1, 1]);
    let y = x
        .conv2d(&w, None, &ConvOptions::new().padding(1).groups(2))
        .unwrap();
    close(
        "large conv2d",
        &vals(&y),
        &ref_conv(&vals(&x), &vals(&w), None, &c),
        1e-12,
    );
    let single = input(52, &[1, 8, 40, 40], false);
    let w1 = input(53, &[8, 8, 3, 3], false);
    let c1 = ConvCase::new([1, 1, 8, 8, 40, 40, 3, 3], [1, 1], [[0, 0], [0, 0]], [1, 1]);
    let y = single.conv2d(&w1, None, &ConvOptions::new()).unwrap();
    close(
        "large conv2d, one block",
        &vals(&y),
        &ref_conv(&vals(&single), &vals(&w1), None, &c1),
        1e-12,
    );
    let pc = PoolCase::new(16, [34, 30], [3, 3], [1, 1], [1, 1], [1, 1], false);
    let (wv, wi) = ref_max_pool(&vals(&x), &pc);
    let (v, i) = x
        .max_pool2d_with_indices(&MaxPoolOptions::new(3).stride(1).padding(1))
        .unwrap();
    close("large max_pool2d", &vals(&v), &wv, 0.0);
    assert_eq!(i.to_vec::<i64>().unwrap(), wi);
}

// ---- PyTorch's outputs (see the snippet above) ------------------------------------------------

/// Shape [1, 4, 5, 3].
const CONV2D: [f64; 60] = [
    0.3125, 0.0, 0.5625, 0.78125, 0.9375, -1.375, 0.71875, 1.21875, 1.40625, 0.25, -0.9375, 1.75,
    0.8125, -0.1875, -0.46875, 0.59375, 0.375, -0.4375, -2.375, -0.0625, -0.3125, -0.34375,
    -0.3125, -0.15625, -0.34375, 1.46875, -0.8125, -1.28125, -1.125, -0.0625, -0.125, 0.0, -0.0625,
    0.625, -0.5, 0.40625, -0.125, 0.90625, 0.53125, 0.34375, 0.28125, -0.5625, 0.03125, 0.84375,
    0.625, 1.0, 0.4375, 0.8125, 0.375, 2.34375, 1.28125, 1.625, 0.625, 0.75, 0.84375, 0.9375,
    1.84375, 1.53125, 1.0, 0.84375,
];
/// Shape [1, 4, 6].
const CONV1D_SAME: [f64; 24] = [
    0.9375, -0.15625, 0.78125, -0.3125, 0.625, -0.46875, -0.96875, 0.3125, -0.84375, 0.4375,
    -0.71875, 0.46875, -0.625, 0.625, -0.5625, 0.6875, -0.5, 0.75, -0.65625, 0.5625, -0.65625,
    0.5625, -0.65625, 0.5625,
];
/// Shape [1, 3, 6, 6].
const CONV_T: [f64; 108] = [
    -0.875, 0.9375, 0.75, 0.9375, -0.875, 1.0, 1.0625, 2.46875, -0.15625, -1.59375, 1.0625, 1.5,
    0.75, 0.125, 0.75, 0.53125, 0.75, 0.34375, -0.15625, 0.4375, 1.0625, 0.4375, -0.15625, 0.90625,
    0.75, 0.53125, 0.75, 0.125, 0.75, 0.5, 0.78125, -0.40625, 0.125, 1.5, 0.6875, -0.25, -1.65625,
    0.15625, 0.0, 0.21875, -1.59375, 0.28125, 0.34375, -0.96875, -1.21875, -0.78125, 0.46875,
    -2.1875, 0.0625, -0.875, -0.3125, -0.40625, 0.125, -0.28125, -1.09375, 0.40625, 0.1875, 0.1875,
    -0.96875, 0.4375, -0.25, -0.28125, 0.1875, -0.625, -0.1875, -0.4375, -0.21875, 0.5, -0.4375,
    0.0625, -0.25, 0.1875, 1.625, 1.375, 0.90625, 1.5, 1.40625, 1.5625, 1.625, 0.0, -0.28125,
    0.3125, 1.875, -0.78125, 0.6875, 0.125, 2.0, 0.65625, 0.46875, 1.09375, -0.03125, 1.34375,
    1.3125, 1.25, 0.21875, 1.625, 1.78125, 0.90625, 0.25, 0.625, 1.5625, 0.625, 0.78125, 1.6875,
    1.0, 1.3125, 0.8125, 1.25,
];
/// Shape [1, 1, 3, 3].
const MAX_VALS: [f64; 9] = [3.0, 2.0, 3.0, 2.0, 3.0, 2.0, 3.0, 2.0, 0.0];
/// Shape [1, 1, 3, 3].
const MAX_IDX: [f64; 9] = [1.0, 2.0, 9.0, 10.0, 13.0, 14.0, 21.0, 22.0, 24.0];
/// Shape [1, 1, 4, 4].
const NAN_VALS: [f64; 16] = [
    f64::NAN,
    f64::NAN,
    f64::NAN,
    0.0,
    f64::NAN,
    f64::NAN,
    f64::NAN,
    f64::NAN,
    f64::NAN,
    f64::NAN,
    f64::NAN,
    f64::NAN,
    1.0,
    f64::NAN,
    f64::NAN,
    f64::NAN,
];
/// Shape [1, 1, 4, 4].
const NAN_IDX: [f64; 16] = [
    5.0, 5.0, 5.0, 2.0, 5.0, 10.0, 10.0, 10.0, 5.0, 10.0, 10.0, 10.0, 8.0, 10.0, 10.0, 10.0,
];
/// Shape [1, 1, 3, 4].
const AVG: [f64; 12] = [
    -0.25,
    0.20833333333333334,
    0.4583333333333333,
    1.125,
    -0.20833333333333334,
    -0.1111111111111111,
    0.1388888888888889,
    0.08333333333333333,
    0.375,
    -0.25,
    0.0,
    0.125,
];
/// Shape [1, 2, 3, 4].
const ADAPTIVE: [f64; 24] = [
    -0.1875,
    0.0,
    0.25,
    -0.375,
    0.041666666666666664,
    0.1388888888888889,
    0.027777777777777776,
    -0.4166666666666667,
    0.0,
    0.4583333333333333,
    0.16666666666666666,
    -0.1875,
    0.125,
    0.041666666666666664,
    -0.25,
    -0.0625,
    0.08333333333333333,
    0.0,
    -0.1111111111111111,
    0.16666666666666666,
    0.3125,
    -0.041666666666666664,
    0.20833333333333334,
    0.125,
];
/// Shape [1, 1, 5, 7].
const BILINEAR: [f64; 35] = [
    -1.5,
    -0.8750000000000001,
    0.12499999999999986,
    -0.5,
    -1.1250000000000004,
    -0.1250000000000001,
    0.5,
    -1.3,
    -0.6750000000000002,
    0.32499999999999984,
    -0.30000000000000004,
    -0.9250000000000005,
    0.07499999999999987,
    0.7,
    -1.0,
    -0.3750000000000001,
    0.6249999999999999,
    0.0,
    -0.6250000000000004,
    0.3749999999999999,
    1.0,
    -0.7000000000000001,
    -0.07500000000000015,
    0.9249999999999997,
    0.29999999999999993,
    -0.3250000000000005,
    0.6749999999999998,
    1.3,
    -0.5,
    0.12499999999999993,
    1.1249999999999998,
    0.49999999999999994,
    -0.12500000000000044,
    0.875,
    1.5,
];
/// Shape [1, 1, 5, 7].
const BILINEAR_ALIGNED: [f64; 35] = [
    -1.5, -0.625, 0.25, -0.5, -1.25, -0.375, 0.5, -1.25, -0.375, 0.5, -0.25, -1.0, -0.125, 0.75,
    -1.0, -0.125, 0.75, 0.0, -0.75, 0.125, 1.0, -0.75, 0.125, 1.0, 0.25, -0.5, 0.375, 1.25, -0.5,
    0.375, 1.25, 0.5, -0.25, 0.625, 1.5,
];
/// Shape [1, 1, 5, 6].
const BILINEAR_SCALE: [f64; 30] = [
    -1.5,
    -0.8308823529411765,
    0.19852941176470607,
    -0.588235294117647,
    -0.9926470588235295,
    0.03676470588235303,
    -1.3088235294117647,
    -0.6397058823529411,
    0.3897058823529414,
    -0.3970588235294118,
    -0.8014705882352944,
    0.22794117647058834,
    -1.0147058823529411,
    -0.3455882352941176,
    0.6838235294117649,
    -0.10294117647058817,
    -0.5073529411764707,
    0.5220588235294119,
    -0.7205882352941176,
    -0.05147058823529412,
    0.9779411764705883,
    0.19117647058823528,
    -0.21323529411764724,
    0.8161764705882354,
    -0.5,
    0.1691176470588236,
    1.198529411764706,
    0.411764705882353,
    0.0073529411764704546,
    1.036764705882353,
];
/// Shape [1, 1, 5, 7].
const NEAREST: [f64; 35] = [
    -1.5, -1.5, 0.25, 0.25, -1.25, -1.25, 0.5, -1.5, -1.5, 0.25, 0.25, -1.25, -1.25, 0.5, -1.0,
    -1.0, 0.75, 0.75, -0.75, -0.75, 1.0, -1.0, -1.0, 0.75, 0.75, -0.75, -0.75, 1.0, -0.5, -0.5,
    1.25, 1.25, -0.25, -0.25, 1.5,
];
/// Shape [1, 1, 3, 6].
const NEAREST_SCALE: [f64; 18] = [
    -1.5, -1.5, 0.25, -1.25, 0.5, 0.5, 0.75, 0.75, -0.75, 1.0, -0.5, -0.5, -0.25, -0.25, 1.5, 0.0,
    -1.5, -1.5,
];
