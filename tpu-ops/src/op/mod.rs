//! The op contract: what every op defines ([`OpDef`]), the shapes and dtypes it reasons about
//! ([`Meta`], [`DTypeSet`]), type promotion ([`promote`]), the op table ([`table`]) and what
//! of PyTorch's Core ATen opset it covers ([`core_aten`]).

pub mod args;
pub mod core_aten;
pub mod promote;
pub mod samples;
pub mod table;

pub use table::{OpInfo, Sample, op_table, op_table_parts};

use std::fmt;
use std::sync::Arc;

use tpu_tensor::{DType, Dims, Result, Tensor};

use crate::hlo::checks::DeviceCheck;
use crate::hlo::{FnBuilder, TensorType, Value};

/// Shape and dtype of a tensor, without its data.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Meta {
    /// Dimensions.
    pub shape: Dims,
    /// Element type.
    pub dtype: DType,
    /// True for a 0-dim tensor made from a Rust number (`x + 2.0`): it takes part in type
    /// promotion as PyTorch's "wrapped numbers" do, never widening the other operand's dtype
    /// within its category.
    pub number: bool,
}

impl Meta {
    /// A meta of a shape and dtype.
    pub fn new(shape: &[usize], dtype: DType) -> Meta {
        Meta {
            shape: shape.into(),
            dtype,
            number: false,
        }
    }

    /// The meta of a tensor.
    pub fn of(t: &Tensor) -> Meta {
        Meta::new(t.shape(), t.dtype())
    }

    /// The meta of a value being lowered.
    pub fn of_value(v: &Value) -> Meta {
        Meta::new(v.dims(), v.dtype())
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Rank.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The StableHLO type.
    pub fn ty(&self) -> TensorType {
        TensorType::new(&self.shape, self.dtype)
    }
}

/// A set of dtypes (for support tables and dtype checks).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DTypeSet(u16);

fn bit(d: DType) -> u16 {
    1 << DType::ALL.iter().position(|&x| x == d).unwrap_or(0)
}

impl DTypeSet {
    /// No dtype.
    pub const NONE: DTypeSet = DTypeSet(0);
    /// f16, bf16, f32, f64.
    pub const FLOAT: DTypeSet = DTypeSet(0b1_1110_0000);
    /// u8, i8, i32, i64.
    pub const INT: DTypeSet = DTypeSet(0b0_0001_1110);
    /// bool.
    pub const BOOL: DTypeSet = DTypeSet(0b0_0000_0001);
    /// Integers and floats.
    pub const NUMERIC: DTypeSet = DTypeSet(0b1_1111_1110);
    /// Every dtype.
    pub const ALL: DTypeSet = DTypeSet(0b1_1111_1111);
    /// Integers and bool.
    pub const INT_BOOL: DTypeSet = DTypeSet(0b0_0001_1111);
    /// Signed integers and floats.
    pub const SIGNED: DTypeSet = DTypeSet(0b1_1111_1100);

    /// The set holding exactly these dtypes.
    pub fn of(dtypes: &[DType]) -> DTypeSet {
        DTypeSet(dtypes.iter().fold(0, |a, &d| a | bit(d)))
    }

    /// True when `d` is in the set.
    pub fn contains(self, d: DType) -> bool {
        self.0 & bit(d) != 0
    }

    /// Union.
    pub fn union(self, o: DTypeSet) -> DTypeSet {
        DTypeSet(self.0 | o.0)
    }

    /// Intersection.
    pub fn intersect(self, o: DTypeSet) -> DTypeSet {
        DTypeSet(self.0 & o.0)
    }

    /// The dtypes, in promotion order.
    pub fn iter(self) -> impl Iterator<Item = DType> {
        DType::ALL.into_iter().filter(move |&d| self.contains(d))
    }
}

impl fmt::Display for DTypeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(|d| d.name()).collect();
        f.write_str(&names.join(", "))
    }
}

impl fmt::Debug for DTypeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{self}}}")
    }
}

