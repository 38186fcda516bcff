//! Memory accounting shared by every device kind, and memory-size parsing.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::error::{Error, Result};

/// Where a device's memory figures come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemorySource {
    /// tpu-rs's own allocator (the native CPU device): every byte is counted.
    #[default]
    Allocator,
    /// The PJRT plugin's own report of the device.
    Plugin,
    /// The plugin reports no figures; these count the buffers tpu-rs holds on the device.
    TrackedBuffers,
}

/// A snapshot of one device's memory figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held by live allocations.
    pub bytes_in_use: usize,
    /// The largest `bytes_in_use` seen since creation or the last `reset_peak`.
    pub peak_bytes_in_use: usize,
    /// Allocations alive now.
    pub live_allocations: usize,
    /// Allocations made since the device was created.
    pub total_allocations: u64,
    /// The limit in force, if any. It covers memory in use plus memory held for reuse.
    pub bytes_limit: Option<usize>,
    /// Bytes of freed buffers the device holds for reuse (`empty_cache` returns them).
    pub bytes_cached: usize,
    /// Where the figures come from.
    pub source: MemorySource,
}

fn human(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

impl fmt::Display for MemoryStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "in use {} ({} allocations live), peak {}, cached {}, {} allocations made, limit {}",
            human(self.bytes_in_use),
            self.live_allocations,
            human(self.peak_bytes_in_use),
            human(self.bytes_cached),
            self.total_allocations,
            self.bytes_limit.map_or_else(|| "none".to_string(), human)
        )?;
        match self.source {
            MemorySource::Allocator => Ok(()),
            MemorySource::Plugin => write!(f, " (reported by the PJRT plugin)"),
            MemorySource::TrackedBuffers => write!(
                f,
                " (the plugin reports no memory statistics; these count the buffers tpu-rs holds)"
            ),
        }
    }
}

/// Lock-free counters behind [`MemoryStats`], with an optional limit.
#[derive(Debug)]
pub(crate) struct MemoryCounters {
    in_use: AtomicUsize,
    peak: AtomicUsize,
    /// Allocations made and freed: live ones are the difference, so an allocation and a free
    /// each touch one count (they are on every tiny op's path).
    total: AtomicU64,
    freed: AtomicU64,
    /// `usize::MAX` means no limit.
    limit: AtomicUsize,
}

impl MemoryCounters {
    pub(crate) fn new(limit: Option<usize>) -> Self {
        MemoryCounters {
            in_use: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            total: AtomicU64::new(0),
            freed: AtomicU64::new(0),
            limit: AtomicUsize::new(limit.unwrap_or(usize::MAX)),
        }
    }

    pub(crate) fn limit(&self) -> Option<usize> {
        match self.limit.load(Ordering::Relaxed) {
            usize::MAX => None,
            l => Some(l),
        }
    }

