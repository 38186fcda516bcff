//! The einsum op: `spec.rs` parses and resolves equations, `eval.rs` evaluates them as a
//! sequence of products on either backend (`cpu.rs`, `lower.rs`), and `grad.rs` writes each
//! operand's gradient as another einsum.

mod cpu;
mod eval;
mod grad;
mod lower;
mod spec;

use tpu_tensor::{Result, Tensor};

use self::spec::resolve;
use super::matmul_precision;
use super::shape::common_dtype;
use crate::hlo::Precision;
use crate::op::{Meta, OpDef, op_parts};

/// `torch.einsum(equation, *operands)`: explicit (`ij,jk->ik`) and implicit (`ij,jk`) outputs,
/// `...` for broadcast leading dims, repeated subscripts for diagonals, any number of operands
/// (contracted left to right). Sizes of one subscript must match or be 1.
#[derive(Clone, Debug)]
pub struct Einsum {
    /// The equation, as given.
    pub equation: String,
    /// Precision of the StableHLO `dot_general`s.
    pub precision: Precision,
}

impl OpDef for Einsum {
    fn name(&self) -> &'static str {
        "einsum"
    }

    fn attrs(&self) -> String {
        format!("{}|{:?}", self.equation, self.precision)
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let shapes: Vec<&[usize]> = inputs.iter().map(|m| &m.shape[..]).collect();
        let spec = resolve(&self.equation, &shapes)?;
        let names: Vec<String> = (0..inputs.len()).map(|i| format!("operand {i}")).collect();
        let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        let d = common_dtype("einsum", inputs, &names)?;
        Ok(vec![Meta::new(&spec.sizes_of(&spec.output), d)])
    }

    op_parts! {
        cpu: cpu::einsum,
        lower: lower::einsum,
        grad: grad::einsum,
    }
}

/// `torch.einsum(equation, operands)`.
pub fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
    crate::exec::dispatch::run1(
        &Einsum {
            equation: equation.to_string(),
            precision: matmul_precision(),
        },
        operands,
    )
}
