//! Sizes and field offsets of every declared struct, for x86-64 / aarch64 LP64.
//!
//! Expected numbers follow C layout rules applied to the header by hand (8-byte pointers and
//! `size_t`, 4-byte `int` and enums, 1-byte `bool`, each field aligned to its size, structs
//! padded to 8). `STRUCT_SIZE` is the header's own measure: offset of the last field plus its
//! size, without tail padding.

use core::mem::{offset_of, size_of};

use libtpu_sys::*;

/// Checks `size_of`, `STRUCT_SIZE` and every listed field offset of an argument struct.
macro_rules! layout {
    ($ty:ident, size = $size:expr, struct_size = $ss:expr, { $( $field:ident = $off:expr ),* $(,)? }) => {{
        assert_eq!(size_of::<$ty>(), $size, "size_of::<{}>()", stringify!($ty));
        assert_eq!($ty::STRUCT_SIZE, $ss, "{}::STRUCT_SIZE", stringify!($ty));
        assert_eq!(offset_of!($ty, struct_size), 0, "{}.struct_size", stringify!($ty));
        assert_eq!(offset_of!($ty, extension_start), 8, "{}.extension_start", stringify!($ty));
        $( assert_eq!(offset_of!($ty, $field), $off, "{}.{}", stringify!($ty), stringify!($field)); )*
        assert_eq!($ty::new().struct_size, $ss, "{}::new().struct_size", stringify!($ty));
    }};
}

#[test]
fn common_structs() {
    assert_eq!(size_of::<PJRT_Extension_Base>(), 24);
    assert_eq!(offset_of!(PJRT_Extension_Base, struct_size), 0);
    assert_eq!(offset_of!(PJRT_Extension_Base, type_), 8);
    assert_eq!(offset_of!(PJRT_Extension_Base, next), 16);
    layout!(PJRT_Api_Version, size = 24, struct_size = 24, { major_version = 16, minor_version = 20 });
    assert_eq!(size_of::<PJRT_Error_Code>(), 4);
    assert_eq!(size_of::<PJRT_Buffer_Type>(), 4);
    assert_eq!(size_of::<PjrtFn<PJRT_Client_Create_Args>>(), 8);
    assert_eq!(size_of::<PjrtVoidFn<PJRT_Error_Destroy_Args>>(), 8);
}

#[test]
fn error_structs() {
    layout!(PJRT_Error_Destroy_Args, size = 24, struct_size = 24, {
        error = 16
    });
    layout!(PJRT_Error_Message_Args, size = 40, struct_size = 40, {
        error = 16, message = 24, message_size = 32,
    });
    layout!(PJRT_Error_GetCode_Args, size = 32, struct_size = 28, { error = 16, code = 24 });
    layout!(PJRT_Error_ForEachPayload_Args, size = 40, struct_size = 40, {
        error = 16, visitor = 24, user_arg = 32,
    });
}

#[test]
fn named_value() {
    assert_eq!(size_of::<PJRT_NamedValue_Value>(), 8);
    assert_eq!(size_of::<PJRT_NamedValue>(), 56);
    assert_eq!(PJRT_NamedValue::STRUCT_SIZE, 56);
    assert_eq!(offset_of!(PJRT_NamedValue, struct_size), 0);
    assert_eq!(offset_of!(PJRT_NamedValue, extension_start), 8);
    assert_eq!(offset_of!(PJRT_NamedValue, name), 16);
    assert_eq!(offset_of!(PJRT_NamedValue, name_size), 24);
    assert_eq!(offset_of!(PJRT_NamedValue, type_), 32);
    assert_eq!(offset_of!(PJRT_NamedValue, value), 40);
    assert_eq!(offset_of!(PJRT_NamedValue, value_size), 48);
    let v = PJRT_NamedValue::new_int64("cpu_device_count", 4);
    assert_eq!(v.struct_size, 56);
    assert_eq!(v.name_size, 16);
    assert_eq!(v.type_, PJRT_NamedValue_Type::INT64);
    assert_eq!(v.value_size, 1);
}

