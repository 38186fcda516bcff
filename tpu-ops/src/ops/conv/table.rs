//! The op table's rows for the family, with seeded sample inputs that reach every option (and
//! non-contiguous views) of each op.

use std::sync::Arc;

use tpu_tensor::{DType, Device, Generator, Result, Tensor};

use crate::op::samples::{randn, randn_permuted};
use crate::op::{DTypeSet, OpInfo};

use super::ConvOps;
use super::grid_sample::{GridMode, GridPadding, GridSampleOptions, grid_sample};
use super::options::{
    AvgPoolOptions, ConvOptions, ConvTransposeOptions, InterpolateMode, MaxPoolOptions, Padding,
    Resize,
};

fn sample_conv1d(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(21);
    let x = randn_permuted(&mut g, &[2, 4, 9], &[0, 2, 1], d, dev)?;
    let w = randn(&mut g, &[6, 2, 3], d, dev)?;
    let b = randn(&mut g, &[6], d, dev)?;
    let o = ConvOptions::new()
        .stride(2)
        .padding(1)
        .dilation(2)
        .groups(2);
    let same = ConvOptions::new().padding(Padding::Same).dilation(3);
    let w1 = randn(&mut g, &[3, 4, 2], d, dev)?;
    Ok(vec![
        x.conv1d(&w, Some(&b), &o)?,
        x.conv1d(&w1, None, &same)?,
        x.select(0, 1)?.conv1d(&w1, None, &ConvOptions::new())?,
    ])
}

fn sample_conv2d(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(22);
    let x = randn_permuted(&mut g, &[2, 4, 7, 6], &[0, 2, 3, 1], d, dev)?;
    let w = randn(&mut g, &[6, 2, 3, 2], d, dev)?;
    let b = randn(&mut g, &[6], d, dev)?;
    let o = ConvOptions::new()
        .stride([2, 1])
        .padding([1, 2])
        .dilation([2, 1])
        .groups(2);
    let w1 = randn(&mut g, &[3, 4, 1, 1], d, dev)?;
    let w2 = randn(&mut g, &[5, 4, 2, 3], d, dev)?;
    Ok(vec![
        x.conv2d(&w, Some(&b), &o)?,
        x.conv2d(&w1, None, &ConvOptions::new())?,
        x.select(0, 0)?
            .conv2d(&w2, None, &ConvOptions::new().padding(Padding::Same))?,
    ])
}

fn sample_conv_t(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(23);
    let x = randn_permuted(&mut g, &[2, 4, 4, 5], &[0, 3, 1, 2], d, dev)?;
    let w = randn(&mut g, &[4, 3, 3, 2], d, dev)?;
    let b = randn(&mut g, &[6], d, dev)?;
    let o = ConvTransposeOptions::new()
        .stride([2, 3])
        .padding([1, 0])
        .output_padding([1, 2])
        .dilation([1, 2])
        .groups(2);
    // Padding beyond the kernel reach exercises the lowering's cropping.
    let crop = ConvTransposeOptions::new().stride(2).padding(3);
    let w1 = randn(&mut g, &[4, 2, 2, 2], d, dev)?;
    Ok(vec![
        x.conv_transpose2d(&w, Some(&b), &o)?,
        x.conv_transpose2d(&w1, None, &crop)?,
    ])
}

fn sample_max_pool(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(24);
    let x = randn_permuted(&mut g, &[2, 3, 7, 8], &[0, 2, 3, 1], d, dev)?;
    let (v, i) =
        x.max_pool2d_with_indices(&MaxPoolOptions::new(3).stride(2).padding(1).ceil_mode(true))?;
    let o = MaxPoolOptions::new([2, 3]).dilation(2).ceil_mode(true);
    Ok(vec![
        v,
        i,
        x.max_pool2d(&o)?,
        x.select(1, 2)?.max_pool2d(&MaxPoolOptions::new(2))?,
    ])
}

fn sample_avg_pool(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(25);
    let x = randn_permuted(&mut g, &[2, 3, 7, 8], &[0, 2, 3, 1], d, dev)?;
    let o = AvgPoolOptions::new(3)
        .stride(2)
        .padding(1)
        .ceil_mode(true)
        .count_include_pad(false);
    let inc = AvgPoolOptions::new([3, 2]).padding(1).ceil_mode(true);
    let div = AvgPoolOptions::new(2).divisor_override(Some(3));
    Ok(vec![
        x.avg_pool2d(&o)?,
        x.avg_pool2d(&inc)?,
        x.avg_pool2d(&div)?,
    ])
}

fn sample_adaptive(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(26);
    let x = randn_permuted(&mut g, &[2, 3, 7, 9], &[0, 2, 3, 1], d, dev)?;
    Ok(vec![
        x.adaptive_avg_pool2d([3, 4])?,
        x.adaptive_avg_pool2d(1)?,
        x.select(0, 1)?.adaptive_avg_pool2d([5, 9])?,
    ])
}

