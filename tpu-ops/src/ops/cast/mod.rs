//! Dtype casts and dense copies as ops, so they run on the tensor's own device.

use std::sync::Arc;

use tpu_tensor::{DType, Device, Generator, Result, Tensor};

use crate::hlo::{FnBuilder, Value};
use crate::op::{DTypeSet, Meta, OpDef, OpInfo};

/// Converts to a dtype with PyTorch's casting rules.
#[derive(Clone, Debug)]
pub struct Cast(pub DType);

impl OpDef for Cast {
    fn name(&self) -> &'static str {
        "to_dtype"
    }

    fn attrs(&self) -> String {
        self.0.to_string()
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        Ok(vec![Meta::new(&inputs[0].shape, self.0)])
    }

    fn cpu(&self, inputs: &[&Tensor], _outputs: &[Meta]) -> Result<Vec<Tensor>> {
        Ok(vec![inputs[0].to_dtype_untracked(self.0)?])
    }

    fn lower(&self, b: &mut FnBuilder, inputs: &[Value], _outputs: &[Meta]) -> Result<Vec<Value>> {
        Ok(vec![lower_cast(b, &inputs[0], self.0)])
    }

    /// The gradient is converted (or passed) back: the input's values are never read.
    fn backward_reads(&self, _: usize, _: &[bool]) -> bool {
        false
    }

    fn has_backward(&self) -> bool {
        self.0.is_float()
    }

    fn backward(
        &self,
        saved: &crate::autograd::Saved,
        grads: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let from = saved.inputs[0].dtype();
        Ok(vec![match &grads[0] {
            Some(g) if from.is_float() => Some(g.to_dtype(from)?),
            _ => None,
        }])
    }
}

/// PyTorch's cast rules in StableHLO: floats reach unsigned bytes through i64 (so -1.0 wraps to
/// 255), f64 reaches the 16-bit floats through f32 (rounding twice, as PyTorch does), and
/// anything non-zero becomes `true`.
pub fn lower_cast(b: &mut FnBuilder, x: &Value, to: DType) -> Value {
    let from = x.dtype();
    if from == to {
        return x.clone();
    }
    if from.is_float() && to == DType::U8 {
        let i = b.convert(x, DType::I64);
        return b.convert(&i, DType::U8);
    }
    if from == DType::F64 && matches!(to, DType::F16 | DType::BF16) {
        let f = b.convert(x, DType::F32);
        return b.convert(&f, to);
    }
    if from.is_int() && matches!(to, DType::F16 | DType::BF16) {
        let f = b.convert(x, DType::F32);
        return b.convert(&f, to);
    }
    b.convert(x, to)
}

/// A dense copy of a (possibly strided) view.
#[derive(Clone, Debug)]
pub struct Copy;

impl OpDef for Copy {
    fn name(&self) -> &'static str {
        "contiguous"
    }

    fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        Ok(vec![inputs[0].clone()])
    }

    fn cpu(&self, inputs: &[&Tensor], _outputs: &[Meta]) -> Result<Vec<Tensor>> {
        Ok(vec![inputs[0].copy_untracked()?])
    }

    fn lower(&self, _b: &mut FnBuilder, inputs: &[Value], _outputs: &[Meta]) -> Result<Vec<Value>> {
        // The view is materialised when the input is read; the copy is that value.
        Ok(vec![inputs[0].clone()])
    }

    /// The gradient is converted (or passed) back: the input's values are never read.
    fn backward_reads(&self, _: usize, _: &[bool]) -> bool {
        false
    }

    fn has_backward(&self) -> bool {
        true
    }

    fn backward(
        &self,
        _saved: &crate::autograd::Saved,
        grads: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![grads[0].clone()])
    }
}

/// The rows of the op table for casts and copies.
pub fn table() -> Vec<OpInfo> {
    let mut rows = Vec::new();
    for to in DType::ALL {
        rows.push(OpInfo {
            name: match to {
                DType::Bool => "to(bool)",
                DType::U8 => "to(u8)",
                DType::I8 => "to(i8)",
                DType::I32 => "to(i32)",
                DType::I64 => "to(i64)",
                DType::F16 => "to(f16)",
                DType::BF16 => "to(bf16)",
                DType::F32 => "to(f32)",
                DType::F64 => "to(f64)",
            },
            cpu: DTypeSet::ALL,
            hlo: DTypeSet::ALL,
            sample: Arc::new(move |d, dev| {
                let x = Generator::new(4).randn([4, 3], DType::F64, &Device::cpu())?;
                let x = crate::op::samples::host_map(&x, |v| (v * 40.0).round() / 4.0)?
                    .to_dtype(d)?
                    .to_device(dev)?;
                Ok(vec![crate::exec::dispatch::run1(&Cast(to), &[&x.t()?])?])
            }),
            tolerance: 0.0,
        });
    }
    rows.push(OpInfo {
        name: "contiguous",
        cpu: DTypeSet::ALL,
        hlo: DTypeSet::ALL,
        sample: Arc::new(|d, dev| {
            let x = Tensor::arange(0, 24, 1, d, &Device::cpu())?
                .reshape([2, 3, 4])?
                .to_device(dev)?;
            let v = x.permute([2, 0, 1])?.slice(0, 1.., 2)?;
            Ok(vec![crate::exec::dispatch::run1(&Copy, &[&v])?])
        }),
        tolerance: 0.0,
    });
    rows
}
