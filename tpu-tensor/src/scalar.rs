//! A single number of any dtype, as passed to `full`, `arange` and tensor-scalar ops.

use std::fmt;

use tpu_runtime::{DType, Element, Error, Result, bf16, f16};

/// A number that keeps integers exact: `i64` values are not routed through `f64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
}

impl Scalar {
    /// The value as f64.
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as u8 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }

    /// The value as i64 (floats truncate toward zero).
    pub fn to_i64(self) -> i64 {
        match self {
            Scalar::Bool(b) => b as i64,
            Scalar::Int(i) => i,
            Scalar::Float(f) => f as i64,
        }
    }

    /// Converts to an element type with PyTorch's casting rules.
    pub fn to_element<T: Element>(self) -> T {
        match self {
            Scalar::Bool(b) => T::from_i64(b as i64),
            Scalar::Int(i) => T::from_i64(i),
            Scalar::Float(f) => T::from_f64(f),
        }
    }

    /// Checks that the value fits `dtype` the way PyTorch checks a fill value (`torch.full`,
    /// `fill_`, `masked_fill`): bools fit every dtype and every value fits bool; integer dtypes
    /// take integers in range (u8 also takes -255..-1, which wrap, unless `strict_unsigned`) and
    /// finite floats from their lowest value up to, not including, their largest plus one (the
    /// fraction is dropped); float dtypes take infinities, NaN and finite values up to their
    /// largest magnitude. Anything else is an [`Error::InvalidArgument`] naming the value.
    pub fn check_fits(self, op: &str, dtype: DType, strict_unsigned: bool) -> Result<()> {
        let fits = match (self, dtype) {
            (Scalar::Bool(_), _) | (_, DType::Bool) => true,
            (Scalar::Int(i), DType::U8) if !strict_unsigned => (-255..=255).contains(&i),
            (Scalar::Int(i), _) => match int_range(dtype) {
                Some((lo, hi)) => (lo..=hi).contains(&i),
                // Exact: every i64 is within f32, bf16 and f64's range; f16 stops at 65504.
                None => (i as f64).abs() <= float_max(dtype),
            },
            (Scalar::Float(f), _) => match int_range(dtype) {
                // `hi + 1` is exact in f64 for every integer dtype (2^63 for i64).
                Some((lo, hi)) => f >= lo as f64 && f < hi as f64 + 1.0,
                None => !f.is_finite() || f.abs() <= float_max(dtype),
            },
        };
        if fits {
            Ok(())
        } else {
            Err(Error::invalid_argument(
                op,
                format!("value {self} cannot be converted to {dtype} without overflow"),
            ))
        }
    }

    /// True for `Scalar::Float`.
    pub fn is_float(self) -> bool {
        matches!(self, Scalar::Float(_))
    }

    /// The dtype PyTorch gives a Python number of this kind: bool, i64 or f32 (the default float).
    pub fn default_dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::F32,
        }
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => write!(f, "{x}"),
        }
    }
}

/// The values of an integer dtype, or `None` for the others.
fn int_range(dtype: DType) -> Option<(i64, i64)> {
    match dtype {
        DType::U8 => Some((0, u8::MAX as i64)),
        DType::I8 => Some((i8::MIN as i64, i8::MAX as i64)),
        DType::I32 => Some((i32::MIN as i64, i32::MAX as i64)),
        DType::I64 => Some((i64::MIN, i64::MAX)),
        _ => None,
    }
}

/// The largest finite value of a float dtype.
fn float_max(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f16::MAX.to_f64(),
        DType::BF16 => bf16::MAX.to_f64(),
        DType::F32 => f32::MAX as f64,
        _ => f64::MAX,
    }
}

/// A `From` impl per Rust type: the variant it lands in and how the value is widened.
macro_rules! scalar_from {
    ($($t:ty => $variant:ident(|$v:ident| $e:expr)),* $(,)?) => {$(
        impl From<$t> for Scalar {
            fn from($v: $t) -> Self {
                Scalar::$variant($e)
            }
        }
    )*};
}

