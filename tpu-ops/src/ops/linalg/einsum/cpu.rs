//! Einsum on the CPU: diagonals and permutations are views, and every contraction is one call
//! of the products' batched kernel.

use tpu_tensor::{DType, Device, Result, Tensor};

use super::Einsum;
use super::eval::{Backend, run_einsum};
use super::spec::resolve;
use crate::op::Meta;
use crate::ops::linalg::cpu::product_cpu;

/// [`Einsum`] on the CPU.
pub(super) fn einsum(op: &Einsum, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let spec = resolve(&op.equation, &shapes)?;
    let mut be = CpuBackend {
        dtype: outputs[0].dtype,
        device: inputs[0].device().clone(),
    };
    let vals: Vec<Tensor> = inputs.iter().map(|&t| t.clone()).collect();
    let r = run_einsum(&mut be, &spec, &vals)?;
    // A result that is still a view of an operand (a permutation, a diagonal) gets its own
    // storage, as a product's would.
    let r = if inputs.iter().any(|t| t.shares_storage(&r)) {
        r.copy()?
    } else {
        r.contiguous()?
    };
    Ok(vec![r])
}

/// Einsum's steps as tensor views and [`product_cpu`] calls.
struct CpuBackend {
    dtype: DType,
    device: Device,
}

impl Backend for CpuBackend {
    type V = Tensor;

    fn diagonal(&mut self, v: &Tensor, _dims: &[usize], groups: &[Vec<usize>]) -> Result<Tensor> {
        let shape: Vec<usize> = groups.iter().map(|g| v.shape()[g[0]]).collect();
        let strides: Vec<usize> = groups
            .iter()
            .map(|g| g.iter().map(|&d| v.strides()[d]).sum())
            .collect();
        v.as_strided(&shape, &strides, v.offset())
    }

    fn expand(&mut self, v: &Tensor, to: &[usize]) -> Result<Tensor> {
        v.expand(to)
    }

    fn ones(&mut self, dims: &[usize]) -> Result<Tensor> {
        Tensor::ones(dims, self.dtype, &self.device)
    }

    fn dot(
        &mut self,
        a: &Tensor,
        b: &Tensor,
        batch: (&[usize], &[usize]),
        contract: (&[usize], &[usize]),
        out: &[usize],
    ) -> Result<Tensor> {
        let free = |t: &Tensor, x: &[usize], y: &[usize]| -> Vec<usize> {
            (0..t.rank())
                .filter(|d| !x.contains(d) && !y.contains(d))
                .collect()
        };
        let af = free(a, batch.0, contract.0);
        let bf = free(b, batch.1, contract.1);
        let size =
            |t: &Tensor, ds: &[usize]| -> usize { ds.iter().map(|&d| t.shape()[d]).product() };
        let (nb, m, k, n) = (
            size(a, batch.0),
            size(a, &af),
            size(a, contract.0),
            size(b, &bf),
        );
        let pa: Vec<usize> = batch
            .0
            .iter()
            .chain(&af)
            .chain(contract.0)
            .copied()
            .collect();
        let pb: Vec<usize> = batch
            .1
            .iter()
            .chain(contract.1)
            .chain(&bf)
            .copied()
            .collect();
        let a3 = a.permute(pa)?.reshape([nb, m, k])?;
        let b3 = b.permute(pb)?.reshape([nb, k, n])?;
        product_cpu("einsum", &a3, &b3, None, &[nb], &Meta::new(out, self.dtype))
    }

    fn permute(&mut self, v: &Tensor, perm: &[usize], _out: &[usize]) -> Result<Tensor> {
        v.permute(perm)
    }
}
