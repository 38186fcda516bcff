//! `conv3d`, `conv_transpose3d` and `conv_transpose1d` (compositions of the 2-D convolutions):
//! against direct f64 loops over every output element (proptest), finite differences, the
//! native CPU against XLA, values worked out by hand, and bad input.

use crate::common::{Rng, check_near, cpu, f32s, gradcheck_or_panic, has, pjrt, randn, vals};
use proptest::prelude::*;
use tpu_ops::ops::conv::{ConvOps, ConvOptions, ConvTransposeOptions, Padding};
use tpu_ops::prelude::*;
use tpu_tensor::{DType, Device, Tensor};

/// One 3-D problem: the shapes and options of a convolution or of a transposed one. 1-D
/// transposed problems have `d == h == 1` and kernels of depth and height 1.
#[derive(Clone, Debug)]
struct Case3 {
    n: usize,
    groups: usize,
    /// Input channels per group, output channels per group.
    cg: usize,
    og: usize,
    size: [usize; 3],
    k: [usize; 3],
    s: [usize; 3],
    /// `[before, after]` per dim (symmetric for transposed problems).
    p: [[usize; 2]; 3],
    d: [usize; 3],
    /// Output padding (transposed problems).
    op: [usize; 3],
    bias: bool,
    seed: u64,
}

fn case3(one_d: bool, transposed: bool) -> impl Strategy<Value = Case3> {
    (any::<u64>(), any::<bool>()).prop_map(move |(seed, bias)| {
        let mut r = Rng::new(seed);
        let mut dim = |i: usize| {
            let flat = one_d && i < 2;
            let size = if flat { 1 } else { r.range(1, 4) };
            let k = if flat { 1 } else { r.range(1, 3) };
            let s = if flat { 1 } else { r.range(1, 2) };
            let d = if flat { 1 } else { r.range(1, 2) };
            let before = if flat { 0 } else { r.range(0, 2) };
            let after = if transposed || flat {
                before
            } else {
                r.range(0, 2)
            };
            let op = if transposed && !flat {
                r.range(0, s.max(d) - 1)
            } else {
                0
            };
            (size, k, s, [before, after], d, op)
        };
        let dims: Vec<_> = (0..3).map(&mut dim).collect();
        let groups = r.range(1, 2);
        Case3 {
            n: r.range(1, 2),
            groups,
            cg: r.range(1, 2),
            og: r.range(1, 2),
            size: [dims[0].0, dims[1].0, dims[2].0],
            k: [dims[0].1, dims[1].1, dims[2].1],
            s: [dims[0].2, dims[1].2, dims[2].2],
            p: [dims[0].3, dims[1].3, dims[2].3],
            d: [dims[0].4, dims[1].4, dims[2].4],
            op: [dims[0].5, dims[1].5, dims[2].5],
            bias,
            seed,
        }
    })
}

impl Case3 {
    fn span(&self, i: usize) -> usize {
        (self.k[i] - 1) * self.d[i] + 1
    }

    /// Output sizes of the convolution, or `None` when the kernel does not fit.
    fn conv_out(&self) -> Option<[usize; 3]> {
        let mut o = [0; 3];
        for (i, out) in o.iter_mut().enumerate() {
            let padded = self.size[i] + self.p[i][0] + self.p[i][1];
            *out = padded.checked_sub(self.span(i))? / self.s[i] + 1;
        }
        Some(o)
    }

    /// Output sizes of the transposed convolution, or `None` when one is below 1.
    fn conv_t_out(&self) -> Option<[usize; 3]> {
        let mut o = [0; 3];
        for (i, out) in o.iter_mut().enumerate() {
            let full = (self.size[i] - 1) * self.s[i] + self.span(i) + self.op[i];
            *out = full.checked_sub(2 * self.p[i][0]).filter(|&v| v >= 1)?;
        }
        Some(o)
    }

    fn x_shape(&self) -> Vec<usize> {
        let [d, h, w] = self.size;
        vec![self.n, self.groups * self.cg, d, h, w]
    }

