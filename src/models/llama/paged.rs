//! The forward pass over a paged KV cache, as a serving engine batches it: every layer's keys
//! and values live in one pool of fixed-size blocks (`[kv heads, blocks × block size, head
//! dim]`), a sequence owns a list of blocks (its block table: block `i` holds its positions
//! `i × block size ..`), and one pass takes a chunk of new tokens from each of several
//! sequences at different positions, prompts and decodes mixed.
//!
//! The projections and the MLP run once over all the chunks' tokens together (one row each);
//! the new keys and values are written into their slots in place; attention runs per group:
//! the one-token chunks (decodes) as one batch over their gathered keys, masked to each row's
//! length, and every longer chunk (a prompt or a piece of one) over its own, causal from its
//! start. Each row computes what the same sequence computes alone.
//!
//! The pool is head-major so that a gather of slots comes out in the layout attention reads
//! (`[kv heads, rows, positions, head dim]`, with no copy to make it contiguous): the decodes
//! attend as a batch of `kv heads × rows` with the query heads of one kv head (grouped-query
//! attention) as that batch entry's queries.

use tpu_runtime::{Error, Result};
use tpu_tensor::Tensor;

use super::{Llama, Parts};
use crate::nn::functional as F;
use crate::prelude::*;

/// The keys and values of a pool of blocks, per layer (see the module doc). Sequences share
/// blocks by listing the same ones in their tables (a prefix cache), so the pool itself does
/// not know which sequence a slot belongs to: the caller's block manager does.
pub struct PagedCache {
    block_size: usize,
    blocks: usize,
    /// Keys and values of every layer, `[kv heads, blocks × block size, head dim]`.
    layers: Vec<(Tensor, Tensor)>,
}

impl PagedCache {
    /// A pool of `blocks` blocks of `block_size` positions for `model`, zeroed, on the model's
    /// device and in its dtype.
    pub fn new(model: &Llama, blocks: usize, block_size: usize) -> Result<PagedCache> {
        if blocks == 0 || block_size == 0 {
            return Err(Error::invalid_argument(
                "paged_cache",
                format!("{blocks} blocks of {block_size} positions: both must be at least 1"),
            ));
        }
        let c = &model.config;
        let shape = [c.num_kv_heads, blocks * block_size, c.head_dim()];
        let layers = (0..c.num_layers)
            .map(|_| {
                let z = || Tensor::zeros(shape, model.dtype(), model.device());
                Ok((z()?, z()?))
            })
            .collect::<Result<_>>()?;
        Ok(PagedCache {
            block_size,
            blocks,
            layers,
        })
    }

    /// Bytes one block takes for `model` (keys and values of every layer).
    pub fn block_bytes(model: &Llama, block_size: usize) -> usize {
        let c = &model.config;
        2 * c.num_layers
            * block_size
            * c.num_kv_heads
            * c.head_dim()
            * model.dtype().size_in_bytes()
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn blocks(&self) -> usize {
        self.blocks
    }
}

/// One sequence's part of a paged pass: new tokens that follow the `start` positions already
/// in its blocks.
#[derive(Clone, Copy, Debug)]
pub struct PagedChunk<'a> {
    /// The new tokens (at least one).
    pub tokens: &'a [u32],
    /// The position of the first new token: the positions before it are in the cache.
    pub start: usize,
    /// The sequence's block table, covering at least `start + tokens.len()` positions.
    pub blocks: &'a [usize],
    /// Whether the logits of its last token are wanted.
    pub logits: bool,
}

/// The slot of position `p` of a sequence whose block table is `blocks`.
fn slot(blocks: &[usize], bs: usize, p: usize) -> usize {
    blocks[p / bs] * bs + p % bs
}

/// What every layer of one pass shares: where the new keys go, what each group attends to.
struct Plan {
    /// `(first slot, first token, count)`: runs of new tokens with consecutive slots.
    writes: Vec<(usize, usize, usize)>,
    /// The one-token chunks: gather indices `[rows × longest]` and mask `[rows, 1, 1,
    /// longest]`, when there are any.
    decode: Option<(usize, usize, Tensor, Tensor)>,
    /// Each longer chunk: `(first token, tokens, gather indices, mask when it starts past 0)`.
    prefill: Vec<(usize, usize, Tensor, Option<Tensor>)>,
}

