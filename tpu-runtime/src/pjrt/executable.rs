//! Compiling StableHLO programs and running them on PJRT devices.

use std::sync::Arc;

use libtpu_sys::{
    PJRT_Buffer, PJRT_Event, PJRT_Executable, PJRT_ExecuteOptions, PJRT_LoadedExecutable,
    PJRT_Program,
};

use super::buffer::PjrtBuffer;
use super::client::Client;
use super::event::Event;
use super::ffi::{pjrt_call, slice_from, string_from};
use super::signature::{ParamType, main_params, program_head};
use crate::error::{Error, Result};
use crate::switch::EnvSwitch;
use libtpu_sys::compile_options::CompileOptions;

/// Environment variable: `1` makes every PJRT execution wait for completion before returning.
pub const ENV_LAUNCH_BLOCKING: &str = "TPU_RS_LAUNCH_BLOCKING";

static LAUNCH_BLOCKING: EnvSwitch = EnvSwitch::new(ENV_LAUNCH_BLOCKING, false);

/// True when executions wait for completion (`TPU_RS_LAUNCH_BLOCKING=1` or
/// [`set_launch_blocking`]), so an error surfaces at the call that caused it.
pub fn launch_blocking() -> bool {
    LAUNCH_BLOCKING.get()
}

/// Makes executions wait for completion (`true`) or return at once (`false`, the default).
pub fn set_launch_blocking(on: bool) {
    LAUNCH_BLOCKING.set(on);
}

const SERIAL_MAGIC: &[u8] = b"tpu-rs executable v1\n";

struct ExecInner {
    raw: *mut PJRT_LoadedExecutable,
    client: Client,
    name: String,
    num_outputs: usize,
    /// Indices (among the client's devices) the executable runs on, in replica order.
    devices: Vec<usize>,
    params: Option<Vec<ParamType>>,
    portable: bool,
}

// SAFETY: loaded executables may be executed concurrently from any thread per the C API; the
// raw pointer is owned here and destroyed once in `Drop`.
unsafe impl Send for ExecInner {}
// SAFETY: see `Send`.
unsafe impl Sync for ExecInner {}

impl Drop for ExecInner {
    fn drop(&mut self) {
        let lib = self.client.lib();
        // SAFETY: owned, destroyed exactly once; queued executions keep what they need alive.
        let _ = unsafe {
            pjrt_call!(
                lib,
                PJRT_LoadedExecutable_Destroy {
                    executable: self.raw
                }
            )
        };
    }
}

/// A compiled program loaded on one or more devices. Cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct Executable {
    inner: Arc<ExecInner>,
}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Executable({}, {} outputs, devices {:?})",
            self.inner.name, self.inner.num_outputs, self.inner.devices
        )
    }
}

/// Runs `f` with the `PJRT_Executable` behind a loaded executable, destroying it afterwards.
fn with_executable<R>(
    client: &Client,
    loaded: *mut PJRT_LoadedExecutable,
    f: impl FnOnce(*mut PJRT_Executable) -> Result<R>,
) -> Result<R> {
    let lib = client.lib();
    // SAFETY: `loaded` is live; the returned executable is ours to destroy.
    let g = unsafe {
        pjrt_call!(
            lib,
            PJRT_LoadedExecutable_GetExecutable {
                loaded_executable: loaded
            }
        )
    }?;
    let r = f(g.executable);
    // SAFETY: destroyed exactly once, after its last use in `f`.
    let _ = unsafe {
        pjrt_call!(
            lib,
            PJRT_Executable_Destroy {
                executable: g.executable
            }
        )
    };
    r
}

impl Executable {
    fn wrap(
        client: &Client,
        raw: *mut PJRT_LoadedExecutable,
        params: Option<Vec<ParamType>>,
        portable: bool,
    ) -> Result<Executable> {
        let lib = client.lib();
        // Own it at once so that errors below still destroy it.
        let mut inner = ExecInner {
            raw,
            client: client.clone(),
            name: String::new(),
            num_outputs: 0,
            devices: Vec::new(),
            params,
            portable,
        };
        let (name, num_outputs) = with_executable(client, raw, |exe| {
            // SAFETY: `exe` is live for this closure; the name lives as long as `exe`.
            unsafe {
                let n = pjrt_call!(lib, PJRT_Executable_Name { executable: exe })?;
                let o = pjrt_call!(lib, PJRT_Executable_NumOutputs { executable: exe })?;
                Ok((
                    string_from(n.executable_name, n.executable_name_size),
                    o.num_outputs,
                ))
            }
        })?;
        inner.name = name;
        inner.num_outputs = num_outputs;
        // SAFETY: `raw` is live; the array lives as long as the executable.
        let raws = unsafe {
            let d = pjrt_call!(
                lib,
                PJRT_LoadedExecutable_AddressableDevices { executable: raw }
            )?;
            slice_from(d.addressable_devices, d.num_addressable_devices).to_vec()
        };
        for r in raws {
            let idx = client.index_of_raw(r).ok_or_else(|| Error::Pjrt {
                function: "PJRT_LoadedExecutable_AddressableDevices",
                code: "INTERNAL".into(),
                message: "the executable names a device its client does not list".into(),
            })?;
            inner.devices.push(idx);
        }
        Ok(Executable {
            inner: Arc::new(inner),
        })
    }

