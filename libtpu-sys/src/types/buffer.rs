//! Device buffers and their memory layouts.

use core::ffi::c_void;

use super::{PJRT_Buffer, PJRT_Buffer_Type, PJRT_Device, PJRT_Event, PJRT_Memory};

pjrt_struct! {
    /// A tiled layout: dimension order plus optional tiles.
    PJRT_Buffer_MemoryLayout_Tiled, last = num_tiles;
    {
        /// Dimension indices from minor to major.
        minor_to_major: *const i64,
        /// Length of `minor_to_major`.
        minor_to_major_size: usize,
        /// Every tile's dimensions, concatenated.
        tile_dims: *const i64,
        /// Rank of each tile, to split `tile_dims`.
        tile_dim_sizes: *const usize,
        /// Number of tiles.
        num_tiles: usize,
    }
}

pjrt_struct! {
    /// A strided layout.
    PJRT_Buffer_MemoryLayout_Strides, last = num_byte_strides;
    {
        /// Byte stride of each dimension.
        byte_strides: *const i64,
        /// Length of `byte_strides`.
        num_byte_strides: usize,
    }
}

pjrt_enum! {
    /// Which member of `PJRT_Buffer_MemoryLayout`'s union is live.
    PJRT_Buffer_MemoryLayout_Type {
        /// `tiled`.
        TILED = 0,
        /// `strides`.
        STRIDES = 1,
    }
}

/// The layout of a `PJRT_Buffer_MemoryLayout`, chosen by its `type_`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union PJRT_Buffer_MemoryLayout_Value {
    /// For `TILED`.
    pub tiled: PJRT_Buffer_MemoryLayout_Tiled,
    /// For `STRIDES`.
    pub strides: PJRT_Buffer_MemoryLayout_Strides,
}

/// A buffer's memory layout, for host transfers and uploads.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PJRT_Buffer_MemoryLayout {
    /// Size of this struct as the caller knows it.
    pub struct_size: usize,
    /// Optional chain of extension structs; null when unused.
    pub extension_start: *mut super::PJRT_Extension_Base,
    /// The layout.
    pub layout: PJRT_Buffer_MemoryLayout_Value,
    /// Which member of `layout` is live.
    pub type_: PJRT_Buffer_MemoryLayout_Type,
}

impl PJRT_Buffer_MemoryLayout {
    /// Bytes the header counts for this struct: the end of `type_`.
    pub const STRUCT_SIZE: usize = super::field_end(
        core::mem::offset_of!(PJRT_Buffer_MemoryLayout, type_),
        |s: &PJRT_Buffer_MemoryLayout| &s.type_,
    );

    /// A strided layout; the struct borrows `byte_strides` by raw pointer.
    pub const fn new_strides(byte_strides: &[i64]) -> Self {
        let mut strides = PJRT_Buffer_MemoryLayout_Strides::new();
        strides.byte_strides = byte_strides.as_ptr();
        strides.num_byte_strides = byte_strides.len();
        Self {
            struct_size: Self::STRUCT_SIZE,
            extension_start: core::ptr::null_mut(),
            layout: PJRT_Buffer_MemoryLayout_Value { strides },
            type_: PJRT_Buffer_MemoryLayout_Type::STRIDES,
        }
    }

    /// A tiled layout without tiles; the struct borrows `minor_to_major` by raw pointer.
    pub const fn new_minor_to_major(minor_to_major: &[i64]) -> Self {
        let mut tiled = PJRT_Buffer_MemoryLayout_Tiled::new();
        tiled.minor_to_major = minor_to_major.as_ptr();
        tiled.minor_to_major_size = minor_to_major.len();
        Self {
            struct_size: Self::STRUCT_SIZE,
            extension_start: core::ptr::null_mut(),
            layout: PJRT_Buffer_MemoryLayout_Value { tiled },
            type_: PJRT_Buffer_MemoryLayout_Type::TILED,
        }
    }
}

