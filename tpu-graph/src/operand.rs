//! How capture and the fused mode recognise a tensor they have seen: by its storage and its
//! layout over it.

use std::sync::Arc;

use tpu_ops::tpu_tensor::{Layout, Tensor};

/// A storage and a layout.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    /// The storage's address (the holder keeps the storage alive, so it is not reused).
    pub storage: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

impl Key {
    /// The key of `t`.
    pub fn of(t: &Tensor) -> Key {
        Key::at(storage_id(t), t.layout())
    }

    /// The key of the view `layout` of the storage at `storage`.
    pub fn at(storage: usize, layout: &Layout) -> Key {
        Key {
            storage,
            shape: layout.shape.to_vec(),
            strides: layout.strides.to_vec(),
            offset: layout.offset,
        }
    }
}

/// The address of `t`'s storage.
pub(crate) fn storage_id(t: &Tensor) -> usize {
    Arc::as_ptr(t.storage()) as usize
}

/// True when `t` is its whole storage, in order.
pub(crate) fn is_whole(t: &Tensor) -> bool {
    t.is_contiguous() && t.offset() == 0 && t.numel() == t.storage().numel()
}
