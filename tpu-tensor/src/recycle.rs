//! A thread's most recently dropped small CPU tensors, kept whole and handed to the next tensor
//! created on that thread with the same dtype, element count and device.
//!
//! Why: building a tiny op's output (the tensor's record and its storage's, each its own
//! allocation, with the layout, the buffer's dims and the device handle moved into them) and
//! freeing it again cost most of a whole eager call on a few elements; a kept tensor is reused
//! in place instead. Only a tensor nothing else can reach is kept: the last handle, no other
//! handle to its storage, no weak reference to either, no view base, no autograd record, no
//! deferred work, a CPU buffer of at most [`MAX_BYTES`]. While kept, its bytes are not counted
//! as in use ([`tpu_runtime::cpu::CpuDevice::park_bytes`]), so memory statistics read as if it were
//! freed; reused, it starts as a new tensor would: dense row-major layout of the asked shape,
//! version 0, no autograd record.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use tpu_runtime::{Buffer, DType, Device};

use crate::tensor::{Layout, Tensor};

/// Tensors a thread keeps.
const KEEP: usize = 8;
/// The largest buffer kept, in bytes (the CPU device's pool of small buffers takes larger ones
/// up to the same size; past it an op's own work outweighs its allocations).
pub(crate) const MAX_BYTES: usize = 1024;

thread_local! {
    static KEPT: RefCell<Vec<Kept>> = const { RefCell::new(Vec::new()) };
}

/// A kept tensor, parked ([`crate::storage::Storage::park`]). Dropped by the pool (full, cleared,
/// or its thread exiting), it marks its buffer parked first, so that the buffer, already not
/// counted as in use, releases nothing as it drops. `None` once taken back into use.
struct Kept(Option<Tensor>);

impl Drop for Kept {
    fn drop(&mut self) {
        let Some(t) = &mut self.0 else {
            return;
        };
        match Arc::get_mut(&mut t.inner).and_then(|i| Arc::get_mut(&mut i.storage)) {
            Some(s) => s.drop_parked(),
            // Not reached (kept tensors have no other handle); counted again, it drops evenly.
            None => t.inner.storage.recount_parked(),
        }
    }
}

/// Called when the last handle `t` is dropped: keeps the tensor if it qualifies.
///
/// Whether nothing else reaches the tensor and its storage is read from their counts, not
/// taken as exclusive borrows (`Arc::get_mut`): the borrows are atomic read-modify-writes,
/// and a tiny op's whole call is of the order of ten of them (four of these cost it about a
/// tenth).
#[inline]
pub(crate) fn offer(t: &mut Tensor) {
    // Read first: most tensors are too large.
    let inner = &t.inner;
    let s = &inner.storage;
    if s.numel().saturating_mul(s.dtype().size_in_bytes()) > MAX_BYTES || !s.device().is_cpu() {
        return;
    }
    // `t` is the last strong handle (the caller checked). With no weak one either, nothing can
    // make another, so the counts cannot change under this; the same holds for the storage,
    // reached only through `t`. The fence orders this thread's later reads of the tensor after
    // other handles' last writes, as the exclusive borrow's acquire would.
    if Arc::weak_count(&t.inner) != 0
        || Arc::strong_count(s) != 1
        || Arc::weak_count(s) != 0
        || inner.base.is_some()
        || inner.has_autograd.load(Ordering::Relaxed)
    {
        return;
    }
    fence(Ordering::Acquire);
    // The pool's handle outlives `t`'s, which is dropped right after this returns. Parked only
    // once the pool is in reach (not busy, this thread not exiting): every parked storage is
    // then in the pool or being taken from it.
    let _ = KEPT.try_with(|k| {
        let Ok(mut k) = k.try_borrow_mut() else {
            return;
        };
        if !s.park(MAX_BYTES) {
            return;
        }
        if k.len() == KEEP {
            // Dropped while the pool is borrowed, so it is freed rather than offered again.
            k.remove(0);
        }
        k.push(Kept(Some(t.clone())));
    });
}

