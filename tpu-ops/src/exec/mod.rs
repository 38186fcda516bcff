//! Running ops: [`dispatch`] (device checks, the shape rule, the interception hook, then the CPU
//! kernel or PJRT), [`pjrt`], the eager path that compiles one op into one cached program, and
//! [`fast`], the one gate of the paths that skip dispatch.

pub mod dispatch;
pub mod fast;
pub(crate) mod hook;
pub mod pjrt;
