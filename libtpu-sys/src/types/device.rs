//! Device descriptions, devices and memory spaces.

use core::ffi::c_char;

use super::{PJRT_Device, PJRT_DeviceDescription, PJRT_Memory, PJRT_NamedValue};

pjrt_struct! {
    /// Arguments of `PJRT_DeviceDescription_Id`.
    PJRT_DeviceDescription_Id_Args, last = id;
    {
        /// In: the description.
        device_description: *mut PJRT_DeviceDescription,
        /// Out: globally unique device id.
        id: i32,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_DeviceDescription_ProcessIndex`.
    PJRT_DeviceDescription_ProcessIndex_Args, last = process_index;
    {
        /// In: the description.
        device_description: *mut PJRT_DeviceDescription,
        /// Out: index of the process that owns the device.
        process_index: i32,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_DeviceDescription_Attributes`.
    PJRT_DeviceDescription_Attributes_Args, last = attributes;
    {
        /// In: the description.
        device_description: *mut PJRT_DeviceDescription,
        /// Out: number of `attributes`.
        num_attributes: usize,
        /// Out: attributes owned by the description.
        attributes: *const PJRT_NamedValue,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_DeviceDescription_Kind`.
    PJRT_DeviceDescription_Kind_Args, last = device_kind_size;
    {
        /// In: the description.
        device_description: *mut PJRT_DeviceDescription,
        /// Out: device kind, e.g. "TPU v5 lite", not NUL-terminated.
        device_kind: *const c_char,
        /// Out: length of `device_kind`.
        device_kind_size: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_DeviceDescription_DebugString`.
    PJRT_DeviceDescription_DebugString_Args, last = debug_string_size;
    {
        /// In: the description.
        device_description: *mut PJRT_DeviceDescription,
        /// Out: verbose description, not NUL-terminated.
        debug_string: *const c_char,
        /// Out: length of `debug_string`.
        debug_string_size: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_DeviceDescription_ToString`.
    PJRT_DeviceDescription_ToString_Args, last = to_string_size;
    {
        /// In: the description.
        device_description: *mut PJRT_DeviceDescription,
        /// Out: short description, not NUL-terminated.
        to_string: *const c_char,
        /// Out: length of `to_string`.
        to_string_size: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Device_GetDescription`.
    PJRT_Device_GetDescription_Args, last = device_description;
    {
        /// In: the device.
        device: *mut PJRT_Device,
        /// Out: description owned by the device.
        device_description: *mut PJRT_DeviceDescription,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Device_IsAddressable`.
    PJRT_Device_IsAddressable_Args, last = is_addressable;
    {
        /// In: the device.
        device: *mut PJRT_Device,
        /// Out: whether this process can use the device.
        is_addressable: bool,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Device_LocalHardwareId`.
    PJRT_Device_LocalHardwareId_Args, last = local_hardware_id;
    {
        /// In: the device.
        device: *mut PJRT_Device,
        /// Out: hardware id local to this host, -1 when not addressable.
        local_hardware_id: i32,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Device_AddressableMemories`.
    PJRT_Device_AddressableMemories_Args, last = num_memories;
    {
        /// In: the device.
        device: *mut PJRT_Device,
        /// Out: memory array owned by the device.
        memories: *const *mut PJRT_Memory,
        /// Out: number of `memories`.
        num_memories: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Device_DefaultMemory`.
    PJRT_Device_DefaultMemory_Args, last = memory;
    {
        /// In: the device.
        device: *mut PJRT_Device,
        /// Out: the device's default memory space.
        memory: *mut PJRT_Memory,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Device_MemoryStats`; each `_is_set` says whether its value is valid.
    PJRT_Device_MemoryStats_Args, last = peak_allocated_bytes_is_set;
    {
        /// In: the device.
        device: *mut PJRT_Device,
        /// Out: bytes currently allocated (always set).
        bytes_in_use: i64,
        /// Out: highest `bytes_in_use` seen.
        peak_bytes_in_use: i64,
        /// Out: whether `peak_bytes_in_use` is valid.
        peak_bytes_in_use_is_set: bool,
        /// Out: number of allocations.
        num_allocs: i64,
        /// Out: whether `num_allocs` is valid.
        num_allocs_is_set: bool,
        /// Out: largest single allocation.
        largest_alloc_size: i64,
        /// Out: whether `largest_alloc_size` is valid.
        largest_alloc_size_is_set: bool,
        /// Out: bytes the allocator may hand out.
        bytes_limit: i64,
        /// Out: whether `bytes_limit` is valid.
        bytes_limit_is_set: bool,
        /// Out: bytes reserved.
        bytes_reserved: i64,
        /// Out: whether `bytes_reserved` is valid.
        bytes_reserved_is_set: bool,
        /// Out: highest `bytes_reserved` seen.
        peak_bytes_reserved: i64,
        /// Out: whether `peak_bytes_reserved` is valid.
        peak_bytes_reserved_is_set: bool,
        /// Out: upper bound of reservable bytes.
        bytes_reservable_limit: i64,
        /// Out: whether `bytes_reservable_limit` is valid.
        bytes_reservable_limit_is_set: bool,
        /// Out: largest free block.
        largest_free_block_bytes: i64,
        /// Out: whether `largest_free_block_bytes` is valid.
        largest_free_block_bytes_is_set: bool,
        /// Out: bytes in the allocator's pool.
        pool_bytes: i64,
        /// Out: whether `pool_bytes` is valid.
        pool_bytes_is_set: bool,
        /// Out: highest `pool_bytes` seen.
        peak_pool_bytes: i64,
        /// Out: whether `peak_pool_bytes` is valid.
        peak_pool_bytes_is_set: bool,
        /// Out: highest allocated bytes seen.
        peak_allocated_bytes: i64,
        /// Out: whether `peak_allocated_bytes` is valid.
        peak_allocated_bytes_is_set: bool,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Memory_Id`.
    PJRT_Memory_Id_Args, last = id;
    {
        /// In: the memory space.
        memory: *mut PJRT_Memory,
        /// Out: its id.
        id: i32,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Memory_Kind`.
    PJRT_Memory_Kind_Args, last = kind_size;
    {
        /// In: the memory space.
        memory: *mut PJRT_Memory,
        /// Out: kind, e.g. "device" or "pinned_host", not NUL-terminated.
        kind: *const c_char,
        /// Out: length of `kind`.
        kind_size: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Memory_Kind_Id`.
    PJRT_Memory_Kind_Id_Args, last = kind_id;
    {
        /// In: the memory space.
        memory: *mut PJRT_Memory,
        /// Out: numeric id of its kind.
        kind_id: i32,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Memory_DebugString`.
    PJRT_Memory_DebugString_Args, last = debug_string_size;
    {
        /// In: the memory space.
        memory: *mut PJRT_Memory,
        /// Out: verbose description, not NUL-terminated.
        debug_string: *const c_char,
        /// Out: length of `debug_string`.
        debug_string_size: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Memory_ToString`.
    PJRT_Memory_ToString_Args, last = to_string_size;
    {
        /// In: the memory space.
        memory: *mut PJRT_Memory,
        /// Out: short description, not NUL-terminated.
        to_string: *const c_char,
        /// Out: length of `to_string`.
        to_string_size: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Memory_AddressableByDevices`.
    PJRT_Memory_AddressableByDevices_Args, last = num_devices;
    {
        /// In: the memory space.
        memory: *mut PJRT_Memory,
        /// Out: devices that can address it.
        devices: *const *mut PJRT_Device,
        /// Out: number of `devices`.
        num_devices: usize,
    }
}