#[test]
fn plugin_and_event_structs() {
    layout!(PJRT_Plugin_Initialize_Args, size = 16, struct_size = 16, {});
    layout!(PJRT_Plugin_Attributes_Args, size = 32, struct_size = 32, {
        attributes = 16, num_attributes = 24,
    });
    layout!(PJRT_Event_Destroy_Args, size = 24, struct_size = 24, {
        event = 16
    });
    layout!(PJRT_Event_IsReady_Args, size = 32, struct_size = 25, { event = 16, is_ready = 24 });
    layout!(PJRT_Event_Error_Args, size = 24, struct_size = 24, {
        event = 16
    });
    layout!(PJRT_Event_Await_Args, size = 24, struct_size = 24, {
        event = 16
    });
    layout!(PJRT_Event_OnReady_Args, size = 40, struct_size = 40, {
        event = 16, callback = 24, user_arg = 32,
    });
    layout!(PJRT_Event_Create_Args, size = 24, struct_size = 24, {
        event = 16
    });
    layout!(PJRT_Event_Set_Args, size = 48, struct_size = 48, {
        event = 16, error_code = 24, error_message = 32, error_message_size = 40,
    });
}

#[test]
fn key_value_callback_structs() {
    layout!(PJRT_KeyValueGetCallback_Args, size = 80, struct_size = 80, {
        key = 16, key_size = 24, timeout_in_ms = 32, callback_error = 40, user_arg = 48,
        value = 56, value_size = 64, value_deleter_callback = 72,
    });
    layout!(PJRT_KeyValueTryGetCallback_Args, size = 72, struct_size = 72, {
        key = 16, key_size = 24, callback_error = 32, user_arg = 40, value = 48,
        value_size = 56, value_deleter_callback = 64,
    });
    layout!(PJRT_KeyValuePutCallback_Args, size = 64, struct_size = 64, {
        key = 16, key_size = 24, value = 32, value_size = 40, callback_error = 48,
        user_arg = 56,
    });
}

#[test]
fn client_structs() {
    layout!(PJRT_Client_Create_Args, size = 88, struct_size = 88, {
        create_options = 16, num_options = 24, kv_get_callback = 32, kv_get_user_arg = 40,
        kv_put_callback = 48, kv_put_user_arg = 56, client = 64, kv_try_get_callback = 72,
        kv_try_get_user_arg = 80,
    });
    layout!(PJRT_Client_Destroy_Args, size = 24, struct_size = 24, {
        client = 16
    });
    layout!(PJRT_Client_PlatformName_Args, size = 40, struct_size = 40, {
        client = 16, platform_name = 24, platform_name_size = 32,
    });
    layout!(PJRT_Client_ProcessIndex_Args, size = 32, struct_size = 28, {
        client = 16, process_index = 24,
    });
    layout!(PJRT_Client_PlatformVersion_Args, size = 40, struct_size = 40, {
        client = 16, platform_version = 24, platform_version_size = 32,
    });
    layout!(PJRT_Client_Devices_Args, size = 40, struct_size = 40, {
        client = 16, devices = 24, num_devices = 32,
    });
    layout!(PJRT_Client_AddressableDevices_Args, size = 40, struct_size = 40, {
        client = 16, addressable_devices = 24, num_addressable_devices = 32,
    });
    layout!(PJRT_Client_LookupDevice_Args, size = 40, struct_size = 40, {
        client = 16, id = 24, device = 32,
    });
    layout!(PJRT_Client_LookupAddressableDevice_Args, size = 40, struct_size = 40, {
        client = 16, local_hardware_id = 24, addressable_device = 32,
    });
    layout!(PJRT_Client_AddressableMemories_Args, size = 40, struct_size = 40, {
        client = 16, addressable_memories = 24, num_addressable_memories = 32,
    });
    layout!(PJRT_Program, size = 48, struct_size = 48, {
        code = 16, code_size = 24, format = 32, format_size = 40,
    });
    layout!(PJRT_Client_Compile_Args, size = 56, struct_size = 56, {
        client = 16, program = 24, compile_options = 32, compile_options_size = 40,
        executable = 48,
    });
    layout!(PJRT_Client_DefaultDeviceAssignment_Args, size = 48, struct_size = 48, {
        client = 16, num_replicas = 24, num_partitions = 28, default_assignment_size = 32,
        default_assignment = 40,
    });
    layout!(PJRT_Client_BufferFromHostBuffer_Args, size = 120, struct_size = 120, {
        client = 16, data = 24, type_ = 32, dims = 40, num_dims = 48, byte_strides = 56,
        num_byte_strides = 64, host_buffer_semantics = 72, device = 80, memory = 88,
        device_layout = 96, done_with_host_buffer = 104, buffer = 112,
    });
    layout!(PJRT_Client_TopologyDescription_Args, size = 32, struct_size = 32, {
        client = 16, topology = 24,
    });
    assert_eq!(size_of::<PJRT_HostBufferSemantics>(), 4);
}

