//! PJRT clients and their devices.

use std::ffi::c_char;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use libtpu_sys::{PJRT_Client, PJRT_Device, PJRT_NamedValue, PJRT_NamedValue_Type, PjrtLibrary};

use super::event::Event;
use super::ffi::{pjrt_call, slice_from, string_from};
use super::plugin::{
    ENV_PJRT_OPTIONS, OptionValue, find_libtpu, find_pjrt_plugin, load_plugin, parse_create_options,
};
use crate::error::{Error, Result};
use crate::memory::{MemoryCounters, MemorySource, MemoryStats};

/// One addressable device of a client, described once at client creation.
pub(crate) struct DeviceEntry {
    pub(crate) raw: *mut PJRT_Device,
    pub(crate) id: i32,
    pub(crate) local_hardware_id: i32,
    pub(crate) kind: String,
    pub(crate) debug_string: String,
    pub(crate) attributes: Vec<(String, OptionValue)>,
    /// Bytes of the buffers tpu-rs holds on this device, and the user's limit.
    pub(crate) counters: MemoryCounters,
    /// Completion events of work queued on this device and not yet known to be finished.
    pub(crate) pending: Mutex<Vec<Event>>,
}

/// What a PJRT plugin says about one of its devices.
#[derive(Clone, Debug)]
pub struct PjrtDeviceInfo {
    /// The device's global id.
    pub id: i32,
    /// The device's id among the local hardware.
    pub local_hardware_id: i32,
    /// The kind string (`cpu`, `TPU v5 lite`, `NVIDIA H200`, ...).
    pub kind: String,
    /// The plugin's debug description.
    pub debug_string: String,
    /// Further attributes the plugin reports.
    pub attributes: Vec<(String, OptionValue)>,
}

pub(crate) struct ClientInner {
    lib: &'static PjrtLibrary,
    raw: *mut PJRT_Client,
    platform_name: String,
    platform_version: String,
    is_tpu: bool,
    pub(crate) devices: Vec<DeviceEntry>,
}

// SAFETY: a PJRT client and its devices are thread-safe by the C API's contract; the raw
// pointers are owned by this value and only destroyed in `Drop`.
unsafe impl Send for ClientInner {}
// SAFETY: see `Send`.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // Pending events hold a clone of the client, so none can be left here; clear anyway so
        // nothing of the client is used after it is destroyed.
        // SAFETY: `self.raw` is live and owned by us. Buffers, executables and events hold an
        // `Arc` of this value, so none of them outlives it. Errors cannot be reported from drop.
        let _ = unsafe { pjrt_call!(self.lib, PJRT_Client_Destroy { client: self.raw }) };
    }
}

/// A PJRT client: one plugin's view of its devices. Cheap to clone and `Send + Sync`; buffers,
/// executables and events keep their client alive.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Client({} {}, {} devices, plugin {})",
            self.platform_name(),
            self.platform_version(),
            self.inner.devices.len(),
            self.lib().path().display()
        )
    }
}

impl PartialEq for Client {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for Client {}

static DEFAULT_PJRT: Mutex<Option<Client>> = Mutex::new(None);
static TPU: Mutex<Option<Client>> = Mutex::new(None);

impl Client {
    /// Creates a new client of the plugin at `path` with `options` passed through as PJRT
    /// create options (for XLA's CPU plugin, `cpu_device_count`). Each call makes a separate
    /// client; [`Client::default_pjrt`] shares one.
    pub fn create(path: impl AsRef<Path>, options: &[(String, OptionValue)]) -> Result<Client> {
        let lib = load_plugin(path.as_ref())?;
        if is_libtpu(lib.path()) {
            // libtpu contacts cloud metadata when a client is created without chips.
            libtpu_sys::detect().map_err(no_tpu)?;
        }
        Client::create_with(lib, options, is_libtpu(lib.path()))
    }

