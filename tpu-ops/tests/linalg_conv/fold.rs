//! `col2im` and `im2col` (PyTorch's `F.fold` and `F.unfold`): against direct f64 loops on
//! random shapes and options (proptest), at literal values on every device, as each other's
//! adjoint and gradient, and on bad input.

use crate::common::{cpu, devices, vals};
use proptest::prelude::*;
use tpu_ops::autograd::AutogradOps;
use tpu_ops::ops::conv::{FoldOptions, col2im, im2col};
use tpu_ops::ops::reduce::ReduceOps;
use tpu_ops::prelude::*;
use tpu_tensor::{DType, Generator, Tensor};

/// One problem: image `[n, c, h, w]`, kernel, dilation, padding, stride.
#[derive(Clone, Debug)]
struct Case {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    k: [usize; 2],
    d: [usize; 2],
    p: [usize; 2],
    s: [usize; 2],
}

impl Case {
    fn opts(&self) -> FoldOptions {
        FoldOptions::new(self.k)
            .dilation(self.d)
            .padding(self.p)
            .stride(self.s)
    }

    /// Patches per dim.
    fn blocks(&self) -> [usize; 2] {
        let b = |len: usize, i: usize| {
            (len + 2 * self.p[i] - (self.k[i] - 1) * self.d[i] - 1) / self.s[i] + 1
        };
        [b(self.h, 0), b(self.w, 1)]
    }