scalar_from!(
    i8 => Int(|v| v as i64),
    i16 => Int(|v| v as i64),
    i32 => Int(|v| v as i64),
    i64 => Int(|v| v),
    u8 => Int(|v| v as i64),
    u16 => Int(|v| v as i64),
    u32 => Int(|v| v as i64),
    isize => Int(|v| v as i64),
    usize => Int(|v| v as i64),
    bool => Bool(|v| v),
    f32 => Float(|v| v as f64),
    f64 => Float(|v| v),
    f16 => Float(|v| v.to_f64()),
    bf16 => Float(|v| v.to_f64()),
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_stay_exact() {
        let big = (1i64 << 53) + 1;
        assert_eq!(Scalar::from(big).to_element::<i64>(), big);
        assert_eq!(Scalar::from(2.5f32).to_element::<i32>(), 2);
        assert!(Scalar::from(0.5).to_element::<bool>());
        assert_eq!(Scalar::from(3u8).default_dtype(), DType::I64);
    }

    /// Each case is what `torch.full([4], value, dtype=...)` does in PyTorch 2: a value or an
    /// overflow error.
    #[test]
    fn fill_values_are_checked_as_pytorch_does() {
        let fits = |v: Scalar, d: DType| v.check_fits("full", d, false).is_ok();
        use DType::*;
        let cases: &[(Scalar, DType, bool)] = &[
            // u8: integers wrap down to -255; floats must not be negative.
            (Scalar::Int(300), U8, false),
            (Scalar::Int(256), U8, false),
            (Scalar::Int(255), U8, true),
            (Scalar::Int(-1), U8, true),
            (Scalar::Int(-255), U8, true),
            (Scalar::Int(-256), U8, false),
            (Scalar::Float(255.99), U8, true),
            (Scalar::Float(256.0), U8, false),
            (Scalar::Float(-0.0), U8, true),
            (Scalar::Float(-1e-300), U8, false),
            (Scalar::Float(-0.5), U8, false),
            (Scalar::Float(f64::NAN), U8, false),
            (Scalar::Float(f64::INFINITY), U8, false),
            (Scalar::Bool(true), U8, true),
            // Signed integers.
            (Scalar::Int(127), I8, true),
            (Scalar::Int(128), I8, false),
            (Scalar::Int(-129), I8, false),
            (Scalar::Float(127.9), I8, true),
            (Scalar::Float(-128.0), I8, true),
            (Scalar::Float(-128.5), I8, false),
            (Scalar::Int(1 << 31), I32, false),
            (Scalar::Float(2147483647.99), I32, true),
            (Scalar::Float(2147483648.0), I32, false),
            (Scalar::Int(i64::MIN), I64, true),
            (Scalar::Float(9.223372036854775e18), I64, true),
            (Scalar::Float(9.223372036854776e18), I64, false),
            (Scalar::Float(-9.223372036854776e18), I64, true),
            (Scalar::Float(-9.223372036854778e18), I64, false),
            // bool takes anything.
            (Scalar::Int(2), Bool, true),
            (Scalar::Int(-1), Bool, true),
            (Scalar::Float(f64::NAN), Bool, true),
            (Scalar::Float(1e300), Bool, true),
            // Floats: finite magnitudes up to the largest; infinities and NaN pass.
            (Scalar::Float(65504.0), F16, true),
            (Scalar::Float(65504.001), F16, false),
            (Scalar::Float(65519.0), F16, false),
            (Scalar::Int(65505), F16, false),
            (Scalar::Int(-65504), F16, true),
            (Scalar::Float(f64::INFINITY), F16, true),
            (Scalar::Float(f64::NEG_INFINITY), F16, true),
            (Scalar::Float(f64::NAN), F16, true),
            (Scalar::Float(1e-10), F16, true),
            (Scalar::Float(3.3895313892515355e38), BF16, true),
            (Scalar::Float(3.4e38), BF16, false),
            (Scalar::Int(i64::MAX), BF16, true),
            (Scalar::Float(3.4028234663852886e38), F32, true),
            (Scalar::Float(3.4028235e38), F32, false),
            (Scalar::Float(f64::INFINITY), F32, true),
            (Scalar::Float(1e308), F64, true),
            (Scalar::Float(f64::INFINITY), F64, true),
        ];
        for &(v, d, ok) in cases {
            assert_eq!(fits(v, d), ok, "{v} as {d}");
        }
        // F.pad refuses negative values for u8 even where fill values wrap.
        assert!(Scalar::Int(-1).check_fits("pad", U8, true).is_err());
        assert!(Scalar::Int(255).check_fits("pad", U8, true).is_ok());
        let e = Scalar::Int(300).check_fits("full", U8, false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "full: value 300 cannot be converted to u8 without overflow"
        );
    }
}
