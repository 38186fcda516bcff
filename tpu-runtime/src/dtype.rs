//! Element types, chosen at run time.
//!
//! Tensors carry a [`DType`] value rather than a type parameter: one compiled copy of each code
//! path, with the element type dispatched by `match` where a kernel needs it.

use std::borrow::Cow;
use std::fmt;

use bytemuck::{CheckedBitPattern, NoUninit};
use half::{bf16, f16};

use crate::error::{Error, Result};

/// The element type of a tensor or buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// Booleans, stored as one byte each holding 0 or 1.
    Bool,
    /// Unsigned 8-bit integers.
    U8,
    /// Signed 8-bit integers.
    I8,
    /// Signed 32-bit integers.
    I32,
    /// Signed 64-bit integers.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16: f32's exponent with a 7-bit mantissa.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

const ACCEPTED_DTYPES: &str = "bool, u8, i8, i32, i64, f16, bf16, f32, f64 \
     (PyTorch's names such as float32, bfloat16, half, long are accepted too)";

impl DType {
    /// Every dtype, in promotion order.
    pub const ALL: [DType; 9] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// The short name used in printing (`f32`, `bf16`, `bool`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Parses a dtype name: ours (`f32`) or PyTorch's (`float32`, `torch.float32`, `float`).
    pub fn parse(name: &str) -> Result<DType> {
        let n = name.trim();
        let n = n.strip_prefix("torch.").unwrap_or(n);
        Ok(match n.to_ascii_lowercase().as_str() {
            "bool" => DType::Bool,
            "u8" | "uint8" => DType::U8,
            "i8" | "int8" => DType::I8,
            "i32" | "int32" | "int" => DType::I32,
            "i64" | "int64" | "long" => DType::I64,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "f32" | "float32" | "float" => DType::F32,
            "f64" | "float64" | "double" => DType::F64,
            _ => {
                return Err(Error::UnknownDType {
                    given: name.to_string(),
                    accepted: ACCEPTED_DTYPES,
                });
            }
        })
    }

    /// True for f16, bf16, f32 and f64.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// True for the integer dtypes (bool excluded).
    pub const fn is_int(self) -> bool {
        matches!(self, DType::U8 | DType::I8 | DType::I32 | DType::I64)
    }

    /// True for dtypes that can hold negative values.
    pub const fn is_signed(self) -> bool {
        !matches!(self, DType::Bool | DType::U8)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        DType::parse(s)
    }
}

/// A Rust type that is the element of some [`DType`].
///
/// The conversions follow PyTorch's casting rules: integers and bools go through `i64`, floats
/// through `f64` (and f64 reaches f16/bf16 through f32, as PyTorch rounds twice there).
pub trait Element:
    Copy + Send + Sync + PartialEq + Default + fmt::Debug + NoUninit + CheckedBitPattern + 'static
{
    /// The dtype this type represents.
    const DTYPE: DType;
    /// The value as f64 (bools as 0 or 1).
    fn to_f64(self) -> f64;
    /// The value as i64; floats truncate toward zero, as a C cast does.
    fn to_i64(self) -> i64;
    /// Converts from f64 with this dtype's rounding.
    fn from_f64(v: f64) -> Self;
    /// Converts from i64 with this dtype's rounding (wrapping for narrow integers).
    fn from_i64(v: i64) -> Self;
    /// `s` as f32s when this type is `f32` (for kernels that have an f32-only fast path and
    /// are generic over the element), else `None`.
    #[inline]
    fn as_f32s(_s: &[Self]) -> Option<&[f32]> {
        None
    }
    /// [`Element::as_f32s`] for a mutable slice.
    #[inline]
    fn as_f32s_mut(_s: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
}

/// Implements [`Element`] for a primitive number: `as` casts both ways, except `from_f64`,
/// given as `|v| expr`; `f32_views` adds the f32 slice views.
macro_rules! primitive_element {
    ($t:ty, $d:expr, from_f64: |$v:ident| $from_f64:expr $(, $views:ident)?) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline]
            fn from_f64($v: f64) -> Self {
                $from_f64
            }
            #[inline]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            $( primitive_element!(@$views); )?
        }
    };
    (@f32_views) => {
        #[inline]
        fn as_f32s(s: &[Self]) -> Option<&[f32]> {
            Some(s)
        }
        #[inline]
        fn as_f32s_mut(s: &mut [Self]) -> Option<&mut [f32]> {
            Some(s)
        }
    };
}
// Integers convert from floats through i64 so that negative floats wrap into unsigned types as
// in PyTorch (-1.0 -> 255u8) instead of saturating at 0.
primitive_element!(u8, DType::U8, from_f64: |v| (v as i64) as u8);
primitive_element!(i8, DType::I8, from_f64: |v| (v as i64) as i8);
primitive_element!(i32, DType::I32, from_f64: |v| (v as i64) as i32);
primitive_element!(i64, DType::I64, from_f64: |v| v as i64);
primitive_element!(f32, DType::F32, from_f64: |v| v as f32, f32_views);
primitive_element!(f64, DType::F64, from_f64: |v| v);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    #[inline]
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    #[inline]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline]
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    #[inline]
    fn from_i64(v: i64) -> Self {
        v != 0
    }
}

