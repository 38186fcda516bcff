//! Einsum in StableHLO: a diagonal is a gather of the dense value, every contraction one
//! `dot_general` lowered as the products lower theirs.

use tpu_tensor::{DType, Layout, Result};

use super::Einsum;
use super::eval::{Backend, run_einsum};
use super::spec::resolve;
use crate::hlo::lower::{Lowered, OpIo};
use crate::hlo::view::materialize_view;
use crate::hlo::{FnBuilder, Precision, TensorType, Value};
use crate::ops::linalg::lower::lower_dot_acc;

/// [`Einsum`] in StableHLO.
pub(super) fn einsum(op: &Einsum, b: &mut FnBuilder, io: OpIo) -> Lowered {
    let OpIo { inputs, outputs } = io;
    let shapes: Vec<&[usize]> = inputs.iter().map(|v| v.dims()).collect();
    let spec = resolve(&op.equation, &shapes)?;
    let mut be = HloBackend {
        b,
        dtype: outputs[0].dtype,
        precision: op.precision,
    };
    Ok(vec![run_einsum(&mut be, &spec, inputs)?])
}

/// Einsum's steps as StableHLO ops.
struct HloBackend<'a> {
    b: &'a mut FnBuilder,
    dtype: DType,
    precision: Precision,
}

impl Backend for HloBackend<'_> {
    type V = Value;

    fn diagonal(&mut self, v: &Value, dims: &[usize], groups: &[Vec<usize>]) -> Result<Value> {
        // Gathers the diagonal from the dense value, as a strided view of it would read.
        let dense = Layout::contiguous(dims);
        let layout = Layout {
            shape: groups.iter().map(|g| dims[g[0]]).collect(),
            strides: groups
                .iter()
                .map(|g| g.iter().map(|&d| dense.strides[d]).sum())
                .collect(),
            offset: 0,
        };
        Ok(materialize_view(self.b, v, &layout, dense.numel()))
    }

    fn expand(&mut self, v: &Value, to: &[usize]) -> Result<Value> {
        Ok(self.b.broadcast_to(v, to))
    }

    fn ones(&mut self, dims: &[usize]) -> Result<Value> {
        Ok(self.b.splat(TensorType::new(dims, self.dtype), 1))
    }

    fn dot(
        &mut self,
        a: &Value,
        b: &Value,
        batch: (&[usize], &[usize]),
        contract: (&[usize], &[usize]),
        out: &[usize],
    ) -> Result<Value> {
        let l = |d: &[usize]| -> Vec<i64> { d.iter().map(|&x| x as i64).collect() };
        let r = lower_dot_acc(
            self.b,
            a,
            b,
            (&l(batch.0), &l(batch.1)),
            (&l(contract.0), &l(contract.1)),
            out,
            self.precision,
        );
        // Each partial product is rounded to the operands' dtype before the next one.
        Ok(self.b.convert(&r, a.dtype()))
    }

    fn permute(&mut self, v: &Value, perm: &[usize], _out: &[usize]) -> Result<Value> {
        let p: Vec<i64> = perm.iter().map(|&x| x as i64).collect();
        Ok(self.b.transpose(v, &p))
    }
}
