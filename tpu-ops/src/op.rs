//! The op table: what every op defines, and the registry that lists them.

use std::fmt;
use std::sync::Arc;

use tpu_tensor::{DType, Device, Dims, Result, Tensor};

use crate::checks::DeviceCheck;
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
pub trait OpDef: Send + Sync + fmt::Debug + 'static {
    /// The op's name (PyTorch's where one exists).
    fn name(&self) -> &'static str;

    /// The attributes as a stable string; part of the compile-cache key.
    fn attrs(&self) -> String {
        String::new()
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
    /// element plus the error to raise from it (see [`crate::checks`]). Callers include them
    /// when [`crate::checks::device_checks`] is on: the eager path as extra outputs of the op's
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

    /// A shareable copy of this op (for graphs and autograd records).
    fn boxed(&self) -> Arc<dyn OpDef>;

    /// True when the op has a backward rule.
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

/// Runs an op on seeded sample inputs of a dtype on a device.
pub type Sample = Arc<dyn Fn(DType, &Device) -> Result<Vec<Tensor>> + Send + Sync>;

/// What the op table says about one op, for the coverage table and the generic tests.
#[derive(Clone)]
pub struct OpInfo {
    /// The op's name.
    pub name: &'static str,
    /// Input dtypes the native CPU kernel supports.
    pub cpu: DTypeSet,
    /// Input dtypes the StableHLO lowering supports.
    pub hlo: DTypeSet,
    /// Runs the op on sample inputs of `dtype` on `device` (seeded, small shapes). The generic
    /// tests call it for every listed dtype on the CPU and through PJRT and compare the results.
    pub sample: Sample,
    /// Absolute and relative tolerance for comparing CPU and XLA results of float dtypes; 0
    /// means bit-exact.
    pub tolerance: f64,
    /// True when the op has a backward rule.
    pub backward: bool,
}

impl fmt::Debug for OpInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "OpInfo({}, cpu: {}, hlo: {})",
            self.name, self.cpu, self.hlo
        )
    }
}

/// Every op of the library, generated from the op definitions.
pub fn op_table() -> Vec<OpInfo> {
    op_table_parts()
        .into_iter()
        .flat_map(|(_, rows)| rows)
        .collect()
}

/// The op table by category (the file each op is defined in).
pub fn op_table_parts() -> Vec<(&'static str, Vec<OpInfo>)> {
    crate::ops::TABLES
        .iter()
        .map(|(name, part)| (*name, part()))
        .collect()
}
