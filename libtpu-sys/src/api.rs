//! The `PJRT_Api` function table that `GetPjrtApi` returns.

use core::ffi::c_void;

use crate::types::*;

/// Declares `PJRT_Api` from its entries in header order, plus the list of entry names.
macro_rules! pjrt_api {
    ( $( $name:ident : $ty:ty ),* $(,)? ) => {
        /// The function table of a PJRT plugin, in the header's field order.
        ///
        /// A plugin's table may be shorter than this struct: only entries that end within its
        /// `struct_size` exist. [`crate::PjrtLibrary::api`] hands out a copy that is zero-filled
        /// past the plugin's `struct_size`, so entries the plugin lacks read as `None`.
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        pub struct PJRT_Api {
            /// Size of the plugin's table in bytes; entries past it do not exist.
            pub struct_size: usize,
            /// Head of the plugin's extension chain, or null.
            pub extension_start: *mut PJRT_Extension_Base,
            /// The PJRT C API version the plugin implements.
            pub pjrt_api_version: PJRT_Api_Version,
            $(
                #[doc = concat!("Table entry `", stringify!($name), "`.")]
                pub $name: $ty,
            )*
        }

        impl PJRT_Api {
            /// Names of the function entries, in table order.
            pub const FUNCTION_NAMES: &'static [&'static str] = &[ $( stringify!($name) ),* ];
        }
    };
}

