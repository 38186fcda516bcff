//! Device-side checks: the data-dependent errors of the CPU kernels (indices out of range,
//! integer division by zero) for devices whose programs cannot stop and report.
//!
//! An op that can fail on its data implements [`OpDef::lower_checks`](crate::op::OpDef): it
//! emits, into the same function as its lowering, one small value per check that names the first
//! offending element, and says which error to raise from it. The eager PJRT path returns these
//! values as extra outputs of the op's module, reads them back after the run and raises the
//! error; a whole-graph compiler can collect the same values from every node of its graph.

use std::fmt;
use std::sync::Arc;

use tpu_tensor::tpu_runtime::EnvSwitch;
use tpu_tensor::{DType, Error};

use crate::hlo::{Cmp, FnBuilder, TensorType, Value};

/// Environment variable: `0` turns device checks off for the whole process (read once, at the
/// first op on a PJRT device); [`set_device_checks`] overrides it.
pub const ENV_DEVICE_CHECKS: &str = "TPU_RS_DEVICE_CHECKS";

static DEVICE_CHECKS: EnvSwitch = EnvSwitch::new(ENV_DEVICE_CHECKS, true);

/// True when ops on PJRT devices check their data as the CPU kernels do (the default; off with
/// `TPU_RS_DEVICE_CHECKS=0` or [`set_device_checks`]).
///
/// A checked op adds a few reductions to its program and, because the verdict must be read on
/// the host before the op returns, waits for the program to finish: every checked op is a
/// synchronisation point, as with `TPU_RS_LAUNCH_BLOCKING=1`. Ops without data-dependent
/// errors are not affected.
pub fn device_checks() -> bool {
    DEVICE_CHECKS.get()
}

/// Turns device checks on (`true`, the default) or off for the whole process, from the next op
/// on (compiled programs are cached separately for each setting).
///
/// With checks off, ops on PJRT devices do not wait, and what bad data gives is whatever XLA
/// does with it:
///
/// - `gather`, `index_select`, `embedding`: an out-of-range index is clamped into range
///   (`-1` reads element 0, `5` of a 3-element dim reads element 2).
/// - `scatter`, `scatter_add`, `index_add`, `index_copy`: updates at out-of-range indices are dropped.
/// - `one_hot`: a row of zeros for a class outside `[0, num_classes)`.
/// - `cross_entropy`, `nll_loss`: a target outside `[0, C)` (other than `ignore_index`)
///   contributes a loss of 0; without class weights it still counts in the mean's divisor, with
///   class weights it has weight 0.
/// - integer `div_floor`, `div_trunc`, `remainder` by zero: whatever XLA's integer division
///   gives (`7 // 0` is -1, 255 in u8; `remainder(7, 0)` is 7).
pub fn set_device_checks(on: bool) {
    DEVICE_CHECKS.set(on);
}

/// The first offending element a check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its position in row-major order of the checked tensor.
    pub position: usize,
    /// The element (an index, a class, a divisor), as i64.
    pub value: i64,
}

/// Makes the error a failed check raises.
pub type CheckError = Arc<dyn Fn(Found) -> Error + Send + Sync>;

/// A check emitted into an op's program.
#[derive(Clone)]
pub struct DeviceCheck {
    /// An `i64[2]` value: the row-major position of the first offending element (`i64::MAX`
    /// when none offends) and that element.
    pub value: Value,
    /// The error to raise when an element offends.
    pub error: CheckError,
}

impl fmt::Debug for DeviceCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceCheck({})", self.value.name)
    }
}

/// The type of every check value.
pub fn check_type() -> TensorType {
    TensorType::new(&[2], DType::I64)
}

/// The error of the first failed check, from the check values read back in emission order
/// (`words` holds each check's two i64s).
pub fn verdict(errors: &[CheckError], words: &[[i64; 2]]) -> Result<(), Error> {
    for (e, &[pos, value]) in errors.iter().zip(words) {
        if pos != i64::MAX {
            return Err(e(Found {
                position: pos.max(0) as usize,
                value,
            }));
        }
    }
    Ok(())
}

