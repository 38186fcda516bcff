//! The paged pass compiled for PJRT devices: a pass's shapes are padded to buckets, and what
//! changes from one pass to the next (token ids, rotary tables, the slots new keys go to, the
//! gather indices and masks of attention) is data, so each bucket is one program
//! ([`tpu_graph::compile`]) that every later pass of its sizes reuses.
//!
//! Two programs take a pass apart: one runs the one-token chunks (decodes) together, `batch`
//! rows over `context` positions each; one runs a longer chunk (a prompt or a piece of one),
//! `chunk` rows over `context` positions. A pass with decodes and prompt pieces calls the first
//! once and the second once per piece. Padding rows write their keys into the pool's last
//! block, which no sequence owns, and read only there. [`Llama::warm_up_paged`] runs every
//! program a cache's buckets can call once, so a server compiles at start and never while it
//! serves.

use tpu_graph::{CompileOptions, CompiledFn, OnRecompileLimit, compile_with};
use tpu_runtime::{Error, Result};
use tpu_tensor::{Device, Tensor};

use super::paged::{Plan, Writes, chunk_gather, chunk_mask, decode_gather, slot};
use super::{Llama, PagedCache, PagedChunk, Parts};
use crate::nn::functional as F;

/// The sizes compiled paged passes pad to (each list sorted, without repeats).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PagedBuckets {
    batch: Vec<usize>,
    chunk: Vec<usize>,
    context: Vec<usize>,
}

/// `lo`, `2 lo`, `4 lo`, ... below `hi`, then `hi`.
fn powers(lo: usize, hi: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut b = lo.clamp(1, hi.max(1));
    while b < hi {
        v.push(b);
        b *= 2;
    }
    v.push(hi.max(1));
    v
}

impl PagedBuckets {
    /// Buckets of decoding sequences per program (`batch`), tokens of a longer chunk
    /// (`chunk`) and positions attended to (`context`); an error when a list is empty or
    /// holds 0.
    pub fn new(batch: &[usize], chunk: &[usize], context: &[usize]) -> Result<PagedBuckets> {
        let sorted = |what: &str, v: &[usize]| {
            if v.is_empty() || v.contains(&0) {
                return Err(Error::invalid_argument(
                    "paged_buckets",
                    format!("{what} buckets {v:?}: expected at least one, each at least 1"),
                ));
            }
            let mut v = v.to_vec();
            v.sort_unstable();
            v.dedup();
            Ok(v)
        };
        Ok(PagedBuckets {
            batch: sorted("batch", batch)?,
            chunk: sorted("chunk", chunk)?,
            context: sorted("context", context)?,
        })
    }

    /// Powers of two up to each limit and the limit itself: 1 to `batch` decoding sequences,
    /// 16 to `chunk` tokens, 64 to `context` positions.
    pub fn up_to(batch: usize, chunk: usize, context: usize) -> PagedBuckets {
        PagedBuckets {
            batch: powers(1, batch),
            chunk: powers(16, chunk),
            context: powers(64, context),
        }
    }

    /// Decoding sequences one program takes.
    pub fn batch(&self) -> &[usize] {
        &self.batch
    }

    /// Tokens of a longer chunk one program takes.
    pub fn chunk(&self) -> &[usize] {
        &self.chunk
    }

    /// Positions one program's rows attend over.
    pub fn context(&self) -> &[usize] {
        &self.context
    }

    /// The (chunk, context) pairs a pass can meet: a chunk bucket with a context that holds
    /// more positions than the chunk bucket below it (a chunk padded to `t` has more tokens
    /// than that, and attends to at least as many).
    fn chunk_pairs(&self) -> Vec<(usize, usize)> {
        let mut pairs = Vec::new();
        for (i, &t) in self.chunk.iter().enumerate() {
            let below = if i == 0 { 0 } else { self.chunk[i - 1] };
            pairs.extend(self.context.iter().filter(|&&c| c > below).map(|&c| (t, c)));
        }
        pairs
    }

    /// Programs a warm-up compiles: every batch with every context, and
    /// every chunk with every context it can meet.
    pub fn programs(&self) -> usize {
        self.batch.len() * self.context.len() + self.chunk_pairs().len()
    }
}

