//! The one error type of tpu-rs.
//!
//! Every layer above the runtime returns this same `Error`, so a user matches on one enum whatever
//! crate the failure came from. Variants are grouped by theme; each message says what was expected
//! and what was given.

use crate::dtype::DType;

/// Shorthand for `std::result::Result<T, tpu_runtime::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Writes each item with `Display` and joins them with `sep`: `[2, 3]` with `", "` gives `2, 3`.
pub fn join_display<T: std::fmt::Display>(items: impl IntoIterator<Item = T>, sep: &str) -> String {
    items
        .into_iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(sep)
}

/// Formats a shape the way PyTorch prints `tensor.shape`: `[2, 3]`.
pub fn fmt_shape(shape: &[usize]) -> String {
    format!("[{}]", join_display(shape, ", "))
}

/// Checks that `what` has the shape `expected`; when `given` differs, an [`Error::Shape`] for `op`
/// that says `{what}: expected shape {expected}, got {given}`.
pub fn check_shape(
    op: &str,
    what: impl std::fmt::Display,
    expected: &[usize],
    given: &[usize],
) -> Result<()> {
    if expected == given {
        return Ok(());
    }
    Err(Error::shape(
        op,
        format!(
            "{what}: expected shape {}, got {}",
            fmt_shape(expected),
            fmt_shape(given)
        ),
    ))
}

/// Checks that `what` (of shape `shape`) has `rank` dims; otherwise an [`Error::Shape`] for `op`
/// that says `expected a {rank}-D {what}, got shape {shape}`.
pub fn check_rank(op: &str, what: &str, shape: &[usize], rank: usize) -> Result<()> {
    if shape.len() == rank {
        return Ok(());
    }
    Err(Error::shape(
        op,
        format!("expected a {rank}-D {what}, got shape {}", fmt_shape(shape)),
    ))
}