impl Llama {
    /// Logits `[n, vocab]` of the last token of every chunk that wants them (in the chunks'
    /// order), after writing the chunks' keys and values into `cache` (see the module doc).
    /// Chunks of the same pass must not write the same slots.
    pub fn forward_paged(&self, cache: &PagedCache, chunks: &[PagedChunk]) -> Result<Tensor> {
        crate::tpu_ops::cpu::on_device_threads(&self.device, || self.paged(cache, chunks))
    }

    /// Checks the chunks against the cache and the model.
    fn check_paged(&self, cache: &PagedCache, chunks: &[PagedChunk]) -> Result<()> {
        let c = &self.config;
        let bad = |m: String| Err(Error::invalid_argument("forward_paged", m));
        if chunks.is_empty() {
            return bad("no chunks".into());
        }
        let (want_kv, want_hd) = (c.num_kv_heads, c.head_dim());
        match cache.layers.first() {
            Some((k, _))
                if cache.layers.len() == c.num_layers
                    && [k.shape()[0], k.shape()[2]] == [want_kv, want_hd]
                    && k.dtype() == self.dtype()
                    && k.device() == self.device() => {}
            _ => return bad("a cache made for another model (see PagedCache::new)".into()),
        }
        let bs = cache.block_size;
        for (i, ch) in chunks.iter().enumerate() {
            let end = ch.start + ch.tokens.len();
            if ch.tokens.is_empty() {
                return bad(format!("chunk {i} has no tokens"));
            }
            if end > c.max_positions {
                return bad(format!(
                    "chunk {i} reaches position {end}, the model takes at most {}",
                    c.max_positions
                ));
            }
            if ch.blocks.len() * bs < end {
                return bad(format!(
                    "chunk {i} reaches position {end}, its {} blocks of {bs} hold {}",
                    ch.blocks.len(),
                    ch.blocks.len() * bs
                ));
            }
            if let Some(&b) = ch.blocks.iter().find(|&&b| b >= cache.blocks) {
                return bad(format!(
                    "chunk {i} lists block {b}, the cache has {}",
                    cache.blocks
                ));
            }
            if let Some(&t) = ch.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return bad(format!(
                    "chunk {i} has token {t}, the vocabulary has {}",
                    c.vocab_size
                ));
            }
        }
        Ok(())
    }

    /// [`Llama::forward_paged`] on the device's threads.
    fn paged(&self, cache: &PagedCache, chunks: &[PagedChunk]) -> Result<Tensor> {
        self.check_paged(cache, chunks)?;
        let dev = self.device();
        let bs = cache.block_size;
        // Decodes first, so they are one run of rows; then the longer chunks.
        let order: Vec<usize> = (0..chunks.len())
            .filter(|&i| chunks[i].tokens.len() == 1)
            .chain((0..chunks.len()).filter(|&i| chunks[i].tokens.len() > 1))
            .collect();
        let (mut ids, mut positions, mut writes) = (Vec::new(), Vec::new(), Vec::new());
        // Each chunk's first row.
        let mut first = vec![0; chunks.len()];
        for &i in &order {
            let ch = &chunks[i];
            first[i] = ids.len();
            for (j, &t) in ch.tokens.iter().enumerate() {
                let (p, row) = (ch.start + j, ids.len());
                let s = slot(ch.blocks, bs, p);
                match writes.last_mut() {
                    Some((s0, r0, n)) if j > 0 && *s0 + *n == s && *r0 + *n == row => *n += 1,
                    _ => writes.push((s, row, 1)),
                }
                ids.push(t as i64);
                positions.push(p);
            }
        }
        let decodes = order
            .iter()
            .take_while(|&&i| chunks[i].tokens.len() == 1)
            .count();
        let decode = match decodes {
            0 => None,
            rows => {
                let lens: Vec<usize> = order[..rows].iter().map(|&i| chunks[i].start + 1).collect();
                let longest = lens.iter().copied().max().unwrap_or(1);
                let mut idx = Vec::with_capacity(rows * longest);
                let mut mask = Vec::with_capacity(rows * longest);
                for (&i, &len) in order[..rows].iter().zip(&lens) {
                    for p in 0..longest {
                        // Past a row's length any slot will do: the mask hides it.
                        idx.push(if p < len {
                            slot(chunks[i].blocks, bs, p)
                        } else {
                            0
                        } as i64);
                        mask.push(p < len);
                    }
                }
                Some((
                    rows,
                    longest,
                    Tensor::from_vec(idx, [rows * longest], dev)?,
                    Tensor::from_vec(mask, [rows, 1, 1, longest], dev)?,
                ))
            }
        };
        let prefill = order[decodes..]
            .iter()
            .map(|&i| {
                let ch = &chunks[i];
                let (l, end) = (ch.tokens.len(), ch.start + ch.tokens.len());
                let idx: Vec<i64> = (0..end).map(|p| slot(ch.blocks, bs, p) as i64).collect();
                let mask = match ch.start {
                    0 => None,
                    s => {
                        let m: Vec<bool> = (0..l)
                            .flat_map(|q| (0..end).map(move |p| p <= s + q))
                            .collect();
                        Some(Tensor::from_vec(m, [l, end], dev)?)
                    }
                };
                Ok((first[i], l, Tensor::from_vec(idx, [end], dev)?, mask))
            })
            .collect::<Result<Vec<_>>>()?;
        let plan = Plan {
            writes,
            decode,
            prefill,
        };
        let rows = ids.len();
        let ids = Tensor::from_vec(ids, [1, rows], dev)?;
        let (cos, sin) =
            F::rotary_cos_sin_freqs(&positions, &self.config.inv_freq(), self.dtype(), dev)?;
        let p = &self.parts;
        let mut x = p.embed.rows(&ids)?;
        for (layer, (kc, vc)) in p.layers.iter().zip(&cache.layers) {
            x = layer.forward_with(&self.config, &x, (&cos, &sin), |q, k, v| {
                p.paged_attention(&plan, (kc, vc), q, k, v)
            })?;
        }
        let wanted: Vec<i64> = chunks
            .iter()
            .zip(&first)
            .filter(|(ch, _)| ch.logits)
            .map(|(ch, &f)| (f + ch.tokens.len() - 1) as i64)
            .collect();
        let n = wanted.len();
        let x = x.index_select(1, &Tensor::from_vec(wanted, [n], dev)?)?;
        let logits = p.head(x, false)?;
        let vocab = logits.shape()[2];
        logits.reshape([n, vocab])
    }
}

