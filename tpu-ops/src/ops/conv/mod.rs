//! Convolutions, pooling and interpolation over PyTorch's channels-first layouts: `[N, C, L]`
//! for 1-D ops and `[N, C, H, W]` for 2-D ops (the batch dim may be left out, as PyTorch
//! allows).
//!
//! The CPU kernels compute in f32 (f64 for f64 inputs) and round once to the 16-bit floats.
//! Convolutions gather input patches into a matrix (im2col) and multiply it with faer; pooling
//! and interpolation loop directly over the `(N, C)` planes. The lowerings use
//! `stablehlo.convolution`, `stablehlo.reduce_window`, and gathers whose index tables are
//! computed when the program is built, with the same arithmetic as the CPU kernels.
//!
//! Every op here has a backward rule made of ops, so gradients run where the forward ran:
//! convolutions differentiate into (transposed) convolutions, max pooling scatters into the
//! indices of the maxima, average pooling is a transposed convolution with a kernel of ones,
//! adaptive pooling two products with averaging matrices, and interpolation `index_add`s the
//! weighted gradient into its source rows and columns.

use std::ops::{Add, AddAssign, Div, Mul, Range, Sub};
use std::sync::Arc;

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;
use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::tpu_runtime::memory::{check_host_memory, try_host_vec};
use tpu_tensor::{DType, Device, Element, Error, Generator, Result, Scalar, Tensor, bf16, f16};

use crate::TensorOps;
use crate::autograd::Saved;
use crate::cpu::kernels::{PAR_THRESHOLD, Reader, cpu_device};
use crate::hlo::{Cmp, FnBuilder, TensorType, Value, i64_array, list, literal};
use crate::op::promote::compute_dtype;
use crate::op::{DTypeSet, Meta, OpDef, OpInfo};
use crate::ops::movement::MovementOps;
use crate::ops::reduce::ReduceOps;

// ---- options ----------------------------------------------------------------------------------

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
    fn resolve(&self, op: &str, what: &str, n: usize) -> Result<Vec<usize>> {
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
    fn positive(&self, op: &str, what: &str, n: usize) -> Result<Vec<usize>> {
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

// ---- shared helpers ---------------------------------------------------------------------------

const FLOAT_ONLY: DTypeSet = DTypeSet::FLOAT;

fn check_float(op: &str, m: &Meta) -> Result<()> {
    if FLOAT_ONLY.contains(m.dtype) {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            op: op.into(),
            given: m.dtype.to_string(),
            supported: FLOAT_ONLY.to_string(),
        })
    }
}

fn same_dtype(op: &str, what: &str, x: &Meta, other: &Meta) -> Result<()> {
    if x.dtype == other.dtype {
        Ok(())
    } else {
        Err(Error::DTypeMismatch {
            context: format!(
                "{op}: {what} of shape {} must have the input's dtype",
                fmt_shape(&other.shape)
            ),
            expected: x.dtype,
            given: other.dtype,
        })
    }
}

/// PyTorch's pooling output size (`pooling_output_shape`), or `None` when it is below 1.
fn pool_out(len: usize, k: usize, s: usize, p: usize, d: usize, ceil: bool) -> Option<usize> {
    // In i128, where sums and the products below of sizes that fit a usize cannot overflow.
    let (len, k, s, p, d) = (len as i128, k as i128, s as i128, p as i128, d as i128);
    let num = len + 2 * p - d.checked_mul(k - 1)? - 1 + if ceil { s - 1 } else { 0 };
    let mut out = num.div_euclid(s) + 1;
    // The last window must start inside the input or its left padding.
    if ceil && (out - 1) * s >= len + p {
        out -= 1;
    }
    (out >= 1).then(|| usize::try_from(out).ok()).flatten()
}

/// The span of a kernel of `k` taps `d` apart, or `None` when it overflows.
fn dilated(k: usize, d: usize) -> Option<usize> {
    k.checked_sub(1)?.checked_mul(d)?.checked_add(1)
}

/// A size computed from user arguments, or a shape error saying which one overflowed.
fn arith(op: &str, what: &str, v: Option<usize>) -> Result<usize> {
    v.ok_or_else(|| {
        Error::shape(
            op,
            format!("the {what} is more than the address space holds"),
        )
    })
}

/// The one input of a pooling or interpolation op.
fn single<'a>(op: &str, inputs: &'a [Meta]) -> Result<&'a Meta> {
    match inputs {
        [x] => Ok(x),
        _ => Err(Error::invalid_argument(
            op,
            format!("expected one input tensor, got {}", inputs.len()),
        )),
    }
}

/// `[N, C, H, W]` of a 3-D (unbatched) or 4-D input.
fn nchw(shape: &[usize]) -> [usize; 4] {
    match shape {
        [c, h, w] => [1, *c, *h, *w],
        [n, c, h, w] => [*n, *c, *h, *w],
        _ => [0; 4],
    }
}

/// Floats the kernels compute in.
trait Fl:
    Element
    + faer::traits::RealField
    + Add<Output = Self>
    + AddAssign
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + PartialOrd
{
    fn of(v: f64) -> Self {
        Self::from_f64(v)
    }
    fn of_usize(v: usize) -> Self {
        Self::from_f64(v as f64)
    }
    fn fl_floor(self) -> Self;
    fn fl_nan(self) -> bool;
}

impl Fl for f32 {
    fn fl_floor(self) -> f32 {
        self.floor()
    }
    fn fl_nan(self) -> bool {
        self.is_nan()
    }
}

impl Fl for f64 {
    fn fl_floor(self) -> f64 {
        self.floor()
    }
    fn fl_nan(self) -> bool {
        self.is_nan()
    }
}

/// The elements of `t` in row-major order, converted to `F`.
fn read<F: Fl>(t: &Tensor) -> Result<Vec<F>> {
    t.to_dtype(F::DTYPE)?.to_vec::<F>()
}

/// Allocates the output of `meta`'s shape in compute precision on `x`'s device, fills it
/// with `fill`, and rounds it to `meta`'s dtype.
fn produce<F: Fl>(
    op: &str,
    x: &Tensor,
    meta: &Meta,
    fill: impl FnOnce(&CpuDevice, &mut [F]) -> Result<()>,
) -> Result<Tensor> {
    let dev = cpu_device(op, x)?;
    let device = Device::from_cpu(dev.clone());
    Tensor::from_fn_typed::<F>(&meta.shape, &device, |out| fill(&dev, out))?.to_dtype(meta.dtype)
}

/// Multiply-adds below which convolutions stay on the calling thread.
const CONV_PAR_WORK: usize = 1 << 18;

/// Runs `task(index, block, par)` over consecutive `block`-sized pieces of `out`: on the
/// calling thread for small `work`, else on the device's pool, each piece handing the matrix
/// product the threads that the pieces leave idle.
fn run_blocks<F: Send>(
    dev: &CpuDevice,
    out: &mut [F],
    block: usize,
    work: usize,
    task: impl Fn(usize, &mut [F], Par) + Sync + Send,
) -> Result<()> {
    if block == 0 || out.is_empty() {
        return Ok(());
    }
    let threads = dev.num_threads();
    if work < CONV_PAR_WORK || threads <= 1 {
        for (i, b) in out.chunks_mut(block).enumerate() {
            task(i, b, Par::Seq);
        }
        return Ok(());
    }
    let blocks = out.len() / block;
    let inner = threads.div_ceil(blocks.max(1));
    let par = if inner > 1 {
        Par::rayon(inner)
    } else {
        Par::Seq
    };
    dev.install(|| {
        out.par_chunks_mut(block)
            .enumerate()
            .for_each(|(i, b)| task(i, b, par))
    })
}

/// Runs `f(plane, out_plane)` over the `(N, C)` planes of `out`, in parallel when `work`
/// (elements read) is large.
fn each_plane<T: Send>(
    dev: &CpuDevice,
    out: &mut [T],
    plane: usize,
    work: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) -> Result<()> {
    if plane == 0 || out.is_empty() {
        return Ok(());
    }
    if work < PAR_THRESHOLD || dev.num_threads() <= 1 {
        out.chunks_mut(plane).enumerate().for_each(|(p, o)| f(p, o));
        return Ok(());
    }
    dev.install(|| {
        out.par_chunks_mut(plane)
            .enumerate()
            .for_each(|(p, o)| f(p, o))
    })
}

/// A 1-D float constant of `dtype` with exactly these values.
fn const_float(b: &mut FnBuilder, values: &[f64], dtype: DType) -> Value {
    let ty = TensorType::new(&[values.len()], dtype);
    let parts: Vec<String> = values
        .iter()
        .map(|&v| literal(dtype, Scalar::Float(v)))
        .collect();
    let attrs = format!("value = dense<[{}]> : {ty}", parts.join(", "));
    b.op("stablehlo.constant", &[], &attrs, ty)
}

/// Gathers along `axis` of `x` with constant indices of shape `idx_dims`; the index dims take
/// the place of `axis` in the result.
fn gather_axis(
    b: &mut FnBuilder,
    x: &Value,
    axis: usize,
    idx: &[i64],
    idx_dims: &[usize],
) -> Value {
    let rank = x.ty.rank();
    let k = idx_dims.len();
    let mut ishape = idx_dims.to_vec();
    ishape.push(1);
    let iv = b.constant_i64(&ishape, idx);
    let offset: Vec<i64> = (0..rank)
        .filter(|&d| d != axis)
        .map(|d| {
            if d < axis {
                d as i64
            } else {
                (d - 1 + k) as i64
            }
        })
        .collect();
    let sizes: Vec<i64> = (0..rank)
        .map(|d| if d == axis { 1 } else { x.dims()[d] as i64 })
        .collect();
    let mut out = x.dims()[..axis].to_vec();
    out.extend_from_slice(idx_dims);
    out.extend_from_slice(&x.dims()[axis + 1..]);
    let attrs = format!(
        "dimension_numbers = #stablehlo.gather<offset_dims = {}, collapsed_slice_dims = [{axis}], start_index_map = [{axis}], index_vector_dim = {k}>, slice_sizes = {}, indices_are_sorted = false",
        list(&offset),
        i64_array(&sizes)
    );
    b.op(
        "stablehlo.gather",
        &[x, &iv],
        &attrs,
        TensorType::new(&out, x.dtype()),
    )
}

/// A `[lo, hi]` per dim padding attribute.
fn padding_attr(pad: &[[i64; 2]]) -> String {
    let rows: Vec<String> = pad
        .iter()
        .map(|p| format!("[{}, {}]", p[0], p[1]))
        .collect();
    format!("dense<[{}]> : tensor<{}x2xi64>", rows.join(", "), pad.len())
}

/// Geometry of a `stablehlo.convolution` over `[N, C, H, W]` and `[O, I, KH, KW]`.
struct ConvHlo {
    strides: [usize; 2],
    pad: [[i64; 2]; 2],
    lhs_dilation: [usize; 2],
    rhs_dilation: [usize; 2],
    groups: usize,
}

/// Emits the convolution with the matrix-product precision in force (see
/// `ops::linalg::set_matmul_precision`); the ops put it in their attributes, so a change of
/// setting compiles anew.
fn convolution(b: &mut FnBuilder, x: &Value, w: &Value, c: &ConvHlo, out: &[usize]) -> Value {
    let p = crate::ops::linalg::matmul_precision().as_attr();
    let u = |v: [usize; 2]| i64_array(&[v[0] as i64, v[1] as i64]);
    let attrs = format!(
        "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>, feature_group_count = {} : i64, lhs_dilation = {}, padding = {}, precision_config = [{p}, {p}], rhs_dilation = {}, window_strides = {}",
        c.groups,
        u(c.lhs_dilation),
        padding_attr(&c.pad),
        u(c.rhs_dilation),
        u(c.strides)
    );
    b.op(
        "stablehlo.convolution",
        &[x, w],
        &attrs,
        TensorType::new(out, x.dtype()),
    )
}

/// Adds a per-channel bias `[C]` to `[N, C, H, W]`.
fn add_bias(b: &mut FnBuilder, y: &Value, bias: &Value) -> Value {
    let bb = b.broadcast_in_dim(bias, &[1], y.dims());
    b.ew("stablehlo.add", &[y, &bb])
}

/// A 4-D `stablehlo.reduce_window` over the last two dims.
struct Window {
    dims: [usize; 2],
    strides: [usize; 2],
    dilations: [usize; 2],
    pad: [[i64; 2]; 2],
}

fn reduce_window(
    b: &mut FnBuilder,
    inputs: &[&Value],
    inits: &[&Value],
    w: &Window,
    out: &[usize],
    body: impl FnOnce(&mut FnBuilder, &[Value]) -> Vec<Value>,
) -> Vec<Value> {
    let region = b.region(
        &inits.iter().map(|v| v.ty.clone()).collect::<Vec<_>>(),
        2,
        body,
    );
    let four = |v: [usize; 2]| i64_array(&[1, 1, v[0] as i64, v[1] as i64]);
    let attrs = format!(
        "padding = {}, window_dilations = {}, window_dimensions = {}, window_strides = {}",
        padding_attr(&[[0, 0], [0, 0], w.pad[0], w.pad[1]]),
        four(w.dilations),
        four(w.dims),
        four(w.strides)
    );
    let results: Vec<TensorType> = inputs
        .iter()
        .map(|v| TensorType::new(out, v.dtype()))
        .collect();
    let mut operands: Vec<&Value> = inputs.to_vec();
    operands.extend_from_slice(inits);
    b.op_n(
        "stablehlo.reduce_window",
        &operands,
        &attrs,
        &region,
        &results,
    )
}

// ---- convolution ------------------------------------------------------------------------------

/// The input and weight metas of a convolution called with input, weight and optional bias.
fn conv_operands<'a>(op: &str, inputs: &'a [Meta]) -> Result<(&'a Meta, &'a Meta)> {
    match inputs {
        [x, w] | [x, w, _] => Ok((x, w)),
        _ => Err(Error::invalid_argument(
            op,
            format!(
                "expected input, weight and optionally bias, got {} tensors",
                inputs.len()
            ),
        )),
    }
}

/// Padding of a convolution once options are resolved.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Pad {
    /// `[before, after]` for H and W.
    Sides([[usize; 2]; 2]),
    /// Resolved against the kernel size in `geom`.
    Same,
}

/// Everything a convolution kernel needs, resolved from the shapes. 1-D convolutions have
/// `h == 1` and a kernel height of 1.
#[derive(Clone, Copy, Debug)]
struct ConvGeom {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    /// Output channels.
    o: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    stride: [usize; 2],
    pad: [[usize; 2]; 2],
    dil: [usize; 2],
    groups: usize,
}

impl ConvGeom {
    fn pad_i64(&self) -> [[i64; 2]; 2] {
        [
            [self.pad[0][0] as i64, self.pad[0][1] as i64],
            [self.pad[1][0] as i64, self.pad[1][1] as i64],
        ]
    }
}

/// `conv1d` or `conv2d`; inputs: input, weight, and optionally bias.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Conv {
    spatial: usize,
    stride: [usize; 2],
    pad: Pad,
    dilation: [usize; 2],
    groups: usize,
}

impl Conv {
    /// The op for `spatial` (1 or 2) spatial dims and `opts`.
    fn new(spatial: usize, opts: &ConvOptions) -> Result<Conv> {
        let name = if spatial == 1 { "conv1d" } else { "conv2d" };
        let s = opts.stride.positive(name, "stride", spatial)?;
        let d = opts.dilation.positive(name, "dilation", spatial)?;
        if opts.groups == 0 {
            return Err(Error::invalid_argument(
                name,
                "expected groups to be positive, got 0",
            ));
        }
        let sides: Vec<[usize; 2]> = match &opts.padding {
            Padding::Symmetric(p) => p
                .resolve(name, "padding", spatial)?
                .into_iter()
                .map(|v| [v, v])
                .collect(),
            Padding::Sides(v) if v.len() == spatial => v.clone(),
            Padding::Sides(v) => {
                return Err(Error::invalid_argument(
                    name,
                    format!(
                        "expected {spatial} [before, after] padding pairs, got {}: {v:?}",
                        v.len()
                    ),
                ));
            }
            Padding::Valid => vec![[0, 0]; spatial],
            Padding::Same => Vec::new(),
        };
        if opts.padding == Padding::Same && s.iter().any(|&v| v != 1) {
            return Err(Error::invalid_argument(
                name,
                format!(
                    "padding \"same\" is not supported for strided convolutions (stride {s:?})"
                ),
            ));
        }
        // 1-D convolutions run as 2-D ones over a height of 1.
        let two = |v: &[usize], unit: usize| {
            if spatial == 1 {
                [unit, v[0]]
            } else {
                [v[0], v[1]]
            }
        };
        let pad = if opts.padding == Padding::Same {
            Pad::Same
        } else if spatial == 1 {
            Pad::Sides([[0, 0], sides[0]])
        } else {
            Pad::Sides([sides[0], sides[1]])
        };
        Ok(Conv {
            spatial,
            stride: two(&s, 1),
            pad,
            dilation: two(&d, 1),
            groups: opts.groups,
        })
    }

