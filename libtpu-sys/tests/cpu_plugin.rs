//! End to end against a real PJRT CPU plugin: load, create a client, compile, run, read back.
//!
//! The plugin is `$TPU_RS_PJRT_PLUGIN`, else XLA's CPU plugin in the project-local folder
//! (`.pjrt/plugins/xla-cpu.so`, installed by scripts/install-pjrt-cpu.sh); without either the
//! tests print a skip line and pass, unless `TPU_RS_REQUIRE_PJRT=1` (as in CI) makes them fail.

use core::ffi::c_char;
use core::ptr;
use std::path::PathBuf;
use std::sync::OnceLock;

use libtpu_sys::*;

use libtpu_sys::compile_options;

/// XLA's CPU plugin in the project-local folder, looked for above this crate.
fn local_cpu_plugin() -> Option<PathBuf> {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join(".pjrt/plugins/xla-cpu.so"))
        .find(|p| p.exists())
}

const PROGRAM: &str = r#"
module @m {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    %1 = stablehlo.multiply %0, %a : tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}
"#;

struct Plugin {
    lib: PjrtLibrary,
    is_default: bool,
}

/// One library per process: plugins keep process-wide state.
fn plugin() -> Option<&'static Plugin> {
    static PLUGIN: OnceLock<Option<Plugin>> = OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            let (path, is_default) = match std::env::var_os("TPU_RS_PJRT_PLUGIN") {
                Some(p) => (PathBuf::from(p), false),
                None => (local_cpu_plugin()?, true),
            };
            let lib = PjrtLibrary::open(&path).unwrap_or_else(|e| panic!("{e}"));
            Some(Plugin { lib, is_default })
        })
        .as_ref()
}

macro_rules! plugin_or_skip {
    () => {
        match plugin() {
            Some(p) => p,
            None => {
                if std::env::var("TPU_RS_REQUIRE_PJRT").is_ok_and(|v| v == "1") {
                    panic!("TPU_RS_REQUIRE_PJRT=1 but no PJRT plugin was found");
                }
                println!(
                    "skipped: no PJRT plugin found (set TPU_RS_PJRT_PLUGIN or run scripts/install-pjrt-cpu.sh)"
                );
                return;
            }
        }
    };
}

/// A fresh argument struct of the type the table entry `_f` takes, `struct_size` set.
fn args_for<A: Default>(_f: PjrtFn<A>) -> A {
    A::default()
}

/// A field's value in `call!`'s struct form: a field given alone takes the local variable of
/// its name, as in a struct literal.
macro_rules! field_value {
    ($field:ident) => {
        $field
    };
    ($field:ident : $value:expr) => {
        $value
    };
}

/// Like `try_call!`, but panics with the plugin's message on failure.
macro_rules! call {
    ($lib:expr, $f:ident { $( $field:ident $(: $value:expr)? ),* $(,)? }) => {
        try_call!($lib, $f { $( $field $(: $value)? ),* })
            .unwrap_or_else(|e| panic!("{}: {e}", stringify!($f)))
    };
    ($lib:expr, $f:ident, $args:expr) => {
        if let Err(e) = try_call!($lib, $f, $args) {
            panic!("{}: {e}", stringify!($f));
        }
    };
}

/// Calls a table entry with `args` and hands back the plugin's error.
///
/// With `$f { field: value, .. }` instead of `$args`, calls it with a fresh argument struct
/// (of the type the entry takes) whose listed fields are set, and gives the struct back.
macro_rules! try_call {
    ($lib:expr, $f:ident { $( $field:ident $(: $value:expr)? ),* $(,)? }) => {{
        let mut args = args_for($lib.api().$f);
        $( args.$field = field_value!($field $(: $value)?); )*
        try_call!($lib, $f, &mut args).map(|()| args)
    }};
    ($lib:expr, $f:ident, $args:expr) => {{
        let f = $lib
            .api()
            .$f
            .expect(concat!("the plugin lacks ", stringify!($f)));
        // SAFETY: `f` is this plugin's entry, `$args` is a live struct of the declared layout
        // whose pointers reference live objects of this plugin or of this test.
        let error = unsafe { f($args) };
        // SAFETY: `error` was just returned by this plugin and is owned here.
        unsafe { $lib.check(error) }
    }};
}

