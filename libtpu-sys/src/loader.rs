//! Opening a PJRT plugin at run time and checking its function table.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::api::PJRT_Api;
use crate::status::{PjrtError, take_error};
use crate::types::{PJRT_Error, PJRT_Plugin_Initialize_Args};

/// The only PJRT C API major version that exists; a different one means an incompatible ABI.
pub const SUPPORTED_MAJOR: i32 = 0;

/// Oldest minor version accepted. The function table was reordered in 0.57 and has only grown
/// at its end since, so older plugins put different functions in the slots declared here.
pub const MIN_SUPPORTED_MINOR: i32 = 57;

/// Name of the symbol every PJRT plugin exports.
pub const GET_PJRT_API_SYMBOL: &str = "GetPjrtApi";

macro_rules! required {
    ( $( $name:ident ),* $(,)? ) => {
        /// Table entries the layers above call; a plugin whose table ends before any of them is
        /// refused at open. Entries past these may still be `None` and are checked per call.
        pub const REQUIRED_FUNCTIONS: &[(&str, usize)] = &[
            $( (stringify!($name), core::mem::offset_of!(PJRT_Api, $name)) ),*
        ];
    };
}

required! {
    PJRT_Error_Destroy,
    PJRT_Error_Message,
    PJRT_Error_GetCode,
    PJRT_Plugin_Initialize,
    PJRT_Plugin_Attributes,
    PJRT_Event_Destroy,
    PJRT_Event_IsReady,
    PJRT_Event_Error,
    PJRT_Event_Await,
    PJRT_Event_OnReady,
    PJRT_Client_Create,
    PJRT_Client_Destroy,
    PJRT_Client_PlatformName,
    PJRT_Client_ProcessIndex,
    PJRT_Client_PlatformVersion,
    PJRT_Client_Devices,
    PJRT_Client_AddressableDevices,
    PJRT_Client_LookupDevice,
    PJRT_Client_LookupAddressableDevice,
    PJRT_Client_Compile,
    PJRT_Client_DefaultDeviceAssignment,
    PJRT_Client_BufferFromHostBuffer,
    PJRT_DeviceDescription_Id,
    PJRT_DeviceDescription_ProcessIndex,
    PJRT_DeviceDescription_Attributes,
    PJRT_DeviceDescription_Kind,
    PJRT_DeviceDescription_DebugString,
    PJRT_DeviceDescription_ToString,
    PJRT_Device_GetDescription,
    PJRT_Device_IsAddressable,
    PJRT_Device_LocalHardwareId,
    PJRT_Device_MemoryStats,
    PJRT_Executable_Destroy,
    PJRT_Executable_Name,
    PJRT_Executable_NumOutputs,
    PJRT_Executable_OptimizedProgram,
    PJRT_Executable_Serialize,
    PJRT_LoadedExecutable_Destroy,
    PJRT_LoadedExecutable_GetExecutable,
    PJRT_LoadedExecutable_AddressableDevices,
    PJRT_LoadedExecutable_Delete,
    PJRT_LoadedExecutable_IsDeleted,
    PJRT_LoadedExecutable_Execute,
    PJRT_Executable_DeserializeAndLoad,
    PJRT_Buffer_Destroy,
    PJRT_Buffer_ElementType,
    PJRT_Buffer_Dimensions,
    PJRT_Buffer_UnpaddedDimensions,
    PJRT_Buffer_OnDeviceSizeInBytes,
    PJRT_Buffer_Device,
    PJRT_Buffer_Delete,
    PJRT_Buffer_IsDeleted,
    PJRT_Buffer_CopyToDevice,
    PJRT_Buffer_ToHostBuffer,
    PJRT_Buffer_IsOnCpu,
    PJRT_Buffer_ReadyEvent,
    PJRT_Executable_OutputElementTypes,
    PJRT_Executable_OutputDimensions,
    PJRT_Executable_Fingerprint,
}