    /// `[out, in / groups, k..]` for a convolution, `[in, out / groups, k..]` transposed.
    fn w_shape(&self, transposed: bool) -> Vec<usize> {
        let [kd, kh, kw] = self.k;
        if transposed {
            vec![self.groups * self.cg, self.og, kd, kh, kw]
        } else {
            vec![self.groups * self.og, self.cg, kd, kh, kw]
        }
    }

    fn inputs(&self, transposed: bool) -> Vec<Tensor> {
        let mut v = vec![
            randn(self.seed, &self.x_shape()),
            randn(self.seed ^ 1, &self.w_shape(transposed)),
        ];
        if self.bias {
            v.push(randn(self.seed ^ 2, &[self.groups * self.og]));
        }
        v
    }

    fn conv(&self, t: &[Tensor]) -> tpu_tensor::Result<Tensor> {
        let opts = ConvOptions::new()
            .stride(self.s)
            .padding(Padding::Sides(self.p.to_vec()))
            .dilation(self.d)
            .groups(self.groups);
        t[0].conv3d(&t[1], t.get(2), &opts)
    }

    fn conv_t(&self, t: &[Tensor]) -> tpu_tensor::Result<Tensor> {
        let opts = ConvTransposeOptions::new()
            .stride(self.s)
            .padding(self.p.map(|p| p[0]))
            .output_padding(self.op)
            .dilation(self.d)
            .groups(self.groups);
        t[0].conv_transpose3d(&t[1], t.get(2), &opts)
    }

    /// The 1-D transposed op on the problem's last dim.
    fn conv_t1(&self, t: &[Tensor]) -> tpu_tensor::Result<Tensor> {
        let opts = ConvTransposeOptions::new()
            .stride(self.s[2])
            .padding(self.p[2][0])
            .output_padding(self.op[2])
            .dilation(self.d[2])
            .groups(self.groups);
        let x = t[0].squeeze_dim(2)?.squeeze_dim(2)?;
        let w = t[1].squeeze_dim(2)?.squeeze_dim(2)?;
        x.conv_transpose1d(&w, t.get(2), &opts)
    }

    /// `out[n, g·og + o, z] = bias + Σ x[n, g·cg + c, z·s - p + t·d] · w[g·og + o, c, t]`.
    fn ref_conv(&self, x: &[f64], w: &[f64], b: Option<Vec<f64>>) -> Vec<f64> {
        let out = self.conv_out().unwrap();
        let (cs, ks) = (self.groups * self.cg, self.k);
        let mut y = Vec::new();
        for n in 0..self.n {
            for oc in 0..self.groups * self.og {
                let g = oc / self.og;
                for z in cube(out) {
                    let mut acc = b.as_ref().map_or(0.0, |b| b[oc]);
                    for c in 0..self.cg {
                        for t in cube(ks) {
                            let at: Option<Vec<usize>> = (0..3)
                                .map(|i| {
                                    let v = (z[i] * self.s[i] + t[i] * self.d[i]) as i64
                                        - self.p[i][0] as i64;
                                    (0..self.size[i] as i64).contains(&v).then_some(v as usize)
                                })
                                .collect();
                            if let Some(a) = at {
                                let xi = at5(
                                    [n, g * self.cg + c, a[0], a[1], a[2]],
                                    [self.n, cs, self.size[0], self.size[1], self.size[2]],
                                );
                                let wi = at5(
                                    [oc, c, t[0], t[1], t[2]],
                                    [self.groups * self.og, self.cg, ks[0], ks[1], ks[2]],
                                );
                                acc += x[xi] * w[wi];
                            }
                        }
                    }
                    y.push(acc);
                }
            }
        }
        y
    }

