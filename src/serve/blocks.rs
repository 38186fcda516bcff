//! The block manager of a paged KV cache, with prefix caching: which blocks are free, which
//! sequences hold each one, and which full blocks hold a known run of tokens.
//!
//! A full block is named by a hash chain: the hash of its parent's name and its own tokens, so
//! a name stands for the whole prefix up to the block's end. A new sequence takes the blocks
//! of its prompt's longest cached prefix (shared read-only, counted by reference) and computes
//! the rest. A block nobody holds stays cached until it is needed for something else; free
//! blocks are reused least recently used first, blocks that name nothing before any that do.
//! A match compares the tokens and the parent too, so a hash collision never shares a wrong
//! block.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// What a cached block holds: its name, its parent's name, its tokens.
struct Named {
    hash: u64,
    parent: u64,
    tokens: Vec<u32>,
}

/// The blocks of a paged cache (see the module doc).
pub struct BlockManager {
    block_size: usize,
    /// Sequences holding each block.
    refs: Vec<u32>,
    /// The prefix each full block holds, once known.
    named: Vec<Option<Named>>,
    /// Name → block.
    by_name: HashMap<u64, usize>,
    /// Blocks nobody holds, by when they were freed (unnamed ones at tick 0, reused first).
    free: BTreeMap<(u64, usize), ()>,
    /// When each free block was freed (its key in `free`).
    freed_at: Vec<u64>,
    tick: u64,
}

/// The name of the chain start (a prompt's first block has this parent).
pub const ROOT: u64 = 0x2545_f491_4f6c_dd1d;

/// The name of a full block of `tokens` after the block named `parent`.
pub fn chain(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl BlockManager {
    /// `blocks` free blocks of `block_size` positions.
    pub fn new(blocks: usize, block_size: usize) -> BlockManager {
        BlockManager {
            block_size,
            refs: vec![0; blocks],
            named: (0..blocks).map(|_| None).collect(),
            by_name: HashMap::new(),
            free: (0..blocks).map(|b| ((0, b), ())).collect(),
            freed_at: vec![0; blocks],
            tick: 0,
        }
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in all.
    pub fn total(&self) -> usize {
        self.refs.len()
    }

    /// Blocks that can be taken now (free, cached or not).
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Blocks some sequence holds.
    pub fn used(&self) -> usize {
        self.total() - self.available()
    }

    /// Takes a free block (forgetting what it held), or `None` when none is free.
    pub fn take(&mut self) -> Option<usize> {
        let (&(_, b), _) = self.free.iter().next()?;
        self.free.remove(&(self.freed_at[b], b));
        if let Some(n) = self.named[b].take() {
            self.by_name.remove(&n.hash);
        }
        self.refs[b] = 1;
        Some(b)
    }

    /// Gives back one sequence's hold on each of `blocks`; a block nobody holds becomes free
    /// (still cached when it is named).
    pub fn release(&mut self, blocks: &[usize]) {
        // Later blocks of a prefix are reused before earlier ones: they are worth less.
        for &b in blocks.iter().rev() {
            debug_assert!(self.refs[b] > 0, "block {b} released more than held");
            self.refs[b] = self.refs[b].saturating_sub(1);
            if self.refs[b] == 0 {
                self.tick += 1;
                let at = if self.named[b].is_some() {
                    self.tick
                } else {
                    0
                };
                self.freed_at[b] = at;
                self.free.insert((at, b), ());
            }
        }
    }

    /// The blocks of the longest cached prefix of `tokens` in whole blocks (at most `limit`
    /// blocks), each now held once more; with the name of the last one (`ROOT` for none).
    pub fn lookup(&mut self, tokens: &[u32], limit: usize) -> (Vec<usize>, u64) {
        let mut parent = ROOT;
        let mut found = Vec::new();
        for block in tokens.chunks_exact(self.block_size).take(limit) {
            let hash = chain(parent, block);
            let Some(&b) = self.by_name.get(&hash) else {
                break;
            };
            match &self.named[b] {
                Some(n) if n.parent == parent && n.tokens == block => {}
                _ => break,
            }
            if self.refs[b] == 0 {
                self.free.remove(&(self.freed_at[b], b));
            }
            self.refs[b] += 1;
            found.push(b);
            parent = hash;
        }
        (found, parent)
    }

    /// Names block `b` (full, held) as holding `tokens` after the block named `parent`; gives
    /// its name. When another block already has that name, `b` stays unnamed (both hold the
    /// same values; the first keeps serving lookups).
    pub fn name(&mut self, b: usize, parent: u64, tokens: &[u32]) -> u64 {
        let hash = chain(parent, tokens);
        if self.named[b].is_none() && !self.by_name.contains_key(&hash) {
            self.by_name.insert(hash, b);
            self.named[b] = Some(Named {
                hash,
                parent,
                tokens: tokens.to_vec(),
            });
        }
        hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_prefix_is_found_again_until_its_blocks_are_reused() {
        let mut m = BlockManager::new(4, 2);
        let prompt = [1, 2, 3, 4, 5];
        let (a, b) = (m.take().unwrap(), m.take().unwrap());
        let ha = m.name(a, ROOT, &prompt[..2]);
        m.name(b, ha, &prompt[2..4]);
        // Held by another sequence meanwhile: shared.
        let (found, last) = m.lookup(&prompt, 2);
        assert_eq!(found, [a, b]);
        assert_eq!(last, chain(ha, &prompt[2..4]));
        assert_eq!(m.available(), 2);
        m.release(&[a, b]);
        m.release(&[a, b]);
        assert_eq!(m.available(), 4);
        // A different second block matches the first only.
        assert_eq!(m.lookup(&[1, 2, 9, 9], 2).0, [a]);
        m.release(&[a]);
        // Unnamed blocks go first, then the least recently freed named one (b before a).
        let taken: Vec<usize> = (0..3).map(|_| m.take().unwrap()).collect();
        assert!(
            !taken[..2].contains(&a) && !taken[..2].contains(&b),
            "{taken:?}"
        );
        assert_eq!(taken[2], b);
        assert_eq!(m.lookup(&prompt, 2).0, [a]);
        assert_eq!(m.take(), None);
    }

    #[test]
    fn a_limit_and_a_different_parent_stop_the_match() {
        let mut m = BlockManager::new(3, 2);
        let a = m.take().unwrap();
        let ha = m.name(a, ROOT, &[7, 8]);
        assert_eq!(m.lookup(&[7, 8, 1], 0).0, Vec::<usize>::new());
        let c = m.take().unwrap();
        // The same tokens after another parent are another prefix.
        m.name(c, ha, &[7, 8]);
        assert_eq!(m.lookup(&[1, 1, 7, 8], 2).0, Vec::<usize>::new());
        assert_eq!(m.lookup(&[7, 8, 7, 8], 2).0, [a, c]);
        // A second block with a known name stays unnamed.
        let d = m.take().unwrap();
        assert_eq!(m.name(d, ROOT, &[7, 8]), ha);
        m.release(&[d]);
        assert_eq!(m.lookup(&[7, 8], 1).0, [a]);
    }
}