    fn geom(&self, inputs: &[Meta]) -> Result<(ConvGeom, Vec<usize>)> {
        let name = self.name();
        let sp = self.spatial;
        let (x, w) = conv_operands(name, inputs)?;
        check_float(name, x)?;
        same_dtype(name, "weight", x, w)?;
        if let Some(b) = inputs.get(2) {
            same_dtype(name, "bias", x, b)?;
        }
        let batched = x.rank() == sp + 2;
        if !batched && x.rank() != sp + 1 {
            return Err(Error::shape(
                name,
                format!(
                    "expected a {}-D (unbatched) or {}-D (batched) input, got shape {}",
                    sp + 1,
                    sp + 2,
                    fmt_shape(&x.shape)
                ),
            ));
        }
        if w.rank() != sp + 2 {
            return Err(Error::shape(
                name,
                format!(
                    "expected a {}-D weight [out_channels, in_channels / groups, {}], got shape {}",
                    sp + 2,
                    if sp == 1 { "k" } else { "kh, kw" },
                    fmt_shape(&w.shape)
                ),
            ));
        }
        let xs = &x.shape[..];
        let (n, c, h, wd) = match (batched, sp) {
            (true, 2) => (xs[0], xs[1], xs[2], xs[3]),
            (false, 2) => (1, xs[0], xs[1], xs[2]),
            (true, _) => (xs[0], xs[1], 1, xs[2]),
            (false, _) => (1, xs[0], 1, xs[1]),
        };
        let (o, ci) = (w.shape[0], w.shape[1]);
        let (kh, kw) = if sp == 2 {
            (w.shape[2], w.shape[3])
        } else {
            (1, w.shape[2])
        };
        let g = self.groups;
        if o % g != 0 {
            return Err(Error::shape(
                name,
                format!(
                    "groups={g} must divide the weight's output channels, got weight of shape {}",
                    fmt_shape(&w.shape)
                ),
            ));
        }
        if ci.checked_mul(g) != Some(c) {
            return Err(Error::shape(
                name,
                format!(
                    "groups={g} and weight of shape {} expect an input with {} channels, got input of shape {} ({c} channels)",
                    fmt_shape(&w.shape),
                    ci as u128 * g as u128,
                    fmt_shape(xs)
                ),
            ));
        }
        if let Some(b) = inputs.get(2)
            && b.shape[..] != [o]
        {
            return Err(Error::shape(
                name,
                format!(
                    "expected a bias of shape [{o}] for weight of shape {}, got {}",
                    fmt_shape(&w.shape),
                    fmt_shape(&b.shape)
                ),
            ));
        }
        if kh == 0 || kw == 0 {
            return Err(Error::shape(
                name,
                format!(
                    "expected a non-empty kernel, got weight of shape {}",
                    fmt_shape(&w.shape)
                ),
            ));
        }
        let d = self.dilation;
        let span = [
            arith(name, "dilated kernel", dilated(kh, d[0]))?,
            arith(name, "dilated kernel", dilated(kw, d[1]))?,
        ];
        let pad = match self.pad {
            Pad::Sides(p) => p,
            Pad::Same => {
                let t = [span[0] - 1, span[1] - 1];
                [[t[0] / 2, t[0] - t[0] / 2], [t[1] / 2, t[1] - t[1] / 2]]
            }
        };
        let padded_len = |len: usize, p: [usize; 2]| {
            arith(
                name,
                "padded input",
                len.checked_add(p[0]).and_then(|v| v.checked_add(p[1])),
            )
        };
        let padded = [padded_len(h, pad[0])?, padded_len(wd, pad[1])?];
        if padded[0] < span[0] || padded[1] < span[1] {
            let (pin, ks) = if sp == 1 {
                (padded[1].to_string(), span[1].to_string())
            } else {
                (
                    format!("{} x {}", padded[0], padded[1]),
                    format!("{} x {}", span[0], span[1]),
                )
            };
            return Err(Error::shape(
                name,
                format!(
                    "the padded input per channel ({pin}) is smaller than the dilated kernel ({ks}); input shape {}, weight shape {}",
                    fmt_shape(xs),
                    fmt_shape(&w.shape)
                ),
            ));
        }
        let s = self.stride;
        let oh = (padded[0] - span[0]) / s[0] + 1;
        let ow = (padded[1] - span[1]) / s[1] + 1;
        let mut out = Vec::new();
        if batched {
            out.push(n);
        }
        out.push(o);
        if sp == 2 {
            out.push(oh);
        }
        out.push(ow);
        let geom = ConvGeom {
            n,
            c,
            h,
            w: wd,
            o,
            kh,
            kw,
            oh,
            ow,
            stride: s,
            pad,
            dil: d,
            groups: g,
        };
        Ok((geom, out))
    }
}

/// The transposed convolution on the CPU, computed in `F` and rounded to `meta`'s dtype.
fn run_conv_t<F: Fl>(op: &str, g: &ConvGeom, inputs: &[&Tensor], meta: &Meta) -> Result<Tensor> {
    let x = read::<F>(inputs[0])?;
    let w = read::<F>(inputs[1])?;
    let b = inputs.get(2).map(|t| read::<F>(t)).transpose()?;
    produce::<F>(op, inputs[0], meta, |dev, out| {
        conv_t_cpu(g, &x, &w, b.as_deref(), dev, out)
    })
}

/// Elements of gathered input patches per block on the f32 and f64 path: small enough that a
/// block stays in L2 while the product reads it.
const COLS_BLOCK: usize = 1 << 16;

/// Elements of gathered patches per block on the 16-bit path: larger than the f32 block,
/// because the SIMD product packs its operands itself and per-product overhead dominates
/// narrow blocks (measured: 17.6 ms at 2^16, 15.2 ms at 2^18 for the benchmark's bf16 conv).
const COLS_BLOCK_16: usize = 1 << 18;

/// Fewest output positions per block: narrower products run poorly.
const MIN_COLS: usize = 64;

/// Output positions per block are a multiple of this where there are enough: the product's
/// widest f32 kernel covers 96 rows of its column-major output (48 for f64), and remainders
/// run at half its speed.
const COL_ALIGN: usize = 96;

/// Output planes with fewer positions than this are batched: several images share one
/// product.
const SMALL_PLANE: usize = 256;

/// Columns (positions across images) that a batched product aims for.
const BATCH_COLS: usize = 512;

/// Gathers the input patches of channels `chans` of one image's group `xs` (`[cg, H, W]`) at
/// the output positions `pos` (row-major over `oh x ow`) into rows `(channel, ki, kj)` of
/// `dst`: each row starts `ld` elements after the previous one, at column `col0`. Taps that
/// fall in the padding are zero; every element of the block is written.
fn im2col_block<T: Copy + Default>(
    g: &ConvGeom,
    xs: &[T],
    chans: Range<usize>,
    pos: Range<usize>,
    dst: &mut [T],
    ld: usize,
    col0: usize,
) {
    let (h, w, ow) = (g.h, g.w, g.ow);
    let ([s0, s1], [d0, d1]) = (g.stride, g.dil);
    let (top, left) = (g.pad[0][0], g.pad[1][0]);
    let zero = T::default();
    let mut row = 0;
    for ci in chans {
        let plane = &xs[ci * h * w..(ci + 1) * h * w];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let d = &mut dst[row * ld + col0..row * ld + col0 + pos.len()];
                row += 1;
                // Output column `ox` reads input column `ox * s1 + off - left`, which lies
                // inside the row for `lo <= ox < hi`.
                let off = kj * d1;
                let lo = left.saturating_sub(off).div_ceil(s1);
                let hi = (w + left).saturating_sub(off).div_ceil(s1);
                let mut p = pos.start;
                while p < pos.end {
                    let (oy, ox0) = (p / ow, p % ow);
                    let ox1 = ow.min(ox0 + pos.end - p);
                    let seg = &mut d[p - pos.start..p - pos.start + (ox1 - ox0)];
                    p += ox1 - ox0;
                    let iy = oy * s0 + ki * d0;
                    if iy < top || iy - top >= h {
                        seg.fill(zero);
                        continue;
                    }
                    let src = &plane[(iy - top) * w..(iy - top + 1) * w];
                    let a = lo.clamp(ox0, ox1);
                    let b = hi.clamp(a, ox1);
                    let (head, rest) = seg.split_at_mut(a - ox0);
                    let (mid, tail) = rest.split_at_mut(b - a);
                    head.fill(zero);
                    tail.fill(zero);
                    if a < b {
                        let start = a * s1 + off - left;
                        if s1 == 1 {
                            copy_short(mid, &src[start..start + (b - a)]);
                        } else {
                            for (e, v) in mid.iter_mut().zip(src[start..].iter().step_by(s1)) {
                                *e = *v;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Copies `src` into `dst` (of the same length) in fixed-size pieces, which compile to inline
/// vector moves: the segments of a patch block are short, and a call to `memcpy` for each
/// costs about as much as the copy.
fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    let mut d = dst.chunks_exact_mut(16);
    let mut s = src.chunks_exact(16);
    for (d, s) in (&mut d).zip(&mut s) {
        d.copy_from_slice(s);
    }
    for (d, s) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = *s;
    }
}

/// Block sizes for a product over `cols` output columns and `cg` input channels of `taps`
/// kernel taps each: `(columns per block, channels per reduction step)`, with the block's
/// patches within `budget` elements where possible. Wide blocks are whole multiples of
/// [`COL_ALIGN`], narrow ones of even size.
fn conv_blocks(cols: usize, cg: usize, taps: usize, budget: usize) -> (usize, usize) {
    let k = cg * taps;
    if k * cols <= budget {
        return (cols, cg);
    }
    let nb = (budget / k).max(MIN_COLS).min(cols);
    let nb = if nb >= COL_ALIGN && nb < cols {
        nb / COL_ALIGN * COL_ALIGN
    } else {
        cols.div_ceil(cols.div_ceil(nb))
    };
    let cb = (budget / (taps * nb)).clamp(1, cg);
    (nb, cg.div_ceil(cg.div_ceil(cb)))
}

/// How a convolution's output is split into tasks for the pool.
#[derive(Clone, Copy, Debug)]
enum Split {
    /// One task per image, group and block of `ob` output channels; the product's columns are
    /// the image's output positions.
    Planes { ob: usize },
    /// One task per `imgs` images, whose small output planes form the columns of one product.
    Images { imgs: usize },
}

impl Split {
    fn new(g: &ConvGeom, threads: usize) -> Split {
        let og = g.o / g.groups;
        let ohw = g.oh * g.ow;
        if ohw < SMALL_PLANE && g.n > 1 {
            let mut imgs = (BATCH_COLS / ohw).max(1);
            if threads > 1 {
                imgs = imgs.min(g.n.div_ceil(threads));
            }
            return Split::Images {
                imgs: g.n.div_ceil(g.n.div_ceil(imgs)),
            };
        }
        // Enough tasks to share out evenly: split each group's channels when there are few
        // images, or an odd count of them.
        let units = g.n * g.groups;
        let mut parts = 1;
        while threads > 1
            && parts < og
            && !(units * parts).is_multiple_of(threads)
            && units * parts < 8 * threads
        {
            parts += 1;
        }
        Split::Planes {
            ob: og.div_ceil(parts),
        }
    }

    /// Elements of the output per task.
    fn chunk(&self, g: &ConvGeom) -> usize {
        let ohw = g.oh * g.ow;
        match *self {
            Split::Planes { ob } => ob * ohw,
            Split::Images { imgs } => imgs * g.o * ohw,
        }
    }
}

/// The tasks of `split` over `out`: `(index, first output channel, output chunk)`, where the
/// index counts `(image, group)` pairs for `Split::Planes` and image batches otherwise.
fn conv_tasks<'a, T>(
    g: &ConvGeom,
    split: Split,
    out: &'a mut [T],
) -> Vec<(usize, usize, &'a mut [T])> {
    let chunk = split.chunk(g);
    match split {
        Split::Planes { ob } => {
            let og = g.o / g.groups;
            out.chunks_mut(og * g.oh * g.ow)
                .enumerate()
                .flat_map(|(u, c)| {
                    c.chunks_mut(chunk)
                        .enumerate()
                        .map(move |(j, d)| (u, j * ob, d))
                })
                .collect()
        }
        Split::Images { .. } => out
            .chunks_mut(chunk)
            .enumerate()
            .map(|(t, d)| (t, 0, d))
            .collect(),
    }
}

/// Runs `task` over `tasks` on the device's pool when `threads > 1` (else here), handing the
/// matrix product the threads that the tasks leave idle.
fn run_tasks<T: Send>(
    dev: &CpuDevice,
    threads: usize,
    tasks: Vec<T>,
    task: impl Fn(T, Par) -> Result<()> + Sync + Send,
) -> Result<()> {
    if threads <= 1 {
        return tasks.into_iter().try_for_each(|t| task(t, Par::Seq));
    }
    let inner = threads / tasks.len().max(1);
    let par = if inner > 1 {
        Par::rayon(inner)
    } else {
        Par::Seq
    };
    dev.install(|| tasks.into_par_iter().try_for_each(|t| task(t, par)))?
}

/// The threads a convolution of `g` runs on: one below the work where the pool pays off.
fn conv_threads(g: &ConvGeom, dev: &CpuDevice) -> usize {
    // An estimate for choosing threads: saturating, since huge kernels may overflow it.
    let work = [g.o, g.oh, g.ow, g.c / g.groups, g.kh, g.kw]
        .iter()
        .fold(g.n, |a, &v| a.saturating_mul(v));
    if work < CONV_PAR_WORK {
        1
    } else {
        dev.num_threads()
    }
}

/// The dense operands of a convolution: input `[N, C, H, W]`, weight `[O, cg * kh * kw]`, and
/// bias `[O]`.
#[derive(Clone, Copy)]
struct ConvData<'a, T> {
    x: &'a [T],
    w: &'a [T],
    bias: Option<&'a [T]>,
}

/// Fills `out` (`[N, O, oh, ow]`) for a convolution without input channels: the bias, or zero.
fn conv_no_input<T: Copy + Default>(g: &ConvGeom, bias: Option<&[T]>, out: &mut [T]) {
    for (i, plane) in out.chunks_mut(g.oh * g.ow).enumerate() {
        plane.fill(bias.map_or(T::default(), |b| b[i % g.o]));
    }
}

/// The f32 and f64 convolution on `threads` threads: per task, blocks of input patches of at
/// most about `budget` elements gathered into a buffer that stays in cache (or, for a 1x1
/// kernel without stride or padding, the input itself), each multiplied by the weight straight
/// into the NCHW output.
fn conv_cpu<F: Fl>(
    g: &ConvGeom,
    data: ConvData<'_, F>,
    dev: &CpuDevice,
    threads: usize,
    budget: usize,
    out: &mut [F],
) -> Result<()> {
    let ConvData { x, w, bias } = data;
    let (cg, og) = (g.c / g.groups, g.o / g.groups);
    let (hw, ohw, taps) = (g.h * g.w, g.oh * g.ow, g.kh * g.kw);
    let k = cg * taps;
    if out.is_empty() {
        return Ok(());
    }
    if k == 0 {
        conv_no_input(g, bias, out);
        return Ok(());
    }
    let pointwise = taps == 1 && g.stride == [1, 1] && g.pad == [[0, 0], [0, 0]];
    let split = Split::new(g, threads);
    let one = F::of(1.0);
    let accum = |c0: usize| {
        if c0 == 0 { Accum::Replace } else { Accum::Add }
    };
    let tasks = conv_tasks(g, split, out);
    match split {
        Split::Planes { .. } => {
            let (nb, cb) = if pointwise {
                (ohw, cg)
            } else {
                conv_blocks(ohw, cg, taps, budget)
            };
            run_tasks(dev, threads, tasks, |(u, o0, dst), par| {
                let (img, grp) = (u / g.groups, u % g.groups);
                let xs = &x[(img * g.c + grp * cg) * hw..][..cg * hw];
                let rows = dst.len() / ohw;
                let wg = &w[(grp * og + o0) * k..][..rows * k];
                let mut cols = vec![F::default(); if pointwise { 0 } else { cb * taps * nb }];
                for p0 in (0..ohw).step_by(nb) {
                    let np = nb.min(ohw - p0);
                    for c0 in (0..cg).step_by(cb) {
                        let nc = cb.min(cg - c0);
                        let kc = nc * taps;
                        let rhs = if pointwise {
                            MatRef::from_row_major_slice_with_stride(
                                &xs[c0 * hw + p0..],
                                nc,
                                np,
                                hw,
                            )
                        } else {
                            im2col_block(g, xs, c0..c0 + nc, p0..p0 + np, &mut cols, np, 0);
                            MatRef::from_row_major_slice(&cols[..kc * np], kc, np)
                        };
                        let lhs =
                            MatRef::from_row_major_slice_with_stride(&wg[c0 * taps..], rows, kc, k);
                        // The block of the output: `rows` channels of `np` positions, `ohw`
                        // apart (faer's row-major constructor with a stride is unsound in
                        // 0.24, so this is the transpose of a column-major view).
                        let d = MatMut::from_column_major_slice_with_stride_mut(
                            &mut dst[p0..],
                            np,
                            rows,
                            ohw,
                        )
                        .transpose_mut();
                        matmul(d, accum(c0), lhs, rhs, one, par);
                    }
                    if let Some(b) = bias {
                        for (o, row) in dst.chunks_mut(ohw).enumerate() {
                            let v = b[grp * og + o0 + o];
                            row[p0..p0 + np].iter_mut().for_each(|e| *e += v);
                        }
                    }
                }
                Ok(())
            })
        }
        Split::Images { imgs } => {
            let (_, cb) = conv_blocks(imgs * ohw, cg, taps, budget);
            run_tasks(dev, threads, tasks, |(t, _, dst), par| {
                let bn = dst.len() / (g.o * ohw);
                let ncols = bn * ohw;
                let mut cols = vec![F::default(); cb * taps * ncols];
                let mut acc = vec![F::default(); og * ncols];
                for grp in 0..g.groups {
                    for c0 in (0..cg).step_by(cb) {
                        let nc = cb.min(cg - c0);
                        let kc = nc * taps;
                        for bi in 0..bn {
                            let xs = &x[((t * imgs + bi) * g.c + grp * cg) * hw..][..cg * hw];
                            im2col_block(g, xs, c0..c0 + nc, 0..ohw, &mut cols, ncols, bi * ohw);
                        }
                        let rhs = MatRef::from_row_major_slice(&cols[..kc * ncols], kc, ncols);
                        let lhs = MatRef::from_row_major_slice_with_stride(
                            &w[grp * og * k + c0 * taps..],
                            og,
                            kc,
                            k,
                        );
                        let d = MatMut::from_row_major_slice_mut(&mut acc, og, ncols);
                        matmul(d, accum(c0), lhs, rhs, one, par);
                    }
                    match bias {
                        Some(b) => scatter_planes(g, grp, &acc, ncols, dst, |oc, v| v + b[oc]),
                        None => scatter_planes(g, grp, &acc, ncols, dst, |_, v| v),
                    }
                }
                Ok(())
            })
        }
    }
}

/// Copies a batched product `acc` (`[og, images * ohw]`, rows `ld` apart) of group `grp` into
/// the NCHW output chunk `dst` of those images; `finish(channel, value)` gives each element.
fn scatter_planes<A: Copy, T>(
    g: &ConvGeom,
    grp: usize,
    acc: &[A],
    ld: usize,
    dst: &mut [T],
    finish: impl Fn(usize, A) -> T,
) {
    let og = g.o / g.groups;
    let ohw = g.oh * g.ow;
    for (bi, img) in dst.chunks_mut(g.o * ohw).enumerate() {
        for o in 0..og {
            let oc = grp * og + o;
            let src = &acc[o * ld + bi * ohw..][..ohw];
            let d = &mut img[oc * ohw..][..ohw];
            d.iter_mut().zip(src).for_each(|(e, s)| *e = finish(oc, *s));
        }
    }
}

/// The 16-bit float dtypes, which convolve with f32 accumulation. The conversions are plain
/// bit arithmetic without branches, so that loops over them vectorise.
trait Half: Element {
    fn widen(self) -> f32;
    fn narrow(v: f32) -> Self;
}

impl Half for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    #[inline(always)]
    fn narrow(v: f32) -> bf16 {
        let b = v.to_bits();
        // Round to nearest even; NaNs keep their sign and stay NaNs.
        let r = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
        let nan = (b >> 16) | 0x40;
        bf16::from_bits(if v.is_nan() { nan } else { r } as u16)
    }
}

impl Half for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        let h = u32::from(self.to_bits());
        let em = h & 0x7fff;
        // The f16 exponent and fraction read as an f32 whose exponent is 112 short: scaling
        // by 2^112 fixes normals and subnormals alike; infinities and NaNs are set directly.
        let finite = (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits();
        let bits = if em >= 0x7c00 {
            (em << 13) | 0x7f80_0000
        } else {
            finite
        };
        f32::from_bits(bits | ((h & 0x8000) << 16))
    }
    fn narrow(v: f32) -> f16 {
        f16::from_f32(v)
    }
}

