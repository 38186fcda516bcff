//! The op table's rows for the movement ops, with their seeded sample inputs (small integers,
//! so every dtype is exact; non-contiguous views, ties and NaNs where an op must handle them).

use std::sync::Arc;

use tpu_tensor::{DType, Device, Generator, Result, Scalar, Tensor};

use super::{MovementOps, PadMode, ScatterReduction, cat, embedding, stack};
use crate::op::samples::host_map;
use crate::op::{DTypeSet, OpInfo};

/// Small integers in `[-6, 6]` (0 or 1 for bool) of `dtype`, on the CPU: exact in every dtype,
/// with ties for the sorts.
fn ints(seed: u64, shape: &[usize], dtype: DType) -> Result<Tensor> {
    let cpu = Device::cpu();
    let mut g = Generator::new(seed);
    if dtype == DType::Bool {
        return g.randint(0, 2, shape, DType::Bool, &cpu);
    }
    g.randint(-6, 7, shape, DType::I64, &cpu)?.to_dtype(dtype)
}

/// Random values with fractions for floats (for the accumulating ops), small integers
/// otherwise.
fn reals(seed: u64, shape: &[usize], dtype: DType) -> Result<Tensor> {
    if !dtype.is_float() {
        return ints(seed, shape, dtype);
    }
    let x = Generator::new(seed).randn(shape, DType::F64, &Device::cpu())?;
    host_map(&x, |v| v * 3.0)?.to_dtype(dtype)
}

fn idx_tensor(values: &[i64], shape: &[usize], dev: &Device) -> Result<Tensor> {
    Tensor::from_slice(values, shape, &Device::cpu())?.to_device(dev)
}

type SampleFn = fn(DType, &Device) -> Result<Vec<Tensor>>;

fn row(name: &'static str, cpu: DTypeSet, tolerance: f64, f: SampleFn) -> OpInfo {
    OpInfo {
        name,
        cpu,
        hlo: cpu,
        sample: Arc::new(f),
        tolerance,
    }
}

/// A `[2, 3, 4]` view that is not contiguous.
fn cube(seed: u64, d: DType, dev: &Device) -> Result<Tensor> {
    ints(seed, &[3, 2, 4], d)?
        .to_device(dev)?
        .permute([1, 0, 2])
}

fn sample_cat(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let cpu = Device::cpu();
    let a = ints(1, &[2, 3], d)?.to_device(dev)?;
    let b = ints(2, &[3, 2], d)?.to_device(dev)?.t()?;
    let c = ints(3, &[2, 1], DType::Bool)?.to_device(dev)?;
    let e = Tensor::zeros([0], d, &cpu)?.to_device(dev)?;
    Ok(vec![cat(&[&a, &e, &b, &c], -1)?])
}

fn sample_stack(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let a = ints(4, &[2, 3], d)?.to_device(dev)?;
    let b = ints(5, &[3, 2], d)?.to_device(dev)?.t()?;
    Ok(vec![stack(&[&a, &b], 1)?])
}

fn sample_pad(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = cube(6, d, dev)?;
    Ok(vec![x.pad(
        &[1, 2, 0, 1],
        PadMode::Constant(Scalar::Float(2.5)),
    )?])
}

fn sample_reflect(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = cube(7, d, dev)?;
    Ok(vec![x.pad(&[2, 1, 1, 2], PadMode::Reflect)?])
}

fn sample_replicate(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = cube(8, d, dev)?;
    Ok(vec![x.pad(&[3, 0, 0, 4, 1, 0], PadMode::Replicate)?])
}

fn sample_gather(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = ints(9, &[3, 4], d)?.to_device(dev)?.t()?;
    let i0 = idx_tensor(&[3, 0, 1, 2, 2, 0], &[2, 3], dev)?;
    let i1 = idx_tensor(&[2, 0, 1, 1, 0, 0, 2, 1], &[4, 2], dev)?;
    Ok(vec![x.gather(0, &i0)?, x.gather(-1, &i1)?])
}