/// Every failure tpu-rs reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- devices -------------------------------------------------------------------------------
    /// A device string that tpu-rs does not understand.
    #[error("unknown device {given:?}: expected one of {accepted}")]
    UnknownDevice {
        /// What the user wrote.
        given: String,
        /// The spellings tpu-rs accepts.
        accepted: &'static str,
    },
    /// A device that exists in principle but cannot be used here.
    #[error("device {device} is not available: {reason}")]
    DeviceUnavailable {
        /// The device as the user named it.
        device: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// An operation was given tensors or buffers that live on different devices.
    #[error("{op}: expected every operand on one device, got {first} and {second}")]
    DeviceMismatch {
        /// The operation that refused.
        op: String,
        /// The first device.
        first: String,
        /// The device that differed.
        second: String,
    },
    /// No TPU chip was found, so no libtpu client was created.
    #[error("no TPU found: {looked_at}")]
    NoTpuFound {
        /// What was examined and what was seen.
        looked_at: String,
    },

    // ---- PJRT plugins ------------------------------------------------------------------------
    /// A PJRT plugin could not be opened, checked or initialised.
    #[error(transparent)]
    PluginLoad(#[from] libtpu_sys::LoadError),
    /// No PJRT plugin could be found.
    #[error("no PJRT plugin found: {looked_at}")]
    NoPlugin {
        /// Where tpu-rs looked, and how to point it at a plugin.
        looked_at: String,
    },
    /// A PJRT C API function returned an error.
    #[error("{function} failed ({code}): {message}")]
    Pjrt {
        /// The C API function that failed.
        function: &'static str,
        /// The PJRT status code, such as `INVALID_ARGUMENT`.
        code: String,
        /// The plugin's message, unchanged.
        message: String,
    },
    /// XLA could not compile a program; `message` is the compiler's text, unchanged.
    #[error("XLA could not compile the program: {message}\nthe program begins:\n{program_head}")]
    Compile {
        /// The compiler's error text.
        message: String,
        /// The first lines of the program, for context.
        program_head: String,
    },
    /// Arguments given to an executable that do not match its parameters.
    #[error("executable {executable}: {reason}")]
    ExecutableArguments {
        /// The executable's name.
        executable: String,
        /// What was expected and what was given.
        reason: String,
    },

    // ---- memory --------------------------------------------------------------------------------
    /// An allocation would exceed the device's memory limit (or the host memory the system can
    /// still provide), or the system refused it.
    #[error(
        "out of memory on {device}: requested {requested} bytes{} with {in_use} bytes in use, limit {}",
        if what.is_empty() { String::new() } else { format!(" for {what}") },
        limit.map_or_else(|| "none (the system refused the allocation)".to_string(), |l| format!("{l} bytes"))
    )]
    OutOfMemory {
        /// The device whose memory ran out (`host` for host memory the system cannot provide).
        device: String,
        /// Bytes requested by the failing allocation.
        requested: usize,
        /// What the memory was for, such as `zeros f32[1099511627776]`; empty when unknown.
        what: String,
        /// Bytes in use when it was requested.
        in_use: usize,
        /// The limit in force, if any.
        limit: Option<usize>,
    },
    /// A memory size string (such as `512MiB`) that could not be parsed.
    #[error(
        "invalid memory size {given:?}: expected a byte count such as 1073741824, 512MiB, 2GiB or 1.5GB"
    )]
    InvalidMemorySize {
        /// What was given.
        given: String,
    },

    // ---- configuration -------------------------------------------------------------------------
    /// An environment variable had a value tpu-rs cannot use.
    #[error("environment variable {var}={value:?} is invalid: {expected}")]
    InvalidEnv {
        /// The variable's name.
        var: &'static str,
        /// Its value.
        value: String,
        /// What a valid value looks like.
        expected: String,
    },

    // ---- dtypes and data -----------------------------------------------------------------------
    /// A value of one dtype was used where another was required.
    #[error("{context}: expected dtype {expected}, got {given}")]
    DTypeMismatch {
        /// Where it happened.
        context: String,
        /// The dtype that was required.
        expected: DType,
        /// The dtype that was given.
        given: DType,
    },
    /// A dtype, or combination of dtypes, that an operation does not support.
    #[error("{op}: dtype {given} is not supported; supported: {supported}")]
    UnsupportedDType {
        /// The operation.
        op: String,
        /// What was given (one dtype, or a combination such as `i32 and bool`).
        given: String,
        /// What the operation accepts.
        supported: String,
    },
    /// A dtype name that tpu-rs does not know.
    #[error("unknown dtype {given:?}: expected one of {accepted}")]
    UnknownDType {
        /// What was given.
        given: String,
        /// The accepted names.
        accepted: &'static str,
    },
    /// Host data whose length does not match what was required.
    #[error("{context}: expected {expected} {unit}, got {given}")]
    LengthMismatch {
        /// Where it happened.
        context: String,
        /// What is counted (`elements`, `bytes`).
        unit: &'static str,
        /// The required length.
        expected: usize,
        /// The length given.
        given: usize,
    },
    /// Bytes that do not form valid values of a dtype (misaligned, wrong length, invalid bit
    /// patterns such as a bool byte other than 0 or 1).
    #[error("{context}: {reason}")]
    InvalidData {
        /// Where it happened.
        context: String,
        /// What was wrong.
        reason: String,
    },

    // ---- shapes, dims and indices --------------------------------------------------------------
    /// Shapes that an operation cannot accept together.
    #[error("{op}: {reason}")]
    Shape {
        /// The operation.
        op: String,
        /// What was expected and what was given, shapes included.
        reason: String,
    },
    /// A dimension index out of range.
    #[error("{op}: dim {dim} is out of range for a tensor of shape {} (expected a dim in [{}, {}])",
        fmt_shape(shape), -(*rank.max(&1) as i64), *rank.max(&1) as i64 - 1)]
    DimOutOfRange {
        /// The operation.
        op: String,
        /// The dim given.
        dim: i64,
        /// The tensor's rank.
        rank: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// An index out of range along a dimension.
    #[error(
        "{op}: index {index} is out of range for dim {dim} of size {size} (tensor shape {})",
        fmt_shape(shape)
    )]
    IndexOutOfRange {
        /// The operation.
        op: String,
        /// The index given.
        index: i64,
        /// The dim indexed.
        dim: usize,
        /// The size of that dim.
        size: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },

    // ---- ops -----------------------------------------------------------------------------------
    /// An operation that a device cannot run for the given dtype.
    #[error("{op} is not supported on {device} for dtype {dtype}{}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    UnsupportedOp {
        /// The operation.
        op: String,
        /// The dtype given.
        dtype: String,
        /// The device.
        device: String,
        /// Further detail, possibly empty.
        detail: String,
    },
    /// An argument value outside what an operation accepts (not a shape or dtype problem).
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The operation.
        op: String,
        /// What was expected and what was given.
        reason: String,
    },

    /// A broken invariant inside the library (a kernel given a layout its caller promised it
    /// would not get, a program returning fewer outputs than it declared): a bug in tpu-rs, not
    /// a mistake of the caller.
    #[error("{op}: internal error (a bug in tpu-rs; please report it): {what}")]
    Internal {
        /// The operation.
        op: String,
        /// The invariant that broke.
        what: String,
    },

    // ---- files ---------------------------------------------------------------------------------
    /// An I/O failure, with the path involved.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file whose content is not what its format requires.
    #[error("{path}: invalid {format} file: {reason}")]
    Format {
        /// The file.
        path: String,
        /// The format expected (for example `safetensors`).
        format: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// Builds a [`Error::Shape`] error.
    pub fn shape(op: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Shape {
            op: op.into(),
            reason: reason.into(),
        }
    }

    /// Builds an [`Error::InvalidArgument`] error.
    pub fn invalid_argument(op: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op: op.into(),
            reason: reason.into(),
        }
    }

    /// An [`Error::Internal`]: a broken invariant of the library itself.
    pub fn internal(op: impl Into<String>, what: impl Into<String>) -> Self {
        Error::Internal {
            op: op.into(),
            what: what.into(),
        }
    }

    /// Says what a failed allocation was for (an op, a dtype and shape) in an
    /// [`Error::OutOfMemory`] that does not say yet; any other error is returned unchanged.
    /// `what` is only called for such an error, so callers may format freely.
    pub fn for_allocation(self, what: impl FnOnce() -> String) -> Self {
        match self {
            Error::OutOfMemory {
                device,
                requested,
                what: w,
                in_use,
                limit,
            } if w.is_empty() => Error::OutOfMemory {
                device,
                requested,
                what: what(),
                in_use,
                limit,
            },
            other => other,
        }
    }

    /// Builds an [`Error::Io`] error.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_expected_and_given() {
        let e = Error::OutOfMemory {
            device: "cpu".into(),
            requested: 100,
            what: String::new(),
            in_use: 50,
            limit: Some(120),
        };
        assert_eq!(
            e.to_string(),
            "out of memory on cpu: requested 100 bytes with 50 bytes in use, limit 120 bytes"
        );
        let e = e.for_allocation(|| "zeros f32[25]".into());
        assert_eq!(
            e.to_string(),
            "out of memory on cpu: requested 100 bytes for zeros f32[25] with 50 bytes in use, limit 120 bytes"
        );
        // The first description stays: it is the most precise.
        let e = e.for_allocation(|| "something else".into());
        assert!(e.to_string().contains("for zeros f32[25] with"), "{e}");
        let e = Error::DimOutOfRange {
            op: "transpose".into(),
            dim: 3,
            rank: 2,
            shape: vec![2, 3],
        };
        assert_eq!(
            e.to_string(),
            "transpose: dim 3 is out of range for a tensor of shape [2, 3] (expected a dim in [-2, 1])"
        );
    }

    #[test]
    fn checks_say_expected_and_given() {
        assert!(check_shape("op", "x", &[2, 3], &[2, 3]).is_ok());
        assert_eq!(
            check_shape("load", "w in the file", &[3], &[2, 1])
                .unwrap_err()
                .to_string(),
            "load: w in the file: expected shape [3], got [2, 1]"
        );
        assert!(check_rank("op", "weight", &[2, 3], 2).is_ok());
        assert_eq!(
            check_rank("embedding", "weight", &[4], 2)
                .unwrap_err()
                .to_string(),
            "embedding: expected a 2-D weight, got shape [4]"
        );
        assert_eq!(join_display([1, 2], " or "), "1 or 2");
        assert_eq!(fmt_shape(&[]), "[]");
    }

    #[test]
    fn error_is_send_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<Error>();
    }
}
