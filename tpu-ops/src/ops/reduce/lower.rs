//! The StableHLO lowerings of the reductions and scans: `stablehlo.reduce` in the dtype the CPU
//! kernels compute in (explicit NaN-propagating comparisons for max and min, a variadic reduce
//! for the index of an extreme), and a `reduce_window` for the scans.

use tpu_tensor::shape::resolve_dim_in;
use tpu_tensor::{DType, Error};

use super::shape::{one_to_one, reduce_mask, wide};
use super::{ArgReduce, Reduce, ReduceKind, Scan};
use crate::hlo::lower::{Lowered, OpIo};
use crate::hlo::{Cmp, FnBuilder, TensorType, Value, highest, i64_array, lowest};
use crate::op::{Meta, OpDef};

/// [`Reduce`] in StableHLO.
pub(super) fn reduce(op: &Reduce, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let (x, out) = one_to_one(op.name(), inputs, outputs)?;
    let mask = reduce_mask(op.name(), &op.dims, x.dims())?;
    Ok(vec![lower_reduce(op.kind, b, x, &mask, out)])
}

/// [`ArgReduce`] in StableHLO.
pub(super) fn arg_reduce(op: &ArgReduce, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let x = match inputs {
        [x] => x,
        _ => return Err(Error::internal(op.name(), "expected one input")),
    };
    let in_dtype = x.dtype();
    let xc = b.convert(x, wide(in_dtype));
    let (xc, dim) = match op.dim {
        None => {
            let numel = xc.ty.numel();
            (b.reshape(&xc, &[numel]), 0)
        }
        Some(_) if xc.ty.rank() == 0 => (b.reshape(&xc, &[1]), 0),
        Some(d) => (
            xc.clone(),
            resolve_dim_in(op.name(), d, x.ty.rank(), x.dims())?,
        ),
    };
    let (v, i) = lower_arg(b, &xc, dim, op.max);
    let shape = &outputs
        .last()
        .ok_or_else(|| Error::internal(op.name(), "expected outputs"))?
        .shape;
    let i = b.reshape(&i, shape);
    Ok(if op.with_values {
        let v = b.reshape(&v, shape);
        vec![b.convert(&v, in_dtype), i]
    } else {
        vec![i]
    })
}

/// [`Scan`] in StableHLO.
pub(super) fn scan(op: &Scan, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let (x, out) = one_to_one(op.name(), inputs, outputs)?;
    if out.numel() == 0 {
        return Ok(vec![b.splat(out.ty(), 0)]);
    }
    let d = resolve_dim_in(op.name(), op.dim, x.ty.rank(), x.dims())?;
    let x = if x.ty.rank() == 0 {
        b.reshape(x, &[1])
    } else {
        x.clone()
    };
    let ct = wide(x.dtype());
    let xc = b.convert(&x, ct);
    // A reduce_window whose window spans the whole dim, padded in front: XLA's TPU compiler
    // turns this pattern into an efficient scan; the CPU backend evaluates it in O(n^2).
    let n = xc.dims()[d];
    let rank = xc.ty.rank();
    let window: Vec<i64> = (0..rank)
        .map(|i| if i == d { n as i64 } else { 1 })
        .collect();
    let padding: Vec<String> = (0..rank)
        .map(|i| {
            if i == d {
                format!("[{}, 0]", n - 1)
            } else {
                "[0, 0]".to_string()
            }
        })
        .collect();
    let attrs = format!(
        "window_dimensions = {}, padding = dense<[{}]> : tensor<{rank}x2xi64>",
        i64_array(&window),
        padding.join(", ")
    );
    let init = b.scalar(ct, if op.prod { 1 } else { 0 });
    let step = if op.prod {
        "stablehlo.multiply"
    } else {
        "stablehlo.add"
    };
    let region = b.region(&[TensorType::scalar(ct)], 2, |b, a| {
        vec![b.ew(step, &[&a[0], &a[1]])]
    });
    let ty = xc.ty.clone();
    let s = b
        .op_n(
            "stablehlo.reduce_window",
            &[&xc, &init],
            &attrs,
            &region,
            &[ty],
        )
        .remove(0);
    let s = b.reshape(&s, &out.shape);
    Ok(vec![b.convert(&s, out.dtype)])
}