    pub(crate) fn set_limit(&self, limit: Option<usize>) {
        self.limit
            .store(limit.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    /// Reserves `bytes` against the limit. On failure nothing stays reserved.
    #[inline]
    pub(crate) fn reserve(&self, bytes: usize, device: &dyn fmt::Display) -> Result<()> {
        let before = self.in_use.fetch_add(bytes, Ordering::AcqRel);
        let limit = self.limit.load(Ordering::Relaxed);
        match before.checked_add(bytes) {
            Some(after) if after <= limit => {
                self.raise_peak(after);
                self.total.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(self.refuse(before, bytes, device)),
        }
    }

    /// Takes back a reservation past the limit and says why.
    #[cold]
    fn refuse(&self, before: usize, bytes: usize, device: &dyn fmt::Display) -> Error {
        self.in_use.fetch_sub(bytes, Ordering::AcqRel);
        Error::OutOfMemory {
            device: device.to_string(),
            requested: bytes,
            what: String::new(),
            in_use: before,
            limit: self.limit(),
        }
    }

    /// Checks that `bytes` more would fit under the limit now, reserving nothing: for work that
    /// must know before it starts (an execution whose outputs the device allocates, host memory
    /// staged for an upload).
    pub(crate) fn check(&self, bytes: usize, device: &dyn fmt::Display) -> Result<()> {
        let limit = self.limit.load(Ordering::Relaxed);
        let in_use = self.in_use.load(Ordering::Acquire);
        if in_use.checked_add(bytes).is_none_or(|after| after > limit) {
            return Err(Error::OutOfMemory {
                device: device.to_string(),
                requested: bytes,
                what: String::new(),
                in_use,
                limit: self.limit(),
            });
        }
        Ok(())
    }

    /// Counts memory that already exists (such as an execution's outputs), limit or not.
    pub(crate) fn reserve_unchecked(&self, bytes: usize) {
        let after = self.in_use.fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.raise_peak(after);
        self.total.fetch_add(1, Ordering::Relaxed);
    }

    /// Raises the peak to `after`; a read first, since the peak is rarely passed and a
    /// read-modify-write costs more than the allocation it counts.
    #[inline]
    fn raise_peak(&self, after: usize) {
        if after > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(after, Ordering::AcqRel);
        }
    }

    /// Undoes a reservation whose allocation then failed, without counting an allocation.
    pub(crate) fn unreserve_failed(&self, bytes: usize) {
        self.in_use.fetch_sub(bytes, Ordering::AcqRel);
        self.total.fetch_sub(1, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn release(&self, bytes: usize) {
        self.in_use.fetch_sub(bytes, Ordering::AcqRel);
        self.freed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn reset_peak(&self) {
        self.peak
            .store(self.in_use.load(Ordering::Acquire), Ordering::Release);
    }

    pub(crate) fn snapshot(&self) -> MemoryStats {
        MemoryStats {
            bytes_in_use: self.in_use.load(Ordering::Acquire),
            peak_bytes_in_use: self.peak.load(Ordering::Acquire),
            live_allocations: {
                // Freed first: a free read after the total could be of an allocation the
                // total read missed.
                let freed = self.freed.load(Ordering::Relaxed);
                self.total.load(Ordering::Relaxed).saturating_sub(freed) as usize
            },
            total_allocations: self.total.load(Ordering::Relaxed),
            bytes_limit: self.limit(),
            bytes_cached: 0,
            source: MemorySource::Allocator,
        }
    }
}

/// Host memory as the system reports it, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostMemory {
    /// Physical memory plus swap, at most the control group's memory limit when one is set.
    pub total: usize,
    /// What the system can still provide without failing: available memory plus free swap,
    /// at most `total`.
    pub available: usize,
}

/// The host's memory figures, or `None` where the system does not report them (they are read
/// from Linux's `/proc/meminfo` and control-group limit).
pub fn host_memory() -> Option<HostMemory> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text, cgroup_limit())
}

fn parse_meminfo(text: &str, cgroup_limit: Option<usize>) -> Option<HostMemory> {
    let field = |name: &str| -> Option<usize> {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let kib: usize = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
            Some(kib.saturating_mul(1024))
        })
    };
    let total = field("MemTotal")?.saturating_add(field("SwapTotal").unwrap_or(0));
    let available = field("MemAvailable")?.saturating_add(field("SwapFree").unwrap_or(0));
    let total = cgroup_limit.map_or(total, |l| total.min(l));
    Some(HostMemory {
        total,
        available: available.min(total),
    })
}

/// The memory limit of this process's control group (v2, then v1), if one is set.
fn cgroup_limit() -> Option<usize> {
    [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    // `max` (v2) does not parse; v1 writes a number near i64::MAX, larger than any memory.
    .and_then(|t| t.trim().parse::<usize>().ok())
}

/// Requests smaller than this skip the host-memory check: reading the system's figures costs
/// more than allocating them, and no single one of them can exhaust a machine.
pub const HOST_CHECK_MIN_BYTES: usize = 64 << 20;

/// Checks that the system can still provide `bytes` of host memory, so that memory that will
/// be written in full is refused with an error instead of failing (or being killed) while it is
/// written. `what` names the use, for the error. Requests under [`HOST_CHECK_MIN_BYTES`], and
/// any on a system that reports no figures, pass.
pub fn check_host_memory(bytes: usize, what: impl FnOnce() -> String) -> Result<()> {
    if bytes < HOST_CHECK_MIN_BYTES {
        return Ok(());
    }
    match host_memory() {
        Some(m) if bytes > m.available => Err(host_oom(bytes, what(), Some(m))),
        _ => Ok(()),
    }
}

fn host_oom(bytes: usize, what: String, m: Option<HostMemory>) -> Error {
    Error::OutOfMemory {
        device: "host".into(),
        requested: bytes,
        what,
        in_use: m.map_or(0, |m| m.total - m.available),
        // Without figures, the system itself refused.
        limit: m.map(|m| m.total),
    }
}

/// A host vector of `n` copies of `value`, for staging and scratch memory sized by user input:
/// the byte count is checked for overflow (an [`Error::Shape`]) and against the host memory the
/// system can provide, and an allocation the system refuses is an [`Error::OutOfMemory`], never
/// an abort. `what` names the use, for the error.
pub fn try_host_vec<T: Clone>(n: usize, value: T, what: impl Fn() -> String) -> Result<Vec<T>> {
    let mut v = try_host_capacity::<T>(n, &what)?;
    v.resize(n, value);
    Ok(v)
}

/// An empty host vector with room for `n` values, checked as [`try_host_vec`] checks.
pub fn try_host_capacity<T>(n: usize, what: impl Fn() -> String) -> Result<Vec<T>> {
    let bytes = n
        .checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::shape(
                "allocate",
                format!(
                    "{n} values of {} bytes for {} are more than the address space holds",
                    std::mem::size_of::<T>(),
                    what()
                ),
            )
        })?;
    check_host_memory(bytes, &what)?;
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| host_oom(bytes, what(), host_memory()))?;
    Ok(v)
}