/// One op: its shape and dtype rule, its native CPU kernel and its StableHLO lowering.
///
/// An op value carries its attributes (the dims of a reduction, the kind of a unary op, ...).
/// Dispatch checks devices, calls [`OpDef::infer`], and then runs [`OpDef::cpu`] on the native
/// CPU device or compiles [`OpDef::lower`] for a PJRT device. The graph layer calls `lower` on
/// many ops to build one program.
pub trait OpDef: BoxedOp + Send + Sync + fmt::Debug + 'static {
    /// The op's name (PyTorch's where one exists).
    fn name(&self) -> &'static str;

    /// The attributes as a stable string; part of the compile-cache key. The op value's `Debug`
    /// form unless an op says otherwise (one whose attributes include process-wide settings).
    fn attrs(&self) -> String {
        format!("{self:?}")
    }

    /// Output shapes and dtypes from the inputs', or an error saying what was expected and what
    /// was given (shapes, dtypes, dims).
    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>>;

    /// The native CPU kernel. Inputs live on one native CPU device and may have any strides.
    fn cpu(&self, inputs: &[&Tensor], outputs: &[Meta]) -> Result<Vec<Tensor>>;

    /// The StableHLO lowering: emits instructions computing the outputs from dense inputs.
    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], outputs: &[Meta]) -> Result<Vec<Value>>;

    /// The data-dependent checks of the CPU kernel (indices in range, no integer division by
    /// zero), for devices whose programs cannot stop: emitted into the same function as
    /// [`OpDef::lower`], from the same inputs, each as a value naming the first offending
    /// element plus the error to raise from it (see [`crate::hlo::checks`]). Callers include them
    /// when [`crate::hlo::checks::device_checks`] is on: the eager path as extra outputs of the op's
    /// module, a graph compiler as extra outputs of the graph. Most ops have none.
    fn lower_checks(
        &self,
        b: &mut FnBuilder,
        inputs: &[Value],
        outputs: &[Meta],
    ) -> Result<Vec<DeviceCheck>> {
        let _ = (b, inputs, outputs);
        Ok(Vec::new())
    }

    /// True when the backward rule reads input `input`'s values, so that changing that tensor
    /// in place before the backward runs is an error. `needs_grad` says which inputs will get
    /// a gradient (`a * 2` never reads `a`: only the number's gradient would). Every input,
    /// unless an op says otherwise.
    fn backward_reads(&self, input: usize, needs_grad: &[bool]) -> bool {
        let _ = (input, needs_grad);
        true
    }

    /// True when the op has a backward rule. The op table reads it from here
    /// ([`OpInfo::backward`]).
    fn has_backward(&self) -> bool {
        false
    }

    /// The backward rule: gradients with respect to each input from the gradients with respect
    /// to each output (`None` means zero), computed with ops so they run on the forward's
    /// device. Returns one entry per input; `None` for inputs without a gradient. Gradients may
    /// have the broadcast shape; autograd sums them down to each input's shape.
    fn backward(
        &self,
        saved: &crate::autograd::Saved,
        grads: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let _ = (saved, grads);
        Err(tpu_tensor::Error::UnsupportedOp {
            op: self.name().to_string(),
            dtype: String::new(),
            device: "any device".into(),
            detail: "the op has no backward rule".into(),
        })
    }
}

/// What a backward rule returns: one gradient per input, `None` where there is none.
pub type Grads = Result<Vec<Option<Tensor>>>;