fn fold_hlo(b: &mut FnBuilder, x: &Value, dims: &[usize], init: Value, op: &str) -> Value {
    b.reduce(&[x], &[&init], dims, |b, a| vec![b.ew(op, &[&a[0], &a[1]])])
        .remove(0)
}

fn sum_hlo(b: &mut FnBuilder, x: &Value, dims: &[usize]) -> Value {
    let zero = b.scalar(x.dtype(), 0);
    fold_hlo(b, x, dims, zero, "stablehlo.add")
}

/// Max or min over `dims`, NaN propagating (the comparison is explicit because XLA's
/// `maximum` need not propagate NaN on every backend).
fn extreme_hlo(b: &mut FnBuilder, x: &Value, dims: &[usize], max: bool) -> Value {
    let dt = x.dtype();
    let init = b.scalar(dt, if max { lowest(dt) } else { highest(dt) });
    if !dt.is_float() {
        let op = if max {
            "stablehlo.maximum"
        } else {
            "stablehlo.minimum"
        };
        return fold_hlo(b, x, dims, init, op);
    }
    b.reduce(&[x], &[&init], dims, |b, a| {
        let better = b.compare(if max { Cmp::Gt } else { Cmp::Lt }, &a[0], &a[1]);
        let nan = b.compare(Cmp::Ne, &a[0], &a[0]);
        let keep = b.ew("stablehlo.or", &[&better, &nan]);
        vec![b.select(&keep, &a[0], &a[1])]
    })
    .remove(0)
}

/// The max or min along `dim` and the index of its first occurrence, NaN first: a variadic
/// reduce over (values, iota) whose body is a total order, so XLA may combine in any order.
fn lower_arg(b: &mut FnBuilder, x: &Value, dim: usize, max: bool) -> (Value, Value) {
    let dt = x.dtype();
    let idx = b.iota(x.dims(), dim, DType::I64);
    let init_v = b.scalar(dt, if max { lowest(dt) } else { highest(dt) });
    let init_i = b.scalar(DType::I64, i64::MAX);
    let mut r = b.reduce(&[x, &idx], &[&init_v, &init_i], &[dim], |b, a| {
        let (av, ai, bv, bi) = (&a[0], &a[1], &a[2], &a[3]);
        let an = b.compare(Cmp::Ne, av, av);
        let bn = b.compare(Cmp::Ne, bv, bv);
        let better = b.compare(if max { Cmp::Gt } else { Cmp::Lt }, bv, av);
        let eq = b.compare(Cmp::Eq, bv, av);
        let both_nan = b.ew("stablehlo.and", &[&an, &bn]);
        let tie = b.ew("stablehlo.or", &[&eq, &both_nan]);
        let lower = b.compare(Cmp::Lt, bi, ai);
        let tie_win = b.ew("stablehlo.and", &[&tie, &lower]);
        let a_num = b.ew("stablehlo.not", &[&an]);
        let nan_win = b.ew("stablehlo.and", &[&bn, &a_num]);
        let win = b.ew("stablehlo.or", &[&nan_win, &better]);
        let win = b.ew("stablehlo.or", &[&win, &tie_win]);
        vec![b.select(&win, bv, av), b.select(&win, bi, ai)]
    });
    let i = r.remove(1);
    (r.remove(0), i)
}

