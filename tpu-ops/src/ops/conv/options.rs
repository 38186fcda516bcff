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

/// Arguments of `conv1d` and `conv2d` (PyTorch's defaults: stride 1, no padding, dilation 1,
/// one group).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvOptions {
    /// Step between windows.
    pub stride: Ints,
    /// Zero padding of the input.
    pub padding: Padding,
    /// Step between kernel taps.
    pub dilation: Ints,
    /// Channel groups: input and output channels split into `groups` independent halves.
    pub groups: usize,
}

impl Default for ConvOptions {
    fn default() -> ConvOptions {
        ConvOptions {
            stride: 1.into(),
            padding: 0.into(),
            dilation: 1.into(),
            groups: 1,
        }
    }
}

impl ConvOptions {
    /// PyTorch's defaults.
    pub fn new() -> ConvOptions {
        ConvOptions::default()
    }

    /// Sets the stride.
    pub fn stride(mut self, v: impl Into<Ints>) -> ConvOptions {
        self.stride = v.into();
        self
    }

    /// Sets the padding.
    pub fn padding(mut self, v: impl Into<Padding>) -> ConvOptions {
        self.padding = v.into();
        self
    }

    /// Sets the dilation.
    pub fn dilation(mut self, v: impl Into<Ints>) -> ConvOptions {
        self.dilation = v.into();
        self
    }

    /// Sets the number of groups.
    pub fn groups(mut self, g: usize) -> ConvOptions {
        self.groups = g;
        self
    }
}

/// Arguments of `conv_transpose2d` (PyTorch's defaults: stride 1, no padding, no output
/// padding, one group, dilation 1).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvTransposeOptions {
    /// Stride of the convolution this op transposes.
    pub stride: Ints,
    /// Padding of the convolution this op transposes (removed from both output edges).
    pub padding: Ints,
    /// Extra rows and columns added after the output (smaller than stride or dilation).
    pub output_padding: Ints,
    /// Dilation of the kernel.
    pub dilation: Ints,
    /// Channel groups.
    pub groups: usize,
}

impl Default for ConvTransposeOptions {
    fn default() -> ConvTransposeOptions {
        ConvTransposeOptions {
            stride: 1.into(),
            padding: 0.into(),
            output_padding: 0.into(),
            dilation: 1.into(),
            groups: 1,
        }
    }
}

impl ConvTransposeOptions {
    /// PyTorch's defaults.
    pub fn new() -> ConvTransposeOptions {
        ConvTransposeOptions::default()
    }

    /// Sets the stride.
    pub fn stride(mut self, v: impl Into<Ints>) -> ConvTransposeOptions {
        self.stride = v.into();
        self
    }

    /// Sets the padding.
    pub fn padding(mut self, v: impl Into<Ints>) -> ConvTransposeOptions {
        self.padding = v.into();
        self
    }

    /// Sets the output padding.
    pub fn output_padding(mut self, v: impl Into<Ints>) -> ConvTransposeOptions {
        self.output_padding = v.into();
        self
    }

    /// Sets the dilation.
    pub fn dilation(mut self, v: impl Into<Ints>) -> ConvTransposeOptions {
        self.dilation = v.into();
        self
    }

    /// Sets the number of groups.
    pub fn groups(mut self, g: usize) -> ConvTransposeOptions {
        self.groups = g;
        self
    }
}

/// Arguments of `max_pool2d` (stride defaults to the kernel size).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MaxPoolOptions {
    /// Window size.
    pub kernel_size: Ints,
    /// Step between windows; `None` means the kernel size.
    pub stride: Option<Ints>,
    /// Implicit `-inf` padding on both sides (at most half the dilated window).
    pub padding: Ints,
    /// Step between window taps.
    pub dilation: Ints,
    /// Rounds the output size up, keeping a last window that starts inside the input.
    pub ceil_mode: bool,
}

impl MaxPoolOptions {
    /// A window of `kernel_size`, with PyTorch's other defaults.
    pub fn new(kernel_size: impl Into<Ints>) -> MaxPoolOptions {
        MaxPoolOptions {
            kernel_size: kernel_size.into(),
            stride: None,
            padding: 0.into(),
            dilation: 1.into(),
            ceil_mode: false,
        }
    }

    /// Sets the stride.
    pub fn stride(mut self, v: impl Into<Ints>) -> MaxPoolOptions {
        self.stride = Some(v.into());
        self
    }

    /// Sets the padding.
    pub fn padding(mut self, v: impl Into<Ints>) -> MaxPoolOptions {
        self.padding = v.into();
        self
    }

    /// Sets the dilation.
    pub fn dilation(mut self, v: impl Into<Ints>) -> MaxPoolOptions {
        self.dilation = v.into();
        self
    }

    /// Sets ceil mode.
    pub fn ceil_mode(mut self, on: bool) -> MaxPoolOptions {
        self.ceil_mode = on;
        self
    }
}

/// Arguments of `avg_pool2d` (stride defaults to the kernel size; padding counts toward the
/// average unless `count_include_pad` is false).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AvgPoolOptions {
    /// Window size.
    pub kernel_size: Ints,
    /// Step between windows; `None` means the kernel size.
    pub stride: Option<Ints>,
    /// Zero padding on both sides (at most half the window).
    pub padding: Ints,
    /// Rounds the output size up, keeping a last window that starts inside the input.
    pub ceil_mode: bool,
    /// Whether padding zeros count in the divisor.
    pub count_include_pad: bool,
    /// Divides every window's sum by this instead of its size.
    pub divisor_override: Option<usize>,
}

impl AvgPoolOptions {
    /// A window of `kernel_size`, with PyTorch's other defaults.
    pub fn new(kernel_size: impl Into<Ints>) -> AvgPoolOptions {
        AvgPoolOptions {
            kernel_size: kernel_size.into(),
            stride: None,
            padding: 0.into(),
            ceil_mode: false,
            count_include_pad: true,
            divisor_override: None,
        }
    }

    /// Sets the stride.
    pub fn stride(mut self, v: impl Into<Ints>) -> AvgPoolOptions {
        self.stride = Some(v.into());
        self
    }

    /// Sets the padding.
    pub fn padding(mut self, v: impl Into<Ints>) -> AvgPoolOptions {
        self.padding = v.into();
        self
    }

    /// Sets ceil mode.
    pub fn ceil_mode(mut self, on: bool) -> AvgPoolOptions {
        self.ceil_mode = on;
        self
    }

    /// Sets whether padding counts in the divisor.
    pub fn count_include_pad(mut self, on: bool) -> AvgPoolOptions {
        self.count_include_pad = on;
        self
    }

    /// Sets a fixed divisor.
    pub fn divisor_override(mut self, d: Option<usize>) -> AvgPoolOptions {
        self.divisor_override = d;
        self
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