#[test]
fn device_structs() {
    layout!(PJRT_DeviceDescription_Id_Args, size = 32, struct_size = 28, {
        device_description = 16, id = 24,
    });
    layout!(PJRT_DeviceDescription_ProcessIndex_Args, size = 32, struct_size = 28, {
        device_description = 16, process_index = 24,
    });
    layout!(PJRT_DeviceDescription_Attributes_Args, size = 40, struct_size = 40, {
        device_description = 16, num_attributes = 24, attributes = 32,
    });
    layout!(PJRT_DeviceDescription_Kind_Args, size = 40, struct_size = 40, {
        device_description = 16, device_kind = 24, device_kind_size = 32,
    });
    layout!(PJRT_DeviceDescription_DebugString_Args, size = 40, struct_size = 40, {
        device_description = 16, debug_string = 24, debug_string_size = 32,
    });
    layout!(PJRT_DeviceDescription_ToString_Args, size = 40, struct_size = 40, {
        device_description = 16, to_string = 24, to_string_size = 32,
    });
    layout!(PJRT_Device_GetDescription_Args, size = 32, struct_size = 32, {
        device = 16, device_description = 24,
    });
    layout!(PJRT_Device_IsAddressable_Args, size = 32, struct_size = 25, {
        device = 16, is_addressable = 24,
    });
    layout!(PJRT_Device_LocalHardwareId_Args, size = 32, struct_size = 28, {
        device = 16, local_hardware_id = 24,
    });
    layout!(PJRT_Device_AddressableMemories_Args, size = 40, struct_size = 40, {
        device = 16, memories = 24, num_memories = 32,
    });
    layout!(PJRT_Device_DefaultMemory_Args, size = 32, struct_size = 32, {
        device = 16, memory = 24,
    });
    layout!(PJRT_Device_MemoryStats_Args, size = 208, struct_size = 201, {
        device = 16, bytes_in_use = 24, peak_bytes_in_use = 32, peak_bytes_in_use_is_set = 40,
        num_allocs = 48, num_allocs_is_set = 56, largest_alloc_size = 64,
        largest_alloc_size_is_set = 72, bytes_limit = 80, bytes_limit_is_set = 88,
        bytes_reserved = 96, bytes_reserved_is_set = 104, peak_bytes_reserved = 112,
        peak_bytes_reserved_is_set = 120, bytes_reservable_limit = 128,
        bytes_reservable_limit_is_set = 136, largest_free_block_bytes = 144,
        largest_free_block_bytes_is_set = 152, pool_bytes = 160, pool_bytes_is_set = 168,
        peak_pool_bytes = 176, peak_pool_bytes_is_set = 184, peak_allocated_bytes = 192,
        peak_allocated_bytes_is_set = 200,
    });
}