/// A row-major matrix inside a slice: element `(i, j)` at `data[i * ld + j]`.
#[derive(Clone, Copy)]
struct Panel<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    ld: usize,
}

/// The widened operands of [`gemm16`], kept by each task between products.
#[derive(Default)]
struct Widened {
    /// The address and shape of the 16-bit weight block now in `a`.
    a_key: Option<(usize, usize, usize, usize)>,
    a: Vec<f32>,
    b: Vec<f32>,
}

/// Copies the 16-bit matrix `p` into `dst` as a dense f32 matrix.
fn widen_panel<T: Half>(p: Panel<'_, T>, dst: &mut Vec<f32>) {
    dst.resize(p.rows * p.cols, 0.0);
    for (i, r) in dst.chunks_mut(p.cols).enumerate() {
        let src = &p.data[i * p.ld..][..p.cols];
        r.iter_mut().zip(src).for_each(|(d, s)| *d = s.widen());
    }
}

/// The 16-bit convolution's only product: `dst (+)= a · b` for a 16-bit weight block `a`
/// (`[m, k]`) and patch panel `b` (`[k, n]`), accumulated in f32 into `dst` (`[m, n]`, rows
/// `n` apart). With AVX-512 the SIMD product reads the 16-bit operands in place (`vdpbf16ps`
/// for bf16); elsewhere it widens both (the weight once while a task reuses it) and runs
/// faer's f32 product.
fn gemm16<T: Half + crate::cpu::simd::Elem>(
    a: Panel<'_, T>,
    b: Panel<'_, T>,
    dst: &mut [f32],
    accumulate: bool,
    par: Par,
    wide: &mut Widened,
) -> Result<()> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || dst.len() < m * n {
        return Err(Error::internal(
            "conv2d",
            format!("product of [{m}, {k}] and [{}, {n}]", b.rows),
        ));
    }
    if crate::cpu::simd::gemm_accelerated() {
        fn view<'a, T>(p: Panel<'a, T>) -> crate::cpu::simd::MatView<'a, T> {
            crate::cpu::simd::MatView {
                data: p.data,
                offset: 0,
                rows: p.rows,
                cols: p.cols,
                rs: p.ld,
                cs: 1,
            }
        }
        let threads = match par {
            Par::Seq => 1,
            Par::Rayon(t) => t.get(),
        };
        return crate::cpu::simd::gemm(view(a), view(b), &mut dst[..m * n], accumulate, threads);
    }
    // The weight stays borrowed for the whole convolution, so one address means one content.
    let key = (a.data.as_ptr() as usize, m, k, a.ld);
    if wide.a_key != Some(key) {
        widen_panel(a, &mut wide.a);
        wide.a_key = Some(key);
    }
    widen_panel(b, &mut wide.b);
    let accum = if accumulate {
        Accum::Add
    } else {
        Accum::Replace
    };
    matmul(
        MatMut::from_row_major_slice_mut(&mut dst[..m * n], m, n),
        accum,
        MatRef::from_row_major_slice(&wide.a, m, k),
        MatRef::from_row_major_slice(&wide.b, k, n),
        1.0f32,
        par,
    );
    Ok(())
}

/// The bf16 and f16 convolution: the blocks of [`conv_cpu`], gathered in the 16-bit dtype and
/// multiplied by [`gemm16`] into an f32 accumulator, to which the bias is added before the one
/// rounding of each output element.
fn conv_cpu16<T: Half + crate::cpu::simd::Elem>(
    g: &ConvGeom,
    data: ConvData<'_, T>,
    dev: &CpuDevice,
    threads: usize,
    budget: usize,
    out: &mut [T],
) -> Result<()> {
    let ConvData { x, w, bias } = data;
    let (cg, og) = (g.c / g.groups, g.o / g.groups);
    let (hw, ohw, taps) = (g.h * g.w, g.oh * g.ow, g.kh * g.kw);
    let k = cg * taps;
    if out.is_empty() {
        return Ok(());
    }
    if k == 0 {
        conv_no_input(g, bias, out);
        return Ok(());
    }
    let pointwise = taps == 1 && g.stride == [1, 1] && g.pad == [[0, 0], [0, 0]];
    let split = Split::new(g, threads);
    let bias_of = |oc: usize| bias.map_or(0.0, |b| b[oc].widen());
    let tasks = conv_tasks(g, split, out);
    match split {
        Split::Planes { .. } => {
            let (nb, cb) = conv_blocks(ohw, cg, taps, budget);
            run_tasks(dev, threads, tasks, |(u, o0, dst), par| {
                let (img, grp) = (u / g.groups, u % g.groups);
                let xs = &x[(img * g.c + grp * cg) * hw..][..cg * hw];
                let rows = dst.len() / ohw;
                let wg = &w[(grp * og + o0) * k..][..rows * k];
                let mut cols = vec![T::default(); if pointwise { 0 } else { cb * taps * nb }];
                let mut acc = vec![0.0f32; rows * nb];
                let mut wide = Widened::default();
                for p0 in (0..ohw).step_by(nb) {
                    let np = nb.min(ohw - p0);
                    for c0 in (0..cg).step_by(cb) {
                        let nc = cb.min(cg - c0);
                        let kc = nc * taps;
                        let panel = if pointwise {
                            Panel {
                                data: &xs[c0 * hw + p0..],
                                rows: nc,
                                cols: np,
                                ld: hw,
                            }
                        } else {
                            im2col_block(g, xs, c0..c0 + nc, p0..p0 + np, &mut cols, np, 0);
                            Panel {
                                data: &cols,
                                rows: kc,
                                cols: np,
                                ld: np,
                            }
                        };
                        let weight = Panel {
                            data: &wg[c0 * taps..],
                            rows,
                            cols: kc,
                            ld: k,
                        };
                        gemm16(weight, panel, &mut acc, c0 > 0, par, &mut wide)?;
                    }
                    for (o, row) in dst.chunks_mut(ohw).enumerate() {
                        let b = bias_of(grp * og + o0 + o);
                        let src = &acc[o * np..][..np];
                        for (d, s) in row[p0..p0 + np].iter_mut().zip(src) {
                            *d = T::narrow(s + b);
                        }
                    }
                }
                Ok(())
            })
        }
        Split::Images { imgs } => {
            let (_, cb) = conv_blocks(imgs * ohw, cg, taps, budget);
            run_tasks(dev, threads, tasks, |(t, _, dst), par| {
                let bn = dst.len() / (g.o * ohw);
                let ncols = bn * ohw;
                let mut cols = vec![T::default(); cb * taps * ncols];
                let mut acc = vec![0.0f32; og * ncols];
                let mut wide = Widened::default();
                for grp in 0..g.groups {
                    for c0 in (0..cg).step_by(cb) {
                        let nc = cb.min(cg - c0);
                        let kc = nc * taps;
                        for bi in 0..bn {
                            let xs = &x[((t * imgs + bi) * g.c + grp * cg) * hw..][..cg * hw];
                            im2col_block(g, xs, c0..c0 + nc, 0..ohw, &mut cols, ncols, bi * ohw);
                        }
                        let panel = Panel {
                            data: &cols,
                            rows: kc,
                            cols: ncols,
                            ld: ncols,
                        };
                        let weight = Panel {
                            data: &w[grp * og * k + c0 * taps..],
                            rows: og,
                            cols: kc,
                            ld: k,
                        };
                        gemm16(weight, panel, &mut acc, c0 > 0, par, &mut wide)?;
                    }
                    scatter_planes(g, grp, &acc, ncols, dst, |oc, v| T::narrow(v + bias_of(oc)));
                }
                Ok(())
            })
        }
    }
}

/// `t` itself when its elements are dense, else a dense copy.
fn dense(t: &Tensor) -> Result<Tensor> {
    if t.is_contiguous() {
        Ok(t.clone())
    } else {
        t.copy_untracked()
    }
}

/// The elements of the dense tensor `t` from a reader that locked it.
fn elems<'a, T: Element>(r: &'a Reader<'_>, t: &Tensor) -> Result<&'a [T]> {
    let d = r.data::<T>(t)?;
    d.get(t.offset()..t.offset() + t.numel())
        .ok_or_else(|| Error::internal("conv2d", "a tensor leaves its storage"))
}

