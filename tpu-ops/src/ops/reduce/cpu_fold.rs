//! How the CPU reductions lay out and split their work: a [`Plan`] views the input as
//! `[outer, reduced, inner]` over one dense block, and [`fold`] / [`arg_fold`] run the loops of
//! [`crate::cpu::simd::reduce`] over it on the device's pool in a thread-count-independent order.
//
// Sums have a fixed order that does not depend on the thread count: a run of elements is folded
// as `simd::reduce` documents (lanes within blocks of `BLOCK`, blocks pairwise); a column fold
// takes `ROW_BLOCK` rows at a time, each column in row order, and combines those partial vectors
// pairwise. Work is split into pieces of `2^k` blocks, whose results combine pairwise to exactly
// the single-pass result (see `simd::reduce::Counter`).

use std::ops::Range;

use rayon::prelude::*;
use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::{Element, Error, Result, Tensor};

use crate::cpu::kernels::{PAR_THRESHOLD, Reader, map_on_pool, on_pool};
use crate::cpu::simd::reduce::{self as simd, ArgAcc, Load, RedOp};

/// Input rows per pairwise step of a column fold.
const ROW_BLOCK: usize = 64;
/// Bytes of accumulators per column-fold task (they stay in L1 while rows stream past).
const COL_BYTES: usize = 16 << 10;
/// Columns per scan task.
pub(super) const COLS: usize = 256;
/// Elements of work per parallel task, at least.
pub(super) const TASK: usize = 1 << 14;
/// Rows per piece of an arg column fold, at most (the row index lanes are 32-bit).
const ARG_ROWS: usize = 1 << 31;

/// Combines a sequence of partial results pairwise (equal-sized groups first, like a binary
/// counter), so rounding error grows with the log of the count instead of the count.
struct Cascade<T> {
    levels: Vec<(usize, T)>,
}

impl<T> Cascade<T> {
    fn new() -> Cascade<T> {
        Cascade { levels: Vec::new() }
    }

    fn push(&mut self, mut v: T, merge: &impl Fn(T, T) -> T) {
        let mut n = 1;
        while self.levels.last().map(|l| l.0) == Some(n) {
            let Some((_, prev)) = self.levels.pop() else {
                break;
            };
            v = merge(prev, v);
            n *= 2;
        }
        self.levels.push((n, v));
    }

    fn finish(self, merge: &impl Fn(T, T) -> T) -> Option<T> {
        self.levels
            .into_iter()
            .rev()
            .map(|l| l.1)
            .reduce(|newer, older| merge(older, newer))
    }
}

/// The length of pieces that split `len` among about `want` workers: `unit * 2^k`, so the
/// pieces' results combine to the single-pass result.
fn piece_len(len: usize, want: usize, unit: usize) -> usize {
    let units = len.div_ceil(unit).max(1);
    units.div_ceil(want.max(1)).next_power_of_two() * unit
}

/// Runs `op` over `x` laid out as `[outer, red, inner]`, `ps` holding the parameter of each of
/// the `outer * inner` outputs; returns their accumulators in that order.
pub(super) fn fold<O: RedOp>(
    dev: &CpuDevice,
    op: &O,
    x: &[O::X],
    (outer, red, inner): (usize, usize, usize),
    ps: &[O::P],
) -> Result<Vec<O::A>> {
    if inner == 1 {
        fold_rows(dev, op, x, (outer, red), ps)
    } else {
        fold_cols(dev, op, x, (outer, red, inner), ps)
    }
}

/// Contiguous reductions: whole rows per task, or pieces of rows when there are few.
fn fold_rows<O: RedOp>(
    dev: &CpuDevice,
    op: &O,
    x: &[O::X],
    (outer, red): (usize, usize),
    ps: &[O::P],
) -> Result<Vec<O::A>> {
    let threads = dev.num_threads();
    let mut out = vec![op.identity(); outer];
    if outer * red < PAR_THRESHOLD || threads <= 1 {
        op.rows(x, red, ps, &mut out);
        return Ok(out);
    }
    if outer >= 2 * threads {
        let per = (TASK / red).max(1);
        on_pool(dev, &mut out, per, &|o, c| {
            let r0 = c * per;
            let rows = r0..r0 + o.len();
            op.rows(&x[rows.start * red..rows.end * red], red, &ps[rows], o);
        })?;
        return Ok(out);
    }
    let plen = piece_len(red, (2 * threads).div_ceil(outer), simd::BLOCK);
    let pieces = red.div_ceil(plen);
    let mut parts = vec![op.identity(); outer * pieces];
    on_pool(dev, &mut parts, 1, &|o, w| {
        let (row, k) = (w / pieces, w % pieces);
        let lo = row * red + k * plen;
        let hi = row * red + red.min((k + 1) * plen);
        let run = &x[lo..hi];
        op.rows(run, run.len(), &ps[row..=row], o);
    })?;
    let merge = |a, b| op.merge(a, b);
    for (o, p) in out.iter_mut().zip(parts.chunks(pieces)) {
        let mut c = Cascade::new();
        for &v in p {
            c.push(v, &merge);
        }
        *o = c.finish(&merge).unwrap_or(op.identity());
    }
    Ok(out)
}