/// Implements [`Element`] for a 16-bit float given its conversions to and from f32.
macro_rules! half_element {
    ($t:ty, $d:expr, $to_f32:expr, $from_f32:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline]
            fn to_f64(self) -> f64 {
                $to_f32(self) as f64
            }
            #[inline]
            fn to_i64(self) -> i64 {
                $to_f32(self) as i64
            }
            #[inline]
            fn from_f64(v: f64) -> Self {
                $from_f32(v as f32)
            }
            #[inline]
            fn from_i64(v: i64) -> Self {
                $from_f32(v as f32)
            }
        }
    };
}
half_element!(f16, DType::F16, f16_to_f32, f16_from_f32);
half_element!(bf16, DType::BF16, bf16_to_f32, bf16_from_f32);

/// `v` widened to f32 (exact), with the bits of `f16::to_f32` (NaNs quiet, payload kept) but
/// without a branch or a run-time processor check, so loops over f16 vectorise.
#[inline]
pub fn f16_to_f32(v: f16) -> f32 {
    let h = u32::from(v.to_bits());
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7FFF;
    // Normal numbers: rebias the exponent. Subnormals: the value is em * 2^-24, exact in f32.
    let normal = (em << 13) + ((127 - 15) << 23);
    let sub = (em as f32 * f32::from_bits(0x3380_0000)).to_bits();
    let special =
        0x7F80_0000 | ((em & 0x03FF) << 13) | if em & 0x03FF != 0 { 0x0040_0000 } else { 0 };
    let bits = if em >= 0x7C00 {
        special
    } else if em >= 0x0400 {
        normal
    } else {
        sub
    };
    f32::from_bits(sign | bits)
}

/// `v` rounded to the nearest f16, ties to even, with the bits of `f16::from_f32` (overflow to
/// infinity, NaNs quiet with their sign and the top of their payload), without a branch.
#[inline]
pub fn f16_from_f32(v: f32) -> f16 {
    let x = v.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let a = x & 0x7FFF_FFFF;
    // Below 2^-14 the result is subnormal: adding 0.5 (the f16 subnormal step scaled to one
    // unit of the f32 mantissa) rounds in the f32 adder, ties to even, and the low bits are
    // the f16's.
    let magic = f32::from_bits(0x3F00_0000);
    let sub = ((f32::from_bits(a) + magic).to_bits() - 0x3F00_0000) as u16;
    // Normal: rebias, add just under half a unit of the last kept bit plus that bit, shift.
    let odd = (a >> 13) & 1;
    let normal = (a.wrapping_sub((127 - 15) << 23).wrapping_add(0x0FFF + odd) >> 13) as u16;
    let nan = 0x7E00 | ((a >> 13) & 0x03FF) as u16;
    let bits = if a > 0x7F80_0000 {
        nan
    } else if a >= 0x477F_F000 {
        // At or above 65520 (halfway past the largest f16, ties to even go up): infinity.
        0x7C00
    } else if a >= 0x3880_0000 {
        normal
    } else {
        sub
    };
    f16::from_bits(sign | bits)
}

