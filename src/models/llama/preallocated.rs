//! The forward pass over a preallocated cache, which compiles: every layer's keys and values
//! live in `[batch, kv heads, capacity, head dim]` tensors, and a pass writes its new positions
//! into them in place, so a pass has the same shapes at every position.
//!
//! What changes from one position to the next is data, passed as tensors: the rotary tables of
//! the new positions, the attention mask over the whole capacity (a query sees its row's real
//! slots up to itself; slots not yet written are never seen), and the slots the new keys and
//! values are scattered to (in place: a step writes its new slots, not the whole cache). On a PJRT device the pass is one compiled program
//! ([`tpu_graph::compile`]) per batch size, new-token count and capacity: the cache stays on
//! the device, the program writes it in place (its buffers are donated), and nothing
//! recompiles from one token to the next. Generation pads prompts to length buckets and the
//! capacity to a power of two, so a run compiles one prefill and one decode program. Elsewhere
//! the same pass runs eagerly.

use tpu_graph::{CompileOptions, CompiledFn, OnRecompileLimit, compile_with};
use tpu_runtime::{Error, Result};
use tpu_tensor::Tensor;

use super::{KvCache, Llama, Parts, batch_and_len};
use crate::prelude::*;

/// The smallest bucket a length is padded to.
const MIN_BUCKET: usize = 8;

/// `n` rounded up to a power of two (at least [`MIN_BUCKET`]), but never past `max`, and never
/// below `n`.
pub(crate) fn bucket(n: usize, max: usize) -> usize {
    n.next_power_of_two().max(MIN_BUCKET).min(max).max(n)
}

impl KvCache {
    /// This cache with room for `slots` positions in every layer, allocated by the first
    /// forward pass. A pass that needs more grows it (to the next power of two, at most the
    /// model's context). Every pass over it has the same shapes, so on a PJRT device it runs
    /// as one compiled program (see [`Llama::forward`]).
    pub fn with_capacity(mut self, slots: usize) -> KvCache {
        self.capacity = Some(slots);
        self
    }

    /// Positions the cache has room for before it grows (`None`: it grows with every pass).
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }
}

/// Which compiled pass: the decode of one token, the prefill's last logits, or all logits.
fn step_index(len: usize, last_only: bool) -> usize {
    match (len, last_only) {
        (1, _) => 0,
        (_, true) => 1,
        (_, false) => 2,
    }
}

impl Llama {
    /// The programs compiled for passes over preallocated caches so far (see
    /// [`Llama::forward`]): one per batch size, new-token count and capacity met.
    pub fn programs(&self) -> usize {
        self.steps
            .get()
            .map_or(0, |s| s.iter().map(CompiledFn::programs).sum())
    }

    /// The compiled passes (made on first use).
    fn steps(&self) -> &[CompiledFn; 3] {
        self.steps.get_or_init(|| {
            let make = |name: &str, last_only: bool| {
                let parts = self.parts.clone();
                // Buckets bound the programs (a few lengths, a few capacities, the batch
                // sizes met); each new one still says why it compiles.
                let opts = CompileOptions::default()
                    .name(name)
                    .recompile_limit(64, OnRecompileLimit::Warn);
                compile_with(opts, move |args: &[Tensor]| parts.step(args, last_only))
            };
            [
                make("llama.decode", true),
                make("llama.prefill", true),
                make("llama.forward", false),
            ]
        })
    }

    /// [`Llama::forward`] over a preallocated cache.
    pub(super) fn forward_preallocated(
        &self,
        ids: &Tensor,
        cache: &mut KvCache,
        last_only: bool,
    ) -> Result<Tensor> {
        let (b, l, _) = self.check_input(ids, cache)?;
        let past = cache.len;
        let cap = self.reserve(cache, b, past + l)?;
        let pads = match cache.pad.is_empty() {
            true => vec![0; b],
            false => cache.pad.clone(),
        };
        let dev = &self.device;
        let (cos, sin) = self.rope(Some(&pads), past, l)?;
        let mask: Vec<bool> = pads
            .iter()
            .flat_map(|&p| {
                (0..l).flat_map(move |i| (0..cap).map(move |j| Self::sees(p, past, i, j)))
            })
            .collect();
        let mask = Tensor::from_vec(mask, [b, 1, l, cap], dev)?;
        // The slots the new positions go to.
        let slots: Vec<i64> = (past..past + l).map(|s| s as i64).collect();
        let mut args = vec![
            ids.clone(),
            cos,
            sin,
            mask,
            Tensor::from_vec(slots, [l], dev)?,
        ];
        for (k, v) in cache.layers.iter().flatten() {
            args.extend([k.clone(), v.clone()]);
        }
        let mut out = match dev.as_pjrt() {
            Some(_) => self.steps()[step_index(l, last_only)].call(&args)?,
            None => self.parts.step(&args, last_only)?,
        };
        cache.len = past + l;
        out.pop()
            .ok_or_else(|| Error::internal("llama", "a pass without logits"))
    }

