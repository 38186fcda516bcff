//! Elementwise binary ops with broadcasting and PyTorch's type promotion, and `where`: the
//! kinds and their table columns, the op structs with their `OpDef`, and the table rows.

use std::sync::Arc;

use tpu_tensor::shape::broadcast_shapes;
use tpu_tensor::{DType, Device, Error, Generator, Result, Scalar, Tensor};

use crate::autograd::Saved;
use crate::hlo::{FnBuilder, Value};
use crate::op::promote::{float_result, result_type};
use crate::op::{DTypeSet, Meta, OpDef, OpInfo, op_parts};

mod cpu;
mod grad;
mod lower;

pub(crate) use cpu::{f32_operands, fuses_f32};

/// The binary ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum BinaryKind {
    Add,
    Sub,
    Mul,
    /// True division (integers give floats).
    Div,
    /// Division rounded toward negative infinity (`floor_divide`, `//`).
    DivFloor,
    /// Division rounded toward zero.
    DivTrunc,
    /// Remainder with the sign of the divisor (Python's `%`).
    Remainder,
    /// Remainder with the sign of the dividend (C's `fmod`, `torch.fmod`).
    Fmod,
    Pow,
    Maximum,
    Minimum,
    Atan2,
    /// ReLU's backward: the gradient `a` where the ReLU's output `b` is above 0, else 0
    /// (PyTorch's `threshold_backward(a, b, 0)`), in one pass where `le` and `masked_fill`
    /// took two and a bool tensor between them.
    ReluBackward,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    LogicalAnd,
    LogicalOr,
    LogicalXor,
    BitwiseAnd,
    BitwiseOr,
    BitwiseXor,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Out {
    /// The promoted dtype.
    Promoted,
    /// The promoted dtype, made float if it is not.
    Float,
    /// bool.
    Bool,
}

impl BinaryKind {
    /// The op's name.
    pub fn name(self) -> &'static str {
        use BinaryKind::*;
        match self {
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div => "div",
            DivFloor => "floor_divide",
            DivTrunc => "div_trunc",
            Remainder => "remainder",
            Fmod => "fmod",
            Pow => "pow",
            Maximum => "maximum",
            Minimum => "minimum",
            Atan2 => "atan2",
            ReluBackward => "relu_backward",
            Eq => "eq",
            Ne => "ne",
            Lt => "lt",
            Le => "le",
            Gt => "gt",
            Ge => "ge",
            LogicalAnd => "logical_and",
            LogicalOr => "logical_or",
            LogicalXor => "logical_xor",
            BitwiseAnd => "bitwise_and",
            BitwiseOr => "bitwise_or",
            BitwiseXor => "bitwise_xor",
        }
    }

    /// The arithmetic kinds (not comparisons, logical or bitwise ones): those with a backward
    /// rule, and those whose f32 form fuses.
    pub(crate) fn is_arithmetic(self) -> bool {
        use BinaryKind::*;
        matches!(
            self,
            Add | Sub
                | Mul
                | Div
                | DivFloor
                | DivTrunc
                | Remainder
                | Fmod
                | Pow
                | Maximum
                | Minimum
                | Atan2
                | ReluBackward
        )
    }

    fn out(self) -> Out {
        use BinaryKind::*;
        match self {
            Div | Atan2 => Out::Float,
            Eq | Ne | Lt | Le | Gt | Ge | LogicalAnd | LogicalOr | LogicalXor => Out::Bool,
            _ => Out::Promoted,
        }
    }

    /// Dtypes of the (promoted) operands the op accepts.
    fn dtypes(self) -> DTypeSet {
        use BinaryKind::*;
        match self {
            Add | Mul | Maximum | Minimum | Eq | Ne | Lt | Le | Gt | Ge => DTypeSet::ALL,
            LogicalAnd | LogicalOr | LogicalXor => DTypeSet::ALL,
            Div | Atan2 => DTypeSet::ALL,
            Sub | DivFloor | DivTrunc | Remainder | Fmod | Pow | ReluBackward => DTypeSet::NUMERIC,
            BitwiseAnd | BitwiseOr | BitwiseXor => DTypeSet::INT_BOOL,
        }
    }

    /// Every kind.
    pub fn all() -> Vec<BinaryKind> {
        use BinaryKind::*;
        vec![
            Add,
            Sub,
            Mul,
            Div,
            DivFloor,
            DivTrunc,
            Remainder,
            Fmod,
            Pow,
            Maximum,
            Minimum,
            Atan2,
            ReluBackward,
            Eq,
            Ne,
            Lt,
            Le,
            Gt,
            Ge,
            LogicalAnd,
            LogicalOr,
            LogicalXor,
            BitwiseAnd,
            BitwiseOr,
            BitwiseXor,
        ]
    }

    fn tolerance(self) -> f64 {
        match self {
            // XLA's CPU backend divides through a reciprocal: one unit in the last place.
            BinaryKind::Pow | BinaryKind::Atan2 | BinaryKind::Div => 1e-6,
            _ => 0.0,
        }
    }
}