    fn create_with(
        lib: &'static PjrtLibrary,
        options: &[(String, OptionValue)],
        is_tpu: bool,
    ) -> Result<Client> {
        let named: Vec<PJRT_NamedValue> = options.iter().map(|(k, v)| named_value(k, v)).collect();
        // SAFETY: `named` and the strings and lists it points into (`options`) outlive the
        // call; no key-value callbacks are set, which single-process plugins accept.
        let args = unsafe {
            pjrt_call!(
                lib,
                PJRT_Client_Create {
                    create_options: named.as_ptr(),
                    num_options: named.len(),
                }
            )
        }?;
        let raw = args.client;
        // From here the client is owned by `ClientInner`, so early returns destroy it.
        let mut inner = ClientInner {
            lib,
            raw,
            platform_name: String::new(),
            platform_version: String::new(),
            is_tpu,
            devices: Vec::new(),
        };
        // SAFETY: `raw` is a live client; the returned string lives as long as the client.
        inner.platform_name = unsafe {
            let a = pjrt_call!(lib, PJRT_Client_PlatformName { client: raw })?;
            string_from(a.platform_name, a.platform_name_size)
        };
        // SAFETY: as above.
        inner.platform_version = unsafe {
            let a = pjrt_call!(lib, PJRT_Client_PlatformVersion { client: raw })?;
            string_from(a.platform_version, a.platform_version_size)
        };
        let raws: Vec<*mut PJRT_Device> = {
            // SAFETY: as above; the array lives as long as the client.
            unsafe {
                let a = pjrt_call!(lib, PJRT_Client_AddressableDevices { client: raw })?;
                slice_from(a.addressable_devices, a.num_addressable_devices).to_vec()
            }
        };
        for d in raws {
            inner.devices.push(describe_device(lib, d)?);
        }
        Ok(Client {
            inner: Arc::new(inner),
        })
    }

    /// The process-wide client for `pjrt` devices: the plugin named by `TPU_RS_PJRT_PLUGIN` or
    /// found in the project-local folder, created once with the options in
    /// `TPU_RS_PJRT_OPTIONS`.
    pub fn default_pjrt() -> Result<Client> {
        let mut slot = DEFAULT_PJRT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let path = find_pjrt_plugin()?;
        let options = match std::env::var(ENV_PJRT_OPTIONS) {
            Ok(v) => parse_create_options(&v)?,
            Err(_) => Vec::new(),
        };
        let client = Client::create(&path, &options)?;
        *slot = Some(client.clone());
        Ok(client)
    }

    /// The process-wide libtpu client. TPU chips are detected first; without them this fails
    /// with [`Error::NoTpuFound`] and libtpu is not asked to create a client.
    pub fn tpu() -> Result<Client> {
        let mut slot = TPU.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        libtpu_sys::detect().map_err(no_tpu)?;
        let lib = load_plugin(&find_libtpu()?)?;
        let client = Client::create_with(lib, &[], true)?;
        *slot = Some(client.clone());
        Ok(client)
    }

    pub(crate) fn lib(&self) -> &'static PjrtLibrary {
        self.inner.lib
    }

    pub(crate) fn raw(&self) -> *mut PJRT_Client {
        self.inner.raw
    }

    /// The platform, as the plugin names it (`cpu`, `tpu`, `cuda`).
    pub fn platform_name(&self) -> &str {
        &self.inner.platform_name
    }

    /// The platform's version string.
    pub fn platform_version(&self) -> &str {
        &self.inner.platform_version
    }

    /// The plugin file.
    pub fn plugin_path(&self) -> PathBuf {
        self.lib().path().to_path_buf()
    }

    /// The PJRT C API version the plugin implements.
    pub fn api_version(&self) -> (i32, i32) {
        self.lib().version()
    }

    /// True for libtpu clients (their devices are named `tpu:N`).
    pub fn is_tpu(&self) -> bool {
        self.inner.is_tpu
    }

    /// Number of addressable devices.
    pub fn device_count(&self) -> usize {
        self.inner.devices.len()
    }

    /// Every addressable device.
    pub fn devices(&self) -> Vec<crate::Device> {
        (0..self.device_count())
            .map(|i| crate::Device::from_pjrt(self.clone(), i))
            .collect()
    }

    /// Addressable device `index`.
    pub fn device(&self, index: usize) -> Result<crate::Device> {
        if index >= self.device_count() {
            return Err(Error::DeviceUnavailable {
                device: format!("{}:{index}", self.device_prefix()),
                reason: format!(
                    "the {} plugin has {} addressable devices (indices 0 to {})",
                    self.platform_name(),
                    self.device_count(),
                    self.device_count() as i64 - 1
                ),
            });
        }
        Ok(crate::Device::from_pjrt(self.clone(), index))
    }