    /// `out[n, g·og + o, i·s - p + t·d] += x[n, g·cg + c, i] · w[g·cg + c, o, t]`, plus bias.
    fn ref_conv_t(&self, x: &[f64], w: &[f64], b: Option<Vec<f64>>) -> Vec<f64> {
        let out = self.conv_t_out().unwrap();
        let (cs, os, ks) = (self.groups * self.cg, self.groups * self.og, self.k);
        let oshape = [self.n, os, out[0], out[1], out[2]];
        let mut y = vec![0.0; oshape.iter().product()];
        for n in 0..self.n {
            for c in 0..cs {
                let g = c / self.cg;
                for i in cube(self.size) {
                    let xv = x[at5(
                        [n, c, i[0], i[1], i[2]],
                        [self.n, cs, self.size[0], self.size[1], self.size[2]],
                    )];
                    for o in 0..self.og {
                        for t in cube(ks) {
                            let at: Option<Vec<usize>> = (0..3)
                                .map(|j| {
                                    let v = (i[j] * self.s[j] + t[j] * self.d[j]) as i64
                                        - self.p[j][0] as i64;
                                    (0..out[j] as i64).contains(&v).then_some(v as usize)
                                })
                                .collect();
                            if let Some(a) = at {
                                let wv = w[at5(
                                    [c, o, t[0], t[1], t[2]],
                                    [cs, self.og, ks[0], ks[1], ks[2]],
                                )];
                                y[at5([n, g * self.og + o, a[0], a[1], a[2]], oshape)] += xv * wv;
                            }
                        }
                    }
                }
            }
        }
        if let Some(b) = b {
            let plane: usize = out.iter().product();
            for (i, v) in y.iter_mut().enumerate() {
                *v += b[(i / plane) % os];
            }
        }
        y
    }
}

/// Every index of a `[a, b, c]` box in row-major order.
fn cube(s: [usize; 3]) -> impl Iterator<Item = [usize; 3]> {
    (0..s[0]).flat_map(move |a| (0..s[1]).flat_map(move |b| (0..s[2]).map(move |c| [a, b, c])))
}

fn at5(i: [usize; 5], s: [usize; 5]) -> usize {
    (0..5).fold(0, |acc, k| acc * s[k] + i[k])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(48)))]

    #[test]
    fn conv3d_matches_direct_loops(c in case3(false, false)) {
        let t = c.inputs(false);
        let got = c.conv(&t);
        let Some(out) = c.conv_out() else {
            prop_assert!(got.unwrap_err().to_string().contains("smaller than the dilated kernel"));
            return Ok(());
        };
        let got = got.unwrap();
        let [d, h, w] = out;
        prop_assert_eq!(got.shape(), &[c.n, c.groups * c.og, d, h, w][..]);
        let want = c.ref_conv(&vals(&t[0]), &vals(&t[1]), t.get(2).map(vals));
        check_near(&format!("{c:?}"), &vals(&got), &want, 1e-12);
    }

    #[test]
    fn conv_transpose3d_matches_direct_loops(c in case3(false, true)) {
        let t = c.inputs(true);
        let got = c.conv_t(&t);
        let Some(out) = c.conv_t_out() else {
            prop_assert!(got.is_err());
            return Ok(());
        };
        let got = got.unwrap();
        let [d, h, w] = out;
        prop_assert_eq!(got.shape(), &[c.n, c.groups * c.og, d, h, w][..]);
        let want = c.ref_conv_t(&vals(&t[0]), &vals(&t[1]), t.get(2).map(vals));
        check_near(&format!("{c:?}"), &vals(&got), &want, 1e-12);
    }

    #[test]
    fn conv_transpose1d_matches_direct_loops(c in case3(true, true)) {
        let t = c.inputs(true);
        let got = c.conv_t1(&t);
        let Some(out) = c.conv_t_out() else {
            prop_assert!(got.is_err());
            return Ok(());
        };
        let got = got.unwrap();
        prop_assert_eq!(got.shape(), &[c.n, c.groups * c.og, out[2]][..]);
        let want = c.ref_conv_t(&vals(&t[0]), &vals(&t[1]), t.get(2).map(vals));
        check_near(&format!("{c:?}"), &vals(&got), &want, 1e-12);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(12)))]

    #[test]
    fn conv3d_gradcheck(c in case3(false, false)) {
        if c.conv_out().is_some() {
            gradcheck_or_panic("conv3d", |t| c.conv(t), &c.inputs(false), 1e-6, 1e-6);
        }
    }

    #[test]
    fn conv_transpose3d_gradcheck(c in case3(false, true)) {
        if c.conv_t_out().is_some() {
            gradcheck_or_panic("conv_transpose3d", |t| c.conv_t(t), &c.inputs(true), 1e-6, 1e-6);
        }
    }

    #[test]
    fn conv_transpose1d_gradcheck(c in case3(true, true)) {
        if c.conv_t_out().is_some() {
            gradcheck_or_panic("conv_transpose1d", |t| c.conv_t1(t), &c.inputs(true), 1e-6, 1e-6);
        }
    }
}

