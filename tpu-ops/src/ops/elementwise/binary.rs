//! Elementwise binary ops with broadcasting and PyTorch's type promotion, and `where`.

use std::sync::Arc;

use tpu_tensor::{DType, Device, Element, Error, Generator, Result, Scalar, Tensor, with_element};

use crate::autograd::Saved;
use crate::cpu::kernels::{Reader, cpu_device, map2, map3, output_overwrite};
use crate::hlo::checks::DeviceCheck;
use crate::hlo::{Cmp, FnBuilder, Value};
use crate::op::promote::{compute_dtype, float_result, result_type};
use crate::op::{DTypeSet, Meta, OpDef, OpInfo};
use crate::ops::elementwise::methods::TensorOps;
use crate::ops::elementwise::unary::powi;
use crate::ops::movement::MovementOps;
use tpu_tensor::shape::broadcast_shapes;

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
    Pow,
    Maximum,
    Minimum,
    Atan2,
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
            Pow => "pow",
            Maximum => "maximum",
            Minimum => "minimum",
            Atan2 => "atan2",
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
            Sub | DivFloor | DivTrunc | Remainder | Pow => DTypeSet::NUMERIC,
            BitwiseAnd | BitwiseOr | BitwiseXor => DTypeSet::INT_BOOL,
        }
    }

    /// Every kind.
    pub fn all() -> Vec<BinaryKind> {
        use BinaryKind::*;
        vec![
            Add, Sub, Mul, Div, DivFloor, DivTrunc, Remainder, Pow, Maximum, Minimum, Atan2, Eq,
            Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr, LogicalXor, BitwiseAnd, BitwiseOr,
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

/// PyTorch's float floor division (`div_floor_floating`), exact at the edges.
fn div_floor_f64(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        return a / b;
    }
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        div -= 1.0;
    }
    if div != 0.0 {
        let mut fd = div.floor();
        if div - fd > 0.5 {
            fd += 1.0;
        }
        fd
    } else {
        0.0f64.copysign(a / b)
    }
}

fn div_floor_f32(a: f32, b: f32) -> f32 {
    if b == 0.0 {
        return a / b;
    }
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        div -= 1.0;
    }
    if div != 0.0 {
        let mut fd = div.floor();
        if div - fd > 0.5 {
            fd += 1.0;
        }
        fd
    } else {
        0.0f32.copysign(a / b)
    }
}

fn rem_f64(a: f64, b: f64) -> f64 {
    let m = a % b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        m + b
    } else {
        m
    }
}

fn rem_f32(a: f32, b: f32) -> f32 {
    let m = a % b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        m + b
    } else {
        m
    }
}

fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn min_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// Floats in compute precision.
trait Fl: Copy + Send + Sync + 'static {
    fn add(a: Self, b: Self) -> Self;
    fn sub(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    fn div(a: Self, b: Self) -> Self;
    fn div_floor(a: Self, b: Self) -> Self;
    fn div_trunc(a: Self, b: Self) -> Self;
    fn rem(a: Self, b: Self) -> Self;
    fn pow(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn atan2(a: Self, b: Self) -> Self;
}

impl Fl for f32 {
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
    fn sub(a: Self, b: Self) -> Self {
        a - b
    }
    fn mul(a: Self, b: Self) -> Self {
        a * b
    }
    fn div(a: Self, b: Self) -> Self {
        a / b
    }
    fn div_floor(a: Self, b: Self) -> Self {
        div_floor_f32(a, b)
    }
    fn div_trunc(a: Self, b: Self) -> Self {
        (a / b).trunc()
    }
    fn rem(a: Self, b: Self) -> Self {
        rem_f32(a, b)
    }
    fn pow(a: Self, b: Self) -> Self {
        a.powf(b)
    }
    fn max(a: Self, b: Self) -> Self {
        max_nan(a as f64, b as f64) as f32
    }
    fn min(a: Self, b: Self) -> Self {
        min_nan(a as f64, b as f64) as f32
    }
    fn atan2(a: Self, b: Self) -> Self {
        a.atan2(b)
    }
}

impl Fl for f64 {
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
    fn sub(a: Self, b: Self) -> Self {
        a - b
    }
    fn mul(a: Self, b: Self) -> Self {
        a * b
    }
    fn div(a: Self, b: Self) -> Self {
        a / b
    }
    fn div_floor(a: Self, b: Self) -> Self {
        div_floor_f64(a, b)
    }
    fn div_trunc(a: Self, b: Self) -> Self {
        (a / b).trunc()
    }
    fn rem(a: Self, b: Self) -> Self {
        rem_f64(a, b)
    }
    fn pow(a: Self, b: Self) -> Self {
        a.powf(b)
    }
    fn max(a: Self, b: Self) -> Self {
        max_nan(a, b)
    }
    fn min(a: Self, b: Self) -> Self {
        min_nan(a, b)
    }
    fn atan2(a: Self, b: Self) -> Self {
        a.atan2(b)
    }
}

fn float_fn<F: Fl>(k: BinaryKind) -> fn(F, F) -> F {
    use BinaryKind::*;
    match k {
        Add => F::add,
        Sub => F::sub,
        Mul => F::mul,
        Div => F::div,
        DivFloor => F::div_floor,
        DivTrunc => F::div_trunc,
        Remainder => F::rem,
        Pow => F::pow,
        Maximum => F::max,
        Minimum => F::min,
        Atan2 => F::atan2,
        _ => F::add,
    }
}

fn cmp_fn(k: BinaryKind) -> fn(f64, f64) -> bool {
    use BinaryKind::*;
    match k {
        Eq => |a, b| a == b,
        Ne => |a, b| a != b,
        Lt => |a, b| a < b,
        Le => |a, b| a <= b,
        Gt => |a, b| a > b,
        _ => |a, b| a >= b,
    }
}

fn int_cmp_fn(k: BinaryKind) -> fn(i64, i64) -> bool {
    use BinaryKind::*;
    match k {
        Eq => |a, b| a == b,
        Ne => |a, b| a != b,
        Lt => |a, b| a < b,
        Le => |a, b| a <= b,
        Gt => |a, b| a > b,
        _ => |a, b| a >= b,
    }
}

/// Integer arithmetic in i64, wrapped to the dtype by the store. Division by zero is reported
/// before this runs.
fn int_fn(k: BinaryKind) -> fn(i64, i64) -> i64 {
    use BinaryKind::*;
    match k {
        Add => |a, b| a.wrapping_add(b),
        Sub => |a, b| a.wrapping_sub(b),
        Mul => |a, b| a.wrapping_mul(b),
        DivTrunc => |a, b| a.wrapping_div(b),
        DivFloor => |a, b| {
            let q = a.wrapping_div(b);
            if (a % b != 0) && ((a < 0) != (b < 0)) {
                q - 1
            } else {
                q
            }
        },
        Remainder => |a, b| {
            let r = a.wrapping_rem(b);
            if r != 0 && ((r < 0) != (b < 0)) {
                r + b
            } else {
                r
            }
        },
        Pow => powi,
        Maximum => |a, b| a.max(b),
        Minimum => |a, b| a.min(b),
        BitwiseAnd => |a, b| a & b,
        BitwiseOr => |a, b| a | b,
        BitwiseXor => |a, b| a ^ b,
        _ => |a, _| a,
    }
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

    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>> {
        let metas: Vec<Meta> = inputs.iter().map(|t| Meta::of(t)).collect();
        let common = self.common_dtype(&metas);
        // Operands computed in: the promoted dtype, or its float for true division.
        let operand = match self.kind.out() {
            Out::Float => float_result(common),
            _ => common,
        };
        let out = &outputs[0];
        let kind = self.kind;
        let dev = cpu_device(kind.name(), inputs[0])?;
        let device = Device::from_cpu(dev.clone());
        let is_logical = matches!(
            kind,
            BinaryKind::LogicalAnd | BinaryKind::LogicalOr | BinaryKind::LogicalXor
        );
        // A Rust number keeps full precision in the compute dtype (f32 for 16-bit floats) rather
        // than being rounded to the tensor's dtype first, as PyTorch's opmath does.
        let cast_operand = |t: &Tensor, number: bool| -> Result<Tensor> {
            if is_logical {
                Ok(t.clone())
            } else if number && operand.is_float() {
                t.to_dtype(compute_dtype(operand))
            } else {
                t.to_dtype(operand)
            }
        };
        let a = cast_operand(inputs[0], self.numbers[0])?;
        let b = cast_operand(inputs[1], self.numbers[1])?;
        let r = Reader::new(&[&a, &b]);
        let shape = &out.shape;
        let t = if is_logical {
            let f: fn(bool, bool) -> bool = match kind {
                BinaryKind::LogicalAnd => |x, y| x && y,
                BinaryKind::LogicalOr => |x, y| x || y,
                _ => |x, y| x != y,
            };
            with_element!(a.dtype(), A, {
                with_element!(b.dtype(), B, {
                    let (da, db) = (r.data::<A>(&a)?, r.data::<B>(&b)?);
                    output_overwrite::<bool>(out, &device, |o| {
                        map2(&dev, (da, &a), (db, &b), shape, o, |x: A, y: B| {
                            f(x.to_f64() != 0.0, y.to_f64() != 0.0)
                        })
                    })?
                })
            })
        } else if operand.is_float() {
            let cmp = kind.out() == Out::Bool;
            macro_rules! go {
                ($A:ty, $B:ty, $O:ty) => {{
                    let (da, db) = (r.data::<$A>(&a)?, r.data::<$B>(&b)?);
                    if cmp {
                        float_compare::<$A, $B>(&dev, &device, (da, &a), (db, &b), out, kind)?
                    } else {
                        float_arith::<$A, $B, $O>(&dev, &device, (da, &a), (db, &b), out, kind)?
                    }
                }};
            }
            use tpu_tensor::{bf16, f16};
            match (a.dtype(), b.dtype()) {
                (DType::F32, DType::F32) => go!(f32, f32, f32),
                (DType::F64, DType::F64) => go!(f64, f64, f64),
                (DType::F16, DType::F16) => go!(f16, f16, f16),
                (DType::BF16, DType::BF16) => go!(bf16, bf16, bf16),
                (DType::F16, DType::F32) => go!(f16, f32, f16),
                (DType::F32, DType::F16) => go!(f32, f16, f16),
                (DType::BF16, DType::F32) => go!(bf16, f32, bf16),
                (DType::F32, DType::BF16) => go!(f32, bf16, bf16),
                (x, y) => {
                    return Err(Error::internal(
                        kind.name(),
                        format!("no float kernel for operands {x} and {y}"),
                    ));
                }
            }
        } else {
            with_element!(operand, T, {
                let (da, db) = (r.data::<T>(&a)?, r.data::<T>(&b)?);
                // As PyTorch: an empty output divides nothing, so it cannot fail.
                if matches!(
                    kind,
                    BinaryKind::DivFloor | BinaryKind::DivTrunc | BinaryKind::Remainder
                ) && (out.numel() > 0 && crate::cpu::kernels::any_zero(db, &b))
                {
                    return Err(division_by_zero(kind.name(), operand));
                }
                if kind.out() == Out::Bool {
                    let c = int_cmp_fn(kind);
                    output_overwrite::<bool>(out, &device, |o| {
                        map2(&dev, (da, &a), (db, &b), shape, o, |x: T, y: T| {
                            c(x.to_i64(), y.to_i64())
                        })
                    })?
                } else {
                    let f = int_fn(kind);
                    output_overwrite::<T>(out, &device, |o| {
                        map2(&dev, (da, &a), (db, &b), shape, o, |x: T, y: T| {
                            T::from_i64(f(x.to_i64(), y.to_i64()))
                        })
                    })?
                }
            })
        };
        Ok(vec![t])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let metas: Vec<Meta> = inputs
            .iter()
            .map(|v| Meta::new(v.dims(), v.dtype()))
            .collect();
        let common = self.common_dtype(&metas);
        let operand = match self.kind.out() {
            Out::Float => float_result(common),
            _ => common,
        };
        let shape = outputs[0].shape.to_vec();
        let kind = self.kind;
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
        let x = prep(&inputs[0], self.numbers[0]);
        let y = prep(&inputs[1], self.numbers[1]);
        let x = b.broadcast_to(&x, &shape);
        let y = b.broadcast_to(&y, &shape);
        use BinaryKind::*;
        let r = match kind {
            Add => b.ew(
                if comp == DType::Bool {
                    "stablehlo.or"
                } else {
                    "stablehlo.add"
                },
                &[&x, &y],
            ),
            Sub => b.ew("stablehlo.subtract", &[&x, &y]),
            Mul => b.ew(
                if comp == DType::Bool {
                    "stablehlo.and"
                } else {
                    "stablehlo.multiply"
                },
                &[&x, &y],
            ),
            Div => b.ew("stablehlo.divide", &[&x, &y]),
            DivTrunc => {
                let q = b.ew("stablehlo.divide", &[&x, &y]);
                if comp.is_float() { trunc(b, &q) } else { q }
            }
            DivFloor => lower_div_floor(b, &x, &y),
            Remainder => {
                let m = b.ew("stablehlo.remainder", &[&x, &y]);
                fix_sign(b, &m, &y, true)
            }
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

    fn lower_checks(
        &self,
        b: &mut FnBuilder,
        inputs: &[Value],
        outputs: &[Meta],
    ) -> Result<Vec<DeviceCheck>> {
        use BinaryKind::*;
        // As PyTorch: only divisions that are carried out can fail, so none when the output is
        // empty (and every divisor element is used otherwise).
        if !matches!(self.kind, DivFloor | DivTrunc | Remainder) || outputs[0].numel() == 0 {
            return Ok(Vec::new());
        }
        let metas: Vec<Meta> = inputs
            .iter()
            .map(|v| Meta::new(v.dims(), v.dtype()))
            .collect();
        let operand = self.common_dtype(&metas);
        if operand.is_float() {
            return Ok(Vec::new());
        }
        let y = b.convert(&inputs[1], operand);
        let zero = b.splat(y.ty.clone(), 0);
        let bad = b.compare(Cmp::Eq, &y, &zero);
        let name = self.kind.name();
        Ok(vec![DeviceCheck {
            value: crate::hlo::checks::first_offending(b, &bad, &y),
            error: Arc::new(move |_| division_by_zero(name, operand)),
        }])
    }

    fn has_backward(&self) -> bool {
        use BinaryKind::*;
        matches!(
            self.kind,
            Add | Sub
                | Mul
                | Div
                | DivFloor
                | DivTrunc
                | Remainder
                | Pow
                | Maximum
                | Minimum
                | Atan2
        )
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None, None]);
        };
        let (a, b, y) = (&saved.inputs[0], &saved.inputs[1], &saved.outputs[0]);
        let a = &a.to(g.dtype())?;
        let b = &b.to(g.dtype())?;
        use BinaryKind::*;
        let (ga, gb) = match self.kind {
            Add => (g.clone(), g.clone()),
            Sub => (g.clone(), g.neg()?),
            Mul => (g.mul(b)?, g.mul(a)?),
            Div => (g.div(b)?, g.mul(y)?.div(b)?.neg()?),
            // Piecewise constant: PyTorch's zero gradients (not none, so backward runs).
            DivFloor | DivTrunc => (g.zeros_like()?, g.zeros_like()?),
            Remainder => (g.clone(), g.mul(&a.div_floor(b)?)?.neg()?),
            Pow => {
                // PyTorch's formulas: d/da = b a^(b-1), selected as 0 where b == 0 (so 0^0
                // gives 0, not 0 * inf); d/db = a^b ln a, selected as 0 where a == 0 and
                // b >= 0, then multiplied by the gradient (a NaN gradient stays NaN there).
                let ga = g
                    .mul(&b.mul(&a.pow(&b.sub(1.0)?)?)?)?
                    .masked_fill(&b.eq(0.0)?, 0.0)?;
                let zero_base = a.eq(0.0)?.logical_and(&b.ge(0.0)?)?;
                let gb = g.mul(&y.mul(&a.log()?)?.masked_fill(&zero_base, 0.0)?)?;
                (ga, gb)
            }
            Maximum | Minimum => {
                // Equal elements split the gradient in half, as PyTorch.
                let (win_a, win_b) = if self.kind == Maximum {
                    (a.gt(b)?, b.gt(a)?)
                } else {
                    (a.lt(b)?, b.lt(a)?)
                };
                let tie = a.eq(b)?;
                let half = g.mul(0.5)?;
                let zero = g.zeros_like()?;
                let ga = where_(&win_a, g, &where_(&tie, &half, &zero)?)?;
                let gb = where_(&win_b, g, &where_(&tie, &half, &zero)?)?;
                (ga, gb)
            }
            Atan2 => {
                let r2 = a.square()?.add(&b.square()?)?;
                (g.mul(b)?.div(&r2)?, g.mul(a)?.div(&r2)?.neg()?)
            }
            _ => return Ok(vec![None, None]),
        };
        Ok(vec![Some(ga), Some(gb)])
    }
}

