//! Device memory holding one array: bytes plus the dtype and dims they represent.

use std::fmt;

use crate::cpu::{CpuBuffer, CpuDevice};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// An array's memory on one device.
///
/// On the CPU it is plain host memory that kernels read and write in place; on PJRT devices it is
/// an opaque device buffer reached through transfers and executables.
pub enum Buffer {
    /// Host memory of a native CPU device.
    Cpu {
        /// The bytes.
        data: CpuBuffer,
        /// Element type.
        dtype: DType,
        /// Dimensions the bytes were created with (row-major, dense).
        dims: Vec<usize>,
    },
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Buffer({}{:?} on {})",
            self.dtype(),
            self.dims(),
            self.device()
        )
    }
}

fn byte_len(dtype: DType, dims: &[usize], op: &str) -> Result<usize> {
    dims.iter()
        .try_fold(dtype.size_in_bytes(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            Error::shape(
                op,
                format!(
                    "{} elements of dims {dims:?} overflow the address space",
                    dtype
                ),
            )
        })
}

impl Buffer {
    /// Allocates a zero-filled buffer on `device`.
    pub fn zeroed(device: &Device, dtype: DType, dims: &[usize]) -> Result<Buffer> {
        let bytes = byte_len(dtype, dims, "allocate")?;
        match device.as_cpu() {
            Some(cpu) => Ok(Buffer::Cpu {
                data: CpuDevice::alloc_zeroed(cpu, bytes)?,
                dtype,
                dims: dims.to_vec(),
            }),
            None => unreachable_device(device),
        }
    }

    /// Copies host bytes (row-major, dense) into a new buffer on `device`. The byte count is
    /// checked against dtype and dims before anything is allocated.
    pub fn from_bytes(
        device: &Device,
        dtype: DType,
        dims: &[usize],
        bytes: &[u8],
    ) -> Result<Buffer> {
        let want = byte_len(dtype, dims, "upload")?;
        if bytes.len() != want {
            return Err(Error::LengthMismatch {
                context: format!("uploading {dtype}{dims:?} to {device}"),
                unit: "bytes",
                expected: want,
                given: bytes.len(),
            });
        }
        let mut buf = Buffer::zeroed(device, dtype, dims)?;
        match &mut buf {
            Buffer::Cpu { data, .. } => data.as_bytes_mut().copy_from_slice(bytes),
        }
        Ok(buf)
    }

    /// The device holding the buffer.
    pub fn device(&self) -> Device {
        match self {
            Buffer::Cpu { data, .. } => Device::from_cpu(data.device().clone()),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::Cpu { dtype, .. } => *dtype,
        }
    }

    /// Dimensions.
    pub fn dims(&self) -> &[usize] {
        match self {
            Buffer::Cpu { dims, .. } => dims,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims().iter().product()
    }

    /// Size in bytes of the data (not of any padding the device adds).
    pub fn size_in_bytes(&self) -> usize {
        self.numel() * self.dtype().size_in_bytes()
    }

    /// The host bytes, when the buffer lives in host memory.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        match self {
            Buffer::Cpu { data, .. } => Some(data.as_bytes()),
        }
    }

    /// The host bytes, writable, when the buffer lives in host memory.
    pub fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            Buffer::Cpu { data, .. } => Some(data.as_bytes_mut()),
        }
    }

    /// The CPU buffer behind this buffer, if it is one.
    pub fn as_cpu(&self) -> Option<&CpuBuffer> {
        match self {
            Buffer::Cpu { data, .. } => Some(data),
        }
    }

    /// The CPU buffer behind this buffer, writable, if it is one.
    pub fn as_cpu_mut(&mut self) -> Option<&mut CpuBuffer> {
        match self {
            Buffer::Cpu { data, .. } => Some(data),
        }
    }

    /// Copies the contents to host memory as dense row-major bytes.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        match self {
            Buffer::Cpu { data, .. } => Ok(data.as_bytes().to_vec()),
        }
    }

    /// Copies the buffer to `device` (a plain copy when both are CPU devices).
    pub fn copy_to(&self, device: &Device) -> Result<Buffer> {
        let bytes = self.to_host()?;
        Buffer::from_bytes(device, self.dtype(), self.dims(), &bytes)
    }
}

fn unreachable_device<T>(device: &Device) -> Result<T> {
    Err(Error::DeviceUnavailable {
        device: device.name(),
        reason: "no memory backend for this device kind".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::as_bytes;

    #[test]
    fn upload_checks_length_and_round_trips() {
        let d = Device::cpu();
        let v = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = Buffer::from_bytes(&d, DType::F32, &[2, 3], as_bytes(&v)).unwrap();
        assert_eq!(b.to_host().unwrap(), as_bytes(&v));
        assert_eq!((b.numel(), b.size_in_bytes()), (6, 24));
        let e = Buffer::from_bytes(&d, DType::F32, &[2, 2], as_bytes(&v)).unwrap_err();
        assert!(e.to_string().contains("expected 16 bytes, got 24"), "{e}");
        let e = Buffer::zeroed(&d, DType::F64, &[usize::MAX, 2]).unwrap_err();
        assert!(e.to_string().contains("overflow"), "{e}");
    }
}
