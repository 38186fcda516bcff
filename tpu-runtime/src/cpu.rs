//! The native CPU device: accounted, 64-byte aligned memory and one rayon pool.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytemuck::{Pod, Zeroable};

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::memory::{MemoryCounters, MemoryStats, check_host_memory, parse_memory_size};

/// Environment variable: threads in the default CPU device's pool.
pub const ENV_NUM_THREADS: &str = "TPU_RS_NUM_THREADS";
/// Environment variable: memory limit of the default CPU device (`512MiB`, `2GB`, ...).
pub const ENV_CPU_MEMORY_LIMIT: &str = "TPU_RS_CPU_MEMORY_LIMIT";

/// Alignment of every CPU allocation, in bytes: one cache line, enough for any SIMD load.
pub const CPU_ALIGNMENT: usize = 64;

/// One cache line; a `Vec` of these is a 64-byte aligned allocation made without unsafe code.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(64))]
struct Line([u8; CPU_ALIGNMENT]);

/// How to build a CPU device.
#[derive(Clone, Debug, Default)]
pub struct CpuOptions {
    /// Threads in the device's pool; `None` means the core count.
    pub num_threads: Option<usize>,
    /// Memory limit in bytes; `None` means no limit.
    pub memory_limit: Option<usize>,
}

/// The largest request the CPU device considers: half the address space, so that rounding a
/// request up to its size class never overflows (and no allocator could provide more anyway).
const MAX_ALLOC_BYTES: usize = isize::MAX as usize / 2;

/// Buffers at least this large are kept for reuse when freed; smaller ones go back to the
/// system allocator, which is fast for them.
pub const CACHE_MIN_BYTES: usize = 64 << 10;

/// Buffers of at most this many lines (1 KiB) are kept, when freed, in a small pool of the
/// freeing thread and handed to that thread's next request of the same size: a tiny tensor's
/// buffer otherwise costs an aligned allocation (the allocator's slow path, which splits and
/// merges chunks) that takes longer than most tiny ops.
const SMALL_LINES: usize = 16;
/// Freed small buffers a thread keeps per size.
const SMALL_KEEP: usize = 8;

thread_local! {
    /// Freed small buffers of this thread, by size in lines (index `lines - 1`). Pooled memory
    /// is at most `SMALL_LINES * SMALL_KEEP * (SMALL_LINES + 1) / 2` lines (68 KiB) a thread.
    static SMALL: std::cell::RefCell<[Vec<Vec<Line>>; SMALL_LINES]> =
        const { std::cell::RefCell::new([const { Vec::new() }; SMALL_LINES]) };
}

/// A pooled buffer of exactly `lines` lines, if this thread holds one.
#[inline]
fn take_small(lines: usize) -> Option<Vec<Line>> {
    if lines == 0 || lines > SMALL_LINES {
        return None;
    }
    SMALL
        .try_with(|p| p.try_borrow_mut().ok()?[lines - 1].pop())
        .ok()
        .flatten()
}

/// Keeps a freed small buffer in this thread's pool; false when it is not kept.
#[inline]
fn keep_small(v: &mut Vec<Line>) -> bool {
    let lines = v.len();
    if lines == 0 || lines > SMALL_LINES || v.capacity() != lines {
        return false;
    }
    SMALL
        .try_with(|p| {
            let Ok(mut p) = p.try_borrow_mut() else {
                return false;
            };
            let list = &mut p[lines - 1];
            if list.len() >= SMALL_KEEP {
                return false;
            }
            list.push(std::mem::take(v));
            true
        })
        .unwrap_or(false)
}

/// Freed large buffers by size in lines, for reuse.
#[derive(Default)]
struct Cache {
    free: std::collections::BTreeMap<usize, Vec<Mem>>,
    bytes: usize,
}

/// Allocations of at least this many bytes are anonymous mappings advised onto transparent
/// huge pages. A pass over a large tensor on 4 KiB pages misses the TLB every 4 KiB, and under
/// a hypervisor each miss walks two levels of page tables: on a 2-vCPU virtual machine a sum
/// over 64 MiB ran at 30 GB/s on one core from 2 MiB pages against 17-20 GB/s from 4 KiB pages.
/// (The allocator's zeroed aligned allocation would not do: it writes every page before it can
/// be advised.) Linux grants them where transparent huge pages are set to `madvise` or
/// `always`; elsewhere the mapping keeps 4 KiB pages.
const HUGE_MIN_BYTES: usize = 4 << 20;

