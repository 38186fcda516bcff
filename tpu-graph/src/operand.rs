//! How capture and the fused mode recognise a tensor they have seen: by its storage and its
//! layout over it.

use std::sync::Arc;

use tpu_ops::tpu_tensor::Tensor;

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
    pub fn of(t: &Tensor) -> Key {
        let l = t.layout();
        Key {
            storage: storage_id(t),
            shape: l.shape.to_vec(),
            strides: l.strides.to_vec(),
            offset: l.offset,
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
