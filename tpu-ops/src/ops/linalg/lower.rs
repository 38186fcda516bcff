//! The StableHLO lowerings of the products: one `dot_general` at the op's precision, in f32 for
//! the 16-bit floats and i32 for the narrow integers so that XLA agrees with the CPU kernels.

use tpu_tensor::DType;

use super::shape::plan;
use super::{Linear, Matmul};
use crate::hlo::lower::{Lowered, OpIo};
use crate::hlo::{FnBuilder, Precision, TensorType, Value};

/// [`Matmul`] in StableHLO: one `dot_general`, batched over the broadcast batch dims.
pub(super) fn matmul(op: &Matmul, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let p = plan(op.kind, inputs[0].dims(), inputs[1].dims())?;
    let x = if p.a_vec {
        b.reshape(&inputs[0], &[1, p.k])
    } else {
        inputs[0].clone()
    };
    let y = if p.b_vec {
        b.reshape(&inputs[1], &[p.k, 1])
    } else {
        inputs[1].clone()
    };
    let r = if y.ty.rank() == 2 {
        // x's batch dims are free dims of the product, already in the output's order.
        let xr = x.ty.rank() as i64;
        let mut dims = x.dims()[..x.ty.rank() - 1].to_vec();
        dims.push(p.n);
        lower_dot_acc(
            b,
            &x,
            &y,
            (&[], &[]),
            (&[xr - 1], &[0]),
            &dims,
            op.precision,
        )
    } else {
        let nb = p.batch.len();
        let mut xd = p.batch.clone();
        xd.extend([p.m, p.k]);
        let mut yd = p.batch.clone();
        yd.extend([p.k, p.n]);
        let x = b.broadcast_to(&x, &xd);
        let y = b.broadcast_to(&y, &yd);
        let bd = iota(0..nb);
        let mut dims = p.batch.clone();
        dims.extend([p.m, p.n]);
        let nb = nb as i64;
        lower_dot_acc(
            b,
            &x,
            &y,
            (&bd, &bd),
            (&[nb + 1], &[nb]),
            &dims,
            op.precision,
        )
    };
    let r = b.convert(&r, inputs[0].dtype());
    Ok(vec![b.reshape(&r, &outputs[0].shape)])
}

/// [`Linear`] in StableHLO: the bias is added in the accumulation dtype, before the rounding.
pub(super) fn linear(op: &Linear, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let (x, w) = (&inputs[0], &inputs[1]);
    let out = &outputs[0];
    let xr = x.ty.rank() as i64;
    let r = lower_dot_acc(
        b,
        x,
        w,
        (&[], &[]),
        (&[xr - 1], &[1]),
        &out.shape,
        op.precision,
    );
    let r = match inputs.get(2) {
        Some(bias) => {
            let bias = b.convert(bias, r.dtype());
            let bias = b.broadcast_to(&bias, &out.shape);
            b.ew("stablehlo.add", &[&r, &bias])
        }
        None => r,
    };
    Ok(vec![b.convert(&r, out.dtype)])
}

/// The dtype StableHLO multiplies in: f32 for the 16-bit floats, i32 for the narrow integers
/// (their products wrap to the same low bits), the dtype itself otherwise.
fn product_acc_dtype(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        DType::U8 | DType::I8 => DType::I32,
        d => d,
    }
}

/// `dot_general` in the accumulation dtype; the result stays in it (callers round it back to
/// the operands' dtype, or add a bias first).
pub(super) fn lower_dot_acc(
    b: &mut FnBuilder,
    x: &Value,
    y: &Value,
    batch: (&[i64], &[i64]),
    contract: (&[i64], &[i64]),
    dims: &[usize],
    precision: Precision,
) -> Value {
    let acc = product_acc_dtype(x.dtype());
    let xc = b.convert(x, acc);
    let yc = b.convert(y, acc);
    b.dot_general(
        &xc,
        &yc,
        batch,
        contract,
        TensorType::new(dims, acc),
        precision,
    )
}

/// The dims in `range`, as StableHLO's dim lists.
fn iota(range: std::ops::Range<usize>) -> Vec<i64> {
    range.map(|d| d as i64).collect()
}
