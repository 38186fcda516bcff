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
    live: AtomicUsize,
    total: AtomicU64,
    /// `usize::MAX` means no limit.
    limit: AtomicUsize,
}

impl MemoryCounters {
    pub(crate) fn new(limit: Option<usize>) -> Self {
        MemoryCounters {
            in_use: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            total: AtomicU64::new(0),
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
    pub(crate) fn reserve(&self, bytes: usize, device: &dyn fmt::Display) -> Result<()> {
        let before = self.in_use.fetch_add(bytes, Ordering::AcqRel);
        let after = before.saturating_add(bytes);
        let limit = self.limit.load(Ordering::Relaxed);
        if after > limit || before.checked_add(bytes).is_none() {
            self.in_use.fetch_sub(bytes, Ordering::AcqRel);
            return Err(Error::OutOfMemory {
                device: device.to_string(),
                requested: bytes,
                in_use: before,
                limit: self.limit(),
            });
        }
        self.peak.fetch_max(after, Ordering::AcqRel);
        self.live.fetch_add(1, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Counts memory that already exists (such as an execution's outputs), limit or not.
    pub(crate) fn reserve_unchecked(&self, bytes: usize) {
        let after = self.in_use.fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.peak.fetch_max(after, Ordering::AcqRel);
        self.live.fetch_add(1, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
    }

    /// Undoes a reservation whose allocation then failed, without counting an allocation.
    pub(crate) fn unreserve_failed(&self, bytes: usize) {
        self.in_use.fetch_sub(bytes, Ordering::AcqRel);
        self.live.fetch_sub(1, Ordering::Relaxed);
        self.total.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn release(&self, bytes: usize) {
        self.in_use.fetch_sub(bytes, Ordering::AcqRel);
        self.live.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn reset_peak(&self) {
        self.peak
            .store(self.in_use.load(Ordering::Acquire), Ordering::Release);
    }

    pub(crate) fn snapshot(&self) -> MemoryStats {
        MemoryStats {
            bytes_in_use: self.in_use.load(Ordering::Acquire),
            peak_bytes_in_use: self.peak.load(Ordering::Acquire),
            live_allocations: self.live.load(Ordering::Relaxed),
            total_allocations: self.total.load(Ordering::Relaxed),
            bytes_limit: self.limit(),
            bytes_cached: 0,
            source: MemorySource::Allocator,
        }
    }
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
    fn counters_enforce_limit_and_track_peak() {
        let c = MemoryCounters::new(Some(100));
        c.reserve(60, &"cpu").unwrap();
        let e = c.reserve(50, &"cpu").unwrap_err();
        assert!(matches!(
            e,
            Error::OutOfMemory {
                requested: 50,
                in_use: 60,
                limit: Some(100),
                ..
            }
        ));
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