    /// The executable's name (the module's name, as XLA reports it).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Outputs per device.
    pub fn num_outputs(&self) -> usize {
        self.inner.num_outputs
    }

    /// Device indices (among the client's devices) the executable runs on, in replica order.
    pub fn devices(&self) -> &[usize] {
        &self.inner.devices
    }

    /// The client that compiled it.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The parameter types read from the program text, when they could be read.
    pub fn params(&self) -> Option<&[ParamType]> {
        self.inner.params.as_deref()
    }

    /// The fingerprint the plugin gives the compiled program, if it provides one.
    pub fn fingerprint(&self) -> Result<String> {
        let client = self.client();
        let lib = client.lib();
        with_executable(client, self.inner.raw, |exe| {
            // SAFETY: `exe` is live; the string lives as long as `exe`.
            unsafe {
                let a = pjrt_call!(lib, PJRT_Executable_Fingerprint { executable: exe })?;
                Ok(string_from(
                    a.executable_fingerprint,
                    a.executable_fingerprint_size,
                ))
            }
        })
    }

    /// Serializes the compiled program (with its parameter types) so that
    /// [`Client::deserialize`] can load it without compiling again.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let client = self.client();
        let lib = client.lib();
        let body = with_executable(client, self.inner.raw, |exe| {
            // SAFETY: `exe` is live; the bytes stay valid until the deleter runs, which we call
            // after copying them.
            unsafe {
                let a = pjrt_call!(lib, PJRT_Executable_Serialize { executable: exe })?;
                let bytes =
                    slice_from(a.serialized_bytes.cast::<u8>(), a.serialized_bytes_size).to_vec();
                if let Some(del) = a.serialized_executable_deleter {
                    del(a.serialized_executable);
                }
                Ok(bytes)
            }
        })?;
        let sig = match &self.inner.params {
            Some(ps) => ps
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(" "),
            None => "?".into(),
        };
        let mut out = SERIAL_MAGIC.to_vec();
        out.extend_from_slice(format!("{}\n{sig}\n", u8::from(self.inner.portable)).as_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    fn check_args(&self, device_pos: usize, args: &[&PjrtBuffer]) -> Result<()> {
        let bad = |reason: String| Error::ExecutableArguments {
            executable: self.name().to_string(),
            reason,
        };
        for (i, a) in args.iter().enumerate() {
            if a.client() != self.client() {
                return Err(bad(format!(
                    "argument {i} lives on another client's device"
                )));
            }
        }
        if let Some(params) = &self.inner.params {
            if args.len() != params.len() {
                return Err(bad(format!(
                    "expected {} arguments, got {}",
                    params.len(),
                    args.len()
                )));
            }
            for (i, (a, p)) in args.iter().zip(params).enumerate() {
                if a.dtype() != p.dtype || a.dims() != p.dims.as_slice() {
                    return Err(bad(format!(
                        "argument {i}: expected {p}, got {}",
                        ParamType {
                            dtype: a.dtype(),
                            dims: a.dims().to_vec()
                        }
                    )));
                }
            }
        }
        let _ = device_pos;
        Ok(())
    }

    /// Runs on the executable's single device. Returns at once with the outputs (which become
    /// ready when the work finishes) unless launch blocking is on.
    pub fn execute(&self, args: &[&PjrtBuffer]) -> Result<Vec<PjrtBuffer>> {
        if self.inner.devices.len() != 1 {
            return Err(Error::ExecutableArguments {
                executable: self.name().to_string(),
                reason: format!(
                    "compiled for {} devices; use execute_replicated with one argument list per device",
                    self.inner.devices.len()
                ),
            });
        }
        Ok(self.run(&[args.to_vec()], None)?.pop().unwrap_or_default())
    }

    /// Runs a portable executable on device `device` of its client.
    pub fn execute_on(&self, device: usize, args: &[&PjrtBuffer]) -> Result<Vec<PjrtBuffer>> {
        if !self.inner.portable {
            return Err(Error::ExecutableArguments {
                executable: self.name().to_string(),
                reason: "execute_on needs an executable compiled as portable".into(),
            });
        }
        if device >= self.client().device_count() {
            return Err(Error::DeviceUnavailable {
                device: format!("{}:{device}", self.client().device_prefix()),
                reason: format!("the client has {} devices", self.client().device_count()),
            });
        }
        Ok(self
            .run(&[args.to_vec()], Some(device))?
            .pop()
            .unwrap_or_default())
    }

    /// Runs on every device the executable was compiled for, `args[i]` on its i-th device, at
    /// once. Returns each device's outputs.
    pub fn execute_replicated(&self, args: &[Vec<&PjrtBuffer>]) -> Result<Vec<Vec<PjrtBuffer>>> {
        if args.len() != self.inner.devices.len() {
            return Err(Error::ExecutableArguments {
                executable: self.name().to_string(),
                reason: format!(
                    "expected one argument list per device ({}), got {}",
                    self.inner.devices.len(),
                    args.len()
                ),
            });
        }
        self.run(args, None)
    }

    fn run(
        &self,
        args: &[Vec<&PjrtBuffer>],
        execute_device: Option<usize>,
    ) -> Result<Vec<Vec<PjrtBuffer>>> {
        let client = self.client();
        let lib = client.lib();
        let targets: Vec<usize> = match execute_device {
            Some(d) => vec![d],
            None => self.inner.devices.clone(),
        };
        for (pos, list) in args.iter().enumerate() {
            self.check_args(pos, list)?;
            for (i, a) in list.iter().enumerate() {
                if a.device_index() != targets[pos] {
                    return Err(Error::DeviceMismatch {
                        op: format!("executable {} argument {i}", self.name()),
                        first: format!("{}:{}", client.device_prefix(), targets[pos]),
                        second: format!("{}:{}", client.device_prefix(), a.device_index()),
                    });
                }
            }
        }
        let num_args = args.first().map_or(0, |l| l.len());
        if args.iter().any(|l| l.len() != num_args) {
            return Err(Error::ExecutableArguments {
                executable: self.name().to_string(),
                reason: "every device needs the same number of arguments".into(),
            });
        }
        let raw_args: Vec<Vec<*mut PJRT_Buffer>> = args
            .iter()
            .map(|l| l.iter().map(|b| b.raw()).collect())
            .collect();
        let arg_ptrs: Vec<*const *mut PJRT_Buffer> = raw_args.iter().map(|l| l.as_ptr()).collect();
        let n_out = self.inner.num_outputs;
        let mut outs: Vec<Vec<*mut PJRT_Buffer>> = (0..args.len())
            .map(|_| vec![std::ptr::null_mut(); n_out])
            .collect();
        let out_ptrs: Vec<*mut *mut PJRT_Buffer> =
            outs.iter_mut().map(|l| l.as_mut_ptr()).collect();
        let mut events: Vec<*mut PJRT_Event> = vec![std::ptr::null_mut(); args.len()];
        let mut opts = PJRT_ExecuteOptions::new();
        let device = execute_device.map_or(std::ptr::null_mut(), |d| client.entry(d).raw);
        // SAFETY: every pointer array has `num_devices` rows of `num_args`/`num_outputs`
        // entries and outlives the call; the argument buffers are live (we hold references),
        // and were checked against the parameters and devices above.
        unsafe {
            pjrt_call!(
                lib,
                PJRT_LoadedExecutable_Execute {
                    executable: self.inner.raw,
                    options: &mut opts,
                    argument_lists: arg_ptrs.as_ptr(),
                    num_devices: args.len(),
                    num_args: num_args,
                    output_lists: out_ptrs.as_ptr(),
                    device_complete_events: events.as_mut_ptr(),
                    execute_device: device,
                }
            )
        }?;
        // Take ownership of everything the plugin returned before anything can fail.
        let mut result = Vec::with_capacity(args.len());
        let mut first_err = None;
        let mut owned_events = Vec::new();
        for (pos, row) in outs.iter().enumerate() {
            let dev = targets[pos];
            if !events[pos].is_null() {
                // SAFETY: a fresh completion event, owned by us from here.
                owned_events.push((dev, unsafe {
                    Event::from_raw(events[pos], client.clone(), "execute")
                }));
            }
            let mut bufs = Vec::with_capacity(n_out);
            for &raw in row {
                // SAFETY: each output is a fresh buffer of this client on device `dev`.
                match unsafe { PjrtBuffer::from_raw(raw, client, dev) } {
                    Ok(b) => bufs.push(b),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            result.push(bufs);
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if launch_blocking() {
            for (_, e) in &owned_events {
                e.wait()?;
            }
        } else {
            for (dev, e) in owned_events {
                client.track(dev, e);
            }
        }
        Ok(result)
    }
}

impl Client {
    /// Compiles a StableHLO module given as MLIR text. XLA's error text reaches the caller
    /// unchanged, with the program's first lines.
    pub fn compile(&self, mlir: &str, options: &CompileOptions) -> Result<Executable> {
        let encoded = options
            .encode()
            .map_err(|e| Error::invalid_argument("compile options", e.to_string()))?;
        let lib = self.lib();
        let mut code = mlir.as_bytes().to_vec();
        let format = b"mlir";
        let mut program = PJRT_Program::new();
        program.code = code.as_mut_ptr().cast();
        program.code_size = code.len();
        program.format = format.as_ptr().cast();
        program.format_size = format.len();
        // SAFETY: the program text, format and options outlive the call.
        let r = unsafe {
            pjrt_call!(
                lib,
                PJRT_Client_Compile {
                    client: self.raw(),
                    program: &program,
                    compile_options: encoded.as_ptr().cast(),
                    compile_options_size: encoded.len(),
                }
            )
        };
        let a = r.map_err(|e| match e {
            Error::Pjrt { message, .. } => Error::Compile {
                message,
                program_head: program_head(mlir, 6),
            },
            other => other,
        })?;
        Executable::wrap(
            self,
            a.executable,
            main_params(mlir),
            options.compile_portable_executable,
        )
    }

    /// Compiles for one device (index among this client's devices).
    pub fn compile_for_device(&self, mlir: &str, device: usize) -> Result<Executable> {
        let id = self.device_id(device)?;
        self.compile(
            mlir,
            &CompileOptions {
                device_assignment: Some(vec![vec![id]]),
                ..CompileOptions::default()
            },
        )
    }

    /// Compiles one program to run as replicas on `devices` at once.
    pub fn compile_replicated(&self, mlir: &str, devices: &[usize]) -> Result<Executable> {
        let ids = devices
            .iter()
            .map(|&d| self.device_id(d).map(|id| vec![id]))
            .collect::<Result<Vec<_>>>()?;
        self.compile(
            mlir,
            &CompileOptions {
                num_replicas: devices.len() as u32,
                device_assignment: Some(ids),
                ..CompileOptions::default()
            },
        )
    }

    /// Compiles a portable program that [`Executable::execute_on`] can run on any device.
    pub fn compile_portable(&self, mlir: &str) -> Result<Executable> {
        self.compile(
            mlir,
            &CompileOptions {
                compile_portable_executable: true,
                ..CompileOptions::default()
            },
        )
    }

    fn device_id(&self, device: usize) -> Result<i64> {
        if device >= self.device_count() {
            return Err(Error::DeviceUnavailable {
                device: format!("{}:{device}", self.device_prefix()),
                reason: format!("the client has {} devices", self.device_count()),
            });
        }
        Ok(self.entry(device).id as i64)
    }

    /// Loads an executable produced by [`Executable::serialize`] (on a client of the same
    /// plugin and platform version).
    pub fn deserialize(&self, bytes: &[u8]) -> Result<Executable> {
        let bad = |why: &str| Error::InvalidData {
            context: "deserializing an executable".into(),
            reason: why.to_string(),
        };
        let rest = bytes
            .strip_prefix(SERIAL_MAGIC)
            .ok_or_else(|| bad("missing the tpu-rs executable header"))?;
        let nl = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| bad("truncated header"))?;
        let portable = &rest[..nl] == b"1";
        let rest = &rest[nl + 1..];
        let nl = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| bad("truncated header"))?;
        let sig = std::str::from_utf8(&rest[..nl]).map_err(|_| bad("header is not text"))?;
        let body = &rest[nl + 1..];
        let params = if sig == "?" {
            None
        } else if sig.is_empty() {
            Some(Vec::new())
        } else {
            Some(
                sig.split(' ')
                    .map(super::signature::parse_tensor_type)
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad("unreadable parameter types"))?,
            )
        };
        let lib = self.lib();
        // SAFETY: `body` outlives the call.
        let a = unsafe {
            pjrt_call!(
                lib,
                PJRT_Executable_DeserializeAndLoad {
                    client: self.raw(),
                    serialized_executable: body.as_ptr().cast(),
                    serialized_executable_size: body.len(),
                }
            )
        }?;
        Executable::wrap(self, a.loaded_executable, params, portable)
    }
}
