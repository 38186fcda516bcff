//! The executors of a graph: [`native`] on the native CPU device, [`pjrt`] as one program on a
//! PJRT device.

pub mod native;
pub mod pjrt;