/// `v` widened to f32 (exact): its bits are the high half of the f32's, a NaN made quiet as
/// `bf16::to_f32` makes it, without a branch.
#[inline]
pub fn bf16_to_f32(v: bf16) -> f32 {
    let b = v.to_bits();
    let x = u32::from(b) << 16;
    f32::from_bits(if b & 0x7FFF > 0x7F80 {
        x | 0x0040_0000
    } else {
        x
    })
}

/// `v` rounded to the nearest bf16, ties to even, NaNs kept quiet with their sign: the same
/// bits as `bf16::from_f32`, but without a branch, so loops of elementwise kernels over bf16
/// vectorise (measured 10-20x faster than through `bf16::from_f32`).
#[inline]
pub fn bf16_from_f32(v: f32) -> bf16 {
    let x = v.to_bits();
    // Adding just under half a unit of the last kept bit, plus that bit, carries into it
    // exactly when round-to-nearest-even rounds up.
    let rounded = (x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16) as u16;
    let nan = (x >> 16) as u16 | 0x0040;
    bf16::from_bits(if x & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
    })
}

/// Runs `$body` with `$T` bound to the Rust element type of a [`DType`] value (`bool` for
/// `DType::Bool`), so one generic body serves every dtype.
#[macro_export]
macro_rules! with_element {
    ($dtype:expr, $T:ident, $body:expr) => {
        $crate::__with_element_arms!(
            $dtype, $T, $body;
            Bool => bool,
            U8 => u8,
            I8 => i8,
            I32 => i32,
            I64 => i64,
            F16 => $crate::f16,
            BF16 => $crate::bf16,
            F32 => f32,
            F64 => f64,
        )
    };
}

/// The `match` behind [`with_element!`]: one arm per (variant, element type) pair.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_element_arms {
    ($dtype:expr, $T:ident, $body:expr; $( $variant:ident => $ty:ty ),* $(,)?) => {
        match $dtype {
            $(
                $crate::DType::$variant => {
                    type $T = $ty;
                    $body
                }
            )*
        }
    };
}

/// Views typed host data as bytes, without copying.
pub fn as_bytes<T: Element>(data: &[T]) -> &[u8] {
    bytemuck::cast_slice(data)
}

/// Views bytes as typed data without copying when the bytes are aligned for `T`, and copies them
/// otherwise. Fails when the length is not a multiple of the element size or when a value is not
/// valid for `T` (a bool byte other than 0 or 1).
pub fn cast_bytes<T: Element>(bytes: &[u8]) -> Result<Cow<'_, [T]>> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size) {
        return Err(Error::InvalidData {
            context: format!("reading {} values from bytes", T::DTYPE),
            reason: format!(
                "expected a multiple of {size} bytes, got {} bytes",
                bytes.len()
            ),
        });
    }
    match bytemuck::checked::try_cast_slice::<u8, T>(bytes) {
        Ok(s) => Ok(Cow::Borrowed(s)),
        Err(bytemuck::checked::CheckedCastError::PodCastError(_)) => {
            let mut out = Vec::with_capacity(bytes.len() / size);
            for chunk in bytes.chunks_exact(size) {
                out.push(read_one::<T>(chunk)?);
            }
            Ok(Cow::Owned(out))
        }
        Err(bytemuck::checked::CheckedCastError::InvalidBitPattern) => Err(invalid_bits::<T>()),
    }
}

fn read_one<T: Element>(chunk: &[u8]) -> Result<T> {
    bytemuck::checked::try_pod_read_unaligned::<T>(chunk).map_err(|_| invalid_bits::<T>())
}