/// Parses a memory size: a plain byte count (`1073741824`), or a number with a unit. `KiB`,
/// `MiB`, `GiB`, `TiB` (and the bare `K`, `M`, `G`, `T`) are powers of 1024; `KB`, `MB`, `GB`, `TB`
/// are powers of 1000. Case-insensitive; fractions such as `1.5GiB` are allowed.
pub fn parse_memory_size(text: &str) -> Result<usize> {
    let bad = || Error::InvalidMemorySize {
        given: text.to_string(),
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(bad());
    }
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(bad()),
    };
    if !num.contains('.') && mult == 1.0 {
        return num.parse::<usize>().map_err(|_| bad());
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let bytes = (v * mult).round();
    if !bytes.is_finite() || bytes < 0.0 || bytes > usize::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_memory_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_memory_size("512m").unwrap(), 512 << 20);
        assert_eq!(parse_memory_size("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_memory_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_memory_size(" 4096 ").unwrap(), 4096);
        for bad in ["", "MiB", "12XB", "-5", "1.2.3G"] {
            let e = parse_memory_size(bad).unwrap_err().to_string();
            assert!(e.contains("512MiB"), "{e}");
        }
    }

    #[test]
    fn meminfo_parses_and_caps() {
        let text = "MemTotal:       1000 kB\nMemFree: 10 kB\nMemAvailable:    600 kB\n\
                    SwapTotal: 100 kB\nSwapFree: 50 kB\n";
        assert_eq!(
            parse_meminfo(text, None),
            Some(HostMemory {
                total: 1100 * 1024,
                available: 650 * 1024
            })
        );
        assert_eq!(
            parse_meminfo(text, Some(500 * 1024)),
            Some(HostMemory {
                total: 500 * 1024,
                available: 500 * 1024
            })
        );
        assert_eq!(parse_meminfo("MemTotal: 5 kB\n", None), None);
    }

    #[test]
    fn host_vectors_fail_with_errors() {
        let v = try_host_vec(3, 7u16, || "test".into()).unwrap();
        assert_eq!(v, [7, 7, 7]);
        let e = try_host_vec(usize::MAX / 2, 0u32, || "scratch".into()).unwrap_err();
        assert!(
            matches!(&e, Error::Shape { reason, .. } if reason.contains("scratch")),
            "{e}"
        );
        // More than any machine has (2^50 bytes): refused before anything is allocated.
        let e = try_host_vec(1usize << 47, 0u64, || "scratch".into()).unwrap_err();
        assert!(
            matches!(&e, Error::OutOfMemory { device, what, .. } if device == "host" && what == "scratch"),
            "{e}"
        );
    }

    /// Counters limited to 100 bytes with 60 reserved.
    fn sixty_of_a_hundred() -> MemoryCounters {
        let c = MemoryCounters::new(Some(100));
        c.reserve(60, &"cpu").unwrap();
        c
    }

    /// Asserts that `e` refuses `requested` bytes with 60 of 100 in use.
    fn assert_refused(e: Error, requested: usize) {
        assert!(
            matches!(
                e,
                Error::OutOfMemory {
                    requested: r,
                    in_use: 60,
                    limit: Some(100),
                    ..
                } if r == requested
            ),
            "{e}"
        );
    }

    #[test]
    fn check_reserves_nothing() {
        let c = sixty_of_a_hundred();
        c.check(40, &"cpu").unwrap();
        assert_refused(c.check(41, &"cpu").unwrap_err(), 41);
        assert!(c.check(usize::MAX, &"cpu").is_err());
        assert_eq!(c.snapshot().bytes_in_use, 60);
    }

    #[test]
    fn counters_enforce_limit_and_track_peak() {
        let c = sixty_of_a_hundred();
        assert_refused(c.reserve(50, &"cpu").unwrap_err(), 50);
        c.reserve(40, &"cpu").unwrap();
        assert_eq!(c.snapshot().peak_bytes_in_use, 100);
        c.release(60);
        c.reset_peak();
        let s = c.snapshot();
        assert_eq!(
            (s.bytes_in_use, s.peak_bytes_in_use, s.live_allocations),
            (40, 40, 1)
        );
        assert_eq!(s.total_allocations, 2);
    }
}
