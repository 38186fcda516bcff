//! Storage: one device buffer shared by a tensor and all its views.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tpu_runtime::{Buffer, DType, Device, Error, Result};

use crate::deferred::{Deferred, Slot};

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
    /// Set while the bytes are deferred or watched by deferred work ([`crate::deferred`]).
    deferred: Slot,
    /// Set while [`crate::recycle`] keeps the storage with its bytes not counted as in use
    /// ([`Storage::park`]); a flag here, not in the buffer, so that parking takes no lock.
    parked: AtomicBool,
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
    #[inline]
    pub fn new(buffer: Buffer) -> Arc<Storage> {
        Arc::new(Storage {
            dtype: buffer.dtype(),
            device: buffer.device(),
            numel: buffer.numel(),
            buffer: RwLock::new(buffer),
            version: AtomicU64::new(0),
            deferred: Slot::default(),
            parked: AtomicBool::new(false),
        })
    }

    /// A storage of `numel` elements whose bytes `owner` will compute: nothing is allocated
    /// until then, and the first access to the bytes runs `owner` ([`crate::deferred`]).
    pub fn deferred(
        dtype: DType,
        device: &Device,
        numel: usize,
        owner: Arc<dyn Deferred>,
    ) -> Result<Arc<Storage>> {
        // An empty host buffer stands in; nothing reads it before `fill` replaces it.
        let placeholder = Buffer::zeroed(&Device::cpu(), dtype, &[0])?;
        Ok(Arc::new(Storage {
            buffer: RwLock::new(placeholder),
            dtype,
            device: device.clone(),
            numel,
            version: AtomicU64::new(0),
            deferred: Slot::pending(owner),
            parked: AtomicBool::new(false),
        }))
    }

    /// True while the bytes are deferred (not computed yet).
    pub fn is_pending(&self) -> bool {
        self.deferred.is_pending()
    }

    /// Computes the bytes if they are deferred: the error of the deferred work when it failed
    /// (also on later calls). Free for storages that were never deferred.
    pub fn ready(&self) -> Result<()> {
        if self.deferred.is_clear() {
            return Ok(());
        }
        self.deferred.ready()
    }

    /// Gives a deferred storage its computed bytes. Not a write: the version does not change,
    /// since the values are the ones the storage stood for all along.
    pub fn fill(&self, buffer: Buffer) -> Result<()> {
        if !self.is_pending() {
            return Err(Error::internal(
                "Storage::fill",
                "the storage is not deferred",
            ));
        }
        self.check_fits("Storage::fill", &buffer)?;
        *self.buffer.write().unwrap_or_else(|e| e.into_inner()) = buffer;
        self.deferred.settle(None);
        Ok(())
    }

    /// Marks a deferred storage as never to be computed: reading it returns an error naming
    /// `why`. Its bytes read as zeros through the accessors that cannot fail.
    pub fn fail(&self, why: String) {
        if !self.is_pending() {
            return;
        }
        if let Ok(zeros) = Buffer::zeroed(&self.device, self.dtype, &[self.numel]) {
            *self.buffer.write().unwrap_or_else(|e| e.into_inner()) = zeros;
        }
        self.deferred.settle(Some(why));
    }

    /// Registers deferred work that reads this storage: writing the storage in place runs that
    /// work first, so it sees the values it was recorded with.
    pub fn watch(&self, reader: &Arc<dyn Deferred>) {
        self.deferred.watch(reader);
    }

    /// Forgets a reader registered with [`Storage::watch`] (it has run).
    pub fn unwatch(&self, reader: &Arc<dyn Deferred>) {
        self.deferred.unwatch(reader);
    }

    /// Computes deferred bytes before an access that cannot report errors; a failure is kept
    /// and returned by the fallible readers.
    fn settle_for_access(&self, write: bool) {
        if self.deferred.is_clear() {
            return;
        }
        let _ = if write {
            self.deferred.before_write()
        } else {
            self.deferred.ready()
        };
    }

    fn check_fits(&self, op: &str, buffer: &Buffer) -> Result<()> {
        if buffer.dtype() != self.dtype
            || buffer.numel() != self.numel
            || buffer.device() != self.device
        {
            return Err(Error::invalid_argument(
                op,
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
        Ok(())
    }

    /// For [`crate::recycle`], on a storage nothing else reaches: stops counting its buffer as
    /// in use, if it is a CPU buffer of at most `max_bytes` bytes with no deferred work
    /// attached; false (and nothing done) otherwise. Through `&self` and the device's counters,
    /// without the buffer's lock: the pool checks that nothing else reaches the storage by
    /// reading its counts, which costs less than the exclusive borrow would. Already parked, it
    /// stays so.
    pub(crate) fn park(&self, max_bytes: usize) -> bool {
        if self.parked.load(Ordering::Relaxed) {
            return true;
        }
        let len = self.numel.saturating_mul(self.dtype.size_in_bytes());
        let Some(cpu) = self.device.as_cpu() else {
            return false;
        };
        if !self.deferred.is_clear() || len > max_bytes || !cpu.park_bytes(len) {
            return false;
        }
        self.parked.store(true, Ordering::Relaxed);
        true
    }

    /// Takes a storage parked by [`Storage::park`] back into use as a new one of dims `dims`
    /// (as many elements): counted in use again, version 0. Fails, still parked, when the
    /// device's memory limit has no room for it; its buffer is then marked parked, so that
    /// dropping it releases nothing twice.
    pub(crate) fn unpark(&mut self, dims: &[usize]) -> Result<&mut Buffer> {
        let len = self.numel.saturating_mul(self.dtype.size_in_bytes());
        let buffer = self.buffer.get_mut().unwrap_or_else(|e| e.into_inner());
        if *self.parked.get_mut() {
            if let Some(cpu) = self.device.as_cpu()
                && let Err(e) = cpu.unpark_bytes(len, true)
            {
                if let Buffer::Cpu { data, .. } = buffer {
                    data.set_parked(true);
                }
                return Err(e);
            }
            *self.parked.get_mut() = false;
        }
        if let Buffer::Cpu { data, dims: d, .. } = buffer {
            data.set_parked(false);
            if d[..] != *dims {
                d.clear();
                d.extend_from_slice(dims);
            }
        }
        *self.version.get_mut() = 0;
        Ok(buffer)
    }

    /// For a parked storage about to be dropped: its buffer releases nothing as it drops.
    pub(crate) fn drop_parked(&mut self) {
        if *self.parked.get_mut()
            && let Buffer::Cpu { data, .. } =
                self.buffer.get_mut().unwrap_or_else(|e| e.into_inner())
        {
            data.set_parked(true);
        }
    }

    /// For a parked storage about to be dropped that cannot be borrowed exclusively (which
    /// [`crate::recycle`] rules out): counts its bytes again, so that dropping it releases them
    /// once.
    pub(crate) fn recount_parked(&self) {
        if self.parked.swap(false, Ordering::Relaxed)
            && let Some(cpu) = self.device.as_cpu()
        {
            let len = self.numel.saturating_mul(self.dtype.size_in_bytes());
            let _ = cpu.unpark_bytes(len, false);
        }
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
    /// Deferred bytes are computed first.
    pub fn read(&self) -> RwLockReadGuard<'_, Buffer> {
        self.settle_for_access(false);
        // A panic elsewhere while holding the lock leaves plain bytes behind; nothing to repair.
        self.buffer.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Exclusive access to the buffer, for in-place updates. Counts as a new version. Deferred
    /// bytes are computed first, and so is deferred work that reads them.
    pub fn write(&self) -> RwLockWriteGuard<'_, Buffer> {
        self.settle_for_access(true);
        let g = self.buffer.write().unwrap_or_else(|e| e.into_inner());
        self.version.fetch_add(1, Ordering::AcqRel);
        g
    }

    /// Counts an in-place write without touching the bytes (a write a trace records and a
    /// program makes later).
    pub(crate) fn count_write(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// How many times the storage has been written in place.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Replaces the buffer with one of the same dtype, element count and device.
    pub fn replace(&self, buffer: Buffer) -> Result<Buffer> {
        self.check_fits("Storage::replace", &buffer)?;
        if !self.deferred.is_clear() {
            self.deferred.before_write()?;
        }
        Ok(std::mem::replace(&mut *self.write(), buffer))
    }

    /// The buffer, when this is the only handle to the storage.
    pub fn into_buffer(self: Arc<Self>) -> Option<Buffer> {
        self.settle_for_access(false);
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
        self.ready()?;
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