fn text(ptr: *const c_char, len: usize) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: the plugin returned `len` readable bytes at `ptr`, alive while we copy them.
    let bytes = unsafe { core::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

fn await_and_destroy(lib: &PjrtLibrary, event: *mut PJRT_Event) {
    if event.is_null() {
        return;
    }
    call!(lib, PJRT_Event_Await { event });
    call!(lib, PJRT_Event_Destroy { event });
}

#[test]
fn open_version_and_initialize() {
    let p = plugin_or_skip!();
    let (major, minor) = p.lib.version();
    assert_eq!(major, 0);
    if p.is_default {
        assert_eq!((major, minor), (0, 115));
        assert_eq!(p.lib.struct_size(), 1144);
    }
    assert!(p.lib.api().PJRT_Client_Create.is_some());
    p.lib.initialize().unwrap();
    p.lib.initialize().unwrap();

    let attrs = call!(p.lib, PJRT_Plugin_Attributes {});
    // SAFETY: the plugin returned `num_attributes` structs valid for the process's life.
    let attrs = unsafe { core::slice::from_raw_parts(attrs.attributes, attrs.num_attributes) };
    let names: Vec<String> = attrs.iter().map(|a| text(a.name, a.name_size)).collect();
    println!("plugin attributes: {names:?}");
}

/// A client with four CPU devices, destroyed on drop.
struct Client<'a> {
    lib: &'a PjrtLibrary,
    raw: *mut PJRT_Client,
}

impl<'a> Client<'a> {
    fn new(lib: &'a PjrtLibrary) -> Self {
        lib.initialize().unwrap();
        let options = [PJRT_NamedValue::new_int64("cpu_device_count", 4)];
        let args = call!(
            lib,
            PJRT_Client_Create {
                create_options: options.as_ptr(),
                num_options: options.len(),
            }
        );
        assert!(!args.client.is_null());
        Self {
            lib,
            raw: args.client,
        }
    }

    fn addressable_devices(&self) -> Vec<*mut PJRT_Device> {
        let args = call!(
            self.lib,
            PJRT_Client_AddressableDevices { client: self.raw }
        );
        // SAFETY: the client owns `num_addressable_devices` device pointers at that address.
        unsafe {
            core::slice::from_raw_parts(args.addressable_devices, args.num_addressable_devices)
        }
        .to_vec()
    }

    fn upload_f32(&self, device: *mut PJRT_Device, data: &[f32]) -> *mut PJRT_Buffer {
        let dims = [data.len() as i64];
        let args = call!(
            self.lib,
            PJRT_Client_BufferFromHostBuffer {
                client: self.raw,
                data: data.as_ptr().cast(),
                type_: PJRT_Buffer_Type::F32,
                dims: dims.as_ptr(),
                num_dims: dims.len(),
                host_buffer_semantics: PJRT_HostBufferSemantics::IMMUTABLE_UNTIL_TRANSFER_COMPLETES,
                device,
            }
        );
        // `data` must outlive the transfer, so wait for it here.
        await_and_destroy(self.lib, args.done_with_host_buffer);
        args.buffer
    }

    fn download_f32(&self, buffer: *mut PJRT_Buffer, len: usize) -> Vec<f32> {
        let mut out = vec![0f32; len];
        let args = call!(
            self.lib,
            PJRT_Buffer_ToHostBuffer {
                src: buffer,
                dst: out.as_mut_ptr().cast(),
                dst_size: len * 4,
            }
        );
        await_and_destroy(self.lib, args.event);
        out
    }