/// The memory of a CPU buffer.
enum Mem {
    /// 64-byte lines on the heap.
    Lines(Vec<Line>),
    /// A zero-filled anonymous mapping (page aligned) of a whole number of lines.
    Map(memmap2::MmapMut),
}

impl Mem {
    /// Zero-filled memory of `lines` lines; `Err` when the system refuses it.
    fn zeroed(lines: usize) -> std::result::Result<Mem, ()> {
        let bytes = lines * CPU_ALIGNMENT;
        if bytes < HUGE_MIN_BYTES {
            return bytemuck::allocation::try_zeroed_vec::<Line>(lines).map(Mem::Lines);
        }
        let map = memmap2::MmapMut::map_anon(bytes).map_err(|_| ())?;
        // Advised before anything touches the pages, so the first writes fault in huge pages.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Ok(Mem::Map(map))
    }

    fn lines(&self) -> usize {
        match self {
            Mem::Lines(v) => v.len(),
            Mem::Map(m) => m.len() / CPU_ALIGNMENT,
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Mem::Lines(v) => bytemuck::cast_slice(v),
            Mem::Map(m) => m,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Mem::Lines(v) => bytemuck::cast_slice_mut(v),
            Mem::Map(m) => m,
        }
    }
}

/// Rounds a large request up to a size class (at most 1/8 larger), so freed buffers fit later
/// requests of similar size.
fn size_class(lines: usize) -> usize {
    if lines * CPU_ALIGNMENT < CACHE_MIN_BYTES {
        return lines;
    }
    let shift = (usize::BITS - lines.leading_zeros()).saturating_sub(4);
    let step = 1usize << shift;
    lines.div_ceil(step) * step
}

/// A native CPU device: memory accounting, an optional limit and a thread pool.
pub struct CpuDevice {
    ordinal: usize,
    counters: MemoryCounters,
    num_threads: usize,
    pool: OnceLock<std::result::Result<rayon::ThreadPool, String>>,
    /// A bad environment setting of the default device; every allocation reports it rather than
    /// quietly running with a setting the user did not ask for.
    config_error: Option<(&'static str, String, String)>,
    /// Freed large buffers kept for reuse (a fresh allocation costs a page fault per 4 KiB).
    cache: std::sync::Mutex<Cache>,
}

impl fmt::Debug for CpuDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuDevice")
            .field("name", &self.name())
            .field("num_threads", &self.num_threads)
            .field("memory", &self.counters.snapshot())
            .finish()
    }
}

