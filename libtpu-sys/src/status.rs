//! Turning a returned `PJRT_Error*` into a Rust error.

use crate::api::PJRT_Api;
use crate::types::{
    PJRT_Error, PJRT_Error_Code, PJRT_Error_Destroy_Args, PJRT_Error_GetCode_Args,
    PJRT_Error_Message_Args,
};

/// A failure reported by a plugin: its status code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PjrtError {
    /// The status code.
    pub code: PJRT_Error_Code,
    /// The plugin's message.
    pub message: String,
}

impl core::fmt::Display for PjrtError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.code.name() {
            Some(name) => write!(f, "{name}: {}", self.message),
            None => write!(f, "error code {}: {}", self.code.0, self.message),
        }
    }
}

impl std::error::Error for PjrtError {}

/// Reads the code and message of `error`, then destroys it; returns `None` for null.
///
/// The error is destroyed exactly once, here. If the plugin cannot report the code or the
/// message, `UNKNOWN` or a placeholder message stands in rather than failing.
///
/// # Safety
///
/// `error` must be null or an error returned by a function of the plugin whose table is `api`,
/// not yet destroyed, and not used by anyone after this call.
pub unsafe fn take_error(api: &PJRT_Api, error: *mut PJRT_Error) -> Option<PjrtError> {
    if error.is_null() {
        return None;
    }

    let message = match api.PJRT_Error_Message {
        Some(message_fn) => {
            let mut args = PJRT_Error_Message_Args::new();
            args.error = error;
            // SAFETY: `error` is a live error of this plugin (caller's contract) and `args` is a
            // fully initialised struct of the declared layout.
            unsafe { message_fn(&mut args) };
            if args.message.is_null() {
                String::new()
            } else {
                // SAFETY: the plugin returned `message_size` readable bytes at `message`, valid
                // until `error` is destroyed below.
                let bytes = unsafe {
                    core::slice::from_raw_parts(args.message.cast::<u8>(), args.message_size)
                };
                String::from_utf8_lossy(bytes).into_owned()
            }
        }
        None => String::from("(the plugin provides no PJRT_Error_Message)"),
    };

    let code = match api.PJRT_Error_GetCode {
        Some(code_fn) => {
            let mut args = PJRT_Error_GetCode_Args::new();
            args.error = error;
            // SAFETY: as above; the call only reads `error` and writes `args.code`.
            let failed = unsafe { code_fn(&mut args) };
            if failed.is_null() {
                args.code
            } else {
                // A failure to read the code is itself an error object we now own.
                // SAFETY: `failed` was just returned by this plugin and nobody else holds it.
                unsafe { destroy_error(api, failed) };
                PJRT_Error_Code::UNKNOWN
            }
        }
        None => PJRT_Error_Code::UNKNOWN,
    };

    // SAFETY: `error` is live and owned by us (caller's contract); this is its only destroy.
    unsafe { destroy_error(api, error) };
    Some(PjrtError { code, message })
}

/// Destroys `error` without reading it; a no-op for null or when the plugin lacks the entry.
///
/// # Safety
///
/// `error` must be null or a live error of `api`'s plugin that nobody uses afterwards.
pub unsafe fn destroy_error(api: &PJRT_Api, error: *mut PJRT_Error) {
    if error.is_null() {
        return;
    }
    if let Some(destroy) = api.PJRT_Error_Destroy {
        let mut args = PJRT_Error_Destroy_Args::new();
        args.error = error;
        // SAFETY: `error` is live and owned by the caller, who gives it up here.
        unsafe { destroy(&mut args) };
    }
    // Without a destroy entry the error can only be leaked.
}
