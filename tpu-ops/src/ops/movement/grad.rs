//! Pieces that several movement backward rules share: placing a slice of the gradient inside a
//! larger one, and detaching a slice from the gradient it came from.

use tpu_tensor::{Result, Scalar, Tensor};

use super::{MovementOps, PadMode};

/// `t` with `lo` zeros before and `hi` zeros after it along dim `d` (a constant
/// [`Pad`](super::Pad)): how the backward rules place a slice of the gradient at its position in
/// a larger one, and how `torch.fft`'s sizes lengthen a signal.
pub(crate) fn zero_pad_dim(t: &Tensor, d: usize, lo: usize, hi: usize) -> Result<Tensor> {
    if lo + hi == 0 {
        return Ok(t.clone());
    }
    let r = t.rank();
    let mut pads = vec![0; 2 * (r - d)];
    pads[2 * (r - 1 - d)] = lo;
    pads[2 * (r - 1 - d) + 1] = hi;
    t.pad(&pads, PadMode::Constant(Scalar::Int(0)))
}

/// A dense copy of a slice of the gradient, so a leaf's `.grad` never aliases the gradient of
/// another input (optimizers update `.grad` in place).
pub(super) fn own(t: Tensor) -> Result<Tensor> {
    if t.is_contiguous() && t.offset() == 0 && t.numel() == t.storage().numel() {
        Ok(t)
    } else {
        t.copy()
    }
}