fn sample_nearest(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(27);
    let x = randn_permuted(&mut g, &[2, 3, 4, 5], &[0, 2, 3, 1], d, dev)?;
    let m = InterpolateMode::Nearest;
    Ok(vec![
        x.interpolate(Resize::Size([7, 3]), m)?,
        x.interpolate(Resize::Scale([2.0, 1.5]), m)?,
    ])
}

fn sample_bilinear(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(28);
    let x = randn_permuted(&mut g, &[2, 3, 4, 5], &[0, 2, 3, 1], d, dev)?;
    Ok(vec![
        x.interpolate(
            Resize::Size([7, 3]),
            InterpolateMode::Bilinear {
                align_corners: false,
            },
        )?,
        x.interpolate(
            Resize::Scale([1.5, 2.0]),
            InterpolateMode::Bilinear {
                align_corners: true,
            },
        )?,
    ])
}

fn sample_conv3d(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(31);
    let x = randn_permuted(&mut g, &[2, 4, 5, 4, 3], &[0, 2, 3, 4, 1], d, dev)?;
    let w = randn(&mut g, &[6, 2, 2, 3, 2], d, dev)?;
    let b = randn(&mut g, &[6], d, dev)?;
    let o = ConvOptions::new()
        .stride([2, 1, 1])
        .padding(Padding::Sides(vec![[1, 0], [1, 1], [0, 1]]))
        .dilation([2, 1, 1])
        .groups(2);
    let w1 = randn(&mut g, &[3, 4, 3, 1, 2], d, dev)?;
    Ok(vec![
        x.conv3d(&w, Some(&b), &o)?,
        x.select(0, 1)?
            .conv3d(&w1, None, &ConvOptions::new().padding(Padding::Same))?,
    ])
}

fn sample_conv_t3d(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(32);
    let x = randn_permuted(&mut g, &[2, 4, 3, 4, 2], &[0, 4, 1, 2, 3], d, dev)?;
    let w = randn(&mut g, &[4, 3, 2, 2, 3], d, dev)?;
    let b = randn(&mut g, &[6], d, dev)?;
    let o = ConvTransposeOptions::new()
        .stride([2, 1, 2])
        .padding([1, 0, 1])
        .output_padding([1, 0, 0])
        .dilation([1, 2, 1])
        .groups(2);
    Ok(vec![
        x.conv_transpose3d(&w, Some(&b), &o)?,
        x.select(0, 0)?.conv_transpose3d(
            &w.narrow(1, 0, 1)?,
            None,
            &ConvTransposeOptions::new(),
        )?,
    ])
}

fn sample_conv_t1d(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(33);
    let x = randn_permuted(&mut g, &[2, 4, 6], &[0, 2, 1], d, dev)?;
    let w = randn(&mut g, &[4, 3, 3], d, dev)?;
    let b = randn(&mut g, &[6], d, dev)?;
    let o = ConvTransposeOptions::new()
        .stride(3)
        .padding(1)
        .output_padding(2)
        .dilation(2)
        .groups(2);
    Ok(vec![
        x.conv_transpose1d(&w, Some(&b), &o)?,
        x.select(0, 1)?
            .conv_transpose1d(&w, None, &ConvTransposeOptions::new())?,
    ])
}

fn sample_grid_sample(d: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(34);
    let x = randn_permuted(&mut g, &[2, 3, 5, 4], &[0, 2, 3, 1], d, dev)?;
    // Past [-1, 1] on purpose, where the padding modes differ.
    let grid = randn(&mut g, &[2, 3, 4, 2], d, dev)?;
    let mut out = Vec::new();
    for (mode, padding_mode, align_corners) in [
        (GridMode::Bilinear, GridPadding::Zeros, false),
        (GridMode::Bilinear, GridPadding::Reflection, true),
        (GridMode::Nearest, GridPadding::Border, false),
        (GridMode::Bicubic, GridPadding::Reflection, false),
        (GridMode::Bicubic, GridPadding::Zeros, true),
    ] {
        let opts = GridSampleOptions {
            mode,
            padding_mode,
            align_corners,
        };
        out.push(grid_sample(&x, &grid, &opts)?);
    }
    Ok(out)
}

/// The rows of the op table for this file's ops.
pub fn table() -> Vec<OpInfo> {
    let row = |name: &'static str, f: fn(DType, &Device) -> Result<Vec<Tensor>>| OpInfo {
        name,
        cpu: DTypeSet::FLOAT,
        hlo: DTypeSet::FLOAT,
        sample: Arc::new(f),
        tolerance: 1e-5,
        // Every op here has a backward rule.
    };
    vec![
        row("conv1d", sample_conv1d),
        row("conv2d", sample_conv2d),
        row("conv_transpose2d", sample_conv_t),
        row("conv3d", sample_conv3d),
        row("conv_transpose3d", sample_conv_t3d),
        row("conv_transpose1d", sample_conv_t1d),
        row("grid_sampler_2d", sample_grid_sample),
        row("max_pool2d", sample_max_pool),
        row("avg_pool2d", sample_avg_pool),
        row("adaptive_avg_pool2d", sample_adaptive),
        row("upsample_nearest2d", sample_nearest),
        row("upsample_bilinear2d", sample_bilinear),
    ]
}