fn iota(n: usize) -> Vec<f64> {
    (0..n).map(|i| i as f64).collect()
}

/// Small cases whose values follow from the definitions by hand, on every device.
#[test]
fn hand_worked_values_on_every_device() {
    let mut devs = vec![cpu()];
    devs.extend(pjrt("conv3d hand_worked_values_on_every_device"));
    for dev in &devs {
        // x = torch.arange(8.).view(1, 1, 2, 2, 2); F.conv3d(x, torch.ones(1, 1, 2, 2, 2))
        //   -> [[[[[28.]]]]]; with padding=1 the corner output sees only x[0, 0, 0, 0, 0] = 0
        //   and the centre sees all eight.
        let x = f32s(&iota(8), &[1, 1, 2, 2, 2], dev);
        let ones = f32s(&[1.; 8], &[1, 1, 2, 2, 2], dev);
        let y = x.conv3d(&ones, None, &ConvOptions::new()).unwrap();
        assert_eq!(
            (y.shape().to_vec(), vals(&y)),
            (vec![1, 1, 1, 1, 1], vec![28.])
        );
        let y = x
            .conv3d(&ones, None, &ConvOptions::new().padding(1))
            .unwrap();
        assert_eq!(y.shape(), &[1, 1, 3, 3, 3]);
        let v = vals(&y);
        assert_eq!((v[0], v[13], v[26]), (0., 28., 7.));
        // F.conv_transpose3d(torch.full((1, 1, 1, 1, 1), 2.), torch.arange(8.).view(1, 1, 2, 2, 2),
        //     bias=torch.tensor([1.])) -> 2 * w + 1
        let two = f32s(&[2.], &[1, 1, 1, 1, 1], dev);
        let bias = f32s(&[1.], &[1], dev);
        let y = two
            .conv_transpose3d(&x, Some(&bias), &ConvTransposeOptions::new())
            .unwrap();
        let want: Vec<f64> = iota(8).iter().map(|v| 2. * v + 1.).collect();
        assert_eq!((y.shape().to_vec(), vals(&y)), (vec![1, 1, 2, 2, 2], want));
        // F.conv_transpose1d(torch.tensor([[[1., 2., 3.]]]), torch.tensor([[[1., 10.]]]),
        //     stride=2) -> [[[1., 10., 2., 20., 3., 30.]]]; unbatched input drops the batch.
        let x1 = f32s(&[1., 2., 3.], &[1, 1, 3], dev);
        let w1 = f32s(&[1., 10.], &[1, 1, 2], dev);
        let opts = ConvTransposeOptions::new().stride(2);
        let y = x1.conv_transpose1d(&w1, None, &opts).unwrap();
        let want = vec![1., 10., 2., 20., 3., 30.];
        assert_eq!(
            (y.shape().to_vec(), vals(&y)),
            (vec![1, 1, 6], want.clone())
        );
        let y = x1
            .squeeze_dim(0)
            .unwrap()
            .conv_transpose1d(&w1, None, &opts)
            .unwrap();
        assert_eq!((y.shape().to_vec(), vals(&y)), (vec![1, 6], want));
    }
}