static NEXT_ORDINAL: AtomicUsize = AtomicUsize::new(1);

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl CpuDevice {
    /// The process-wide default CPU device, configured from the environment on first use.
    pub(crate) fn default_device() -> &'static Arc<CpuDevice> {
        static DEFAULT: OnceLock<Arc<CpuDevice>> = OnceLock::new();
        DEFAULT.get_or_init(|| Arc::new(CpuDevice::from_env(|k| std::env::var(k).ok())))
    }

    fn from_env(var: impl Fn(&str) -> Option<String>) -> CpuDevice {
        let mut config_error = None;
        let num_threads = match var(ENV_NUM_THREADS) {
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if n > 0 => n,
                _ => {
                    config_error = Some((
                        ENV_NUM_THREADS,
                        v,
                        "expected a positive whole number of threads".to_string(),
                    ));
                    default_threads()
                }
            },
            None => default_threads(),
        };
        let memory_limit = match var(ENV_CPU_MEMORY_LIMIT) {
            Some(v) => match parse_memory_size(&v) {
                Ok(n) => Some(n),
                Err(e) => {
                    config_error.get_or_insert((ENV_CPU_MEMORY_LIMIT, v, e.to_string()));
                    None
                }
            },
            None => None,
        };
        CpuDevice {
            ordinal: 0,
            counters: MemoryCounters::new(memory_limit),
            num_threads,
            pool: OnceLock::new(),
            config_error,
            cache: Default::default(),
        }
    }

    /// A new CPU device with its own accounting, limit and pool, independent of the default one.
    pub(crate) fn with_options(options: &CpuOptions) -> Result<CpuDevice> {
        let num_threads = match options.num_threads {
            Some(0) => {
                return Err(Error::invalid_argument(
                    "CpuOptions",
                    "num_threads must be at least 1, got 0",
                ));
            }
            Some(n) => n,
            None => default_threads(),
        };
        Ok(CpuDevice {
            ordinal: NEXT_ORDINAL.fetch_add(1, Ordering::Relaxed),
            counters: MemoryCounters::new(options.memory_limit),
            num_threads,
            pool: OnceLock::new(),
            config_error: None,
            cache: Default::default(),
        })
    }

    /// `cpu` for the default device, `cpu:N` for devices made with [`CpuOptions`].
    pub fn name(&self) -> String {
        CpuName(self.ordinal).to_string()
    }

    /// Threads in this device's pool.
    pub fn num_threads(&self) -> usize {
        self.num_threads
    }

    fn check_config(&self) -> Result<()> {
        match &self.config_error {
            None => Ok(()),
            Some((var, value, expected)) => Err(Error::InvalidEnv {
                var,
                value: value.clone(),
                expected: expected.clone(),
            }),
        }
    }

    /// The device's rayon pool, built on first use so that programs that only touch tiny
    /// tensors never start threads.
    pub fn pool(&self) -> Result<&rayon::ThreadPool> {
        self.check_config()?;
        let built = self.pool.get_or_init(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(self.num_threads)
                .thread_name(|i| format!("tpu-rs-cpu-{i}"))
                .build()
                .map_err(|e| e.to_string())
        });
        built.as_ref().map_err(|e| Error::DeviceUnavailable {
            device: self.name(),
            reason: format!("could not start {} threads: {e}", self.num_threads),
        })
    }

    /// Runs `f` inside this device's pool (so rayon's parallel iterators use its threads).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R> {
        Ok(self.pool()?.install(f))
    }

    /// [`CpuDevice::install`] with the pool's other threads kept awake until `f` returns: they
    /// wait spinning, each taking a parallel task as soon as one is queued, where rayon's idle
    /// threads go to sleep within microseconds. For a sequence of ops (a compiled graph, a
    /// decode step), whose parallel kernels would otherwise each wake a sleeping thread: a
    /// wake-up took 20-60 µs on a two-core VM, more than a parallel ReLU over 512 KiB (12 µs
    /// with both threads awake, 30-70 µs after a pause). The waiting threads keep their cores
    /// busy while `f` runs, as OpenMP's do.
    pub fn install_awake<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R> {
        let pool = self.pool()?;
        if self.num_threads <= 1 {
            return Ok(pool.install(f));
        }
        Ok(pool.install(|| {
            let done = AtomicBool::new(false);
            rayon::scope(|s| {
                for _ in 1..self.num_threads {
                    s.spawn(|_| {
                        while !done.load(Ordering::Acquire) {
                            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                                // A pause between looks, so the waiting threads do not keep
                                // taking the queues' cache lines from the working one.
                                for _ in 0..16 {
                                    std::hint::spin_loop();
                                }
                            }
                        }
                    });
                }
                // Set also when `f` panics, so the scope's waiting tasks end.
                struct Done<'a>(&'a AtomicBool);
                impl Drop for Done<'_> {
                    fn drop(&mut self) {
                        self.0.store(true, Ordering::Release);
                    }
                }
                let _done = Done(&done);
                f()
            })
        }))
    }

    /// The bytes the device counts for a buffer of `len` bytes that its pool of small buffers
    /// serves (whole lines); `None` above that size.
    fn small_counted(len: usize) -> Option<usize> {
        let lines = len.div_ceil(CPU_ALIGNMENT);
        (lines <= SMALL_LINES).then_some(lines * CPU_ALIGNMENT)
    }

    /// For a pool above this layer that keeps a dropped tensor whole to reuse it: stops
    /// counting its buffer of `len` bytes (at most 1 KiB) as in use, so memory statistics read
    /// as if it were freed. Takes the device, not the buffer, so that the pool need not lock
    /// the buffer to park it. The owner must call [`CpuBuffer::set_parked`] before the buffer
    /// drops parked, or [`CpuDevice::unpark_bytes`] when it takes it back into use. False, with
    /// nothing counted, for a larger buffer.
    #[inline]
    pub fn park_bytes(&self, len: usize) -> bool {
        let Some(bytes) = CpuDevice::small_counted(len) else {
            return false;
        };
        self.counters.release(bytes);
        true
    }

    /// Counts a buffer of `len` bytes parked by [`CpuDevice::park_bytes`] as in use again, as
    /// an allocation of it would: fails, with nothing counted, when the memory limit has no
    /// room for it (with `enforce_limit`; without it, counts it regardless).
    #[inline]
    pub fn unpark_bytes(&self, len: usize, enforce_limit: bool) -> Result<()> {
        let bytes = CpuDevice::small_counted(len).unwrap_or(0);
        if enforce_limit {
            self.counters.reserve(bytes, &CpuName(self.ordinal))
        } else {
            self.counters.reserve_unchecked(bytes);
            Ok(())
        }
    }

    /// Current memory figures.
    pub fn memory_stats(&self) -> MemoryStats {
        MemoryStats {
            bytes_cached: self.cached_bytes(),
            ..self.counters.snapshot()
        }
    }

    /// Sets or clears the memory limit. Allocations already made are kept even above it.
    pub fn set_memory_limit(&self, limit: Option<usize>) {
        self.counters.set_limit(limit);
    }

    /// Makes the peak equal to the bytes in use now.
    pub fn reset_peak(&self) {
        self.counters.reset_peak();
    }

    /// Allocates `bytes` zeroed, 64-byte aligned bytes on `device`, counted against its limit.
    #[inline]
    pub fn alloc_zeroed(device: &Arc<CpuDevice>, bytes: usize) -> Result<CpuBuffer> {
        CpuDevice::alloc(device, bytes, true)
    }

    /// Allocates `bytes` of 64-byte aligned memory whose contents are unspecified (old values of
    /// a reused buffer, or zeros): for outputs a kernel overwrites entirely. Never uninitialised.
    #[inline]
    pub fn alloc_for_overwrite(device: &Arc<CpuDevice>, bytes: usize) -> Result<CpuBuffer> {
        CpuDevice::alloc(device, bytes, false)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes of freed buffers held for reuse.
    pub fn cached_bytes(&self) -> usize {
        self.cache().bytes
    }

    /// Returns the buffers held for reuse to the system.
    pub fn empty_cache(&self) {
        let mut c = self.cache();
        c.free.clear();
        c.bytes = 0;
    }

    /// Checks, allocating nothing, that `bytes` could be allocated now: the limit (memory held
    /// for reuse aside, since an allocation gives it back first) and, for large requests, the
    /// host memory the system can still provide.
    pub fn check_alloc(&self, bytes: usize) -> Result<()> {
        self.check_config()?;
        let name = CpuName(self.ordinal);
        if bytes > MAX_ALLOC_BYTES {
            return Err(self.too_large(bytes));
        }
        self.counters.check(bytes, &name)?;
        if check_host_memory(bytes, String::new).is_err() {
            // As an allocation would: memory this device holds for reuse is given back first.
            self.empty_cache();
            check_host_memory(bytes, String::new)?;
        }
        Ok(())
    }

    /// The error for a request no allocation can satisfy.
    fn too_large(&self, bytes: usize) -> Error {
        Error::OutOfMemory {
            device: self.name(),
            requested: bytes,
            what: String::new(),
            in_use: self.counters.snapshot().bytes_in_use,
            limit: self.counters.limit(),
        }
    }

    /// Allocates from this thread's pool of small buffers when it can (inlined: a tiny op's
    /// whole cost is of this order), else takes [`CpuDevice::alloc_new`].
    #[inline]
    fn alloc(device: &Arc<CpuDevice>, bytes: usize, zeroed: bool) -> Result<CpuBuffer> {
        if device.config_error.is_none()
            && let Some(mut v) = take_small(bytes.div_ceil(CPU_ALIGNMENT))
        {
            device
                .counters
                .reserve(v.len() * CPU_ALIGNMENT, &CpuName(device.ordinal))?;
            if zeroed {
                v.fill(Line([0; CPU_ALIGNMENT]));
            }
            return Ok(CpuBuffer {
                mem: Mem::Lines(v),
                len: bytes,
                device: Arc::clone(device),
                parked: false,
            });
        }
        CpuDevice::alloc_new(device, bytes, zeroed)
    }

    /// Allocates from the cache of large buffers or the system.
    fn alloc_new(device: &Arc<CpuDevice>, bytes: usize, zeroed: bool) -> Result<CpuBuffer> {
        device.check_config()?;
        // Refused before any rounding below could overflow.
        if bytes > MAX_ALLOC_BYTES {
            return Err(device.too_large(bytes));
        }
        let lines = size_class(bytes.div_ceil(CPU_ALIGNMENT));
        let accounted = lines * CPU_ALIGNMENT;
        if accounted >= CACHE_MIN_BYTES {
            let mut c = device.cache();
            if let Some(mut v) = c.free.get_mut(&lines).and_then(|list| list.pop()) {
                c.bytes -= accounted;
                drop(c);
                // Held memory does not change (cached becomes in use), so the limit holds.
                device.counters.reserve_unchecked(accounted);
                if zeroed {
                    v.bytes_mut().fill(0);
                }
                return Ok(CpuBuffer {
                    mem: v,
                    len: bytes,
                    device: Arc::clone(device),
                    parked: false,
                });
            }
            // The limit covers memory held for reuse too: give cached buffers back first.
            if let Some(limit) = device.counters.limit() {
                let in_use = device.counters.snapshot().bytes_in_use;
                if in_use.saturating_add(c.bytes).saturating_add(accounted) > limit {
                    c.free.clear();
                    c.bytes = 0;
                }
            }
        }
        // The name is formatted only for an error: building it costs more than a small op.
        device
            .counters
            .reserve(accounted, &CpuName(device.ordinal))?;
        // The system may promise more than it can give (pages are only found when written, and
        // kernels write all of them): refuse what it cannot provide now, after giving back what
        // the cache holds.
        if check_host_memory(accounted, String::new).is_err() {
            device.empty_cache();
            if let Err(e) = check_host_memory(accounted, String::new) {
                device.counters.unreserve_failed(accounted);
                return Err(e);
            }
        }
        // Memory comes zeroed (large buffers as fresh mapped pages that cost nothing until
        // touched), and a refusal is an error, not an abort.
        let fresh = Mem::zeroed(lines).or_else(|()| {
            // The system refused: return cached memory and try once more.
            device.empty_cache();
            Mem::zeroed(lines)
        });
        match fresh {
            Ok(mem) => Ok(CpuBuffer {
                mem,
                len: bytes,
                device: Arc::clone(device),
                parked: false,
            }),
            Err(()) => {
                let in_use = device.counters.snapshot().bytes_in_use - accounted;
                device.counters.unreserve_failed(accounted);
                Err(Error::OutOfMemory {
                    device: device.name(),
                    requested: accounted,
                    what: String::new(),
                    in_use,
                    limit: device.counters.limit(),
                })
            }
        }
    }
}

