//! Convolutions (`conv1d`, `conv2d`, `conv_transpose2d`): the op structs, their shape rules, and
//! `OpDef` impls that hand the kernels, lowerings and backward rules to the files below.

mod cpu;
mod cpu16;
mod grad;
mod lower;

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{Error, Result, Tensor};

use crate::op::args::check_float;
use crate::op::{Meta, OpDef, op_parts};

use super::options::{ConvOptions, ConvTransposeOptions};
use super::{arith, dilated, nchw, same_dtype};

/// The input and weight metas of a convolution called with input, weight and optional bias,
/// checked for dtypes and ranks (`sp` spatial dims; `weight_layout` names the weight's dims in
/// the error), and whether the input is batched.
fn conv_operands<'a>(
    op: &str,
    inputs: &'a [Meta],
    sp: usize,
    weight_layout: &str,
) -> Result<(&'a Meta, &'a Meta, bool)> {
    let (x, w) = match inputs {
        [x, w] | [x, w, _] => (x, w),
        _ => {
            return Err(Error::invalid_argument(
                op,
                format!(
                    "expected input, weight and optionally bias, got {} tensors",
                    inputs.len()
                ),
            ));
        }
    };
    check_float(op, x)?;
    same_dtype(op, "weight", x, w)?;
    if let Some(b) = inputs.get(2) {
        same_dtype(op, "bias", x, b)?;
    }
    let batched = x.rank() == sp + 2;
    if !batched && x.rank() != sp + 1 {
        return Err(Error::shape(
            op,
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
            op,
            format!(
                "expected a {}-D weight [{weight_layout}], got shape {}",
                sp + 2,
                fmt_shape(&w.shape)
            ),
        ));
    }
    Ok((x, w, batched))
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

/// Writes the `OpDef` impl of a convolution op from its name, kernel, lowering and backward
/// rule: both take their output and kernel from `geom`, and both key their cache on the matmul
/// precision, which their lowerings read.
macro_rules! conv_op_def {
    ($Op:ty, |$op:ident| $name:expr, $cpu:path, $lower:path, $grad:path) => {
        impl OpDef for $Op {
            fn name(&self) -> &'static str {
                let $op = self;
                $name
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
                let t = $cpu(self.name(), &g, inputs, &outputs[0])?;
                Ok(vec![t])
            }

            op_parts! {
                lower: $lower,
                grad: $grad,
            }
        }
    };
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
    pub(super) fn new(spatial: usize, opts: &ConvOptions) -> Result<Conv> {
        let name = if spatial == 1 { "conv1d" } else { "conv2d" };
        let s = opts.stride.positive(name, "stride", spatial)?;
        let d = opts.dilation.positive(name, "dilation", spatial)?;
        if opts.groups == 0 {
            return Err(Error::invalid_argument(
                name,
                "expected groups to be positive, got 0",
            ));
        }
        let sides = opts.padding.sides(name, spatial, &s)?;
        // 1-D convolutions run as 2-D ones over a height of 1.
        let two = |v: &[usize], unit: usize| {
            if spatial == 1 {
                [unit, v[0]]
            } else {
                [v[0], v[1]]
            }
        };
        let pad = match sides {
            None => Pad::Same,
            Some(v) if spatial == 1 => Pad::Sides([[0, 0], v[0]]),
            Some(v) => Pad::Sides([v[0], v[1]]),
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
        let taps = if sp == 1 { "k" } else { "kh, kw" };
        let layout = format!("out_channels, in_channels / groups, {taps}");
        let (x, w, batched) = conv_operands(name, inputs, sp, &layout)?;
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

conv_op_def!(
    Conv,
    |op| if op.spatial == 1 { "conv1d" } else { "conv2d" },
    cpu::conv_forward,
    lower::conv,
    grad::conv
);

/// `conv_transpose2d`; inputs: input, weight `[in, out / groups, kh, kw]`, and optionally bias.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvTranspose2d {
    pub(super) stride: [usize; 2],
    pub(super) padding: [usize; 2],
    pub(super) output_padding: [usize; 2],
    pub(super) dilation: [usize; 2],
    pub(super) groups: usize,
}

impl ConvTranspose2d {
    pub(super) fn new(opts: &ConvTransposeOptions) -> Result<ConvTranspose2d> {
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
        let layout = "in_channels, out_channels / groups, kh, kw";
        let (x, w, batched) = conv_operands(name, inputs, 2, layout)?;
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

conv_op_def!(
    ConvTranspose2d,
    |_op| "conv_transpose2d",
    cpu::conv_transpose,
    lower::conv_transpose,
    grad::conv_transpose
);