    /// Compiles `program` given in `format` with default options.
    fn try_compile(
        &self,
        program: &str,
        format: &str,
    ) -> Result<*mut PJRT_LoadedExecutable, PjrtError> {
        let options = compile_options::CompileOptions::default().encode().unwrap();
        let mut prog = PJRT_Program::new();
        prog.code = program.as_ptr().cast_mut().cast();
        prog.code_size = program.len();
        prog.format = format.as_ptr().cast();
        prog.format_size = format.len();
        let args = try_call!(
            self.lib,
            PJRT_Client_Compile {
                client: self.raw,
                program: &prog,
                compile_options: options.as_ptr().cast(),
                compile_options_size: options.len(),
            }
        )?;
        Ok(args.executable)
    }

    fn compile(&self, program: &str) -> *mut PJRT_LoadedExecutable {
        let exe = self
            .try_compile(program, "mlir")
            .unwrap_or_else(|e| panic!("PJRT_Client_Compile: {e}"));
        assert!(!exe.is_null());
        exe
    }

    /// Runs a one-device executable on `args`, returning its single output.
    fn run(
        &self,
        exe: *mut PJRT_LoadedExecutable,
        inputs: &[*mut PJRT_Buffer],
    ) -> *mut PJRT_Buffer {
        let mut options = PJRT_ExecuteOptions::new();
        let argument_lists = [inputs.as_ptr()];
        let mut outputs = [ptr::null_mut::<PJRT_Buffer>(); 1];
        let output_lists = [outputs.as_mut_ptr()];
        let mut done = [ptr::null_mut::<PJRT_Event>(); 1];
        call!(
            self.lib,
            PJRT_LoadedExecutable_Execute {
                executable: exe,
                options: &mut options,
                argument_lists: argument_lists.as_ptr(),
                num_devices: 1,
                num_args: inputs.len(),
                output_lists: output_lists.as_ptr(),
                device_complete_events: done.as_mut_ptr(),
            }
        );
        await_and_destroy(self.lib, done[0]);
        assert!(!outputs[0].is_null());
        outputs[0]
    }

    fn destroy_buffer(&self, buffer: *mut PJRT_Buffer) {
        call!(self.lib, PJRT_Buffer_Destroy { buffer });
    }

    fn destroy_loaded(&self, exe: *mut PJRT_LoadedExecutable) {
        call!(self.lib, PJRT_LoadedExecutable_Destroy { executable: exe });
    }
}

impl Drop for Client<'_> {
    fn drop(&mut self) {
        call!(self.lib, PJRT_Client_Destroy { client: self.raw });
    }
}

