//! The options of the family's ops: PyTorch's `int or tuple` sizes, padding modes and one
//! builder per op kind, each starting from PyTorch's defaults.

use tpu_tensor::{Error, Result};

/// Sizes given once for every spatial dim or once per dim, as PyTorch's `int or tuple`
/// arguments: `2.into()`, `[2, 3].into()`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ints(pub Vec<usize>);

impl From<usize> for Ints {
    fn from(v: usize) -> Ints {
        Ints(vec![v])
    }
}

impl<const N: usize> From<[usize; N]> for Ints {
    fn from(v: [usize; N]) -> Ints {
        Ints(v.to_vec())
    }
}

impl From<Vec<usize>> for Ints {
    fn from(v: Vec<usize>) -> Ints {
        Ints(v)
    }
}

impl From<&[usize]> for Ints {
    fn from(v: &[usize]) -> Ints {
        Ints(v.to_vec())
    }
}

impl Ints {
    /// Exactly `n` values: one value repeated, or `n` values as given.
    pub(super) fn resolve(&self, op: &str, what: &str, n: usize) -> Result<Vec<usize>> {
        match self.0.len() {
            1 => Ok(vec![self.0[0]; n]),
            k if k == n => Ok(self.0.clone()),
            k => Err(Error::invalid_argument(
                op,
                format!(
                    "expected {what} to have 1 or {n} values, got {k}: {:?}",
                    self.0
                ),
            )),
        }
    }

    /// Like `resolve`, and every value must be at least 1.
    pub(super) fn positive(&self, op: &str, what: &str, n: usize) -> Result<Vec<usize>> {
        let v = self.resolve(op, what, n)?;
        if v.contains(&0) {
            return Err(Error::invalid_argument(
                op,
                format!("expected every {what} value to be positive, got {v:?}"),
            ));
        }
        Ok(v)
    }
}

/// How a convolution pads its input with zeros.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Padding {
    /// The same amount before and after, per spatial dim (or one amount for all).
    Symmetric(Ints),
    /// `[before, after]` per spatial dim.
    Sides(Vec<[usize; 2]>),
    /// PyTorch's `"same"`: the output as large as the input (stride 1 only); an odd total goes
    /// after.
    Same,
    /// PyTorch's `"valid"`: no padding.
    Valid,
}

impl From<usize> for Padding {
    fn from(v: usize) -> Padding {
        Padding::Symmetric(v.into())
    }
}

impl<const N: usize> From<[usize; N]> for Padding {
    fn from(v: [usize; N]) -> Padding {
        Padding::Symmetric(v.into())
    }
}

impl From<Ints> for Padding {
    fn from(v: Ints) -> Padding {
        Padding::Symmetric(v)
    }
}

impl Padding {
    /// `[before, after]` per spatial dim for `n` dims, or `None` for `Same` (which depends on
    /// the kernel); `Same` with a stride other than 1 is an error, as in PyTorch.
    pub(super) fn sides(
        &self,
        op: &str,
        n: usize,
        stride: &[usize],
    ) -> Result<Option<Vec<[usize; 2]>>> {
        Ok(Some(match self {
            Padding::Symmetric(p) => p
                .resolve(op, "padding", n)?
                .into_iter()
                .map(|v| [v, v])
                .collect(),
            Padding::Sides(v) if v.len() == n => v.clone(),
            Padding::Sides(v) => {
                return Err(Error::invalid_argument(
                    op,
                    format!(
                        "expected {n} [before, after] padding pairs, got {}: {v:?}",
                        v.len()
                    ),
                ));
            }
            Padding::Valid => vec![[0, 0]; n],
            Padding::Same if stride.iter().any(|&v| v != 1) => {
                return Err(Error::invalid_argument(
                    op,
                    format!(
                        "padding \"same\" is not supported for strided convolutions (stride {stride:?})"
                    ),
                ));
            }
            Padding::Same => return Ok(None),
        }))
    }
}