/// Reductions over an outer extent: each task folds a piece of the rows of one outer block into
/// accumulators for a band of columns, sweeping the rows in memory order.
fn fold_cols<O: RedOp>(
    dev: &CpuDevice,
    op: &O,
    x: &[O::X],
    (outer, red, inner): (usize, usize, usize),
    ps: &[O::P],
) -> Result<Vec<O::A>> {
    let cw = inner.min((COL_BYTES / size_of::<O::A>().max(1)).max(simd::LANES));
    let ncb = inner.div_ceil(cw);
    let tasks = outer * ncb;
    let threads = dev.num_threads();
    let serial = outer * red * inner < PAR_THRESHOLD || threads <= 1;
    let plen = if serial || tasks >= 2 * threads {
        red
    } else {
        piece_len(red, (2 * threads).div_ceil(tasks), ROW_BLOCK)
    };
    let pieces = red.div_ceil(plen);
    let item = |w: usize| {
        let (t, k) = (w / pieces, w % pieces);
        let (a, c) = (t / ncb, t % ncb);
        let cols = c * cw..inner.min((c + 1) * cw);
        let rows = k * plen..red.min((k + 1) * plen);
        let band = &ps[a * inner + cols.start..a * inner + cols.end];
        col_piece(op, x, (red, inner), a, (cols.start, rows), band)
    };
    let n = tasks * pieces;
    let parts = pieces_of(dev, serial, n, cw * plen, item)?;
    let merge = |mut p: Vec<O::A>, q: Vec<O::A>| {
        for (s, t) in p.iter_mut().zip(q) {
            *s = op.merge(*s, t);
        }
        p
    };
    let mut out = Vec::with_capacity(outer * inner);
    let mut it = parts.into_iter();
    for _ in 0..tasks {
        let mut c = Cascade::new();
        for v in it.by_ref().take(pieces) {
            c.push(v, &merge);
        }
        out.extend(c.finish(&merge).unwrap_or_default());
    }
    Ok(out)
}

/// Folds rows `rows` of outer block `a` into accumulators for the band of columns starting at
/// `c0` whose parameters are `ps`.
fn col_piece<O: RedOp>(
    op: &O,
    x: &[O::X],
    (red, inner): (usize, usize),
    a: usize,
    (c0, rows): (usize, Range<usize>),
    ps: &[O::P],
) -> Vec<O::A> {
    let w = ps.len();
    let merge = |mut p: Vec<O::A>, q: Vec<O::A>| {
        for (s, t) in p.iter_mut().zip(q) {
            *s = op.merge(*s, t);
        }
        p
    };
    let mut casc = Cascade::new();
    let mut r0 = rows.start;
    while r0 < rows.end {
        let r1 = rows.end.min(r0 + ROW_BLOCK);
        let start = (a * red + r0) * inner + c0;
        let mut acc = vec![op.identity(); w];
        op.cols(
            &x[start..start + (r1 - r0 - 1) * inner + w],
            inner,
            r1 - r0,
            &mut acc,
            ps,
        );
        casc.push(acc, &merge);
        r0 = r1;
    }
    casc.finish(&merge)
        .unwrap_or_else(|| vec![op.identity(); w])
}

/// A reduction laid out as `[outer, red, inner]` over the dense elements of `x`, which is the
/// input itself or a copy of it.
pub(super) struct Plan {
    pub(super) x: Tensor,
    pub(super) outer: usize,
    red: usize,
    pub(super) inner: usize,
    /// When the kept dims appear in the dense order in another order than the logical one: the
    /// result's shape in that order and the permutation back to the logical order.
    perm_back: Option<(Vec<usize>, Vec<usize>)>,
}

