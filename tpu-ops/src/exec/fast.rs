//! Fast paths: kernels called without going through [`super::dispatch::run`], where the general
//! path's metas, type promotion, walk planning and op boxing cost more than the work itself.
//!
//! Every such path asks `may_skip_dispatch` first, so what makes skipping dispatch safe is
//! decided here, once. Each gives the bits dispatch would: float arithmetic on small dense f32
//! tensors of one shape or a tensor and a number (`small_dense_f32` in
//! `ops/elementwise/binary/cpu.rs`, comparisons included), the f32 unary ops on a small dense f32
//! tensor (the same in `ops/elementwise/unary/cpu.rs`), sum, mean and the extremes of one over
//! its last dim or every dim (`ops/reduce/cpu.rs`), and `linear` on a weight packed once
//! (`ops/linalg/packed.rs`).

use tpu_tensor::Tensor;
use tpu_tensor::tpu_runtime::Buffer;

/// True when ops on `inputs` may run without dispatch: every input lives on one native CPU
/// device, no dispatch hook watches this thread (a graph capture must see every op), and no
/// gradient is to be recorded. Connects the op library first, as dispatch does.
pub(crate) fn may_skip_dispatch(inputs: &[&Tensor]) -> bool {
    let Some(first) = inputs.first() else {
        return false;
    };
    let on_one_cpu =
        first.device().as_cpu().is_some() && inputs.iter().all(|t| t.device() == first.device());
    if !on_one_cpu || super::dispatch::hooked() {
        return false;
    }
    if crate::autograd::is_grad_enabled()
        && inputs.iter().any(|t| crate::autograd::requires_grad(t))
    {
        return false;
    }
    crate::init();
    true
}

/// The `n` elements of the dense f32 tensor `t`, read from `g`, its storage's CPU buffer;
/// `None` when they cannot be read so (then the fast path gives way to dispatch, which
/// reports why). An `Option`, not a `Result`: a `Result` carries the 96-byte error through
/// memory on every call, which costs more than the rest of this.
#[inline]
pub(crate) fn dense_f32<'g>(g: &'g Buffer, t: &Tensor, n: usize) -> Option<&'g [f32]> {
    let all = g.as_cpu()?.typed::<f32>().ok()?;
    all.get(t.offset()..t.offset() + n)
}