type CpuDev = tpu_tensor::tpu_runtime::CpuDevice;

/// Float arithmetic: operands converted to the compute precision (f64 for f64, else f32).
fn float_arith<A: Element, B: Element, O: Element>(
    dev: &CpuDev,
    device: &Device,
    a: (&[A], &Tensor),
    b: (&[B], &Tensor),
    out: &Meta,
    kind: BinaryKind,
) -> Result<Tensor> {
    // One inlined closure per kind: a function pointer in the inner loop would stop the
    // compiler from vectorising it.
    macro_rules! run {
        ($F:ty, $f:expr) => {
            output_overwrite::<O>(out, device, |o| {
                map2(dev, a, b, &out.shape, o, |x: A, y: B| {
                    O::from_f64($f(x.to_f64() as $F, y.to_f64() as $F) as f64)
                })
            })
        };
    }
    macro_rules! per_kind {
        ($F:ty) => {{
            use BinaryKind::*;
            match kind {
                Add => run!($F, <$F as Fl>::add),
                Sub => run!($F, <$F as Fl>::sub),
                Mul => run!($F, <$F as Fl>::mul),
                Div => run!($F, <$F as Fl>::div),
                Maximum => run!($F, <$F as Fl>::max),
                Minimum => run!($F, <$F as Fl>::min),
                _ => {
                    let f = float_fn::<$F>(kind);
                    output_overwrite::<O>(out, device, |o| {
                        map2(dev, a, b, &out.shape, o, |x: A, y: B| {
                            O::from_f64(f(x.to_f64() as $F, y.to_f64() as $F) as f64)
                        })
                    })
                }
            }
        }};
    }
    if O::DTYPE == DType::F64 {
        per_kind!(f64)
    } else {
        per_kind!(f32)
    }
}