/// A convolution kernel: geometry, operands, device, threads, patch budget, output.
type ConvKernel<T> =
    fn(&ConvGeom, ConvData<'_, T>, &CpuDevice, usize, usize, &mut [T]) -> Result<()>;

/// The convolution of `inputs` (input, weight, optional bias; all of dtype `T`) by `kernel`
/// into a new tensor of `meta` (dtype `T`), reading the inputs in place.
fn conv_dense<T: Element>(
    op: &str,
    g: &ConvGeom,
    inputs: &[&Tensor],
    meta: &Meta,
    kernel: ConvKernel<T>,
    budget: usize,
) -> Result<Tensor> {
    let dev = cpu_device(op, inputs[0])?;
    let ts = inputs
        .iter()
        .map(|t| dense(t))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&Tensor> = ts.iter().collect();
    let r = Reader::new(&refs);
    let data = ConvData {
        x: elems::<T>(&r, &ts[0])?,
        w: elems::<T>(&r, &ts[1])?,
        bias: ts.get(2).map(|t| elems::<T>(&r, t)).transpose()?,
    };
    let threads = conv_threads(g, &dev);
    let device = Device::from_cpu(dev.clone());
    Tensor::from_fn_overwrite::<T>(&meta.shape, &device, |out| {
        kernel(g, data, &dev, threads, budget, out)
    })
}

/// The CPU convolution in the inputs' dtype.
fn conv_forward(op: &str, g: &ConvGeom, inputs: &[&Tensor], meta: &Meta) -> Result<Tensor> {
    match meta.dtype {
        DType::F64 => conv_dense::<f64>(op, g, inputs, meta, conv_cpu, COLS_BLOCK),
        DType::F32 => conv_dense::<f32>(op, g, inputs, meta, conv_cpu, COLS_BLOCK),
        DType::BF16 => conv_dense::<bf16>(op, g, inputs, meta, conv_cpu16, COLS_BLOCK_16),
        DType::F16 => conv_dense::<f16>(op, g, inputs, meta, conv_cpu16, COLS_BLOCK_16),
        d => Err(Error::UnsupportedDType {
            op: op.into(),
            given: d.to_string(),
            supported: FLOAT_ONLY.to_string(),
        }),
    }
}

impl OpDef for Conv {
    fn name(&self) -> &'static str {
        if self.spatial == 1 {
            "conv1d"
        } else {
            "conv2d"
        }
    }

    fn attrs(&self) -> String {
        format!("{self:?}|{:?}", crate::ops::linalg::matmul_precision())
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let (_, out) = self.geom(inputs)?;
        Ok(vec![Meta::new(&out, inputs[0].dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let metas: Vec<Meta> = inputs.iter().map(|t| Meta::of(t)).collect();
        let (g, _) = self.geom(&metas)?;
        let t = conv_forward(self.name(), &g, inputs, &outputs[0])?;
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let metas: Vec<Meta> = inputs
            .iter()
            .map(|v| Meta::new(v.dims(), v.dtype()))
            .collect();
        let (g, _) = self.geom(&metas)?;
        let cd = compute_dtype(metas[0].dtype);
        let x = b.convert(&inputs[0], cd);
        let x = b.reshape(&x, &[g.n, g.c, g.h, g.w]);
        let w = b.convert(&inputs[1], cd);
        let w = b.reshape(&w, &[g.o, g.c / g.groups, g.kh, g.kw]);
        let c = ConvHlo {
            strides: g.stride,
            pad: g.pad_i64(),
            lhs_dilation: [1, 1],
            rhs_dilation: g.dil,
            groups: g.groups,
        };
        let mut y = convolution(b, &x, &w, &c, &[g.n, g.o, g.oh, g.ow]);
        if let Some(bias) = inputs.get(2) {
            let bias = b.convert(bias, cd);
            y = add_bias(b, &y, &bias);
        }
        let y = b.convert(&y, outputs[0].dtype);
        Ok(vec![b.reshape(&y, &outputs[0].shape)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let n_in = saved.inputs.len();
        let Some(g) = &grads[0] else {
            return Ok(vec![None; n_in]);
        };
        let metas: Vec<Meta> = saved.inputs.iter().map(Meta::of).collect();
        let (geo, _) = self.geom(&metas)?;
        let (x, w) = (&saved.inputs[0], &saved.inputs[1]);
        // 1-D and unbatched convolutions are 2-D batched ones, as in the forward.
        let x4 = x.reshape([geo.n, geo.c, geo.h, geo.w])?;
        let w4 = w.reshape([geo.o, geo.c / geo.groups, geo.kh, geo.kw])?;
        let g4 = g.reshape([geo.n, geo.o, geo.oh, geo.ow])?;
        let gx = conv_input_grad(&g4, &w4, &geo)?.reshape(x.shape())?;
        let gw = conv_weight_grad(&x4, &g4, &geo)?.reshape(w.shape())?;
        let mut res = vec![Some(gx.contiguous()?), Some(gw.contiguous()?)];
        if n_in == 3 {
            res.push(Some(g4.sum(&[0, 2, 3], false)?));
        }
        Ok(res)
    }
}

/// The gradient of a convolution's input `[N, C, H, W]` from the output's gradient `g4`: the
/// transposed convolution of `g4` with the same weight `w4`. It runs without padding, so its
/// result covers the padded input (grown at the end to cover rows no window reached, whose
/// gradient is zero), and is then cut back to the input.
fn conv_input_grad(g4: &Tensor, w4: &Tensor, geo: &ConvGeom) -> Result<Tensor> {
    let (len, out, k) = ([geo.h, geo.w], [geo.oh, geo.ow], [geo.kh, geo.kw]);
    let mut extra = [0; 2];
    for i in 0..2 {
        let reach = (out[i] - 1) * geo.stride[i] + geo.dil[i] * (k[i] - 1) + 1;
        extra[i] = (geo.pad[i][0] + len[i]).saturating_sub(reach);
    }
    // Built directly: the public constructor limits output padding to what PyTorch accepts,
    // while the kernels and the lowering take any amount.
    let op = ConvTranspose2d {
        stride: geo.stride,
        padding: [0, 0],
        output_padding: extra,
        dilation: geo.dil,
        groups: geo.groups,
    };
    crate::exec::dispatch::run1(&op, &[g4, w4])?
        .narrow(2, geo.pad[0][0] as i64, geo.h)?
        .narrow(3, geo.pad[1][0] as i64, geo.w)
}

/// The gradient of a convolution's weight `[O, C / groups, kh, kw]`: for each tap, the sum
/// over the batch and the output positions of the gradient times the input it multiplied. That
/// is itself a convolution, with the input's channels as the batch, the batch as the channels,
/// the gradient as the kernel, and stride and dilation swapped; its output can reach past the
/// kernel (rows of the padded input no window used), which is cut off.
fn conv_weight_grad(x4: &Tensor, g4: &Tensor, geo: &ConvGeom) -> Result<Tensor> {
    let (gr, n) = (geo.groups, geo.n);
    let (cg, og) = (geo.c / gr, geo.o / gr);
    // Channel `k * n + b` of the rearranged input is image `b`'s channel of group `k`, so
    // group `k` of the convolution pairs it with the gradient of group `k`'s outputs.
    let xin = x4
        .reshape([n, gr, cg, geo.h, geo.w])?
        .permute([2, 1, 0, 3, 4])?
        .reshape([cg, gr * n, geo.h, geo.w])?;
    let ker = g4
        .reshape([n, gr, og, geo.oh, geo.ow])?
        .permute([1, 2, 0, 3, 4])?
        .reshape([geo.o, n, geo.oh, geo.ow])?;
    let op = Conv {
        spatial: 2,
        stride: geo.dil,
        pad: Pad::Sides(geo.pad),
        dilation: geo.stride,
        groups: gr,
    };
    crate::exec::dispatch::run1(&op, &[&xin, &ker])?
        .narrow(2, 0, geo.kh)?
        .narrow(3, 0, geo.kw)?
        .permute([1, 0, 2, 3])
}

// ---- transposed convolution -------------------------------------------------------------------

/// `conv_transpose2d`; inputs: input, weight `[in, out / groups, kh, kw]`, and optionally bias.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvTranspose2d {
    stride: [usize; 2],
    padding: [usize; 2],
    output_padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
}

impl ConvTranspose2d {
    fn new(opts: &ConvTransposeOptions) -> Result<ConvTranspose2d> {
        let name = "conv_transpose2d";
        let s = opts.stride.positive(name, "stride", 2)?;
        let d = opts.dilation.positive(name, "dilation", 2)?;
        let p = opts.padding.resolve(name, "padding", 2)?;
        let op = opts.output_padding.resolve(name, "output_padding", 2)?;
        if opts.groups == 0 {
            return Err(Error::invalid_argument(
                name,
                "expected groups to be positive, got 0",
            ));
        }
        for i in 0..2 {
            if op[i] >= s[i] && op[i] >= d[i] {
                return Err(Error::invalid_argument(
                    name,
                    format!(
                        "output padding must be smaller than either stride or dilation, got output_padding {op:?}, stride {s:?}, dilation {d:?}"
                    ),
                ));
            }
        }
        Ok(ConvTranspose2d {
            stride: [s[0], s[1]],
            padding: [p[0], p[1]],
            output_padding: [op[0], op[1]],
            dilation: [d[0], d[1]],
            groups: opts.groups,
        })
    }

    /// The geometry, with `o` the output channels and `pad` the symmetric padding (as
    /// `[p, p]` pairs).
    fn geom(&self, inputs: &[Meta]) -> Result<(ConvGeom, Vec<usize>)> {
        let name = "conv_transpose2d";
        let (x, w) = conv_operands(name, inputs)?;
        check_float(name, x)?;
        same_dtype(name, "weight", x, w)?;
        if let Some(b) = inputs.get(2) {
            same_dtype(name, "bias", x, b)?;
        }
        let batched = x.rank() == 4;
        if !batched && x.rank() != 3 {
            return Err(Error::shape(
                name,
                format!(
                    "expected a 3-D (unbatched) or 4-D (batched) input, got shape {}",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        if w.rank() != 4 {
            return Err(Error::shape(
                name,
                format!(
                    "expected a 4-D weight [in_channels, out_channels / groups, kh, kw], got shape {}",
                    fmt_shape(&w.shape)
                ),
            ));
        }
        let [n, c, h, wd] = nchw(&x.shape);
        let g = self.groups;
        let (ci, og, kh, kw) = (w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
        if ci % g != 0 {
            return Err(Error::shape(
                name,
                format!(
                    "groups={g} must divide the weight's input channels, got weight of shape {}",
                    fmt_shape(&w.shape)
                ),
            ));
        }
        if ci != c {
            return Err(Error::shape(
                name,
                format!(
                    "weight of shape {} expects an input with {ci} channels, got input of shape {} ({c} channels)",
                    fmt_shape(&w.shape),
                    fmt_shape(&x.shape)
                ),
            ));
        }
        let o = arith(name, "number of output channels", og.checked_mul(g))?;
        if let Some(b) = inputs.get(2)
            && b.shape[..] != [o]
        {
            return Err(Error::shape(
                name,
                format!(
                    "expected a bias of shape [{o}] for weight of shape {} and groups={g}, got {}",
                    fmt_shape(&w.shape),
                    fmt_shape(&b.shape)
                ),
            ));
        }
        let (s, p, op, d) = (
            self.stride,
            self.padding,
            self.output_padding,
            self.dilation,
        );
        // In i128 with checked products: every argument is a usize and may be huge.
        let size = |len: usize, i: usize, k: usize| -> Option<i128> {
            let grown = (len as i128 - 1).checked_mul(s[i] as i128)?;
            let taps = (d[i] as i128).checked_mul(k as i128 - 1)?;
            grown
                .checked_sub(2 * p[i] as i128)?
                .checked_add(taps)?
                .checked_add(op[i] as i128 + 1)
        };
        let (Some(oh), Some(ow)) = (size(h, 0, kh), size(wd, 1, kw)) else {
            return Err(Error::shape(
                name,
                format!(
                    "input of shape {} and weight of shape {} with stride {s:?} and dilation {d:?} give an output size past the address space",
                    fmt_shape(&x.shape),
                    fmt_shape(&w.shape)
                ),
            ));
        };
        if h == 0 || wd == 0 || kh == 0 || kw == 0 || oh < 1 || ow < 1 {
            return Err(Error::shape(
                name,
                format!(
                    "input of shape {} and weight of shape {} give an output size of ({oh} x {ow}), which is too small",
                    fmt_shape(&x.shape),
                    fmt_shape(&w.shape)
                ),
            ));
        }
        let (Ok(oh), Ok(ow)) = (usize::try_from(oh), usize::try_from(ow)) else {
            return Err(Error::shape(
                name,
                format!(
                    "input of shape {} and weight of shape {} give an output size of ({oh} x {ow}), past the address space",
                    fmt_shape(&x.shape),
                    fmt_shape(&w.shape)
                ),
            ));
        };
        let mut out = if batched { vec![n] } else { Vec::new() };
        out.extend([o, oh, ow]);
        let geom = ConvGeom {
            n,
            c,
            h,
            w: wd,
            o,
            kh,
            kw,
            oh,
            ow,
            stride: s,
            pad: [[p[0], p[0]], [p[1], p[1]]],
            dil: d,
            groups: g,
        };
        Ok((geom, out))
    }
}

/// Transposed convolution: per image and group, the weight's transpose times the input gives
/// every tap's contribution, which is then added into place (col2im).
fn conv_t_cpu<F: Fl>(
    g: &ConvGeom,
    x: &[F],
    w: &[F],
    bias: Option<&[F]>,
    dev: &CpuDevice,
    out: &mut [F],
) -> Result<()> {
    let (cg, og) = (g.c / g.groups, g.o / g.groups);
    let (hw, ohw) = (g.h * g.w, g.oh * g.ow);
    let kk = og * g.kh * g.kw;
    let work = [g.c, hw, kk].iter().fold(g.n, |a, &v| a.saturating_mul(v));
    // Each task's columns hold every tap of the input, which for large kernels is far more
    // than the output: ask for them, one per thread, before any task starts.
    let cols_bytes = kk
        .checked_mul(hw)
        .and_then(|v| v.checked_mul(std::mem::size_of::<F>()))
        .and_then(|v| v.checked_mul(dev.num_threads().min(g.n * g.groups).max(1)))
        .ok_or_else(|| {
            Error::shape(
                "conv_transpose2d",
                "the column buffers are more than the address space holds",
            )
        })?;
    check_host_memory(cols_bytes, || "conv_transpose2d column buffers".into())?;
    run_blocks(dev, out, og * ohw, work, |i, dst, par| {
        let (bn, grp) = (i / g.groups, i % g.groups);
        let base = (bn * g.c + grp * cg) * hw;
        let rhs = MatRef::from_row_major_slice(&x[base..base + cg * hw], cg, hw);
        let lhs = MatRef::from_row_major_slice(&w[grp * cg * kk..(grp + 1) * cg * kk], cg, kk)
            .transpose();
        let mut cols = vec![F::default(); kk * hw];
        matmul(
            MatMut::from_row_major_slice_mut(&mut cols, kk, hw),
            Accum::Replace,
            lhs,
            rhs,
            F::of(1.0),
            par,
        );
        dst.fill(F::default());
        for (r, col) in cols.chunks(hw).enumerate() {
            let kj = r % g.kw;
            let ki = (r / g.kw) % g.kh;
            let oc = r / (g.kw * g.kh);
            let plane = &mut dst[oc * ohw..(oc + 1) * ohw];
            for iy in 0..g.h {
                let oy = (iy * g.stride[0] + ki * g.dil[0]) as isize - g.pad[0][0] as isize;
                if oy < 0 || oy >= g.oh as isize {
                    continue;
                }
                let orow = &mut plane[oy as usize * g.ow..(oy as usize + 1) * g.ow];
                for (ix, &v) in col[iy * g.w..(iy + 1) * g.w].iter().enumerate() {
                    let ox = (ix * g.stride[1] + kj * g.dil[1]) as isize - g.pad[1][0] as isize;
                    if ox >= 0 && (ox as usize) < g.ow {
                        orow[ox as usize] += v;
                    }
                }
            }
        }
        if let Some(b) = bias {
            for (oc, row) in dst.chunks_mut(ohw).enumerate() {
                let v = b[grp * og + oc];
                row.iter_mut().for_each(|e| *e += v);
            }
        }
    })
}

impl OpDef for ConvTranspose2d {
    fn name(&self) -> &'static str {
        "conv_transpose2d"
    }

    fn attrs(&self) -> String {
        format!("{self:?}|{:?}", crate::ops::linalg::matmul_precision())
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let (_, out) = self.geom(inputs)?;
        Ok(vec![Meta::new(&out, inputs[0].dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let metas: Vec<Meta> = inputs.iter().map(|t| Meta::of(t)).collect();
        let (g, _) = self.geom(&metas)?;
        let t = match compute_dtype(metas[0].dtype) {
            DType::F64 => run_conv_t::<f64>(self.name(), &g, inputs, &outputs[0])?,
            _ => run_conv_t::<f32>(self.name(), &g, inputs, &outputs[0])?,
        };
        Ok(vec![t])
    }

    /// A convolution of the input dilated by the stride with the kernel flipped and its
    /// in/out channels swapped within each group.
    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let metas: Vec<Meta> = inputs
            .iter()
            .map(|v| Meta::new(v.dims(), v.dtype()))
            .collect();
        let (g, _) = self.geom(&metas)?;
        let cd = compute_dtype(metas[0].dtype);
        let (cg, og, gr) = (g.c / g.groups, g.o / g.groups, g.groups);
        let x = b.convert(&inputs[0], cd);
        let x = b.reshape(&x, &[g.n, g.c, g.h, g.w]);
        let w = b.convert(&inputs[1], cd);
        let w = b.reshape(&w, &[gr, cg, og, g.kh, g.kw]);
        let w = b.transpose(&w, &[0, 2, 1, 3, 4]);
        let w = b.reshape(&w, &[g.o, cg, g.kh, g.kw]);
        let attrs = format!("dimensions = {}", i64_array(&[2, 3]));
        let w = b.op("stablehlo.reverse", &[&w], &attrs, w.ty.clone());
        // Padding that would be negative becomes zero here and is sliced off afterwards.
        let k = [g.kh, g.kw];
        let mut pad = [[0i64; 2]; 2];
        let mut cut = [[0i64; 2]; 2];
        let mut full = [0usize; 2];
        let len = [g.h, g.w];
        for i in 0..2 {
            let edge = (g.dil[i] * (k[i] - 1)) as i64 - self.padding[i] as i64;
            let want = [edge, edge + self.output_padding[i] as i64];
            for j in 0..2 {
                pad[i][j] = want[j].max(0);
                cut[i][j] = pad[i][j] - want[j];
            }
            let dilated = ((len[i] - 1) * g.stride[i] + 1) as i64;
            let span = (g.dil[i] * (k[i] - 1) + 1) as i64;
            full[i] = (dilated + pad[i][0] + pad[i][1] - span + 1) as usize;
        }
        let c = ConvHlo {
            strides: [1, 1],
            pad,
            lhs_dilation: g.stride,
            rhs_dilation: g.dil,
            groups: gr,
        };
        let mut y = convolution(b, &x, &w, &c, &[g.n, g.o, full[0], full[1]]);
        if cut != [[0, 0], [0, 0]] {
            y = b.slice(
                &y,
                &[0, 0, cut[0][0], cut[1][0]],
                &[
                    g.n as i64,
                    g.o as i64,
                    full[0] as i64 - cut[0][1],
                    full[1] as i64 - cut[1][1],
                ],
                &[1, 1, 1, 1],
            );
        }
        if let Some(bias) = inputs.get(2) {
            let bias = b.convert(bias, cd);
            y = add_bias(b, &y, &bias);
        }
        let y = b.convert(&y, outputs[0].dtype);
        Ok(vec![b.reshape(&y, &outputs[0].shape)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let n_in = saved.inputs.len();
        let Some(g) = &grads[0] else {
            return Ok(vec![None; n_in]);
        };
        let metas: Vec<Meta> = saved.inputs.iter().map(Meta::of).collect();
        let (geo, _) = self.geom(&metas)?;
        let (x, w) = (&saved.inputs[0], &saved.inputs[1]);
        let (gr, n) = (geo.groups, geo.n);
        let (cg, og) = (geo.c / gr, geo.o / gr);
        let x4 = x.reshape([n, geo.c, geo.h, geo.w])?;
        let g4 = g.reshape([n, geo.o, geo.oh, geo.ow])?;
        // The input's gradient is the convolution of `g` with the same weight (a convolution
        // is the adjoint of the transposed one). Output padding can leave it a little larger
        // than the input; the extra rows belong to no input element.
        let conv = Conv {
            spatial: 2,
            stride: self.stride,
            pad: Pad::Sides(geo.pad),
            dilation: self.dilation,
            groups: gr,
        };
        let gx = crate::exec::dispatch::run1(&conv, &[&g4, w])?
            .narrow(2, 0, geo.h)?
            .narrow(3, 0, geo.w)?
            .reshape(x.shape())?;
        // The weight's gradient correlates `g` with the input over the batch: a convolution
        // whose "batch" is the output channels of a group and whose kernel is the input, with
        // stride and dilation swapped; group `k`'s channels are the batch of group `k`.
        let gin = g4
            .reshape([n, gr, og, geo.oh, geo.ow])?
            .permute([2, 1, 0, 3, 4])?
            .reshape([og, gr * n, geo.oh, geo.ow])?;
        let ker = x4
            .reshape([n, gr, cg, geo.h, geo.w])?
            .permute([1, 2, 0, 3, 4])?
            .reshape([geo.c, n, geo.h, geo.w])?;
        let corr = Conv {
            spatial: 2,
            stride: self.dilation,
            pad: Pad::Sides(geo.pad),
            dilation: self.stride,
            groups: gr,
        };
        let gw = crate::exec::dispatch::run1(&corr, &[&gin, &ker])?
            .narrow(2, 0, geo.kh)?
            .narrow(3, 0, geo.kw)?
            .permute([1, 0, 2, 3])?;
        let mut res = vec![Some(gx.contiguous()?), Some(gw.contiguous()?)];
        if n_in == 3 {
            res.push(Some(g4.sum(&[0, 2, 3], false)?));
        }
        Ok(res)
    }
}

// ---- pooling ----------------------------------------------------------------------------------

/// Window geometry of a 2-D pooling op over `[P, H, W]` planes.
#[derive(Clone, Copy, Debug)]
struct PoolGeom {
    planes: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
}

impl PoolGeom {
    /// The reduce_window padding: `p` before, and after whatever the last window needs.
    fn window(&self) -> Window {
        let len = [self.h, self.w];
        let out = [self.oh, self.ow];
        let mut pad = [[0i64; 2]; 2];
        for i in 0..2 {
            let reach = ((out[i] - 1) * self.s[i] + self.d[i] * (self.k[i] - 1) + 1) as i64;
            pad[i] = [
                self.p[i] as i64,
                (reach - len[i] as i64 - self.p[i] as i64).max(0),
            ];
        }
        Window {
            dims: self.k,
            strides: self.s,
            dilations: self.d,
            pad,
        }
    }
}

/// Checks a pooling input and options and returns the geometry and the output shape.
fn pool_geom(
    op: &str,
    x: &Meta,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    ceil: bool,
) -> Result<(PoolGeom, Vec<usize>)> {
    check_float(op, x)?;
    let ok_rank = x.rank() == 4 || x.rank() == 3;
    let dims = &x.shape[x.rank().saturating_sub(3)..];
    if !ok_rank || dims.contains(&0) {
        return Err(Error::shape(
            op,
            format!(
                "expected a 3-D [C, H, W] or 4-D [N, C, H, W] input with non-zero C, H and W, got shape {}",
                fmt_shape(&x.shape)
            ),
        ));
    }
    for i in 0..2 {
        // Kernels stay well inside isize, so the kernels' window arithmetic cannot overflow.
        let eff = arith(
            op,
            "dilated kernel",
            dilated(k[i], d[i]).filter(|&e| e <= isize::MAX as usize / 4),
        )?;
        if p[i] > eff / 2 {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "padding must be at most half of the effective kernel size, got padding {p:?}, kernel_size {k:?}, dilation {d:?}"
                ),
            ));
        }
    }
    let [n, c, h, w] = nchw(&x.shape);
    let oh = pool_out(h, k[0], s[0], p[0], d[0], ceil);
    let ow = pool_out(w, k[1], s[1], p[1], d[1], ceil);
    let (Some(oh), Some(ow)) = (oh, ow) else {
        return Err(Error::shape(
            op,
            format!(
                "input of shape {} with kernel_size {k:?}, stride {s:?}, padding {p:?}, dilation {d:?} gives an empty output",
                fmt_shape(&x.shape)
            ),
        ));
    };
    let mut out = x.shape[..x.rank() - 2].to_vec();
    out.extend([oh, ow]);
    let g = PoolGeom {
        planes: n * c,
        h,
        w,
        oh,
        ow,
        k,
        s,
        p,
        d,
    };
    Ok((g, out))
}

fn pair(v: Vec<usize>) -> [usize; 2] {
    [v[0], v[1]]
}

/// `max_pool2d`, optionally with PyTorch's indices (flat within each `H x W` plane) as a
/// second output.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MaxPool2d {
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    ceil_mode: bool,
    indices: bool,
}

impl MaxPool2d {
    fn new(o: &MaxPoolOptions, indices: bool) -> Result<MaxPool2d> {
        let name = "max_pool2d";
        let k = o.kernel_size.positive(name, "kernel_size", 2)?;
        let s = match &o.stride {
            Some(s) => s.positive(name, "stride", 2)?,
            None => k.clone(),
        };
        Ok(MaxPool2d {
            k: pair(k),
            s: pair(s),
            p: pair(o.padding.resolve(name, "padding", 2)?),
            d: pair(o.dilation.positive(name, "dilation", 2)?),
            ceil_mode: o.ceil_mode,
            indices,
        })
    }

    fn geom(&self, x: &Meta) -> Result<(PoolGeom, Vec<usize>)> {
        pool_geom(
            self.name(),
            x,
            self.k,
            self.s,
            self.p,
            self.d,
            self.ceil_mode,
        )
    }
}

/// First window tap at or after `start` (stepping by `d`) and the end of the window, clipped
/// to `[0, len)`.
fn taps(start: isize, k: usize, d: usize, len: usize) -> (usize, usize) {
    let end = (start + ((k - 1) * d + 1) as isize).min(len as isize);
    // The first tap at or after 0, in one step: padding may be billions of taps wide.
    let s = if start < 0 {
        start + (start.unsigned_abs().div_ceil(d) * d) as isize
    } else {
        start
    };
    (s as usize, end.max(0) as usize)
}

fn max_pool_cpu<F: Fl>(g: &PoolGeom, x: &[F], dev: &CpuDevice, out: &mut [(F, i64)]) -> Result<()> {
    // Kernels may be far larger than the input (padding reaches half a kernel): saturate.
    let work = out.len().saturating_mul(g.k[0]).saturating_mul(g.k[1]);
    each_plane(dev, out, g.oh * g.ow, work, |pl, o| {
        let src = &x[pl * g.h * g.w..(pl + 1) * g.h * g.w];
        for oy in 0..g.oh {
            let (y0, y1) = taps(
                (oy * g.s[0]) as isize - g.p[0] as isize,
                g.k[0],
                g.d[0],
                g.h,
            );
            for ox in 0..g.ow {
                let (x0, x1) = taps(
                    (ox * g.s[1]) as isize - g.p[1] as isize,
                    g.k[1],
                    g.d[1],
                    g.w,
                );
                // As PyTorch: the first maximum wins ties, and any NaN (the last one) wins.
                let mut best = (F::of(f64::NEG_INFINITY), (y0 * g.w + x0) as i64);
                for iy in (y0..y1).step_by(g.d[0]) {
                    for ix in (x0..x1).step_by(g.d[1]) {
                        let v = src[iy * g.w + ix];
                        if v > best.0 || v.fl_nan() {
                            best = (v, (iy * g.w + ix) as i64);
                        }
                    }
                }
                o[oy * g.ow + ox] = best;
            }
        }
    })
}

fn run_max_pool<F: Fl>(
    g: &PoolGeom,
    x: &Tensor,
    outputs: &[Meta],
    indices: bool,
) -> Result<Vec<Tensor>> {
    let data = read::<F>(x)?;
    let dev = cpu_device("max_pool2d", x)?;
    let device = Device::from_cpu(dev.clone());
    let mut both = try_host_vec(g.planes * g.oh * g.ow, (F::default(), 0i64), || {
        format!("max_pool2d scratch for {}", fmt_shape(&outputs[0].shape))
    })?;
    max_pool_cpu(g, &data, &dev, &mut both)?;
    let vals = Tensor::from_fn_typed::<F>(&outputs[0].shape, &device, |o| {
        o.iter_mut().zip(&both).for_each(|(o, b)| *o = b.0);
        Ok(())
    })?
    .to_dtype(outputs[0].dtype)?;
    let mut res = vec![vals];
    if indices {
        res.push(Tensor::from_fn_typed::<i64>(
            &outputs[1].shape,
            &device,
            |o| {
                o.iter_mut().zip(&both).for_each(|(o, b)| *o = b.1);
                Ok(())
            },
        )?);
    }
    Ok(res)
}

/// Reshapes a 3-D or 4-D input to 4-D in compute precision.
fn to_nchw(b: &mut FnBuilder, x: &Value) -> Value {
    let cd = compute_dtype(x.dtype());
    let v = b.convert(x, cd);
    b.reshape(&v, &nchw(x.dims()))
}

impl OpDef for MaxPool2d {
    fn name(&self) -> &'static str {
        "max_pool2d"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = single(self.name(), inputs)?;
        let (_, out) = self.geom(x)?;
        let mut metas = vec![Meta::new(&out, x.dtype)];
        if self.indices {
            metas.push(Meta::new(&out, DType::I64));
        }
        Ok(metas)
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let (g, _) = self.geom(&Meta::of(inputs[0]))?;
        match compute_dtype(inputs[0].dtype()) {
            DType::F64 => run_max_pool::<f64>(&g, inputs[0], outputs, self.indices),
            _ => run_max_pool::<f32>(&g, inputs[0], outputs, self.indices),
        }
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let (g, _) = self.geom(&Meta::new(inputs[0].dims(), inputs[0].dtype()))?;
        let x = to_nchw(b, &inputs[0]);
        let cd = x.dtype();
        let out4 = [x.dims()[0], x.dims()[1], g.oh, g.ow];
        let win = g.window();
        let ninf = b.scalar(cd, f64::NEG_INFINITY);
        let res = if !self.indices {
            reduce_window(b, &[&x], &[&ninf], &win, &out4, |b, a| {
                // XLA's CPU maximum may drop NaNs; PyTorch's max pooling keeps them.
                let an = b.compare(Cmp::Ne, &a[0], &a[0]);
                let gt = b.compare(Cmp::Gt, &a[0], &a[1]);
                let pick = b.ew("stablehlo.or", &[&an, &gt]);
                vec![b.select(&pick, &a[0], &a[1])]
            })
        } else {
            let d4 = x.dims().to_vec();
            let row = b.iota(&d4, 2, DType::I64);
            let col = b.iota(&d4, 3, DType::I64);
            let wv = b.splat(TensorType::new(&d4, DType::I64), g.w as i64);
            let rw = b.ew("stablehlo.multiply", &[&row, &wv]);
            let idx = b.ew("stablehlo.add", &[&rw, &col]);
            let never = b.scalar(DType::I64, i64::MAX);
            reduce_window(b, &[&x, &idx], &[&ninf, &never], &win, &out4, |b, a| {
                // (value, index) pairs: NaN beats numbers and the later NaN wins; otherwise
                // the larger value, and the smaller index among equals.
                let (av, ai, bv, bi) = (&a[0], &a[1], &a[2], &a[3]);
                let an = b.compare(Cmp::Ne, av, av);
                let bn = b.compare(Cmp::Ne, bv, bv);
                let t = b.splat(TensorType::scalar(DType::Bool), true);
                let not_bn = b.ew("stablehlo.xor", &[&bn, &t]);
                let not_an = b.ew("stablehlo.xor", &[&an, &t]);
                let later = b.compare(Cmp::Gt, ai, bi);
                let earlier = b.compare(Cmp::Lt, ai, bi);
                let nan_pick = b.ew("stablehlo.or", &[&not_bn, &later]);
                let nan_pick = b.ew("stablehlo.and", &[&an, &nan_pick]);
                let gt = b.compare(Cmp::Gt, av, bv);
                let eq = b.compare(Cmp::Eq, av, bv);
                let tie = b.ew("stablehlo.and", &[&eq, &earlier]);
                let num_pick = b.ew("stablehlo.or", &[&gt, &tie]);
                let neither = b.ew("stablehlo.and", &[&not_an, &not_bn]);
                let num_pick = b.ew("stablehlo.and", &[&neither, &num_pick]);
                let pick = b.ew("stablehlo.or", &[&nan_pick, &num_pick]);
                vec![b.select(&pick, av, bv), b.select(&pick, ai, bi)]
            })
        };
        let v = b.convert(&res[0], outputs[0].dtype);
        let mut outs = vec![b.reshape(&v, &outputs[0].shape)];
        if self.indices {
            // A window whose taps all fall in the padding keeps the initial index; PyTorch
            // reports its first tap inside the input's bounds instead.
            let first = |o: usize, i: usize, len: usize| {
                taps((o * g.s[i]) as isize - g.p[i] as isize, g.k[i], g.d[i], len).0 as i64
            };
            let fy: Vec<i64> = (0..g.oh).map(|o| first(o, 0, g.h) * g.w as i64).collect();
            let fx: Vec<i64> = (0..g.ow).map(|o| first(o, 1, g.w)).collect();
            let fy = b.constant_i64(&[g.oh], &fy);
            let fx = b.constant_i64(&[g.ow], &fx);
            let fy = b.broadcast_in_dim(&fy, &[2], &out4);
            let fx = b.broadcast_in_dim(&fx, &[3], &out4);
            let fallback = b.ew("stablehlo.add", &[&fy, &fx]);
            let never = b.splat(TensorType::new(&out4, DType::I64), i64::MAX);
            let empty = b.compare(Cmp::Eq, &res[1], &never);
            let idx = b.select(&empty, &fallback, &res[1]);
            outs.push(b.reshape(&idx, &outputs[1].shape));
        }
        Ok(outs)
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// Each window's gradient goes to the element PyTorch reports as its maximum (the first
    /// of equal maxima, or a NaN), added up where windows overlap.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        // The indices (a second output) have no gradient; only the values' counts.
        let Some(g) = &grads[0] else {
            return Ok(vec![None]);
        };
        let x = &saved.inputs[0];
        let (geo, _) = self.geom(&Meta::of(x))?;
        let idx = if self.indices {
            saved.outputs[1].clone()
        } else {
            // The forward kept no indices; the same pooling with indices finds them again.
            let op = MaxPool2d {
                indices: true,
                ..self.clone()
            };
            let mut out = crate::exec::dispatch::run(&op, &[x])?;
            if out.len() != 2 {
                return Err(Error::internal("max_pool2d", "expected values and indices"));
            }
            out.remove(1)
        };
        let per = geo.oh * geo.ow;
        let g2 = g.reshape([geo.planes, per])?;
        let i2 = idx.reshape([geo.planes, per])?;
        let z = Tensor::zeros([geo.planes, geo.h * geo.w], g.dtype(), g.device())?;
        Ok(vec![Some(z.scatter_add(1, &i2, &g2)?.reshape(x.shape())?)])
    }
}

/// `avg_pool2d`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AvgPool2d {
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: Option<usize>,
}

impl AvgPool2d {
    fn new(o: &AvgPoolOptions) -> Result<AvgPool2d> {
        let name = "avg_pool2d";
        let k = o.kernel_size.positive(name, "kernel_size", 2)?;
        let s = match &o.stride {
            Some(s) => s.positive(name, "stride", 2)?,
            None => k.clone(),
        };
        if o.divisor_override == Some(0) {
            return Err(Error::invalid_argument(
                name,
                "expected divisor_override to be non-zero, got 0",
            ));
        }
        Ok(AvgPool2d {
            k: pair(k),
            s: pair(s),
            p: pair(o.padding.resolve(name, "padding", 2)?),
            ceil_mode: o.ceil_mode,
            count_include_pad: o.count_include_pad,
            divisor_override: o.divisor_override,
        })
    }

    fn geom(&self, x: &Meta) -> Result<(PoolGeom, Vec<usize>)> {
        pool_geom(
            self.name(),
            x,
            self.k,
            self.s,
            self.p,
            [1, 1],
            self.ceil_mode,
        )
    }

    /// PyTorch's divisor for each output index along dim `i`: the window clipped to the
    /// padded input, or to the input itself without `count_include_pad`. (The 2-D divisor is
    /// the product of the two.)
    fn divisors(&self, g: &PoolGeom, i: usize) -> Vec<usize> {
        let (len, out) = if i == 0 { (g.h, g.oh) } else { (g.w, g.ow) };
        (0..out)
            .map(|o| {
                let start = (o * g.s[i]) as isize - g.p[i] as isize;
                let end = (start + g.k[i] as isize).min((len + g.p[i]) as isize);
                if self.count_include_pad {
                    (end - start) as usize
                } else {
                    (end.min(len as isize) - start.max(0)).max(0) as usize
                }
            })
            .collect()
    }
}

fn avg_pool_cpu<F: Fl>(
    op: &AvgPool2d,
    g: &PoolGeom,
    x: &[F],
    dev: &CpuDevice,
    out: &mut [F],
) -> Result<()> {
    let (dh, dw) = (op.divisors(g, 0), op.divisors(g, 1));
    // Kernels may be far larger than the input (padding reaches half a kernel): saturate.
    let work = out.len().saturating_mul(g.k[0]).saturating_mul(g.k[1]);
    each_plane(dev, out, g.oh * g.ow, work, |pl, o| {
        let src = &x[pl * g.h * g.w..(pl + 1) * g.h * g.w];
        for oy in 0..g.oh {
            let (y0, y1) = taps((oy * g.s[0]) as isize - g.p[0] as isize, g.k[0], 1, g.h);
            for ox in 0..g.ow {
                let (x0, x1) = taps((ox * g.s[1]) as isize - g.p[1] as isize, g.k[1], 1, g.w);
                let mut sum = F::default();
                for iy in y0..y1 {
                    for &v in &src[iy * g.w + x0..iy * g.w + x1.max(x0)] {
                        sum += v;
                    }
                }
                let div = op.divisor_override.unwrap_or(dh[oy] * dw[ox]).max(1);
                o[oy * g.ow + ox] = sum / F::of_usize(div);
            }
        }
    })
}

impl OpDef for AvgPool2d {
    fn name(&self) -> &'static str {
        "avg_pool2d"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = single(self.name(), inputs)?;
        let (_, out) = self.geom(x)?;
        Ok(vec![Meta::new(&out, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let (g, _) = self.geom(&Meta::of(inputs[0]))?;
        let x = inputs[0];
        let t = match compute_dtype(x.dtype()) {
            DType::F64 => {
                let d = read::<f64>(x)?;
                produce::<f64>(self.name(), x, &outputs[0], |dev, o| {
                    avg_pool_cpu(self, &g, &d, dev, o)
                })?
            }
            _ => {
                let d = read::<f32>(x)?;
                produce::<f32>(self.name(), x, &outputs[0], |dev, o| {
                    avg_pool_cpu(self, &g, &d, dev, o)
                })?
            }
        };
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let (g, _) = self.geom(&Meta::new(inputs[0].dims(), inputs[0].dtype()))?;
        let x = to_nchw(b, &inputs[0]);
        let cd = x.dtype();
        let out4 = [x.dims()[0], x.dims()[1], g.oh, g.ow];
        let zero = b.scalar(cd, 0.0);
        let sum = reduce_window(b, &[&x], &[&zero], &g.window(), &out4, |b, a| {
            vec![b.ew("stablehlo.add", &[&a[0], &a[1]])]
        })
        .remove(0);
        let div = match self.divisor_override {
            Some(d) => b.splat(TensorType::new(&out4, cd), d as f64),
            None => {
                let f = |v: Vec<usize>| -> Vec<f64> {
                    v.into_iter().map(|d| d.max(1) as f64).collect()
                };
                let dh = const_float(b, &f(self.divisors(&g, 0)), cd);
                let dw = const_float(b, &f(self.divisors(&g, 1)), cd);
                let dh = b.broadcast_in_dim(&dh, &[2], &out4);
                let dw = b.broadcast_in_dim(&dw, &[3], &out4);
                b.ew("stablehlo.multiply", &[&dh, &dw])
            }
        };
        let y = b.ew("stablehlo.divide", &[&sum, &div]);
        let y = b.convert(&y, outputs[0].dtype);
        Ok(vec![b.reshape(&y, &outputs[0].shape)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// Each window's gradient, divided by the window's divisor, is shared by the input
    /// elements the window covers: a transposed convolution with a kernel of ones over the
    /// padded input, cut back to the input.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None]);
        };
        let x = &saved.inputs[0];
        let (geo, _) = self.geom(&Meta::of(x))?;
        // The divisors depend only on the geometry (as in the forward's lowering).
        let div: Vec<f64> = match self.divisor_override {
            Some(d) => vec![d as f64; geo.oh * geo.ow],
            None => {
                let (dh, dw) = (self.divisors(&geo, 0), self.divisors(&geo, 1));
                dh.iter()
                    .flat_map(|&a| dw.iter().map(move |&b| (a * b).max(1) as f64))
                    .collect()
            }
        };
        let div = Tensor::from_vec(div, [geo.oh, geo.ow], &Device::cpu())?
            .to_dtype(g.dtype())?
            .to_device(g.device())?;
        let share = TensorOps::div(g, &div)?.reshape([geo.planes, 1, geo.oh, geo.ow])?;
        let ones = Tensor::ones([1, 1, geo.k[0], geo.k[1]], g.dtype(), g.device())?;
        let (len, out) = ([geo.h, geo.w], [geo.oh, geo.ow]);
        let mut extra = [0; 2];
        for i in 0..2 {
            let reach = (out[i] - 1) * geo.s[i] + geo.k[i];
            extra[i] = (geo.p[i] + len[i]).saturating_sub(reach);
        }
        let op = ConvTranspose2d {
            stride: geo.s,
            padding: [0, 0],
            output_padding: extra,
            dilation: [1, 1],
            groups: 1,
        };
        let gx = crate::exec::dispatch::run1(&op, &[&share, &ones])?
            .narrow(2, geo.p[0] as i64, geo.h)?
            .narrow(3, geo.p[1] as i64, geo.w)?
            .reshape(x.shape())?;
        Ok(vec![Some(gx.contiguous()?)])
    }
}

/// `adaptive_avg_pool2d`: output index `i` of `out` averages input `[floor(i * in / out),
/// ceil((i + 1) * in / out))`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AdaptiveAvgPool2d {
    size: [usize; 2],
}

/// The windows of adaptive pooling along one dim: `(start, end)` per output index.
fn adaptive_windows(len: usize, out: usize) -> Vec<(usize, usize)> {
    // In u128: `i * len` may pass usize when both sizes are huge.
    let (l, o) = (len as u128, out as u128);
    (0..out as u128)
        .map(|i| (((i * l) / o) as usize, ((i + 1) * l).div_ceil(o) as usize))
        .collect()
}

impl AdaptiveAvgPool2d {
    fn check(&self, x: &Meta) -> Result<Vec<usize>> {
        let op = self.name();
        check_float(op, x)?;
        let dims = &x.shape[x.rank().saturating_sub(3)..];
        if (x.rank() != 3 && x.rank() != 4) || dims[1] == 0 || dims[2] == 0 {
            return Err(Error::shape(
                op,
                format!(
                    "expected a 3-D [C, H, W] or 4-D [N, C, H, W] input with non-zero H and W, got shape {}",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        let mut out = x.shape[..x.rank() - 2].to_vec();
        out.extend(self.size);
        Ok(out)
    }
}

fn adaptive_cpu<F: Fl>(g: &PoolGeom, x: &[F], dev: &CpuDevice, out: &mut [F]) -> Result<()> {
    let (wh, ww) = (adaptive_windows(g.h, g.oh), adaptive_windows(g.w, g.ow));
    let work = g.planes * g.h * g.w;
    each_plane(dev, out, g.oh * g.ow, work, |pl, o| {
        let src = &x[pl * g.h * g.w..(pl + 1) * g.h * g.w];
        for (oy, &(y0, y1)) in wh.iter().enumerate() {
            for (ox, &(x0, x1)) in ww.iter().enumerate() {
                let mut sum = F::default();
                for iy in y0..y1 {
                    for &v in &src[iy * g.w + x0..iy * g.w + x1] {
                        sum += v;
                    }
                }
                // PyTorch divides by the height and then by the width.
                o[oy * g.ow + ox] = sum / F::of_usize(y1 - y0) / F::of_usize(x1 - x0);
            }
        }
    })
}

/// Sums `x` over the adaptive windows of `axis` (2 or 3): one gather of every window's taps
/// (padded to the longest window by repeating the last row, then masked to zero), and a sum.
fn adaptive_sum(b: &mut FnBuilder, x: &Value, axis: usize, out: usize) -> Value {
    let len = x.dims()[axis];
    let wins = adaptive_windows(len, out);
    let longest = wins.iter().map(|w| w.1 - w.0).max().unwrap_or(1);
    let mut idx = Vec::with_capacity(out * longest);
    let mut mask = Vec::with_capacity(out * longest);
    for &(s, e) in &wins {
        for t in 0..longest {
            idx.push((s + t).min(len - 1) as i64);
            mask.push((s + t < e) as i64);
        }
    }
    let g = gather_axis(b, x, axis, &idx, &[out, longest]);
    let m = b.constant_i64(&[out, longest], &mask);
    let zero_i = b.splat(TensorType::new(&[out, longest], DType::I64), 0);
    let m = b.compare(Cmp::Ne, &m, &zero_i);
    let m = b.broadcast_in_dim(&m, &[axis as i64, axis as i64 + 1], g.dims());
    let zeros = b.splat(g.ty.clone(), 0.0);
    let g = b.select(&m, &g, &zeros);
    let zero = b.scalar(x.dtype(), 0.0);
    b.reduce(&[&g], &[&zero], &[axis + 1], |b, a| {
        vec![b.ew("stablehlo.add", &[&a[0], &a[1]])]
    })
    .remove(0)
}

impl OpDef for AdaptiveAvgPool2d {
    fn name(&self) -> &'static str {
        "adaptive_avg_pool2d"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = single(self.name(), inputs)?;
        let out = self.check(x)?;
        Ok(vec![Meta::new(&out, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0];
        let [n, c, h, w] = nchw(x.shape());
        let g = PoolGeom {
            planes: n * c,
            h,
            w,
            oh: self.size[0],
            ow: self.size[1],
            k: [1, 1],
            s: [1, 1],
            p: [0, 0],
            d: [1, 1],
        };
        let t = match compute_dtype(x.dtype()) {
            DType::F64 => {
                let d = read::<f64>(x)?;
                produce::<f64>(self.name(), x, &outputs[0], |dev, o| {
                    adaptive_cpu(&g, &d, dev, o)
                })?
            }
            _ => {
                let d = read::<f32>(x)?;
                produce::<f32>(self.name(), x, &outputs[0], |dev, o| {
                    adaptive_cpu(&g, &d, dev, o)
                })?
            }
        };
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let x = to_nchw(b, &inputs[0]);
        let (h, w) = (x.dims()[2], x.dims()[3]);
        let cd = x.dtype();
        if outputs[0].numel() == 0 {
            let y = b.splat(TensorType::new(&outputs[0].shape, outputs[0].dtype), 0.0);
            return Ok(vec![y]);
        }
        let sh = adaptive_sum(b, &x, 2, self.size[0]);
        let s = adaptive_sum(b, &sh, 3, self.size[1]);
        let lens = |len: usize, out: usize| -> Vec<f64> {
            adaptive_windows(len, out)
                .iter()
                .map(|w| (w.1 - w.0) as f64)
                .collect()
        };
        let dh = const_float(b, &lens(h, self.size[0]), cd);
        let dw = const_float(b, &lens(w, self.size[1]), cd);
        let dh = b.broadcast_in_dim(&dh, &[2], s.dims());
        let dw = b.broadcast_in_dim(&dw, &[3], s.dims());
        let y = b.ew("stablehlo.divide", &[&s, &dh]);
        let y = b.ew("stablehlo.divide", &[&y, &dw]);
        let y = b.convert(&y, outputs[0].dtype);
        Ok(vec![b.reshape(&y, &outputs[0].shape)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The pooling is `A_h · x · A_wᵀ` for averaging matrices `A` (one row per window, `1 /
    /// length` over its span), so the gradient is `A_hᵀ · g · A_w`: each input row (then
    /// column) gathers the gradients of the windows covering it, divided by their lengths.
    /// Gathered and added at indices rather than multiplied by `A`, so a NaN or infinite
    /// gradient reaches only its window's elements (as in PyTorch), not every element through
    /// the zeros of `A`.
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None]);
        };
        let x = &saved.inputs[0];
        let [_, _, h, w] = nchw(x.shape());
        let rank = g.rank();
        let dev = g.device();
        let spread = |t: &Tensor, dim: usize, len: usize, out: usize| -> Result<Tensor> {
            let (mut src, mut dst, mut share) = (Vec::new(), Vec::new(), Vec::new());
            for (o, (s, e)) in adaptive_windows(len, out).into_iter().enumerate() {
                for i in s..e {
                    src.push(o as i64);
                    dst.push(i as i64);
                    share.push(1.0 / (e - s) as f64);
                }
            }
            let pairs = src.len();
            let mut wshape = vec![1; rank];
            wshape[dim] = pairs;
            let share = Tensor::from_vec(share, &wshape[..], &Device::cpu())?
                .to_dtype(g.dtype())?
                .to_device(dev)?;
            let picked = t.index_select(dim, &Tensor::from_vec(src, [pairs], dev)?)?;
            let picked = TensorOps::mul(&picked, &share)?;
            let mut shape = t.shape().to_vec();
            shape[dim] = len;
            Tensor::zeros(&shape[..], g.dtype(), dev)?.index_add(
                dim,
                &Tensor::from_vec(dst, [pairs], dev)?,
                &picked,
                1.0,
            )
        };
        let t = spread(g, rank - 2, h, self.size[0])?;
        Ok(vec![Some(spread(&t, rank - 1, w, self.size[1])?)])
    }
}

// ---- interpolation ----------------------------------------------------------------------------

/// `interpolate` of a 4-D input (PyTorch's `upsample_nearest2d` and `upsample_bilinear2d`).
#[derive(Clone, Debug, PartialEq)]
pub struct Interpolate {
    size: [usize; 2],
    /// Scale factors given by the caller; PyTorch maps coordinates with them when present.
    scales: [Option<f64>; 2],
    mode: InterpolateMode,
}

/// PyTorch's legacy nearest source index (`nearest_idx`), with its f32 arithmetic.
fn nearest_sources(len: usize, out: usize, scale: Option<f64>) -> Vec<usize> {
    (0..out)
        .map(|i| {
            if out == len {
                i
            } else if out == 2 * len {
                i >> 1
            } else {
                let s = match scale {
                    Some(v) if v > 0.0 => (1.0 / v) as f32,
                    _ => len as f32 / out as f32,
                };
                ((i as f32 * s).floor() as usize).min(len - 1)
            }
        })
        .collect()
}

/// PyTorch's linear interpolation taps along one dim, in the op's compute precision:
/// `(i0, i1, weight0, weight1)` per output index.
fn linear_taps<F: Fl>(
    len: usize,
    out: usize,
    align: bool,
    scale: Option<f64>,
) -> Vec<(usize, usize, F, F)> {
    let zero = F::of(0.0);
    let one = F::of(1.0);
    let scale: F = if align {
        if out > 1 {
            F::of_usize(len - 1) / F::of_usize(out - 1)
        } else {
            zero
        }
    } else {
        match scale {
            Some(v) if v > 0.0 => F::of(1.0 / v),
            _ => F::of_usize(len) / F::of_usize(out),
        }
    };
    (0..out)
        .map(|i| {
            let real = if align {
                scale * F::of_usize(i)
            } else {
                let r = scale * (F::of_usize(i) + F::of(0.5)) - F::of(0.5);
                if r < zero { zero } else { r }
            };
            let i0 = (real.fl_floor().to_f64() as usize).min(len - 1);
            let mut lambda = real - F::of_usize(i0);
            if lambda < zero {
                lambda = zero;
            }
            if lambda > one {
                lambda = one;
            }
            let i1 = if i0 < len - 1 { i0 + 1 } else { i0 };
            (i0, i1, one - lambda, lambda)
        })
        .collect()
}

impl Interpolate {
    fn check(&self, x: &Meta) -> Result<()> {
        let op = self.name();
        check_float(op, x)?;
        if x.rank() != 4 || x.shape[2] == 0 || x.shape[3] == 0 {
            return Err(Error::shape(
                op,
                format!(
                    "expected a 4-D [N, C, H, W] input with non-zero H and W, got shape {}",
                    fmt_shape(&x.shape)
                ),
            ));
        }
        if self.size.contains(&0) {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "expected a positive output size, got {:?} for input of shape {}",
                    self.size,
                    fmt_shape(&x.shape)
                ),
            ));
        }
        Ok(())
    }

    fn nearest_cpu<F: Fl>(&self, x: &Tensor, meta: &Meta) -> Result<Tensor> {
        let [n, c, h, w] = nchw(x.shape());
        let [oh, ow] = self.size;
        let (sy, sx) = (
            nearest_sources(h, oh, self.scales[0]),
            nearest_sources(w, ow, self.scales[1]),
        );
        let d = read::<F>(x)?;
        produce::<F>(self.name(), x, meta, |dev, out| {
            each_plane(dev, out, oh * ow, n * c * oh * ow, |pl, o| {
                let src = &d[pl * h * w..(pl + 1) * h * w];
                for (oy, &iy) in sy.iter().enumerate() {
                    for (ox, &ix) in sx.iter().enumerate() {
                        o[oy * ow + ox] = src[iy * w + ix];
                    }
                }
            })
        })
    }

    fn bilinear_cpu<F: Fl>(&self, x: &Tensor, meta: &Meta, align: bool) -> Result<Tensor> {
        let [n, c, h, w] = nchw(x.shape());
        let [oh, ow] = self.size;
        let ty = linear_taps::<F>(h, oh, align, self.scales[0]);
        let tx = linear_taps::<F>(w, ow, align, self.scales[1]);
        let d = read::<F>(x)?;
        produce::<F>(self.name(), x, meta, |dev, out| {
            each_plane(dev, out, oh * ow, 4 * n * c * oh * ow, |pl, o| {
                let src = &d[pl * h * w..(pl + 1) * h * w];
                for (oy, &(y0, y1, hy0, hy1)) in ty.iter().enumerate() {
                    for (ox, &(x0, x1, wx0, wx1)) in tx.iter().enumerate() {
                        let t0 = src[y0 * w + x0] * wx0 + src[y0 * w + x1] * wx1;
                        let t1 = src[y1 * w + x0] * wx0 + src[y1 * w + x1] * wx1;
                        o[oy * ow + ox] = t0 * hy0 + t1 * hy1;
                    }
                }
            })
        })
    }
}

/// The interpolation weights of one dim as a constant broadcast along `axis` of `dims`.
fn weights_along(b: &mut FnBuilder, w: &[f64], dtype: DType, axis: i64, dims: &[usize]) -> Value {
    let c = const_float(b, w, dtype);
    b.broadcast_in_dim(&c, &[axis], dims)
}

impl OpDef for Interpolate {
    fn name(&self) -> &'static str {
        match self.mode {
            InterpolateMode::Nearest => "upsample_nearest2d",
            InterpolateMode::Bilinear { .. } => "upsample_bilinear2d",
        }
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let x = single(self.name(), inputs)?;
        self.check(x)?;
        let out = [x.shape[0], x.shape[1], self.size[0], self.size[1]];
        Ok(vec![Meta::new(&out, x.dtype)])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let x = inputs[0];
        let f64c = compute_dtype(x.dtype()) == DType::F64;
        let t = match (self.mode, f64c) {
            (InterpolateMode::Nearest, true) => self.nearest_cpu::<f64>(x, &outputs[0])?,
            (InterpolateMode::Nearest, false) => self.nearest_cpu::<f32>(x, &outputs[0])?,
            (InterpolateMode::Bilinear { align_corners }, true) => {
                self.bilinear_cpu::<f64>(x, &outputs[0], align_corners)?
            }
            (InterpolateMode::Bilinear { align_corners }, false) => {
                self.bilinear_cpu::<f32>(x, &outputs[0], align_corners)?
            }
        };
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let x = to_nchw(b, &inputs[0]);
        let cd = x.dtype();
        let [n, c, h, w] = nchw(x.dims());
        let [oh, ow] = self.size;
        let out4 = [n, c, oh, ow];
        if outputs[0].numel() == 0 {
            let y = b.splat(TensorType::new(&outputs[0].shape, outputs[0].dtype), 0.0);
            return Ok(vec![y]);
        }
        let y = match self.mode {
            InterpolateMode::Nearest => {
                let sy: Vec<i64> = nearest_sources(h, oh, self.scales[0])
                    .iter()
                    .map(|&v| v as i64)
                    .collect();
                let sx: Vec<i64> = nearest_sources(w, ow, self.scales[1])
                    .iter()
                    .map(|&v| v as i64)
                    .collect();
                let g = gather_axis(b, &x, 2, &sy, &[oh]);
                gather_axis(b, &g, 3, &sx, &[ow])
            }
            InterpolateMode::Bilinear { align_corners } => {
                // Weights in the compute precision, as the CPU kernel computes them.
                type Taps = Vec<(usize, usize, f64, f64)>;
                let widen = |t: Vec<(usize, usize, f32, f32)>| -> Taps {
                    t.into_iter()
                        .map(|(a, b, c, d)| (a, b, c as f64, d as f64))
                        .collect()
                };
                let (ty, tx): (Taps, Taps) = if cd == DType::F64 {
                    (
                        linear_taps::<f64>(h, oh, align_corners, self.scales[0]),
                        linear_taps::<f64>(w, ow, align_corners, self.scales[1]),
                    )
                } else {
                    (
                        widen(linear_taps::<f32>(h, oh, align_corners, self.scales[0])),
                        widen(linear_taps::<f32>(w, ow, align_corners, self.scales[1])),
                    )
                };
                let iy: Vec<i64> = ty.iter().flat_map(|t| [t.0 as i64, t.1 as i64]).collect();
                let ix: Vec<i64> = tx.iter().flat_map(|t| [t.0 as i64, t.1 as i64]).collect();
                // [N, C, OH, 2, W], then [N, C, OH, 2, OW, 2].
                let g = gather_axis(b, &x, 2, &iy, &[oh, 2]);
                let g = gather_axis(b, &g, 4, &ix, &[ow, 2]);
                let corner = |b: &mut FnBuilder, y: i64, xx: i64| {
                    let s = b.slice(
                        &g,
                        &[0, 0, 0, y, 0, xx],
                        &[n as i64, c as i64, oh as i64, y + 1, ow as i64, xx + 1],
                        &[1; 6],
                    );
                    b.reshape(&s, &out4)
                };
                let (x00, x01) = (corner(b, 0, 0), corner(b, 0, 1));
                let (x10, x11) = (corner(b, 1, 0), corner(b, 1, 1));
                let col = |t: &Taps, k: usize| -> Vec<f64> {
                    t.iter().map(|v| if k == 0 { v.2 } else { v.3 }).collect()
                };
                let wx0 = weights_along(b, &col(&tx, 0), cd, 3, &out4);
                let wx1 = weights_along(b, &col(&tx, 1), cd, 3, &out4);
                let hy0 = weights_along(b, &col(&ty, 0), cd, 2, &out4);
                let hy1 = weights_along(b, &col(&ty, 1), cd, 2, &out4);
                let lerp = |b: &mut FnBuilder, p: &Value, q: &Value, wp: &Value, wq: &Value| {
                    let a = b.ew("stablehlo.multiply", &[p, wp]);
                    let c = b.ew("stablehlo.multiply", &[q, wq]);
                    b.ew("stablehlo.add", &[&a, &c])
                };
                let t0 = lerp(b, &x00, &x01, &wx0, &wx1);
                let t1 = lerp(b, &x10, &x11, &wx0, &wx1);
                lerp(b, &t0, &t1, &hy0, &hy1)
            }
        };
        Ok(vec![b.convert(&y, outputs[0].dtype)])
    }

    fn has_backward(&self) -> bool {
        true
    }

    /// The adjoint of the resampling, one dim at a time: every output pixel's gradient, times
    /// each tap's weight, is added to the tap's source row or column (`index_add`, which
    /// accumulates the sources many outputs share).
    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None]);
        };
        let x = &saved.inputs[0];
        let [n, c, h, w] = nchw(x.shape());
        let [oh, ow] = self.size;
        let dev = g.device();
        // The forward's precision (f32 for 16-bit floats); autograd rounds the result back.
        let cd = compute_dtype(g.dtype());
        let g = g.to(cd)?;
        let index = |v: Vec<usize>| -> Result<Tensor> {
            let len = v.len();
            let v: Vec<i64> = v.into_iter().map(|i| i as i64).collect();
            Tensor::from_vec(v, [len], dev)
        };
        let weights = |v: Vec<f64>, shape: &[usize]| -> Result<Tensor> {
            Tensor::from_vec(v, shape, &Device::cpu())?
                .to_dtype(cd)?
                .to_device(dev)
        };
        let rows = Tensor::zeros([n, c, oh, w], cd, dev)?;
        let full = Tensor::zeros([n, c, h, w], cd, dev)?;
        let gx = match self.mode {
            InterpolateMode::Nearest => {
                let sy = index(nearest_sources(h, oh, self.scales[0]))?;
                let sx = index(nearest_sources(w, ow, self.scales[1]))?;
                let t = rows.index_add(3, &sx, &g, 1.0)?;
                full.index_add(2, &sy, &t, 1.0)?
            }
            InterpolateMode::Bilinear { align_corners } => {
                type Taps = Vec<(usize, usize, f64, f64)>;
                let taps = |len: usize, out: usize, scale: Option<f64>| -> Taps {
                    // The weights of the forward, in its precision (f32 values are exact in f64).
                    if cd == DType::F64 {
                        linear_taps::<f64>(len, out, align_corners, scale)
                    } else {
                        linear_taps::<f32>(len, out, align_corners, scale)
                            .into_iter()
                            .map(|(a, b, p, q)| (a, b, p as f64, q as f64))
                            .collect()
                    }
                };
                let ty = taps(h, oh, self.scales[0]);
                let tx = taps(w, ow, self.scales[1]);
                let i0 = |t: &Taps| index(t.iter().map(|v| v.0).collect());
                let i1 = |t: &Taps| index(t.iter().map(|v| v.1).collect());
                let w0 = |t: &Taps, s: &[usize]| weights(t.iter().map(|v| v.2).collect(), s);
                let w1 = |t: &Taps, s: &[usize]| weights(t.iter().map(|v| v.3).collect(), s);
                let t = rows
                    .index_add(3, &i0(&tx)?, &TensorOps::mul(&g, &w0(&tx, &[ow])?)?, 1.0)?
                    .index_add(3, &i1(&tx)?, &TensorOps::mul(&g, &w1(&tx, &[ow])?)?, 1.0)?;
                full.index_add(2, &i0(&ty)?, &TensorOps::mul(&t, &w0(&ty, &[oh, 1])?)?, 1.0)?
                    .index_add(2, &i1(&ty)?, &TensorOps::mul(&t, &w1(&ty, &[oh, 1])?)?, 1.0)?
            }
        };
        Ok(vec![Some(gx)])
    }
}

// ---- the public API ---------------------------------------------------------------------------

fn conv_inputs<'a>(x: &'a Tensor, w: &'a Tensor, b: Option<&'a Tensor>) -> Vec<&'a Tensor> {
    let mut v = vec![x, w];
    v.extend(b);
    v
}

/// This file's ops as methods on `Tensor`, with PyTorch's names, layouts and semantics.
pub trait ConvOps {
    /// 1-D convolution (cross-correlation) of `[N, C, L]` or `[C, L]` with a weight
    /// `[out, C / groups, k]` and an optional bias `[out]`.
    fn conv1d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor>;
    /// 2-D convolution (cross-correlation) of `[N, C, H, W]` or `[C, H, W]` with a weight
    /// `[out, C / groups, kh, kw]` and an optional bias `[out]`.
    fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor>;
    /// 2-D transposed convolution of `[N, C, H, W]` or `[C, H, W]` with a weight
    /// `[C, out / groups, kh, kw]` and an optional bias `[out]`.
    fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &ConvTransposeOptions,
    ) -> Result<Tensor>;
    /// 2-D max pooling of `[N, C, H, W]` or `[C, H, W]` (NaN propagates).
    fn max_pool2d(&self, opts: &MaxPoolOptions) -> Result<Tensor>;
    /// 2-D max pooling, also returning each maximum's index (i64) within its `H x W` plane.
    fn max_pool2d_with_indices(&self, opts: &MaxPoolOptions) -> Result<(Tensor, Tensor)>;
    /// 2-D average pooling of `[N, C, H, W]` or `[C, H, W]`.
    fn avg_pool2d(&self, opts: &AvgPoolOptions) -> Result<Tensor>;
    /// 2-D adaptive average pooling of `[N, C, H, W]` or `[C, H, W]` to `output_size`
    /// (one value for both dims, or height and width).
    fn adaptive_avg_pool2d(&self, output_size: impl Into<Ints>) -> Result<Tensor>;
    /// Resizes `[N, C, H, W]` (PyTorch's `interpolate` with mode `'nearest'` or
    /// `'bilinear'`).
    fn interpolate(&self, to: Resize, mode: InterpolateMode) -> Result<Tensor>;
}

impl ConvOps for Tensor {
    fn conv1d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor> {
        crate::exec::dispatch::run1(&Conv::new(1, opts)?, &conv_inputs(self, weight, bias))
    }

    fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor> {
        crate::exec::dispatch::run1(&Conv::new(2, opts)?, &conv_inputs(self, weight, bias))
    }

    fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &ConvTransposeOptions,
    ) -> Result<Tensor> {
        crate::exec::dispatch::run1(
            &ConvTranspose2d::new(opts)?,
            &conv_inputs(self, weight, bias),
        )
    }

    fn max_pool2d(&self, opts: &MaxPoolOptions) -> Result<Tensor> {
        crate::exec::dispatch::run1(&MaxPool2d::new(opts, false)?, &[self])
    }

    fn max_pool2d_with_indices(&self, opts: &MaxPoolOptions) -> Result<(Tensor, Tensor)> {
        let mut out = crate::exec::dispatch::run(&MaxPool2d::new(opts, true)?, &[self])?;
        if out.len() != 2 {
            return Err(Error::internal(
                "max_pool2d",
                format!("expected values and indices, got {} outputs", out.len()),
            ));
        }
        let idx = out.remove(1);
        Ok((out.remove(0), idx))
    }

    fn avg_pool2d(&self, opts: &AvgPoolOptions) -> Result<Tensor> {
        crate::exec::dispatch::run1(&AvgPool2d::new(opts)?, &[self])
    }

    fn adaptive_avg_pool2d(&self, output_size: impl Into<Ints>) -> Result<Tensor> {
        let size = output_size
            .into()
            .resolve("adaptive_avg_pool2d", "output_size", 2)?;
        crate::exec::dispatch::run1(&AdaptiveAvgPool2d { size: pair(size) }, &[self])
    }

    fn interpolate(&self, to: Resize, mode: InterpolateMode) -> Result<Tensor> {
        let op = match mode {
            InterpolateMode::Nearest => "upsample_nearest2d",
            InterpolateMode::Bilinear { .. } => "upsample_bilinear2d",
        };
        let (size, scales) = match to {
            Resize::Size(s) => (s, [None, None]),
            Resize::Scale(f) => {
                if self.rank() != 4 {
                    return Err(Error::shape(
                        op,
                        format!(
                            "expected a 4-D [N, C, H, W] input, got shape {}",
                            fmt_shape(self.shape())
                        ),
                    ));
                }
                if f.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
                    return Err(Error::invalid_argument(
                        op,
                        format!("expected positive finite scale factors, got {f:?}"),
                    ));
                }
                let s = [
                    (self.shape()[2] as f64 * f[0]).floor() as usize,
                    (self.shape()[3] as f64 * f[1]).floor() as usize,
                ];
                (s, [Some(f[0]), Some(f[1])])
            }
        };
        crate::exec::dispatch::run1(&Interpolate { size, scales, mode }, &[self])
    }
}

