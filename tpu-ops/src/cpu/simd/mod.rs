//! Hand-written SIMD kernels for the native CPU device, chosen at run time by [`crate::cpu::isa`].
//!
//! The crate is built for plain x86-64, so wider instructions only run inside functions marked
//! `#[target_feature]`, called after [`crate::cpu::isa::level`] says the processor has them. The
//! kernels read and write through raw pointers whose bounds the safe entry points check first.
//!
//! - [`gemm`]: `c (+)= a · b` for f32, f16 and bf16 operands with f32 accumulation: packed
//!   panels and an AVX-512 register tile of 12×32 (FMA for f32 and f16; 14×32 on `vdpbf16ps`
//!   for bf16 when [`crate::cpu::isa::has_avx512_bf16`], or 32×32 on AMX tiles where the
//!   processor and the OS allow them: [`amx`]), cache blocking, and the rows or columns of one
//!   product split across the threads of the calling rayon pool; at
//!   [`crate::cpu::isa::Level::Avx2`] the same blocking runs a 6×16 FMA tile. Matrix-vector
//!   products take a memory-bound path of their own (faer's at AVX2). Below AVX2 it multiplies
//!   with faer in f32, so callers need no fallback of their own.
//! - [`conv_bf16`]: the bf16 convolution with a stride of one as an implicit product on
//!   `vdpbf16ps`, or on AMX tiles for input channels in multiples of 32, reading the image in
//!   place of gathered patches (AVX512_BF16 only).
//! - [`quant`]: f32 activations times matrices of GGML's quantised blocks (Q4_0, Q4_1, Q8_0),
//!   read at their quantised size.
//! - [`gelu_f32`]: the erf GELU of `crate::cpu::math`, whose piecewise fit reads its coefficients
//!   from 16-entry tables, with the lookups as permutes (AVX-512, AVX2), bit for bit the same.

use tpu_tensor::{Error, Result, bf16, f16};

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod conv;
mod gemm;
pub mod quant;
pub(crate) mod reduce;
pub(crate) mod rows;
mod unary;

pub use conv::{ConvPlane, ConvWeight, conv_bf16, conv_bf16_available};
pub use gemm::{
    PackedPanels, gemm, gemm_bias, gemm_packed, gemm_packed_bias, gemm_update_f32,
    gemm_update_f32_in_place,
};
pub use unary::gelu_f32;

/// Whether [`gemm`] runs its packed SIMD kernels now, AVX-512 or AVX2 (else its portable path).
pub fn gemm_accelerated() -> bool {
    cfg!(target_arch = "x86_64") && crate::cpu::isa::level() >= crate::cpu::isa::Level::Avx2
}

/// Element types of the SIMD kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `f32`.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::f16 {}
    impl Sealed for super::bf16 {}
}

/// An element type the kernels read and write: f32, f16 or bf16.
pub trait Elem: sealed::Sealed + Copy + Send + Sync + 'static {
    /// Which one.
    const KIND: Kind;
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;
    /// `x` rounded to this type (to nearest, ties to even).
    fn from_f32(x: f32) -> Self;
    /// The slice itself when this type is f32.
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        let _ = s;
        None
    }
    /// The slice itself when this type is f32.
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        let _ = s;
        None
    }
}

impl Elem for f32 {
    const KIND: Kind = Kind::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
    fn as_f32(s: &[f32]) -> Option<&[f32]> {
        Some(s)
    }
    fn as_f32_mut(s: &mut [f32]) -> Option<&mut [f32]> {
        Some(s)
    }
}

/// [`Elem`] for a 16-bit float, through its own conversions.
macro_rules! half_elem {
    ($($t:ident: $kind:ident),*) => {
        $(
            impl Elem for $t {
                const KIND: Kind = Kind::$kind;
                fn to_f32(self) -> f32 {
                    $t::to_f32(self)
                }
                fn from_f32(x: f32) -> Self {
                    $t::from_f32(x)
                }
            }
        )*
    };
}
half_elem!(f16: F16, bf16: Bf16);

/// A strided matrix in a storage slice: element `(i, j)` is `data[offset + i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatView<'a, T> {
    /// The storage.
    pub data: &'a [T],
    /// Where element `(0, 0)` is.
    pub offset: usize,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Row stride in elements.
    pub rs: usize,
    /// Column stride in elements.
    pub cs: usize,
}

impl<'a, T> MatView<'a, T> {
    /// The transpose, reading the same elements.
    fn t(&self) -> MatView<'a, T> {
        MatView {
            data: self.data,
            offset: self.offset,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    /// Checks that every element lies inside `data`.
    fn check(&self, what: &str) -> Result<()> {
        if self.rows == 0 || self.cols == 0 {
            return Ok(());
        }
        let last = (self.rows - 1)
            .checked_mul(self.rs)
            .and_then(|r| (self.cols - 1).checked_mul(self.cs).map(|c| (r, c)))
            .and_then(|(r, c)| r.checked_add(c))
            .and_then(|x| x.checked_add(self.offset));
        match last {
            Some(l) if l < self.data.len() => Ok(()),
            _ => Err(Error::internal(
                "matmul",
                format!(
                    "{what}, a {}x{} matrix at offset {} with strides ({}, {}), leaves its storage of {} elements",
                    self.rows,
                    self.cols,
                    self.offset,
                    self.rs,
                    self.cs,
                    self.data.len()
                ),
            )),
        }
    }
}
