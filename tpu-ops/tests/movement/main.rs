//! The movement ops (join, index, mask, order) and views: values, device checks, gradients, and
//! gradients through random chains of views.
//!
//! One test binary per family, so CI links the whole stack once per family rather than once per
//! file; `cargo test --test movement <module>::` runs one part.

#[path = "../common/mod.rs"]
mod common;

mod bag;
mod forward;
mod grad;
mod view_chains;
