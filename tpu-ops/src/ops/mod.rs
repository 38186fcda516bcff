//! The op families. Each folder holds one family: `mod.rs` (the op structs and their `OpDef`
//! impls, the free functions, the family's trait of `Tensor` methods, the table rows), `cpu.rs`
//! (the CPU kernels), `lower.rs` (the StableHLO lowerings) and `grad.rs` (the backward rules).

use tpu_tensor::{Result, Tensor};

use crate::op::OpInfo;

/// Declares options structs of PyTorch keyword arguments, each with its defaults written once:
/// the struct (public fields), `new()` and `Default` (or, for `pub struct Name(arg: T)`, only
/// `new(arg)`, taking anything that converts into `T`, which the defaults may name), and a
/// builder setter per field that has one. A field is `name: Type = default`, followed for a
/// setter by `=> "doc"` (takes a `Type`), `=> into "doc"` (anything that converts into `Type`)
/// or `=> some(T) "doc"` (anything that converts into `T`, stored as `Some`).
macro_rules! options {
    ($(
        $(#[$m:meta])*
        pub struct $Name:ident $(<$lt:lifetime>)? $(($req:ident: $rt:ty))? {
            $(
                $(#[$fm:meta])*
                $field:ident: $ft:ty = $def:expr $(=> $($how:ident $(($st:ty))?)? $doc:literal)?
            ),* $(,)?
        }
    )*) => {$(
        $(#[$m])*
        pub struct $Name $(<$lt>)? {
            $( $(#[$fm])* pub $field: $ft, )*
        }

        options!(@new $Name [$($lt)?] [$($req: $rt)?] { $($field: $def),* });

        impl $(<$lt>)? $Name $(<$lt>)? {
            $($( options!(@set $field: $ft, [$($how $(($st))?)?] $doc); )?)*
        }
    )*};
    (@new $Name:ident [$($lt:lifetime)?] [] { $($field:ident: $def:expr),* }) => {
        impl $(<$lt>)? Default for $Name $(<$lt>)? {
            fn default() -> Self {
                $Name { $($field: $def),* }
            }
        }

        impl $(<$lt>)? $Name $(<$lt>)? {
            /// PyTorch's defaults.
            pub fn new() -> Self {
                Self::default()
            }
        }
    };
    (@new $Name:ident [] [$req:ident: $rt:ty] { $($field:ident: $def:expr),* }) => {
        impl $Name {
            #[doc = concat!("`", stringify!($req), "` as given, with PyTorch's other defaults.")]
            pub fn new($req: impl Into<$rt>) -> Self {
                let $req = $req.into();
                $Name { $($field: $def),* }
            }
        }
    };
    (@set $field:ident: $ft:ty, [] $doc:literal) => {
        #[doc = $doc]
        pub fn $field(mut self, $field: $ft) -> Self {
            self.$field = $field;
            self
        }
    };
    (@set $field:ident: $ft:ty, [into] $doc:literal) => {
        #[doc = $doc]
        pub fn $field(mut self, $field: impl Into<$ft>) -> Self {
            self.$field = $field.into();
            self
        }
    };
    (@set $field:ident: $ft:ty, [some($st:ty)] $doc:literal) => {
        #[doc = $doc]
        pub fn $field(mut self, $field: impl Into<$st>) -> Self {
            self.$field = Some($field.into());
            self
        }
    };
}

pub mod cast;
pub mod conv;
pub mod elementwise;
pub mod fft;
pub mod linalg;
pub mod movement;
pub mod nn;
pub mod quant;
pub mod reduce;

/// The op table, part by part.
/// A category's name and the function listing its rows.
pub(crate) type TablePart = (&'static str, fn() -> Vec<OpInfo>);

pub(crate) const TABLES: &[TablePart] = &[
    ("unary", elementwise::unary::table),
    ("binary", elementwise::binary::table),
    ("cast", cast::table),
    ("reduce", reduce::table),
    ("linalg", linalg::table),
    ("conv", conv::table),
    ("movement", movement::table),
    ("nn", nn::table),
    ("fft", fft::table),
    ("view", movement::view::table),
];

/// Sums `t` over `dims` (keeping them as size 1 when `keepdim`): the reduction autograd needs to
/// undo broadcasting. Sums keep the gradient's float dtype.
pub(crate) fn reduce_sum_dims(t: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    if dims.is_empty() {
        return Ok(t.clone());
    }
    reduce::reduce(t, reduce::ReduceKind::Sum, dims, keepdim)
}
