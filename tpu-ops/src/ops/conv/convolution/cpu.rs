//! The CPU convolution kernels in f32 and f64: input patches gathered block by block (im2col)
//! and multiplied with the weight by faer's matrix product, split into tasks for the device's
//! pool; and the transposed convolution (a faer product, then col2im). 16-bit floats: `cpu16.rs`.

use std::ops::Range;

use faer::linalg::matmul::matmul;
use faer::traits::RealField;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;
use tpu_tensor::tpu_runtime::CpuDevice;
use tpu_tensor::tpu_runtime::memory::check_host_memory;
use tpu_tensor::{DType, Device, Element, Error, Result, Tensor, bf16, f16};

use crate::cpu::float::{Float, with_compute};
use crate::cpu::kernels::{Reader, cpu_device};
use crate::op::args::unsupported;
use crate::op::{DTypeSet, Meta};
use crate::ops::conv::cpu::{produce, read};

use super::ConvGeom;
use super::cpu16::{COLS_BLOCK_16, conv_cpu16};

/// Multiply-adds below which convolutions stay on the calling thread.
const CONV_PAR_WORK: usize = 1 << 18;

/// Elements of gathered input patches per block on the f32 and f64 path: small enough that a
/// block stays in L2 while the product reads it.
const COLS_BLOCK: usize = 1 << 16;

/// Fewest output positions per block: narrower products run poorly.
const MIN_COLS: usize = 64;

/// Output positions per block are a multiple of this where there are enough: the product's
/// widest f32 kernel covers 96 rows of its column-major output (48 for f64), and remainders
/// run at half its speed.
const COL_ALIGN: usize = 96;

/// Output planes with fewer positions than this are batched: several images share one
/// product.
const SMALL_PLANE: usize = 256;

/// Columns (positions across images) that a batched product aims for.
const BATCH_COLS: usize = 512;