/// A kept tensor of `numel` `dtype` elements on `device`, reshaped to `shape` (dense), with
/// `fill` run on its buffer; `None` when none is kept (or the device's memory limit has no
/// room for it, as it would not for a new one) or when `fill` returns false (it keeps its
/// error itself: a `Result` here would carry the 96-byte error through memory on every call).
#[inline]
pub(crate) fn take(
    device: &Device,
    dtype: DType,
    shape: &[usize],
    numel: usize,
    fill: impl FnOnce(&mut Buffer) -> bool,
) -> Option<Tensor> {
    let mut t = KEPT
        .try_with(|k| {
            let mut k = k.try_borrow_mut().ok()?;
            let i = k.iter().rposition(|kept| {
                kept.0.as_ref().is_some_and(|t| {
                    let s = &t.inner.storage;
                    s.numel() == numel && s.dtype() == dtype && s.device() == device
                })
            })?;
            k.swap_remove(i).0.take()
        })
        .ok()
        .flatten()?;
    // Kept tensors have no other handle; were that ever not so, `t` goes back as dropped.
    let inner = Arc::get_mut(&mut t.inner)?;
    // Still parked when the limit has no room: dropped, `t` goes back to the pool.
    let buffer = Arc::get_mut(&mut inner.storage)?.unpark(shape).ok()?;
    if !fill(buffer) {
        return None;
    }
    *inner.autograd.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
    let layout = &mut inner.layout;
    if layout.offset != 0 || layout.shape[..] != *shape || !dense_strides(shape, &layout.strides) {
        *layout = Layout::contiguous(shape);
    }
    Some(t)
}

/// True when `strides` are exactly the row-major strides of `shape`.
fn dense_strides(shape: &[usize], strides: &[usize]) -> bool {
    let mut expected = 1;
    shape.len() == strides.len()
        && shape.iter().zip(strides).rev().all(|(&d, &s)| {
            let ok = s == expected;
            expected = expected.saturating_mul(d);
            ok
        })
}