#[test]
fn client_and_devices() {
    let p = plugin_or_skip!();
    let lib = &p.lib;
    let client = Client::new(lib);

    let name = call!(lib, PJRT_Client_PlatformName { client: client.raw });
    assert_eq!(text(name.platform_name, name.platform_name_size), "cpu");

    let version = call!(lib, PJRT_Client_PlatformVersion { client: client.raw });
    println!(
        "platform version: {}",
        text(version.platform_version, version.platform_version_size)
    );

    let index = call!(lib, PJRT_Client_ProcessIndex { client: client.raw });
    assert_eq!(index.process_index, 0);

    let all = call!(lib, PJRT_Client_Devices { client: client.raw });
    assert_eq!(all.num_devices, 4);

    let devices = client.addressable_devices();
    assert_eq!(devices.len(), 4);
    let mut ids = Vec::new();
    for &device in &devices {
        let desc = call!(lib, PJRT_Device_GetDescription { device });
        let device_description = desc.device_description;

        let kind = call!(lib, PJRT_DeviceDescription_Kind { device_description });
        let kind = text(kind.device_kind, kind.device_kind_size);
        assert!(!kind.is_empty());

        let id = call!(lib, PJRT_DeviceDescription_Id { device_description });
        ids.push(id.id);

        let proc_index = call!(
            lib,
            PJRT_DeviceDescription_ProcessIndex { device_description }
        );
        assert_eq!(proc_index.process_index, 0);

        let to_string = call!(lib, PJRT_DeviceDescription_ToString { device_description });
        call!(
            lib,
            PJRT_DeviceDescription_DebugString { device_description }
        );
        call!(
            lib,
            PJRT_DeviceDescription_Attributes { device_description }
        );

        let addressable = call!(lib, PJRT_Device_IsAddressable { device });
        assert!(addressable.is_addressable);

        let hw = call!(lib, PJRT_Device_LocalHardwareId { device });

        let lookup = call!(
            lib,
            PJRT_Client_LookupAddressableDevice {
                client: client.raw,
                local_hardware_id: hw.local_hardware_id,
            }
        );
        assert_eq!(lookup.addressable_device, device);

        let by_id = call!(
            lib,
            PJRT_Client_LookupDevice {
                client: client.raw,
                id: id.id,
            }
        );
        assert_eq!(by_id.device, device);

        // CPU devices may not keep allocator statistics; an error here is a valid answer.
        let _ = try_call!(lib, PJRT_Device_MemoryStats { device });

        println!(
            "device {} kind {kind:?} hw {} {:?}",
            id.id,
            hw.local_hardware_id,
            text(to_string.to_string, to_string.to_string_size)
        );
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 4, "device ids are distinct");

    let mut assignment = vec![-1i32; 4];
    call!(
        lib,
        PJRT_Client_DefaultDeviceAssignment {
            client: client.raw,
            num_replicas: 1,
            num_partitions: 4,
            default_assignment_size: assignment.len(),
            default_assignment: assignment.as_mut_ptr(),
        }
    );
    assert!(assignment.iter().all(|d| *d >= 0), "{assignment:?}");
}

