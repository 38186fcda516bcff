//! The StableHLO lowerings of the binary ops and `where`, with PyTorch's integer division,
//! modulo and power spelled out, and the device check of integer division by zero.

use std::sync::Arc;

use tpu_tensor::{DType, Result};

use super::{Binary, BinaryKind, Out, division_by_zero};
use crate::hlo::checks::DeviceCheck;
use crate::hlo::lower::{Checks, Lowered, OpIo};
use crate::hlo::{Cmp, FnBuilder, Value};
use crate::op::Meta;
use crate::op::promote::{compute_dtype, float_result};
use crate::ops::elementwise::unary::lower::trunc_float;

/// `op` of `inputs`, broadcast to `outputs[0]`'s shape and converted to its dtype.
pub(super) fn lower_binary(op: &Binary, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let metas: Vec<Meta> = inputs.iter().map(Meta::of_value).collect();
    let common = op.common_dtype(&metas);
    let operand = match op.kind.out() {
        Out::Float => float_result(common),
        _ => common,
    };
    let shape = outputs[0].shape.to_vec();
    let kind = op.kind;
    let is_logical = matches!(
        kind,
        BinaryKind::LogicalAnd | BinaryKind::LogicalOr | BinaryKind::LogicalXor
    );
    let comp = if is_logical {
        DType::Bool
    } else {
        compute_dtype(operand)
    };
    // As on the CPU: tensors are first rounded to the operand dtype, float numbers go
    // straight to the compute dtype.
    let mut prep = |v: &Value, number: bool| {
        let v = if is_logical || (number && operand.is_float()) {
            v.clone()
        } else {
            b.convert(v, operand)
        };
        b.convert(&v, comp)
    };
    let x = prep(&inputs[0], op.numbers[0]);
    let y = prep(&inputs[1], op.numbers[1]);
    let x = b.broadcast_to(&x, &shape);
    let y = b.broadcast_to(&y, &shape);
    // Bool adds and multiplies are `or` and `and`, which StableHLO spells apart.
    let on_bool = |logical: &'static str, arith: &'static str| {
        if comp == DType::Bool { logical } else { arith }
    };
    use BinaryKind::*;
    let r = match kind {
        Add => b.ew(on_bool("stablehlo.or", "stablehlo.add"), &[&x, &y]),
        Sub => b.ew("stablehlo.subtract", &[&x, &y]),
        Mul => b.ew(on_bool("stablehlo.and", "stablehlo.multiply"), &[&x, &y]),
        Div => b.ew("stablehlo.divide", &[&x, &y]),
        DivTrunc => {
            let q = b.ew("stablehlo.divide", &[&x, &y]);
            if comp.is_float() {
                trunc_float(b, &q)
            } else {
                q
            }
        }
        DivFloor => lower_div_floor(b, &x, &y),
        Remainder => {
            let m = b.ew("stablehlo.remainder", &[&x, &y]);
            fix_sign(b, &m, &y, true)
        }
        // StableHLO's remainder is C's fmod: the dividend's sign.
        Fmod => b.ew("stablehlo.remainder", &[&x, &y]),
        Pow => {
            if comp.is_float() {
                b.ew("stablehlo.power", &[&x, &y])
            } else {
                lower_powi(b, &x, &y)
            }
        }
        Maximum => b.extreme(&x, &y, true),
        Minimum => b.extreme(&x, &y, false),
        Atan2 => b.ew("stablehlo.atan2", &[&x, &y]),
        ReluBackward => {
            // y <= 0 ? 0 : g, so a NaN `y` keeps `g` as the CPU kernel does.
            let zero = b.splat(y.ty.clone(), 0);
            let off = b.compare(Cmp::Le, &y, &zero);
            b.select(&off, &zero, &x)
        }
        Eq => b.compare(Cmp::Eq, &x, &y),
        Ne => b.compare(Cmp::Ne, &x, &y),
        Lt => b.compare(Cmp::Lt, &x, &y),
        Le => b.compare(Cmp::Le, &x, &y),
        Gt => b.compare(Cmp::Gt, &x, &y),
        Ge => b.compare(Cmp::Ge, &x, &y),
        LogicalAnd => b.ew("stablehlo.and", &[&x, &y]),
        LogicalOr => b.ew("stablehlo.or", &[&x, &y]),
        LogicalXor => b.ew("stablehlo.xor", &[&x, &y]),
        BitwiseAnd => b.ew("stablehlo.and", &[&x, &y]),
        BitwiseOr => b.ew("stablehlo.or", &[&x, &y]),
        BitwiseXor => b.ew("stablehlo.xor", &[&x, &y]),
    };
    Ok(vec![b.convert(&r, outputs[0].dtype)])
}

