//! Errors, named values, plugin setup and events.

use core::ffi::{c_char, c_void};

use super::{PJRT_Error, PJRT_Error_Code, PJRT_Event, PJRT_Extension_Base, PJRT_NamedValue_Type};

pjrt_struct! {
    /// Arguments of `PJRT_Error_Destroy`.
    PJRT_Error_Destroy_Args, last = error;
    {
        /// In: the error to free; null is allowed.
        error: *mut PJRT_Error,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Error_Message`.
    PJRT_Error_Message_Args, last = message_size;
    {
        /// In: the error to read.
        error: *const PJRT_Error,
        /// Out: message bytes, not NUL-terminated, valid while `error` lives.
        message: *const c_char,
        /// Out: length of `message`.
        message_size: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Error_GetCode`.
    PJRT_Error_GetCode_Args, last = code;
    {
        /// In: the error to read.
        error: *const PJRT_Error,
        /// Out: the error's status code.
        code: PJRT_Error_Code,
    }
}

/// Called once per payload entry by `PJRT_Error_ForEachPayload`.
pub type PJRT_Error_PayloadVisitor = Option<
    unsafe extern "C" fn(
        key: *const c_char,
        key_size: usize,
        value: *const c_char,
        value_size: usize,
        user_arg: *mut c_void,
    ),
>;

pjrt_struct! {
    /// Arguments of `PJRT_Error_ForEachPayload`.
    PJRT_Error_ForEachPayload_Args, last = user_arg;
    {
        /// In: the error to read.
        error: *const PJRT_Error,
        /// In: called for each payload entry.
        visitor: PJRT_Error_PayloadVisitor,
        /// In: passed through to `visitor`.
        user_arg: *mut c_void,
    }
}

/// Handed to caller callbacks so they can build a `PJRT_Error` to return to the plugin.
pub type PJRT_CallbackError = Option<
    unsafe extern "C" fn(
        code: PJRT_Error_Code,
        message: *const c_char,
        message_size: usize,
    ) -> *mut PJRT_Error,
>;

/// The value of a `PJRT_NamedValue`; which member is live is given by its `type_`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union PJRT_NamedValue_Value {
    /// For `STRING`: `value_size` bytes, not NUL-terminated.
    pub string_value: *const c_char,
    /// For `INT64`.
    pub int64_value: i64,
    /// For `INT64_LIST`: `value_size` elements.
    pub int64_array_value: *const i64,
    /// For `FLOAT`.
    pub float_value: f32,
    /// For `BOOL`.
    pub bool_value: bool,
}

/// A key-value pair, used for client create options and for attributes.
///
/// The constructors store raw pointers into `name` and the value: keep those alive for as long
/// as the plugin may read the struct (for create options, until `PJRT_Client_Create` returns).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PJRT_NamedValue {
    /// Size of this struct as the caller knows it.
    pub struct_size: usize,
    /// Optional chain of extension structs; null when unused.
    pub extension_start: *mut PJRT_Extension_Base,
    /// Key bytes, not NUL-terminated.
    pub name: *const c_char,
    /// Length of `name`.
    pub name_size: usize,
    /// Which member of `value` is live.
    pub type_: PJRT_NamedValue_Type,
    /// The value.
    pub value: PJRT_NamedValue_Value,
    /// Element count for strings and lists, 1 for scalars.
    pub value_size: usize,
}

impl PJRT_NamedValue {
    /// Bytes the header counts for this struct: the end of `value_size`.
    pub const STRUCT_SIZE: usize = super::field_end(
        core::mem::offset_of!(PJRT_NamedValue, value_size),
        |s: &PJRT_NamedValue| &s.value_size,
    );

    const fn with(
        name: &str,
        type_: PJRT_NamedValue_Type,
        value: PJRT_NamedValue_Value,
        value_size: usize,
    ) -> Self {
        Self {
            struct_size: Self::STRUCT_SIZE,
            extension_start: core::ptr::null_mut(),
            name: name.as_ptr().cast(),
            name_size: name.len(),
            type_,
            value,
            value_size,
        }
    }