/// Writes the methods of an `OpDef` impl that only hand the op to its family's files, so an
/// impl states its name and shape rule and then names its parts in one place:
///
/// ```ignore
/// impl OpDef for Norm {
///     fn name(&self) -> &'static str { .. }
///     fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> { .. }
///     op_parts! {
///         cpu: cpu::norm,
///         lower: lower::norm,
///         grad: grad::norm,
///     }
/// }
/// ```
///
/// Each part is optional and takes a function of the op followed by that method's arguments:
/// `cpu: f` gives `cpu(&self, inputs, outputs) = f(self, inputs, outputs)`; `lower: f` gives
/// `lower(&self, b, inputs, outputs) = f(self, b, OpIo { inputs, outputs })` (see
/// [`crate::hlo::lower::OpIo`]), and `lower_checks` likewise. `backward: f` gives
/// `backward(&self, saved, grads) = f(self, saved, grads)`; `grad: f`, for rules that read only
/// the gradient of output 0, gives a `backward` that returns no gradient for any input when that
/// one is zero and `f(self, saved, g)` with the gradient `g: &Tensor` otherwise. Either gives a
/// `has_backward` that is `true`, or the value of `has_backward: |op| expr` written after it.
macro_rules! op_parts {
    (
        $(cpu: $cpu:path,)?
        $(lower: $lower:path,)?
        $(lower_checks: $checks:path,)?
        $(backward: $grad:path $(, has_backward: |$op:ident| $has:expr)?,)?
        $(grad: $grad0:path $(, has_backward: |$op0:ident| $has0:expr)?,)?
    ) => {
        $(
            fn cpu(
                &self,
                inputs: &[&tpu_tensor::Tensor],
                outputs: &[$crate::op::Meta],
            ) -> tpu_tensor::Result<Vec<tpu_tensor::Tensor>> {
                $cpu(self, inputs, outputs)
            }
        )?
        $(
            fn lower(
                &self,
                b: &mut $crate::hlo::FnBuilder,
                inputs: &[$crate::hlo::Value],
                outputs: &[$crate::op::Meta],
            ) -> tpu_tensor::Result<Vec<$crate::hlo::Value>> {
                $lower(self, b, $crate::hlo::lower::OpIo { inputs, outputs })
            }
        )?
        $(
            fn lower_checks(
                &self,
                b: &mut $crate::hlo::FnBuilder,
                inputs: &[$crate::hlo::Value],
                outputs: &[$crate::op::Meta],
            ) -> tpu_tensor::Result<Vec<$crate::hlo::checks::DeviceCheck>> {
                $checks(self, b, $crate::hlo::lower::OpIo { inputs, outputs })
            }
        )?
        $(op_parts!(@rule backward $grad $(|$op| $has)?);)?
        $(op_parts!(@rule grad $grad0 $(|$op0| $has0)?);)?
    };
    (@rule $rule:ident $grad:path $(|$op:ident| $has:expr)?) => {
        fn has_backward(&self) -> bool {
            let this = self;
            op_parts!(@has this $(|$op| $has)?)
        }

        fn backward(
            &self,
            saved: &$crate::autograd::Saved,
            grads: &[Option<tpu_tensor::Tensor>],
        ) -> tpu_tensor::Result<Vec<Option<tpu_tensor::Tensor>>> {
            op_parts!(@backward $rule $grad, self, saved, grads)
        }
    };
    (@backward backward $grad:path, $this:ident, $saved:ident, $grads:ident) => {
        $grad($this, $saved, $grads)
    };
    (@backward grad $grad:path, $this:ident, $saved:ident, $grads:ident) => {
        $crate::op::grad_of_first($grads, $saved.inputs.len(), |g| $grad($this, $saved, g))
    };
    (@has $this:ident) => {{
        let _ = $this;
        true
    }};
    (@has $this:ident |$op:ident| $has:expr) => {{
        let $op = $this;
        $has
    }};
}
pub(crate) use op_parts;

/// The frame of a backward rule whose op's first output is the only one with a gradient:
/// `rule(g)` with that gradient gives one entry per input; when none arrived, each of the
/// `inputs` inputs gets none. `op_parts!`'s `grad:` part and hand-written `backward`s share it.
pub(crate) fn grad_of_first(
    grads: &[Option<Tensor>],
    inputs: usize,
    rule: impl FnOnce(&Tensor) -> Result<Vec<Option<Tensor>>>,
) -> Result<Vec<Option<Tensor>>> {
    match grads.first() {
        Some(Some(g)) => rule(g),
        _ => Ok(vec![None; inputs]),
    }
}

/// [`grad_of_first`] for a one-input op: `rule(g, x)`, from the gradient `g` and the saved
/// input `x`, is the input's gradient.
pub(crate) fn input_grad(
    saved: &crate::autograd::Saved,
    grads: &[Option<Tensor>],
    rule: impl FnOnce(&Tensor, &Tensor) -> Result<Tensor>,
) -> Result<Vec<Option<Tensor>>> {
    grad_of_first(grads, 1, |g| Ok(vec![Some(rule(g, &saved.inputs[0])?)]))
}

/// A shareable copy of an op (for graphs and autograd records); every `Clone` op has it.
pub trait BoxedOp {
    /// The op, behind an `Arc`.
    fn boxed(&self) -> Arc<dyn OpDef>;

    /// The op as `Any`, so that graph passes can read the attributes of the ops they rewrite.
    fn as_any(&self) -> &dyn std::any::Any;
}

impl<T: OpDef + Clone> BoxedOp for T {
    fn boxed(&self) -> Arc<dyn OpDef> {
        Arc::new(self.clone())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
