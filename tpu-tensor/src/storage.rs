//! Storage: one device buffer shared by a tensor and all its views.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tpu_runtime::{Buffer, DType, Device, Error, Result};

/// A buffer on one device, shared by every view of it.
///
/// The buffer sits behind a lock so that in-place updates (optimizer steps, `copy_`) are seen by
/// every view, and so that a PJRT buffer can be swapped for the result of an on-device update.
pub struct Storage {
    buffer: RwLock<Buffer>,
    dtype: DType,
    device: Device,
    numel: usize,
    /// Bumped by every write, so autograd can tell that a tensor it saved was changed in place.
    version: AtomicU64,
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Storage({} x {} on {})",
            self.numel, self.dtype, self.device
        )
    }
}

impl Storage {
    /// Wraps a buffer.
    pub fn new(buffer: Buffer) -> Arc<Storage> {
        Arc::new(Storage {
            dtype: buffer.dtype(),
            device: buffer.device(),
            numel: buffer.numel(),
            buffer: RwLock::new(buffer),
            version: AtomicU64::new(0),
        })
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device holding the buffer.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Elements held.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Shared access to the buffer. Kernels hold it while they read.
    pub fn read(&self) -> RwLockReadGuard<'_, Buffer> {
        // A panic elsewhere while holding the lock leaves plain bytes behind; nothing to repair.
        self.buffer.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Exclusive access to the buffer, for in-place updates. Counts as a new version.
    pub fn write(&self) -> RwLockWriteGuard<'_, Buffer> {
        let g = self.buffer.write().unwrap_or_else(|e| e.into_inner());
        self.version.fetch_add(1, Ordering::AcqRel);
        g
    }

    /// How many times the storage has been written in place.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Replaces the buffer with one of the same dtype, element count and device.
    pub fn replace(&self, buffer: Buffer) -> Result<Buffer> {
        if buffer.dtype() != self.dtype
            || buffer.numel() != self.numel
            || buffer.device() != self.device
        {
            return Err(Error::invalid_argument(
                "Storage::replace",
                format!(
                    "expected a buffer of {} {} elements on {}, got {} {} elements on {}",
                    self.numel,
                    self.dtype,
                    self.device,
                    buffer.numel(),
                    buffer.dtype(),
                    buffer.device()
                ),
            ));
        }
        Ok(std::mem::replace(&mut *self.write(), buffer))
    }

    /// The buffer, when this is the only handle to the storage.
    pub fn into_buffer(self: Arc<Self>) -> Option<Buffer> {
        Arc::try_unwrap(self)
            .ok()
            .map(|s| s.buffer.into_inner().unwrap_or_else(|e| e.into_inner()))
    }

    /// Calls `f` with the storage's bytes in host memory: borrowed on CPU devices, downloaded
    /// from other devices.
    /// Refused where [`crate::host_reads`] forbids host reads.
    #[track_caller]
    pub fn with_host_bytes<R>(&self, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        crate::host_reads::check()?;
        let guard = self.read();
        match guard.host_bytes() {
            Some(b) => f(b),
            None => {
                let bytes = guard.to_host()?;
                drop(guard);
                f(&bytes)
            }
        }
    }
}
