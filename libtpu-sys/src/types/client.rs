//! Client creation, queries, compilation and host-to-device uploads.

use core::ffi::{c_char, c_void};

use super::{
    PJRT_Buffer, PJRT_Buffer_MemoryLayout, PJRT_Buffer_Type, PJRT_CallbackError, PJRT_Client,
    PJRT_Device, PJRT_Error, PJRT_Event, PJRT_LoadedExecutable, PJRT_Memory, PJRT_NamedValue,
    PJRT_TopologyDescription,
};

/// Frees a value returned by a key-value get callback.
pub type PJRT_KeyValueGetCallback_ValueDeleter = Option<unsafe extern "C" fn(value: *mut c_char)>;

/// Frees a value returned by a key-value try-get callback.
pub type PJRT_KeyValueTryGetCallback_ValueDeleter =
    Option<unsafe extern "C" fn(value: *mut c_char)>;

pjrt_struct! {
    /// Arguments the plugin passes to a caller's blocking key-value get callback.
    PJRT_KeyValueGetCallback_Args, last = value_deleter_callback;
    {
        /// Key bytes.
        key: *const c_char,
        /// Length of `key`.
        key_size: usize,
        /// How long to wait for the key.
        timeout_in_ms: i32,
        /// Builds the error to return on failure.
        callback_error: *mut PJRT_CallbackError,
        /// The caller's `kv_get_user_arg`.
        user_arg: *mut c_void,
        /// Out: value bytes.
        value: *mut c_char,
        /// Out: length of `value`.
        value_size: usize,
        /// Out: frees `value` once the plugin copied it.
        value_deleter_callback: PJRT_KeyValueGetCallback_ValueDeleter,
    }
}

pjrt_struct! {
    /// Arguments the plugin passes to a caller's non-blocking key-value get callback.
    PJRT_KeyValueTryGetCallback_Args, last = value_deleter_callback;
    {
        /// Key bytes.
        key: *const c_char,
        /// Length of `key`.
        key_size: usize,
        /// Builds the error to return on failure (NOT_FOUND when absent).
        callback_error: *mut PJRT_CallbackError,
        /// The caller's `kv_try_get_user_arg`.
        user_arg: *mut c_void,
        /// Out: value bytes.
        value: *mut c_char,
        /// Out: length of `value`.
        value_size: usize,
        /// Out: frees `value` once the plugin copied it.
        value_deleter_callback: PJRT_KeyValueTryGetCallback_ValueDeleter,
    }
}

pjrt_struct! {
    /// Arguments the plugin passes to a caller's key-value put callback.
    PJRT_KeyValuePutCallback_Args, last = user_arg;
    {
        /// Key bytes.
        key: *const c_char,
        /// Length of `key`.
        key_size: usize,
        /// Value bytes, valid only during the call.
        value: *const c_char,
        /// Length of `value`.
        value_size: usize,
        /// Builds the error to return on failure.
        callback_error: *mut PJRT_CallbackError,
        /// The caller's `kv_put_user_arg`.
        user_arg: *mut c_void,
    }
}

/// Blocking key-value get provided by the caller for multi-process clients.
pub type PJRT_KeyValueGetCallback =
    Option<unsafe extern "C" fn(args: *mut PJRT_KeyValueGetCallback_Args) -> *mut PJRT_Error>;

/// Non-blocking key-value get provided by the caller for multi-process clients.
pub type PJRT_KeyValueTryGetCallback =
    Option<unsafe extern "C" fn(args: *mut PJRT_KeyValueTryGetCallback_Args) -> *mut PJRT_Error>;

/// Key-value put provided by the caller for multi-process clients.
pub type PJRT_KeyValuePutCallback =
    Option<unsafe extern "C" fn(args: *mut PJRT_KeyValuePutCallback_Args) -> *mut PJRT_Error>;

