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
