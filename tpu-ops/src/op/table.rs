//! The op table: one row per op, listing the dtypes each device supports and sample inputs;
//! the generic tests and the coverage table are driven from it.

use std::fmt;
use std::sync::{Arc, Mutex};

use tpu_tensor::{DType, Device, Result, Tensor};

use super::{DTypeSet, Meta, OpDef};
use crate::exec::dispatch::{DispatchHook, with_dispatch_hook};

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
}

impl OpInfo {
    /// A row whose CPU kernel and lowering take the same `dtypes`, compared within
    /// `tolerance`.
    pub fn new(
        name: &'static str,
        dtypes: DTypeSet,
        tolerance: f64,
        sample: impl Fn(DType, &Device) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    ) -> OpInfo {
        OpInfo {
            name,
            cpu: dtypes,
            hlo: dtypes,
            sample: Arc::new(sample),
            tolerance,
        }
    }

    /// True when the op has a backward rule, as its definition says ([`OpDef::has_backward`]),
    /// and gives a float output for it to flow from: runs the sample on the CPU and asks the op
    /// it dispatched under the row's name (the last one, after any ops that made the inputs),
    /// or the last op it dispatched when no op bears the row's name (the casts' rows are named
    /// by their target, `to(f32)`).
    pub fn backward(&self) -> bool {
        #[derive(Default)]
        struct Seen {
            named: Option<bool>,
            last: Option<bool>,
        }
        struct Watch {
            name: &'static str,
            seen: Mutex<Seen>,
        }
        impl DispatchHook for Watch {
            fn dispatch(
                &self,
                op: &dyn OpDef,
                _: &[&Tensor],
                _: &[Meta],
            ) -> Option<Result<Vec<Tensor>>> {
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                if op.name() == self.name {
                    seen.named = Some(op.has_backward());
                }
                seen.last = Some(op.has_backward());
                None
            }
        }
        let dtype = [DType::F32, DType::F64]
            .into_iter()
            .find(|&d| self.cpu.contains(d))
            .or_else(|| self.cpu.iter().next());
        let Some(dtype) = dtype else {
            return false;
        };
        let watch = Arc::new(Watch {
            name: self.name,
            seen: Mutex::default(),
        });
        let sample = with_dispatch_hook(watch.clone(), || (self.sample)(dtype, &Device::cpu()));
        let seen = watch.seen.lock().unwrap_or_else(|e| e.into_inner());
        // A gradient flows only into float outputs: `argsort` is `sort` without its values.
        let float_out = sample.is_ok_and(|outs| outs.iter().any(|t| t.dtype().is_float()));
        float_out && seen.named.or(seen.last).unwrap_or(false)
    }
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