/// One reduction of `kind` over the dims `mask` marks, computed as the CPU kernel computes it
/// (widened, around the maximum for logsumexp) and converted to `out`.
fn lower_reduce(
    kind: ReduceKind,
    b: &mut FnBuilder,
    x: &Value,
    mask: &[bool],
    out: &Meta,
) -> Value {
    use ReduceKind::*;
    // A 0-dim input reduces as a 1-element vector.
    let (x, mask) = if x.ty.rank() == 0 {
        (b.reshape(x, &[1]), vec![true])
    } else {
        (x.clone(), mask.to_vec())
    };
    let dims: Vec<usize> = (0..mask.len()).filter(|&d| mask[d]).collect();
    let kept: Vec<i64> = (0..mask.len())
        .filter(|&d| !mask[d])
        .map(|d| d as i64)
        .collect();
    let n: usize = dims.iter().map(|&d| x.dims()[d]).product();
    let ct = kind.compute(x.dtype());
    let xc = b.convert(&x, ct);
    let v = match kind {
        Sum => sum_hlo(b, &xc, &dims),
        Prod => {
            let one = b.scalar(ct, 1);
            fold_hlo(b, &xc, &dims, one, "stablehlo.multiply")
        }
        Mean => {
            let s = sum_hlo(b, &xc, &dims);
            let nv = b.splat(s.ty.clone(), n as f64);
            b.ew("stablehlo.divide", &[&s, &nv])
        }
        Amax | Amin => extreme_hlo(b, &xc, &dims, kind == Amax),
        All | Any => {
            let init = b.scalar(DType::Bool, kind == All);
            let op = if kind == All {
                "stablehlo.and"
            } else {
                "stablehlo.or"
            };
            fold_hlo(b, &xc, &dims, init, op)
        }
        Var { correction } | Std { correction } => {
            let s = sum_hlo(b, &xc, &dims);
            let nv = b.splat(s.ty.clone(), n as f64);
            let mean = b.ew("stablehlo.divide", &[&s, &nv]);
            let mean = b.broadcast_in_dim(&mean, &kept, xc.dims());
            let d = b.ew("stablehlo.subtract", &[&xc, &mean]);
            let sq = b.ew("stablehlo.multiply", &[&d, &d]);
            let m2 = sum_hlo(b, &sq, &dims);
            let div = b.splat(m2.ty.clone(), (n as f64 - correction).max(0.0));
            let var = b.ew("stablehlo.divide", &[&m2, &div]);
            if matches!(kind, Std { .. }) {
                b.ew("stablehlo.sqrt", &[&var])
            } else {
                var
            }
        }
        LogSumExp => {
            let m = extreme_hlo(b, &xc, &dims, true);
            let am = b.ew("stablehlo.abs", &[&m]);
            let inf = b.splat(m.ty.clone(), f64::INFINITY);
            let is_inf = b.compare(Cmp::Eq, &am, &inf);
            let zero = b.splat(m.ty.clone(), 0);
            let center = b.select(&is_inf, &zero, &m);
            let cb = b.broadcast_in_dim(&center, &kept, xc.dims());
            let d = b.ew("stablehlo.subtract", &[&xc, &cb]);
            let e = b.ew("stablehlo.exponential", &[&d]);
            let s = sum_hlo(b, &e, &dims);
            let l = b.ew("stablehlo.log", &[&s]);
            b.ew("stablehlo.add", &[&l, &center])
        }
        Norm { p } => {
            let a = b.ew("stablehlo.abs", &[&xc]);
            if p.is_infinite() {
                extreme_hlo(b, &a, &dims, p > 0.0)
            } else if p == 0.0 {
                let zero = b.splat(xc.ty.clone(), 0);
                let one = b.splat(xc.ty.clone(), 1);
                let nz = b.compare(Cmp::Ne, &xc, &zero);
                let c = b.select(&nz, &one, &zero);
                sum_hlo(b, &c, &dims)
            } else if p == 1.0 {
                sum_hlo(b, &a, &dims)
            } else if p == 2.0 {
                let sq = b.ew("stablehlo.multiply", &[&xc, &xc]);
                let s = sum_hlo(b, &sq, &dims);
                b.ew("stablehlo.sqrt", &[&s])
            } else {
                let pv = b.splat(a.ty.clone(), p);
                let t = b.ew("stablehlo.power", &[&a, &pv]);
                let s = sum_hlo(b, &t, &dims);
                let inv = b.splat(s.ty.clone(), 1.0 / p);
                b.ew("stablehlo.power", &[&s, &inv])
            }
        }
    };
    let v = b.reshape(&v, &out.shape);
    b.convert(&v, out.dtype)
}