// ---- the op table -----------------------------------------------------------------------------

/// Seeded normal samples of `shape` in `dtype` on `device`; `perm` (if given) is applied to a
/// tensor created in the permuted order, so the result is a non-contiguous view.
fn randn(
    g: &mut Generator,
    shape: &[usize],
    perm: Option<&[usize]>,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let cpu = Device::cpu();
    match perm {
        None => g
            .randn(shape, DType::F64, &cpu)?
            .to_dtype(dtype)?
            .to_device(device),
        Some(p) => {
            // Create `stored` so that permuting it by `p` yields `shape`.
            let mut stored = vec![0; shape.len()];
            for (i, &pi) in p.iter().enumerate() {
                stored[pi] = shape[i];
            }
            let t = g
                .randn(&stored[..], DType::F64, &cpu)?
                .to_dtype(dtype)?
                .to_device(device)?;
            t.permute(p)
        }
    }
}

fn sample_conv1d(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(21);
    let x = randn(&mut g, &[2, 4, 9], Some(&[0, 2, 1]), d, dev)?;
    let w = randn(&mut g, &[6, 2, 3], None, d, dev)?;
    let b = randn(&mut g, &[6], None, d, dev)?;
    let o = ConvOptions::new()
        .stride(2)
        .padding(1)
        .dilation(2)
        .groups(2);
    let same = ConvOptions::new().padding(Padding::Same).dilation(3);
    let w1 = randn(&mut g, &[3, 4, 2], None, d, dev)?;
    Ok(vec![
        x.conv1d(&w, Some(&b), &o)?,
        x.conv1d(&w1, None, &same)?,
        x.select(0, 1)?.conv1d(&w1, None, &ConvOptions::new())?,
    ])
}