#[test]
fn compile_execute_and_read_back() {
    let p = plugin_or_skip!();
    let lib = &p.lib;
    let client = Client::new(lib);
    let device = client.addressable_devices()[0];

    let exe = client.compile(PROGRAM);
    let a = client.upload_f32(device, &[1.0, 2.0, 3.0, 4.0]);
    let b = client.upload_f32(device, &[10.0, 20.0, 30.0, 40.0]);
    let out = client.run(exe, &[a, b]);
    assert_eq!(client.download_f32(out, 4), [11.0, 44.0, 99.0, 176.0]);

    // What the output buffer says about itself.
    let ty = call!(lib, PJRT_Buffer_ElementType { buffer: out });
    assert_eq!(ty.type_, PJRT_Buffer_Type::F32);
    let dims = call!(lib, PJRT_Buffer_Dimensions { buffer: out });
    // SAFETY: the buffer owns `num_dims` dimensions at `dims`.
    assert_eq!(
        unsafe { core::slice::from_raw_parts(dims.dims, dims.num_dims) },
        [4]
    );
    let unpadded = call!(lib, PJRT_Buffer_UnpaddedDimensions { buffer: out });
    assert_eq!(unpadded.num_dims, 1);
    let size = call!(lib, PJRT_Buffer_OnDeviceSizeInBytes { buffer: out });
    assert_eq!(size.on_device_size_in_bytes, 16);
    let on_cpu = call!(lib, PJRT_Buffer_IsOnCpu { buffer: out });
    assert!(on_cpu.is_on_cpu);
    let dev = call!(lib, PJRT_Buffer_Device { buffer: out });
    assert_eq!(dev.device, device);
    let ready = call!(lib, PJRT_Buffer_ReadyEvent { buffer: out });
    call!(lib, PJRT_Event_IsReady { event: ready.event });
    await_and_destroy(lib, ready.event);

    // Copy to another device and read it there.
    let other = client.addressable_devices()[1];
    let copy = call!(
        lib,
        PJRT_Buffer_CopyToDevice {
            buffer: out,
            dst_device: other,
        }
    );
    assert_eq!(
        client.download_f32(copy.dst_buffer, 4),
        [11.0, 44.0, 99.0, 176.0]
    );
    client.destroy_buffer(copy.dst_buffer);

    // Delete frees the data but keeps the handle.
    call!(lib, PJRT_Buffer_Delete { buffer: out });
    let deleted = call!(lib, PJRT_Buffer_IsDeleted { buffer: out });
    assert!(deleted.is_deleted);
    client.destroy_buffer(out);

    // The unloaded executable: outputs, name, fingerprint.
    let get = call!(
        lib,
        PJRT_LoadedExecutable_GetExecutable {
            loaded_executable: exe,
        }
    );
    let executable = get.executable;
    let n = call!(lib, PJRT_Executable_NumOutputs { executable });
    assert_eq!(n.num_outputs, 1);
    let types = call!(lib, PJRT_Executable_OutputElementTypes { executable });
    // SAFETY: the executable owns `num_output_types` entries at `output_types`.
    let types = unsafe { core::slice::from_raw_parts(types.output_types, types.num_output_types) };
    assert_eq!(types, [PJRT_Buffer_Type::F32]);
    let out_dims = call!(lib, PJRT_Executable_OutputDimensions { executable });
    assert_eq!(out_dims.num_outputs, 1);
    // SAFETY: one rank entry per output, and the dims of all outputs concatenated.
    unsafe {
        assert_eq!(*out_dims.dim_sizes, 1);
        assert_eq!(*out_dims.dims, 4);
    }
    let name = call!(lib, PJRT_Executable_Name { executable });
    println!(
        "executable name: {}",
        text(name.executable_name, name.executable_name_size)
    );
    if let Err(e) = try_call!(lib, PJRT_Executable_Fingerprint { executable }) {
        println!("no fingerprint: {e}");
    }

    // Optimized program: ask for the size, then fetch it.
    let mut program = PJRT_Program::new();
    let mut optimized = PJRT_Executable_OptimizedProgram_Args::new();
    optimized.executable = executable;
    optimized.program = &mut program;
    match try_call!(lib, PJRT_Executable_OptimizedProgram, &mut optimized) {
        Ok(()) => {
            let mut code = vec![0u8; program.code_size];
            program.code = code.as_mut_ptr().cast();
            call!(lib, PJRT_Executable_OptimizedProgram, &mut optimized);
            println!(
                "optimized program: {} bytes, format {:?}",
                code.len(),
                text(program.format, program.format_size)
            );
        }
        Err(e) => println!("no optimized program: {e}"),
    }

    // Serialize, load the bytes back and run the copy.
    let ser = call!(lib, PJRT_Executable_Serialize { executable });
    assert!(ser.serialized_bytes_size > 0);
    let load = call!(
        lib,
        PJRT_Executable_DeserializeAndLoad {
            client: client.raw,
            serialized_executable: ser.serialized_bytes,
            serialized_executable_size: ser.serialized_bytes_size,
        }
    );
    if let Some(deleter) = ser.serialized_executable_deleter {
        // SAFETY: the holder came from this plugin's Serialize and is freed exactly once.
        unsafe { deleter(ser.serialized_executable) };
    }
    let reloaded = load.loaded_executable;
    let out2 = client.run(reloaded, &[a, b]);
    assert_eq!(client.download_f32(out2, 4), [11.0, 44.0, 99.0, 176.0]);
    client.destroy_buffer(out2);

    let exe_devices = call!(
        lib,
        PJRT_LoadedExecutable_AddressableDevices { executable: exe }
    );
    assert_eq!(exe_devices.num_addressable_devices, 1);

    call!(lib, PJRT_Executable_Destroy { executable });

    call!(lib, PJRT_LoadedExecutable_Delete { executable: exe });
    let is_deleted = call!(lib, PJRT_LoadedExecutable_IsDeleted { executable: exe });
    assert!(is_deleted.is_deleted);

    client.destroy_loaded(reloaded);
    client.destroy_loaded(exe);
    client.destroy_buffer(a);
    client.destroy_buffer(b);
}