impl core::fmt::Debug for PJRT_Buffer_MemoryLayout {
    // The union is not printed: which member is live depends on `type_`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PJRT_Buffer_MemoryLayout")
            .field("struct_size", &self.struct_size)
            .field("type_", &self.type_)
            .finish_non_exhaustive()
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_Destroy`, which frees the handle and its device memory.
    PJRT_Buffer_Destroy_Args, last = buffer;
    {
        /// In: the buffer.
        buffer: *mut PJRT_Buffer,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_ElementType`.
    PJRT_Buffer_ElementType_Args, last = type_;
    {
        /// In: the buffer.
        buffer: *mut PJRT_Buffer,
        /// Out: its element type.
        type_: PJRT_Buffer_Type,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_Dimensions`.
    PJRT_Buffer_Dimensions_Args, last = num_dims;
    {
        /// In: the buffer.
        buffer: *mut PJRT_Buffer,
        /// Out: dimensions owned by the buffer.
        dims: *const i64,
        /// Out: rank.
        num_dims: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_UnpaddedDimensions`.
    PJRT_Buffer_UnpaddedDimensions_Args, last = num_dims;
    {
        /// In: the buffer.
        buffer: *mut PJRT_Buffer,
        /// Out: dimensions without dynamic padding, owned by the buffer.
        unpadded_dims: *const i64,
        /// Out: rank.
        num_dims: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_OnDeviceSizeInBytes`.
    PJRT_Buffer_OnDeviceSizeInBytes_Args, last = on_device_size_in_bytes;
    {
        /// In: the buffer.
        buffer: *mut PJRT_Buffer,
        /// Out: bytes the buffer occupies on the device, padding included.
        on_device_size_in_bytes: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_Device`.
    PJRT_Buffer_Device_Args, last = device;
    {
        /// In: the buffer.
        buffer: *mut PJRT_Buffer,
        /// Out: the device holding it.
        device: *mut PJRT_Device,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_Memory`.
    PJRT_Buffer_Memory_Args, last = memory;
    {
        /// In: the buffer.
        buffer: *mut PJRT_Buffer,
        /// Out: the memory space holding it.
        memory: *mut PJRT_Memory,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_Delete`, which frees device memory but keeps the handle.
    PJRT_Buffer_Delete_Args, last = buffer;
    {
        /// In: the buffer.
        buffer: *mut PJRT_Buffer,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_IsDeleted`.
    PJRT_Buffer_IsDeleted_Args, last = is_deleted;
    {
        /// In: the buffer.
        buffer: *mut PJRT_Buffer,
        /// Out: whether its device memory was freed.
        is_deleted: bool,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_CopyToDevice`.
    PJRT_Buffer_CopyToDevice_Args, last = dst_buffer;
    {
        /// In: the source buffer.
        buffer: *mut PJRT_Buffer,
        /// In: the destination device.
        dst_device: *mut PJRT_Device,
        /// Out: the new buffer on `dst_device`.
        dst_buffer: *mut PJRT_Buffer,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_CopyToMemory`.
    PJRT_Buffer_CopyToMemory_Args, last = dst_buffer;
    {
        /// In: the source buffer.
        buffer: *mut PJRT_Buffer,
        /// In: the destination memory space.
        dst_memory: *mut PJRT_Memory,
        /// Out: the new buffer in `dst_memory`.
        dst_buffer: *mut PJRT_Buffer,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_ToHostBuffer`.
    ///
    /// With `dst` null the call only reports the needed `dst_size`.
    PJRT_Buffer_ToHostBuffer_Args, last = event;
    {
        /// In: the buffer to read.
        src: *mut PJRT_Buffer,
        /// In: optional host layout; null for dense major-to-minor.
        host_layout: *mut PJRT_Buffer_MemoryLayout,
        /// In: caller-owned destination, valid until `event` fires.
        dst: *mut c_void,
        /// In/out: size of `dst`, or the required size when `dst` is null.
        dst_size: usize,
        /// Out: fires when `dst` is filled.
        event: *mut PJRT_Event,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_IsOnCpu`.
    PJRT_Buffer_IsOnCpu_Args, last = is_on_cpu;
    {
        /// In: the buffer.
        buffer: *mut PJRT_Buffer,
        /// Out: whether its memory is host memory.
        is_on_cpu: bool,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_ReadyEvent`.
    PJRT_Buffer_ReadyEvent_Args, last = event;
    {
        /// In: the buffer.
        buffer: *mut PJRT_Buffer,
        /// Out: fires when the buffer's data is ready; the caller destroys it.
        event: *mut PJRT_Event,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_UnsafePointer`.
    PJRT_Buffer_UnsafePointer_Args, last = buffer_pointer;
    {
        /// In: the buffer.
        buffer: *mut PJRT_Buffer,
        /// Out: device address of its data.
        buffer_pointer: usize,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_IncreaseExternalReferenceCount`.
    PJRT_Buffer_IncreaseExternalReferenceCount_Args, last = buffer;
    {
        /// In: the buffer whose memory an outside user will hold.
        buffer: *mut PJRT_Buffer,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_DecreaseExternalReferenceCount`.
    PJRT_Buffer_DecreaseExternalReferenceCount_Args, last = buffer;
    {
        /// In: the buffer whose outside hold ends.
        buffer: *mut PJRT_Buffer,
    }
}

pjrt_struct! {
    /// Arguments of `PJRT_Buffer_OpaqueDeviceMemoryDataPointer`.
    PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args, last = device_memory_ptr;
    {
        /// In: the buffer.
        buffer: *mut PJRT_Buffer,
        /// Out: platform-specific device memory pointer.
        device_memory_ptr: *mut c_void,
    }
}