/// Smallest `struct_size` that covers every entry in [`REQUIRED_FUNCTIONS`].
pub const fn required_table_size() -> usize {
    let mut need = 0;
    let mut i = 0;
    while i < REQUIRED_FUNCTIONS.len() {
        let end = REQUIRED_FUNCTIONS[i].1 + core::mem::size_of::<usize>();
        if end > need {
            need = end;
        }
        i += 1;
    }
    need
}

/// End of `pjrt_api_version`: the least a table must hold before its version can be read.
const VERSION_END: usize = core::mem::offset_of!(PJRT_Api, pjrt_api_version)
    + core::mem::size_of::<crate::types::PJRT_Api_Version>();

/// Why a plugin could not be opened or initialised.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// The path names no file.
    #[error("PJRT plugin {} does not exist; expected the path of a plugin shared library", .path.display())]
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// The dynamic loader refused the file.
    #[error("cannot load {} as a shared library: {message}", .path.display())]
    Open {
        /// The path given.
        path: PathBuf,
        /// The dynamic loader's message.
        message: String,
    },
    /// The library loaded but does not export `GetPjrtApi`.
    #[error(
        "{} has no `GetPjrtApi` symbol, so it is not a PJRT plugin; expected a library exporting it ({message})",
        .path.display()
    )]
    MissingGetPjrtApi {
        /// The path given.
        path: PathBuf,
        /// The dynamic loader's message.
        message: String,
    },
    /// `GetPjrtApi` returned null.
    #[error("`GetPjrtApi` of {} returned a null pointer; expected a PJRT_Api table", .path.display())]
    NullApi {
        /// The path given.
        path: PathBuf,
    },
    /// The plugin implements a major version other than 0.
    #[error(
        "{} implements PJRT C API {major}.{minor}; expected major version {SUPPORTED_MAJOR}",
        .path.display()
    )]
    UnsupportedMajor {
        /// The path given.
        path: PathBuf,
        /// Major version reported.
        major: i32,
        /// Minor version reported.
        minor: i32,
    },
    /// The plugin is older than the table layout declared here.
    #[error(
        "{} implements PJRT C API 0.{minor}; expected 0.{MIN_SUPPORTED_MINOR} or newer, whose function table order this crate declares",
        .path.display()
    )]
    UnsupportedMinor {
        /// The path given.
        path: PathBuf,
        /// Minor version reported.
        minor: i32,
    },
    /// The table ends before functions that are needed.
    #[error(
        "{} ({version}) has a {got}-byte PJRT_Api table; expected at least {need} bytes; missing: {missing}",
        .path.display()
    )]
    TableTooShort {
        /// The path given.
        path: PathBuf,
        /// The version, as far as it could be read.
        version: String,
        /// The table's `struct_size`.
        got: usize,
        /// Bytes needed.
        need: usize,
        /// Names of the entries that lie past `got`.
        missing: String,
    },
    /// `PJRT_Plugin_Initialize` failed.
    #[error("PJRT_Plugin_Initialize of {} failed: {error}", .path.display())]
    Initialize {
        /// The path given.
        path: PathBuf,
        /// The plugin's error.
        error: PjrtError,
    },
}

/// An opened PJRT plugin: the loaded library and a checked copy of its function table.
///
/// The library is never unloaded, even when this value is dropped: plugins start threads and
/// register thread-local destructors (libtpu does on the calling thread just by being asked for
/// its table), which would jump into unmapped code once the library was gone. Keep one per
/// plugin per process: plugins hold process-wide state, and a second instance of the same file
/// shares it.
pub struct PjrtLibrary {
    api: Box<PJRT_Api>,
    raw_api: *const PJRT_Api,
    version: (i32, i32),
    path: PathBuf,
    init: OnceLock<Result<(), PjrtError>>,
    // Never dropped, so never unloaded; see the type's documentation.
    _library: core::mem::ManuallyDrop<libloading::Library>,
}

