//! The StableHLO lowerings of pooling: `stablehlo.reduce_window` for max and average pooling
//! (with PyTorch's NaN and index rules in the reducer), and gathers of every window's taps for
//! adaptive pooling.

use tpu_tensor::DType;

use crate::hlo::lower::{Lowered, OpIo};
use crate::hlo::{Cmp, FnBuilder, TensorType, Value, i64_array};
use crate::op::Meta;
use crate::ops::conv::lower::{const_float, gather_axis, padding_attr, to_nchw};

use super::{AdaptiveAvgPool2d, AvgPool2d, MaxPool2dOp, PoolGeom, adaptive_windows, taps};

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

/// The input as `[N, C, H, W]` in compute precision, and the shape of its windows' results.
fn windowed(b: &mut FnBuilder, g: &PoolGeom, input: &Value) -> (Value, [usize; 4]) {
    let x = to_nchw(b, input);
    let out4 = [x.dims()[0], x.dims()[1], g.oh, g.ow];
    (x, out4)
}

/// `max_pool2d`: a `reduce_window` of the maxima, or of (value, index) pairs with indices.
pub(super) fn max_pool(op: &MaxPool2dOp, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let (g, _) = op.geom(&Meta::of_value(&inputs[0]))?;
    let (x, out4) = windowed(b, &g, &inputs[0]);
    let cd = x.dtype();
    let win = g.window();
    let ninf = b.scalar(cd, f64::NEG_INFINITY);
    let res = if !op.indices {
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
    if op.indices {
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

/// `avg_pool2d`: a `reduce_window` sum divided by PyTorch's divisors.
pub(super) fn avg_pool(op: &AvgPool2d, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let (g, _) = op.geom(&Meta::of_value(&inputs[0]))?;
    let (x, out4) = windowed(b, &g, &inputs[0]);
    let cd = x.dtype();
    let zero = b.scalar(cd, 0.0);
    let sum = reduce_window(b, &[&x], &[&zero], &g.window(), &out4, |b, a| {
        vec![b.ew("stablehlo.add", &[&a[0], &a[1]])]
    })
    .remove(0);
    let div = match op.divisor_override {
        Some(d) => b.splat(TensorType::new(&out4, cd), d as f64),
        None => {
            let f =
                |v: Vec<usize>| -> Vec<f64> { v.into_iter().map(|d| d.max(1) as f64).collect() };
            let dh = const_float(b, &f(op.divisors(&g, 0)), cd);
            let dw = const_float(b, &f(op.divisors(&g, 1)), cd);
            let dh = b.broadcast_in_dim(&dh, &[2], &out4);
            let dw = b.broadcast_in_dim(&dw, &[3], &out4);
            b.ew("stablehlo.multiply", &[&dh, &dw])
        }
    };
    let y = b.ew("stablehlo.divide", &[&sum, &div]);
    let y = b.convert(&y, outputs[0].dtype);
    Ok(vec![b.reshape(&y, &outputs[0].shape)])
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

/// `adaptive_avg_pool2d`: the window sums along H, then W, divided by the window lengths.
pub(super) fn adaptive_avg_pool(op: &AdaptiveAvgPool2d, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let x = to_nchw(b, &inputs[0]);
    let (h, w) = (x.dims()[2], x.dims()[3]);
    let cd = x.dtype();
    if let Some(z) = io.zeros_if_empty(b) {
        return Ok(z);
    }
    let sh = adaptive_sum(b, &x, 2, op.size[0]);
    let s = adaptive_sum(b, &sh, 3, op.size[1]);
    let lens = |len: usize, out: usize| -> Vec<f64> {
        adaptive_windows(len, out)
            .iter()
            .map(|w| (w.1 - w.0) as f64)
            .collect()
    };
    let dh = const_float(b, &lens(h, op.size[0]), cd);
    let dw = const_float(b, &lens(w, op.size[1]), cd);
    let dh = b.broadcast_in_dim(&dh, &[2], s.dims());
    let dw = b.broadcast_in_dim(&dw, &[3], s.dims());
    let y = b.ew("stablehlo.divide", &[&s, &dh]);
    let y = b.ew("stablehlo.divide", &[&y, &dw]);
    let y = b.convert(&y, outputs[0].dtype);
    Ok(vec![b.reshape(&y, &outputs[0].shape)])
}
