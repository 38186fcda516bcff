//! The native CPU backend: typed access to inputs and fresh outputs, strided and broadcast walks,
//! the parallel split over the device's thread pool ([`kernels`]), the instruction-set level
//! ([`isa`]), vectorisable f32 elementary functions ([`math`]) and the hand-written SIMD kernels
//! ([`simd`]), and the one vocabulary of compute types ([`float`]). The op families' `cpu.rs`
//! files are built from these pieces. All unsafe code of tpu-ops lives in this folder, each block
//! with a `// SAFETY:` line.

pub mod float;
pub mod isa;
pub mod kernels;
pub mod math;
pub mod simd;

use tpu_tensor::{Device, Result};

/// Runs `f`, a sequence of many small ops on `device`, on a thread of the native CPU device's
/// pool: each op's kernel then starts on a thread already awake instead of being handed over
/// from the calling thread and waited for (at a few microseconds per hand-off, that is most
/// of a decode step of a small model), and the pool's other threads wait for its parallel
/// tasks awake ([`tpu_tensor::tpu_runtime::cpu::CpuDevice::install_awake`]). Grad mode is carried over. Anything else runs `f`
/// here: another device, or a calling thread whose ops a dispatch hook or write observer sees
/// (a trace, a fused scope), since those belong to this thread.
pub fn on_device_threads<R: Send>(
    device: &Device,
    f: impl FnOnce() -> Result<R> + Send,
) -> Result<R> {
    let here = crate::exec::dispatch::hooked() || tpu_tensor::observe::observing();
    match device.as_cpu() {
        Some(cpu) if !here => {
            let grad = crate::autograd::is_grad_enabled();
            cpu.install_awake(move || {
                let _mode = match grad {
                    true => crate::autograd::enable_grad(),
                    false => crate::autograd::no_grad(),
                };
                f()
            })?
        }
        _ => f(),
    }
}