/// An elementwise binary op. `numbers` marks operands that came from Rust numbers, which take
/// part in type promotion as PyTorch's wrapped numbers.
#[derive(Clone, Debug)]
pub struct Binary {
    /// Which op.
    pub kind: BinaryKind,
    /// Which operands are Rust numbers.
    pub numbers: [bool; 2],
}

/// The error of an integer division (or remainder) by zero.
fn division_by_zero(op: &str, operand: DType) -> Error {
    Error::invalid_argument(
        op,
        format!("integer division by zero (divisor of dtype {operand})"),
    )
}

impl Binary {
    fn operand_metas(&self, inputs: &[Meta]) -> Vec<Meta> {
        inputs
            .iter()
            .zip(self.numbers)
            .map(|(m, n)| Meta {
                number: n,
                ..m.clone()
            })
            .collect()
    }

    /// The dtype both operands are brought to before the op.
    fn common_dtype(&self, inputs: &[Meta]) -> DType {
        result_type(&self.operand_metas(inputs))
    }
}

impl OpDef for Binary {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn attrs(&self) -> String {
        format!("{:?}", self.numbers)
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let name = self.kind.name();
        let shape = broadcast_shapes(name, &inputs[0].shape, &inputs[1].shape)?;
        let common = self.common_dtype(inputs);
        let supported = self.kind.dtypes();
        // PyTorch refuses subtraction with any bool operand (tensor or number), whatever the
        // promoted dtype.
        let bool_sub = self.kind == BinaryKind::Sub
            && (inputs[0].dtype == DType::Bool || inputs[1].dtype == DType::Bool);
        if !supported.contains(common) || bool_sub {
            let supported = if !bool_sub {
                supported.to_string()
            } else if inputs[0].dtype == inputs[1].dtype {
                format!(
                    "{supported}, with no bool operand (for two bool tensors use logical_xor())"
                )
            } else {
                format!("{supported}, with no bool operand (to invert a mask, use logical_not())")
            };
            return Err(Error::UnsupportedDType {
                op: name.into(),
                given: format!(
                    "{} and {} (promoted to {common})",
                    inputs[0].dtype, inputs[1].dtype
                ),
                supported,
            });
        }
        let out = match self.kind.out() {
            Out::Promoted => common,
            Out::Float => float_result(common),
            Out::Bool => DType::Bool,
        };
        Ok(vec![Meta::new(&shape, out)])
    }

    op_parts! {
        cpu: cpu::binary_cpu,
        lower: lower::lower_binary,
        lower_checks: lower::division_checks,
    }

    fn has_backward(&self) -> bool {
        grad::has_backward(self.kind)
    }

    fn backward_reads(&self, input: usize, needs_grad: &[bool]) -> bool {
        grad::reads(self.kind, input, needs_grad)
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        grad::binary_backward(self.kind, saved, grads)
    }
}

/// Applies a binary op to two tensors.
pub fn binary(a: &Tensor, b: &Tensor, kind: BinaryKind) -> Result<Tensor> {
    if let Some(r) = cpu::small_dense_f32(cpu::Small::Tensor(a), cpu::Small::Tensor(b), kind) {
        return r;
    }
    crate::exec::dispatch::run1(
        &Binary {
            kind,
            numbers: [false, false],
        },
        &[a, b],
    )
}

/// The 0-dim tensor of a Rust number on `device`, kept at full precision (f64, i64 or bool).
pub fn number_tensor(v: Scalar, device: &Device) -> Result<Tensor> {
    match v {
        Scalar::Bool(x) => Tensor::scalar(x, device),
        Scalar::Int(x) => Tensor::scalar(x, device),
        Scalar::Float(x) => Tensor::scalar(x, device),
    }
}

/// Applies a binary op to a tensor and a Rust number (`a op v`).
pub fn binary_scalar(a: &Tensor, v: impl Into<Scalar>, kind: BinaryKind) -> Result<Tensor> {
    let v = v.into();
    if let Some(n) = cpu::number_f32(v) {
        let number = cpu::Small::Number(n);
        if let Some(r) = cpu::small_dense_f32(cpu::Small::Tensor(a), number, kind) {
            return r;
        }
    }
    let s = number_tensor(v, a.device())?;
    crate::exec::dispatch::run1(
        &Binary {
            kind,
            numbers: [false, true],
        },
        &[a, &s],
    )
}