fn invalid_bits<T: Element>() -> Error {
    Error::InvalidData {
        context: format!("reading {} values from bytes", T::DTYPE),
        reason: "found a byte pattern that is not a valid value (bools must be 0 or 1)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()).unwrap(), d);
        }
        assert_eq!(DType::BF16.size_in_bytes(), 2);
        assert_eq!(DType::Bool.size_in_bytes(), 1);
        assert_eq!(DType::parse("torch.bfloat16").unwrap(), DType::BF16);
        assert_eq!(DType::parse("long").unwrap(), DType::I64);
        let e = DType::parse("f8").unwrap_err().to_string();
        assert!(e.contains("\"f8\"") && e.contains("bf16"), "{e}");
    }

    #[test]
    fn bytes_round_trip_borrowed_when_aligned() {
        let v = vec![1.5f32, -2.0, 3.25];
        let b = as_bytes(&v);
        assert_eq!(b.len(), 12);
        let back = cast_bytes::<f32>(b).unwrap();
        assert!(matches!(back, Cow::Borrowed(_)));
        assert_eq!(&*back, &v[..]);
    }

    #[test]
    fn bytes_copied_when_misaligned() {
        let v = [7i32, -9];
        let mut raw = [0u8; 9];
        raw[1..].copy_from_slice(as_bytes(&v));
        let back = cast_bytes::<i32>(&raw[1..]).unwrap();
        assert_eq!(&*back, &v[..]);
    }

    #[test]
    fn bad_bytes_are_errors() {
        assert!(cast_bytes::<f32>(&[0u8; 7]).is_err());
        let e = cast_bytes::<bool>(&[0, 1, 2]).unwrap_err().to_string();
        assert!(e.contains("0 or 1"), "{e}");
        assert_eq!(&*cast_bytes::<bool>(&[0, 1]).unwrap(), &[false, true]);
    }

    #[test]
    fn pytorch_cast_rules() {
        assert_eq!(u8::from_f64(-1.0), 255);
        assert_eq!(i32::from_f64(-2.7), -2);
        assert!(bool::from_f64(f64::NAN));
        // 1 + 2^-8 + 2^-9 lies between two bf16 values; ties and above round up.
        assert_eq!(bf16::from_f64(1.0 + 1.0 / 256.0).to_f32(), 1.0);
        assert_eq!(bf16::from_f64(1.0 + 3.0 / 512.0).to_f32(), 1.0078125);
        assert_eq!(f32::from_i64(16_777_217), 16_777_216.0);
    }

    #[test]
    fn half_conversions_give_the_bits_of_half() {
        // Every 4099th pattern (all exponents, both signs, NaN payloads), plus the edges of
        // rounding: ties, just above and below, the largest finite values and infinities.
        let edges = [
            0x3F80_8000u32,
            0x3F81_8000,
            0x3F80_8001,
            0x3F80_7FFF,
            0x7F7F_FFFF,
            0xFF7F_FFFF,
            0x7F80_0000,
            0xFF80_0000,
            0x7F80_0001,
            0xFFC0_0000,
            0x0000_8000,
            0x0001_8000,
            // f16: the largest finite value and the overflow tie, the normal-subnormal
            // boundary and the smallest subnormal's ties.
            0x477F_E000,
            0x477F_EFFF,
            0x477F_F000,
            0x3880_0000,
            0x387F_F000,
            0x387F_FFFF,
            0x3300_0000,
            0x3300_0001,
            0x3380_0000,
            0xB3C0_0000,
            0x7FC0_1234,
            0xFF80_2000,
        ];
        // Every pattern (STEP = 1) passes too, in about 20 s of a release build.
        const STEP: usize = 4099;
        for x in (0..=u32::MAX).step_by(STEP).chain(edges) {
            let v = f32::from_bits(x);
            assert_eq!(
                bf16_from_f32(v).to_bits(),
                bf16::from_f32(v).to_bits(),
                "{x:#x}"
            );
            let h = bf16::from_bits((x >> 16) as u16);
            assert_eq!(bf16_to_f32(h).to_bits(), h.to_f32().to_bits(), "{x:#x}");
            assert_eq!(
                f16_from_f32(v).to_bits(),
                f16::from_f32(v).to_bits(),
                "{x:#x}"
            );
        }
        for h in 0..=u16::MAX {
            let h = f16::from_bits(h);
            assert_eq!(f16_to_f32(h).to_bits(), h.to_f32().to_bits(), "{h:?}");
        }
    }
}