pjrt_api! {
    PJRT_Error_Destroy: PjrtVoidFn<PJRT_Error_Destroy_Args>,
    PJRT_Error_Message: PjrtVoidFn<PJRT_Error_Message_Args>,
    PJRT_Error_GetCode: PjrtFn<PJRT_Error_GetCode_Args>,

    PJRT_Plugin_Initialize: PjrtFn<PJRT_Plugin_Initialize_Args>,
    PJRT_Plugin_Attributes: PjrtFn<PJRT_Plugin_Attributes_Args>,

    PJRT_Event_Destroy: PjrtFn<PJRT_Event_Destroy_Args>,
    PJRT_Event_IsReady: PjrtFn<PJRT_Event_IsReady_Args>,
    PJRT_Event_Error: PjrtFn<PJRT_Event_Error_Args>,
    PJRT_Event_Await: PjrtFn<PJRT_Event_Await_Args>,
    PJRT_Event_OnReady: PjrtFn<PJRT_Event_OnReady_Args>,

    PJRT_Client_Create: PjrtFn<PJRT_Client_Create_Args>,
    PJRT_Client_Destroy: PjrtFn<PJRT_Client_Destroy_Args>,
    PJRT_Client_PlatformName: PjrtFn<PJRT_Client_PlatformName_Args>,
    PJRT_Client_ProcessIndex: PjrtFn<PJRT_Client_ProcessIndex_Args>,
    PJRT_Client_PlatformVersion: PjrtFn<PJRT_Client_PlatformVersion_Args>,
    PJRT_Client_Devices: PjrtFn<PJRT_Client_Devices_Args>,
    PJRT_Client_AddressableDevices: PjrtFn<PJRT_Client_AddressableDevices_Args>,
    PJRT_Client_LookupDevice: PjrtFn<PJRT_Client_LookupDevice_Args>,
    PJRT_Client_LookupAddressableDevice: PjrtFn<PJRT_Client_LookupAddressableDevice_Args>,
    PJRT_Client_AddressableMemories: PjrtFn<PJRT_Client_AddressableMemories_Args>,
    PJRT_Client_Compile: PjrtFn<PJRT_Client_Compile_Args>,
    PJRT_Client_DefaultDeviceAssignment: PjrtFn<PJRT_Client_DefaultDeviceAssignment_Args>,
    PJRT_Client_BufferFromHostBuffer: PjrtFn<PJRT_Client_BufferFromHostBuffer_Args>,

    PJRT_DeviceDescription_Id: PjrtFn<PJRT_DeviceDescription_Id_Args>,
    PJRT_DeviceDescription_ProcessIndex: PjrtFn<PJRT_DeviceDescription_ProcessIndex_Args>,
    PJRT_DeviceDescription_Attributes: PjrtFn<PJRT_DeviceDescription_Attributes_Args>,
    PJRT_DeviceDescription_Kind: PjrtFn<PJRT_DeviceDescription_Kind_Args>,
    PJRT_DeviceDescription_DebugString: PjrtFn<PJRT_DeviceDescription_DebugString_Args>,
    PJRT_DeviceDescription_ToString: PjrtFn<PJRT_DeviceDescription_ToString_Args>,

    PJRT_Device_GetDescription: PjrtFn<PJRT_Device_GetDescription_Args>,
    PJRT_Device_IsAddressable: PjrtFn<PJRT_Device_IsAddressable_Args>,
    PJRT_Device_LocalHardwareId: PjrtFn<PJRT_Device_LocalHardwareId_Args>,
    PJRT_Device_AddressableMemories: PjrtFn<PJRT_Device_AddressableMemories_Args>,
    PJRT_Device_DefaultMemory: PjrtFn<PJRT_Device_DefaultMemory_Args>,
    PJRT_Device_MemoryStats: PjrtFn<PJRT_Device_MemoryStats_Args>,

    PJRT_Memory_Id: PjrtFn<PJRT_Memory_Id_Args>,
    PJRT_Memory_Kind: PjrtFn<PJRT_Memory_Kind_Args>,
    PJRT_Memory_DebugString: PjrtFn<PJRT_Memory_DebugString_Args>,
    PJRT_Memory_ToString: PjrtFn<PJRT_Memory_ToString_Args>,
    PJRT_Memory_AddressableByDevices: PjrtFn<PJRT_Memory_AddressableByDevices_Args>,

    PJRT_Executable_Destroy: PjrtFn<PJRT_Executable_Destroy_Args>,
    PJRT_Executable_Name: PjrtFn<PJRT_Executable_Name_Args>,
    PJRT_Executable_NumReplicas: PjrtFn<PJRT_Executable_NumReplicas_Args>,
    PJRT_Executable_NumPartitions: PjrtFn<PJRT_Executable_NumPartitions_Args>,
    PJRT_Executable_NumOutputs: PjrtFn<PJRT_Executable_NumOutputs_Args>,
    PJRT_Executable_SizeOfGeneratedCodeInBytes:
        PjrtFn<PJRT_Executable_SizeOfGeneratedCodeInBytes_Args>,
    PJRT_Executable_GetCostAnalysis: PjrtFn<PJRT_Executable_GetCostAnalysis_Args>,
    PJRT_Executable_OutputMemoryKinds: PjrtFn<PJRT_Executable_OutputMemoryKinds_Args>,
    PJRT_Executable_OptimizedProgram: PjrtFn<PJRT_Executable_OptimizedProgram_Args>,
    PJRT_Executable_Serialize: PjrtFn<PJRT_Executable_Serialize_Args>,

    PJRT_LoadedExecutable_Destroy: PjrtFn<PJRT_LoadedExecutable_Destroy_Args>,
    PJRT_LoadedExecutable_GetExecutable: PjrtFn<PJRT_LoadedExecutable_GetExecutable_Args>,
    PJRT_LoadedExecutable_AddressableDevices:
        PjrtFn<PJRT_LoadedExecutable_AddressableDevices_Args>,
    PJRT_LoadedExecutable_Delete: PjrtFn<PJRT_LoadedExecutable_Delete_Args>,
    PJRT_LoadedExecutable_IsDeleted: PjrtFn<PJRT_LoadedExecutable_IsDeleted_Args>,
    PJRT_LoadedExecutable_Execute: PjrtFn<PJRT_LoadedExecutable_Execute_Args>,
    PJRT_Executable_DeserializeAndLoad: PjrtFn<PJRT_Executable_DeserializeAndLoad_Args>,
    PJRT_LoadedExecutable_Fingerprint: PjrtFn<PJRT_LoadedExecutable_Fingerprint_Args>,

    PJRT_Buffer_Destroy: PjrtFn<PJRT_Buffer_Destroy_Args>,
    PJRT_Buffer_ElementType: PjrtFn<PJRT_Buffer_ElementType_Args>,
    PJRT_Buffer_Dimensions: PjrtFn<PJRT_Buffer_Dimensions_Args>,
    PJRT_Buffer_UnpaddedDimensions: PjrtFn<PJRT_Buffer_UnpaddedDimensions_Args>,
    PJRT_Buffer_DynamicDimensionIndices: PjrtUntypedFn,
    PJRT_Buffer_GetMemoryLayout: PjrtUntypedFn,
    PJRT_Buffer_OnDeviceSizeInBytes: PjrtFn<PJRT_Buffer_OnDeviceSizeInBytes_Args>,
    PJRT_Buffer_Device: PjrtFn<PJRT_Buffer_Device_Args>,
    PJRT_Buffer_Memory: PjrtFn<PJRT_Buffer_Memory_Args>,
    PJRT_Buffer_Delete: PjrtFn<PJRT_Buffer_Delete_Args>,
    PJRT_Buffer_IsDeleted: PjrtFn<PJRT_Buffer_IsDeleted_Args>,
    PJRT_Buffer_CopyToDevice: PjrtFn<PJRT_Buffer_CopyToDevice_Args>,
    PJRT_Buffer_ToHostBuffer: PjrtFn<PJRT_Buffer_ToHostBuffer_Args>,
    PJRT_Buffer_IsOnCpu: PjrtFn<PJRT_Buffer_IsOnCpu_Args>,
    PJRT_Buffer_ReadyEvent: PjrtFn<PJRT_Buffer_ReadyEvent_Args>,
    PJRT_Buffer_UnsafePointer: PjrtFn<PJRT_Buffer_UnsafePointer_Args>,
    PJRT_Buffer_IncreaseExternalReferenceCount:
        PjrtFn<PJRT_Buffer_IncreaseExternalReferenceCount_Args>,
    PJRT_Buffer_DecreaseExternalReferenceCount:
        PjrtFn<PJRT_Buffer_DecreaseExternalReferenceCount_Args>,
    PJRT_Buffer_OpaqueDeviceMemoryDataPointer:
        PjrtFn<PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args>,

    PJRT_CopyToDeviceStream_Destroy: PjrtUntypedFn,
    PJRT_CopyToDeviceStream_AddChunk: PjrtUntypedFn,
    PJRT_CopyToDeviceStream_TotalBytes: PjrtUntypedFn,
    PJRT_CopyToDeviceStream_GranuleSize: PjrtUntypedFn,
    PJRT_CopyToDeviceStream_CurrentBytes: PjrtUntypedFn,

    PJRT_TopologyDescription_Create: PjrtUntypedFn,
    PJRT_TopologyDescription_Destroy: PjrtUntypedFn,
    PJRT_TopologyDescription_PlatformName: PjrtUntypedFn,
    PJRT_TopologyDescription_PlatformVersion: PjrtUntypedFn,
    PJRT_TopologyDescription_GetDeviceDescriptions: PjrtUntypedFn,
    PJRT_TopologyDescription_Serialize: PjrtUntypedFn,
    PJRT_TopologyDescription_Attributes: PjrtUntypedFn,

    PJRT_Compile: PjrtUntypedFn,

    PJRT_Executable_OutputElementTypes: PjrtFn<PJRT_Executable_OutputElementTypes_Args>,
    PJRT_Executable_OutputDimensions: PjrtFn<PJRT_Executable_OutputDimensions_Args>,
    PJRT_Buffer_CopyToMemory: PjrtFn<PJRT_Buffer_CopyToMemory_Args>,
    PJRT_Client_CreateViewOfDeviceBuffer: PjrtUntypedFn,
    PJRT_Executable_Fingerprint: PjrtFn<PJRT_Executable_Fingerprint_Args>,
    PJRT_Client_TopologyDescription: PjrtFn<PJRT_Client_TopologyDescription_Args>,
    PJRT_Executable_GetCompiledMemoryStats: PjrtFn<PJRT_Executable_GetCompiledMemoryStats_Args>,
    PJRT_Memory_Kind_Id: PjrtFn<PJRT_Memory_Kind_Id_Args>,
    PJRT_ExecuteContext_Create: PjrtFn<PJRT_ExecuteContext_Create_Args>,
    PJRT_ExecuteContext_Destroy: PjrtFn<PJRT_ExecuteContext_Destroy_Args>,
    PJRT_Buffer_CopyRawToHost: PjrtUntypedFn,
    PJRT_AsyncHostToDeviceTransferManager_Destroy: PjrtUntypedFn,
    PJRT_AsyncHostToDeviceTransferManager_TransferData: PjrtUntypedFn,
    PJRT_Client_CreateBuffersForAsyncHostToDevice: PjrtUntypedFn,
    PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer: PjrtUntypedFn,
    PJRT_AsyncHostToDeviceTransferManager_Device: PjrtUntypedFn,
    PJRT_AsyncHostToDeviceTransferManager_BufferCount: PjrtUntypedFn,
    PJRT_AsyncHostToDeviceTransferManager_BufferSize: PjrtUntypedFn,
    PJRT_AsyncHostToDeviceTransferManager_SetBufferError: PjrtUntypedFn,
    PJRT_AsyncHostToDeviceTransferManager_AddMetadata: PjrtUntypedFn,
    PJRT_Client_DmaMap: PjrtUntypedFn,
    PJRT_Client_DmaUnmap: PjrtUntypedFn,
    PJRT_Client_CreateUninitializedBuffer: PjrtUntypedFn,
    PJRT_Client_UpdateGlobalProcessInfo: PjrtUntypedFn,
    PJRT_TopologyDescription_Deserialize: PjrtUntypedFn,
    PJRT_Client_CreateAliasBuffer: PjrtUntypedFn,
    PJRT_Client_FulfillAliasBuffer: PjrtUntypedFn,
    PJRT_LoadedExecutable_GetDeviceAssignment: PjrtUntypedFn,
    PJRT_Client_CreateErrorBuffer: PjrtUntypedFn,
    PJRT_AsyncHostToDeviceTransferManager_TransferLiteral: PjrtUntypedFn,
    PJRT_Buffer_CopyRawToHostFuture: PjrtUntypedFn,
    PJRT_Device_PoisonExecution: PjrtUntypedFn,
    PJRT_Device_CreateAsyncTrackingEvent: PjrtUntypedFn,
    PJRT_AsyncTrackingEvent_Destroy: PjrtUntypedFn,
    PJRT_Executable_GetCompileOptions: PjrtUntypedFn,
    PJRT_Buffer_DonateWithControlDependency: PjrtUntypedFn,
    PJRT_Event_Create: PjrtFn<PJRT_Event_Create_Args>,
    PJRT_Event_Set: PjrtFn<PJRT_Event_Set_Args>,
    PJRT_Device_GetAttributes: PjrtUntypedFn,
    PJRT_Client_Load: PjrtUntypedFn,
    PJRT_LoadedExecutable_AddressableDeviceLogicalIds: PjrtUntypedFn,
    PJRT_Buffer_Bitcast: PjrtUntypedFn,
    PJRT_Error_ForEachPayload: PjrtFn<PJRT_Error_ForEachPayload_Args>,
    PJRT_TopologyDescription_Fingerprint: PjrtUntypedFn,
    PJRT_Executable_ParameterMemoryKinds: PjrtUntypedFn,
    PJRT_Device_ClearMemoryStats: PjrtUntypedFn,
    PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace: PjrtUntypedFn,
    PJRT_TopologyDescription_GetMemorySpaceKindIds: PjrtUntypedFn,
}