    /// For every column cell `(n, row, col)` in row-major order, the image position it reads
    /// (`None`: padding), by PyTorch's definition.
    fn cells(&self) -> Vec<Option<usize>> {
        let [bh, bw] = self.blocks();
        let mut out = Vec::new();
        for n in 0..self.n {
            for c in 0..self.c {
                for i in 0..self.k[0] {
                    for j in 0..self.k[1] {
                        for bi in 0..bh {
                            for bj in 0..bw {
                                let y = (bi * self.s[0] + i * self.d[0]) as i64 - self.p[0] as i64;
                                let x = (bj * self.s[1] + j * self.d[1]) as i64 - self.p[1] as i64;
                                let inside = (0..self.h as i64).contains(&y)
                                    && (0..self.w as i64).contains(&x);
                                out.push(inside.then(|| {
                                    ((n * self.c + c) * self.h + y as usize) * self.w + x as usize
                                }));
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Direct `im2col` of `image` (row-major `[n, c, h, w]`).
    fn im2col(&self, image: &[f64]) -> Vec<f64> {
        self.cells()
            .iter()
            .map(|c| c.map_or(0.0, |i| image[i]))
            .collect()
    }

    /// Direct `col2im` of `cols` (row-major `[n, c·kh·kw, L]`).
    fn col2im(&self, cols: &[f64]) -> Vec<f64> {
        let mut image = vec![0.0; self.n * self.c * self.h * self.w];
        for (cell, v) in self.cells().iter().zip(cols) {
            if let Some(i) = cell {
                image[*i] += v;
            }
        }
        image
    }

    fn cols_shape(&self) -> [usize; 3] {
        let [bh, bw] = self.blocks();
        [self.n, self.c * self.k[0] * self.k[1], bh * bw]
    }
}

fn case() -> impl Strategy<Value = Case> {
    (
        (1usize..3, 1usize..4, 1usize..8, 1usize..8),
        (
            [1usize..4, 1..4],
            [1usize..3, 1..3],
            [0usize..3, 0..3],
            [1usize..4, 1..4],
        ),
    )
        .prop_filter_map(
            "the kernel fits the padded image",
            |((n, c, h, w), (k, d, p, s))| {
                let fits = |len: usize, i: usize| len + 2 * p[i] > (k[i] - 1) * d[i];
                (fits(h, 0) && fits(w, 1)).then_some(Case {
                    n,
                    c,
                    h,
                    w,
                    k,
                    d,
                    p,
                    s,
                })
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Both against direct loops, and `<col2im(x), y> = <x, im2col(y)>`.
    #[test]
    fn fold_and_unfold_match_direct_loops(case in case(), seed in 0u64..1000) {
        let mut g = Generator::new(seed);
        let image = g.randn([case.n, case.c, case.h, case.w], DType::F64, &cpu()).unwrap();
        let cols = g.randn(case.cols_shape(), DType::F64, &cpu()).unwrap();
        let unfolded = im2col(&image, &case.opts()).unwrap();
        prop_assert_eq!(unfolded.shape(), &case.cols_shape()[..]);
        prop_assert_eq!(vals(&unfolded), case.im2col(&vals(&image)));
        let folded = col2im(&cols, [case.h, case.w], &case.opts()).unwrap();
        prop_assert_eq!(folded.shape(), &[case.n, case.c, case.h, case.w][..]);
        let want = case.col2im(&vals(&cols));
        for (a, b) in vals(&folded).iter().zip(&want) {
            prop_assert!((a - b).abs() <= 1e-12 * (1.0 + b.abs()), "{} vs {}", a, b);
        }
        let lhs: f64 = vals(&folded).iter().zip(vals(&image)).map(|(a, b)| a * b).sum();
        let rhs: f64 = vals(&cols).iter().zip(vals(&unfolded)).map(|(a, b)| a * b).sum();
        prop_assert!((lhs - rhs).abs() <= 1e-9 * (1.0 + lhs.abs()));
    }
}

/// Values by the ops' definition, which PyTorch's docs give and these reproduce:
///
/// ```python
/// x = torch.arange(9.).reshape(1, 1, 3, 3)
/// F.unfold(x, 2)                           # [[0,1,3,4],[1,2,4,5],[3,4,6,7],[4,5,7,8]]
/// F.unfold(x, 2, padding=1, stride=2)      # [[0,0,0,4],[0,0,3,5],[0,1,0,7],[0,2,6,8]]
/// F.fold(torch.ones(1, 4, 4), (3, 3), 2)   # [[1,2,1],[2,4,2],[1,2,1]]: overlap counts
/// ```
#[test]
fn fold_and_unfold_give_the_defined_values_on_every_device() {
    for dev in devices() {
        let x = Tensor::from_vec((0..9).map(|v| v as f32).collect(), [1, 1, 3, 3], &dev).unwrap();
        let cols = im2col(&x, &FoldOptions::new(2)).unwrap();
        assert_eq!(cols.shape(), [1, 4, 4]);
        let want = [
            0., 1., 3., 4., 1., 2., 4., 5., 3., 4., 6., 7., 4., 5., 7., 8.,
        ];
        assert_eq!(vals(&cols), want, "{dev}");
        let padded = im2col(&x, &FoldOptions::new(2).padding(1).stride(2)).unwrap();
        let want = [
            0., 0., 0., 4., 0., 0., 3., 5., 0., 1., 0., 7., 0., 2., 6., 8.,
        ];
        assert_eq!(vals(&padded), want, "{dev}");
        // Unbatched, in f32 and i64 alike.
        let ones = Tensor::ones([4, 4], DType::F32, &dev).unwrap();
        let counts = col2im(&ones, 3, &FoldOptions::new(2)).unwrap();
        assert_eq!(counts.shape(), [1, 3, 3]);
        assert_eq!(vals(&counts), [1., 2., 1., 2., 4., 2., 1., 2., 1.], "{dev}");
        let ones = Tensor::ones([4, 4], DType::I64, &dev).unwrap();
        let counts = col2im(&ones, [3, 3], &FoldOptions::new(2)).unwrap();
        assert_eq!(counts.dtype(), DType::I64);
        assert_eq!(vals(&counts), [1., 2., 1., 2., 4., 2., 1., 2., 1.], "{dev}");
        // The same image folded back from its columns, divided by the overlap counts.
        let back = col2im(&cols, [3, 3], &FoldOptions::new(2)).unwrap();
        let counts = col2im(
            &Tensor::ones([1, 4, 4], DType::F32, &dev).unwrap(),
            3,
            &FoldOptions::new(2),
        )
        .unwrap();
        assert_eq!(vals(&back.div(&counts).unwrap()), vals(&x), "{dev}");
    }
}

/// The gradient of each is the other applied to the upstream gradient, on every device.
#[test]
fn fold_and_unfold_differentiate_into_each_other() {
    let case = Case {
        n: 2,
        c: 2,
        h: 5,
        w: 4,
        k: [2, 3],
        d: [2, 1],
        p: [1, 1],
        s: [1, 2],
    };
    let mut g = Generator::new(7);
    let image = g.randn([2, 2, 5, 4], DType::F64, &cpu()).unwrap();
    let cols = g.randn(case.cols_shape(), DType::F64, &cpu()).unwrap();
    for dev in devices() {
        let x = image.to_device(&dev).unwrap().requires_grad_(true).unwrap();
        let up = cols.to_device(&dev).unwrap();
        im2col(&x, &case.opts())
            .unwrap()
            .mul(&up)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let want = case.col2im(&vals(&cols));
        let got = vals(&x.grad().unwrap());
        for (a, b) in got.iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                "{dev}: {got:?} vs {want:?}"
            );
        }
        let c = cols.to_device(&dev).unwrap().requires_grad_(true).unwrap();
        let up = image.to_device(&dev).unwrap();
        col2im(&c, [5, 4], &case.opts())
            .unwrap()
            .mul(&up)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        assert_eq!(
            vals(&c.grad().unwrap()),
            case.im2col(&vals(&image)),
            "{dev}"
        );
    }
}

#[test]
fn fold_and_unfold_refuse_what_does_not_fit() {
    let dev = cpu();
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &dev).unwrap();
    let msg = |r: tpu_tensor::Result<Tensor>| r.unwrap_err().to_string();
    let e = msg(col2im(&z(&[1, 4, 5]), [3, 3], &FoldOptions::new(2)));
    assert!(
        e.contains("takes columns [N, C × 4, 4], got shape [1, 4, 5]"),
        "{e}"
    );
    let e = msg(col2im(&z(&[1, 6, 4]), [3, 3], &FoldOptions::new(2)));
    assert!(e.contains("takes columns [N, C × 4, 4]"), "{e}");
    let e = msg(col2im(&z(&[4]), [3, 3], &FoldOptions::new(2)));
    assert!(e.contains("expected columns"), "{e}");
    let e = msg(col2im(&z(&[4, 4]), [3, 3], &FoldOptions::new(4)));
    assert!(e.contains("smaller than the kernel"), "{e}");
    let e = msg(im2col(&z(&[3, 3]), &FoldOptions::new(2)));
    assert!(
        e.contains("expected an image [N, C, H, W] or [C, H, W], got shape [3, 3]"),
        "{e}"
    );
    let e = msg(im2col(&z(&[1, 3, 3]), &FoldOptions::new([2, 2, 2])));
    assert!(e.contains("kernel_size to have 1 or 2 values"), "{e}");
    let e = msg(im2col(&z(&[1, 3, 3]), &FoldOptions::new(2).stride(0)));
    assert!(e.contains("stride value to be positive"), "{e}");
}