/// The smallest of `sizes` that holds `n`, or an error naming `what`.
fn pick(sizes: &[usize], n: usize, what: &str) -> Result<usize> {
    sizes.iter().copied().find(|&b| b >= n).ok_or_else(|| {
        Error::invalid_argument(
            "forward_paged",
            format!(
                "{n} {what} is past the largest bucket of {sizes:?} (see PagedCache::with_buckets)"
            ),
        )
    })
}

/// One padded row of a compiled pass: its token, position and slot.
type Row = (u32, usize, usize);

/// One program call of a pass.
enum Call<'a> {
    /// These one-token chunks (indices into the pass's), padded to a batch over a context.
    Decode(&'a [usize], usize, usize),
    /// These tokens of a longer chunk, padded to a chunk bucket over a context.
    Chunk(usize, std::ops::Range<usize>, usize, usize),
}

impl Llama {
    /// The compiled paged passes (made on first use): the decodes, a longer chunk.
    fn paged_steps(&self) -> &[CompiledFn; 2] {
        self.paged_steps.get_or_init(|| {
            let make = |name: &str, decode: bool| {
                let parts = self.parts.clone();
                // Every bucket is a program of its own, compiled at warm-up: a new one is
                // expected then, and counted in the metrics either way.
                let opts = CompileOptions::default()
                    .name(name)
                    .recompile_limit(usize::MAX, OnRecompileLimit::Warn)
                    .log_recompiles(false);
                compile_with(opts, move |args: &[Tensor]| parts.paged_step(args, decode))
            };
            [
                make("llama.paged_decode", true),
                make("llama.paged_chunk", false),
            ]
        })
    }

    /// The programs compiled for paged passes so far.
    pub fn paged_programs(&self) -> usize {
        self.paged_steps
            .get()
            .map_or(0, |s| s.iter().map(CompiledFn::programs).sum())
    }

    /// Compiles every program a paged pass over `cache` can call on a PJRT device, by running
    /// each once over padding only (which writes only the block no sequence owns); gives how
    /// many programs ran. Elsewhere nothing compiles, and it gives 0.
    pub fn warm_up_paged(&self, cache: &PagedCache) -> Result<usize> {
        if self.device.as_pjrt().is_none() {
            return Ok(0);
        }
        let b = &cache.buckets;
        for &c in &b.context {
            for &n in &b.batch {
                self.decode_program(cache, &[], n, c)?;
            }
        }
        for &(t, c) in &b.chunk_pairs() {
            self.chunk_program(cache, None, t, c)?;
        }
        Ok(b.programs())
    }