impl PJRT_Api {
    /// Byte offset of the first function entry.
    pub const FIRST_FUNCTION_OFFSET: usize = core::mem::offset_of!(PJRT_Api, PJRT_Error_Destroy);

    /// Table size of the layout declared here, i.e. `size_of::<PJRT_Api>()`.
    pub const DECLARED_SIZE: usize = core::mem::size_of::<PJRT_Api>();

    /// Name of the function entry at byte `offset`, if one starts there.
    pub fn function_name_at(offset: usize) -> Option<&'static str> {
        let rel = offset.checked_sub(Self::FIRST_FUNCTION_OFFSET)?;
        if rel % core::mem::size_of::<PjrtUntypedFn>() != 0 {
            return None;
        }
        Self::FUNCTION_NAMES
            .get(rel / core::mem::size_of::<PjrtUntypedFn>())
            .copied()
    }

    /// Byte offset of the function entry called `name`.
    pub fn function_offset(name: &str) -> Option<usize> {
        let index = Self::FUNCTION_NAMES.iter().position(|n| *n == name)?;
        Some(Self::FIRST_FUNCTION_OFFSET + index * core::mem::size_of::<PjrtUntypedFn>())
    }

    /// Whether a table of `struct_size` bytes contains the whole entry at `offset`.
    pub const fn covers(struct_size: usize, offset: usize) -> bool {
        offset + core::mem::size_of::<PjrtUntypedFn>() <= struct_size
    }

    /// A table with every entry absent and `struct_size` zero, for tests and padding copies.
    pub const fn zeroed() -> Self {
        // SAFETY: the fields are integers, raw pointers and `Option`s of function pointers;
        // all-zero bytes are a valid value (0, null, `None`) for each.
        unsafe { core::mem::zeroed() }
    }
}

// Keeps the untyped alias honest: it must be a single nullable pointer like every other entry.
const _: () = assert!(core::mem::size_of::<PjrtUntypedFn>() == core::mem::size_of::<*mut c_void>());