/// Bytes on a CPU device: 64-byte aligned, counted in the device's memory statistics until
/// dropped.
pub struct CpuBuffer {
    mem: Mem,
    len: usize,
    device: Arc<CpuDevice>,
    /// Set when the buffer is kept for reuse by a pool above this layer
    /// ([`CpuBuffer::set_parked`]): its bytes are then not counted as in use.
    parked: bool,
}

impl fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuBuffer({} bytes on {})", self.len, self.device.name())
    }
}

impl CpuBuffer {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device that owns this memory.
    pub fn device(&self) -> &Arc<CpuDevice> {
        &self.device
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.mem.bytes()[..self.len]
    }

    /// The bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.mem.bytes_mut()[..self.len]
    }

    /// The contents as `T`s. The buffer is aligned for any `T`; a length that is not a multiple
    /// of `T`'s size, or a byte that is not a valid `T` (a bool other than 0 or 1), is an error.
    pub fn typed<T: Element>(&self) -> Result<&[T]> {
        let n = self.typed_len::<T>()?;
        let bytes = &self.mem.bytes()[..n * std::mem::size_of::<T>()];
        bytemuck::checked::try_cast_slice(bytes).map_err(|e| invalid::<T>(e))
    }

    /// The contents as writable `T`s.
    pub fn typed_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        let n = self.typed_len::<T>()?;
        let bytes = &mut self.mem.bytes_mut()[..n * std::mem::size_of::<T>()];
        bytemuck::checked::try_cast_slice_mut(bytes).map_err(|e| invalid::<T>(e))
    }

    /// Marks the buffer as parked by its owner ([`CpuDevice::park_bytes`]: its bytes are not
    /// counted as in use, so dropping it releases nothing) or, with false, as counted again
    /// ([`CpuDevice::unpark_bytes`]).
    #[inline]
    pub fn set_parked(&mut self, parked: bool) {
        debug_assert_eq!(
            CpuDevice::small_counted(self.len),
            Some(self.mem.lines() * CPU_ALIGNMENT)
        );
        self.parked = parked;
    }

    fn typed_len<T: Element>(&self) -> Result<usize> {
        let size = std::mem::size_of::<T>();
        if size == 0 || !self.len.is_multiple_of(size) {
            return Err(Error::InvalidData {
                context: "viewing a CPU buffer as typed values".into(),
                reason: format!(
                    "expected a length that is a multiple of {size} bytes, got {} bytes",
                    self.len
                ),
            });
        }
        Ok(self.len / size)
    }
}

