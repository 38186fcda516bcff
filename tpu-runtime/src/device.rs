//! Device handles.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::cpu::{CpuDevice, CpuOptions};
use crate::error::{Error, Result};
use crate::memory::MemoryStats;
use crate::pjrt::Client;

/// The spellings [`Device::parse`] accepts, for error messages.
pub const ACCEPTED_DEVICES: &str = "\"cpu\", \"cpu:0\", \"tpu\", \"tpu:N\", \"pjrt\", \"pjrt:N\" (N a device index, e.g. \"tpu:1\")";

/// What kind of device a handle points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// The native CPU device: tpu-rs's own kernels on host memory.
    Cpu,
    /// A device of a PJRT plugin (a TPU through libtpu, XLA's CPU plugin, a GPU, ...).
    Pjrt,
}

/// A device: cheap to clone, `Send + Sync`, compared by identity.
#[derive(Clone)]
pub struct Device {
    repr: Repr,
}

#[derive(Clone)]
enum Repr {
    Cpu(Arc<CpuDevice>),
    Pjrt { client: Client, index: usize },
}

impl Device {
    /// The native CPU device (configured from `TPU_RS_NUM_THREADS` and `TPU_RS_CPU_MEMORY_LIMIT`).
    pub fn cpu() -> Device {
        Device {
            repr: Repr::Cpu(Arc::clone(CpuDevice::default_device())),
        }
    }

    /// A new native CPU device with its own memory accounting, limit and thread pool, separate
    /// from [`Device::cpu`]. Useful to give one part of a program its own memory budget.
    pub fn new_cpu(options: &CpuOptions) -> Result<Device> {
        Ok(Device {
            repr: Repr::Cpu(Arc::new(CpuDevice::with_options(options)?)),
        })
    }

    /// Wraps a native CPU device.
    pub fn from_cpu(cpu: Arc<CpuDevice>) -> Device {
        Device {
            repr: Repr::Cpu(cpu),
        }
    }

    /// Device `index` of a PJRT client.
    pub(crate) fn from_pjrt(client: Client, index: usize) -> Device {
        Device {
            repr: Repr::Pjrt { client, index },
        }
    }

    /// Parses a device the way a user types it: `cpu`, `cpu:0`, `tpu`, `tpu:N`, `pjrt`, `pjrt:N`.
    pub fn parse(spec: &str) -> Result<Device> {
        let unknown = || Error::UnknownDevice {
            given: spec.to_string(),
            accepted: ACCEPTED_DEVICES,
        };
        let s = spec.trim().to_ascii_lowercase();
        let (kind, index) = match s.split_once(':') {
            None => (s.as_str(), None),
            Some((k, i)) => (k, Some(i.parse::<usize>().map_err(|_| unknown())?)),
        };
        match (kind, index) {
            ("cpu", None | Some(0)) => Ok(Device::cpu()),
            ("pjrt", i) => Client::default_pjrt()?.device(i.unwrap_or(0)),
            // TPU chips are detected before libtpu is asked for a client.
            ("tpu", i) => Client::tpu()?.device(i.unwrap_or(0)),
            _ => Err(unknown()),
        }
    }

    /// The kind of device.
    pub fn kind(&self) -> DeviceKind {
        match &self.repr {
            Repr::Cpu(_) => DeviceKind::Cpu,
            Repr::Pjrt { .. } => DeviceKind::Pjrt,
        }
    }

    /// True for native CPU devices.
    pub fn is_cpu(&self) -> bool {
        self.kind() == DeviceKind::Cpu
    }

    /// The native CPU device behind this handle, if it is one.
    pub fn as_cpu(&self) -> Option<&Arc<CpuDevice>> {
        match &self.repr {
            Repr::Cpu(c) => Some(c),
            Repr::Pjrt { .. } => None,
        }
    }

    /// The PJRT client and device index behind this handle, if it is a PJRT device.
    pub fn as_pjrt(&self) -> Option<(&Client, usize)> {
        match &self.repr {
            Repr::Cpu(_) => None,
            Repr::Pjrt { client, index } => Some((client, *index)),
        }
    }

    /// The platform: `native` for the native CPU device, else the PJRT plugin's platform name
    /// (`cpu`, `tpu`, `cuda`, ...).
    pub fn platform(&self) -> String {
        match &self.repr {
            Repr::Cpu(_) => "native".to_string(),
            Repr::Pjrt { client, .. } => client.platform_name().to_string(),
        }
    }