/// True when the dims `order` (outermost first) of a view tile its elements densely.
fn tiles_densely(order: &[usize], shape: &[usize], strides: &[usize]) -> bool {
    let mut expect = 1;
    for &d in order.iter().rev() {
        if strides[d] != expect {
            return false;
        }
        expect *= shape[d];
    }
    true
}

impl Plan {
    /// Plans a reduction of a non-empty `x` over `mask`. With `logical`, the reduced elements
    /// are visited in logical row-major order (for flattened indices).
    pub(super) fn new(x: &Tensor, mask: &[bool], logical: bool) -> Result<Plan> {
        let (shape, strides) = (x.shape(), x.strides());
        let live: Vec<usize> = (0..shape.len()).filter(|&d| shape[d] > 1).collect();
        let mut mem = live.clone();
        if !logical {
            mem.sort_by(|&a, &b| strides[b].cmp(&strides[a]));
        }
        if tiles_densely(&mem, shape, strides) {
            if let Some(p) = Plan::direct(x.clone(), &mem, mask) {
                return Ok(p);
            }
        } else if let Some(p) = Plan::direct(x.contiguous()?, &live, mask) {
            return Ok(p);
        }
        // Interleaved kept and reduced dims: one copy with the reduced dims last.
        let kept: Vec<usize> = (0..shape.len()).filter(|&d| !mask[d]).collect();
        let reduced: Vec<usize> = (0..shape.len()).filter(|&d| mask[d]).collect();
        let perm: Vec<usize> = kept.iter().chain(&reduced).copied().collect();
        Ok(Plan {
            x: x.permute(&perm[..])?.contiguous()?,
            outer: kept.iter().map(|&d| shape[d]).product(),
            red: reduced.iter().map(|&d| shape[d]).product(),
            inner: 1,
            perm_back: None,
        })
    }

    /// The plan for `x` dense in `order`, when its kept and reduced dims form at most
    /// `[kept, reduced, kept]` in that order.
    fn direct(x: Tensor, order: &[usize], mask: &[bool]) -> Option<Plan> {
        let shape = x.shape();
        let mut groups: Vec<(bool, usize)> = Vec::new();
        for &d in order {
            match groups.last_mut() {
                Some(g) if g.0 == mask[d] => g.1 *= shape[d],
                _ => groups.push((mask[d], shape[d])),
            }
        }
        let (outer, red, inner) = match groups[..] {
            [] => (1, 1, 1),
            [(false, k)] => (k, 1, 1),
            [(true, r)] => (1, r, 1),
            [(false, k), (true, r)] => (k, r, 1),
            [(true, r), (false, k)] => (1, r, k),
            [(false, k0), (true, r), (false, k1)] => (k0, r, k1),
            _ => return None,
        };
        let kept: Vec<usize> = order.iter().copied().filter(|&d| !mask[d]).collect();
        let perm_back = if kept.windows(2).all(|w| w[0] < w[1]) {
            None
        } else {
            let mut sorted = kept.clone();
            sorted.sort_unstable();
            let perm = sorted
                .iter()
                .map(|d| kept.iter().position(|k| k == d).unwrap_or(0))
                .collect();
            Some((kept.iter().map(|&d| shape[d]).collect(), perm))
        };
        Some(Plan {
            x,
            outer,
            red,
            inner,
            perm_back,
        })
    }

    /// The layout `(outer, red, inner)`.
    pub(super) fn geometry(&self) -> (usize, usize, usize) {
        (self.outer, self.red, self.inner)
    }

    /// Brings a flat result in the plan's order to the logical order, shaped `shape`.
    pub(super) fn restore(&self, t: Tensor, shape: &[usize]) -> Result<Tensor> {
        match &self.perm_back {
            None => t.reshape(shape),
            Some((mem_shape, perm)) => t
                .reshape(&mem_shape[..])?
                .permute(&perm[..])?
                .contiguous()?
                .reshape(shape),
        }
    }
}

/// The dense elements of `t` (which must be dense from its offset on) as `T`.
pub(super) fn block<'a, T: Element>(r: &'a Reader<'_>, t: &Tensor) -> Result<&'a [T]> {
    let data = r.data::<T>(t)?;
    data.get(t.offset()..t.offset() + t.numel())
        .ok_or_else(|| Error::internal("reduce", "view outside its storage"))
}

