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

use super::{Llama, PagedBuckets, Parts};
use crate::nn::functional as F;
use crate::prelude::*;

/// The keys and values of a pool of blocks, per layer (see the module doc). Sequences share
/// blocks by listing the same ones in their tables (a prefix cache), so the pool itself does
/// not know which sequence a slot belongs to: the caller's block manager does.
pub struct PagedCache {
    block_size: usize,
    blocks: usize,
    /// Keys and values of every layer, `[kv heads, (blocks + 1) × block size, head dim]`: the
    /// last block is no sequence's, the slots padded rows of a compiled pass write to.
    pub(super) layers: Vec<(Tensor, Tensor)>,
    /// The sizes compiled passes pad to.
    pub(super) buckets: PagedBuckets,
}

impl PagedCache {
    /// A pool of `blocks` blocks of `block_size` positions for `model`, zeroed, on the model's
    /// device and in its dtype (and one block more, for the padding of compiled passes), with
    /// the buckets [`PagedBuckets::up_to`] gives for at most 64 decoding sequences, chunks of
    /// 512 tokens and the model's context.
    pub fn new(model: &Llama, blocks: usize, block_size: usize) -> Result<PagedCache> {
        if blocks == 0 || block_size == 0 {
            return Err(Error::invalid_argument(
                "paged_cache",
                format!("{blocks} blocks of {block_size} positions: both must be at least 1"),
            ));
        }
        let c = &model.config;
        let shape = [c.num_kv_heads, (blocks + 1) * block_size, c.head_dim()];
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
            buckets: PagedBuckets::up_to(64, 512, c.max_positions),
        })
    }

    /// This cache with compiled passes padded to `buckets` (they matter on PJRT devices only).
    pub fn with_buckets(mut self, buckets: PagedBuckets) -> PagedCache {
        self.buckets = buckets;
        self
    }

    /// The sizes compiled passes pad to.
    pub fn buckets(&self) -> &PagedBuckets {
        &self.buckets
    }

    /// The first slot of the block no sequence owns, which padding writes to.
    pub(super) fn trash(&self) -> usize {
        self.blocks * self.block_size
    }

    /// Bytes one block takes for `model` (keys and values of every layer; the pool takes one
    /// block more than it has).
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
pub(super) fn slot(blocks: &[usize], bs: usize, p: usize) -> usize {
    blocks[p / bs] * bs + p % bs
}

/// The gather indices (`[rows × width]`) and mask (`[rows, 1, width]`) of one-token chunks:
/// `seqs` gives each one's block table and how many positions it attends to; rows past
/// `seqs.len()` are padding. Positions a row does not see read slot `fill` (any slot will do:
/// the mask hides it), except that a padding row sees position 0, so that no row's softmax is
/// over nothing.
pub(super) fn decode_gather(
    seqs: &[(&[usize], usize)],
    bs: usize,
    rows: usize,
    width: usize,
    fill: usize,
) -> (Vec<i64>, Vec<bool>) {
    let mut idx = Vec::with_capacity(rows * width);
    let mut mask = Vec::with_capacity(rows * width);
    for r in 0..rows {
        let (blocks, len) = seqs.get(r).copied().unwrap_or((&[], 0));
        for p in 0..width {
            idx.push(if p < len { slot(blocks, bs, p) } else { fill } as i64);
            mask.push(p < len || (len == 0 && p == 0));
        }
    }
    (idx, mask)
}

/// The gather indices (`[width]`) of a chunk that ends at position `end`: its slots, then
/// `fill`.
pub(super) fn chunk_gather(
    blocks: &[usize],
    bs: usize,
    end: usize,
    width: usize,
    fill: usize,
) -> Vec<i64> {
    (0..width)
        .map(|p| if p < end { slot(blocks, bs, p) } else { fill } as i64)
        .collect()
}

/// The mask (`[rows, width]`) of a chunk of `len` tokens from position `start`: each token
/// sees the positions up to its own; rows past `len` are padding and see position 0.
pub(super) fn chunk_mask(start: usize, len: usize, rows: usize, width: usize) -> Vec<bool> {
    (0..rows)
        .flat_map(|q| {
            (0..width).map(move |p| match q < len {
                true => p <= start + q,
                false => p == 0,
            })
        })
        .collect()
}

/// Where a pass's new keys and values go.
pub(super) enum Writes {
    /// `(first slot, first token, count)`: runs of new tokens with consecutive slots, each
    /// copied in place (eager passes).
    Runs(Vec<(usize, usize, usize)>),
    /// Each new token's slot (`[rows]`, i64), scattered at once: a compiled pass's slots are
    /// data, and the pool's buffer is donated, so the scatter writes in place.
    Slots(Tensor),
}