#[test]
fn plugin_errors_carry_code_and_message() {
    let p = plugin_or_skip!();
    let lib = &p.lib;
    let client = Client::new(lib);
    let err = client.try_compile(PROGRAM, "no-such-format").unwrap_err();
    assert_ne!(err.code, PJRT_Error_Code::OK);
    assert!(!err.message.is_empty());
    println!("expected compile failure: {err}");

    // An argument struct smaller than the plugin's own is refused with its expected size.
    let small = try_call!(
        lib,
        PJRT_Client_PlatformName {
            struct_size: 8,
            client: client.raw,
        }
    );
    let err = small.unwrap_err();
    assert!(err.message.contains("expected 40, got 8"), "{err}");
}

/// Reads `N` out of a plugin's "Unexpected <struct> size: expected N, got M" complaint.
fn expected_size(message: &str) -> Option<usize> {
    let start = message.find("size: expected ")? + "size: expected ".len();
    message[start..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Calls each entry with `struct_size` 0 and checks the size the plugin then asks for is no
/// larger than the one we declare. Plugins check the size before touching any other field.
macro_rules! size_probe {
    ($lib:expr, $( $f:ident : $args:ident ),* $(,)?) => {{
        let mut checked = 0;
        $(
            let mut args = $args::new();
            args.struct_size = 0;
            let err = try_call!($lib, $f, &mut args)
                .expect_err(concat!(stringify!($f), " accepted struct_size 0"));
            let want = expected_size(&err.message)
                .unwrap_or_else(|| panic!("{}: {err}", stringify!($f)));
            assert!(
                want <= $args::STRUCT_SIZE,
                "{}: the plugin expects {want} bytes, we declare {}",
                stringify!($args),
                $args::STRUCT_SIZE
            );
            checked += 1;
        )*
        checked
    }};
}

#[test]
fn plugin_accepts_every_declared_struct_size() {
    let p = plugin_or_skip!();
    if !p.is_default {
        // Probing with struct_size 0 relies on the plugin checking sizes first, which was
        // verified for the CPU plugin only.
        println!("skipped: size probe runs only against the default CPU plugin");
        return;
    }
    let lib = &p.lib;
    lib.initialize().unwrap();
    let checked = size_probe!(lib,
        PJRT_Error_GetCode: PJRT_Error_GetCode_Args,
        PJRT_Plugin_Initialize: PJRT_Plugin_Initialize_Args,
        PJRT_Plugin_Attributes: PJRT_Plugin_Attributes_Args,
        PJRT_Event_Destroy: PJRT_Event_Destroy_Args,
        PJRT_Event_IsReady: PJRT_Event_IsReady_Args,
        PJRT_Event_Error: PJRT_Event_Error_Args,
        PJRT_Event_Await: PJRT_Event_Await_Args,
        PJRT_Event_OnReady: PJRT_Event_OnReady_Args,
        PJRT_Client_Create: PJRT_Client_Create_Args,
        PJRT_Client_Destroy: PJRT_Client_Destroy_Args,
        PJRT_Client_PlatformName: PJRT_Client_PlatformName_Args,
        PJRT_Client_ProcessIndex: PJRT_Client_ProcessIndex_Args,
        PJRT_Client_PlatformVersion: PJRT_Client_PlatformVersion_Args,
        PJRT_Client_Devices: PJRT_Client_Devices_Args,
        PJRT_Client_AddressableDevices: PJRT_Client_AddressableDevices_Args,
        PJRT_Client_LookupDevice: PJRT_Client_LookupDevice_Args,
        PJRT_Client_LookupAddressableDevice: PJRT_Client_LookupAddressableDevice_Args,
        PJRT_Client_AddressableMemories: PJRT_Client_AddressableMemories_Args,
        PJRT_Client_Compile: PJRT_Client_Compile_Args,
        PJRT_Client_DefaultDeviceAssignment: PJRT_Client_DefaultDeviceAssignment_Args,
        PJRT_Client_BufferFromHostBuffer: PJRT_Client_BufferFromHostBuffer_Args,
        PJRT_DeviceDescription_Id: PJRT_DeviceDescription_Id_Args,
        PJRT_DeviceDescription_ProcessIndex: PJRT_DeviceDescription_ProcessIndex_Args,
        PJRT_DeviceDescription_Attributes: PJRT_DeviceDescription_Attributes_Args,
        PJRT_DeviceDescription_Kind: PJRT_DeviceDescription_Kind_Args,
        PJRT_DeviceDescription_DebugString: PJRT_DeviceDescription_DebugString_Args,
        PJRT_DeviceDescription_ToString: PJRT_DeviceDescription_ToString_Args,
        PJRT_Device_GetDescription: PJRT_Device_GetDescription_Args,
        PJRT_Device_IsAddressable: PJRT_Device_IsAddressable_Args,
        PJRT_Device_LocalHardwareId: PJRT_Device_LocalHardwareId_Args,
        PJRT_Device_AddressableMemories: PJRT_Device_AddressableMemories_Args,
        PJRT_Device_DefaultMemory: PJRT_Device_DefaultMemory_Args,
        PJRT_Device_MemoryStats: PJRT_Device_MemoryStats_Args,
        PJRT_Memory_Id: PJRT_Memory_Id_Args,
        PJRT_Memory_Kind: PJRT_Memory_Kind_Args,
        PJRT_Memory_DebugString: PJRT_Memory_DebugString_Args,
        PJRT_Memory_ToString: PJRT_Memory_ToString_Args,
        PJRT_Memory_AddressableByDevices: PJRT_Memory_AddressableByDevices_Args,
        PJRT_Memory_Kind_Id: PJRT_Memory_Kind_Id_Args,
        PJRT_Executable_Destroy: PJRT_Executable_Destroy_Args,
        PJRT_Executable_Name: PJRT_Executable_Name_Args,
        PJRT_Executable_NumReplicas: PJRT_Executable_NumReplicas_Args,
        PJRT_Executable_NumPartitions: PJRT_Executable_NumPartitions_Args,
        PJRT_Executable_NumOutputs: PJRT_Executable_NumOutputs_Args,
        PJRT_Executable_SizeOfGeneratedCodeInBytes: PJRT_Executable_SizeOfGeneratedCodeInBytes_Args,
        PJRT_Executable_GetCostAnalysis: PJRT_Executable_GetCostAnalysis_Args,
        PJRT_Executable_OutputMemoryKinds: PJRT_Executable_OutputMemoryKinds_Args,
        PJRT_Executable_OptimizedProgram: PJRT_Executable_OptimizedProgram_Args,
        PJRT_Executable_Serialize: PJRT_Executable_Serialize_Args,
        PJRT_Executable_OutputElementTypes: PJRT_Executable_OutputElementTypes_Args,
        PJRT_Executable_OutputDimensions: PJRT_Executable_OutputDimensions_Args,
        PJRT_Executable_Fingerprint: PJRT_Executable_Fingerprint_Args,
        PJRT_Executable_GetCompiledMemoryStats: PJRT_Executable_GetCompiledMemoryStats_Args,
        PJRT_Executable_DeserializeAndLoad: PJRT_Executable_DeserializeAndLoad_Args,
        PJRT_LoadedExecutable_Destroy: PJRT_LoadedExecutable_Destroy_Args,
        PJRT_LoadedExecutable_GetExecutable: PJRT_LoadedExecutable_GetExecutable_Args,
        PJRT_LoadedExecutable_AddressableDevices: PJRT_LoadedExecutable_AddressableDevices_Args,
        PJRT_LoadedExecutable_Delete: PJRT_LoadedExecutable_Delete_Args,
        PJRT_LoadedExecutable_IsDeleted: PJRT_LoadedExecutable_IsDeleted_Args,
        PJRT_LoadedExecutable_Execute: PJRT_LoadedExecutable_Execute_Args,
        PJRT_ExecuteContext_Create: PJRT_ExecuteContext_Create_Args,
        PJRT_ExecuteContext_Destroy: PJRT_ExecuteContext_Destroy_Args,
        PJRT_Buffer_Destroy: PJRT_Buffer_Destroy_Args,
        PJRT_Buffer_ElementType: PJRT_Buffer_ElementType_Args,
        PJRT_Buffer_Dimensions: PJRT_Buffer_Dimensions_Args,
        PJRT_Buffer_UnpaddedDimensions: PJRT_Buffer_UnpaddedDimensions_Args,
        PJRT_Buffer_OnDeviceSizeInBytes: PJRT_Buffer_OnDeviceSizeInBytes_Args,
        PJRT_Buffer_Device: PJRT_Buffer_Device_Args,
        PJRT_Buffer_Memory: PJRT_Buffer_Memory_Args,
        PJRT_Buffer_Delete: PJRT_Buffer_Delete_Args,
        PJRT_Buffer_IsDeleted: PJRT_Buffer_IsDeleted_Args,
        PJRT_Buffer_CopyToDevice: PJRT_Buffer_CopyToDevice_Args,
        PJRT_Buffer_CopyToMemory: PJRT_Buffer_CopyToMemory_Args,
        PJRT_Buffer_ToHostBuffer: PJRT_Buffer_ToHostBuffer_Args,
        PJRT_Buffer_IsOnCpu: PJRT_Buffer_IsOnCpu_Args,
        PJRT_Buffer_ReadyEvent: PJRT_Buffer_ReadyEvent_Args,
        PJRT_Buffer_UnsafePointer: PJRT_Buffer_UnsafePointer_Args,
        PJRT_Buffer_IncreaseExternalReferenceCount: PJRT_Buffer_IncreaseExternalReferenceCount_Args,
        PJRT_Buffer_DecreaseExternalReferenceCount: PJRT_Buffer_DecreaseExternalReferenceCount_Args,
        PJRT_Buffer_OpaqueDeviceMemoryDataPointer: PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args,
        PJRT_Client_TopologyDescription: PJRT_Client_TopologyDescription_Args,
        PJRT_Event_Create: PJRT_Event_Create_Args,
        PJRT_Event_Set: PJRT_Event_Set_Args,
        PJRT_Error_ForEachPayload: PJRT_Error_ForEachPayload_Args,
    );
    assert_eq!(checked, 84);

    // Structs passed by pointer inside other arguments: a program and execute options.
    let client = Client::new(lib);
    let mut prog = PJRT_Program::new();
    prog.struct_size = 0;
    let compile = try_call!(
        lib,
        PJRT_Client_Compile {
            client: client.raw,
            program: &prog,
        }
    );
    let err = compile.unwrap_err();
    assert!(
        expected_size(&err.message).is_some_and(|n| n <= PJRT_Program::STRUCT_SIZE),
        "{err}"
    );

    let exe = client.compile(PROGRAM);
    let mut options = PJRT_ExecuteOptions::new();
    options.struct_size = 0;
    let run = try_call!(
        lib,
        PJRT_LoadedExecutable_Execute {
            executable: exe,
            options: &mut options,
            num_devices: 1,
        }
    );
    let err = run.unwrap_err();
    let want = expected_size(&err.message);
    assert!(
        want.is_some_and(|n| n <= PJRT_ExecuteOptions::STRUCT_SIZE),
        "{err}"
    );
    client.destroy_loaded(exe);
}