    pub(crate) fn device_prefix(&self) -> &'static str {
        if self.is_tpu() { "tpu" } else { "pjrt" }
    }

    /// What the plugin says about device `index`.
    pub fn device_info(&self, index: usize) -> Option<PjrtDeviceInfo> {
        self.inner.devices.get(index).map(|d| PjrtDeviceInfo {
            id: d.id,
            local_hardware_id: d.local_hardware_id,
            kind: d.kind.clone(),
            debug_string: d.debug_string.clone(),
            attributes: d.attributes.clone(),
        })
    }

    pub(crate) fn entry(&self, index: usize) -> &DeviceEntry {
        &self.inner.devices[index]
    }

    pub(crate) fn index_of_raw(&self, raw: *mut PJRT_Device) -> Option<usize> {
        self.inner.devices.iter().position(|d| d.raw == raw)
    }

    /// Memory figures of device `index`: the plugin's own when it reports them, otherwise the
    /// bytes of the buffers tpu-rs holds there (see [`MemoryStats::source`]).
    pub(crate) fn memory_stats(&self, index: usize) -> MemoryStats {
        let entry = self.entry(index);
        let mut tracked = entry.counters.snapshot();
        tracked.source = MemorySource::TrackedBuffers;
        // SAFETY: `entry.raw` is a live device of this client.
        let r = unsafe { pjrt_call!(self.lib(), PJRT_Device_MemoryStats { device: entry.raw }) };
        match r {
            Ok(a) => MemoryStats {
                bytes_in_use: a.bytes_in_use.max(0) as usize,
                peak_bytes_in_use: if a.peak_bytes_in_use_is_set {
                    a.peak_bytes_in_use.max(0) as usize
                } else {
                    tracked.peak_bytes_in_use
                },
                live_allocations: tracked.live_allocations,
                total_allocations: if a.num_allocs_is_set {
                    a.num_allocs.max(0) as u64
                } else {
                    tracked.total_allocations
                },
                bytes_limit: if a.bytes_limit_is_set {
                    Some(a.bytes_limit.max(0) as usize)
                } else {
                    tracked.bytes_limit
                },
                bytes_cached: 0,
                source: MemorySource::Plugin,
            },
            Err(_) => tracked,
        }
    }

    /// Checks, allocating nothing, that `bytes` more could be allocated on device `index` now:
    /// the user's limit, the plugin's limit where it reports one, and host memory when the
    /// plugin's devices are the host's CPUs.
    pub(crate) fn check_alloc(&self, index: usize, bytes: usize) -> Result<()> {
        // Formatted only for an error: this runs before every eager op.
        struct Name<'a>(&'a str, usize);
        impl std::fmt::Display for Name<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}:{}", self.0, self.1)
            }
        }
        let name = Name(self.device_prefix(), index);
        let entry = self.entry(index);
        entry.counters.check(bytes, &name)?;
        // Asking the plugin is a call through the C API (an error object where it keeps no
        // figures): only worth it for requests that could matter.
        if bytes >= crate::memory::HOST_CHECK_MIN_BYTES {
            let stats = self.memory_stats(index);
            if stats.source == MemorySource::Plugin
                && let Some(limit) = stats.bytes_limit
                && stats
                    .bytes_in_use
                    .checked_add(bytes)
                    .is_none_or(|a| a > limit)
            {
                return Err(Error::OutOfMemory {
                    device: name.to_string(),
                    requested: bytes,
                    what: String::new(),
                    in_use: stats.bytes_in_use,
                    limit: Some(limit),
                });
            }
        }
        if self.platform_name().eq_ignore_ascii_case("cpu") {
            crate::memory::check_host_memory(bytes, String::new)?;
        }
        Ok(())
    }

    /// Waits for all work queued on device `index`; returns the first failure among it.
    pub(crate) fn synchronize(&self, index: usize) -> Result<()> {
        let events: Vec<Event> = std::mem::take(
            &mut *self
                .entry(index)
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let mut first = Ok(());
        for e in events {
            let r = e.wait();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Remembers an event of work queued on device `index`, dropping finished ones.
    pub(crate) fn track(&self, index: usize, event: Event) {
        let mut pending = self
            .entry(index)
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Keep failed events until synchronize reports them.
        pending.retain(|e| !matches!(e.is_ready(), Ok(true)) || e.outcome().is_err());
        pending.push(event);
    }
}

fn no_tpu(e: libtpu_sys::NoTpuFound) -> Error {
    let text = e.to_string();
    let looked_at = text.strip_prefix("no TPU found: ").unwrap_or(&text);
    Error::NoTpuFound {
        looked_at: format!("{looked_at}; so no libtpu client was created"),
    }
}

fn is_libtpu(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("libtpu"))
}

fn named_value(key: &str, value: &OptionValue) -> PJRT_NamedValue {
    match value {
        OptionValue::Str(s) => PJRT_NamedValue::new_string(key, s),
        OptionValue::Int(i) => PJRT_NamedValue::new_int64(key, *i),
        OptionValue::IntList(l) => PJRT_NamedValue::new_int64_list(key, l),
        OptionValue::Float(f) => PJRT_NamedValue::new_float(key, *f),
        OptionValue::Bool(b) => PJRT_NamedValue::new_bool(key, *b),
    }
}

/// Reads a plugin's named values into owned data.
///
/// # Safety
///
/// `values` must be null or point to `n` named values whose strings and lists are readable.
unsafe fn read_named_values(
    values: *const PJRT_NamedValue,
    n: usize,
) -> Vec<(String, OptionValue)> {
    // SAFETY: caller contract.
    let values = unsafe { slice_from(values, n) };
    values
        .iter()
        .map(|v| {
            // SAFETY: the name is `name_size` bytes; the union member read is the one `type_`
            // says is set, and list/string members point to `value_size` items.
            unsafe {
                let name = string_from(v.name, v.name_size);
                let value = match v.type_ {
                    PJRT_NamedValue_Type::STRING => {
                        OptionValue::Str(string_from(v.value.string_value, v.value_size))
                    }
                    PJRT_NamedValue_Type::INT64 => OptionValue::Int(v.value.int64_value),
                    PJRT_NamedValue_Type::INT64_LIST => OptionValue::IntList(
                        slice_from(v.value.int64_array_value, v.value_size).to_vec(),
                    ),
                    PJRT_NamedValue_Type::FLOAT => OptionValue::Float(v.value.float_value),
                    PJRT_NamedValue_Type::BOOL => OptionValue::Bool(v.value.bool_value),
                    other => OptionValue::Str(format!("<value of unknown type {}>", other.0)),
                };
                (name, value)
            }
        })
        .collect()
}

fn describe_device(lib: &'static PjrtLibrary, raw: *mut PJRT_Device) -> Result<DeviceEntry> {
    // SAFETY: `raw` is a live device of a live client; the description lives as long.
    let g = unsafe { pjrt_call!(lib, PJRT_Device_GetDescription { device: raw }) }?;
    let device_description = g.device_description;
    // SAFETY: `device_description` is a live description.
    let id = unsafe { pjrt_call!(lib, PJRT_DeviceDescription_Id { device_description }) }?;
    // SAFETY: as above; the string lives as long as the description.
    let kind = unsafe {
        let kind = pjrt_call!(lib, PJRT_DeviceDescription_Kind { device_description })?;
        string_from(kind.device_kind as *const c_char, kind.device_kind_size)
    };
    // SAFETY: as above.
    let debug_string = unsafe {
        let dbg = pjrt_call!(
            lib,
            PJRT_DeviceDescription_DebugString { device_description }
        )?;
        string_from(dbg.debug_string, dbg.debug_string_size)
    };
    // SAFETY: as above; the values live as long as the description.
    let attributes = unsafe {
        let attrs = pjrt_call!(
            lib,
            PJRT_DeviceDescription_Attributes { device_description }
        )?;
        read_named_values(attrs.attributes, attrs.num_attributes)
    };
    // SAFETY: `raw` is live.
    let hw = unsafe { pjrt_call!(lib, PJRT_Device_LocalHardwareId { device: raw }) }?;
    Ok(DeviceEntry {
        raw,
        id: id.id,
        local_hardware_id: hw.local_hardware_id,
        kind,
        debug_string,
        attributes,
        counters: MemoryCounters::new(None),
        pending: Mutex::new(Vec::new()),
    })
}
