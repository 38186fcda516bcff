//! Device memory holding one array: bytes plus the dtype and dims they represent.

use std::fmt;

use crate::cpu::{CpuBuffer, CpuDevice};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result, fmt_shape};
use crate::memory::try_host_vec;
use crate::pjrt::PjrtBuffer;

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
        /// Dimensions the bytes were created with (row-major, dense); inline up to rank 6, so
        /// a buffer costs no allocation besides its bytes.
        dims: smallvec::SmallVec<[usize; 6]>,
    },
    /// Memory of a PJRT device.
    Pjrt(PjrtBuffer),
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

/// `f32[2, 3]`: how allocation errors name what was asked for.
pub fn describe(dtype: DType, dims: &[usize]) -> String {
    format!("{dtype}{}", fmt_shape(dims))
}

/// A zero-filled host copy of `bytes` bytes to upload to `device` as `dtype[dims]`: the device
/// is asked first whether the upload could fit, and the host memory is checked and allocated
/// fallibly, so a size too large for either is an error before anything is allocated.
pub fn staging_bytes(
    device: &Device,
    dtype: DType,
    dims: &[usize],
    bytes: usize,
) -> Result<Vec<u8>> {
    let what = || format!("{} for {device}", describe(dtype, dims));
    device.check_alloc(bytes, what)?;
    try_host_vec(bytes, 0u8, || {
        format!("staging {} for {device}", describe(dtype, dims))
    })
}

impl Buffer {
    /// Allocates a zero-filled buffer on `device`.
    pub fn zeroed(device: &Device, dtype: DType, dims: &[usize]) -> Result<Buffer> {
        let bytes = byte_len(dtype, dims, "allocate")?;
        match device.as_cpu() {
            Some(cpu) => Buffer::new_cpu(CpuDevice::alloc_zeroed(cpu, bytes), dtype, dims),
            None => {
                let bytes = staging_bytes(device, dtype, dims, bytes)?;
                Buffer::from_bytes(device, dtype, dims, &bytes)
            }
        }
    }

    /// Allocates a buffer on `device` whose contents are unspecified (old values of reused
    /// memory, never uninitialised): for outputs that are overwritten entirely. Elsewhere than on
    /// the CPU it is zero-filled.
    #[inline]
    pub fn for_overwrite(device: &Device, dtype: DType, dims: &[usize]) -> Result<Buffer> {
        let bytes = byte_len(dtype, dims, "allocate")?;
        match device.as_cpu() {
            Some(cpu) => Buffer::new_cpu(CpuDevice::alloc_for_overwrite(cpu, bytes), dtype, dims),
            None => Buffer::zeroed(device, dtype, dims),
        }
    }

    /// Wraps a fresh CPU allocation for `dtype[dims]`; a failure names the tensor.
    #[inline]
    fn new_cpu(data: Result<CpuBuffer>, dtype: DType, dims: &[usize]) -> Result<Buffer> {
        Ok(Buffer::Cpu {
            data: data.map_err(|e| e.for_allocation(|| describe(dtype, dims)))?,
            dtype,
            dims: dims.into(),
        })
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
        if let Some((client, index)) = device.as_pjrt() {
            return PjrtBuffer::from_host(client, index, dtype, dims, bytes)
                .map(Buffer::Pjrt)
                .map_err(|e| e.for_allocation(|| describe(dtype, dims)));
        }
        let mut buf = Buffer::zeroed(device, dtype, dims)?;
        if let Some(data) = buf.host_bytes_mut() {
            data.copy_from_slice(bytes);
        }
        Ok(buf)
    }

    /// The device holding the buffer.
    #[inline]
    pub fn device(&self) -> Device {
        match self {
            Buffer::Cpu { data, .. } => Device::from_cpu(data.device().clone()),
            Buffer::Pjrt(b) => b.device(),
        }
    }