    /// [`Llama::forward_paged`] on a PJRT device (the chunks are checked): the logits on the
    /// host. Every program's bucket is chosen before any runs, so a pass that does not fit
    /// the buckets fails without writing the cache.
    pub(super) fn paged_compiled(
        &self,
        cache: &PagedCache,
        chunks: &[PagedChunk],
    ) -> Result<Tensor> {
        let b = &cache.buckets;
        let max_batch = b.batch.last().copied().unwrap_or(1);
        let max_chunk = b.chunk.last().copied().unwrap_or(1);
        let decodes: Vec<usize> = (0..chunks.len())
            .filter(|&i| chunks[i].tokens.len() == 1)
            .collect();
        let mut calls = Vec::new();
        for group in decodes.chunks(max_batch) {
            let longest = group
                .iter()
                .map(|&i| chunks[i].start + 1)
                .max()
                .unwrap_or(1);
            let n = pick(&b.batch, group.len(), "decoding sequences")?;
            calls.push(Call::Decode(
                group,
                n,
                pick(&b.context, longest, "positions")?,
            ));
        }
        for (i, ch) in chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.tokens.len() > 1)
        {
            for at in (0..ch.tokens.len()).step_by(max_chunk) {
                let to = (at + max_chunk).min(ch.tokens.len());
                let t = pick(&b.chunk, to - at, "tokens in a chunk")?;
                let context = pick(&b.context, ch.start + to, "positions")?;
                calls.push(Call::Chunk(i, at..to, t, context));
            }
        }
        let mut logits: Vec<Option<Tensor>> = vec![None; chunks.len()];
        for call in calls {
            match call {
                Call::Decode(group, n, context) => {
                    let rows: Vec<&PagedChunk> = group.iter().map(|&i| &chunks[i]).collect();
                    let out = self.decode_program(cache, &rows, n, context)?;
                    for (r, &i) in group.iter().enumerate() {
                        if chunks[i].logits {
                            logits[i] = Some(out.narrow(0, r as i64, 1)?);
                        }
                    }
                }
                Call::Chunk(i, range, t, context) => {
                    let ch = &chunks[i];
                    let last = range.end == ch.tokens.len();
                    let piece = (&ch.tokens[range.clone()], ch.start + range.start, ch.blocks);
                    let out = self.chunk_program(cache, Some(piece), t, context)?;
                    if ch.logits && last {
                        logits[i] = Some(out);
                    }
                }
            }
        }
        let rows: Vec<&Tensor> = logits.iter().flatten().collect();
        match rows.len() {
            0 => Tensor::zeros([0, self.config.vocab_size], self.dtype(), &Device::cpu()),
            _ => crate::ops::movement::cat(&rows, 0),
        }
    }

    /// The arguments every compiled pass starts with: ids `[1, rows]`, the rotary tables and
    /// the slots of `rows` (padded to `n` with token 0 at position 0 into the unowned block).
    fn row_args(&self, cache: &PagedCache, rows: &[Row], n: usize) -> Result<Vec<Tensor>> {
        let dev = &self.device;
        let pad = (0, 0, cache.trash());
        let rows: Vec<Row> = (0..n)
            .map(|r| rows.get(r).copied().unwrap_or(pad))
            .collect();
        let positions: Vec<usize> = rows.iter().map(|r| r.1).collect();
        let (cos, sin) =
            F::rotary_cos_sin_freqs(&positions, &self.config.inv_freq(), self.dtype(), dev)?;
        Ok(vec![
            Tensor::from_vec(rows.iter().map(|r| r.0 as i64).collect(), [1, n], dev)?,
            cos,
            sin,
            Tensor::from_vec(rows.iter().map(|r| r.2 as i64).collect(), [n], dev)?,
        ])
    }

    /// Runs the decode program for `rows` padded to `n` rows over `context` positions; gives
    /// the logits of every row `[n, vocab]` on the host.
    fn decode_program(
        &self,
        cache: &PagedCache,
        rows: &[&PagedChunk],
        n: usize,
        context: usize,
    ) -> Result<Tensor> {
        let (dev, bs) = (&self.device, cache.block_size());
        let new: Vec<Row> = rows
            .iter()
            .map(|c| (c.tokens[0], c.start, slot(c.blocks, bs, c.start)))
            .collect();
        let seqs: Vec<(&[usize], usize)> = rows.iter().map(|c| (c.blocks, c.start + 1)).collect();
        let (idx, mask) = decode_gather(&seqs, bs, n, context, cache.trash());
        let mut args = self.row_args(cache, &new, n)?;
        args.extend([
            Tensor::from_vec(idx, [n * context], dev)?,
            Tensor::from_vec(mask, [n, 1, context], dev)?,
            Tensor::from_vec((0..n as i64).collect(), [n], dev)?,
        ]);
        self.run_paged_program(0, cache, args)
    }

    /// Runs the chunk program for `piece` (tokens, first position, block table; `None`:
    /// padding only) padded to `t` tokens over `context` positions; gives the logits of its
    /// last token `[1, vocab]` on the host.
    fn chunk_program(
        &self,
        cache: &PagedCache,
        piece: Option<(&[u32], usize, &[usize])>,
        t: usize,
        context: usize,
    ) -> Result<Tensor> {
        let (dev, bs) = (&self.device, cache.block_size());
        let (tokens, start, blocks) = piece.unwrap_or((&[], 0, &[]));
        let new: Vec<Row> = tokens
            .iter()
            .enumerate()
            .map(|(j, &tok)| (tok, start + j, slot(blocks, bs, start + j)))
            .collect();
        let end = start + tokens.len();
        let idx = chunk_gather(blocks, bs, end, context, cache.trash());
        let mask = chunk_mask(start, tokens.len(), t, context);
        let mut args = self.row_args(cache, &new, t)?;
        args.extend([
            Tensor::from_vec(idx, [context], dev)?,
            Tensor::from_vec(mask, [t, context], dev)?,
            Tensor::from_vec(vec![tokens.len().saturating_sub(1) as i64], [1], dev)?,
        ]);
        self.run_paged_program(1, cache, args)
    }

    /// Runs compiled paged pass `which` over `args` and the pools; gives its logits on the
    /// host.
    fn run_paged_program(
        &self,
        which: usize,
        cache: &PagedCache,
        mut args: Vec<Tensor>,
    ) -> Result<Tensor> {
        for (k, v) in &cache.layers {
            args.extend([k.clone(), v.clone()]);
        }
        let mut out = self.paged_steps()[which].call(&args)?;
        out.pop()
            .ok_or_else(|| Error::internal("llama", "a paged pass without logits"))?
            .to_device(&Device::cpu())
    }
}

