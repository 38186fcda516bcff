//! Seeded sample inputs for the op table's rows: made on the CPU in f64 and converted, so a row's
//! inputs are the same values on every device and in every dtype.

use tpu_tensor::{DType, Device, Generator, Result, Tensor};

/// Maps an f64 tensor's values on the host (for building sample inputs).
pub fn host_map(t: &Tensor, f: impl Fn(f64) -> f64) -> Result<Tensor> {
    let v: Vec<f64> = t
        .to_dtype(DType::F64)?
        .to_vec::<f64>()?
        .into_iter()
        .map(f)
        .collect();
    Tensor::from_vec(v, t.shape(), t.device())
}

/// Standard normal values of `shape`, as `dtype` on `device`.
pub fn randn(g: &mut Generator, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
    g.randn(shape, DType::F64, &Device::cpu())?
        .to_dtype(dtype)?
        .to_device(device)
}

/// Normal values of mean `shift` and deviation `scale`, as `dtype` on `device`.
pub fn randn_affine(
    g: &mut Generator,
    shape: &[usize],
    scale: f64,
    shift: f64,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let t = g.randn(shape, DType::F64, &Device::cpu())?;
    host_map(&t, |v| v * scale + shift)?
        .to_dtype(dtype)?
        .to_device(device)
}

/// Standard normal values of `shape` as a non-contiguous view: stored in the order that
/// `permute(perm)` turns into `shape`.
pub fn randn_permuted(
    g: &mut Generator,
    shape: &[usize],
    perm: &[usize],
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let mut stored = vec![0; shape.len()];
    for (i, &p) in perm.iter().enumerate() {
        stored[p] = shape[i];
    }
    randn(g, &stored, dtype, device)?.permute(perm)
}