/// The first extreme element (NaN first) of each output's group and its index, for `x` laid
/// out as `[outer, red, inner]`.
pub(super) fn arg_fold<X: Load<A>, A: ArgAcc, const MAX: bool>(
    dev: &CpuDevice,
    x: &[X],
    (outer, red, inner): (usize, usize, usize),
) -> Result<Vec<(A, usize)>> {
    let threads = dev.num_threads();
    let serial = outer * red * inner < PAR_THRESHOLD || threads <= 1;
    let pick = |a, b| simd::arg_merge::<A, MAX>(a, b);
    if inner == 1 {
        let mut vals = vec![A::ZERO; outer];
        let mut idx = vec![0i64; outer];
        if serial {
            simd::arg_rows::<X, A, MAX>(x, red, &mut vals, &mut idx);
        } else if outer >= 2 * threads {
            let per = (TASK / red).max(1);
            dev.install(|| {
                vals.par_chunks_mut(per)
                    .zip(idx.par_chunks_mut(per))
                    .enumerate()
                    .for_each(|(c, (v, i))| {
                        let r0 = c * per;
                        let rows = &x[r0 * red..(r0 + v.len()) * red];
                        simd::arg_rows::<X, A, MAX>(rows, red, v, i);
                    })
            })?;
        } else {
            let plen = red
                .div_ceil((2 * threads).div_ceil(outer))
                .next_multiple_of(simd::LANES);
            let pieces = red.div_ceil(plen);
            let parts: Vec<(A, usize)> = map_on_pool(dev, outer * pieces, 1, &|w| {
                let (row, k) = (w / pieces, w % pieces);
                let lo = k * plen;
                let run = &x[row * red + lo..row * red + red.min(lo + plen)];
                let (mut v, mut i) = (A::ZERO, 0);
                simd::arg_rows::<X, A, MAX>(
                    run,
                    run.len(),
                    std::slice::from_mut(&mut v),
                    std::slice::from_mut(&mut i),
                );
                (v, lo + i as usize)
            })?;
            return Ok(parts
                .chunks(pieces)
                .map(|p| p.iter().copied().reduce(pick).unwrap_or((A::ZERO, 0)))
                .collect());
        }
        return Ok(vals
            .into_iter()
            .zip(idx)
            .map(|(v, i)| (v, i as usize))
            .collect());
    }
    let cw = inner.min((COL_BYTES / size_of::<A>()).max(simd::LANES));
    let ncb = inner.div_ceil(cw);
    let tasks = outer * ncb;
    let plen = if serial || tasks >= 2 * threads {
        red
    } else {
        red.div_ceil((2 * threads).div_ceil(tasks))
    }
    .min(ARG_ROWS);
    let pieces = red.div_ceil(plen);
    let item = |w: usize| -> Vec<(A, usize)> {
        let (t, k) = (w / pieces, w % pieces);
        let (a, c) = (t / ncb, t % ncb);
        let (c0, c1) = (c * cw, inner.min((c + 1) * cw));
        let (r0, r1) = (k * plen, red.min((k + 1) * plen));
        let start = (a * red + r0) * inner + c0;
        let w = c1 - c0;
        let mut vals: Vec<A> = x[start..start + w].iter().map(|e| e.load()).collect();
        let mut at = vec![A::index(0); w];
        simd::arg_cols::<X, A, MAX>(
            &x[start..start + (r1 - r0 - 1) * inner + w],
            inner,
            r1 - r0,
            &mut vals,
            &mut at,
        );
        vals.into_iter()
            .zip(at)
            .map(|(v, i)| (v, r0 + A::position(i)))
            .collect()
    };
    let n = tasks * pieces;
    let parts = pieces_of(dev, serial, n, cw * plen, item)?;
    let mut out = Vec::with_capacity(outer * inner);
    let mut it = parts.into_iter();
    for _ in 0..tasks {
        let best = it.by_ref().take(pieces).reduce(|mut p, q| {
            for (s, t) in p.iter_mut().zip(q) {
                *s = pick(*s, t);
            }
            p
        });
        out.extend(best.unwrap_or_default());
    }
    Ok(out)
}

/// `item(i)` for the `n` pieces of a column fold, on the calling thread when `serial`, else on
/// the pool in tasks of about [`TASK`] elements (`size` per piece).
fn pieces_of<T: Send>(
    dev: &CpuDevice,
    serial: bool,
    n: usize,
    size: usize,
    item: impl Fn(usize) -> T + Sync + Send,
) -> Result<Vec<T>> {
    if serial {
        return Ok((0..n).map(item).collect());
    }
    map_on_pool(dev, n, TASK / size.max(1), &item)
}
