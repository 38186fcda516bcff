//! `#[repr(C)]` declarations of the PJRT C API handles, enums and argument structs.
//!
//! Every argument struct starts with `struct_size` and `extension_start`. Its `new()` zeroes
//! the rest and sets `struct_size` to the header's `STRUCT_SIZE` (the end of the last field,
//! without tail padding), which is exactly what a C caller compiled against the same header
//! passes. Plugins accept any `struct_size` at least as large as their own, so declaring the
//! newest layout we could verify keeps older plugins working.

use core::ffi::c_void;
use core::marker::{PhantomData, PhantomPinned};

/// Declares one argument struct with the common two-field header, `STRUCT_SIZE` and `new()`.
macro_rules! pjrt_struct {
    (
        $(#[$meta:meta])*
        $name:ident, last = $last:ident;
        { $( $(#[$fmeta:meta])* $field:ident : $ty:ty ),* $(,)? }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            /// Size of this struct as the caller knows it; `new()` sets the header's value.
            pub struct_size: usize,
            /// Optional chain of extension structs; null when unused.
            pub extension_start: *mut $crate::types::PJRT_Extension_Base,
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl $name {
            /// Bytes the header counts for this struct: the end of its last field, no tail padding.
            pub const STRUCT_SIZE: usize = $crate::types::field_end(
                core::mem::offset_of!($name, $last),
                |s: &$name| &s.$last,
            );

            /// All fields zero or null, `struct_size` set to [`Self::STRUCT_SIZE`].
            pub const fn new() -> Self {
                // SAFETY: every field is an integer, a bool, a raw pointer, an `Option` of a
                // function pointer or a `u32` newtype; all-zero bytes are a valid value of each.
                let mut s: Self = unsafe { core::mem::zeroed() };
                s.struct_size = Self::STRUCT_SIZE;
                s
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }
    };
}

/// Declares a C enum as a `u32` newtype, so values a newer plugin invents stay representable.
macro_rules! pjrt_enum {
    (
        $(#[$meta:meta])*
        $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $value:literal ),* $(,)? }
    ) => {
        $(#[$meta])*
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub u32);

        impl $name {
            $( $(#[$vmeta])* pub const $variant: Self = Self($value); )*

            /// The constant's name, or `None` for a value this crate does not know.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $( $value => Some(stringify!($variant)), )*
                    _ => None,
                }
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self.name() {
                    Some(n) => write!(f, "{}::{}", stringify!($name), n),
                    None => write!(f, "{}({})", stringify!($name), self.0),
                }
            }
        }
    };
}

/// Declares opaque handle types that only ever live behind pointers the plugin hands out.
macro_rules! pjrt_opaque {
    ( $( $(#[$meta:meta])* $name:ident ),* $(,)? ) => {
        $(
            $(#[$meta])*
            #[repr(C)]
            pub struct $name {
                _data: [u8; 0],
                _marker: PhantomData<(*mut u8, PhantomPinned)>,
            }
        )*
    };
}

mod buffer;
mod client;
mod device;
mod error;
mod executable;

pub use buffer::*;
pub use client::*;
pub use device::*;
pub use error::*;
pub use executable::*;

/// Offset just past a field; `_field` only names the field so its type can be measured.
#[doc(hidden)]
pub const fn field_end<S, F>(offset: usize, _field: fn(&S) -> &F) -> usize {
    offset + core::mem::size_of::<F>()
}

/// A function-table entry: takes its argument struct, returns an owned error or null.
pub type PjrtFn<A> = Option<unsafe extern "C" fn(args: *mut A) -> *mut PJRT_Error>;

/// A function-table entry that returns nothing (only the two error accessors).
pub type PjrtVoidFn<A> = Option<unsafe extern "C" fn(args: *mut A)>;

/// A table entry this crate does not call; the argument struct is left untyped.
pub type PjrtUntypedFn = PjrtFn<c_void>;

pjrt_opaque! {
    /// An error the plugin allocated; destroy it with `PJRT_Error_Destroy`.
    PJRT_Error,
    /// A completion notification; destroy it with `PJRT_Event_Destroy`.
    PJRT_Event,
    /// A runtime client, owner of devices, buffers and executables.
    PJRT_Client,
    /// A device, owned by its client.
    PJRT_Device,
    /// A memory space attached to one or more devices.
    PJRT_Memory,
    /// Static facts about a device, owned by the device or a topology.
    PJRT_DeviceDescription,
    /// A description of a device topology that can exist without a client.
    PJRT_TopologyDescription,
    /// A compiled program not bound to devices.
    PJRT_Executable,
    /// A compiled program loaded onto a client's devices.
    PJRT_LoadedExecutable,
    /// An array on a device.
    PJRT_Buffer,
    /// Holder of bytes produced by `PJRT_Executable_Serialize`.
    PJRT_SerializedExecutable,
    /// Per-execution context passed through `PJRT_ExecuteOptions::context`.
    PJRT_ExecuteContext,
    /// A stream used by receive callbacks to copy chunks to a device.
    PJRT_CopyToDeviceStream,
    /// Load options for `PJRT_Executable_DeserializeAndLoad`; not declared here.
    PJRT_LoadOptions,
}

/// Head of every extension struct in an `extension_start` chain.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PJRT_Extension_Base {
    /// Size of the full extension struct.
    pub struct_size: usize,
    /// Which extension this is.
    pub type_: PJRT_Extension_Type,
    /// Next extension in the chain, or null.
    pub next: *mut PJRT_Extension_Base,
}

pjrt_struct! {
    /// The version a plugin implements, embedded in `PJRT_Api`.
    PJRT_Api_Version, last = minor_version;
    {
        /// Incremented on ABI-breaking changes; only 0 exists.
        major_version: i32,
        /// Incremented on compatible additions.
        minor_version: i32,
    }
}

pjrt_enum! {
    /// Kind of an extension struct in an `extension_start` chain.
    PJRT_Extension_Type {
        /// GPU custom calls.
        GPU_CUSTOM_CALL = 0,
        /// Profiler hooks.
        PROFILER = 1,
        /// Custom partitioner registration.
        CUSTOM_PARTITIONER = 2,
        /// Device streams.
        STREAM = 3,
        /// Memory layouts.
        LAYOUTS = 4,
        /// XLA FFI.
        FFI = 5,
        /// Memory descriptions of devices.
        MEMORY_DESCRIPTIONS = 6,
        /// Triton kernels.
        TRITON = 7,
        /// Raw buffers.
        RAW_BUFFER = 8,
        /// Phased compilation.
        PHASE_COMPILE = 9,
        /// Example extension.
        EXAMPLE = 10,
        /// Unknown extension.
        UNKNOWN = 11,
        /// Cross-host transfers.
        CROSS_HOST_TRANSFERS = 12,
        /// Executable metadata.
        EXECUTABLE_METADATA = 13,
        /// Host callbacks.
        CALLBACK = 14,
        /// Host allocator.
        HOST_ALLOCATOR = 15,
        /// TPU topology.
        TPU_TOPOLOGY = 16,
        /// TPU executables.
        TPU_EXECUTABLE = 17,
        /// Megascale.
        MEGASCALE = 18,
        /// Shardings.
        SHARDINGS = 19,
        /// ABI versions.
        ABI_VERSION = 20,
        /// Collectives.
        COLLECTIVES = 21,
        /// Multi-slice configuration.
        MULTI_SLICE = 22,
        /// Host memory allocator.
        HOST_MEMORY_ALLOCATOR = 23,
        /// XLA transforms.
        XLA_TRANSFORM = 24,
    }
}

pjrt_enum! {
    /// Status code of a `PJRT_Error`, numbered like absl status codes.
    PJRT_Error_Code {
        /// Not an error.
        OK = 0,
        /// Cancelled.
        CANCELLED = 1,
        /// Unknown.
        UNKNOWN = 2,
        /// Invalid argument.
        INVALID_ARGUMENT = 3,
        /// Deadline exceeded.
        DEADLINE_EXCEEDED = 4,
        /// Not found.
        NOT_FOUND = 5,
        /// Already exists.
        ALREADY_EXISTS = 6,
        /// Permission denied.
        PERMISSION_DENIED = 7,
        /// Resource exhausted.
        RESOURCE_EXHAUSTED = 8,
        /// Failed precondition.
        FAILED_PRECONDITION = 9,
        /// Aborted.
        ABORTED = 10,
        /// Out of range.
        OUT_OF_RANGE = 11,
        /// Unimplemented.
        UNIMPLEMENTED = 12,
        /// Internal.
        INTERNAL = 13,
        /// Unavailable.
        UNAVAILABLE = 14,
        /// Data loss.
        DATA_LOSS = 15,
        /// Unauthenticated.
        UNAUTHENTICATED = 16,
    }
}

pjrt_enum! {
    /// Which member of a `PJRT_NamedValue`'s value union is set.
    PJRT_NamedValue_Type {
        /// `string_value`, `value_size` bytes.
        STRING = 0,
        /// `int64_value`.
        INT64 = 1,
        /// `int64_array_value`, `value_size` elements.
        INT64_LIST = 2,
        /// `float_value`.
        FLOAT = 3,
        /// `bool_value`.
        BOOL = 4,
    }
}

pjrt_enum! {
    /// Element type of a buffer or executable output.
    PJRT_Buffer_Type {
        /// Not a valid type.
        INVALID = 0,
        /// Boolean.
        PRED = 1,
        /// Signed 8-bit integer.
        S8 = 2,
        /// Signed 16-bit integer.
        S16 = 3,
        /// Signed 32-bit integer.
        S32 = 4,
        /// Signed 64-bit integer.
        S64 = 5,
        /// Unsigned 8-bit integer.
        U8 = 6,
        /// Unsigned 16-bit integer.
        U16 = 7,
        /// Unsigned 32-bit integer.
        U32 = 8,
        /// Unsigned 64-bit integer.
        U64 = 9,
        /// IEEE half precision.
        F16 = 10,
        /// IEEE single precision.
        F32 = 11,
        /// IEEE double precision.
        F64 = 12,
        /// bfloat16.
        BF16 = 13,
        /// Complex of two f32.
        C64 = 14,
        /// Complex of two f64.
        C128 = 15,
        /// 8-bit float, e5m2.
        F8E5M2 = 16,
        /// 8-bit float, e4m3 finite.
        F8E4M3FN = 17,
        /// 8-bit float, e4m3 with bias 11, finite, unsigned zero.
        F8E4M3B11FNUZ = 18,
        /// 8-bit float, e5m2 finite, unsigned zero.
        F8E5M2FNUZ = 19,
        /// 8-bit float, e4m3 finite, unsigned zero.
        F8E4M3FNUZ = 20,
        /// Signed 4-bit integer.
        S4 = 21,
        /// Unsigned 4-bit integer.
        U4 = 22,
        /// Ordering token.
        TOKEN = 23,
        /// Signed 2-bit integer.
        S2 = 24,
        /// Unsigned 2-bit integer.
        U2 = 25,
        /// 8-bit float, e4m3.
        F8E4M3 = 26,
        /// 8-bit float, e3m4.
        F8E3M4 = 27,
        /// 8-bit exponent-only float.
        F8E8M0FNU = 28,
        /// 4-bit float, e2m1 finite.
        F4E2M1FN = 29,
        /// Signed 1-bit integer.
        S1 = 30,
        /// Unsigned 1-bit integer.
        U1 = 31,
        /// 6-bit float, e2m3 finite.
        F6E2M3FN = 32,
        /// 6-bit float, e3m2 finite.
        F6E3M2FN = 33,
    }
}

impl PJRT_Buffer_Type {
    /// Bytes per element for the byte-addressable types; `None` for sub-byte, token, invalid
    /// and unknown types.
    pub const fn byte_size(self) -> Option<usize> {
        match self {
            Self::PRED | Self::S8 | Self::U8 => Some(1),
            Self::F8E5M2 | Self::F8E4M3FN | Self::F8E4M3B11FNUZ | Self::F8E5M2FNUZ => Some(1),
            Self::F8E4M3FNUZ | Self::F8E4M3 | Self::F8E3M4 | Self::F8E8M0FNU => Some(1),
            Self::S16 | Self::U16 | Self::F16 | Self::BF16 => Some(2),
            Self::S32 | Self::U32 | Self::F32 => Some(4),
            Self::S64 | Self::U64 | Self::F64 | Self::C64 => Some(8),
            Self::C128 => Some(16),
            _ => None,
        }
    }
}