#[test]
fn memory_structs() {
    layout!(PJRT_Memory_Id_Args, size = 32, struct_size = 28, { memory = 16, id = 24 });
    layout!(PJRT_Memory_Kind_Args, size = 40, struct_size = 40, {
        memory = 16, kind = 24, kind_size = 32,
    });
    layout!(PJRT_Memory_Kind_Id_Args, size = 32, struct_size = 28, { memory = 16, kind_id = 24 });
    layout!(PJRT_Memory_DebugString_Args, size = 40, struct_size = 40, {
        memory = 16, debug_string = 24, debug_string_size = 32,
    });
    layout!(PJRT_Memory_ToString_Args, size = 40, struct_size = 40, {
        memory = 16, to_string = 24, to_string_size = 32,
    });
    layout!(PJRT_Memory_AddressableByDevices_Args, size = 40, struct_size = 40, {
        memory = 16, devices = 24, num_devices = 32,
    });
}

#[test]
fn executable_structs() {
    layout!(PJRT_Executable_Destroy_Args, size = 24, struct_size = 24, {
        executable = 16
    });
    layout!(PJRT_Executable_Name_Args, size = 40, struct_size = 40, {
        executable = 16, executable_name = 24, executable_name_size = 32,
    });
    layout!(PJRT_Executable_NumReplicas_Args, size = 32, struct_size = 32, {
        executable = 16, num_replicas = 24,
    });
    layout!(PJRT_Executable_NumPartitions_Args, size = 32, struct_size = 32, {
        executable = 16, num_partitions = 24,
    });
    layout!(PJRT_Executable_NumOutputs_Args, size = 32, struct_size = 32, {
        executable = 16, num_outputs = 24,
    });
    layout!(PJRT_Executable_SizeOfGeneratedCodeInBytes_Args, size = 32, struct_size = 32, {
        executable = 16, size_in_bytes = 24,
    });
    layout!(PJRT_Executable_GetCostAnalysis_Args, size = 40, struct_size = 40, {
        executable = 16, num_properties = 24, properties = 32,
    });
    layout!(PJRT_Executable_OutputMemoryKinds_Args, size = 48, struct_size = 48, {
        executable = 16, num_outputs = 24, memory_kinds = 32, memory_kind_sizes = 40,
    });
    layout!(PJRT_Executable_OptimizedProgram_Args, size = 32, struct_size = 32, {
        executable = 16, program = 24,
    });
    layout!(PJRT_Executable_Serialize_Args, size = 56, struct_size = 56, {
        executable = 16, serialized_bytes = 24, serialized_bytes_size = 32,
        serialized_executable = 40, serialized_executable_deleter = 48,
    });
    layout!(PJRT_Executable_OutputElementTypes_Args, size = 40, struct_size = 40, {
        executable = 16, output_types = 24, num_output_types = 32,
    });
    layout!(PJRT_Executable_OutputDimensions_Args, size = 48, struct_size = 48, {
        executable = 16, num_outputs = 24, dims = 32, dim_sizes = 40,
    });
    layout!(PJRT_Executable_Fingerprint_Args, size = 40, struct_size = 40, {
        executable = 16, executable_fingerprint = 24, executable_fingerprint_size = 32,
    });
    layout!(PJRT_Executable_GetCompiledMemoryStats_Args, size = 144, struct_size = 144, {
        executable = 16, generated_code_size_in_bytes = 24, argument_size_in_bytes = 32,
        output_size_in_bytes = 40, alias_size_in_bytes = 48, temp_size_in_bytes = 56,
        host_generated_code_size_in_bytes = 64, host_argument_size_in_bytes = 72,
        host_output_size_in_bytes = 80, host_alias_size_in_bytes = 88,
        host_temp_size_in_bytes = 96, peak_memory_in_bytes = 104, total_size_in_bytes = 112,
        total_allocation_bytes = 120, indefinite_allocations = 128,
        peak_unpadded_heap_bytes = 136,
    });
    layout!(PJRT_Executable_DeserializeAndLoad_Args, size = 72, struct_size = 72, {
        client = 16, serialized_executable = 24, serialized_executable_size = 32,
        loaded_executable = 40, overridden_serialized_compile_options = 48,
        overridden_serialized_compile_options_size = 56, load_options = 64,
    });
    layout!(
        PJRT_ExecuteContext_Create_Args,
        size = 24,
        struct_size = 24,
        { context = 16 }
    );
    layout!(
        PJRT_ExecuteContext_Destroy_Args,
        size = 24,
        struct_size = 24,
        { context = 16 }
    );
}