/// The compositions on XLA agree with the native CPU, forward and backward.
#[test]
fn xla_matches_the_native_cpu() {
    let Some(dev) = pjrt("conv3d xla_matches_the_native_cpu") else {
        return;
    };
    let c = Case3 {
        n: 2,
        groups: 2,
        cg: 2,
        og: 1,
        size: [4, 3, 5],
        k: [2, 2, 3],
        s: [2, 1, 2],
        p: [[1, 0], [1, 1], [0, 2]],
        d: [1, 2, 1],
        op: [1, 0, 1],
        bias: true,
        seed: 5,
    };
    let run = |transposed: bool, dev: &Device| {
        let inputs: Vec<Tensor> = c
            .inputs(transposed)
            .iter()
            .map(|t| {
                t.to_dtype(DType::F32)
                    .unwrap()
                    .to_device(dev)
                    .unwrap()
                    .requires_grad_(true)
                    .unwrap()
            })
            .collect();
        let y = if transposed {
            c.conv_t(&inputs)
        } else {
            c.conv(&inputs)
        }
        .unwrap();
        let w = Tensor::ones(y.shape(), DType::F32, dev).unwrap();
        let loss = y.mul(&y).unwrap().mul(&w).unwrap().sum_all().unwrap();
        loss.backward().unwrap();
        let mut out = vec![vals(&y)];
        out.extend(inputs.iter().map(|t| vals(&t.grad().unwrap())));
        out
    };
    for transposed in [false, true] {
        let (a, b) = (run(transposed, &cpu()), run(transposed, &dev));
        for (i, (a, b)) in a.iter().zip(&b).enumerate() {
            check_near(&format!("transposed={transposed} output {i}"), b, a, 1e-4);
        }
    }
}

#[test]
fn bad_input_is_refused() {
    let dev = cpu();
    let x = f32s(&[0.; 16], &[1, 2, 2, 2, 2], &dev);
    let w = f32s(&[0.; 16], &[1, 2, 2, 2, 2], &dev);
    let err = |r: tpu_tensor::Result<Tensor>| r.unwrap_err().to_string();
    let o = ConvOptions::new();
    has(
        err(x.reshape([2, 2, 4]).unwrap().conv3d(&w, None, &o)),
        &["conv3d", "4-D", "5-D", "[2, 2, 4]"],
    );
    has(
        err(x.conv3d(&w.squeeze_dim(0).unwrap(), None, &o)),
        &["conv3d", "5-D weight", "[2, 2, 2, 2]"],
    );
    has(
        err(x.conv3d(&w, None, &o.clone().groups(2))),
        &["groups=2", "2 channels"],
    );
    let b = f32s(&[0., 0.], &[2], &dev);
    has(
        err(x.conv3d(&w, Some(&b), &o)),
        &["bias of shape [1]", "[2]"],
    );
    has(
        err(x.conv3d(&w, None, &o.clone().stride([1, 0, 1]))),
        &["stride", "positive"],
    );
    has(
        err(x.conv3d(&w, None, &o.clone().dilation([3, 1, 1]))),
        &["padded input depth (2)", "dilated kernel depth (4)"],
    );
    has(
        err(x.conv3d(&w, None, &o.clone().stride(2).padding(Padding::Same))),
        &["same", "strided"],
    );
    has(
        err(x.conv3d(&w, None, &o.clone().padding(Padding::Sides(vec![[0, 0]])))),
        &["3 [before, after] padding pairs"],
    );
    let w64 = w.to_dtype(DType::F64).unwrap();
    has(
        err(x.conv3d(&w64, None, &o)),
        &["conv3d", "weight", "f32", "f64"],
    );
    let t = ConvTransposeOptions::new();
    let wt = w.reshape([2, 1, 2, 2, 2]).unwrap();
    has(
        err(x.conv_transpose3d(&wt, None, &t.clone().output_padding(1))),
        &["output_padding smaller than the stride or the dilation"],
    );
    has(
        err(x.conv_transpose3d(&wt, None, &t.clone().padding([2, 0, 0]))),
        &["output depth would be -1"],
    );
    has(
        err(x.conv_transpose3d(&wt.narrow(0, 0, 1).unwrap(), None, &t)),
        &["conv_transpose3d", "does not fit an input with 2 channels"],
    );
    let x1 = f32s(&[0.; 4], &[1, 2, 2], &dev);
    has(
        err(x1.conv_transpose1d(&w, None, &t)),
        &["conv_transpose1d", "3-D weight"],
    );
    has(
        err(x1.unsqueeze(0).unwrap().conv_transpose1d(&w, None, &t)),
        &["conv_transpose1d", "2-D [C, L] or 3-D [N, C, L]"],
    );
}
