//! Arrays in PJRT device memory, and transfers to and from the host.

use std::fmt;

use libtpu_sys::{PJRT_Buffer, PJRT_Buffer_Type, PJRT_HostBufferSemantics};

use super::client::Client;
use super::event::Event;
use super::ffi::{pjrt_call, slice_from};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The PJRT element type of a dtype.
pub fn to_pjrt_type(dtype: DType) -> PJRT_Buffer_Type {
    match dtype {
        DType::Bool => PJRT_Buffer_Type::PRED,
        DType::U8 => PJRT_Buffer_Type::U8,
        DType::I8 => PJRT_Buffer_Type::S8,
        DType::I32 => PJRT_Buffer_Type::S32,
        DType::I64 => PJRT_Buffer_Type::S64,
        DType::F16 => PJRT_Buffer_Type::F16,
        DType::BF16 => PJRT_Buffer_Type::BF16,
        DType::F32 => PJRT_Buffer_Type::F32,
        DType::F64 => PJRT_Buffer_Type::F64,
    }
}

/// The dtype of a PJRT element type, if tpu-rs has one.
pub fn from_pjrt_type(t: PJRT_Buffer_Type) -> Option<DType> {
    Some(match t {
        PJRT_Buffer_Type::PRED => DType::Bool,
        PJRT_Buffer_Type::U8 => DType::U8,
        PJRT_Buffer_Type::S8 => DType::I8,
        PJRT_Buffer_Type::S32 => DType::I32,
        PJRT_Buffer_Type::S64 => DType::I64,
        PJRT_Buffer_Type::F16 => DType::F16,
        PJRT_Buffer_Type::BF16 => DType::BF16,
        PJRT_Buffer_Type::F32 => DType::F32,
        PJRT_Buffer_Type::F64 => DType::F64,
        _ => return None,
    })
}

/// An array on one PJRT device. Dropping it destroys the PJRT buffer exactly once; it keeps
/// its client alive.
pub struct PjrtBuffer {
    raw: *mut PJRT_Buffer,
    client: Client,
    device: usize,
    dtype: DType,
    dims: Vec<usize>,
    /// Bytes counted in the device's tracked memory figures.
    accounted: usize,
}

// SAFETY: PJRT buffers may be used from any thread; the raw pointer is owned by this value.
unsafe impl Send for PjrtBuffer {}
// SAFETY: shared access only calls thread-safe entries (reads, copies, executions).
unsafe impl Sync for PjrtBuffer {}

impl fmt::Debug for PjrtBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PjrtBuffer({}{:?} on {}:{})",
            self.dtype,
            self.dims,
            self.client.device_prefix(),
            self.device
        )
    }
}

fn byte_size(dtype: DType, dims: &[usize]) -> Option<usize> {
    dims.iter()
        .try_fold(dtype.size_in_bytes(), |a, &d| a.checked_mul(d))
}

