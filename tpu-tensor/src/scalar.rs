//! A single number of any dtype, as passed to `full`, `arange` and tensor-scalar ops.

use std::fmt;

use tpu_runtime::{DType, Element, bf16, f16};

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

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Scalar {
            fn from(v: $t) -> Self {
                Scalar::Int(v as i64)
            }
        }
    )*};
}
from_int!(i8, i16, i32, i64, u8, u16, u32, isize);

impl From<usize> for Scalar {
    fn from(v: usize) -> Self {
        Scalar::Int(v as i64)
    }
}

impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Bool(v)
    }
}

impl From<f32> for Scalar {
    fn from(v: f32) -> Self {
        Scalar::Float(v as f64)
    }
}

impl From<f64> for Scalar {
    fn from(v: f64) -> Self {
        Scalar::Float(v)
    }
}

impl From<f16> for Scalar {
    fn from(v: f16) -> Self {
        Scalar::Float(v.to_f64())
    }
}

impl From<bf16> for Scalar {
    fn from(v: bf16) -> Self {
        Scalar::Float(v.to_f64())
    }
}

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
}