    /// A string value (borrowed by pointer, see the type's docs).
    pub const fn new_string(name: &str, value: &str) -> Self {
        let v = PJRT_NamedValue_Value {
            string_value: value.as_ptr().cast(),
        };
        Self::with(name, PJRT_NamedValue_Type::STRING, v, value.len())
    }

    /// A 64-bit integer value.
    pub const fn new_int64(name: &str, value: i64) -> Self {
        Self::with(
            name,
            PJRT_NamedValue_Type::INT64,
            PJRT_NamedValue_Value { int64_value: value },
            1,
        )
    }

    /// A list of 64-bit integers (borrowed by pointer, see the type's docs).
    pub const fn new_int64_list(name: &str, value: &[i64]) -> Self {
        let v = PJRT_NamedValue_Value {
            int64_array_value: value.as_ptr(),
        };
        Self::with(name, PJRT_NamedValue_Type::INT64_LIST, v, value.len())
    }

    /// A 32-bit float value.
    pub const fn new_float(name: &str, value: f32) -> Self {
        Self::with(
            name,
            PJRT_NamedValue_Type::FLOAT,
            PJRT_NamedValue_Value { float_value: value },
            1,
        )
    }

    /// A boolean value.
    pub const fn new_bool(name: &str, value: bool) -> Self {
        Self::with(
            name,
            PJRT_NamedValue_Type::BOOL,
            PJRT_NamedValue_Value { bool_value: value },
            1,
        )
    }
}

impl core::fmt::Debug for PJRT_NamedValue {
    // The union is not printed: reading it would mean trusting `type_` and the pointers.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PJRT_NamedValue")
            .field("struct_size", &self.struct_size)
            .field("name", &self.name)
            .field("name_size", &self.name_size)
            .field("type_", &self.type_)
            .field("value_size", &self.value_size)
            .finish_non_exhaustive()
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Plugin_Initialize`.
    PJRT_Plugin_Initialize_Args, last = extension_start;
    {}
}

pjrt_struct! {
    /// Arguments of `PJRT_Plugin_Attributes`.
    PJRT_Plugin_Attributes_Args, last = num_attributes;
    {
        /// Out: attributes, valid for the life of the process.
        attributes: *const PJRT_NamedValue,
        /// Out: number of `attributes`.
        num_attributes: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Event_Destroy`.
    PJRT_Event_Destroy_Args, last = event;
    {
        /// In: the event to free; null is allowed.
        event: *mut PJRT_Event,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Event_IsReady`.
    PJRT_Event_IsReady_Args, last = is_ready;
    {
        /// In: the event.
        event: *mut PJRT_Event,
        /// Out: whether the event has completed, successfully or not.
        is_ready: bool,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Event_Error`; call only once the event is ready.
    PJRT_Event_Error_Args, last = event;
    {
        /// In: the event.
        event: *mut PJRT_Event,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Event_Await`, which blocks until the event completes.
    PJRT_Event_Await_Args, last = event;
    {
        /// In: the event.
        event: *mut PJRT_Event,
    }
}

/// Called once an event is ready; owns `error` (null on success) and must destroy it.
pub type PJRT_Event_OnReadyCallback =
    Option<unsafe extern "C" fn(error: *mut PJRT_Error, user_arg: *mut c_void)>;

pjrt_struct! {
    /// Arguments of `PJRT_Event_OnReady`.
    PJRT_Event_OnReady_Args, last = user_arg;
    {
        /// In: the event.
        event: *mut PJRT_Event,
        /// In: called once when the event is ready, possibly on another thread.
        callback: PJRT_Event_OnReadyCallback,
        /// In: passed through to `callback`.
        user_arg: *mut c_void,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Event_Create`, which makes an event the caller completes.
    PJRT_Event_Create_Args, last = event;
    {
        /// Out: the new event.
        event: *mut PJRT_Event,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Event_Set`, which completes an event made by `PJRT_Event_Create`.
    PJRT_Event_Set_Args, last = error_message_size;
    {
        /// In: the event.
        event: *mut PJRT_Event,
        /// In: `OK` for success, else the failure's code.
        error_code: PJRT_Error_Code,
        /// In: failure message, copied by the plugin.
        error_message: *const c_char,
        /// In: length of `error_message`.
        error_message_size: usize,
    }
}