/// The device check of an integer division: no divisor is zero.
pub(super) fn division_checks(op: &Binary, b: &mut FnBuilder, io: OpIo) -> Checks {
    let OpIo { inputs, outputs } = io;
    use BinaryKind::*;
    // As PyTorch: only divisions that are carried out can fail, so none when the output is
    // empty (and every divisor element is used otherwise).
    if !matches!(op.kind, DivFloor | DivTrunc | Remainder | Fmod) || outputs[0].numel() == 0 {
        return Ok(Vec::new());
    }
    let metas: Vec<Meta> = inputs.iter().map(Meta::of_value).collect();
    let operand = op.common_dtype(&metas);
    if operand.is_float() {
        return Ok(Vec::new());
    }
    let y = b.convert(&inputs[1], operand);
    let zero = b.splat(y.ty.clone(), 0);
    let bad = b.compare(Cmp::Eq, &y, &zero);
    let name = op.kind.name();
    Ok(vec![DeviceCheck {
        value: crate::hlo::checks::first_offending(b, &bad, &y),
        error: Arc::new(move |_| division_by_zero(name, operand)),
    }])
}

/// `m + y` where `m` is non-zero and its sign differs from `y`'s: fmod turned into Python's
/// modulo (`add = true`), or the quotient correction for floor division.
fn fix_sign(b: &mut FnBuilder, m: &Value, y: &Value, add: bool) -> Value {
    let zero = b.splat(m.ty.clone(), 0);
    let nz = b.compare(Cmp::Ne, m, &zero);
    let mneg = b.compare(Cmp::Lt, m, &zero);
    let yneg = b.compare(Cmp::Lt, y, &zero);
    let differ = b.ew("stablehlo.xor", &[&mneg, &yneg]);
    let fix = b.ew("stablehlo.and", &[&nz, &differ]);
    let adjusted = if add {
        b.ew("stablehlo.add", &[m, y])
    } else {
        let one = b.splat(m.ty.clone(), 1);
        b.ew("stablehlo.subtract", &[m, &one])
    };
    b.select(&fix, &adjusted, m)
}