fn invalid<T: Element>(e: bytemuck::checked::CheckedCastError) -> Error {
    Error::InvalidData {
        context: format!("viewing a CPU buffer as {}", T::DTYPE),
        reason: format!("{e} (bools must be 0 or 1)"),
    }
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        let bytes = self.mem.lines() * CPU_ALIGNMENT;
        if !self.parked {
            self.device.counters.release(bytes);
        }
        if let Mem::Lines(v) = &mut self.mem
            && keep_small(v)
        {
            return;
        }
        if bytes >= CACHE_MIN_BYTES {
            let mem = std::mem::replace(&mut self.mem, Mem::Lines(Vec::new()));
            let mut c = self.device.cache();
            c.bytes += bytes;
            c.free.entry(mem.lines()).or_default().push(mem);
        }
    }
}

/// A CPU device's name, formatted only when shown.
struct CpuName(usize);

impl fmt::Display for CpuName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => f.write_str("cpu"),
            n => write!(f, "cpu:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(limit: Option<usize>) -> Arc<CpuDevice> {
        Arc::new(
            CpuDevice::with_options(&CpuOptions {
                num_threads: Some(1),
                memory_limit: limit,
            })
            .unwrap(),
        )
    }

    #[test]
    fn buffers_are_aligned_zeroed_and_counted() {
        let d = fresh(None);
        let mut b = CpuDevice::alloc_zeroed(&d, 100).unwrap();
        assert_eq!(b.as_bytes().as_ptr() as usize % CPU_ALIGNMENT, 0);
        assert!(b.as_bytes().iter().all(|&x| x == 0));
        assert_eq!(d.memory_stats().bytes_in_use, 128);
        b.as_bytes_mut()[99] = 7;
        assert!(b.typed::<f32>().is_ok());
        assert!(b.typed::<f64>().is_err());
        drop(b);
        let s = d.memory_stats();
        assert_eq!(
            (s.bytes_in_use, s.peak_bytes_in_use, s.live_allocations),
            (0, 128, 0)
        );
    }

    #[test]
    fn small_buffers_are_reused_zeroed_counted_and_limited() {
        let d = fresh(Some(256));
        let mut a = CpuDevice::alloc_zeroed(&d, 100).unwrap();
        a.as_bytes_mut().fill(9);
        let at = a.as_bytes().as_ptr() as usize;
        drop(a);
        // The thread's pool hands the same memory back, zeroed when asked, counted again.
        let b = CpuDevice::alloc_zeroed(&d, 120).unwrap();
        assert_eq!(b.as_bytes().as_ptr() as usize, at);
        assert!(b.as_bytes().iter().all(|&x| x == 0));
        assert_eq!(b.len(), 120);
        let s = d.memory_stats();
        assert_eq!(
            (s.bytes_in_use, s.live_allocations, s.total_allocations),
            (128, 1, 2)
        );
        // A pooled buffer still counts against the limit.
        let c = CpuDevice::alloc_for_overwrite(&d, 128).unwrap();
        drop(c);
        let e = CpuDevice::alloc_for_overwrite(&d, 128 + 64).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
        let e = CpuDevice::alloc_for_overwrite(&d, 128 + 1).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
        drop(b);
        let s = d.memory_stats();
        assert_eq!(
            (s.bytes_in_use, s.live_allocations, s.total_allocations),
            (0, 0, 3)
        );
        // Buffers freed on another thread go to that thread's pool; nothing is lost.
        let moved = CpuDevice::alloc_zeroed(&d, 64).unwrap();
        std::thread::spawn(move || drop(moved)).join().unwrap();
        assert_eq!(d.memory_stats().bytes_in_use, 0);
    }

    #[test]
    fn over_limit_is_an_error_then_allocation_recovers() {
        let d = fresh(Some(1 << 20));
        let a = CpuDevice::alloc_zeroed(&d, 1 << 19).unwrap();
        let e = CpuDevice::alloc_zeroed(&d, 1 << 20).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("requested 1048576 bytes") && msg.contains("524288 bytes in use"),
            "{msg}"
        );
        drop(a);
        CpuDevice::alloc_zeroed(&d, 1 << 20).unwrap();
    }

    #[test]
    fn impossible_allocation_is_an_error_not_an_abort() {
        let d = fresh(None);
        let e = CpuDevice::alloc_zeroed(&d, usize::MAX / 2).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
        assert_eq!(d.memory_stats().bytes_in_use, 0);
    }

    #[test]
    fn sizes_near_the_address_space_are_errors() {
        let d = fresh(None);
        for bytes in [
            usize::MAX,
            usize::MAX - 63,
            isize::MAX as usize,
            1 << 62,
            1 << 50,
        ] {
            let e = CpuDevice::alloc_zeroed(&d, bytes).unwrap_err();
            assert!(
                matches!(e, Error::OutOfMemory { requested, .. } if requested >= bytes),
                "{bytes}: {e}"
            );
            assert!(d.check_alloc(bytes).is_err(), "{bytes}");
        }
        assert_eq!(d.memory_stats().bytes_in_use, 0);
        let d = fresh(Some(1000));
        d.check_alloc(1000).unwrap();
        let e = d.check_alloc(1001).unwrap_err();
        assert!(
            matches!(
                e,
                Error::OutOfMemory {
                    limit: Some(1000),
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(d.memory_stats().bytes_in_use, 0);
    }

    #[test]
    fn environment_sets_threads_and_limit() {
        let d = Arc::new(CpuDevice::from_env(|k| match k {
            ENV_NUM_THREADS => Some("3".into()),
            ENV_CPU_MEMORY_LIMIT => Some("1KiB".into()),
            _ => None,
        }));
        assert_eq!(d.num_threads(), 3);
        assert_eq!(d.memory_stats().bytes_limit, Some(1024));
        assert!(CpuDevice::alloc_zeroed(&d, 2048).is_err());
        assert!(CpuDevice::alloc_zeroed(&d, 1024).is_ok());
    }

    #[test]
    fn bad_environment_is_reported_on_use() {
        let d = Arc::new(CpuDevice::from_env(|k| {
            (k == ENV_CPU_MEMORY_LIMIT).then(|| "lots".to_string())
        }));
        let e = CpuDevice::alloc_zeroed(&d, 8).unwrap_err().to_string();
        assert!(
            e.contains("TPU_RS_CPU_MEMORY_LIMIT=\"lots\"") && e.contains("512MiB"),
            "{e}"
        );
        let d = Arc::new(CpuDevice::from_env(|k| {
            (k == ENV_NUM_THREADS).then(|| "0".to_string())
        }));
        let e = d.pool().unwrap_err().to_string();
        assert!(e.contains("TPU_RS_NUM_THREADS=\"0\""), "{e}");
    }

    #[test]
    fn freed_large_buffers_are_reused_and_the_limit_holds() {
        let d = fresh(Some(4 << 20));
        let a = CpuDevice::alloc_for_overwrite(&d, 1 << 20).unwrap();
        let p = a.as_bytes().as_ptr() as usize;
        drop(a);
        let s = d.memory_stats();
        assert_eq!(
            (s.bytes_in_use, s.bytes_cached, s.live_allocations),
            (0, 1 << 20, 0)
        );
        // A request of the same size class gets the same memory back.
        let mut b = CpuDevice::alloc_for_overwrite(&d, (1 << 20) - 100).unwrap();
        assert_eq!(b.as_bytes().as_ptr() as usize, p);
        assert_eq!(d.memory_stats().bytes_cached, 0);
        b.as_bytes_mut().fill(7);
        drop(b);
        // Zeroed requests see zeros even from the cache.
        let z = CpuDevice::alloc_zeroed(&d, 1 << 20).unwrap();
        assert!(z.as_bytes().iter().all(|&x| x == 0));
        drop(z);
        // The limit counts cached memory: a big request first empties the cache.
        let big = CpuDevice::alloc_for_overwrite(&d, 7 << 19).unwrap();
        assert_eq!(d.memory_stats().bytes_cached, 0);
        assert!(CpuDevice::alloc_for_overwrite(&d, 1 << 20).is_err());
        drop(big);
        d.empty_cache();
        assert_eq!(d.memory_stats().bytes_cached, 0);
        // Small buffers are not cached.
        drop(CpuDevice::alloc_zeroed(&d, 1000).unwrap());
        assert_eq!(d.memory_stats().bytes_cached, 0);
    }

    #[test]
    fn mapped_large_buffers_are_zeroed_aligned_counted_and_reused() {
        let d = fresh(None);
        let n = HUGE_MIN_BYTES + 100;
        let mut a = CpuDevice::alloc_zeroed(&d, n).unwrap();
        assert!(matches!(a.mem, Mem::Map(_)));
        assert_eq!(a.len(), n);
        assert_eq!(a.as_bytes().as_ptr() as usize % 4096, 0);
        assert!(a.as_bytes().iter().all(|&x| x == 0));
        a.typed_mut::<f32>().unwrap()[n / 4 - 1] = 1.5;
        assert_eq!(a.typed::<f32>().unwrap()[n / 4 - 1], 1.5);
        let accounted = size_class(n.div_ceil(CPU_ALIGNMENT)) * CPU_ALIGNMENT;
        assert_eq!(d.memory_stats().bytes_in_use, accounted);
        let p = a.as_bytes().as_ptr() as usize;
        a.as_bytes_mut().fill(9);
        drop(a);
        assert_eq!(d.memory_stats().bytes_cached, accounted);
        // Back from the cache, zeroed when asked.
        let b = CpuDevice::alloc_zeroed(&d, n).unwrap();
        assert_eq!(b.as_bytes().as_ptr() as usize, p);
        assert!(b.as_bytes().iter().all(|&x| x == 0));
        drop(b);
        d.empty_cache();
        let s = d.memory_stats();
        assert_eq!(
            (s.bytes_in_use, s.bytes_cached, s.live_allocations),
            (0, 0, 0)
        );
        // Below the threshold, heap lines.
        let c = CpuDevice::alloc_zeroed(&d, HUGE_MIN_BYTES / 2).unwrap();
        assert!(matches!(c.mem, Mem::Lines(_)));
    }

    #[test]
    fn size_classes_waste_little() {
        for lines in [1usize, 100, 1024, 1025, 5000, 1 << 20, (1 << 20) + 1] {
            let c = size_class(lines);
            assert!(
                c >= lines && (c - lines) * 8 <= lines.max(1024),
                "{lines} -> {c}"
            );
        }
    }

    #[test]
    fn pool_has_requested_threads() {
        let d = fresh(None);
        assert_eq!(d.install(rayon::current_num_threads).unwrap(), 1);
    }
}
