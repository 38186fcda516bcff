//! Calling PJRT entries and turning their errors into ours.

use libtpu_sys::{PJRT_Error, PjrtError, PjrtFn, PjrtLibrary};

use crate::error::{Error, Result};

/// Converts a plugin error, naming the C API function that failed.
pub(crate) fn pjrt_error(function: &'static str, e: PjrtError) -> Error {
    Error::Pjrt {
        function,
        code: e
            .code
            .name()
            .map_or_else(|| format!("code {}", e.code.0), str::to_string),
        message: e.message,
    }
}

/// Calls one table entry and converts its error, destroying it exactly once.
///
/// # Safety
///
/// `args` must be a fully initialised argument struct for `f`, with every pointer in it valid
/// for the duration of the call as the C API requires, and `f` must come from `lib`'s table.
pub(crate) unsafe fn call<A>(
    lib: &PjrtLibrary,
    function: &'static str,
    f: PjrtFn<A>,
    args: &mut A,
) -> Result<()> {
    let f = f.ok_or_else(|| Error::Pjrt {
        function,
        code: "UNIMPLEMENTED".into(),
        message: format!(
            "the plugin {} does not provide this entry",
            lib.path().display()
        ),
    })?;
    // SAFETY: forwarded caller contract: `args` is valid for `f`.
    let err: *mut PJRT_Error = unsafe { f(args) };
    // SAFETY: `err` was just returned by `lib`'s entry and is owned by nobody else.
    unsafe { lib.check(err) }.map_err(|e| pjrt_error(function, e))
}

/// Copies a (pointer, length) string the plugin returned into an owned `String`.
///
/// # Safety
///
/// `ptr` must be null or point to `len` readable bytes.
pub(crate) unsafe fn string_from(ptr: *const std::ffi::c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: caller contract.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}