/// Frees the tensors this thread keeps for reuse (at most eight, of at most 1 KiB each).
pub fn clear() {
    let _ = KEPT.try_with(|k| {
        if let Ok(mut k) = k.try_borrow_mut() {
            // Dropped while the pool is borrowed, so they are freed rather than offered again.
            k.clear();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpu_runtime::cpu::CpuOptions;

    fn device(limit: Option<usize>) -> Device {
        Device::new_cpu(&CpuOptions {
            num_threads: Some(1),
            memory_limit: limit,
        })
        .unwrap()
    }

    fn ones(shape: &[usize], device: &Device) -> Tensor {
        Tensor::from_fn_overwrite::<f32>(shape, device, |o| {
            o.fill(1.0);
            Ok(())
        })
        .unwrap()
    }

    fn kept_here() -> usize {
        KEPT.with(|k| k.borrow().len())
    }

    fn in_use(device: &Device) -> (usize, usize) {
        let s = device.memory_stats().unwrap();
        (s.bytes_in_use, s.live_allocations)
    }

    #[test]
    fn a_kept_tensor_comes_back_new_and_uncounted_while_kept() {
        clear();
        let dev = device(None);
        let t = ones(&[2, 3], &dev);
        let storage = Arc::as_ptr(t.storage());
        drop(t.storage().write());
        assert_eq!(t.storage().version(), 1);
        assert_eq!(in_use(&dev), (64, 1));
        drop(t);
        assert_eq!(kept_here(), 1);
        assert_eq!(in_use(&dev), (0, 0), "a kept tensor is not in use");

        // Same dtype, count and device, another shape: the same storage, as a new tensor.
        let u = Tensor::from_fn_overwrite::<f32>(&[6], &dev, |o| {
            o.copy_from_slice(&[1., 2., 3., 4., 5., 6.]);
            Ok(())
        })
        .unwrap();
        assert_eq!(kept_here(), 0);
        assert_eq!(Arc::as_ptr(u.storage()), storage);
        assert_eq!(in_use(&dev), (64, 1));
        assert_eq!(u.shape(), &[6]);
        assert_eq!(u.layout(), &Layout::contiguous(&[6]));
        assert_eq!(u.storage().read().dims(), &[6]);
        assert_eq!(u.storage().version(), 0);
        assert!(!u.has_autograd_meta());
        assert_eq!(u.to_vec::<f32>().unwrap(), [1., 2., 3., 4., 5., 6.]);

        // A zero-filled creation of the same size zeroes what the kept buffer held.
        drop(u);
        let z = Tensor::from_fn_typed::<f32>(&[3, 2], &dev, |_| Ok(())).unwrap();
        assert_eq!(Arc::as_ptr(z.storage()), storage);
        assert_eq!(z.to_vec::<f32>().unwrap(), [0.; 6]);

        // Another dtype, count or device takes a new allocation.
        drop(z);
        let other = device(None);
        for t in [ones(&[5], &dev), ones(&[6], &other)] {
            assert_ne!(Arc::as_ptr(t.storage()), storage);
        }
        let b = Tensor::from_fn_typed::<i32>(&[6], &dev, |_| Ok(())).unwrap();
        assert_ne!(Arc::as_ptr(b.storage()), storage);
        clear();
    }

    #[test]
    fn only_tensors_nothing_else_reaches_are_kept() {
        clear();
        let dev = device(None);
        // Whether the pool holds `t` once it is dropped with `f(t)` alive (a pointer test could
        // be fooled by the allocator handing back the same address).
        let kept = |f: &dyn Fn(&Tensor) -> Box<dyn std::any::Any>| {
            let t = ones(&[4], &dev);
            let held = f(&t);
            drop(t);
            let kept = kept_here();
            drop(held);
            clear();
            kept == 1
        };
        assert!(kept(&|_| Box::new(())));
        // Another handle, a handle to the storage, a weak reference, a view.
        assert!(!kept(&|t| Box::new(t.clone())));
        assert!(!kept(&|t| Box::new(t.storage().clone())));
        assert!(!kept(&|t| Box::new(Arc::downgrade(t.storage()))));
        assert!(!kept(&|t| Box::new(t.reshape([2, 2]).unwrap())));
        // An autograd record.
        assert!(!kept(&|t| {
            t.set_autograd_meta(Some(Arc::new(())));
            Box::new(())
        }));
        // Larger than kept.
        drop(ones(&[MAX_BYTES / 4 + 1], &dev));
        assert_eq!(kept_here(), 0);
        assert_eq!(in_use(&dev), (0, 0));
    }

    #[test]
    fn a_kept_tensor_respects_the_memory_limit() {
        clear();
        let dev = device(Some(128));
        drop(ones(&[16], &dev)); // 64 bytes, kept
        let held = ones(&[32], &dev); // 128 bytes: the limit
        let err = Tensor::from_fn_overwrite::<f32>(&[16], &dev, |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("out of memory"), "{err}");
        drop(held);
        // Still kept, and given once there is room.
        assert_eq!(in_use(&dev), (0, 0));
        let t = ones(&[16], &dev);
        assert_eq!(in_use(&dev), (64, 1));
        drop(t);
        clear();
        assert_eq!(in_use(&dev), (0, 0));
    }

    #[test]
    fn a_thread_keeps_a_bounded_number() {
        clear();
        let dev = device(None);
        let made: Vec<Tensor> = (1..=2 * KEEP).map(|n| ones(&[n], &dev)).collect();
        drop(made);
        assert_eq!(kept_here(), KEEP);
        clear();
        assert_eq!(kept_here(), 0);
        assert_eq!(in_use(&dev), (0, 0));
    }

    #[test]
    fn a_thread_exiting_frees_what_it_kept_once() {
        let dev = device(None);
        let held = ones(&[3], &dev);
        std::thread::scope(|s| {
            s.spawn(|| {
                drop((1..=3).map(|n| ones(&[n * 8], &dev)).collect::<Vec<_>>());
                assert_eq!(kept_here(), 3);
                assert_eq!(in_use(&dev), (64, 1), "only `held` is in use");
            });
        });
        // Had the exiting thread's kept buffers released their bytes again, the count would
        // have fallen below `held`'s.
        assert_eq!(in_use(&dev), (64, 1));
        drop(held);
        clear();
        assert_eq!(in_use(&dev), (0, 0));
    }
}