    /// Makes room in `cache` for `need` positions of `b` rows; gives the capacity.
    fn reserve(&self, cache: &mut KvCache, b: usize, need: usize) -> Result<usize> {
        let c = &self.config;
        if std::sync::Arc::strong_count(&cache.clones) > 1 {
            // Another clone holds these tensors: write into copies of them.
            for (k, v) in cache.layers.iter_mut().flatten() {
                (*k, *v) = (k.copy()?, v.copy()?);
            }
            cache.clones = Default::default();
        }
        let have = cache.capacity.unwrap_or(0);
        let cap = if need > have {
            bucket(need, c.max_positions)
        } else {
            have
        };
        cache.capacity = Some(cap);
        let shape = [b, c.num_kv_heads, cap, c.head_dim()];
        let zeros = |n: usize| {
            Tensor::zeros(
                [b, c.num_kv_heads, n, c.head_dim()],
                self.dtype(),
                &self.device,
            )
        };
        if cache.layers.iter().all(Option::is_none) {
            cache.layers = (0..c.num_layers)
                .map(|_| Ok(Some((zeros(cap)?, zeros(cap)?))))
                .collect::<Result<_>>()?;
            return Ok(cap);
        }
        for (k, v) in cache.layers.iter_mut().flatten() {
            let grown = k.shape()[2];
            if grown < cap {
                let more = zeros(cap - grown)?;
                *k = crate::ops::movement::cat(&[&*k, &more], 2)?;
                *v = crate::ops::movement::cat(&[&*v, &more], 2)?;
            }
            debug_assert_eq!(k.shape(), shape);
        }
        Ok(cap)
    }
}

impl Parts {
    /// One pass over a preallocated cache: `args` are the token ids `[b, l]`, the rotary
    /// tables `[b, 1, l, head dim]`, the mask `[b, 1, l, capacity]`, the slots the new
    /// positions go to `[l]` (i64), then each layer's keys and values, written in
    /// place. Gives the logits.
    pub(super) fn step(&self, args: &[Tensor], last_only: bool) -> Result<Vec<Tensor>> {
        let [ids, cos, sin, mask, slots, caches @ ..] = args else {
            return Err(Error::internal("llama", "a pass's inputs"));
        };
        if caches.len() != 2 * self.layers.len() {
            return Err(Error::internal("llama", "a pass's caches"));
        }
        batch_and_len(ids)?;
        let mut x = self.embed.rows(ids)?;
        for (layer, kv) in self.layers.iter().zip(caches.chunks(2)) {
            x = layer.forward(&self.config, &x, (cos, sin), Some(mask), |k, v| {
                // One scatter of the new slots' slices: in place where the cache's buffer
                // is donated, so a step writes its new slots, not the whole cache.
                let k = kv[0].index_copy(2, slots, &k)?;
                let v = kv[1].index_copy(2, slots, &v)?;
                kv[0].copy_(&k)?;
                kv[1].copy_(&v)?;
                Ok((k, v))
            })?;
        }
        Ok(vec![self.head(x, last_only)?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_within_the_context() {
        assert_eq!(bucket(1, 8192), 8);
        assert_eq!(bucket(17, 8192), 32);
        assert_eq!(bucket(64, 8192), 64);
        assert_eq!(bucket(5000, 6000), 6000);
        assert_eq!(bucket(7000, 6000), 7000);
        assert_eq!(step_index(1, false), 0);
        assert_eq!(step_index(5, true), 1);
    }

    #[test]
    fn a_cache_remembers_its_capacity() {
        let c = KvCache::left_padded(vec![1, 0]).with_capacity(64);
        assert_eq!(c.capacity(), Some(64));
        assert_eq!(c.select_rows(&[1]).unwrap().capacity(), Some(64));
        assert_eq!(KvCache::new().capacity(), None);
    }
}