options! {
    /// Arguments of `conv1d` and `conv2d` (PyTorch's defaults: stride 1, no padding, dilation 1,
    /// one group).
    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    pub struct ConvOptions {
        /// Step between windows.
        stride: Ints = 1.into() => into "Sets the stride.",
        /// Zero padding of the input.
        padding: Padding = 0.into() => into "Sets the padding.",
        /// Step between kernel taps.
        dilation: Ints = 1.into() => into "Sets the dilation.",
        /// Channel groups: input and output channels split into `groups` independent halves.
        groups: usize = 1 => "Sets the number of groups.",
    }

    /// Arguments of `conv_transpose2d` (PyTorch's defaults: stride 1, no padding, no output
    /// padding, one group, dilation 1).
    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    pub struct ConvTransposeOptions {
        /// Stride of the convolution this op transposes.
        stride: Ints = 1.into() => into "Sets the stride.",
        /// Padding of the convolution this op transposes (removed from both output edges).
        padding: Ints = 0.into() => into "Sets the padding.",
        /// Extra rows and columns added after the output (smaller than stride or dilation).
        output_padding: Ints = 0.into() => into "Sets the output padding.",
        /// Dilation of the kernel.
        dilation: Ints = 1.into() => into "Sets the dilation.",
        /// Channel groups.
        groups: usize = 1 => "Sets the number of groups.",
    }

    /// Arguments of `max_pool2d` (stride defaults to the kernel size).
    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    pub struct MaxPoolOptions(kernel_size: Ints) {
        /// Window size.
        kernel_size: Ints = kernel_size,
        /// Step between windows; `None` means the kernel size.
        stride: Option<Ints> = None => some(Ints) "Sets the stride.",
        /// Implicit `-inf` padding on both sides (at most half the dilated window).
        padding: Ints = 0.into() => into "Sets the padding.",
        /// Step between window taps.
        dilation: Ints = 1.into() => into "Sets the dilation.",
        /// Rounds the output size up, keeping a last window that starts inside the input.
        ceil_mode: bool = false => "Sets ceil mode.",
    }

    /// Arguments of `col2im` and `im2col` (PyTorch's `fold` and `unfold`; its defaults:
    /// dilation 1, no padding, stride 1).
    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    pub struct FoldOptions(kernel_size: Ints) {
        /// Patch size.
        kernel_size: Ints = kernel_size,
        /// Step between patch taps.
        dilation: Ints = 1.into() => into "Sets the dilation.",
        /// Zero padding on both sides of the image.
        padding: Ints = 0.into() => into "Sets the padding.",
        /// Step between patches.
        stride: Ints = 1.into() => into "Sets the stride.",
    }

    /// Arguments of `avg_pool2d` (stride defaults to the kernel size; padding counts toward the
    /// average unless `count_include_pad` is false).
    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    pub struct AvgPoolOptions(kernel_size: Ints) {
        /// Window size.
        kernel_size: Ints = kernel_size,
        /// Step between windows; `None` means the kernel size.
        stride: Option<Ints> = None => some(Ints) "Sets the stride.",
        /// Zero padding on both sides (at most half the window).
        padding: Ints = 0.into() => into "Sets the padding.",
        /// Rounds the output size up, keeping a last window that starts inside the input.
        ceil_mode: bool = false => "Sets ceil mode.",
        /// Whether padding zeros count in the divisor.
        count_include_pad: bool = true => "Sets whether padding counts in the divisor.",
        /// Divides every window's sum by this instead of its size.
        divisor_override: Option<usize> = None => "Sets a fixed divisor.",
    }
}

/// The output size of `interpolate`: given outright, or as a scale factor per spatial dim
/// (output size `floor(input * scale)`; the scale itself then maps coordinates, as in PyTorch
/// without `recompute_scale_factor`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Resize {
    /// Output height and width.
    Size([usize; 2]),
    /// Height and width scale factors.
    Scale([f64; 2]),
}

/// How `interpolate` computes output pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InterpolateMode {
    /// PyTorch's legacy `'nearest'`: source index `floor(dst * in / out)`.
    Nearest,
    /// Bilinear; `align_corners` maps the corner pixel centres onto each other.
    Bilinear {
        /// PyTorch's `align_corners`.
        align_corners: bool,
    },
}