fn sample_scatter(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    // scatter_value shares the lowering; the literal tests run it through XLA.
    let x = ints(10, &[3, 4], d)?.to_device(dev)?;
    let src = ints(11, &[4, 3], d)?.to_device(dev)?.t()?;
    let i1 = idx_tensor(&[3, 0, 1, 1, 2, 0], &[2, 3], dev)?;
    Ok(vec![x.scatter(1, &i1, &src)?])
}

fn sample_scatter_add(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = reals(12, &[3, 4], d)?.to_device(dev)?;
    let src = reals(13, &[4, 5], d)?.to_device(dev)?.t()?;
    let i = idx_tensor(
        &[0, 2, 2, 1, 2, 2, 0, 1, 0, 2, 1, 1, 2, 2, 0, 1],
        &[4, 4],
        dev,
    )?;
    Ok(vec![x.scatter_add(0, &i, &src)?])
}

/// `scatter_reduce` along dim 0 with repeated indices, with and without the input, from a
/// transposed `src` larger than the index.
fn scatter_reduce_sample(reduce: ScatterReduction, d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = reals(14, &[3, 4], d)?.to_device(dev)?;
    let src = reals(15, &[5, 4], d)?.to_device(dev)?.t()?;
    let i = idx_tensor(&[0, 2, 2, 1, 2, 2, 0, 1, 0, 2, 1, 1], &[3, 4], dev)?;
    Ok(vec![
        x.scatter_reduce(0, &i, &src, reduce, true)?,
        x.scatter_reduce(0, &i, &src, reduce, false)?,
    ])
}

fn sample_scatter_sum(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    scatter_reduce_sample(ScatterReduction::Sum, d, dev)
}

fn sample_scatter_prod(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    scatter_reduce_sample(ScatterReduction::Prod, d, dev)
}

fn sample_scatter_mean(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    scatter_reduce_sample(ScatterReduction::Mean, d, dev)
}

fn sample_scatter_amax(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    scatter_reduce_sample(ScatterReduction::Amax, d, dev)
}

fn sample_scatter_amin(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    scatter_reduce_sample(ScatterReduction::Amin, d, dev)
}

fn sample_index_select(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = ints(14, &[3, 4], d)?.to_device(dev)?.t()?;
    let i = idx_tensor(&[2, 0, 2, 1, 1], &[5], dev)?;
    Ok(vec![x.index_select(-1, &i)?])
}

fn sample_index_add(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = reals(15, &[5, 3], d)?.to_device(dev)?;
    let src = reals(16, &[3, 4], d)?.to_device(dev)?.t()?;
    let i = idx_tensor(&[1, 4, 1, 0], &[4], dev)?;
    Ok(vec![x.index_add(0, &i, &src, 2)?])
}

fn sample_index_copy(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = reals(15, &[3, 5], d)?.to_device(dev)?;
    let src = reals(16, &[2, 3], d)?.to_device(dev)?.t()?;
    let i = idx_tensor(&[4, 1], &[2], dev)?;
    Ok(vec![x.index_copy(1, &i, &src)?])
}

fn sample_masked_fill(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = ints(17, &[4, 3], d)?.to_device(dev)?.t()?;
    let m = ints(18, &[4], DType::Bool)?.to_device(dev)?;
    Ok(vec![x.masked_fill(&m, 1.5)?])
}

fn sample_embedding(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let w = ints(19, &[3, 5], d)?.to_device(dev)?.t()?;
    let i = idx_tensor(&[4, 0, 2, 4], &[2, 2], dev)?;
    Ok(vec![embedding(&i, &w)?])
}

fn sample_one_hot(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = Tensor::from_slice(&[0i64, 3, 1, 1, 0, 2], [2, 3], &Device::cpu())?
        .to_dtype(d)?
        .to_device(dev)?;
    Ok(vec![x.one_hot(-1)?])
}

fn sample_tril(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    Ok(vec![cube(20, d, dev)?.tril(-1)?])
}

fn sample_triu(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    Ok(vec![cube(21, d, dev)?.triu(1)?])
}

