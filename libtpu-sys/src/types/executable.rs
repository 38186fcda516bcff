//! Executables, loaded executables, execution and (de)serialization.

use core::ffi::{c_char, c_void};

use super::{
    PJRT_Buffer, PJRT_Buffer_Type, PJRT_Client, PJRT_Device, PJRT_Event, PJRT_Executable,
    PJRT_ExecuteContext, PJRT_LoadOptions, PJRT_LoadedExecutable, PJRT_NamedValue, PJRT_Program,
    PJRT_SerializedExecutable,
};

pjrt_struct! {
    /// Arguments of `PJRT_Executable_Destroy`.
    PJRT_Executable_Destroy_Args, last = executable;
    {
        /// In: the executable to free.
        executable: *mut PJRT_Executable,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Executable_Name`.
    PJRT_Executable_Name_Args, last = executable_name_size;
    {
        /// In: the executable.
        executable: *mut PJRT_Executable,
        /// Out: name owned by the executable, not NUL-terminated.
        executable_name: *const c_char,
        /// Out: length of `executable_name`.
        executable_name_size: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Executable_NumReplicas`.
    PJRT_Executable_NumReplicas_Args, last = num_replicas;
    {
        /// In: the executable.
        executable: *mut PJRT_Executable,
        /// Out: replica count it was compiled for.
        num_replicas: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Executable_NumPartitions`.
    PJRT_Executable_NumPartitions_Args, last = num_partitions;
    {
        /// In: the executable.
        executable: *mut PJRT_Executable,
        /// Out: partition count it was compiled for.
        num_partitions: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Executable_NumOutputs`.
    PJRT_Executable_NumOutputs_Args, last = num_outputs;
    {
        /// In: the executable.
        executable: *mut PJRT_Executable,
        /// Out: number of outputs per device.
        num_outputs: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Executable_SizeOfGeneratedCodeInBytes`.
    PJRT_Executable_SizeOfGeneratedCodeInBytes_Args, last = size_in_bytes;
    {
        /// In: the executable.
        executable: *mut PJRT_Executable,
        /// Out: size of the generated code.
        size_in_bytes: i64,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Executable_GetCostAnalysis`.
    PJRT_Executable_GetCostAnalysis_Args, last = properties;
    {
        /// In: the executable.
        executable: *mut PJRT_Executable,
        /// Out: number of `properties`.
        num_properties: usize,
        /// Out: cost properties owned by the executable.
        properties: *const PJRT_NamedValue,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Executable_OutputMemoryKinds`.
    PJRT_Executable_OutputMemoryKinds_Args, last = memory_kind_sizes;
    {
        /// In: the executable.
        executable: *mut PJRT_Executable,
        /// Out: number of outputs.
        num_outputs: usize,
        /// Out: one memory-kind string per output.
        memory_kinds: *const *const c_char,
        /// Out: length of each `memory_kinds` entry.
        memory_kind_sizes: *const usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Executable_OptimizedProgram`.
    ///
    /// Call once with `program.code` null to learn `program.code_size`, then again with a
    /// buffer of that size.
    PJRT_Executable_OptimizedProgram_Args, last = program;
    {
        /// In: the executable.
        executable: *mut PJRT_Executable,
        /// In/out: caller-owned program whose code buffer the plugin fills.
        program: *mut PJRT_Program,
    }
}

/// Frees the holder returned by `PJRT_Executable_Serialize`.
pub type PJRT_SerializedExecutableDeleter =
    Option<unsafe extern "C" fn(exec: *mut PJRT_SerializedExecutable)>;

pjrt_struct! {
    /// Arguments of `PJRT_Executable_Serialize`.
    PJRT_Executable_Serialize_Args, last = serialized_executable_deleter;
    {
        /// In: the executable.
        executable: *const PJRT_Executable,
        /// Out: serialized bytes, valid until the holder is freed.
        serialized_bytes: *const c_char,
        /// Out: length of `serialized_bytes`.
        serialized_bytes_size: usize,
        /// Out: holder of the bytes.
        serialized_executable: *mut PJRT_SerializedExecutable,
        /// Out: frees `serialized_executable`; call exactly once.
        serialized_executable_deleter: PJRT_SerializedExecutableDeleter,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Executable_OutputElementTypes`.
    PJRT_Executable_OutputElementTypes_Args, last = num_output_types;
    {
        /// In: the executable.
        executable: *mut PJRT_Executable,
        /// Out: one element type per output, owned by the executable.
        output_types: *const PJRT_Buffer_Type,
        /// Out: number of `output_types`.
        num_output_types: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Executable_OutputDimensions`.
    PJRT_Executable_OutputDimensions_Args, last = dim_sizes;
    {
        /// In: the executable.
        executable: *mut PJRT_Executable,
        /// Out: number of outputs.
        num_outputs: usize,
        /// Out: every output's dimensions, concatenated.
        dims: *const i64,
        /// Out: rank of each output, to split `dims`.
        dim_sizes: *const usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Executable_Fingerprint`.
    PJRT_Executable_Fingerprint_Args, last = executable_fingerprint_size;
    {
        /// In: the executable.
        executable: *mut PJRT_Executable,
        /// Out: fingerprint bytes owned by the executable; null if the plugin has none.
        executable_fingerprint: *const c_char,
        /// Out: length of `executable_fingerprint`.
        executable_fingerprint_size: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Executable_GetCompiledMemoryStats`.
    PJRT_Executable_GetCompiledMemoryStats_Args, last = peak_unpadded_heap_bytes;
    {
        /// In: the executable.
        executable: *mut PJRT_Executable,
        /// Out: device code size.
        generated_code_size_in_bytes: i64,
        /// Out: device argument bytes.
        argument_size_in_bytes: i64,
        /// Out: device output bytes.
        output_size_in_bytes: i64,
        /// Out: device bytes shared by arguments and outputs.
        alias_size_in_bytes: i64,
        /// Out: device scratch bytes.
        temp_size_in_bytes: i64,
        /// Out: host code size.
        host_generated_code_size_in_bytes: i64,
        /// Out: host argument bytes.
        host_argument_size_in_bytes: i64,
        /// Out: host output bytes.
        host_output_size_in_bytes: i64,
        /// Out: host aliased bytes.
        host_alias_size_in_bytes: i64,
        /// Out: host scratch bytes.
        host_temp_size_in_bytes: i64,
        /// Out: peak device memory.
        peak_memory_in_bytes: i64,
        /// Out: total device bytes.
        total_size_in_bytes: i64,
        /// Out: total allocated bytes.
        total_allocation_bytes: i64,
        /// Out: allocations that live for the whole program.
        indefinite_allocations: i64,
        /// Out: peak heap bytes before padding.
        peak_unpadded_heap_bytes: i64,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Executable_DeserializeAndLoad`.
    PJRT_Executable_DeserializeAndLoad_Args, last = load_options;
    {
        /// In: the client to load onto.
        client: *mut PJRT_Client,
        /// In: bytes from `PJRT_Executable_Serialize`.
        serialized_executable: *const c_char,
        /// In: length of `serialized_executable`.
        serialized_executable_size: usize,
        /// Out: the loaded executable.
        loaded_executable: *mut PJRT_LoadedExecutable,
        /// In: optional serialized `CompileOptionsProto` replacing the stored one.
        overridden_serialized_compile_options: *const c_char,
        /// In: length of `overridden_serialized_compile_options`.
        overridden_serialized_compile_options_size: usize,
        /// In: optional load options; null for defaults.
        load_options: *const PJRT_LoadOptions,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_LoadedExecutable_Destroy`.
    PJRT_LoadedExecutable_Destroy_Args, last = executable;
    {
        /// In: the loaded executable to free.
        executable: *mut PJRT_LoadedExecutable,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_LoadedExecutable_GetExecutable`.
    PJRT_LoadedExecutable_GetExecutable_Args, last = executable;
    {
        /// In: the loaded executable.
        loaded_executable: *mut PJRT_LoadedExecutable,
        /// Out: a new executable handle the caller must destroy.
        executable: *mut PJRT_Executable,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_LoadedExecutable_AddressableDevices`.
    PJRT_LoadedExecutable_AddressableDevices_Args, last = num_addressable_devices;
    {
        /// In: the loaded executable.
        executable: *mut PJRT_LoadedExecutable,
        /// Out: devices it runs on, owned by the executable.
        addressable_devices: *const *mut PJRT_Device,
        /// Out: number of `addressable_devices`.
        num_addressable_devices: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_LoadedExecutable_Delete`, which frees device code but not the handle.
    PJRT_LoadedExecutable_Delete_Args, last = executable;
    {
        /// In: the loaded executable.
        executable: *mut PJRT_LoadedExecutable,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_LoadedExecutable_IsDeleted`.
    PJRT_LoadedExecutable_IsDeleted_Args, last = is_deleted;
    {
        /// In: the loaded executable.
        executable: *mut PJRT_LoadedExecutable,
        /// Out: whether `Delete` was called.
        is_deleted: bool,
    }
}

pjrt_struct! {
    /// Arguments of the deprecated `PJRT_LoadedExecutable_Fingerprint`.
    PJRT_LoadedExecutable_Fingerprint_Args, last = executable_fingerprint_size;
    {
        /// In: the loaded executable.
        executable: *mut PJRT_LoadedExecutable,
        /// Out: fingerprint bytes; null if the plugin has none.
        executable_fingerprint: *const c_char,
        /// Out: length of `executable_fingerprint`.
        executable_fingerprint_size: usize,
    }
}

pjrt_struct! {
    /// Options of one `PJRT_LoadedExecutable_Execute` call; `new()` gives the defaults.
    ///
    /// Pointers whose pointee this crate does not declare are typed `c_void`; leave them null.
    PJRT_ExecuteOptions, last = num_custom_options;
    {
        /// In: per-device arrays of send callbacks; null when the program has none.
        send_callbacks: *mut *mut c_void,
        /// In: per-device arrays of receive callbacks; null when the program has none.
        recv_callbacks: *mut *mut c_void,
        /// In: send callbacks per device.
        num_send_ops: usize,
        /// In: receive callbacks per device.
        num_recv_ops: usize,
        /// In: id shared by all processes taking part in one multi-host launch.
        launch_id: i32,
        /// In: argument indices that must not be donated.
        non_donatable_input_indices: *const i64,
        /// In: number of `non_donatable_input_indices`.
        num_non_donatable_input_indices: usize,
        /// In: optional execution context.
        context: *mut PJRT_ExecuteContext,
        /// In: optional call-site information; leave null.
        call_location: *const c_void,
        /// In: number of `task_ids` and `incarnation_ids`.
        num_tasks: usize,
        /// In: optional task ids; leave null.
        task_ids: *const c_void,
        /// In: optional incarnation ids; leave null.
        incarnation_ids: *const c_void,
        /// In: optional multi-slice configuration; leave null.
        multi_slice_config: *const c_void,
        /// In: layout convention for host callbacks.
        use_major_to_minor_data_layout_for_callbacks: bool,
        /// In: optional HLO output callbacks; leave null.
        hlo_output_callbacks: *const c_void,
        /// In: number of `hlo_output_callbacks`.
        num_hlo_output_callbacks: usize,
        /// In: optional runtime-specific key-value options for this one execution; null for
        /// none. Caller-owned; the plugin reads them only during the call.
        custom_options: *const PJRT_NamedValue,
        /// In: number of `custom_options`.
        num_custom_options: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_LoadedExecutable_Execute`.
    ///
    /// `argument_lists[d][a]` is argument `a` on device `d`; the plugin writes output `o` of
    /// device `d` to `output_lists[d][o]`, so the caller allocates `num_devices` arrays of
    /// `num_outputs` slots.
    PJRT_LoadedExecutable_Execute_Args, last = execute_device;
    {
        /// In: the loaded executable.
        executable: *mut PJRT_LoadedExecutable,
        /// In: execution options.
        options: *mut PJRT_ExecuteOptions,
        /// In: one argument array per device.
        argument_lists: *const *const *mut PJRT_Buffer,
        /// In: number of devices (length of `argument_lists` and `output_lists`).
        num_devices: usize,
        /// In: arguments per device.
        num_args: usize,
        /// In: caller-owned arrays the plugin fills with new output buffers.
        output_lists: *const *mut *mut PJRT_Buffer,
        /// In: optional caller-owned array of `num_devices` slots for completion events.
        device_complete_events: *mut *mut PJRT_Event,
        /// In: run a single-device program on this device instead; null otherwise.
        execute_device: *mut PJRT_Device,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_ExecuteContext_Create`.
    PJRT_ExecuteContext_Create_Args, last = context;
    {
        /// Out: the new context.
        context: *mut PJRT_ExecuteContext,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_ExecuteContext_Destroy`.
    PJRT_ExecuteContext_Destroy_Args, last = context;
    {
        /// In: the context to free.
        context: *mut PJRT_ExecuteContext,
    }
}
