//! Deferred values: storages whose bytes a higher layer has promised but not computed yet (the
//! graph layer's fused mode records ops instead of running them and computes them together).
//!
//! A deferred storage holds no memory. Every path to its bytes ([`Storage::read`],
//! [`Storage::write`], [`Storage::with_host_bytes`], [`Storage::replace`], transfers) first asks
//! the [`Deferred`] work that owns it to run, which fills it with [`Storage::fill`]. Storages that
//! pending work reads are *watched*: writing one in place runs that work first, so it sees the
//! values it was recorded with.
//!
//! An unset flag costs one atomic load per access, so tensors that were never deferred pay
//! nothing more.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::{Error, Result, Storage};

/// Work that will fill deferred storages when it runs.
pub trait Deferred: Send + Sync {
    /// Runs the work: fills every storage it owns that is still alive (with
    /// [`Storage::fill`]), or marks them failed (with [`Storage::fail`]) and returns the error.
    /// Running work that has already run does nothing.
    fn flush(&self) -> Result<()>;
}

const PENDING: u8 = 1;
const WATCHED: u8 = 2;
const FAILED: u8 = 4;

/// The deferral state of one storage; all clear for a storage that was never deferred.
#[derive(Default)]
pub(crate) struct Slot {
    flags: AtomicU8,
    inner: Mutex<Option<Box<Inner>>>,
}

#[derive(Default)]
struct Inner {
    owner: Option<Arc<dyn Deferred>>,
    readers: Vec<Weak<dyn Deferred>>,
    failure: Option<String>,
}

impl Slot {
    pub(crate) fn pending(owner: Arc<dyn Deferred>) -> Slot {
        Slot {
            flags: AtomicU8::new(PENDING),
            inner: Mutex::new(Some(Box::new(Inner {
                owner: Some(owner),
                ..Inner::default()
            }))),
        }
    }

    fn flags(&self) -> u8 {
        self.flags.load(Ordering::Acquire)
    }

    pub(crate) fn is_clear(&self) -> bool {
        self.flags() == 0
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(g.get_or_insert_with(Box::default))
    }

    pub(crate) fn is_pending(&self) -> bool {
        self.flags() & PENDING != 0
    }

    /// Runs the owner of a pending storage; the error of a failed one.
    pub(crate) fn ready(&self) -> Result<()> {
        let flags = self.flags();
        if flags & (PENDING | FAILED) == 0 {
            return Ok(());
        }
        if flags & PENDING != 0 {
            // The owner is cloned out so the lock is free while it runs (it fills this slot).
            let owner = self.with(|i| i.owner.clone());
            if let Some(o) = owner {
                o.flush()?;
            }
        }
        let flags = self.flags();
        if flags & FAILED != 0 {
            let why = self.with(|i| i.failure.clone()).unwrap_or_default();
            return Err(Error::invalid_argument(
                "deferred",
                format!("this tensor's value could not be computed: {why}"),
            ));
        }
        if flags & PENDING != 0 {
            return Err(Error::internal(
                "deferred",
                "the work that computes this tensor ran without filling it",
            ));
        }
        Ok(())
    }

    /// Runs the pending work that reads this storage, before it is written.
    pub(crate) fn before_write(&self) -> Result<()> {
        self.ready()?;
        if self.flags() & WATCHED == 0 {
            return Ok(());
        }
        let readers = self.with(|i| std::mem::take(&mut i.readers));
        self.flags.fetch_and(!WATCHED, Ordering::AcqRel);
        for r in readers.iter().filter_map(Weak::upgrade) {
            r.flush()?;
        }
        Ok(())
    }

    pub(crate) fn watch(&self, reader: &Arc<dyn Deferred>) {
        self.with(|i| {
            if !i.readers.iter().any(|r| same(r, reader)) {
                i.readers.push(Arc::downgrade(reader));
            }
        });
        self.flags.fetch_or(WATCHED, Ordering::AcqRel);
    }