impl Parts {
    /// One compiled paged pass: `args` are the token ids `[1, rows]`, the rotary tables, the
    /// new tokens' slots `[rows]`, the gather indices and mask (decodes: `[rows × context]`
    /// and `[rows, 1, context]`; a chunk: `[context]` and `[rows, context]`), the rows whose
    /// logits are wanted, then each layer's keys and values (written in place). Gives the
    /// logits.
    fn paged_step(&self, args: &[Tensor], decode: bool) -> Result<Vec<Tensor>> {
        let [ids, cos, sin, slots, idx, mask, wanted, pools @ ..] = args else {
            return Err(Error::internal("llama", "a paged pass's inputs"));
        };
        if pools.len() != 2 * self.layers.len() {
            return Err(Error::internal("llama", "a paged pass's pools"));
        }
        let rows = ids.shape()[1];
        let plan = Plan {
            writes: Writes::Slots(slots.clone()),
            decode: decode.then(|| (rows, idx.shape()[0] / rows, idx.clone(), mask.clone())),
            prefill: match decode {
                true => Vec::new(),
                false => vec![(0, rows, idx.clone(), Some(mask.clone()))],
            },
        };
        let pools = pools.chunks(2).map(|p| (&p[0], &p[1]));
        Ok(vec![self.paged_run(
            ids,
            (cos, sin),
            &plan,
            pools,
            wanted,
        )?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_up_to_each_limit() {
        let b = PagedBuckets::up_to(6, 512, 100);
        assert_eq!(b.batch(), [1, 2, 4, 6]);
        assert_eq!(b.chunk(), [16, 32, 64, 128, 256, 512]);
        assert_eq!(b.context(), [64, 100]);
        assert_eq!(PagedBuckets::up_to(1, 8, 32).context(), [32]);
        assert_eq!(PagedBuckets::up_to(1, 8, 32).chunk(), [8]);
    }

    #[test]
    fn a_warm_up_compiles_the_pairs_a_pass_can_meet() {
        let b = PagedBuckets::new(&[4, 1, 2, 2], &[16, 32], &[64, 16, 32]).unwrap();
        assert_eq!(b.batch(), [1, 2, 4]);
        assert_eq!(b.context(), [16, 32, 64]);
        // Chunks of 1..16 tokens reach every context; of 17..32, those past 16.
        assert_eq!(
            b.chunk_pairs(),
            [(16, 16), (16, 32), (16, 64), (32, 32), (32, 64)]
        );
        assert_eq!(b.programs(), 9 + 5);
        let e = PagedBuckets::new(&[], &[16], &[64]).unwrap_err();
        assert!(e.to_string().contains("batch buckets []"), "{e}");
        assert!(PagedBuckets::new(&[1], &[0], &[64]).is_err());
        let e = pick(&[16, 32], 40, "tokens in a chunk").unwrap_err();
        assert!(e.to_string().contains("40 tokens in a chunk"), "{e}");
    }
}
