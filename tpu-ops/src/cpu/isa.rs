//! Which vector instruction sets the native CPU kernels may use, detected once at run time.
//!
//! The crates build for plain x86-64 (SSE2), so code that wants AVX2 or AVX-512 lives in
//! `#[target_feature]` functions that are only called after [`level`] says the processor has
//! those features. Every SIMD kernel module asks here, so one cap ([`force_level`]) switches
//! them all, which is how the tests run the portable fallbacks on a machine that has AVX-512.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

/// The instruction-set levels the kernels have versions for, in increasing order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Plain Rust for the build target.
    Portable = 0,
    /// AVX2 with FMA and F16C.
    Avx2 = 1,
    /// AVX-512 F, BW, DQ and VL, on top of AVX2, FMA and F16C.
    Avx512 = 2,
}

impl Level {
    fn from_u8(v: u8) -> Level {
        match v {
            2 => Level::Avx512,
            1 => Level::Avx2,
            _ => Level::Portable,
        }
    }
}

const UNKNOWN: u8 = u8::MAX;
static DETECTED: AtomicU8 = AtomicU8::new(UNKNOWN);
static BF16: AtomicU8 = AtomicU8::new(UNKNOWN);
static CAP: AtomicU8 = AtomicU8::new(Level::Avx512 as u8);
static CAP_LOCK: Mutex<()> = Mutex::new(());

fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        if avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
        {
            return Level::Avx512;
        }
        if avx2 {
            return Level::Avx2;
        }
    }
    Level::Portable
}

/// The widest level this processor supports, whatever the cap.
pub fn detected_level() -> Level {
    let mut d = DETECTED.load(Ordering::Relaxed);
    if d == UNKNOWN {
        d = detect() as u8;
        DETECTED.store(d, Ordering::Relaxed);
    }
    Level::from_u8(d)
}

/// The level the kernels run at now: the detected one, capped by [`force_level`].
#[inline]
pub fn level() -> Level {
    detected_level().min(Level::from_u8(CAP.load(Ordering::Relaxed)))
}

/// Whether the bf16 dot-product instruction (`vdpbf16ps`, AVX512_BF16) may be used now: the
/// processor has it and the level is [`Level::Avx512`].
pub fn has_avx512_bf16() -> bool {
    if level() < Level::Avx512 {
        return false;
    }
    let mut b = BF16.load(Ordering::Relaxed);
    if b == UNKNOWN {
        #[cfg(target_arch = "x86_64")]
        let has = is_x86_feature_detected!("avx512bf16");
        #[cfg(not(target_arch = "x86_64"))]
        let has = false;
        b = has as u8;
        BF16.store(b, Ordering::Relaxed);
    }
    b == 1
}

/// Caps the level of every kernel for the whole process; a cap above what the processor
/// supports runs what it supports. For tests and benchmarks: prefer [`with_level`].
#[doc(hidden)]
pub fn force_level(cap: Level) {
    CAP.store(cap as u8, Ordering::Relaxed);
}

/// Runs `f` with the kernels capped at `cap`, then lifts the cap. Callers are serialised, so
/// two tests comparing levels do not undo each other's cap; kernels running meanwhile on
/// other threads may run at either level, which is harmless because every level is correct.
#[doc(hidden)]
pub fn with_level<R>(cap: Level, f: impl FnOnce() -> R) -> R {
    let _guard = CAP_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    force_level(cap);
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            force_level(Level::Avx512);
        }
    }
    let _restore = Restore;
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_limits_level() {
        with_level(Level::Portable, || {
            assert_eq!(level(), Level::Portable);
            assert!(!has_avx512_bf16());
        });
        with_level(Level::Avx512, || assert_eq!(level(), detected_level()));
    }
}
