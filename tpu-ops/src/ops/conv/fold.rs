//! `col2im` (PyTorch's `F.fold`) and `im2col` (`F.unfold`), as compositions: one index table,
//! computed from the shapes alone, maps every patch element to its place in the image's
//! flattened `H × W` plane, or to one extra place past it where the element falls in the
//! padding. `im2col` gathers with it (`index_select` from the plane with a zero appended),
//! `col2im` adds into it (`scatter_add` into a plane one longer, which is then cut back), so
//! both run on every device and differentiate through those ops; each is the other's adjoint.
//!
//! Layouts, as PyTorch's: the image `[N, C, H, W]` (or `[C, H, W]`), the columns `[N, C × kh ×
//! kw, L]` (or `[C × kh × kw, L]`), where column row `c·kh·kw + i·kw + j` holds tap `(i, j)` of
//! channel `c`, and column `bi·bw + bj` is patch `(bi, bj)`: the one whose tap `(i, j)` reads
//! image position `(bi·s₀ + i·d₀ − p₀, bj·s₁ + j·d₁ − p₁)`.

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{Error, Result, Tensor};

use super::options::{FoldOptions, Ints};
use super::{arith, dilated};
use crate::ops::movement::MovementOps;

/// The index table of patches over an `h × w` image: `kh·kw·L` entries (tap-major, as the
/// column rows go), each a flat position in the plane or `h·w` for padding; and `L`.
fn patch_index(op: &str, h: usize, w: usize, o: &FoldOptions) -> Result<(Vec<i64>, usize)> {
    let k = o.kernel_size.positive(op, "kernel_size", 2)?;
    let d = o.dilation.positive(op, "dilation", 2)?;
    let p = o.padding.resolve(op, "padding", 2)?;
    let s = o.stride.positive(op, "stride", 2)?;
    let mut blocks = [0usize; 2];
    for (i, len) in [h, w].into_iter().enumerate() {
        let eff = arith(op, "dilated kernel", dilated(k[i], d[i]))?;
        let span = arith(
            op,
            "padded size",
            p[i].checked_mul(2).and_then(|q| q.checked_add(len)),
        )?;
        if span < eff {
            return Err(Error::shape(
                op,
                format!(
                    "an image of {:?} padded by {p:?} is smaller than the kernel {k:?} dilated \
                     by {d:?}",
                    [h, w]
                ),
            ));
        }
        blocks[i] = (span - eff) / s[i] + 1;
    }
    let taps = k[0] * k[1];
    let l = arith(op, "number of patches", blocks[0].checked_mul(blocks[1]))?;
    arith(
        op,
        "column count",
        taps.checked_mul(l)
            .filter(|&n| n <= isize::MAX as usize / 8),
    )?;
    let pad = (h * w) as i64;
    let mut index = Vec::with_capacity(taps * l);
    for i in 0..k[0] {
        for j in 0..k[1] {
            for bi in 0..blocks[0] {
                let y = (bi * s[0] + i * d[0]) as i64 - p[0] as i64;
                for bj in 0..blocks[1] {
                    let x = (bj * s[1] + j * d[1]) as i64 - p[1] as i64;
                    let inside = (0..h as i64).contains(&y) && (0..w as i64).contains(&x);
                    index.push(if inside { y * w as i64 + x } else { pad });
                }
            }
        }
    }
    Ok((index, l))
}

/// `col2im`: sums the columns `[N, C × kh × kw, L]` (or unbatched `[C × kh × kw, L]`) into an
/// image `[N, C, H, W]` of `output_size` (one value for both dims, or `[H, W]`), every patch
/// element added at its place; elements in the padding are dropped. PyTorch's `F.fold`.
pub fn col2im(cols: &Tensor, output_size: impl Into<Ints>, opts: &FoldOptions) -> Result<Tensor> {
    const OP: &str = "col2im";
    let size = output_size.into().positive(OP, "output_size", 2)?;
    let (h, w) = (size[0], size[1]);
    let batched = match cols.rank() {
        3 => true,
        2 => false,
        _ => {
            return Err(Error::shape(
                OP,
                format!(
                    "expected columns [N, C × kh × kw, L] or [C × kh × kw, L], got shape {}",
                    fmt_shape(cols.shape())
                ),
            ));
        }
    };
    let x = if batched {
        cols.clone()
    } else {
        cols.unsqueeze(0)?
    };
    let (n, rows, l) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let (index, want_l) = patch_index(OP, h, w, opts)?;
    let taps = index.len() / want_l;
    if rows % taps != 0 || l != want_l {
        return Err(Error::shape(
            OP,
            format!(
                "an image of {:?} in patches of {:?} (dilation {:?}, padding {:?}, stride {:?}) \
                 takes columns [N, C × {taps}, {want_l}], got shape {}",
                [h, w],
                opts.kernel_size.0,
                opts.dilation.0,
                opts.padding.0,
                opts.stride.0,
                fmt_shape(cols.shape())
            ),
        ));
    }
    let c = rows / taps;
    let cells = taps * l;
    let index = Tensor::from_vec(index, [1, 1, cells], x.device())?
        .expand([n, c, cells])?
        .contiguous()?;
    let plane = Tensor::zeros([n, c, h * w + 1], x.dtype(), x.device())?;
    let image = plane
        .scatter_add(2, &index, &x.reshape([n, c, cells])?)?
        .narrow(2, 0, h * w)?
        .reshape([n, c, h, w])?;
    if batched {
        Ok(image)
    } else {
        image.squeeze_dim(0)
    }
}

/// `im2col`: the patches of an image `[N, C, H, W]` (or unbatched `[C, H, W]`) as columns
/// `[N, C × kh × kw, L]`, zeros where a patch reads the padding. PyTorch's `F.unfold`.
pub fn im2col(image: &Tensor, opts: &FoldOptions) -> Result<Tensor> {
    const OP: &str = "im2col";
    let batched = match image.rank() {
        4 => true,
        3 => false,
        _ => {
            return Err(Error::shape(
                OP,
                format!(
                    "expected an image [N, C, H, W] or [C, H, W], got shape {}",
                    fmt_shape(image.shape())
                ),
            ));
        }
    };
    let x = if batched {
        image.clone()
    } else {
        image.unsqueeze(0)?
    };
    let [n, c, h, w] = [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]];
    let (index, l) = patch_index(OP, h, w, opts)?;
    let taps = index.len() / l;
    let index = Tensor::from_vec(index, [taps * l], x.device())?;
    let zero = Tensor::zeros([n, c, 1], x.dtype(), x.device())?;
    let plane = crate::ops::movement::cat(&[&x.reshape([n, c, h * w])?, &zero], 2)?;
    let cols = plane.index_select(2, &index)?.reshape([n, c * taps, l])?;
    if batched {
        Ok(cols)
    } else {
        cols.squeeze_dim(0)
    }
}