fn sample_conv2d(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(22);
    let x = randn(&mut g, &[2, 4, 7, 6], Some(&[0, 2, 3, 1]), d, dev)?;
    let w = randn(&mut g, &[6, 2, 3, 2], None, d, dev)?;
    let b = randn(&mut g, &[6], None, d, dev)?;
    let o = ConvOptions::new()
        .stride([2, 1])
        .padding([1, 2])
        .dilation([2, 1])
        .groups(2);
    let w1 = randn(&mut g, &[3, 4, 1, 1], None, d, dev)?;
    let w2 = randn(&mut g, &[5, 4, 2, 3], None, d, dev)?;
    Ok(vec![
        x.conv2d(&w, Some(&b), &o)?,
        x.conv2d(&w1, None, &ConvOptions::new())?,
        x.select(0, 0)?
            .conv2d(&w2, None, &ConvOptions::new().padding(Padding::Same))?,
    ])
}

fn sample_conv_t(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(23);
    let x = randn(&mut g, &[2, 4, 4, 5], Some(&[0, 3, 1, 2]), d, dev)?;
    let w = randn(&mut g, &[4, 3, 3, 2], None, d, dev)?;
    let b = randn(&mut g, &[6], None, d, dev)?;
    let o = ConvTransposeOptions::new()
        .stride([2, 3])
        .padding([1, 0])
        .output_padding([1, 2])
        .dilation([1, 2])
        .groups(2);
    // Padding beyond the kernel reach exercises the lowering's cropping.
    let crop = ConvTransposeOptions::new().stride(2).padding(3);
    let w1 = randn(&mut g, &[4, 2, 2, 2], None, d, dev)?;
    Ok(vec![
        x.conv_transpose2d(&w, Some(&b), &o)?,
        x.conv_transpose2d(&w1, None, &crop)?,
    ])
}

