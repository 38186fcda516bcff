//! The op table's rows for the reductions and scans: one seeded `[4, 3, 5]` input per row, read
//! through a permuted or sliced view, so the rows also exercise the kernels' layouts.

use std::sync::Arc;

use tpu_tensor::{DType, Device, Generator, Result, Tensor};

use super::ReduceOps;
use crate::op::samples::host_map;
use crate::op::{DTypeSet, OpInfo};

/// How sample values are drawn.
#[derive(Clone, Copy)]
enum Values {
    /// Normal floats times 3, integers in [-5, 5].
    Wide,
    /// Normal floats times 0.8, integers in [-2, 2] (products stay in range).
    Narrow,
    /// Rounded floats and small integers, with many zeros (for all/any and p = 0).
    Sparse,
}

/// A seeded `[4, 3, 5]` input of `dtype` on `device`, built on the CPU.
fn sample_input(dtype: DType, device: &Device, values: Values) -> Result<Tensor> {
    let cpu = Device::cpu();
    let mut g = Generator::new(17);
    let x = if dtype.is_float() {
        let scale = match values {
            Values::Wide => 3.0,
            Values::Narrow => 0.8,
            Values::Sparse => 0.6,
        };
        let r = g.randn([4, 3, 5], DType::F64, &cpu)?;
        match values {
            Values::Sparse => host_map(&r, |v| (v * scale).round())?,
            _ => host_map(&r, |v| v * scale)?,
        }
    } else if dtype == DType::Bool {
        g.randint(0, 2, [4, 3, 5], DType::I64, &cpu)?
    } else {
        let (lo, hi) = match values {
            Values::Wide => (-5, 6),
            Values::Narrow => (-2, 3),
            Values::Sparse => (-1, 2),
        };
        g.randint(lo, hi, [4, 3, 5], DType::I64, &cpu)?
    };
    x.to_dtype(dtype)?.to_device(device)
}

type SampleFn = fn(&Tensor) -> Result<Vec<Tensor>>;

fn row(name: &'static str, dtypes: DTypeSet, tol: f64, values: Values, f: SampleFn) -> OpInfo {
    OpInfo {
        name,
        cpu: dtypes,
        hlo: dtypes,
        sample: Arc::new(move |d, dev| f(&sample_input(d, dev, values)?)),
        tolerance: tol,
    }
}

/// The rows of the op table for this file's ops. One call per row keeps XLA compiles few (each
/// costs tens of milliseconds); every call reads a permuted or sliced view. The CPU paths each
/// layout takes are covered by the property tests in `tests/reduce.rs`.
pub fn table() -> Vec<OpInfo> {
    use Values::*;
    let all = DTypeSet::ALL;
    let float = DTypeSet::FLOAT;
    // Float accumulations run in another order under XLA than on the CPU.
    let acc = 1e-5;
    vec![
        row("sum", all, acc, Wide, |x| {
            Ok(vec![
                x.slice(2, 1.., 2)?
                    .permute([2, 0, 1])?
                    .sum(&[0, -1], false)?,
            ])
        }),
        row("prod", all, acc, Narrow, |x| {
            Ok(vec![x.transpose(0, 2)?.prod(&[1], true)?])
        }),
        row("mean", float, acc, Wide, |x| {
            Ok(vec![x.permute([1, 2, 0])?.mean(&[2, 0], true)?])
        }),
        row("amax", all, 0.0, Wide, |x| {
            Ok(vec![x.permute([2, 0, 1])?.amax(&[1], false)?])
        }),
        row("amin", all, 0.0, Wide, |x| {
            Ok(vec![x.slice(0, 1.., 2)?.amin(&[], true)?])
        }),
        row("max", all, 0.0, Wide, |x| {
            let (v, i) = x.permute([2, 0, 1])?.max_dim(1, false)?;
            Ok(vec![v, i])
        }),
        row("min", all, 0.0, Wide, |x| {
            let (v, i) = x.slice(1, .., 2)?.min_dim(-1, true)?;
            Ok(vec![v, i])
        }),
        row("max_all", all, 0.0, Wide, |x| {
            Ok(vec![x.permute([1, 2, 0])?.max_all()?])
        }),
        row("min_all", all, 0.0, Wide, |x| {
            Ok(vec![x.slice(2, .., 2)?.min_all()?])
        }),
        row("argmax", DTypeSet::NUMERIC, 0.0, Wide, |x| {
            Ok(vec![x.permute([1, 2, 0])?.argmax(None, false)?])
        }),
        row("argmin", DTypeSet::NUMERIC, 0.0, Wide, |x| {
            Ok(vec![x.transpose(0, 2)?.argmin(Some(0), true)?])
        }),
        row("var", float, acc, Wide, |x| {
            Ok(vec![x.permute([2, 0, 1])?.var(&[0, 2], 1.0, false)?])
        }),
        row("std", float, acc, Wide, |x| {
            Ok(vec![x.slice(2, .., 2)?.std(&[-1, 0], 0.0, true)?])
        }),
        row("logsumexp", all, acc, Wide, |x| {
            Ok(vec![x.permute([1, 0, 2])?.logsumexp(&[0, 2], false)?])
        }),
        row("norm", float, acc, Sparse, |x| {
            Ok(vec![
                x.transpose(0, 2)?.norm(2.0, &[0], false)?,
                x.slice(1, .., 2)?.norm(3.0, &[-1, 0], true)?,
            ])
        }),
        row("all", all, 0.0, Sparse, |x| {
            Ok(vec![x.permute([2, 0, 1])?.all(&[1], false)?])
        }),
        row("any", all, 0.0, Sparse, |x| {
            Ok(vec![x.slice(2, .., 4)?.any(&[], true)?])
        }),
        row("cumsum", all, acc, Wide, |x| {
            Ok(vec![x.permute([2, 0, 1])?.cumsum(1)?])
        }),
        row("cumprod", all, acc, Narrow, |x| {
            Ok(vec![x.transpose(0, 1)?.cumprod(-1)?])
        }),
    ]
}