/// Emits a check value: the first position where the bool tensor `bad` is true, and the element
/// of `values` (an integer tensor of the same shape) there.
pub fn first_offending(b: &mut FnBuilder, bad: &Value, values: &Value) -> Value {
    let n = bad.ty.numel();
    if n == 0 {
        return b.constant_i64(&[2], &[i64::MAX, 0]);
    }
    let bad = b.reshape(bad, &[n]);
    let values = b.convert(values, DType::I64);
    let values = b.reshape(&values, &[n]);
    let pos = b.iota(&[n], 0, DType::I64);
    let none = b.splat(TensorType::new(&[n], DType::I64), i64::MAX);
    let cand = b.select(&bad, &pos, &none);
    let init = b.scalar(DType::I64, i64::MAX);
    let first = b
        .reduce(&[&cand], &[&init], &[0], |b, a| {
            vec![b.ew("stablehlo.minimum", &[&a[0], &a[1]])]
        })
        .remove(0);
    // The element at that position, as a masked sum (no position matches when none offends).
    let fb = b.broadcast_in_dim(&first, &[], &[n]);
    let hit = b.compare(Cmp::Eq, &pos, &fb);
    let zero = b.splat(TensorType::new(&[n], DType::I64), 0);
    let picked = b.select(&hit, &values, &zero);
    let zs = b.scalar(DType::I64, 0);
    let value = b
        .reduce(&[&picked], &[&zs], &[0], |b, a| {
            vec![b.ew("stablehlo.add", &[&a[0], &a[1]])]
        })
        .remove(0);
    let first = b.reshape(&first, &[1]);
    let value = b.reshape(&value, &[1]);
    b.concatenate(&[&first, &value], 0)
}

/// Emits the check that every element of the i64 tensor `index` lies in `[0, size)`, elements
/// equal to `except` aside; `None` when `index` is empty (nothing can offend).
pub fn index_in_range(
    b: &mut FnBuilder,
    index: &Value,
    size: usize,
    except: Option<i64>,
) -> Option<Value> {
    if index.ty.numel() == 0 {
        return None;
    }
    let ty = index.ty.clone();
    let zero = b.splat(ty.clone(), 0);
    let n = b.splat(ty.clone(), size as i64);
    let neg = b.compare(Cmp::Lt, index, &zero);
    let big = b.compare(Cmp::Ge, index, &n);
    let mut bad = b.ew("stablehlo.or", &[&neg, &big]);
    if let Some(e) = except {
        let ev = b.splat(ty, e);
        let other = b.compare(Cmp::Ne, index, &ev);
        bad = b.ew("stablehlo.and", &[&bad, &other]);
    }
    Some(first_offending(b, &bad, index))
}

/// The CPU kernels' error for an index outside `[0, size)` of dim `dim` of a tensor of `shape`.
pub fn index_error(op: &str, dim: usize, size: usize, shape: &[usize]) -> CheckError {
    let (op, shape) = (op.to_string(), shape.to_vec());
    Arc::new(move |f: Found| Error::IndexOutOfRange {
        op: op.clone(),
        index: f.value,
        dim,
        size,
        shape: shape.clone(),
    })
}

/// The check of an op that indexes dim `dim` (negative counts from the end) of a tensor of
/// `shape` with the i64 tensor `index`: every index in range, with the CPU kernels' error
/// (no check when `index` is empty, since nothing can offend).
pub fn index_check(
    b: &mut FnBuilder,
    op: &str,
    index: &Value,
    dim: i64,
    shape: &[usize],
) -> Result<Vec<DeviceCheck>, Error> {
    let dim = tpu_tensor::shape::resolve_dim(op, dim, shape)?;
    // A 0-dim tensor is indexed as one of a single element.
    let size = shape.get(dim).copied().unwrap_or(1);
    Ok(index_in_range(b, index, size, None)
        .map(|value| DeviceCheck {
            value,
            error: index_error(op, dim, size, shape),
        })
        .into_iter()
        .collect())
}