    /// Element type.
    #[inline]
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::Cpu { dtype, .. } => *dtype,
            Buffer::Pjrt(b) => b.dtype(),
        }
    }

    /// Dimensions.
    #[inline]
    pub fn dims(&self) -> &[usize] {
        match self {
            Buffer::Cpu { dims, .. } => dims,
            Buffer::Pjrt(b) => b.dims(),
        }
    }

    /// Number of elements.
    #[inline]
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
            Buffer::Pjrt(_) => None,
        }
    }

    /// The host bytes, writable, when the buffer lives in host memory.
    pub fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            Buffer::Cpu { data, .. } => Some(data.as_bytes_mut()),
            Buffer::Pjrt(_) => None,
        }
    }

    /// The CPU buffer behind this buffer, if it is one.
    pub fn as_cpu(&self) -> Option<&CpuBuffer> {
        match self {
            Buffer::Cpu { data, .. } => Some(data),
            Buffer::Pjrt(_) => None,
        }
    }

    /// The PJRT buffer behind this buffer, if it is one.
    pub fn as_pjrt(&self) -> Option<&PjrtBuffer> {
        match self {
            Buffer::Pjrt(b) => Some(b),
            Buffer::Cpu { .. } => None,
        }
    }

    /// The CPU buffer behind this buffer, writable, if it is one.
    pub fn as_cpu_mut(&mut self) -> Option<&mut CpuBuffer> {
        match self {
            Buffer::Cpu { data, .. } => Some(data),
            Buffer::Pjrt(_) => None,
        }
    }

    /// Copies the contents to host memory as dense row-major bytes (host memory checked and
    /// allocated fallibly).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        match self {
            Buffer::Cpu { data, dtype, dims } => {
                let src = data.as_bytes();
                let mut out = crate::memory::try_host_capacity(src.len(), || {
                    format!("a host copy of {}", describe(*dtype, dims))
                })?;
                out.extend_from_slice(src);
                Ok(out)
            }
            Buffer::Pjrt(b) => b.to_host(),
        }
    }

    /// Copies the buffer to `device`, bit for bit: device to device within one PJRT client,
    /// through host memory otherwise.
    pub fn copy_to(&self, device: &Device) -> Result<Buffer> {
        if let (Buffer::Pjrt(b), Some((client, index))) = (self, device.as_pjrt())
            && b.client() == client
        {
            return Ok(Buffer::Pjrt(b.copy_to_device(index)?));
        }
        if let Buffer::Pjrt(b) = self
            && let Some(cpu) = device.as_cpu()
        {
            // Download straight into the new host buffer.
            let mut data = CpuDevice::alloc_zeroed(cpu, b.size_in_bytes())
                .map_err(|e| e.for_allocation(|| describe(b.dtype(), b.dims())))?;
            b.copy_to_host(data.as_bytes_mut())?;
            return Ok(Buffer::Cpu {
                data,
                dtype: b.dtype(),
                dims: b.dims().into(),
            });
        }
        match self.host_bytes() {
            Some(bytes) => Buffer::from_bytes(device, self.dtype(), self.dims(), bytes),
            None => {
                // Ask the destination before downloading a copy it could not take.
                device.check_alloc(self.size_in_bytes(), || describe(self.dtype(), self.dims()))?;
                Buffer::from_bytes(device, self.dtype(), self.dims(), &self.to_host()?)
            }
        }
    }
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

    #[test]
    fn huge_buffers_are_errors_that_name_dtype_and_dims() {
        let d = Device::new_cpu(&crate::CpuOptions {
            num_threads: Some(1),
            memory_limit: Some(1 << 20),
        })
        .unwrap();
        let e = Buffer::zeroed(&d, DType::F32, &[1 << 40]).unwrap_err();
        match &e {
            Error::OutOfMemory {
                requested,
                what,
                limit,
                ..
            } => assert_eq!(
                (*requested, what.as_str(), *limit),
                (1 << 42, "f32[1099511627776]", Some(1 << 20))
            ),
            other => panic!("expected OutOfMemory, got {other}"),
        }
        // Past the address space: a shape error, whatever the limit.
        let e = Buffer::for_overwrite(&d, DType::F32, &[1 << 32, 1 << 32, 16]).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
        // Without a limit, more than the host has is refused before anything is allocated.
        let e = Buffer::zeroed(&Device::cpu(), DType::F64, &[1 << 47]).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
        assert_eq!(d.memory_stats().unwrap().bytes_in_use, 0);
    }
}