/// Applies a binary op to a Rust number and a tensor (`v op a`).
pub fn scalar_binary(v: impl Into<Scalar>, a: &Tensor, kind: BinaryKind) -> Result<Tensor> {
    let v = v.into();
    if let Some(n) = cpu::number_f32(v) {
        let number = cpu::Small::Number(n);
        if let Some(r) = cpu::small_dense_f32(number, cpu::Small::Tensor(a), kind) {
            return r;
        }
    }
    let s = number_tensor(v, a.device())?;
    crate::exec::dispatch::run1(
        &Binary {
            kind,
            numbers: [true, false],
        },
        &[&s, a],
    )
}

/// `torch.where(cond, a, b)`: elements of `a` where `cond` is true, of `b` elsewhere.
#[derive(Clone, Debug)]
pub struct Where;

impl OpDef for Where {
    fn name(&self) -> &'static str {
        "where"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        if inputs[0].dtype != DType::Bool {
            return Err(Error::DTypeMismatch {
                context: "where: condition".into(),
                expected: DType::Bool,
                given: inputs[0].dtype,
            });
        }
        let s = broadcast_shapes("where", &inputs[0].shape, &inputs[1].shape)?;
        let s = broadcast_shapes("where", &s, &inputs[2].shape)?;
        Ok(vec![Meta::new(&s, result_type(&inputs[1..]))])
    }

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        cpu::where_cpu(inputs, outputs)
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        grad::where_backward(saved, grads)
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        lower::lower_where(b, inputs, outputs)
    }
}

/// `torch.where(cond, a, b)`.
pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    crate::exec::dispatch::run1(&Where, &[cond, a, b])
}

fn sample(kind: BinaryKind, dtype: DType, device: &Device) -> Result<Vec<Tensor>> {
    let cpu = Device::cpu();
    let mut g = Generator::new(5);
    let (a, b) = if dtype.is_float() {
        let a = crate::op::samples::host_map(&g.randn([3, 4], DType::F64, &cpu)?, |v| v * 4.0)?;
        let b = crate::op::samples::host_map(&g.randn([4], DType::F64, &cpu)?, |v| v * 4.0)?;
        (a, b)
    } else if dtype == DType::Bool {
        (
            g.randint(0, 2, [3, 4], DType::Bool, &cpu)?,
            g.randint(0, 2, [4], DType::Bool, &cpu)?,
        )
    } else {
        // Non-zero divisors; small exponents keep integer powers in range.
        let a = g.randint(-20, 20, [3, 4], DType::I64, &cpu)?;
        let b = crate::op::samples::host_map(
            &g.randint(1, 6, [4], DType::I64, &cpu)?
                .to_dtype(DType::F64)?,
            |v| {
                if v as i64 % 2 == 0 { -v } else { v }
            },
        )?;
        let b = if kind == BinaryKind::Pow {
            crate::op::samples::host_map(&b, |v| v.abs().min(4.0))?
        } else {
            b
        };
        (a, b)
    };
    let a = a.to_dtype(dtype)?.to_device(device)?;
    let b = b.to_dtype(dtype)?.to_device(device)?;
    let mut out = vec![
        binary(&a, &b, kind)?,
        binary(&a.t()?, &b.unsqueeze(1)?, kind)?,
    ];
    if dtype != DType::Bool
        && !matches!(
            kind,
            BinaryKind::BitwiseAnd | BinaryKind::BitwiseOr | BinaryKind::BitwiseXor
        )
    {
        out.push(binary_scalar(
            &a,
            if dtype.is_float() {
                Scalar::Float(1.5)
            } else {
                Scalar::Int(3)
            },
            kind,
        )?);
    }
    Ok(out)
}

/// The rows of the op table for binary ops and `where`.
pub fn table() -> Vec<OpInfo> {
    let mut rows: Vec<OpInfo> = BinaryKind::all()
        .into_iter()
        .map(|k| OpInfo {
            name: k.name(),
            cpu: k.dtypes(),
            hlo: k.dtypes(),
            sample: Arc::new(move |d, dev| sample(k, d, dev)),
            tolerance: k.tolerance(),
        })
        .collect();
    rows.push(OpInfo {
        name: "where",
        cpu: DTypeSet::ALL,
        hlo: DTypeSet::ALL,
        sample: Arc::new(|d, dev| {
            let cpu = Device::cpu();
            let mut g = Generator::new(9);
            let c = g.randint(0, 2, [2, 3], DType::Bool, &cpu)?.to_device(dev)?;
            let a = g
                .randint(-5, 5, [2, 3], DType::I64, &cpu)?
                .to_dtype(d)?
                .to_device(dev)?;
            let b = g
                .randint(-5, 5, [3], DType::I64, &cpu)?
                .to_dtype(d)?
                .to_device(dev)?;
            Ok(vec![where_(&c, &a, &b)?])
        }),
        tolerance: 0.0,
    });
    rows
}
