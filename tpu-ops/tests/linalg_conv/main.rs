//! Matrix products, einsum, convolutions and Fourier transforms: values, the GEMM kernels against
//! naive loops, and gradients.
//!
//! One test binary per family, so CI links the whole stack once per family rather than once per
//! file; `cargo test --test linalg_conv <module>::` runs one part.

#[path = "../common/mod.rs"]
mod common;

mod conv;
mod conv3d;
mod fft;
mod fold;
mod gemm;
mod grad;
mod grid_sample;
mod linalg;
mod packed;
mod pool3d;
mod quant;

use tpu_ops::ops::conv::ConvTransposeOptions;

/// A 2-D convolution problem; 1-D ones have `h == 1`, `kh == 1`. The value and the gradient
/// checks draw theirs as this.
#[derive(Clone, Debug)]
struct ConvCase {
    n: usize,
    groups: usize,
    cg: usize,
    og: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    s: [usize; 2],
    p: [[usize; 2]; 2],
    d: [usize; 2],
}

impl ConvCase {
    /// The case of sizes `[n, groups, cg, og, h, w, kh, kw]`, with stride `s`, padding `p`
    /// (before and after, per dim) and dilation `d`.
    fn new(
        [n, groups, cg, og, h, w, kh, kw]: [usize; 8],
        s: [usize; 2],
        p: [[usize; 2]; 2],
        d: [usize; 2],
    ) -> Self {
        ConvCase {
            n,
            groups,
            cg,
            og,
            h,
            w,
            kh,
            kw,
            s,
            p,
            d,
        }
    }

    /// The output size per dim, or `None` where the kernel does not fit in the padded input.
    fn out(&self) -> Option<[usize; 2]> {
        let (len, k) = ([self.h, self.w], [self.kh, self.kw]);
        let mut o = [0; 2];
        for i in 0..2 {
            let padded = len[i] + self.p[i][0] + self.p[i][1];
            let span = self.d[i] * (k[i] - 1) + 1;
            if padded < span {
                return None;
            }
            o[i] = (padded - span) / self.s[i] + 1;
        }
        Some(o)
    }

    /// The same case with each dim padded on both sides by its padding before.
    fn symmetric(self) -> Self {
        ConvCase {
            p: [[self.p[0][0]; 2], [self.p[1][0]; 2]],
            ..self
        }
    }

    /// The output size per dim of the transposed convolution with output padding `op` (below 1
    /// where there is no output), by the padding before each dim.
    fn transposed_out(&self, op: [usize; 2]) -> [i64; 2] {
        let (len, k) = ([self.h, self.w], [self.kh, self.kw]);
        std::array::from_fn(|i| {
            (len[i] as i64 - 1) * self.s[i] as i64 - 2 * self.p[i][0] as i64
                + self.d[i] as i64 * (k[i] as i64 - 1)
                + op[i] as i64
                + 1
        })
    }

    /// Whether the transposed convolution with output padding `op` is defined: `op` below the
    /// stride or the dilation in each dim, and an output in each.
    fn transpose_fits(&self, op: [usize; 2]) -> bool {
        (0..2).all(|i| op[i] < self.s[i] || op[i] < self.d[i])
            && self.transposed_out(op).iter().all(|&n| n >= 1)
    }

    /// The options of the transposed convolution with output padding `op`, by the padding
    /// before each dim.
    fn transpose_options(&self, op: [usize; 2]) -> ConvTransposeOptions {
        ConvTransposeOptions::new()
            .stride(self.s)
            .padding([self.p[0][0], self.p[1][0]])
            .output_padding(op)
            .dilation(self.d)
            .groups(self.groups)
    }
}
