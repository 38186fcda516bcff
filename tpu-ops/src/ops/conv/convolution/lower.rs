//! The StableHLO lowerings of the convolutions: one `stablehlo.convolution` each, the transposed
//! one as a convolution of the stride-dilated input with the flipped kernel.

use crate::hlo::lower::{Lowered, OpIo};
use crate::hlo::{FnBuilder, TensorType, Value, i64_array};
use crate::op::Meta;
use crate::op::promote::compute_dtype;
use crate::ops::conv::lower::padding_attr;

use super::{Conv, ConvTranspose2d};

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

/// `conv1d` and `conv2d`: a 2-D convolution over `[N, C, H, W]` (1-D and unbatched inputs
/// reshaped to it), plus the bias.
pub(super) fn conv(op: &Conv, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let metas: Vec<Meta> = inputs.iter().map(Meta::of_value).collect();
    let (g, _) = op.geom(&metas)?;
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

/// A convolution of the input dilated by the stride with the kernel flipped and its in/out
/// channels swapped within each group.
pub(super) fn conv_transpose(op: &ConvTranspose2d, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let metas: Vec<Meta> = inputs.iter().map(Meta::of_value).collect();
    let (g, _) = op.geom(&metas)?;
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
        let edge = (g.dil[i] * (k[i] - 1)) as i64 - op.padding[i] as i64;
        let want = [edge, edge + op.output_padding[i] as i64];
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