fn lower_div_floor(b: &mut FnBuilder, x: &Value, y: &Value) -> Value {
    if !x.dtype().is_float() {
        // Truncating quotient, minus one where the remainder is non-zero and signs differ.
        let q = b.ew("stablehlo.divide", &[x, y]);
        let r = b.ew("stablehlo.remainder", &[x, y]);
        let zero = b.splat(r.ty.clone(), 0);
        let nz = b.compare(Cmp::Ne, &r, &zero);
        let xneg = b.compare(Cmp::Lt, x, &zero);
        let yneg = b.compare(Cmp::Lt, y, &zero);
        let differ = b.ew("stablehlo.xor", &[&xneg, &yneg]);
        let fix = b.ew("stablehlo.and", &[&nz, &differ]);
        let one = b.splat(q.ty.clone(), 1);
        let qm = b.ew("stablehlo.subtract", &[&q, &one]);
        return b.select(&fix, &qm, &q);
    }
    // PyTorch's div_floor_floating, step for step.
    let m = b.ew("stablehlo.remainder", &[x, y]);
    let xm = b.ew("stablehlo.subtract", &[x, &m]);
    let div = b.ew("stablehlo.divide", &[&xm, y]);
    let zero = b.splat(m.ty.clone(), 0);
    let one = b.splat(m.ty.clone(), 1);
    let half = b.splat(m.ty.clone(), 0.5);
    let mnz = b.compare(Cmp::Ne, &m, &zero);
    let mneg = b.compare(Cmp::Lt, &m, &zero);
    let yneg = b.compare(Cmp::Lt, y, &zero);
    let differ = b.ew("stablehlo.xor", &[&yneg, &mneg]);
    let fix = b.ew("stablehlo.and", &[&mnz, &differ]);
    let divm1 = b.ew("stablehlo.subtract", &[&div, &one]);
    let div = b.select(&fix, &divm1, &div);
    let fd = b.ew("stablehlo.floor", &[&div]);
    let frac = b.ew("stablehlo.subtract", &[&div, &fd]);
    let up = b.compare(Cmp::Gt, &frac, &half);
    let fd1 = b.ew("stablehlo.add", &[&fd, &one]);
    let fd = b.select(&up, &fd1, &fd);
    // div == 0: a signed zero with the sign of x / y.
    let q = b.ew("stablehlo.divide", &[x, y]);
    let signed_zero = {
        let s = b.ew("stablehlo.sign", &[&q]);
        b.ew("stablehlo.multiply", &[&zero, &s])
    };
    let dz = b.compare(Cmp::Eq, &div, &zero);
    let r = b.select(&dz, &signed_zero, &fd);
    // y == 0: x / y (inf or nan), as PyTorch.
    let yz = b.compare(Cmp::Eq, y, &zero);
    b.select(&yz, &q, &r)
}

/// Integer power by repeated squaring over the exponent's 64 bits, with PyTorch's results for
/// negative exponents.
fn lower_powi(b: &mut FnBuilder, x: &Value, y: &Value) -> Value {
    let ty = x.ty.clone();
    let zero = b.splat(ty.clone(), 0);
    let one = b.splat(ty.clone(), 1);
    let mut acc = one.clone();
    let mut base = x.clone();
    let mut e = y.clone();
    let bits = x.dtype().size_in_bytes() * 8;
    for _ in 0..bits.min(64) {
        let lowbit = b.ew("stablehlo.and", &[&e, &one]);
        let odd = b.compare(Cmp::Ne, &lowbit, &zero);
        let prod = b.ew("stablehlo.multiply", &[&acc, &base]);
        acc = b.select(&odd, &prod, &acc);
        base = b.ew("stablehlo.multiply", &[&base, &base]);
        e = b.ew("stablehlo.shift_right_logical", &[&e, &one]);
    }
    // Negative exponents: 1 for base 1, +-1 for base -1, else 0.
    let neg = b.compare(Cmp::Lt, y, &zero);
    let minus_one = b.splat(ty.clone(), -1);
    let is_one = b.compare(Cmp::Eq, x, &one);
    let is_m1 = b.compare(Cmp::Eq, x, &minus_one);
    let ylow = b.ew("stablehlo.and", &[y, &one]);
    let yodd = b.compare(Cmp::Ne, &ylow, &zero);
    let m1res = b.select(&yodd, &minus_one, &one);
    let r = b.select(&is_m1, &m1res, &zero);
    let r = b.select(&is_one, &one, &r);
    b.select(&neg, &r, &acc)
}

/// `where` as a select of the broadcast operands in the output dtype.
pub(super) fn lower_where(
    b: &mut FnBuilder,
    inputs: &[Value],
    outputs: &[Meta],
) -> Result<Vec<Value>> {
    let shape = outputs[0].shape.to_vec();
    let c = b.broadcast_to(&inputs[0], &shape);
    let x = b.convert(&inputs[1], outputs[0].dtype);
    let x = b.broadcast_to(&x, &shape);
    let y = b.convert(&inputs[2], outputs[0].dtype);
    let y = b.broadcast_to(&y, &shape);
    Ok(vec![b.select(&c, &x, &y)])
}