// SAFETY: the function table is immutable once `GetPjrtApi` returned it, `api` is our own copy,
// and PJRT functions may be called from any thread; `Library` itself is Send + Sync.
unsafe impl Send for PjrtLibrary {}
// SAFETY: see `Send`; shared access only reads the table, and `init` is a `OnceLock`.
unsafe impl Sync for PjrtLibrary {}

impl core::fmt::Debug for PjrtLibrary {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PjrtLibrary")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("struct_size", &self.api.struct_size)
            .finish_non_exhaustive()
    }
}

impl PjrtLibrary {
    /// Loads the plugin at `path`, calls `GetPjrtApi` and checks the table it returns.
    ///
    /// A path with a directory part must exist; a bare file name is looked up by the dynamic
    /// loader's search path. Loading runs the library's initialisers, so pass only PJRT
    /// plugins. This does not call `PJRT_Plugin_Initialize`; see [`Self::initialize`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LoadError> {
        let path = path.as_ref().to_path_buf();
        let bare_name = path.parent().is_none_or(|p| p.as_os_str().is_empty());
        if !bare_name && !path.exists() {
            return Err(LoadError::NotFound { path });
        }

        // SAFETY: loading runs the library's initialisers; the caller chose this file as a PJRT
        // plugin, and plugins' initialisers only set up their own state.
        let library = unsafe { libloading::Library::new(&path) }.map_err(|e| LoadError::Open {
            path: path.clone(),
            message: e.to_string(),
        })?;