impl Parts {
    /// One layer's attention in a paged pass: `q` `[1, heads, rows, head dim]`, the new keys
    /// and values `[1, kv heads, rows, head dim]` (written into the cache here); gives `[1,
    /// heads, rows, head dim]`.
    fn paged_attention(
        &self,
        plan: &Plan,
        (kc, vc): (&Tensor, &Tensor),
        q: Tensor,
        k: Tensor,
        v: Tensor,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim());
        let group = nh / nkv;
        // [kv heads, rows, head dim], as the cache lays out slots.
        let (k, v) = (k.squeeze_dim(0)?, v.squeeze_dim(0)?);
        for &(s, r, n) in &plan.writes {
            kc.narrow(1, s as i64, n)?
                .copy_(&k.narrow(1, r as i64, n)?)?;
            vc.narrow(1, s as i64, n)?
                .copy_(&v.narrow(1, r as i64, n)?)?;
        }
        let mut out = Vec::with_capacity(plan.prefill.len() + 1);
        if let Some((rows, longest, idx, mask)) = &plan.decode {
            let (rows, longest) = (*rows, *longest);
            // Keys [kv heads, rows, longest, head dim] straight from the gather; each kv head's
            // `group` query heads are its queries: [kv heads, rows, group, head dim].
            let gather = |cache: &Tensor| {
                cache
                    .index_select(1, idx)?
                    .reshape([nkv, rows, longest, hd])
            };
            let qd = q
                .narrow(2, 0, rows)?
                .reshape([nkv, group, rows, hd])?
                .transpose(1, 2)?;
            let mask = mask.reshape([rows, 1, longest])?;
            let a = F::scaled_dot_product_attention_with(
                &qd,
                &gather(kc)?,
                &gather(vc)?,
                &F::AttentionOptions::new().attn_mask(&mask),
            )?;
            // Back to [1, heads, rows, head dim].
            out.push(a.transpose(1, 2)?.reshape([1, nh, rows, hd])?);
        }
        let opts = F::AttentionOptions::new().enable_gqa(nkv != nh);
        for (at, l, idx, mask) in &plan.prefill {
            let qc = q.narrow(2, *at as i64, *l)?;
            let opts = match mask {
                Some(m) => opts.attn_mask(m),
                None => opts.is_causal(true),
            };
            out.push(F::scaled_dot_product_attention_with(
                &qc,
                &kc.index_select(1, idx)?.unsqueeze(0)?,
                &vc.index_select(1, idx)?.unsqueeze(0)?,
                &opts,
            )?);
        }
        match out.len() {
            1 => Ok(out.remove(0)),
            _ => crate::ops::movement::cat(&out.iter().collect::<Vec<_>>(), 2),
        }
    }
}
