//! Slice-level f32 forms of the elementwise kernels, for kernels that run several ops in one
//! pass over memory (the graph layer's fused kernels): each runs the function, and the loop
//! compiled for the instruction set, that the op's own f32 kernel runs, so a fused program
//! gives the bits of the ops run one by one.

use tpu_tensor::{Error, Result};

use super::binary::{self, BinaryKind};
use super::unary::{self, UnaryKind};

/// An operand of a binary step: a run of elements, or one number broadcast over the run.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    /// As many elements as the output.
    Slice(&'a [f32]),
    /// One value for every element.
    Scalar(f32),
}

impl Operand<'_> {
    fn fits(&self, n: usize) -> bool {
        match self {
            Operand::Slice(s) => s.len() == n,
            Operand::Scalar(_) => true,
        }
    }
}

/// True when [`unary_f32`] runs `kind`: every unary op whose f32 result is f32 (not the
/// bool-valued tests such as `isnan`).
pub fn unary_fuses(kind: UnaryKind) -> bool {
    unary::fuses_f32(kind)
}

/// `out[i] = kind(src[i])`, with the bits of the op's f32 kernel.
pub fn unary_f32(kind: UnaryKind, src: &[f32], out: &mut [f32]) -> Result<()> {
    if !unary_fuses(kind) {
        return Err(unsupported(&format!("{kind:?}")));
    }
    if src.len() != out.len() {
        return Err(lengths(src.len(), out.len()));
    }
    unary::f32_slice(kind, src, out);
    Ok(())
}

/// True when [`binary_f32`] runs `kind`: the float arithmetic kinds (`add`, `sub`, `mul`, `div`,
/// `floor_divide`, `div_trunc`, `remainder`, `pow`, `maximum`, `minimum`, `atan2`), not the
/// comparisons, logical or bitwise ones.
pub fn binary_fuses(kind: BinaryKind) -> bool {
    binary::fuses_f32(kind)
}

/// `out[i] = kind(a[i], b[i])`, a scalar operand standing for every element, with the bits of
/// the op's f32 kernel.
pub fn binary_f32(kind: BinaryKind, a: Operand<'_>, b: Operand<'_>, out: &mut [f32]) -> Result<()> {
    if !binary_fuses(kind) {
        return Err(unsupported(kind.name()));
    }
    for x in [&a, &b] {
        if !x.fits(out.len()) {
            let n = match x {
                Operand::Slice(s) => s.len(),
                Operand::Scalar(_) => 1,
            };
            return Err(lengths(n, out.len()));
        }
    }
    binary::f32_operands(kind, a, b, out);
    Ok(())
}

/// The condition of a `where` step: a run of bools, or one for every element.
#[derive(Clone, Copy, Debug)]
pub enum Cond<'a> {
    /// As many elements as the output.
    Slice(&'a [bool]),
    /// One value for every element.
    Scalar(bool),
}

/// `out[i] = if cond[i] { a[i] } else { b[i] }`, as `where` picks (a choice, no arithmetic: the
/// operands' bits are kept).
pub fn where_f32(cond: Cond<'_>, a: Operand<'_>, b: Operand<'_>, out: &mut [f32]) -> Result<()> {
    let n = out.len();
    if let Cond::Slice(c) = cond
        && c.len() != n
    {
        return Err(lengths(c.len(), n));
    }
    for x in [&a, &b] {
        if let Operand::Slice(s) = x
            && s.len() != n
        {
            return Err(lengths(s.len(), n));
        }
    }
    match cond {
        Cond::Scalar(c) => match if c { a } else { b } {
            Operand::Slice(s) => out.copy_from_slice(s),
            Operand::Scalar(v) => out.fill(v),
        },
        // One loop per pair of operand forms, so none branches on them per element.
        Cond::Slice(c) => match (a, b) {
            (Operand::Slice(a), Operand::Slice(b)) => {
                for (((o, &k), &x), &y) in out.iter_mut().zip(c).zip(a).zip(b) {
                    *o = if k { x } else { y };
                }
            }
            (Operand::Slice(a), Operand::Scalar(y)) => {
                for ((o, &k), &x) in out.iter_mut().zip(c).zip(a) {
                    *o = if k { x } else { y };
                }
            }
            (Operand::Scalar(x), Operand::Slice(b)) => {
                for ((o, &k), &y) in out.iter_mut().zip(c).zip(b) {
                    *o = if k { x } else { y };
                }
            }
            (Operand::Scalar(x), Operand::Scalar(y)) => {
                for (o, &k) in out.iter_mut().zip(c) {
                    *o = if k { x } else { y };
                }
            }
        },
    }
    Ok(())
}

fn unsupported(kind: &str) -> Error {
    Error::invalid_argument(
        "fused elementwise",
        format!("{kind} has no f32 slice kernel"),
    )
}

fn lengths(given: usize, out: usize) -> Error {
    Error::invalid_argument(
        "fused elementwise",
        format!("an operand of {given} elements for an output of {out}"),
    )
}
