//! PyTorch's type promotion.
//!
//! `promote_types` is PyTorch's lattice for two dtypes; `result_type` is `torch.result_type`
//! over operands of three priorities: tensors with dims, zero-dim tensors, and Rust numbers.
//! A lower-priority operand changes the result only when its category (bool < integer <
//! float) is higher. tpu-rs has no i16, so where PyTorch gives int16 (u8 with i8) the result is
//! i32.

use tpu_tensor::DType;

use crate::op::Meta;

fn category(d: DType) -> u8 {
    match d {
        DType::Bool => 0,
        d if d.is_int() => 1,
        _ => 2,
    }
}

/// The smallest dtype both `a` and `b` convert to without losing range, as PyTorch's
/// `promote_types`.
pub fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    match (a, b) {
        (Bool, x) | (x, Bool) => x,
        (U8, I8) | (I8, U8) => I32,
        (F16, BF16) | (BF16, F16) => F32,
        (x, y) if x.is_float() && !y.is_float() => x,
        (x, y) if y.is_float() && !x.is_float() => y,
        // Same category: the later one in DType's order is the wider one.
        (x, y) => x.max(y),
    }
}

/// The default dtype of a Rust number of `d`'s category: bool, i64, or f32.
fn number_dtype(d: DType) -> DType {
    match category(d) {
        0 => DType::Bool,
        1 => DType::I64,
        _ => DType::F32,
    }
}

/// Combines the results of two priority tiers, `higher` taking precedence, as PyTorch's
/// `combine_categories`: the lower tier only matters when it brings a higher category.
fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    match (higher, lower) {
        (Some(h), _) if h.is_float() => Some(h),
        (Some(h), Some(l)) if h == DType::Bool || l.is_float() => Some(promote_types(h, l)),
        (Some(h), _) => Some(h),
        (None, l) => l,
    }
}

/// `torch.result_type` over the operands' metas.
pub fn result_type(operands: &[Meta]) -> DType {
    let mut tiers: [Option<DType>; 3] = [None, None, None];
    for m in operands {
        let (tier, d) = if m.number {
            (2, number_dtype(m.dtype))
        } else if m.shape.is_empty() {
            (1, m.dtype)
        } else {
            (0, m.dtype)
        };
        tiers[tier] = Some(tiers[tier].map_or(d, |t| promote_types(t, d)));
    }
    combine(tiers[0], combine(tiers[1], tiers[2])).unwrap_or(DType::F32)
}

/// The dtype kernels compute in: f32 for the 16-bit floats (as PyTorch's "opmath"), the dtype
/// itself otherwise.
pub fn compute_dtype(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// The float dtype an op that always returns floats (true division, `sqrt` of ints, `mean`)
/// gives for `d`: `d` itself if it is a float, f32 otherwise.
pub fn float_result(d: DType) -> DType {
    if d.is_float() { d } else { DType::F32 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    fn t(shape: &[usize], d: DType) -> Meta {
        Meta::new(shape, d)
    }

    fn n(d: DType) -> Meta {
        Meta {
            number: true,
            ..Meta::new(&[], d)
        }
    }

    #[test]
    fn lattice() {
        assert_eq!(promote_types(I32, F16), F16);
        assert_eq!(promote_types(BF16, F16), F32);
        assert_eq!(promote_types(U8, I8), I32);
        assert_eq!(promote_types(Bool, U8), U8);
        assert_eq!(promote_types(I64, I32), I64);
        assert_eq!(promote_types(F32, F64), F64);
    }

    #[test]
    fn result_type_matches_pytorch() {
        // torch.result_type(torch.ones(2, dtype=torch.bfloat16), 2.5) -> torch.bfloat16
        assert_eq!(result_type(&[t(&[2], BF16), n(F64)]), BF16);
        // torch.result_type(torch.ones(2, dtype=torch.int32), 2.5) -> torch.float32
        assert_eq!(result_type(&[t(&[2], I32), n(F64)]), F32);
        // torch.result_type(torch.ones(2, dtype=torch.int32), 7) -> torch.int32
        assert_eq!(result_type(&[t(&[2], I32), n(I64)]), I32);
        // torch.result_type(torch.ones(2, dtype=torch.float32), torch.tensor(1., dtype=torch.float64)) -> float32
        assert_eq!(result_type(&[t(&[2], F32), t(&[], F64)]), F32);
        // torch.result_type(torch.ones(2, dtype=torch.int32), torch.tensor(1., dtype=torch.float64)) -> float64
        assert_eq!(result_type(&[t(&[2], I32), t(&[], F64)]), F64);
        // torch.result_type(torch.tensor(1, dtype=torch.int8), torch.tensor(1, dtype=torch.int64)) -> int64
        assert_eq!(result_type(&[t(&[], I8), t(&[], I64)]), I64);
        // torch.result_type(torch.ones(2, dtype=torch.bool), 3) -> torch.int64
        assert_eq!(result_type(&[t(&[2], Bool), n(I64)]), I64);
        // torch.result_type(torch.ones(2, dtype=torch.uint8), torch.ones(2, dtype=torch.int8)) -> int16 (i32 here)
        assert_eq!(result_type(&[t(&[2], U8), t(&[2], I8)]), I32);
    }
}