/// Gathers the input patches of channels `chans` of one image's group `xs` (`[cg, H, W]`) at
/// the output positions `pos` (row-major over `oh x ow`) into rows `(channel, ki, kj)` of
/// `dst`: each row starts `ld` elements after the previous one, at column `col0`. Taps that
/// fall in the padding are zero; every element of the block is written.
pub(super) fn im2col_block<T: Copy + Default>(
    g: &ConvGeom,
    xs: &[T],
    chans: Range<usize>,
    pos: Range<usize>,
    dst: &mut [T],
    ld: usize,
    col0: usize,
) {
    let (h, w, ow) = (g.h, g.w, g.ow);
    let ([s0, s1], [d0, d1]) = (g.stride, g.dil);
    let (top, left) = (g.pad[0][0], g.pad[1][0]);
    let zero = T::default();
    let mut row = 0;
    for ci in chans {
        let plane = &xs[ci * h * w..(ci + 1) * h * w];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let d = &mut dst[row * ld + col0..row * ld + col0 + pos.len()];
                row += 1;
                // Output column `ox` reads input column `ox * s1 + off - left`, which lies
                // inside the row for `lo <= ox < hi`.
                let off = kj * d1;
                let lo = left.saturating_sub(off).div_ceil(s1);
                let hi = (w + left).saturating_sub(off).div_ceil(s1);
                let mut p = pos.start;
                while p < pos.end {
                    let (oy, ox0) = (p / ow, p % ow);
                    let ox1 = ow.min(ox0 + pos.end - p);
                    let seg = &mut d[p - pos.start..p - pos.start + (ox1 - ox0)];
                    p += ox1 - ox0;
                    let iy = oy * s0 + ki * d0;
                    if iy < top || iy - top >= h {
                        seg.fill(zero);
                        continue;
                    }
                    let src = &plane[(iy - top) * w..(iy - top + 1) * w];
                    let a = lo.clamp(ox0, ox1);
                    let b = hi.clamp(a, ox1);
                    let (head, rest) = seg.split_at_mut(a - ox0);
                    let (mid, tail) = rest.split_at_mut(b - a);
                    head.fill(zero);
                    tail.fill(zero);
                    if a < b {
                        let start = a * s1 + off - left;
                        if s1 == 1 {
                            copy_short(mid, &src[start..start + (b - a)]);
                        } else {
                            for (e, v) in mid.iter_mut().zip(src[start..].iter().step_by(s1)) {
                                *e = *v;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Copies `src` into `dst` (of the same length) in pieces of 64 bytes, fixed-size arrays that
/// compile to inline vector moves: the segments of a patch block are short, and a call to
/// `memcpy` for each (which slices of a run-time length get, 16-bit ones included) costs about
/// as much as the copy.
fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    match size_of::<T>() {
        2 => copy_pieces::<T, 32>(dst, src),
        4 => copy_pieces::<T, 16>(dst, src),
        _ => copy_pieces::<T, 8>(dst, src),
    }
}

fn copy_pieces<T: Copy, const N: usize>(dst: &mut [T], src: &[T]) {
    let (d, d_rest) = dst.as_chunks_mut::<N>();
    let (s, s_rest) = src.as_chunks::<N>();
    for (d, s) in d.iter_mut().zip(s) {
        *d = *s;
    }
    for (d, s) in d_rest.iter_mut().zip(s_rest) {
        *d = *s;
    }
}

/// Block sizes for a product over `cols` output columns and `cg` input channels of `taps`
/// kernel taps each: `(columns per block, channels per reduction step)`, with the block's
/// patches within `budget` elements where possible. Wide blocks are whole multiples of
/// [`COL_ALIGN`], narrow ones of even size.
pub(super) fn conv_blocks(cols: usize, cg: usize, taps: usize, budget: usize) -> (usize, usize) {
    let k = cg * taps;
    if k * cols <= budget {
        return (cols, cg);
    }
    let nb = (budget / k).max(MIN_COLS).min(cols);
    let nb = if nb >= COL_ALIGN && nb < cols {
        nb / COL_ALIGN * COL_ALIGN
    } else {
        cols.div_ceil(cols.div_ceil(nb))
    };
    let cb = (budget / (taps * nb)).clamp(1, cg);
    (nb, cg.div_ceil(cg.div_ceil(cb)))
}

/// How a convolution's output is split into tasks for the pool.
#[derive(Clone, Copy, Debug)]
pub(super) enum Split {
    /// One task per image, group and block of `ob` output channels; the product's columns are
    /// the image's output positions.
    Planes { ob: usize },
    /// One task per `imgs` images, whose small output planes form the columns of one product.
    Images { imgs: usize },
}

impl Split {
    pub(super) fn new(g: &ConvGeom, threads: usize) -> Split {
        let og = g.o / g.groups;
        let ohw = g.oh * g.ow;
        if ohw < SMALL_PLANE && g.n > 1 {
            let mut imgs = (BATCH_COLS / ohw).max(1);
            if threads > 1 {
                imgs = imgs.min(g.n.div_ceil(threads));
            }
            return Split::Images {
                imgs: g.n.div_ceil(g.n.div_ceil(imgs)),
            };
        }
        // Enough tasks to share out evenly: split each group's channels when there are few
        // images, or an odd count of them.
        let units = g.n * g.groups;
        let mut parts = 1;
        while threads > 1
            && parts < og
            && !(units * parts).is_multiple_of(threads)
            && units * parts < 8 * threads
        {
            parts += 1;
        }
        Split::Planes {
            ob: og.div_ceil(parts),
        }
    }

    /// Elements of the output per task.
    fn chunk(&self, g: &ConvGeom) -> usize {
        let ohw = g.oh * g.ow;
        match *self {
            Split::Planes { ob } => ob * ohw,
            Split::Images { imgs } => imgs * g.o * ohw,
        }
    }
}

/// The tasks of `split` over `out`: `(index, first output channel, output chunk)`, where the
/// index counts `(image, group)` pairs for `Split::Planes` and image batches otherwise.
pub(super) fn conv_tasks<'a, T>(
    g: &ConvGeom,
    split: Split,
    out: &'a mut [T],
) -> Vec<(usize, usize, &'a mut [T])> {
    let chunk = split.chunk(g);
    match split {
        Split::Planes { ob } => {
            let og = g.o / g.groups;
            out.chunks_mut(og * g.oh * g.ow)
                .enumerate()
                .flat_map(|(u, c)| {
                    c.chunks_mut(chunk)
                        .enumerate()
                        .map(move |(j, d)| (u, j * ob, d))
                })
                .collect()
        }
        Split::Images { .. } => out
            .chunks_mut(chunk)
            .enumerate()
            .map(|(t, d)| (t, 0, d))
            .collect(),
    }
}

/// Runs `task` over `tasks` on the device's pool when `threads > 1` (else here), handing the
/// matrix product the threads that the tasks leave idle.
pub(super) fn run_tasks<T: Send>(
    dev: &CpuDevice,
    threads: usize,
    tasks: Vec<T>,
    task: impl Fn(T, Par) -> Result<()> + Sync + Send,
) -> Result<()> {
    if threads <= 1 {
        return tasks.into_iter().try_for_each(|t| task(t, Par::Seq));
    }
    let par = inner_par(threads, tasks.len());
    dev.install(|| tasks.into_par_iter().try_for_each(|t| task(t, par)))?
}

/// The threads [`run_tasks`] hands each of `tasks` tasks' products: those the tasks leave idle.
pub(super) fn inner_par(threads: usize, tasks: usize) -> Par {
    let inner = threads / tasks.max(1);
    if inner > 1 {
        Par::rayon(inner)
    } else {
        Par::Seq
    }
}

/// The threads a convolution of `g` runs on: one below the work where the pool pays off.
fn conv_threads(g: &ConvGeom, dev: &CpuDevice) -> usize {
    // An estimate for choosing threads: saturating, since huge kernels may overflow it.
    let work = [g.o, g.oh, g.ow, g.c / g.groups, g.kh, g.kw]
        .iter()
        .fold(g.n, |a, &v| a.saturating_mul(v));
    if work < CONV_PAR_WORK {
        1
    } else {
        dev.num_threads()
    }
}

/// The dense operands of a convolution: input `[N, C, H, W]`, weight `[O, cg * kh * kw]`, and
/// bias `[O]`.
#[derive(Clone, Copy)]
pub(super) struct ConvData<'a, T> {
    pub(super) x: &'a [T],
    pub(super) w: &'a [T],
    pub(super) bias: Option<&'a [T]>,
}

/// Fills `out` (`[N, O, oh, ow]`) for a convolution without input channels: the bias, or zero.
pub(super) fn conv_no_input<T: Copy + Default>(g: &ConvGeom, bias: Option<&[T]>, out: &mut [T]) {
    for (i, plane) in out.chunks_mut(g.oh * g.ow).enumerate() {
        plane.fill(bias.map_or(T::default(), |b| b[i % g.o]));
    }
}

/// A convolution as both kernels (`conv_cpu`, `conv_cpu16`) take it: the geometry, the dense
/// operands, the pool, the threads and patch budget, and the sizes and work split they start
/// from.
pub(super) struct Conv<'a, T> {
    pub(super) g: &'a ConvGeom,
    pub(super) x: &'a [T],
    pub(super) w: &'a [T],
    pub(super) bias: Option<&'a [T]>,
    pub(super) dev: &'a CpuDevice,
    pub(super) threads: usize,
    pub(super) budget: usize,
    /// Input and output channels per group.
    pub(super) cg: usize,
    pub(super) og: usize,
    /// Input and output positions per plane.
    pub(super) hw: usize,
    pub(super) ohw: usize,
    pub(super) taps: usize,
    /// The reduction length of a patch: input channels per group times taps.
    pub(super) k: usize,
    /// A 1x1 kernel without stride or padding, whose patches are the input itself.
    pub(super) pointwise: bool,
    pub(super) split: Split,
}

impl<T: Copy> Conv<'_, T> {
    /// The input planes of group `grp` of image `img`.
    pub(super) fn group_input(&self, img: usize, grp: usize) -> &[T] {
        &self.x[(img * self.g.c + grp * self.cg) * self.hw..][..self.cg * self.hw]
    }

    /// What a `Split::Planes` task `(u, o0, dst)` reads, for a `dst` of `len` elements: its
    /// group, that group's input planes, its count of output channels, and their weights.
    pub(super) fn plane_task(&self, u: usize, o0: usize, len: usize) -> (usize, &[T], usize, &[T]) {
        let (img, grp) = (u / self.g.groups, u % self.g.groups);
        let rows = len / self.ohw;
        let wg = &self.w[(grp * self.og + o0) * self.k..][..rows * self.k];
        (grp, self.group_input(img, grp), rows, wg)
    }

    /// What a `Split::Images` task with `len` output elements works on: its count of images,
    /// the columns of its products, and a patch buffer for blocks of `cb` channels.
    pub(super) fn images_task(&self, len: usize, cb: usize) -> (usize, usize, Vec<T>)
    where
        T: Default,
    {
        let bn = len / (self.g.o * self.ohw);
        let ncols = bn * self.ohw;
        (bn, ncols, vec![T::default(); cb * self.taps * ncols])
    }

    /// Gathers the patches of channels `chans` of group `grp` for `bn` images from `img0` on
    /// into `cols`, image after image along its `ncols` columns.
    pub(super) fn gather_images(
        &self,
        (img0, bn): (usize, usize),
        grp: usize,
        chans: Range<usize>,
        cols: &mut [T],
        ncols: usize,
    ) where
        T: Default,
    {
        for bi in 0..bn {
            let xs = self.group_input(img0 + bi, grp);
            im2col_block(
                self.g,
                xs,
                chans.clone(),
                0..self.ohw,
                cols,
                ncols,
                bi * self.ohw,
            );
        }
    }
}

/// Runs `kernel` on a convolution of `g` into `out`: nothing for an empty output, the bias (or
/// zero) without input channels, else the kernel with the convolution's sizes and split.
pub(super) fn convolve<T: Copy + Default>(
    kernel: ConvKernel<T>,
    g: &ConvGeom,
    data: ConvData<'_, T>,
    dev: &CpuDevice,
    threads: usize,
    budget: usize,
    out: &mut [T],
) -> Result<()> {
    let (cg, og) = (g.c / g.groups, g.o / g.groups);
    let (hw, ohw, taps) = (g.h * g.w, g.oh * g.ow, g.kh * g.kw);
    let k = cg * taps;
    if out.is_empty() {
        return Ok(());
    }
    if k == 0 {
        conv_no_input(g, data.bias, out);
        return Ok(());
    }
    let conv = Conv {
        g,
        x: data.x,
        w: data.w,
        bias: data.bias,
        dev,
        threads,
        budget,
        cg,
        og,
        hw,
        ohw,
        taps,
        k,
        pointwise: taps == 1 && g.stride == [1, 1] && g.pad == [[0, 0], [0, 0]],
        split: Split::new(g, threads),
    };
    kernel(&conv, out)
}

/// The f32 and f64 convolution: per task, blocks of input patches of at most about the
/// budget's elements gathered into a buffer that stays in cache (or, for a 1x1 kernel without
/// stride or padding, the input itself), each multiplied by the weight straight into the NCHW
/// output.
fn conv_cpu<F: Float + RealField>(c: &Conv<'_, F>, out: &mut [F]) -> Result<()> {
    let (g, cg, taps, ohw, k) = (c.g, c.cg, c.taps, c.ohw, c.k);
    let one = F::of(1.0);
    let accum = |c0: usize| {
        if c0 == 0 { Accum::Replace } else { Accum::Add }
    };
    let tasks = conv_tasks(g, c.split, out);
    match c.split {
        Split::Planes { .. } => {
            let (nb, cb) = if c.pointwise {
                (ohw, cg)
            } else {
                conv_blocks(ohw, cg, taps, c.budget)
            };
            run_tasks(c.dev, c.threads, tasks, |(u, o0, dst), par| {
                let (grp, xs, rows, wg) = c.plane_task(u, o0, dst.len());
                let mut cols = vec![F::default(); if c.pointwise { 0 } else { cb * taps * nb }];
                for p0 in (0..ohw).step_by(nb) {
                    let np = nb.min(ohw - p0);
                    for c0 in (0..cg).step_by(cb) {
                        let nc = cb.min(cg - c0);
                        let kc = nc * taps;
                        let rhs = if c.pointwise {
                            MatRef::from_row_major_slice_with_stride(
                                &xs[c0 * c.hw + p0..],
                                nc,
                                np,
                                c.hw,
                            )
                        } else {
                            im2col_block(g, xs, c0..c0 + nc, p0..p0 + np, &mut cols, np, 0);
                            MatRef::from_row_major_slice(&cols[..kc * np], kc, np)
                        };
                        let lhs =
                            MatRef::from_row_major_slice_with_stride(&wg[c0 * taps..], rows, kc, k);
                        // The block of the output: `rows` channels of `np` positions, `ohw`
                        // apart (faer's row-major constructor with a stride is unsound in
                        // 0.24, so this is the transpose of a column-major view).
                        let d = MatMut::from_column_major_slice_with_stride_mut(
                            &mut dst[p0..],
                            np,
                            rows,
                            ohw,
                        )
                        .transpose_mut();
                        matmul(d, accum(c0), lhs, rhs, one, par);
                    }
                    if let Some(b) = c.bias {
                        for (o, row) in dst.chunks_mut(ohw).enumerate() {
                            let v = b[grp * c.og + o0 + o];
                            row[p0..p0 + np].iter_mut().for_each(|e| *e += v);
                        }
                    }
                }
                Ok(())
            })
        }
        Split::Images { imgs } => {
            let (_, cb) = conv_blocks(imgs * ohw, cg, taps, c.budget);
            run_tasks(c.dev, c.threads, tasks, |(t, _, dst), par| {
                let (bn, ncols, mut cols) = c.images_task(dst.len(), cb);
                let mut acc = vec![F::default(); c.og * ncols];
                for grp in 0..g.groups {
                    for c0 in (0..cg).step_by(cb) {
                        let nc = cb.min(cg - c0);
                        let kc = nc * taps;
                        c.gather_images((t * imgs, bn), grp, c0..c0 + nc, &mut cols, ncols);
                        let rhs = MatRef::from_row_major_slice(&cols[..kc * ncols], kc, ncols);
                        let lhs = MatRef::from_row_major_slice_with_stride(
                            &c.w[grp * c.og * k + c0 * taps..],
                            c.og,
                            kc,
                            k,
                        );
                        let d = MatMut::from_row_major_slice_mut(&mut acc, c.og, ncols);
                        matmul(d, accum(c0), lhs, rhs, one, par);
                    }
                    match c.bias {
                        Some(b) => scatter_planes(g, grp, &acc, ncols, dst, |oc, v| v + b[oc]),
                        None => scatter_planes(g, grp, &acc, ncols, dst, |_, v| v),
                    }
                }
                Ok(())
            })
        }
    }
}

/// Copies a batched product `acc` (`[og, images * ohw]`, rows `ld` apart) of group `grp` into
/// the NCHW output chunk `dst` of those images; `finish(channel, value)` gives each element.
pub(super) fn scatter_planes<A: Copy, T>(
    g: &ConvGeom,
    grp: usize,
    acc: &[A],
    ld: usize,
    dst: &mut [T],
    finish: impl Fn(usize, A) -> T,
) {
    let og = g.o / g.groups;
    let ohw = g.oh * g.ow;
    for (bi, img) in dst.chunks_mut(g.o * ohw).enumerate() {
        for o in 0..og {
            let oc = grp * og + o;
            let src = &acc[o * ld + bi * ohw..][..ohw];
            let d = &mut img[oc * ohw..][..ohw];
            d.iter_mut().zip(src).for_each(|(e, s)| *e = finish(oc, *s));
        }
    }
}

/// `t` itself when its elements are dense, else a dense copy.
fn contiguous_untracked(t: &Tensor) -> Result<Tensor> {
    if t.is_contiguous() {
        Ok(t.clone())
    } else {
        t.copy_untracked()
    }
}

/// The elements of the dense tensor `t` from a reader that locked it.
fn elems<'a, T: Element>(r: &'a Reader<'_>, t: &Tensor) -> Result<&'a [T]> {
    let d = r.data::<T>(t)?;
    d.get(t.offset()..t.offset() + t.numel())
        .ok_or_else(|| Error::internal("conv2d", "a tensor leaves its storage"))
}

/// A convolution kernel: the convolution (see [`convolve`]) and its output.
pub(super) type ConvKernel<T> = fn(&Conv<'_, T>, &mut [T]) -> Result<()>;

/// The convolution of `inputs` (input, weight, optional bias; all of dtype `T`) by `kernel`
/// into a new tensor of `meta` (dtype `T`), reading the inputs in place.
fn conv_dense<T: Element + Default>(
    op: &str,
    g: &ConvGeom,
    inputs: &[&Tensor],
    meta: &Meta,
    kernel: ConvKernel<T>,
    budget: usize,
) -> Result<Tensor> {
    let dev = cpu_device(op, inputs[0])?;
    let ts = inputs
        .iter()
        .map(|t| contiguous_untracked(t))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&Tensor> = ts.iter().collect();
    let r = Reader::new(&refs);
    let data = ConvData {
        x: elems::<T>(&r, &ts[0])?,
        w: elems::<T>(&r, &ts[1])?,
        bias: ts.get(2).map(|t| elems::<T>(&r, t)).transpose()?,
    };
    let threads = conv_threads(g, &dev);
    let device = Device::from_cpu(dev.clone());
    Tensor::from_fn_overwrite::<T>(&meta.shape, &device, |out| {
        convolve(kernel, g, data, &dev, threads, budget, out)
    })
}

/// The CPU convolution in the inputs' dtype.
pub(super) fn conv_forward(
    op: &str,
    g: &ConvGeom,
    inputs: &[&Tensor],
    meta: &Meta,
) -> Result<Tensor> {
    match meta.dtype {
        DType::F64 => conv_dense::<f64>(op, g, inputs, meta, conv_cpu, COLS_BLOCK),
        DType::F32 => conv_dense::<f32>(op, g, inputs, meta, conv_cpu, COLS_BLOCK),
        DType::BF16 => conv_dense::<bf16>(op, g, inputs, meta, conv_cpu16, COLS_BLOCK_16),
        DType::F16 => conv_dense::<f16>(op, g, inputs, meta, conv_cpu16, COLS_BLOCK_16),
        d => Err(unsupported(op, d, DTypeSet::FLOAT)),
    }
}

/// The transposed convolution on the CPU, computed in f32 (f64 for f64 inputs) and rounded to
/// `meta`'s dtype.
pub(super) fn conv_transpose(
    op: &str,
    g: &ConvGeom,
    inputs: &[&Tensor],
    meta: &Meta,
) -> Result<Tensor> {
    with_compute!(op, inputs[0].dtype(), |C| {
        let x = read::<C>(inputs[0])?;
        let w = read::<C>(inputs[1])?;
        let b = inputs.get(2).map(|t| read::<C>(t)).transpose()?;
        produce::<C>(op, inputs[0], meta, |dev, out| {
            conv_t_cpu(g, &x, &w, b.as_deref(), dev, out)
        })
    })
}

/// calling thread for small `work`, else on the device's pool, each piece handing the matrix
/// product the threads that the pieces leave idle.
fn run_blocks<F: Send>(
    dev: &CpuDevice,
    out: &mut [F],
    block: usize,
    work: usize,
    task: impl Fn(usize, &mut [F], Par) + Sync + Send,
) -> Result<()> {
    if block == 0 || out.is_empty() {
        return Ok(());
    }
    let threads = dev.num_threads();
    if work < CONV_PAR_WORK || threads <= 1 {
        for (i, b) in out.chunks_mut(block).enumerate() {
            task(i, b, Par::Seq);
        }
        return Ok(());
    }
    let blocks = out.len() / block;
    let inner = threads.div_ceil(blocks.max(1));
    let par = if inner > 1 {
        Par::rayon(inner)
    } else {
        Par::Seq
    };
    dev.install(|| {
        out.par_chunks_mut(block)
            .enumerate()
            .for_each(|(i, b)| task(i, b, par))
    })
}

/// Transposed convolution: per image and group, the weight's transpose times the input gives
/// every tap's contribution, which is then added into place (col2im).
fn conv_t_cpu<F: Float + RealField>(
    g: &ConvGeom,
    x: &[F],
    w: &[F],
    bias: Option<&[F]>,
    dev: &CpuDevice,
    out: &mut [F],
) -> Result<()> {
    let (cg, og) = (g.c / g.groups, g.o / g.groups);
    let (hw, ohw) = (g.h * g.w, g.oh * g.ow);
    let kk = og * g.kh * g.kw;
    let work = [g.c, hw, kk].iter().fold(g.n, |a, &v| a.saturating_mul(v));
    // Each task's columns hold every tap of the input, which for large kernels is far more
    // than the output: ask for them, one per thread, before any task starts.
    let cols_bytes = kk
        .checked_mul(hw)
        .and_then(|v| v.checked_mul(std::mem::size_of::<F>()))
        .and_then(|v| v.checked_mul(dev.num_threads().min(g.n * g.groups).max(1)))
        .ok_or_else(|| {
            Error::shape(
                "conv_transpose2d",
                "the column buffers are more than the address space holds",
            )
        })?;
    check_host_memory(cols_bytes, || "conv_transpose2d column buffers".into())?;
    run_blocks(dev, out, og * ohw, work, |i, dst, par| {
        let (bn, grp) = (i / g.groups, i % g.groups);
        let base = (bn * g.c + grp * cg) * hw;
        let rhs = MatRef::from_row_major_slice(&x[base..base + cg * hw], cg, hw);
        let lhs = MatRef::from_row_major_slice(&w[grp * cg * kk..(grp + 1) * cg * kk], cg, kk)
            .transpose();
        let mut cols = vec![F::default(); kk * hw];
        matmul(
            MatMut::from_row_major_slice_mut(&mut cols, kk, hw),
            Accum::Replace,
            lhs,
            rhs,
            F::of(1.0),
            par,
        );
        dst.fill(F::default());
        for (r, col) in cols.chunks(hw).enumerate() {
            let kj = r % g.kw;
            let ki = (r / g.kw) % g.kh;
            let oc = r / (g.kw * g.kh);
            let plane = &mut dst[oc * ohw..(oc + 1) * ohw];
            for iy in 0..g.h {
                let oy = (iy * g.stride[0] + ki * g.dil[0]) as isize - g.pad[0][0] as isize;
                if oy < 0 || oy >= g.oh as isize {
                    continue;
                }
                let orow = &mut plane[oy as usize * g.ow..(oy as usize + 1) * g.ow];
                for (ix, &v) in col[iy * g.w..(iy + 1) * g.w].iter().enumerate() {
                    let ox = (ix * g.stride[1] + kj * g.dil[1]) as isize - g.pad[1][0] as isize;
                    if ox >= 0 && (ox as usize) < g.ow {
                        orow[ox as usize] += v;
                    }
                }
            }
        }
        if let Some(b) = bias {
            for (oc, row) in dst.chunks_mut(ohw).enumerate() {
                let v = b[grp * og + oc];
                row.iter_mut().for_each(|e| *e += v);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    //! The convolution kernels against direct loops, with patch budgets and thread counts that
    //! force every blocking and splitting path on small shapes.

    use std::sync::Arc;

    use proptest::prelude::*;
    use tpu_tensor::Generator;

    use super::*;

    /// `out[n, o, y, x] = bias[o] + sum x[n, g * cg + c, ...] * w[o, c, ki, kj]` in f64, and
    /// the same sum over absolute values (the scale of the rounding error).
    fn direct(g: &ConvGeom, x: &[f64], w: &[f64], bias: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        let (cg, og) = (g.c / g.groups, g.o / g.groups);
        let (mut out, mut mag) = (Vec::new(), Vec::new());
        for n in 0..g.n {
            for oc in 0..g.o {
                let grp = oc / og;
                for oy in 0..g.oh {
                    for ox in 0..g.ow {
                        let b = bias.map_or(0.0, |b| b[oc]);
                        let (mut s, mut a) = (b, b.abs());
                        for c in 0..cg {
                            for ki in 0..g.kh {
                                for kj in 0..g.kw {
                                    let iy = (oy * g.stride[0] + ki * g.dil[0]) as isize
                                        - g.pad[0][0] as isize;
                                    let ix = (ox * g.stride[1] + kj * g.dil[1]) as isize
                                        - g.pad[1][0] as isize;
                                    if iy < 0 || ix < 0 || iy >= g.h as isize || ix >= g.w as isize
                                    {
                                        continue;
                                    }
                                    let ci = grp * cg + c;
                                    let xv =
                                        x[((n * g.c + ci) * g.h + iy as usize) * g.w + ix as usize];
                                    let wv = w[((oc * cg + c) * g.kh + ki) * g.kw + kj];
                                    s += xv * wv;
                                    a += (xv * wv).abs();
                                }
                            }
                        }
                        out.push(s);
                        mag.push(a);
                    }
                }
            }
        }
        (out, mag)
    }

    /// Geometries whose sizes straddle the block and split boundaries, a patch budget, a
    /// thread count and a seed; `None` where the kernel does not fit the padded input.
    fn case() -> impl Strategy<Value = Option<(ConvGeom, usize, usize, u64)>> {
        (
            (
                1..=3usize,
                1..=2usize,
                prop::sample::select(vec![1usize, 2, 7, 17, 65]),
            ),
            (
                prop::sample::select(vec![1usize, 7, 17]),
                prop::sample::select(vec![1usize, 2, 7, 9]),
            ),
            prop::sample::select(vec![1usize, 7, 17, 63, 65]),
            (
                1..=3usize,
                1..=3usize,
                1..=2usize,
                1..=2usize,
                1..=2usize,
                1..=2usize,
            ),
            (0..=2usize, 0..=2usize, 0..=1usize, 0..=1usize),
            (
                prop::sample::select(vec![1usize, 40, 257, 1000, 4096, 1 << 16]),
                1..=3usize,
                any::<u64>(),
            ),
        )
            .prop_map(
                |(
                    (n, groups, cg),
                    (og, h),
                    w,
                    (kh, kw, s0, s1, d0, d1),
                    pads,
                    (budget, threads, seed),
                )| {
                    let (p0, p1, q0, q1) = pads;
                    let pad = [[p0, p1], [q0, q1]];
                    let span = [d0 * (kh - 1) + 1, d1 * (kw - 1) + 1];
                    let padded = [h + p0 + p1, w + q0 + q1];
                    if padded[0] < span[0] || padded[1] < span[1] {
                        return None;
                    }
                    let g = ConvGeom {
                        n,
                        c: cg * groups,
                        h,
                        w,
                        o: og * groups,
                        kh,
                        kw,
                        oh: (padded[0] - span[0]) / s0 + 1,
                        ow: (padded[1] - span[1]) / s1 + 1,
                        stride: [s0, s1],
                        pad,
                        dil: [d0, d1],
                        groups,
                    };
                    Some((g, budget, threads, seed))
                },
            )
    }

    /// Seeded normal operands of `g` (input, weight, bias), rounded to `T`.
    fn operands<T: Element>(g: &ConvGeom, seed: u64) -> [Vec<T>; 3] {
        let mut r = Generator::new(seed);
        let sizes = [
            g.n * g.c * g.h * g.w,
            g.o * (g.c / g.groups) * g.kh * g.kw,
            g.o,
        ];
        sizes.map(|len| {
            r.randn([len], DType::F64, &Device::cpu())
                .and_then(|t| t.to_dtype(T::DTYPE))
                .and_then(|t| t.to_vec::<T>())
                .unwrap()
        })
    }

    fn wide<T: Element>(v: &[T]) -> Vec<f64> {
        v.iter().map(|e| e.to_f64()).collect()
    }

    fn host() -> Arc<CpuDevice> {
        Device::cpu().as_cpu().cloned().unwrap()
    }

    /// Runs `kernel` on `g` with and without bias and checks each output element against the
    /// direct loops: within `rel` of the absolute-value sum, plus half a unit in the last place
    /// of the output dtype (`mant` fraction bits, `emin` smallest normal exponent), so that
    /// 16-bit outputs must be rounded once from an f32 sum.
    fn check<T: Element>(
        g: &ConvGeom,
        budget: usize,
        threads: usize,
        seed: u64,
        kernel: ConvKernel<T>,
        (rel, mant, emin): (f64, i32, i32),
    ) -> std::result::Result<(), TestCaseError> {
        let [x, w, b] = operands::<T>(g, seed);
        let dev = host();
        for with_bias in [false, true] {
            let bias = with_bias.then_some(&b[..]);
            let mut out = vec![T::default(); g.n * g.o * g.oh * g.ow];
            convolve(
                kernel,
                g,
                ConvData { x: &x, w: &w, bias },
                &dev,
                threads,
                budget,
                &mut out,
            )
            .unwrap();
            let wb = wide(&b);
            let (want, mag) = direct(g, &wide(&x), &wide(&w), with_bias.then_some(&wb[..]));
            for (i, (y, (r, m))) in out.iter().zip(want.iter().zip(&mag)).enumerate() {
                let y = y.to_f64();
                let e = if *r == 0.0 {
                    emin
                } else {
                    (r.abs().log2().floor() as i32).max(emin)
                };
                let tol = rel * m + 2f64.powi(e - mant - 1);
                prop_assert!(
                    (y - r).abs() <= tol,
                    "{g:?} budget {budget} threads {threads} bias {with_bias}: element {i} is {y}, expected {r}"
                );
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn kernels_match_direct_loops(c in case()) {
            let Some((g, budget, threads, seed)) = c else { return Ok(()) };
            let k = (g.c / g.groups * g.kh * g.kw + 2) as f64;
            check::<f64>(&g, budget, threads, seed, conv_cpu, (k * 2f64.powi(-52), 52, -1022))?;
            check::<f32>(&g, budget, threads, seed, conv_cpu, (k * 2f64.powi(-23), 23, -126))?;
            check::<bf16>(&g, budget, threads, seed, conv_cpu16, (k * 2f64.powi(-23), 7, -126))?;
            check::<f16>(&g, budget, threads, seed, conv_cpu16, (k * 2f64.powi(-23), 10, -14))?;
        }
    }

    #[test]
    fn kernels_without_input_channels_give_the_bias() {
        let g = ConvGeom {
            n: 2,
            c: 0,
            h: 3,
            w: 3,
            o: 2,
            kh: 1,
            kw: 1,
            oh: 3,
            ow: 3,
            stride: [1, 1],
            pad: [[0, 0], [0, 0]],
            dil: [1, 1],
            groups: 1,
        };
        let b = [bf16::from_f32(1.5), bf16::from_f32(-2.0)];
        let mut out = vec![bf16::from_f32(9.0); 36];
        let data = ConvData {
            x: &[],
            w: &[],
            bias: Some(&b),
        };
        convolve(conv_cpu16, &g, data, &host(), 1, COLS_BLOCK_16, &mut out).unwrap();
        let want: Vec<f32> = (0..36)
            .map(|i| if i / 9 % 2 == 0 { 1.5 } else { -2.0 })
            .collect();
        assert_eq!(out.iter().map(|v| v.to_f32()).collect::<Vec<_>>(), want);
    }
}
