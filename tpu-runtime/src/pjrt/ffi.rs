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

/// A zeroed argument struct of the type the table entry `_f` takes, `struct_size` set.
///
/// Only the entry's type is used, so the caller names the entry and never the struct.
pub(crate) fn args_for<A: Default>(_f: PjrtFn<A>) -> A {
    A::default()
}

/// Calls table entry `$f` of `$lib` with a fresh argument struct whose listed fields are set,
/// and gives back the struct (its out-fields filled in) or the plugin's error naming `$f` (or
/// `name`, where given).
///
/// It expands to a call of the unsafe [`call`], so it stands inside an `unsafe` block whose
/// `SAFETY` comment covers the fields passed, as [`call`] requires.
macro_rules! pjrt_call {
    ($lib:expr, $f:ident { $( $field:ident $(: $value:expr)? ),* $(,)? }) => {
        $crate::pjrt::ffi::pjrt_call!(
            $lib, $f { $( $field $(: $value)? ),* }, name = stringify!($f)
        )
    };
    (
        $lib:expr, $f:ident { $( $field:ident $(: $value:expr)? ),* $(,)? }, name = $name:expr
    ) => {{
        let lib: &libtpu_sys::PjrtLibrary = $lib;
        let entry = lib.api().$f;
        let mut args = $crate::pjrt::ffi::args_for(entry);
        $( args.$field = $crate::pjrt::ffi::pjrt_call!(@value $field $(: $value)?); )*
        $crate::pjrt::ffi::call(lib, $name, entry, &mut args).map(|()| args)
    }};
    // A field given alone (`{ device }`) takes the local variable of its name, as in a struct
    // literal.
    (@value $field:ident) => {
        $field
    };
    (@value $field:ident : $value:expr) => {
        $value
    };
}
pub(crate) use pjrt_call;

/// A (pointer, length) array the plugin returned, as a slice; empty when the pointer is null.
///
/// # Safety
///
/// `ptr` must be null or point to `len` readable values that stay alive and unchanged for `'a`.
pub(crate) unsafe fn slice_from<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: caller contract.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// Copies a (pointer, length) string the plugin returned into an owned `String`.
///
/// # Safety
///
/// `ptr` must be null or point to `len` readable bytes.
pub(crate) unsafe fn string_from(ptr: *const std::ffi::c_char, len: usize) -> String {
    // SAFETY: caller contract.
    let bytes = unsafe { slice_from(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}