/// Float comparisons, in the operands' compute precision.
fn float_compare<A: Element, B: Element>(
    dev: &CpuDev,
    device: &Device,
    a: (&[A], &Tensor),
    b: (&[B], &Tensor),
    out: &Meta,
    kind: BinaryKind,
) -> Result<Tensor> {
    let c = cmp_fn(kind);
    output_overwrite::<bool>(out, device, |o| {
        map2(dev, a, b, &out.shape, o, |x: A, y: B| {
            c(x.to_f64(), y.to_f64())
        })
    })
}

fn trunc(b: &mut FnBuilder, q: &Value) -> Value {
    let zero = b.splat(q.ty.clone(), 0);
    let neg = b.compare(Cmp::Lt, q, &zero);
    let c = b.ew("stablehlo.ceil", &[q]);
    let f = b.ew("stablehlo.floor", &[q]);
    b.select(&neg, &c, &f)
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

/// Applies a binary op to two tensors.
pub fn binary(a: &Tensor, b: &Tensor, kind: BinaryKind) -> Result<Tensor> {
    if let Some(r) = small_dense_f32(a, b, kind) {
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

/// Float arithmetic on two small dense f32 tensors of one shape on one CPU device, when no
/// dispatch hook watches and no gradient is to be recorded: the general path's metas, type
/// promotion, walk planning and op boxing cost several times the arithmetic there. Gives
/// exactly what [`crate::exec::dispatch::run1`] would (no promotion, broadcast or error can arise
/// for such operands, and the same f32 functions compute it), or `None` to take that path.
fn small_dense_f32(a: &Tensor, b: &Tensor, kind: BinaryKind) -> Option<Result<Tensor>> {
    use BinaryKind::*;
    if !matches!(kind, Add | Sub | Mul | Div | Maximum | Minimum) {
        return None;
    }
    let n = a.numel();
    let dense = a.dtype() == DType::F32
        && b.dtype() == DType::F32
        && n < crate::cpu::kernels::PAR_THRESHOLD
        && a.shape() == b.shape()
        && a.is_contiguous()
        && b.is_contiguous();
    if !dense || !crate::exec::fast::may_skip_dispatch(&[a, b]) {
        return None;
    }
    Some(small_dense_f32_run(a, b, n, kind))
}

fn small_dense_f32_run(a: &Tensor, b: &Tensor, n: usize, kind: BinaryKind) -> Result<Tensor> {
    let ga = a.storage().read();
    // One lock when both views share a storage: a second read lock could wait behind a writer.
    let gb = if Arc::ptr_eq(a.storage(), b.storage()) {
        None
    } else {
        Some(b.storage().read())
    };
    let da = dense_f32(&ga, a, n)?;
    let db = dense_f32(gb.as_deref().unwrap_or(&ga), b, n)?;
    Tensor::from_fn_overwrite::<f32>(a.shape(), a.device(), |o| {
        // One loop per kind: a function pointer in the loop would stop vectorisation.
        macro_rules! fill {
            ($g:expr) => {
                for ((o, &x), &y) in o.iter_mut().zip(da).zip(db) {
                    *o = $g(x, y);
                }
            };
        }
        use BinaryKind::*;
        match kind {
            Add => fill!(<f32 as Fl>::add),
            Sub => fill!(<f32 as Fl>::sub),
            Mul => fill!(<f32 as Fl>::mul),
            Div => fill!(<f32 as Fl>::div),
            Maximum => fill!(<f32 as Fl>::max),
            _ => fill!(<f32 as Fl>::min),
        }
        Ok(())
    })
}

/// The `n` elements of the dense f32 view `t` of the buffer `g`.
fn dense_f32<'g>(
    g: &'g tpu_tensor::tpu_runtime::Buffer,
    t: &Tensor,
    n: usize,
) -> Result<&'g [f32]> {
    let all = g
        .as_cpu()
        .ok_or_else(|| Error::invalid_argument("kernel", "expected a CPU buffer"))?
        .typed::<f32>()?;
    all.get(t.offset()..t.offset() + n)
        .ok_or_else(|| Error::invalid_argument("kernel", "input view exceeds its storage"))
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
    let s = number_tensor(v.into(), a.device())?;
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
    let s = number_tensor(v.into(), a.device())?;
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
        let out = &outputs[0];
        let c = inputs[0];
        let a = inputs[1].to_dtype(out.dtype)?;
        let b = inputs[2].to_dtype(out.dtype)?;
        let dev = cpu_device("where", c)?;
        let device = Device::from_cpu(dev.clone());
        let r = Reader::new(&[c, &a, &b]);
        let t = with_element!(out.dtype, T, {
            let (dc, da, db) = (r.data::<bool>(c)?, r.data::<T>(&a)?, r.data::<T>(&b)?);
            output_overwrite::<T>(out, &device, |o| {
                map3(
                    &dev,
                    (dc, c),
                    (da, &a),
                    (db, &b),
                    &out.shape,
                    o,
                    |k: bool, x: T, y: T| if k { x } else { y },
                )
            })?
        });
        Ok(vec![t])
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(&self, saved: &Saved, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None, None, None]);
        };
        let c = &saved.inputs[0];
        let zero = g.zeros_like()?;
        Ok(vec![
            None,
            Some(where_(c, g, &zero)?),
            Some(where_(c, &zero, g)?),
        ])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>> {
        let shape = outputs[0].shape.to_vec();
        let c = b.broadcast_to(&inputs[0], &shape);
        let x = b.convert(&inputs[1], outputs[0].dtype);
        let x = b.broadcast_to(&x, &shape);
        let y = b.convert(&inputs[2], outputs[0].dtype);
        let y = b.broadcast_to(&y, &shape);
        Ok(vec![b.select(&c, &x, &y)])
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