pjrt_struct! {
    /// Arguments of `PJRT_Client_Create`.
    PJRT_Client_Create_Args, last = kv_try_get_user_arg;
    {
        /// In: platform-specific options, e.g. `cpu_device_count` for the CPU plugin.
        create_options: *const PJRT_NamedValue,
        /// In: number of `create_options`.
        num_options: usize,
        /// In: optional key-value get for multi-process setups.
        kv_get_callback: PJRT_KeyValueGetCallback,
        /// In: passed to `kv_get_callback`.
        kv_get_user_arg: *mut c_void,
        /// In: optional key-value put for multi-process setups.
        kv_put_callback: PJRT_KeyValuePutCallback,
        /// In: passed to `kv_put_callback`.
        kv_put_user_arg: *mut c_void,
        /// Out: the new client.
        client: *mut PJRT_Client,
        /// In: optional non-blocking key-value get.
        kv_try_get_callback: PJRT_KeyValueTryGetCallback,
        /// In: passed to `kv_try_get_callback`.
        kv_try_get_user_arg: *mut c_void,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Client_Destroy`.
    PJRT_Client_Destroy_Args, last = client;
    {
        /// In: the client to shut down and free; null is allowed.
        client: *mut PJRT_Client,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Client_PlatformName`.
    PJRT_Client_PlatformName_Args, last = platform_name_size;
    {
        /// In: the client.
        client: *mut PJRT_Client,
        /// Out: e.g. "cpu" or "tpu", owned by the client, not NUL-terminated.
        platform_name: *const c_char,
        /// Out: length of `platform_name`.
        platform_name_size: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Client_ProcessIndex`.
    PJRT_Client_ProcessIndex_Args, last = process_index;
    {
        /// In: the client.
        client: *mut PJRT_Client,
        /// Out: this process's index, 0 when single-process.
        process_index: i32,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Client_PlatformVersion`.
    PJRT_Client_PlatformVersion_Args, last = platform_version_size;
    {
        /// In: the client.
        client: *mut PJRT_Client,
        /// Out: human-readable version, owned by the client, not NUL-terminated.
        platform_version: *const c_char,
        /// Out: length of `platform_version`.
        platform_version_size: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Client_Devices` (all devices, addressable or not).
    PJRT_Client_Devices_Args, last = num_devices;
    {
        /// In: the client.
        client: *mut PJRT_Client,
        /// Out: device array owned by the client.
        devices: *const *mut PJRT_Device,
        /// Out: number of `devices`.
        num_devices: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Client_AddressableDevices` (devices this process can use).
    PJRT_Client_AddressableDevices_Args, last = num_addressable_devices;
    {
        /// In: the client.
        client: *mut PJRT_Client,
        /// Out: device array owned by the client.
        addressable_devices: *const *mut PJRT_Device,
        /// Out: number of `addressable_devices`.
        num_addressable_devices: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Client_LookupDevice`.
    PJRT_Client_LookupDevice_Args, last = device;
    {
        /// In: the client.
        client: *mut PJRT_Client,
        /// In: global device id.
        id: i32,
        /// Out: the device, owned by the client.
        device: *mut PJRT_Device,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Client_LookupAddressableDevice`.
    PJRT_Client_LookupAddressableDevice_Args, last = addressable_device;
    {
        /// In: the client.
        client: *mut PJRT_Client,
        /// In: local hardware id of the device.
        local_hardware_id: i32,
        /// Out: the device, owned by the client.
        addressable_device: *mut PJRT_Device,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Client_AddressableMemories`.
    PJRT_Client_AddressableMemories_Args, last = num_addressable_memories;
    {
        /// In: the client.
        client: *mut PJRT_Client,
        /// Out: memory array owned by the client.
        addressable_memories: *const *mut PJRT_Memory,
        /// Out: number of `addressable_memories`.
        num_addressable_memories: usize,
    }
}

pjrt_struct! {
    /// A program to compile, or the out-parameter of `PJRT_Executable_OptimizedProgram`.
    PJRT_Program, last = format_size;
    {
        /// Program bytes (MLIR bytecode or text for "mlir", a serialized module for "hlo").
        code: *mut c_char,
        /// Length of `code`.
        code_size: usize,
        /// Format name, e.g. "mlir" or "hlo", not NUL-terminated.
        format: *const c_char,
        /// Length of `format`.
        format_size: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Client_Compile`.
    PJRT_Client_Compile_Args, last = executable;
    {
        /// In: the client.
        client: *mut PJRT_Client,
        /// In: the program.
        program: *const PJRT_Program,
        /// In: a serialized `xla.CompileOptionsProto`.
        compile_options: *const c_char,
        /// In: length of `compile_options`.
        compile_options_size: usize,
        /// Out: the compiled, loaded executable.
        executable: *mut PJRT_LoadedExecutable,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Client_DefaultDeviceAssignment`.
    PJRT_Client_DefaultDeviceAssignment_Args, last = default_assignment;
    {
        /// In: the client.
        client: *mut PJRT_Client,
        /// In: number of replicas.
        num_replicas: i32,
        /// In: number of partitions.
        num_partitions: i32,
        /// In: length of `default_assignment`, at least replicas times partitions.
        default_assignment_size: usize,
        /// In: caller-owned array the plugin fills with device ids, replica-major.
        default_assignment: *mut i32,
    }
}

pjrt_enum! {
    /// How long the plugin may keep reading the host data given to `BufferFromHostBuffer`.
    PJRT_HostBufferSemantics {
        /// Only during the call; the plugin copies before returning.
        IMMUTABLE_ONLY_DURING_CALL = 0,
        /// Until `done_with_host_buffer` fires; the caller must not change the data meanwhile.
        IMMUTABLE_UNTIL_TRANSFER_COMPLETES = 1,
        /// The buffer may alias the host data for its whole life; the data must not change.
        IMMUTABLE_ZERO_COPY = 2,
        /// The buffer may alias the host data, and the device may write to it.
        MUTABLE_ZERO_COPY = 3,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Client_BufferFromHostBuffer`.
    PJRT_Client_BufferFromHostBuffer_Args, last = buffer;
    {
        /// In: the client.
        client: *mut PJRT_Client,
        /// In: host data.
        data: *const c_void,
        /// In: element type.
        type_: PJRT_Buffer_Type,
        /// In: dimensions.
        dims: *const i64,
        /// In: number of `dims`.
        num_dims: usize,
        /// In: optional byte strides; null means dense major-to-minor.
        byte_strides: *const i64,
        /// In: number of `byte_strides` (0 or `num_dims`).
        num_byte_strides: usize,
        /// In: how long `data` must stay valid and unchanged.
        host_buffer_semantics: PJRT_HostBufferSemantics,
        /// In: target device (or set `memory`).
        device: *mut PJRT_Device,
        /// In: target memory space; overrides `device` when set.
        memory: *mut PJRT_Memory,
        /// In: optional device layout; null for the default.
        device_layout: *mut PJRT_Buffer_MemoryLayout,
        /// Out: fires once the plugin no longer reads `data`.
        done_with_host_buffer: *mut PJRT_Event,
        /// Out: the new buffer.
        buffer: *mut PJRT_Buffer,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Client_TopologyDescription`.
    PJRT_Client_TopologyDescription_Args, last = topology;
    {
        /// In: the client.
        client: *mut PJRT_Client,
        /// Out: topology owned by the client.
        topology: *mut PJRT_TopologyDescription,
    }
}
