//! Scaled dot-product attention: the op with its shape rule, the options value and the public
//! functions. The kernel, lowering and backward rule live in `cpu.rs`, `lower.rs` and
//! `grad.rs`.

mod cpu;
mod grad;
mod lower;

use tpu_tensor::shape::broadcast_shapes;
use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{DType, Error, Result, Tensor};

use crate::exec::dispatch::run1;
use crate::op::args::check_float;
use crate::op::{Meta, OpDef, op_parts};
use crate::ops::nn::args::{check_arity, check_dtype};

/// Scaled dot-product attention over `[..., L, E]` queries and `[..., S, E]` keys and
/// `[..., S, Ev]` values, with grouped-query heads. Inputs: `q`, `k`, `v`, then the mask when
/// present (bool, true = attend; or additive of `q`'s dtype).
#[derive(Clone, Debug)]
pub struct Attention {
    /// Factor applied to `q · k`.
    pub scale: f64,
    /// Query `i` attends to keys `j <= i` only.
    pub causal: bool,
    /// Keys and values may have fewer heads (dim -3) than queries, dividing them.
    pub gqa: bool,
    /// A mask is given.
    pub mask: bool,
}

/// Query batches (leading dims, heads included), query heads and key heads.
fn attn_batches(q: &[usize], k: &[usize]) -> (usize, usize, usize) {
    let r = q.len();
    let b = q[..r - 2].iter().product();
    if r >= 3 {
        (b, q[r - 3], k[r - 3])
    } else {
        (b, 1, 1)
    }
}

impl OpDef for Attention {
    fn name(&self) -> &'static str {
        "scaled_dot_product_attention"
    }

    fn attrs(&self) -> String {
        format!("{self:?}|{:?}", crate::ops::linalg::matmul_precision())
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let op = self.name();
        check_arity(op, inputs, 3 + self.mask as usize)?;
        let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
        check_float(op, q)?;
        check_dtype(op, "key", k, q.dtype)?;
        check_dtype(op, "value", v, q.dtype)?;
        let shapes = || {
            format!(
                "query {}, key {}, value {}",
                fmt_shape(&q.shape),
                fmt_shape(&k.shape),
                fmt_shape(&v.shape)
            )
        };
        let r = q.rank();
        if r < 2 || k.rank() != r || v.rank() != r {
            return Err(Error::shape(
                op,
                format!(
                    "expected query, key and value of one rank >= 2 ([..., L, E]), got {}",
                    shapes()
                ),
            ));
        }
        let (l, e, s, ev) = (
            q.shape[r - 2],
            q.shape[r - 1],
            k.shape[r - 2],
            v.shape[r - 1],
        );
        if k.shape[r - 1] != e || v.shape[r - 2] != s || k.shape[..r - 2] != v.shape[..r - 2] {
            return Err(Error::shape(
                op,
                format!(
                    "expected key [..., S, E] and value [..., S, Ev] for query [..., L, E], got {}",
                    shapes()
                ),
            ));
        }
        let grouped = self.gqa && r >= 3;
        let lead_ok = if grouped {
            let (hq, hk) = (q.shape[r - 3], k.shape[r - 3]);
            if hk == 0 || hq % hk != 0 {
                return Err(Error::shape(
                    op,
                    format!(
                        "expected the key/value heads (dim -3) to divide the query heads, got {}",
                        shapes()
                    ),
                ));
            }
            q.shape[..r - 3] == k.shape[..r - 3]
        } else {
            q.shape[..r - 2] == k.shape[..r - 2]
        };
        if !lead_ok {
            return Err(Error::shape(
                op,
                format!(
                    "expected key and value with the query's batch dims{}, got {}",
                    if self.gqa {
                        ""
                    } else {
                        " (enable_gqa allows fewer key/value heads)"
                    },
                    shapes()
                ),
            ));
        }
        if self.mask {
            let m = &inputs[3];
            if m.dtype != DType::Bool {
                check_dtype(op, "attn_mask", m, q.dtype)?;
            }
            if self.causal {
                return Err(Error::invalid_argument(
                    op,
                    "an explicit attn_mask must not be given with is_causal=true",
                ));
            }
            let mut full: Vec<usize> = q.shape[..r - 2].to_vec();
            full.extend([l, s]);
            let bs = broadcast_shapes(op, &full, &m.shape)?;
            if bs[..] != full[..] {
                return Err(Error::shape(
                    op,
                    format!(
                        "expected attn_mask broadcastable to {}, got {}",
                        fmt_shape(&full),
                        fmt_shape(&m.shape)
                    ),
                ));
            }
        }
        let mut out: Vec<usize> = q.shape[..r - 1].to_vec();
        out.push(ev);
        Ok(vec![Meta::new(&out, q.dtype)])
    }

    op_parts! {
        cpu: cpu::attention,
        lower: lower::attention,
        grad: grad::attention,
    }
}

options! {
    /// Options of [`scaled_dot_product_attention_with`], PyTorch's keyword arguments with their
    /// defaults: no mask, not causal, `scale` `1 / sqrt(E)`, no grouped-query heads.
    #[derive(Clone, Copy, Debug)]
    pub struct AttentionOptions<'a> {
        /// Bool (true = attend) or additive (the query's dtype), broadcastable to `[..., L, S]`.
        attn_mask: Option<&'a Tensor> = None
            => into "Sets (or, with `None`, clears) the mask.",
        /// Query `i` sees keys `j <= i` only; excludes `attn_mask`.
        is_causal: bool = false => "Causal attention or not.",
        /// Factor applied to `q · k`; `None` for `1 / sqrt(E)`.
        scale: Option<f64> = None => into "Sets the scale (`None`: the default).",
        /// Keys and values may have fewer heads (dim -3) than queries, dividing them.
        enable_gqa: bool = false => "Allows fewer key/value heads than query heads, or not.",
    }
}

/// `softmax(q kᵀ / sqrt(E)) v` with PyTorch's defaults (see
/// [`scaled_dot_product_attention_with`]).
pub fn scaled_dot_product_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    scaled_dot_product_attention_with(q, k, v, &AttentionOptions::new())
}

/// `softmax(q kᵀ * scale + mask) v` for `[..., L, E]` queries, `[..., S, E]` keys and
/// `[..., S, Ev]` values.
///
/// `attn_mask` is bool (true = attend) or additive (the query's dtype), broadcastable to
/// `[..., L, S]`; `is_causal` lets query `i` see keys `j <= i` and excludes a mask.
/// `scale` defaults to `1 / sqrt(E)`. With `enable_gqa`, keys and values may have fewer
/// heads (dim -3) than queries, dividing them; query head `h` uses key head
/// `h / (Hq / Hk)`. Query rows that attend to nothing give zeros. On the CPU the scores
/// are never materialised: each query row runs an online softmax over blocks of keys.
pub fn scaled_dot_product_attention_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttentionOptions,
) -> Result<Tensor> {
    let e = q.shape().last().copied().unwrap_or(1);
    let op = Attention {
        scale: opts.scale.unwrap_or(1.0 / (e as f64).sqrt()),
        causal: opts.is_causal,
        gqa: opts.enable_gqa,
        mask: opts.attn_mask.is_some(),
    };
    let mut ins = vec![q, k, v];
    ins.extend(opts.attn_mask);
    run1(&op, &ins)
}