#[test]
fn loaded_executable_structs() {
    layout!(
        PJRT_LoadedExecutable_Destroy_Args,
        size = 24,
        struct_size = 24,
        { executable = 16 }
    );
    layout!(PJRT_LoadedExecutable_GetExecutable_Args, size = 32, struct_size = 32, {
        loaded_executable = 16, executable = 24,
    });
    layout!(PJRT_LoadedExecutable_AddressableDevices_Args, size = 40, struct_size = 40, {
        executable = 16, addressable_devices = 24, num_addressable_devices = 32,
    });
    layout!(
        PJRT_LoadedExecutable_Delete_Args,
        size = 24,
        struct_size = 24,
        { executable = 16 }
    );
    layout!(PJRT_LoadedExecutable_IsDeleted_Args, size = 32, struct_size = 25, {
        executable = 16, is_deleted = 24,
    });
    layout!(PJRT_LoadedExecutable_Fingerprint_Args, size = 40, struct_size = 40, {
        executable = 16, executable_fingerprint = 24, executable_fingerprint_size = 32,
    });
    layout!(PJRT_ExecuteOptions, size = 160, struct_size = 160, {
        send_callbacks = 16, recv_callbacks = 24, num_send_ops = 32, num_recv_ops = 40,
        launch_id = 48, non_donatable_input_indices = 56, num_non_donatable_input_indices = 64,
        context = 72, call_location = 80, num_tasks = 88, task_ids = 96, incarnation_ids = 104,
        multi_slice_config = 112, use_major_to_minor_data_layout_for_callbacks = 120,
        hlo_output_callbacks = 128, num_hlo_output_callbacks = 136, custom_options = 144,
        num_custom_options = 152,
    });
    layout!(PJRT_LoadedExecutable_Execute_Args, size = 80, struct_size = 80, {
        executable = 16, options = 24, argument_lists = 32, num_devices = 40, num_args = 48,
        output_lists = 56, device_complete_events = 64, execute_device = 72,
    });
}