/// What every layer of one pass shares: where the new keys go, what each group attends to.
pub(super) struct Plan {
    pub(super) writes: Writes,
    /// The one-token chunks: `(rows, longest, gather indices [rows × longest], mask [rows, 1,
    /// longest])`, when there are any.
    pub(super) decode: Option<(usize, usize, Tensor, Tensor)>,
    /// Each longer chunk: `(first token, tokens, gather indices, mask when it starts past 0)`.
    pub(super) prefill: Vec<(usize, usize, Tensor, Option<Tensor>)>,
}

impl Llama {
    /// Logits `[n, vocab]` of the last token of every chunk that wants them (in the chunks'
    /// order), after writing the chunks' keys and values into `cache` (see the module doc).
    /// Chunks of the same pass must not write the same slots.
    ///
    /// On a PJRT device the pass runs as compiled programs (one for the decodes, one per
    /// longer chunk, each padded to `cache`'s buckets) and the logits come back on the host,
    /// where a sampler reads them: joining the programs' rows on the device would be programs
    /// of their own.
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
        if self.device.as_pjrt().is_some() {
            return self.paged_compiled(cache, chunks);
        }
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
                let seqs: Vec<(&[usize], usize)> = order[..rows]
                    .iter()
                    .map(|&i| (chunks[i].blocks, chunks[i].start + 1))
                    .collect();
                let longest = seqs.iter().map(|s| s.1).max().unwrap_or(1);
                let (idx, mask) = decode_gather(&seqs, bs, rows, longest, 0);
                Some((
                    rows,
                    longest,
                    Tensor::from_vec(idx, [rows * longest], dev)?,
                    Tensor::from_vec(mask, [rows, 1, longest], dev)?,
                ))
            }
        };
        let prefill = order[decodes..]
            .iter()
            .map(|&i| {
                let ch = &chunks[i];
                let (l, end) = (ch.tokens.len(), ch.start + ch.tokens.len());
                let idx = chunk_gather(ch.blocks, bs, end, end, 0);
                // From position 0 the causal mask is attention's own.
                let mask = match ch.start {
                    0 => None,
                    s => Some(Tensor::from_vec(chunk_mask(s, l, l, end), [l, end], dev)?),
                };
                Ok((first[i], l, Tensor::from_vec(idx, [end], dev)?, mask))
            })
            .collect::<Result<Vec<_>>>()?;
        let plan = Plan {
            writes: Writes::Runs(writes),
            decode,
            prefill,
        };
        let wanted: Vec<i64> = chunks
            .iter()
            .zip(&first)
            .filter(|(ch, _)| ch.logits)
            .map(|(ch, &f)| (f + ch.tokens.len() - 1) as i64)
            .collect();
        let n = wanted.len();
        let rows = ids.len();
        let rope = F::rotary_cos_sin_freqs(&positions, &self.config.inv_freq(), self.dtype(), dev)?;
        self.parts.paged_run(
            &Tensor::from_vec(ids, [1, rows], dev)?,
            (&rope.0, &rope.1),
            &plan,
            cache.layers.iter().map(|(k, v)| (k, v)),
            &Tensor::from_vec(wanted, [n], dev)?,
        )
    }
}

impl Parts {
    /// The layers and the head over a pass's rows: `ids` `[1, rows]`, the rotary tables of
    /// the rows' positions, the pools of every layer; gives the logits `[n, vocab]` of the
    /// rows `wanted` lists.
    pub(super) fn paged_run<'a>(
        &self,
        ids: &Tensor,
        rope: (&Tensor, &Tensor),
        plan: &Plan,
        pools: impl Iterator<Item = (&'a Tensor, &'a Tensor)>,
        wanted: &Tensor,
    ) -> Result<Tensor> {
        let c = &self.config;
        let mut x = self.embed.rows(ids)?;
        for (layer, (kc, vc)) in self.layers.iter().zip(pools) {
            x = layer.forward_with(c, &x, rope, |q, k, v| {
                self.paged_attention(plan, (kc, vc), q, k, v)
            })?;
        }
        let n = wanted.shape()[0];
        let logits = self.head(x.index_select(1, wanted)?, false)?;
        let vocab = logits.shape()[2];
        logits.reshape([n, vocab])
    }

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
        let (kc, vc) = match &plan.writes {
            Writes::Runs(runs) => {
                for &(s, r, n) in runs {
                    kc.narrow(1, s as i64, n)?
                        .copy_(&k.narrow(1, r as i64, n)?)?;
                    vc.narrow(1, s as i64, n)?
                        .copy_(&v.narrow(1, r as i64, n)?)?;
                }
                (kc.clone(), vc.clone())
            }
            Writes::Slots(slots) => {
                let (k, v) = (kc.index_copy(1, slots, &k)?, vc.index_copy(1, slots, &v)?);
                kc.copy_(&k)?;
                vc.copy_(&v)?;
                (k, v)
            }
        };
        let (kc, vc) = (&kc, &vc);
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
            let a = F::scaled_dot_product_attention_with(
                &qd,
                &gather(kc)?,
                &gather(vc)?,
                &F::AttentionOptions::new().attn_mask(mask),
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
