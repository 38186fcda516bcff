//! Memory planning: where each intermediate of a graph would live in one arena, from the
//! values' lifetimes, and how that arena compares with allocating every value apart.
//!
//! A node's results are placed while its operands are still live (a kernel reads its inputs
//! while it writes its outputs), and a value's range is free again after the last node that
//! reads it; returned values live to the end. Placement is best fit among the free ranges,
//! growing the arena only when none fits.

use std::collections::BTreeMap;

use crate::ir::{Graph, ValueId};

/// Alignment of every placement, in bytes: a cache line, as the CPU device aligns buffers.
pub const ALIGN: usize = 64;

/// Where one value lives in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The value.
    pub value: ValueId,
    /// Its offset in the arena, in bytes.
    pub offset: usize,
    /// Its size, in bytes, rounded up to [`ALIGN`].
    pub bytes: usize,
    /// The node that defines it.
    pub defined: usize,
    /// The last node that reads it (`None` for a value returned by the graph, which lives to
    /// the end).
    pub last_use: Option<usize>,
}

/// The plan of a graph's intermediates (every node's results, returned ones included; inputs
/// live elsewhere).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The arena's size: the planned peak, in bytes.
    pub peak_bytes: usize,
    /// The most bytes live at once, the least any placement could reach.
    pub live_peak_bytes: usize,
    /// The bytes of all intermediates, as if none were ever freed.
    pub total_bytes: usize,
    /// Each value's place, in the order of definition.
    pub placements: Vec<Placement>,
}

/// Free ranges of the arena, by offset, merged with their neighbours.
#[derive(Default)]
struct FreeList {
    ranges: BTreeMap<usize, usize>,
    end: usize,
}

impl FreeList {
    /// The offset of `bytes` placed at the smallest free range that holds them (the lowest
    /// among equals), or at the end of the arena (taking in a free range that ends there).
    fn take(&mut self, bytes: usize) -> usize {
        let best = self
            .ranges
            .iter()
            .filter(|&(_, &len)| len >= bytes)
            .min_by_key(|&(&off, &len)| (len, off))
            .map(|(&off, &len)| (off, len));
        if let Some((off, len)) = best {
            self.ranges.remove(&off);
            if len > bytes {
                self.ranges.insert(off + bytes, len - bytes);
            }
            return off;
        }
        let tail = self
            .ranges
            .iter()
            .next_back()
            .filter(|&(&off, &len)| off + len == self.end)
            .map(|(&off, _)| off);
        let off = match tail {
            Some(off) => {
                self.ranges.remove(&off);
                off
            }
            None => self.end,
        };
        self.end = off + bytes;
        off
    }

    /// Frees `[off, off + bytes)`, merging it with the free ranges it touches.
    fn give(&mut self, mut off: usize, mut bytes: usize) {
        if bytes == 0 {
            return;
        }
        if let Some((&p, &len)) = self.ranges.range(..off).next_back()
            && p + len == off
        {
            self.ranges.remove(&p);
            off = p;
            bytes += len;
        }
        if let Some(&len) = self.ranges.get(&(off + bytes)) {
            self.ranges.remove(&(off + bytes));
            bytes += len;
        }
        self.ranges.insert(off, bytes);
    }
}

impl Graph {
    /// The memory plan of the graph's intermediates (see [`crate::memory`]).
    pub fn memory_plan(&self) -> MemoryPlan {
        let last = self.last_uses();
        let mut plan = MemoryPlan::default();
        let mut free = FreeList::default();
        // Values to free after each node, by the index in `plan.placements`.
        let mut frees: Vec<Vec<usize>> = vec![Vec::new(); self.nodes().len()];
        let mut live = 0usize;
        for (i, n) in self.nodes().iter().enumerate() {
            for v in &n.outputs {
                let m = self.meta(*v);
                let bytes = (m.numel() * m.dtype.size_in_bytes()).div_ceil(ALIGN) * ALIGN;
                let last_use = match last[v.0 as usize] {
                    Some(usize::MAX) => None,
                    Some(j) => Some(j),
                    // Nothing reads it: it is freed once its node has run.
                    None => Some(i),
                };
                let offset = free.take(bytes);
                if let Some(j) = last_use {
                    frees[j.max(i)].push(plan.placements.len());
                }
                plan.placements.push(Placement {
                    value: *v,
                    offset,
                    bytes,
                    defined: i,
                    last_use,
                });
                plan.total_bytes += bytes;
                live += bytes;
            }
            plan.live_peak_bytes = plan.live_peak_bytes.max(live);
            for &k in &frees[i] {
                let p = plan.placements[k];
                free.give(p.offset, p.bytes);
                live -= p.bytes;
            }
        }
        plan.peak_bytes = free.end;
        plan
    }
}