#[test]
fn buffer_structs() {
    layout!(PJRT_Buffer_MemoryLayout_Tiled, size = 56, struct_size = 56, {
        minor_to_major = 16, minor_to_major_size = 24, tile_dims = 32, tile_dim_sizes = 40,
        num_tiles = 48,
    });
    layout!(PJRT_Buffer_MemoryLayout_Strides, size = 32, struct_size = 32, {
        byte_strides = 16, num_byte_strides = 24,
    });
    assert_eq!(size_of::<PJRT_Buffer_MemoryLayout_Value>(), 56);
    assert_eq!(size_of::<PJRT_Buffer_MemoryLayout>(), 80);
    assert_eq!(PJRT_Buffer_MemoryLayout::STRUCT_SIZE, 76);
    assert_eq!(offset_of!(PJRT_Buffer_MemoryLayout, struct_size), 0);
    assert_eq!(offset_of!(PJRT_Buffer_MemoryLayout, extension_start), 8);
    assert_eq!(offset_of!(PJRT_Buffer_MemoryLayout, layout), 16);
    assert_eq!(offset_of!(PJRT_Buffer_MemoryLayout, type_), 72);

    layout!(PJRT_Buffer_Destroy_Args, size = 24, struct_size = 24, {
        buffer = 16
    });
    layout!(PJRT_Buffer_ElementType_Args, size = 32, struct_size = 28, { buffer = 16, type_ = 24 });
    layout!(PJRT_Buffer_Dimensions_Args, size = 40, struct_size = 40, {
        buffer = 16, dims = 24, num_dims = 32,
    });
    layout!(PJRT_Buffer_UnpaddedDimensions_Args, size = 40, struct_size = 40, {
        buffer = 16, unpadded_dims = 24, num_dims = 32,
    });
    layout!(PJRT_Buffer_OnDeviceSizeInBytes_Args, size = 32, struct_size = 32, {
        buffer = 16, on_device_size_in_bytes = 24,
    });
    layout!(PJRT_Buffer_Device_Args, size = 32, struct_size = 32, { buffer = 16, device = 24 });
    layout!(PJRT_Buffer_Memory_Args, size = 32, struct_size = 32, { buffer = 16, memory = 24 });
    layout!(PJRT_Buffer_Delete_Args, size = 24, struct_size = 24, {
        buffer = 16
    });
    layout!(PJRT_Buffer_IsDeleted_Args, size = 32, struct_size = 25, {
        buffer = 16, is_deleted = 24,
    });
    layout!(PJRT_Buffer_CopyToDevice_Args, size = 40, struct_size = 40, {
        buffer = 16, dst_device = 24, dst_buffer = 32,
    });
    layout!(PJRT_Buffer_CopyToMemory_Args, size = 40, struct_size = 40, {
        buffer = 16, dst_memory = 24, dst_buffer = 32,
    });
    layout!(PJRT_Buffer_ToHostBuffer_Args, size = 56, struct_size = 56, {
        src = 16, host_layout = 24, dst = 32, dst_size = 40, event = 48,
    });
    layout!(PJRT_Buffer_IsOnCpu_Args, size = 32, struct_size = 25, { buffer = 16, is_on_cpu = 24 });
    layout!(PJRT_Buffer_ReadyEvent_Args, size = 32, struct_size = 32, { buffer = 16, event = 24 });
    layout!(PJRT_Buffer_UnsafePointer_Args, size = 32, struct_size = 32, {
        buffer = 16, buffer_pointer = 24,
    });
    layout!(PJRT_Buffer_IncreaseExternalReferenceCount_Args, size = 24, struct_size = 24, {
        buffer = 16,
    });
    layout!(PJRT_Buffer_DecreaseExternalReferenceCount_Args, size = 24, struct_size = 24, {
        buffer = 16,
    });
    layout!(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args, size = 32, struct_size = 32, {
        buffer = 16, device_memory_ptr = 24,
    });
}