    /// The device kind as its platform describes it (for PJRT devices, the plugin's kind
    /// string such as `cpu` or `TPU v5 lite`).
    pub fn description(&self) -> String {
        match &self.repr {
            Repr::Cpu(c) => format!("native CPU device, {} threads", c.num_threads()),
            Repr::Pjrt { client, index } => client.entry(*index).kind.clone(),
        }
    }

    /// The name users see and [`Device::parse`] reads back: `cpu`, `pjrt:0`, `tpu:1`.
    pub fn name(&self) -> String {
        match &self.repr {
            Repr::Cpu(c) => c.name(),
            Repr::Pjrt { client, index } => format!("{}:{index}", client.device_prefix()),
        }
    }

    /// Current memory figures.
    pub fn memory_stats(&self) -> Result<MemoryStats> {
        match &self.repr {
            Repr::Cpu(c) => Ok(c.memory_stats()),
            Repr::Pjrt { client, index } => Ok(client.memory_stats(*index)),
        }
    }

    /// Checks, allocating nothing, that `bytes` more could be allocated on this device now: its
    /// memory limit, the plugin's own limit where it reports one, and the host memory the system
    /// can still provide where the device's memory is host memory. For work that allocates only
    /// after it has started (an execution's outputs, a host copy staged for an upload). `what`
    /// names the use (an op, a dtype and shape) and is only called for an error.
    pub fn check_alloc(&self, bytes: usize, what: impl Fn() -> String) -> Result<()> {
        let r = match &self.repr {
            Repr::Cpu(c) => c.check_alloc(bytes),
            Repr::Pjrt { client, index } => client.check_alloc(*index, bytes),
        };
        r.map_err(|e| e.for_allocation(what))
    }

    /// Makes the peak figure equal to the bytes in use now.
    pub fn reset_peak(&self) -> Result<()> {
        match &self.repr {
            Repr::Cpu(c) => {
                c.reset_peak();
                Ok(())
            }
            Repr::Pjrt { client, index } => {
                client.entry(*index).counters.reset_peak();
                Ok(())
            }
        }
    }

    /// Sets (or with `None` clears) the device's memory limit in bytes. On PJRT devices the
    /// limit applies to the buffers tpu-rs uploads, checked before the plugin is called.
    pub fn set_memory_limit(&self, limit: Option<usize>) -> Result<()> {
        match &self.repr {
            Repr::Cpu(c) => {
                c.set_memory_limit(limit);
                Ok(())
            }
            Repr::Pjrt { client, index } => {
                client.entry(*index).counters.set_limit(limit);
                Ok(())
            }
        }
    }

    /// Returns memory held for reuse to the system (freed buffers the CPU device caches).
    pub fn empty_cache(&self) {
        if let Repr::Cpu(c) = &self.repr {
            c.empty_cache();
        }
    }

    /// Waits until all work queued on the device has finished.
    pub fn synchronize(&self) -> Result<()> {
        match &self.repr {
            // CPU kernels run to completion before returning.
            Repr::Cpu(_) => Ok(()),
            Repr::Pjrt { client, index } => client.synchronize(*index),
        }
    }

    /// Identity key: two handles are equal when they point at the same device.
    fn key(&self) -> (usize, usize) {
        match &self.repr {
            Repr::Cpu(c) => (Arc::as_ptr(c) as usize, usize::MAX),
            Repr::Pjrt { client, index } => (Arc::as_ptr(&client.inner) as usize, *index),
        }
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Device {}

impl Hash for Device {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.name())
    }
}

impl Default for Device {
    fn default() -> Self {
        Device::cpu()
    }
}

impl std::str::FromStr for Device {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Device::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_cpu_spellings() {
        assert_eq!(Device::parse("cpu").unwrap(), Device::cpu());
        assert_eq!(Device::parse(" CPU:0 ").unwrap(), Device::cpu());
        for bad in ["gpu", "cpu:x", "cpu:1", "", "tpu:-1"] {
            let e = Device::parse(bad).unwrap_err().to_string();
            assert!(e.contains("\"tpu:N\""), "{bad}: {e}");
        }
    }

    #[test]
    fn separate_cpu_devices_differ() {
        let a = Device::new_cpu(&CpuOptions::default()).unwrap();
        assert_ne!(a, Device::cpu());
        assert_eq!(a, a.clone());
        assert!(a.name().starts_with("cpu:"));
    }

    #[test]
    fn device_is_send_sync() {
        fn check<T: Send + Sync + Clone>() {}
        check::<Device>();
    }
}