impl PjrtBuffer {
    /// Uploads dense row-major `bytes` to device `device` of `client`. Sizes are checked, and
    /// the device's memory limit applied, before PJRT is called.
    pub fn from_host(
        client: &Client,
        device: usize,
        dtype: DType,
        dims: &[usize],
        bytes: &[u8],
    ) -> Result<PjrtBuffer> {
        let name = || format!("{}:{device}", client.device_prefix());
        if device >= client.device_count() {
            return Err(Error::DeviceUnavailable {
                device: name(),
                reason: format!("the client has {} devices", client.device_count()),
            });
        }
        let want = byte_size(dtype, dims)
            .ok_or_else(|| Error::shape("upload", format!("dims {dims:?} of {dtype} overflow")))?;
        // PJRT takes dims as i64: a larger one (possible beside a 0) must not turn negative.
        if dims.iter().any(|&d| i64::try_from(d).is_err()) {
            return Err(Error::shape(
                "upload",
                format!(
                    "dims {dims:?} of {dtype}: PJRT takes sizes up to {}",
                    i64::MAX
                ),
            ));
        }
        if bytes.len() != want {
            return Err(Error::LengthMismatch {
                context: format!("uploading {dtype}{dims:?} to {}", name()),
                unit: "bytes",
                expected: want,
                given: bytes.len(),
            });
        }
        if dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
            return Err(Error::InvalidData {
                context: format!("uploading bool{dims:?} to {}", name()),
                reason: "bools must be 0 or 1".into(),
            });
        }
        let entry = client.entry(device);
        entry.counters.reserve(want, &name())?;
        let dims_i64: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        // SAFETY: `bytes` and `dims_i64` outlive the call; the semantics mean the plugin does
        // not keep the host pointer after returning; `entry.raw` belongs to this client.
        let r = unsafe {
            pjrt_call!(
                client.lib(),
                PJRT_Client_BufferFromHostBuffer {
                    client: client.raw(),
                    data: bytes.as_ptr().cast(),
                    type_: to_pjrt_type(dtype),
                    dims: dims_i64.as_ptr(),
                    num_dims: dims_i64.len(),
                    // The plugin copies the bytes before returning, so the caller's slice may
                    // go at once.
                    host_buffer_semantics: PJRT_HostBufferSemantics::IMMUTABLE_ONLY_DURING_CALL,
                    device: entry.raw,
                }
            )
        };
        let a = r.inspect_err(|_| entry.counters.unreserve_failed(want))?;
        if !a.done_with_host_buffer.is_null() {
            // SAFETY: a fresh event owned by us; dropped (destroyed) right after waiting.
            let done =
                unsafe { Event::from_raw(a.done_with_host_buffer, client.clone(), "upload") };
            done.wait()?;
        }
        Ok(PjrtBuffer {
            raw: a.buffer,
            client: client.clone(),
            device,
            dtype,
            dims: dims.to_vec(),
            accounted: want,
        })
    }

    /// Wraps a buffer an execution or copy produced, reading its dtype and dims.
    ///
    /// # Safety
    ///
    /// `raw` must be a live buffer of `client` that nobody else destroys.
    pub(crate) unsafe fn from_raw(
        raw: *mut PJRT_Buffer,
        client: &Client,
        device: usize,
    ) -> Result<PjrtBuffer> {
        let lib = client.lib();
        // Own it first, so that an error below still destroys it.
        let mut buf = PjrtBuffer {
            raw,
            client: client.clone(),
            device,
            dtype: DType::U8,
            dims: Vec::new(),
            accounted: 0,
        };
        // SAFETY: `raw` is live.
        let t = unsafe { pjrt_call!(lib, PJRT_Buffer_ElementType { buffer: raw }) }?;
        buf.dtype = from_pjrt_type(t.type_).ok_or_else(|| Error::UnsupportedDType {
            op: "reading a PJRT buffer".into(),
            given: format!("{:?}", t.type_),
            supported: "PRED, U8, S8, S32, S64, F16, BF16, F32, F64".into(),
        })?;
        // SAFETY: `raw` is live; the dims array lives as long as the buffer.
        unsafe {
            let d = pjrt_call!(lib, PJRT_Buffer_Dimensions { buffer: raw })?;
            buf.dims = slice_from(d.dims, d.num_dims)
                .iter()
                .map(|&v| v.max(0) as usize)
                .collect();
        }
        let bytes = byte_size(buf.dtype, &buf.dims).unwrap_or(0);
        // Outputs already exist on the device: count them even past the limit.
        client.entry(device).counters.reserve_unchecked(bytes);
        buf.accounted = bytes;
        Ok(buf)
    }

    pub(crate) fn raw(&self) -> *mut PJRT_Buffer {
        self.raw
    }

    /// The client holding the buffer.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Index of the device among the client's addressable devices.
    pub fn device_index(&self) -> usize {
        self.device
    }

    /// The device holding the buffer.
    pub fn device(&self) -> crate::Device {
        crate::Device::from_pjrt(self.client.clone(), self.device)
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Size of the data in bytes.
    pub fn size_in_bytes(&self) -> usize {
        byte_size(self.dtype, &self.dims).unwrap_or(0)
    }

    /// Bytes the buffer takes on the device (may include padding).
    pub fn on_device_size(&self) -> Result<usize> {
        let lib = self.client.lib();
        // SAFETY: `self.raw` is live.
        let a = unsafe { pjrt_call!(lib, PJRT_Buffer_OnDeviceSizeInBytes { buffer: self.raw }) }?;
        Ok(a.on_device_size_in_bytes)
    }

    /// An event that completes when the buffer's contents are ready.
    pub fn ready_event(&self) -> Result<Event> {
        let lib = self.client.lib();
        // SAFETY: `self.raw` is live; the event returned is ours to destroy.
        unsafe {
            let a = pjrt_call!(lib, PJRT_Buffer_ReadyEvent { buffer: self.raw })?;
            Ok(Event::from_raw(a.event, self.client.clone(), "execute"))
        }
    }

    /// Blocks until the contents are ready; reports the failure of the work that produced them.
    pub fn wait_ready(&self) -> Result<()> {
        self.ready_event()?.wait()
    }

    /// Copies the contents into `dst` (dense row-major), waiting for the transfer.
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        let want = self.size_in_bytes();
        if dst.len() != want {
            return Err(Error::LengthMismatch {
                context: format!("downloading {}{:?}", self.dtype, self.dims),
                unit: "bytes",
                expected: want,
                given: dst.len(),
            });
        }
        let lib = self.client.lib();
        // Ask the plugin for the size it will write first, so a mismatch is an error here
        // rather than a write past `dst`.
        // SAFETY: with `dst` null the plugin only reports the size it needs.
        let probe = unsafe { pjrt_call!(lib, PJRT_Buffer_ToHostBuffer { src: self.raw }) }?;
        if probe.dst_size != want {
            return Err(Error::InvalidData {
                context: format!("downloading {}{:?}", self.dtype, self.dims),
                reason: format!(
                    "the plugin reports {} bytes for a host copy, expected {want}",
                    probe.dst_size
                ),
            });
        }
        if want == 0 {
            return Ok(());
        }
        // SAFETY: `dst` has `dst_size` writable bytes and is not touched until the event below
        // has completed (we wait for it before returning).
        unsafe {
            let a = pjrt_call!(
                lib,
                PJRT_Buffer_ToHostBuffer {
                    src: self.raw,
                    dst: dst.as_mut_ptr().cast(),
                    dst_size: dst.len(),
                }
            )?;
            if !a.event.is_null() {
                Event::from_raw(a.event, self.client.clone(), "transfer to host").wait()?;
            }
        }
        Ok(())
    }

    /// The contents as dense row-major bytes in host memory (checked against the host memory
    /// the system can provide, and allocated fallibly).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let mut out = crate::memory::try_host_vec(self.size_in_bytes(), 0u8, || {
            format!("a host copy of {}{:?}", self.dtype, self.dims)
        })?;
        self.copy_to_host(&mut out)?;
        Ok(out)
    }

    /// Copies the buffer to another device of the same client, on the devices themselves.
    pub fn copy_to_device(&self, device: usize) -> Result<PjrtBuffer> {
        if device >= self.client.device_count() {
            return Err(Error::DeviceUnavailable {
                device: format!("{}:{device}", self.client.device_prefix()),
                reason: format!("the client has {} devices", self.client.device_count()),
            });
        }
        let lib = self.client.lib();
        // SAFETY: both the buffer and the destination device belong to this live client.
        unsafe {
            let a = pjrt_call!(
                lib,
                PJRT_Buffer_CopyToDevice {
                    buffer: self.raw,
                    dst_device: self.client.entry(device).raw,
                }
            )?;
            PjrtBuffer::from_raw(a.dst_buffer, &self.client, device)
        }
    }
}

impl Drop for PjrtBuffer {
    fn drop(&mut self) {
        let lib = self.client.lib();
        // SAFETY: `self.raw` is owned by us and destroyed exactly once, here; PJRT defers the
        // release of memory still used by queued work.
        let _ = unsafe { pjrt_call!(lib, PJRT_Buffer_Destroy { buffer: self.raw }) };
        self.client
            .entry(self.device)
            .counters
            .release(self.accounted);
    }
}
