//! PyTorch's Core ATen opset (torch 2.15: 160 op names, 189 overloads) and what covers each
//! name here: a row of the op table, the backward rule of one, a documented composition, a
//! view, or nothing yet. `examples/op_coverage.rs` prints it; the tests check that every row
//! named here exists, so the list cannot claim an op the table lacks.
//!
//! The list was produced in a virtual environment with torch 2.15:
//!
//! ```python
//! import torch
//! names = []
//! for n in dir(torch.ops.aten):
//!     try:
//!         p = getattr(torch.ops.aten, n); overloads = p.overloads()
//!     except Exception:
//!         continue
//!     core = [o for o in overloads
//!             if torch.Tag.core in getattr(getattr(p, o), "tags", ())]
//!     if core:
//!         names.append(n)
//! ```

/// How a Core ATen op is covered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cover {
    /// Rows of the op table (by name) that compute it, forward and backward as the rows do.
    Rows(&'static [&'static str]),
    /// The backward rule of this row computes it.
    Backward(&'static str),
    /// A view of the `Tensor` type (no data moves; autograd records it).
    View(&'static str),
    /// A composition of existing ops or `Tensor` functions, as described.
    Composition(&'static str),
    /// Covered in part: what is there and what is missing.
    Partial(&'static str),
    /// A documented exclusion: why the op has no counterpart.
    Excluded(&'static str),
    /// Not covered yet.
    Missing,
}

impl Cover {
    /// Whether the op counts as covered (partial and missing ones do not).
    pub fn is_covered(self) -> bool {
        !matches!(self, Cover::Partial(_) | Cover::Missing)
    }
}

use Cover::*;

/// Every Core ATen op name of torch 2.15, in `dir(torch.ops.aten)` order, with its cover.
pub const CORE_ATEN: [(&str, Cover); 160] = [
    ("_adaptive_avg_pool2d", Rows(&["adaptive_avg_pool2d"])),
    (
        "_adaptive_avg_pool2d_backward",
        Backward("adaptive_avg_pool2d"),
    ),
    (
        "_adaptive_avg_pool3d",
        Composition(
            "conv::adaptive_avg_pool3d: adaptive_avg_pool2d per depth slice, averaged over each depth window",
        ),
    ),
    (
        "_cdist_forward",
        Composition("linalg::cdist: differences and the vector norm"),
    ),
    (
        "_embedding_bag",
        Composition(
            "movement::embedding_bag: embedding, then index_add (sum, mean) or scatter_reduce amax (max) into the bags; the output only, not offset2bag, bag_size or max_indices",
        ),
    ),
    ("_fft_c2r", Rows(&["fft_c2r"])),
    ("_fft_r2c", Rows(&["fft_r2c"])),
    (
        "_local_scalar_dense",
        Composition("Tensor::to_scalar (a host read)"),
    ),
    ("_log_softmax", Rows(&["log_softmax"])),
    ("_native_batch_norm_legit", Rows(&["batch_norm"])),
    (
        "_native_batch_norm_legit_no_training",
        Rows(&["batch_norm"]),
    ),
    (
        "_pdist_forward",
        Composition("linalg::pdist: row pairs by index_select, then the norm"),
    ),
    ("_softmax", Rows(&["softmax"])),
    ("_to_copy", Rows(&["to(f32)", "contiguous"])),
    ("abs", Rows(&["abs"])),
    ("acos", Rows(&["acos"])),
    ("acosh", Rows(&["acosh"])),
    ("add", Rows(&["add"])),
    (
        "addmm",
        Composition("mm, mul by the scalars and add (`linear` when beta and alpha are 1)"),
    ),
    ("alias", View("Tensor::view to the same shape")),
    ("amax", Rows(&["amax"])),
    ("amin", Rows(&["amin"])),
    ("any", Rows(&["any"])),
    ("arange", Composition("Tensor::arange")),
    ("argmax", Rows(&["argmax"])),
    ("argmin", Rows(&["argmin"])),
    ("as_strided", View("Tensor::as_strided")),
    ("asin", Rows(&["asin"])),
    ("asinh", Rows(&["asinh"])),
    ("atan", Rows(&["atan"])),
    ("atan2", Rows(&["atan2"])),
    ("atanh", Rows(&["atanh"])),
    ("avg_pool2d", Rows(&["avg_pool2d"])),
    ("avg_pool2d_backward", Backward("avg_pool2d")),
    (
        "avg_pool3d",
        Composition(
            "conv::avg_pool3d: avg_pool2d per depth tap (index_select of the slices), summed and divided by the depth extent",
        ),
    ),
    ("bitwise_and", Rows(&["bitwise_and"])),
    ("bitwise_not", Rows(&["bitwise_not"])),
    ("bitwise_or", Rows(&["bitwise_or"])),
    ("bitwise_xor", Rows(&["bitwise_xor"])),
    ("bmm", Rows(&["bmm"])),
    ("cat", Rows(&["cat"])),
    ("ceil", Rows(&["ceil"])),
    ("clamp", Rows(&["clamp"])),
    ("clone", Rows(&["contiguous"])),
    (
        "col2im",
        Composition(
            "conv::col2im (F.fold): scatter_add over a patch index table; conv::im2col (F.unfold) is its adjoint",
        ),
    ),
    (
        "constant_pad_nd",
        Composition("MovementOps::constant_pad_nd: crops, then pad"),
    ),
    (
        "convolution",
        Rows(&[
            "conv1d",
            "conv2d",
            "conv3d",
            "conv_transpose1d",
            "conv_transpose2d",
            "conv_transpose3d",
        ]),
    ),
    (
        "convolution_backward",
        Composition(
            "the backward rules of conv1d, conv2d and conv_transpose2d, through which the 3-d and 1-d transposed compositions differentiate",
        ),
    ),
    ("copy", Rows(&["view_write"])),
    ("cos", Rows(&["cos"])),
    ("cosh", Rows(&["cosh"])),
    ("cumsum", Rows(&["cumsum"])),
    ("diagonal", View("Tensor::diagonal")),
    ("div", Rows(&["div", "floor_divide", "div_trunc"])),
    ("elu", Rows(&["elu"])),
    ("embedding", Rows(&["embedding"])),
    ("embedding_dense_backward", Backward("embedding")),
    (
        "empty",
        Composition("Tensor::zeros (memory is never handed out uninitialised)"),
    ),
    (
        "empty_strided",
        Composition("Tensor::zeros, then Tensor::as_strided"),
    ),
    ("eq", Rows(&["eq"])),
    ("erf", Rows(&["erf"])),
    ("exp", Rows(&["exp"])),
    ("expand", View("Tensor::expand")),
    ("expm1", Rows(&["expm1"])),
    (
        "fill",
        Composition("Tensor::full_like (fill.Scalar) or a broadcast copy (fill.Tensor)"),
    ),
    ("flip", Rows(&["flip"])),
    ("floor", Rows(&["floor"])),
    ("fmod", Rows(&["fmod"])),
    ("full", Composition("Tensor::full")),
    ("full_like", Composition("Tensor::full_like")),
    ("gather", Rows(&["gather"])),
    ("ge", Rows(&["ge"])),
    ("gelu", Rows(&["gelu", "gelu_tanh"])),
    ("grid_sampler_2d", Rows(&["grid_sampler_2d"])),
    ("gt", Rows(&["gt"])),
    (
        "hardtanh",
        Composition("clamp(min_val, max_val): the same values and gradient"),
    ),
    (
        "index",
        Composition("MovementOps::index: flat index_select over the indexed dims"),
    ),
    (
        "index_put",
        Composition("MovementOps::index_put: index_copy or index_add at the flat index"),
    ),
    ("index_select", Rows(&["index_select"])),
    ("isinf", Rows(&["isinf"])),
    ("isnan", Rows(&["isnan"])),
    ("le", Rows(&["le"])),
    ("leaky_relu", Rows(&["leaky_relu"])),
    ("log", Rows(&["log"])),
    ("log10", Rows(&["log10"])),
    ("log1p", Rows(&["log1p"])),
    ("log2", Rows(&["log2"])),
    ("logical_and", Rows(&["logical_and"])),
    ("logical_not", Rows(&["logical_not"])),
    ("logical_or", Rows(&["logical_or"])),
    ("logical_xor", Rows(&["logical_xor"])),
    ("lt", Rows(&["lt"])),
    (
        "masked_scatter",
        Composition("MovementOps::masked_scatter: cumsum, index_select, where"),
    ),
    ("max", Rows(&["max", "max_all"])),
    ("max_pool2d_with_indices", Rows(&["max_pool2d"])),
    ("max_pool2d_with_indices_backward", Backward("max_pool2d")),
    (
        "max_pool3d_with_indices",
        Composition(
            "conv::max_pool3d_with_indices: max_pool2d_with_indices per depth tap, combined by PyTorch's rule with where",
        ),
    ),
    ("maximum", Rows(&["maximum"])),
    ("mean", Rows(&["mean"])),
    ("min", Rows(&["min", "min_all"])),
    ("minimum", Rows(&["minimum"])),
    ("mm", Rows(&["mm"])),
    ("mul", Rows(&["mul"])),
    ("native_dropout", Rows(&["dropout"])),
    ("native_group_norm", Rows(&["group_norm"])),
    ("native_group_norm_backward", Backward("group_norm")),
    ("native_layer_norm", Rows(&["layer_norm"])),
    ("native_layer_norm_backward", Backward("layer_norm")),
    ("ne", Rows(&["ne"])),
    ("neg", Rows(&["neg"])),
    (
        "nonzero",
        Composition("MovementOps::nonzero: one host read of the mask on PJRT devices"),
    ),
    ("permute", View("Tensor::permute")),
    ("pow", Rows(&["pow"])),
    ("prod", Rows(&["prod"])),
    ("rand", Composition("Generator::rand")),
    ("randn", Composition("Generator::randn")),
    ("randperm", Composition("Generator::randperm")),
    ("reciprocal", Rows(&["reciprocal"])),
    ("reflection_pad1d", Rows(&["pad(reflect)"])),
    ("reflection_pad2d", Rows(&["pad(reflect)"])),
    ("reflection_pad3d", Rows(&["pad(reflect)"])),
    ("relu", Rows(&["relu"])),
    ("remainder", Rows(&["remainder"])),
    ("repeat", Rows(&["repeat"])),
    ("replication_pad2d", Rows(&["pad(replicate)"])),
    ("replication_pad3d", Rows(&["pad(replicate)"])),
    ("round", Rows(&["round"])),
    ("rsqrt", Rows(&["rsqrt"])),
    ("scalar_tensor", Composition("Tensor::scalar")),
    ("scatter", Rows(&["scatter"])),
    ("scatter_add", Rows(&["scatter_add"])),
    (
        "scatter_reduce",
        Rows(&[
            "scatter_reduce(sum)",
            "scatter_reduce(prod)",
            "scatter_reduce(mean)",
            "scatter_reduce(amax)",
            "scatter_reduce(amin)",
        ]),
    ),
    ("select", View("Tensor::select")),
    (
        "select_scatter",
        Composition("MovementOps::select_scatter: index_copy at the index"),
    ),
    ("sigmoid", Rows(&["sigmoid"])),
    ("sign", Rows(&["sign"])),
    ("sin", Rows(&["sin"])),
    ("sinh", Rows(&["sinh"])),
    ("slice", View("Tensor::slice")),
    (
        "slice_scatter",
        Composition("MovementOps::slice_scatter: index_copy at the slice's indices"),
    ),
    ("sort", Rows(&["sort"])),
    ("split_with_sizes", View("Tensor::split_with_sizes")),
    ("sqrt", Rows(&["sqrt"])),
    ("squeeze", View("Tensor::squeeze")),
    ("sub", Rows(&["sub"])),
    ("sum", Rows(&["sum"])),
    ("sym_numel", Excluded("a shape query: Tensor::numel")),
    ("sym_size", Excluded("a shape query: Tensor::shape")),
    (
        "sym_storage_offset",
        Excluded("a shape query: Tensor::offset"),
    ),
    ("sym_stride", Excluded("a shape query: Tensor::strides")),
    ("tan", Rows(&["tan"])),
    ("tanh", Rows(&["tanh"])),
    ("topk", Rows(&["topk"])),
    ("trunc", Rows(&["trunc"])),
    ("unsqueeze", View("Tensor::unsqueeze")),
    ("upsample_bilinear2d", Rows(&["upsample_bilinear2d"])),
    ("upsample_nearest2d", Rows(&["upsample_nearest2d"])),
    ("var", Rows(&["var"])),
    ("view", View("Tensor::view")),
    ("where", Rows(&["where"])),
];

/// How many Core ATen ops are covered (documented exclusions included).
pub fn core_aten_covered() -> usize {
    CORE_ATEN.iter().filter(|(_, c)| c.is_covered()).count()
}