        type GetPjrtApi = unsafe extern "C" fn() -> *const PJRT_Api;
        let raw_api = {
            // SAFETY: every PJRT plugin exports `GetPjrtApi` with exactly this signature.
            let get_api = unsafe { library.get::<GetPjrtApi>(GET_PJRT_API_SYMBOL.as_bytes()) }
                .map_err(|e| LoadError::MissingGetPjrtApi {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            // SAFETY: `GetPjrtApi` takes no arguments and returns a pointer to a static table.
            unsafe { get_api() }
        };

        // SAFETY: `raw_api` came from `GetPjrtApi` of the library we keep loaded below.
        let (api, version) = unsafe { check_table(raw_api, &path) }?;

        Ok(Self {
            api,
            raw_api,
            version,
            path,
            init: OnceLock::new(),
            _library: core::mem::ManuallyDrop::new(library),
        })
    }

    /// The plugin's function table, copied and zero-filled past the plugin's `struct_size`, so
    /// entries the plugin does not have read as `None`.
    pub fn api(&self) -> &PJRT_Api {
        &self.api
    }

    /// The table pointer exactly as `GetPjrtApi` returned it; valid while `self` lives.
    pub fn raw_api(&self) -> *const PJRT_Api {
        self.raw_api
    }

    /// `(major, minor)` PJRT C API version the plugin implements.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// Size in bytes of the plugin's own table.
    pub fn struct_size(&self) -> usize {
        self.api.struct_size
    }

    /// The path the plugin was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Calls `PJRT_Plugin_Initialize` the first time; later calls return the cached outcome,
    /// failure included, without calling the plugin again.
    pub fn initialize(&self) -> Result<(), LoadError> {
        let outcome = self.init.get_or_init(|| {
            let Some(init) = self.api.PJRT_Plugin_Initialize else {
                // Nothing to run: the plugin does not ask to be initialised.
                return Ok(());
            };
            let mut args = PJRT_Plugin_Initialize_Args::new();
            // SAFETY: `init` is this plugin's entry and `args` has the declared layout.
            let error = unsafe { init(&mut args) };
            // SAFETY: `error` was just returned by this plugin and is owned by us alone.
            match unsafe { take_error(&self.api, error) } {
                None => Ok(()),
                Some(e) => Err(e),
            }
        });
        outcome.clone().map_err(|error| LoadError::Initialize {
            path: self.path.clone(),
            error,
        })
    }

    /// Reads and destroys an error returned by this plugin; see [`crate::take_error`].
    ///
    /// # Safety
    ///
    /// `error` must be null or a live error returned by this plugin that nobody uses after.
    pub unsafe fn take_error(&self, error: *mut PJRT_Error) -> Option<PjrtError> {
        // SAFETY: forwarded caller contract; `self.api` is this plugin's table.
        unsafe { take_error(&self.api, error) }
    }

    /// `Ok` for a null error, otherwise the error read and destroyed.
    ///
    /// # Safety
    ///
    /// As for [`Self::take_error`].
    pub unsafe fn check(&self, error: *mut PJRT_Error) -> Result<(), PjrtError> {
        // SAFETY: forwarded caller contract.
        match unsafe { self.take_error(error) } {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

/// Validates a table from `GetPjrtApi` and returns a padded copy plus its version.
///
/// `struct_size` is read before anything else, and nothing past it is ever read.
///
/// # Safety
///
/// `raw` must be null or point to at least `struct_size` readable bytes of a PJRT_Api table
/// (whose first field is that `struct_size`), valid for the duration of the call.
pub(crate) unsafe fn check_table(
    raw: *const PJRT_Api,
    path: &Path,
) -> Result<(Box<PJRT_Api>, (i32, i32)), LoadError> {
    if raw.is_null() {
        return Err(LoadError::NullApi {
            path: path.to_path_buf(),
        });
    }
    // SAFETY: every table starts with its size; `raw` is non-null and readable (contract).
    let struct_size = unsafe { core::ptr::addr_of!((*raw).struct_size).read_unaligned() };
    if struct_size < VERSION_END {
        return Err(LoadError::TableTooShort {
            path: path.to_path_buf(),
            version: String::from("version unreadable"),
            got: struct_size,
            need: VERSION_END,
            missing: String::from("pjrt_api_version"),
        });
    }
    // SAFETY: the version lies within the first `VERSION_END <= struct_size` bytes.
    let (major, minor) = unsafe {
        (
            core::ptr::addr_of!((*raw).pjrt_api_version.major_version).read_unaligned(),
            core::ptr::addr_of!((*raw).pjrt_api_version.minor_version).read_unaligned(),
        )
    };
    let path_buf = || path.to_path_buf();
    if major != SUPPORTED_MAJOR {
        return Err(LoadError::UnsupportedMajor {
            path: path_buf(),
            major,
            minor,
        });
    }
    if minor < MIN_SUPPORTED_MINOR {
        return Err(LoadError::UnsupportedMinor {
            path: path_buf(),
            minor,
        });
    }
    let need = required_table_size();
    if struct_size < need {
        let missing: Vec<&str> = REQUIRED_FUNCTIONS
            .iter()
            .filter(|(_, offset)| !PJRT_Api::covers(struct_size, *offset))
            .map(|(name, _)| *name)
            .collect();
        return Err(LoadError::TableTooShort {
            path: path_buf(),
            version: format!("PJRT C API {major}.{minor}"),
            got: struct_size,
            need,
            missing: missing.join(", "),
        });
    }

    let mut copy = Box::new(PJRT_Api::zeroed());
    let len = struct_size.min(core::mem::size_of::<PJRT_Api>());
    // SAFETY: `raw` has `struct_size >= len` readable bytes (contract), `copy` is a distinct
    // allocation of `size_of::<PJRT_Api>() >= len` bytes, and every byte pattern the plugin
    // wrote is a valid value of the integer, pointer and nullable-function fields.
    unsafe {
        core::ptr::copy_nonoverlapping(
            raw.cast::<u8>(),
            (&mut *copy as *mut PJRT_Api).cast::<u8>(),
            len,
        );
    }
    Ok((copy, (major, minor)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(struct_size: usize, major: i32, minor: i32) -> PJRT_Api {
        let mut t = PJRT_Api::zeroed();
        t.struct_size = struct_size;
        t.pjrt_api_version.struct_size = crate::types::PJRT_Api_Version::STRUCT_SIZE;
        t.pjrt_api_version.major_version = major;
        t.pjrt_api_version.minor_version = minor;
        t
    }

    fn check(t: &PJRT_Api) -> Result<(Box<PJRT_Api>, (i32, i32)), LoadError> {
        // SAFETY: `t` is a full-size table, so every byte up to any `struct_size` we set here
        // (never above `size_of::<PJRT_Api>()`) is readable.
        unsafe { check_table(t, Path::new("/fake/plugin.so")) }
    }

    #[test]
    fn null_table_is_refused() {
        // SAFETY: null is explicitly allowed.
        let err = unsafe { check_table(core::ptr::null(), Path::new("x.so")) }.unwrap_err();
        assert!(matches!(err, LoadError::NullApi { .. }), "{err}");
        assert!(err.to_string().contains("null"), "{err}");
    }

    #[test]
    fn version_must_be_readable() {
        let err = check(&table(24, 0, 115)).unwrap_err();
        assert!(
            matches!(
                err,
                LoadError::TableTooShort {
                    got: 24,
                    need: 40,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn major_other_than_zero_is_refused() {
        let err = check(&table(PJRT_Api::DECLARED_SIZE, 1, 2)).unwrap_err();
        assert!(matches!(
            err,
            LoadError::UnsupportedMajor {
                major: 1,
                minor: 2,
                ..
            }
        ));
        let text = err.to_string();
        assert!(
            text.contains("1.2") && text.contains("expected major version 0"),
            "{text}"
        );
    }

    #[test]
    fn pre_reorder_minor_is_refused() {
        let err = check(&table(PJRT_Api::DECLARED_SIZE, 0, 40)).unwrap_err();
        assert!(
            matches!(err, LoadError::UnsupportedMinor { minor: 40, .. }),
            "{err}"
        );
    }

    #[test]
    fn short_table_names_missing_functions() {
        // Ends right before PJRT_Executable_OutputElementTypes.
        let end = PJRT_Api::function_offset("PJRT_Executable_OutputElementTypes").unwrap();
        let err = check(&table(end, 0, 60)).unwrap_err();
        let LoadError::TableTooShort {
            got, need, missing, ..
        } = &err
        else {
            panic!("unexpected {err}");
        };
        assert_eq!(*got, end);
        assert_eq!(*need, required_table_size());
        assert_eq!(
            missing,
            "PJRT_Executable_OutputElementTypes, PJRT_Executable_OutputDimensions, \
             PJRT_Executable_Fingerprint"
        );
        assert!(
            err.to_string().contains("PJRT_Executable_Fingerprint"),
            "{err}"
        );
    }

    #[test]
    fn shorter_table_is_copied_and_padded() {
        // A 0.81-sized table: 118 entries. Fill every entry with a marker, then check that the
        // copy keeps the first 118 and reads the rest as absent.
        extern "C" fn marker(_: *mut core::ffi::c_void) -> *mut PJRT_Error {
            core::ptr::null_mut()
        }
        let size = PJRT_Api::FIRST_FUNCTION_OFFSET + 118 * 8;
        let mut t = table(size, 0, 81);
        t.PJRT_LoadedExecutable_GetDeviceAssignment = Some(marker);
        t.PJRT_Client_CreateErrorBuffer = Some(marker);
        let (copy, version) = check(&t).unwrap();
        assert_eq!(version, (0, 81));
        assert_eq!(copy.struct_size, size);
        assert!(
            copy.PJRT_LoadedExecutable_GetDeviceAssignment.is_some(),
            "entry 117 is inside"
        );
        assert!(
            copy.PJRT_Client_CreateErrorBuffer.is_none(),
            "entry 118 lies past the table"
        );
    }

    #[test]
    fn required_size_reaches_executable_fingerprint() {
        let fp = core::mem::offset_of!(PJRT_Api, PJRT_Executable_Fingerprint);
        assert_eq!(required_table_size(), fp + 8);
        assert_eq!(required_table_size(), 800);
    }
}