fn sample_repeat(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = ints(22, &[3, 2], d)?.to_device(dev)?.t()?;
    Ok(vec![x.repeat(&[2, 1, 3])?])
}

fn sample_tile(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let x = ints(23, &[3, 2], d)?.to_device(dev)?.t()?;
    Ok(vec![x.tile(&[2])?])
}

fn sample_flip(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    Ok(vec![cube(24, d, dev)?.flip(&[0, -1])?])
}

fn sample_roll(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    // The flattened roll is one of the literal tests on XLA.
    Ok(vec![cube(25, d, dev)?.roll(&[1, -2], &[0, 2])?])
}

/// A `[3, 5]` non-contiguous view with ties, and NaNs for floats.
fn sort_input(d: DType, dev: &Device) -> Result<Tensor> {
    let mut v = ints(26, &[5, 3], DType::I64)?
        .to_dtype(DType::F64)?
        .to_vec::<f64>()?;
    if d.is_float() {
        v[2] = f64::NAN;
        v[7] = f64::NAN;
        v[8] = -0.0;
    }
    let x = Tensor::from_vec(v, [5, 3], &Device::cpu())?;
    let x = if d == DType::Bool {
        host_map(&x, |v| (v > 0.0) as u8 as f64)?
    } else {
        x
    };
    x.to_dtype(d)?.to_device(dev)?.t()
}

fn sample_sort(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    // Descending here; the argsort row sorts ascending.
    let (a, b) = sort_input(d, dev)?.sort(1, true, true)?;
    Ok(vec![a, b])
}

fn sample_argsort(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    Ok(vec![sort_input(d, dev)?.argsort(0, false, true)?])
}

fn sample_topk(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    // Distinct values: which of several equal values topk returns is not specified.
    let v: Vec<i64> = (0..15).map(|i| (i * 7) % 15 - 7).collect();
    let x = Tensor::from_vec(v, [5, 3], &Device::cpu())?
        .to_dtype(d)?
        .to_device(dev)?
        .t()?;
    let (a, b) = x.topk(3, -1, true, true)?;
    Ok(vec![a, b])
}

/// The rows of the op table for the movement ops.
pub fn table() -> Vec<OpInfo> {
    let all = DTypeSet::ALL;
    let num = DTypeSet::NUMERIC;
    let rows = vec![
        row("cat", all, 0.0, sample_cat),
        row("stack", all, 0.0, sample_stack),
        row("pad", all, 0.0, sample_pad),
        row("pad(reflect)", num, 0.0, sample_reflect),
        row("pad(replicate)", num, 0.0, sample_replicate),
        row("gather", all, 0.0, sample_gather),
        row("scatter", all, 0.0, sample_scatter),
        // Additions may happen in another order in XLA.
        row("scatter_add", all, 1e-6, sample_scatter_add),
        row("scatter_reduce(sum)", all, 1e-6, sample_scatter_sum),
        row("scatter_reduce(prod)", all, 1e-6, sample_scatter_prod),
        row("scatter_reduce(mean)", num, 1e-6, sample_scatter_mean),
        row("scatter_reduce(amax)", all, 0.0, sample_scatter_amax),
        row("scatter_reduce(amin)", all, 0.0, sample_scatter_amin),
        row("index_select", all, 0.0, sample_index_select),
        row("index_add", all, 1e-6, sample_index_add),
        row("index_copy", all, 0.0, sample_index_copy),
        row("masked_fill", all, 0.0, sample_masked_fill),
        row("embedding", all, 0.0, sample_embedding),
        row("one_hot", DTypeSet::of(&[DType::I64]), 0.0, sample_one_hot),
        row("tril", all, 0.0, sample_tril),
        row("triu", all, 0.0, sample_triu),
        row("repeat", all, 0.0, sample_repeat),
        row("tile", all, 0.0, sample_tile),
        row("flip", all, 0.0, sample_flip),
        row("roll", all, 0.0, sample_roll),
        row("sort", all, 0.0, sample_sort),
        row("argsort", all, 0.0, sample_argsort),
        row("topk", num, 0.0, sample_topk),
    ];
    rows
}