    pub(crate) fn unwatch(&self, reader: &Arc<dyn Deferred>) {
        if self.flags() & WATCHED == 0 {
            return;
        }
        self.with(|i| {
            i.readers
                .retain(|r| r.strong_count() > 0 && !same(r, reader));
            if i.readers.is_empty() {
                self.flags.fetch_and(!WATCHED, Ordering::AcqRel);
            }
        });
    }

    pub(crate) fn settle(&self, failure: Option<String>) {
        self.with(|i| {
            i.owner = None;
            if failure.is_some() {
                i.failure = failure;
                self.flags.fetch_or(FAILED, Ordering::AcqRel);
            }
        });
        self.flags.fetch_and(!PENDING, Ordering::AcqRel);
    }
}

fn same(w: &Weak<dyn Deferred>, a: &Arc<dyn Deferred>) -> bool {
    std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(a))
}

/// Runs every pending work `storages` depend on (their owners), so their bytes can be read.
/// The error of the first that fails.
pub fn ready_all<'a>(storages: impl IntoIterator<Item = &'a Storage>) -> Result<()> {
    for s in storages {
        s.ready()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::{Device, Tensor};
    use tpu_runtime::{Buffer, DType};

    /// Fills its storage with `value` (or fails) when flushed, counting its runs.
    struct Fill {
        target: Mutex<Option<Weak<Storage>>>,
        value: Option<f32>,
        runs: AtomicUsize,
    }

    impl Deferred for Fill {
        fn flush(&self) -> Result<()> {
            let Some(s) = self.target.lock().unwrap().take().and_then(|w| w.upgrade()) else {
                return Ok(());
            };
            self.runs.fetch_add(1, Ordering::SeqCst);
            match self.value {
                Some(v) => s.fill(Buffer::from_bytes(
                    &Device::cpu(),
                    DType::F32,
                    &[2],
                    bytemuck::cast_slice(&[v, v]),
                )?),
                None => {
                    s.fail("the kernel refused".into());
                    Err(Error::invalid_argument("op", "the kernel refused"))
                }
            }
        }
    }

    fn deferred(value: Option<f32>) -> (Arc<Fill>, Tensor) {
        let work = Arc::new(Fill {
            target: Mutex::new(None),
            value,
            runs: AtomicUsize::new(0),
        });
        let owner: Arc<dyn Deferred> = work.clone();
        let s = Storage::deferred(DType::F32, &Device::cpu(), 2, owner).unwrap();
        *work.target.lock().unwrap() = Some(Arc::downgrade(&s));
        let t = Tensor::from_storage(s, crate::Layout::contiguous(&[2])).unwrap();
        (work, t)
    }

    #[test]
    fn a_read_runs_the_work_once_and_keeps_the_version() {
        let (work, t) = deferred(Some(3.0));
        assert!(t.storage().is_pending());
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
        assert_eq!(work.runs.load(Ordering::SeqCst), 1);
        assert_eq!(t.storage().version(), 0);
    }

    #[test]
    fn a_failure_is_reported_by_every_fallible_read() {
        let (_, t) = deferred(None);
        let first = t.to_vec::<f32>().unwrap_err().to_string();
        assert!(first.contains("the kernel refused"), "{first}");
        let again = t.to_vec::<f32>().unwrap_err().to_string();
        assert!(again.contains("could not be computed"), "{again}");
    }

    #[test]
    fn writing_a_watched_storage_runs_its_readers_first() {
        let (work, out) = deferred(Some(1.0));
        let input = Tensor::new([5.0f32, 6.0], &Device::cpu()).unwrap();
        let reader: Arc<dyn Deferred> = work.clone();
        input.storage().watch(&reader);
        drop(input.storage().write());
        assert_eq!(work.runs.load(Ordering::SeqCst), 1);
        assert!(!out.storage().is_pending());
        // Unwatched storages write without running anything.
        input.storage().unwatch(&reader);
        drop(input.storage().write());
        assert_eq!(work.runs.load(Ordering::SeqCst), 1);
    }
}
