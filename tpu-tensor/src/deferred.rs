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