fn sample_max_pool(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(24);
    let x = randn(&mut g, &[2, 3, 7, 8], Some(&[0, 2, 3, 1]), d, dev)?;
    let (v, i) =
        x.max_pool2d_with_indices(&MaxPoolOptions::new(3).stride(2).padding(1).ceil_mode(true))?;
    let o = MaxPoolOptions::new([2, 3]).dilation(2).ceil_mode(true);
    Ok(vec![
        v,
        i,
        x.max_pool2d(&o)?,
        x.select(1, 2)?.max_pool2d(&MaxPoolOptions::new(2))?,
    ])
}

fn sample_avg_pool(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(25);
    let x = randn(&mut g, &[2, 3, 7, 8], Some(&[0, 2, 3, 1]), d, dev)?;
    let o = AvgPoolOptions::new(3)
        .stride(2)
        .padding(1)
        .ceil_mode(true)
        .count_include_pad(false);
    let inc = AvgPoolOptions::new([3, 2]).padding(1).ceil_mode(true);
    let div = AvgPoolOptions::new(2).divisor_override(Some(3));
    Ok(vec![
        x.avg_pool2d(&o)?,
        x.avg_pool2d(&inc)?,
        x.avg_pool2d(&div)?,
    ])
}

fn sample_adaptive(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(26);
    let x = randn(&mut g, &[2, 3, 7, 9], Some(&[0, 2, 3, 1]), d, dev)?;
    Ok(vec![
        x.adaptive_avg_pool2d([3, 4])?,
        x.adaptive_avg_pool2d(1)?,
        x.select(0, 1)?.adaptive_avg_pool2d([5, 9])?,
    ])
}