/// Function entries start at byte 40 and take 8 bytes each, in header order.
#[test]
fn api_table() {
    assert_eq!(offset_of!(PJRT_Api, struct_size), 0);
    assert_eq!(offset_of!(PJRT_Api, extension_start), 8);
    assert_eq!(offset_of!(PJRT_Api, pjrt_api_version), 16);
    assert_eq!(offset_of!(PJRT_Api, pjrt_api_version.major_version), 32);
    assert_eq!(offset_of!(PJRT_Api, pjrt_api_version.minor_version), 36);
    assert_eq!(PJRT_Api::FIRST_FUNCTION_OFFSET, 40);
    // 138 entries from 0.114 through 0.117 (none added since): the 0.117 header's table size
    // and the 0.115 CPU plugin's `struct_size` are both 1144.
    assert_eq!(PJRT_Api::FUNCTION_NAMES.len(), 138);
    assert_eq!(size_of::<PJRT_Api>(), 1144);

    let slots: &[(&str, usize)] = &[
        ("PJRT_Error_Destroy", 40),
        ("PJRT_Error_Message", 48),
        ("PJRT_Error_GetCode", 56),
        ("PJRT_Plugin_Initialize", 64),
        ("PJRT_Plugin_Attributes", 72),
        ("PJRT_Event_Destroy", 80),
        ("PJRT_Event_Await", 104),
        ("PJRT_Event_OnReady", 112),
        ("PJRT_Client_Create", 120),
        ("PJRT_Client_Destroy", 128),
        ("PJRT_Client_PlatformName", 136),
        ("PJRT_Client_AddressableDevices", 168),
        ("PJRT_Client_Compile", 200),
        ("PJRT_Client_DefaultDeviceAssignment", 208),
        ("PJRT_Client_BufferFromHostBuffer", 216),
        ("PJRT_DeviceDescription_Id", 224),
        ("PJRT_DeviceDescription_Kind", 248),
        ("PJRT_Device_GetDescription", 272),
        ("PJRT_Device_MemoryStats", 312),
        ("PJRT_Memory_Id", 320),
        ("PJRT_Executable_Destroy", 360),
        ("PJRT_Executable_NumOutputs", 392),
        ("PJRT_Executable_OptimizedProgram", 424),
        ("PJRT_Executable_Serialize", 432),
        ("PJRT_LoadedExecutable_Destroy", 440),
        ("PJRT_LoadedExecutable_GetExecutable", 448),
        ("PJRT_LoadedExecutable_Execute", 480),
        ("PJRT_Executable_DeserializeAndLoad", 488),
        ("PJRT_LoadedExecutable_Fingerprint", 496),
        ("PJRT_Buffer_Destroy", 504),
        ("PJRT_Buffer_ElementType", 512),
        ("PJRT_Buffer_Dimensions", 520),
        ("PJRT_Buffer_OnDeviceSizeInBytes", 552),
        ("PJRT_Buffer_ToHostBuffer", 600),
        ("PJRT_Buffer_ReadyEvent", 616),
        ("PJRT_Compile", 752),
        ("PJRT_Executable_OutputElementTypes", 760),
        ("PJRT_Executable_OutputDimensions", 768),
        ("PJRT_Executable_Fingerprint", 792),
        ("PJRT_Event_Create", 1048),
        ("PJRT_Event_Set", 1056),
        ("PJRT_TopologyDescription_GetMemorySpaceKindIds", 1136),
    ];
    for &(name, offset) in slots {
        assert_eq!(PJRT_Api::function_offset(name), Some(offset), "{name}");
        assert_eq!(PJRT_Api::function_name_at(offset), Some(name), "{offset}");
    }
    // The same facts through `offset_of!`, so the list above cannot drift from the struct.
    assert_eq!(offset_of!(PJRT_Api, PJRT_Client_Create), 120);
    assert_eq!(offset_of!(PJRT_Api, PJRT_Client_Compile), 200);
    assert_eq!(offset_of!(PJRT_Api, PJRT_Client_BufferFromHostBuffer), 216);
    assert_eq!(offset_of!(PJRT_Api, PJRT_LoadedExecutable_Execute), 480);
    assert_eq!(
        offset_of!(PJRT_Api, PJRT_Executable_DeserializeAndLoad),
        488
    );
    assert_eq!(offset_of!(PJRT_Api, PJRT_Buffer_ToHostBuffer), 600);
    assert_eq!(offset_of!(PJRT_Api, PJRT_Executable_Fingerprint), 792);
    assert_eq!(offset_of!(PJRT_Api, PJRT_Event_Set), 1056);
    assert_eq!(
        offset_of!(PJRT_Api, PJRT_TopologyDescription_GetMemorySpaceKindIds),
        1136
    );
    for (i, name) in PJRT_Api::FUNCTION_NAMES.iter().enumerate() {
        assert_eq!(PJRT_Api::function_offset(name), Some(40 + 8 * i), "{name}");
    }
    assert_eq!(PJRT_Api::function_name_at(44), None);
    assert_eq!(PJRT_Api::function_name_at(1144), None);
}