fn sample_nearest(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(27);
    let x = randn(&mut g, &[2, 3, 4, 5], Some(&[0, 2, 3, 1]), d, dev)?;
    let m = InterpolateMode::Nearest;
    Ok(vec![
        x.interpolate(Resize::Size([7, 3]), m)?,
        x.interpolate(Resize::Scale([2.0, 1.5]), m)?,
    ])
}

fn sample_bilinear(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(28);
    let x = randn(&mut g, &[2, 3, 4, 5], Some(&[0, 2, 3, 1]), d, dev)?;
    Ok(vec![
        x.interpolate(
            Resize::Size([7, 3]),
            InterpolateMode::Bilinear {
                align_corners: false,
            },
        )?,
        x.interpolate(
            Resize::Scale([1.5, 2.0]),
            InterpolateMode::Bilinear {
                align_corners: true,
            },
        )?,
    ])
}

/// The rows of the op table for this file's ops.
pub fn table() -> Vec<OpInfo> {
    let row = |name: &'static str, f: fn(DType, &Device) -> Result<Vec<Tensor>>| OpInfo {
        name,
        cpu: DTypeSet::FLOAT,
        hlo: DTypeSet::FLOAT,
        sample: Arc::new(f),
        tolerance: 1e-5,
        // Every op here has a backward rule.
    };
    vec![
        row("conv1d", sample_conv1d),
        row("conv2d", sample_conv2d),
        row("conv_transpose2d", sample_conv_t),
        row("max_pool2d", sample_max_pool),
        row("avg_pool2d", sample_avg_pool),
        row("adaptive_avg_pool2d", sample_adaptive),
        row("upsample_nearest2d", sample_nearest),
        row("upsample_bilinear2d", sample_bilinear),
    ]
}

#[cfg(test)]
mod tests {
    //! The convolution kernels against direct loops, with patch budgets and thread counts that
    //! force every blocking and splitting path on small shapes.

    use super::*;
    use proptest::prelude::*;

    /// `out[n, o, y, x] = bias[o] + sum x[n, g * cg + c, ...] * w[o, c, ki, kj]` in f64, and
    /// the same sum over absolute values (the scale of the rounding error).
    fn direct(g: &ConvGeom, x: &[f64], w: &[f64], bias: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        let (cg, og) = (g.c / g.groups, g.o / g.groups);
        let (mut out, mut mag) = (Vec::new(), Vec::new());
        for n in 0..g.n {
            for oc in 0..g.o {
                let grp = oc / og;
                for oy in 0..g.oh {
                    for ox in 0..g.ow {
                        let b = bias.map_or(0.0, |b| b[oc]);
                        let (mut s, mut a) = (b, b.abs());
                        for c in 0..cg {
                            for ki in 0..g.kh {
                                for kj in 0..g.kw {
                                    let iy = (oy * g.stride[0] + ki * g.dil[0]) as isize
                                        - g.pad[0][0] as isize;
                                    let ix = (ox * g.stride[1] + kj * g.dil[1]) as isize
                                        - g.pad[1][0] as isize;
                                    if iy < 0 || ix < 0 || iy >= g.h as isize || ix >= g.w as isize
                                    {
                                        continue;
                                    }
                                    let ci = grp * cg + c;
                                    let xv =
                                        x[((n * g.c + ci) * g.h + iy as usize) * g.w + ix as usize];
                                    let wv = w[((oc * cg + c) * g.kh + ki) * g.kw + kj];
                                    s += xv * wv;
                                    a += (xv * wv).abs();
                                }
                            }
                        }
                        out.push(s);
                        mag.push(a);
                    }
                }
            }
        }
        (out, mag)
    }

    /// Geometries whose sizes straddle the block and split boundaries, a patch budget, a
    /// thread count and a seed; `None` where the kernel does not fit the padded input.
    fn case() -> impl Strategy<Value = Option<(ConvGeom, usize, usize, u64)>> {
        (
            (
                1..=3usize,
                1..=2usize,
                prop::sample::select(vec![1usize, 2, 7, 17, 65]),
            ),
            (
                prop::sample::select(vec![1usize, 7, 17]),
                prop::sample::select(vec![1usize, 2, 7, 9]),
            ),
            prop::sample::select(vec![1usize, 7, 17, 63, 65]),
            (
                1..=3usize,
                1..=3usize,
                1..=2usize,
                1..=2usize,
                1..=2usize,
                1..=2usize,
            ),
            (0..=2usize, 0..=2usize, 0..=1usize, 0..=1usize),
            (
                prop::sample::select(vec![1usize, 40, 257, 1000, 4096, 1 << 16]),
                1..=3usize,
                any::<u64>(),
            ),
        )
            .prop_map(
                |(
                    (n, groups, cg),
                    (og, h),
                    w,
                    (kh, kw, s0, s1, d0, d1),
                    pads,
                    (budget, threads, seed),
                )| {
                    let (p0, p1, q0, q1) = pads;
                    let pad = [[p0, p1], [q0, q1]];
                    let span = [d0 * (kh - 1) + 1, d1 * (kw - 1) + 1];
                    let padded = [h + p0 + p1, w + q0 + q1];
                    if padded[0] < span[0] || padded[1] < span[1] {
                        return None;
                    }
                    let g = ConvGeom {
                        n,
                        c: cg * groups,
                        h,
                        w,
                        o: og * groups,
                        kh,
                        kw,
                        oh: (padded[0] - span[0]) / s0 + 1,
                        ow: (padded[1] - span[1]) / s1 + 1,
                        stride: [s0, s1],
                        pad,
                        dil: [d0, d1],
                        groups,
                    };
                    Some((g, budget, threads, seed))
                },
            )
    }

    /// Seeded normal operands of `g` (input, weight, bias), rounded to `T`.
    fn operands<T: Element>(g: &ConvGeom, seed: u64) -> [Vec<T>; 3] {
        let mut r = Generator::new(seed);
        let sizes = [
            g.n * g.c * g.h * g.w,
            g.o * (g.c / g.groups) * g.kh * g.kw,
            g.o,
        ];
        sizes.map(|len| {
            r.randn([len], DType::F64, &Device::cpu())
                .and_then(|t| t.to_dtype(T::DTYPE))
                .and_then(|t| t.to_vec::<T>())
                .unwrap()
        })
    }

    fn wide<T: Element>(v: &[T]) -> Vec<f64> {
        v.iter().map(|e| e.to_f64()).collect()
    }

    fn host() -> Arc<CpuDevice> {
        Device::cpu().as_cpu().cloned().unwrap()
    }

    /// Runs `kernel` on `g` with and without bias and checks each output element against the
    /// direct loops: within `rel` of the absolute-value sum, plus half a unit in the last place
    /// of the output dtype (`mant` fraction bits, `emin` smallest normal exponent), so that
    /// 16-bit outputs must be rounded once from an f32 sum.
    fn check<T: Element>(
        g: &ConvGeom,
        budget: usize,
        threads: usize,
        seed: u64,
        kernel: ConvKernel<T>,
        (rel, mant, emin): (f64, i32, i32),
    ) -> std::result::Result<(), TestCaseError> {
        let [x, w, b] = operands::<T>(g, seed);
        let dev = host();
        for with_bias in [false, true] {
            let bias = with_bias.then_some(&b[..]);
            let mut out = vec![T::default(); g.n * g.o * g.oh * g.ow];
            kernel(
                g,
                ConvData { x: &x, w: &w, bias },
                &dev,
                threads,
                budget,
                &mut out,
            )
            .unwrap();
            let wb = wide(&b);
            let (want, mag) = direct(g, &wide(&x), &wide(&w), with_bias.then_some(&wb[..]));
            for (i, (y, (r, m))) in out.iter().zip(want.iter().zip(&mag)).enumerate() {
                let y = y.to_f64();
                let e = if *r == 0.0 {
                    emin
                } else {
                    (r.abs().log2().floor() as i32).max(emin)
                };
                let tol = rel * m + 2f64.powi(e - mant - 1);
                prop_assert!(
                    (y - r).abs() <= tol,
                    "{g:?} budget {budget} threads {threads} bias {with_bias}: element {i} is {y}, expected {r}"
                );
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn kernels_match_direct_loops(c in case()) {
            let Some((g, budget, threads, seed)) = c else { return Ok(()) };
            let k = (g.c / g.groups * g.kh * g.kw + 2) as f64;
            check::<f64>(&g, budget, threads, seed, conv_cpu, (k * 2f64.powi(-52), 52, -1022))?;
            check::<f32>(&g, budget, threads, seed, conv_cpu, (k * 2f64.powi(-23), 23, -126))?;
            check::<bf16>(&g, budget, threads, seed, conv_cpu16, (k * 2f64.powi(-23), 7, -126))?;
            check::<f16>(&g, budget, threads, seed, conv_cpu16, (k * 2f64.powi(-23), 10, -14))?;
        }
    }

    #[test]
    fn half_conversions_match_the_half_crate() {
        for bits in 0..=u16::MAX {
            for (mine, theirs) in [
                (
                    bf16::from_bits(bits).widen(),
                    bf16::from_bits(bits).to_f32(),
                ),
                (f16::from_bits(bits).widen(), f16::from_bits(bits).to_f32()),
            ] {
                assert!(
                    mine.to_bits() == theirs.to_bits() || (mine.is_nan() && theirs.is_nan()),
                    "{bits:#06x}: {mine} vs {theirs}"
                );
            }
        }
        let mut r = Generator::new(7);
        let mut v = r
            .randn([4096], DType::F32, &Device::cpu())
            .and_then(|t| t.to_vec::<f32>())
            .unwrap();
        // Ties, values next to ties, overflow, infinities, NaNs and subnormals.
        v.extend([
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            f32::from_bits(0x3f80_8001),
            f32::from_bits(0x3f81_7fff),
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            1e-40,
            -1e-41,
            0.0,
            -0.0,
        ]);
        for x in v {
            let (mine, theirs) = (bf16::narrow(x), bf16::from_f32(x));
            assert!(
                mine.to_bits() == theirs.to_bits() || (mine.is_nan() && theirs.is_nan()),
                "{x}: {mine} vs {theirs}"
            );
        }
    }

    #[test]
    fn kernels_without_input_channels_give_the_bias() {
        let g = ConvGeom {
            n: 2,
            c: 0,
            h: 3,
            w: 3,
            o: 2,
            kh: 1,
            kw: 1,
            oh: 3,
            ow: 3,
            stride: [1, 1],
            pad: [[0, 0], [0, 0]],
            dil: [1, 1],
            groups: 1,
        };
        let b = [bf16::from_f32(1.5), bf16::from_f32(-2.0)];
        let mut out = vec![bf16::from_f32(9.0); 36];
        let data = ConvData {
            x: &[],
            w: &[],
            bias: Some(&b),
        };
        conv_cpu16(&g, data, &host(), 1, COLS_BLOCK_16, &mut out).unwrap();
        let want: Vec<f32> = (0..36)
            .map(|i| if i / 9 % 2 == 0 { 1.5 } else { -2.0 })
            .collect();
        assert_eq!(out.iter().map(|v| v.to_f32()).collect::<Vec<_>>(), want);
    }
}
