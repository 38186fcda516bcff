//! Size-changing ops with huge outputs are errors, never aborts: near and past the limit of a
//! small CPU device, past any machine's memory on PJRT devices, and past the address space.
//! Fill values of pad, masked_fill and scatter are checked as PyTorch checks them.
//!
//! The property tests run a few cases by default; `PROPTEST_CASES` sets how many.

use crate::common::pjrt;
use proptest::prelude::*;
use tpu_ops::ops::conv::{ConvOptions, InterpolateMode, Padding, Resize};
use tpu_ops::ops::movement::{MovementOps, PadMode, cat, stack};
use tpu_ops::prelude::*;
use tpu_tensor::tpu_runtime::CpuOptions;
use tpu_tensor::{DType, Device, Error, Result, Scalar, Tensor};

/// The limit of the small CPU devices.
const LIMIT: usize = 4 << 20;

fn config(ci_cases: u32) -> ProptestConfig {
    ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(ci_cases))
}

fn limited() -> Device {
    Device::new_cpu(&CpuOptions {
        num_threads: Some(1),
        memory_limit: Some(LIMIT),
    })
    .unwrap()
}

/// A size-changing op whose output has about `n` elements.
#[derive(Clone, Copy, Debug)]
enum SizeOp {
    Repeat,
    Tile,
    PadConstant,
    PadReplicate,
    Cat,
    Stack,
    OneHot,
    Contiguous,
    AddExpanded,
    Conv2dPadding,
    Interpolate,
    MatmulBatch,
}

const OPS: [SizeOp; 12] = [
    SizeOp::Repeat,
    SizeOp::Tile,
    SizeOp::PadConstant,
    SizeOp::PadReplicate,
    SizeOp::Cat,
    SizeOp::Stack,
    SizeOp::OneHot,
    SizeOp::Contiguous,
    SizeOp::AddExpanded,
    SizeOp::Conv2dPadding,
    SizeOp::Interpolate,
    SizeOp::MatmulBatch,
];

fn ones(shape: &[usize], d: &Device) -> Tensor {
    Tensor::ones(shape, DType::F32, d).unwrap()
}

impl SizeOp {
    /// The output shape for size parameter `k`, and the bytes of each element.
    fn output(self, k: usize) -> (Vec<usize>, usize) {
        match self {
            SizeOp::Repeat => (vec![2 * k], 4),
            SizeOp::Tile => (vec![2 * k, 3], 4),
            SizeOp::PadConstant | SizeOp::PadReplicate => (vec![1, 2 + k], 4),
            SizeOp::Cat => (vec![2 * k], 4),
            SizeOp::Stack => (vec![2, k], 4),
            SizeOp::OneHot => (vec![1, k], 8),
            SizeOp::Contiguous | SizeOp::AddExpanded => (vec![k], 4),
            SizeOp::Conv2dPadding => (vec![1, 1, 1 + 2 * k, 1], 4),
            SizeOp::Interpolate => (vec![1, 1, k, 1], 4),
            SizeOp::MatmulBatch => (vec![k, 1, 1], 4),
        }
    }

    /// Runs the op on `d` for size parameter `k` (at most `i64::MAX / 2`, so that every
    /// argument the op takes can be named).
    fn run(self, k: usize, d: &Device) -> Result<Tensor> {
        match self {
            SizeOp::Repeat => ones(&[2], d).repeat(&[k]),
            SizeOp::Tile => ones(&[2, 1], d).tile(&[k, 3]),
            SizeOp::PadConstant => ones(&[1, 2], d).pad(&[0, k], PadMode::Constant(1.5.into())),
            SizeOp::PadReplicate => ones(&[1, 2], d).pad(&[k, 0], PadMode::Replicate),
            SizeOp::Cat => {
                let e = ones(&[1], d).expand([k as i64])?;
                cat(&[&e, &e], 0)
            }
            SizeOp::Stack => {
                let e = ones(&[1], d).expand([k as i64])?;
                stack(&[&e, &e], 0)
            }
            SizeOp::OneHot => Tensor::from_vec(vec![0i64], [1], d)?.one_hot(k as i64),
            SizeOp::Contiguous => ones(&[1], d).expand([k as i64])?.contiguous(),
            SizeOp::AddExpanded => {
                let e = ones(&[1], d).expand([k as i64])?;
                e.add(&e)
            }
            SizeOp::Conv2dPadding => {
                let o = ConvOptions {
                    padding: Padding::from([k, 0]),
                    ..Default::default()
                };
                ones(&[1, 1, 1, 1], d).conv2d(&ones(&[1, 1, 1, 1], d), None, &o)
            }
            SizeOp::Interpolate => {
                ones(&[1, 1, 1, 1], d).interpolate(Resize::Size([k, 1]), InterpolateMode::Nearest)
            }
            SizeOp::MatmulBatch => {
                let a = ones(&[1, 1, 1], d).expand([k as i64, 1, 1])?;
                a.matmul(&ones(&[1, 1], d))
            }
        }
    }
}

/// The output's bytes, or `None` past what a shape can count (element counts past i64, bytes
/// past usize).
fn countable_bytes(shape: &[usize], size: usize) -> Option<usize> {
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    if n > i64::MAX as usize {
        return None;
    }
    n.checked_mul(size)
}

/// What one run of an op must give.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// A result of the output's shape: the output and what the op allocates on the way are
    /// well under the limit.
    Fit,
    /// Near the limit: either a result or an out-of-memory error.
    Either,
    /// Past the limit: an out-of-memory error (a shape error past what can be counted).
    Refuse,
}

/// Runs `op` with parameter `k` on `d` and checks the outcome against `expect`.
fn check(op: SizeOp, k: usize, d: &Device, expect: Expect) -> std::result::Result<(), String> {
    let (shape, size) = op.output(k);
    let r = op.run(k, d);
    match (&r, countable_bytes(&shape, size)) {
        (Ok(t), Some(_)) if expect != Expect::Refuse && t.shape() == &shape[..] => Ok(()),
        (Err(Error::OutOfMemory { .. }), Some(_)) if expect != Expect::Fit => Ok(()),
        (Err(Error::Shape { .. }), None) => Ok(()),
        _ => Err(format!(
            "{op:?} k = {k} (output {shape:?}, expected {expect:?}): {:?}",
            r.map(|t| t.shape().to_vec())
        )),
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// Near the limit of a small device: outputs well under it succeed, outputs past it are
    /// out-of-memory errors, and nothing stays allocated.
    #[test]
    fn size_changing_ops_near_a_small_limit(which in 0..OPS.len(), frac in 0.0f64..2.0) {
        let op = OPS[which];
        let (_, size) = op.output(1);
        // The output's bytes are about `frac * LIMIT`.
        let k = ((frac * LIMIT as f64) / (2 * size) as f64).max(1.0) as usize;
        let (shape, _) = op.output(k);
        let bytes = countable_bytes(&shape, size).unwrap();
        let d = limited();
        // Inputs and copies made on the way may take as much again as the output.
        let expect = if 4 * bytes <= LIMIT {
            Expect::Fit
        } else if bytes > LIMIT {
            Expect::Refuse
        } else {
            Expect::Either
        };
        let r = check(op, k, &d, expect);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
        prop_assert_eq!(d.memory_stats().unwrap().bytes_in_use, 0);
    }

    /// Far past the limit and past what shapes can count.
    #[test]
    fn size_changing_ops_far_past_the_limit(which in 0..OPS.len(), log2 in 21u32..62) {
        let op = OPS[which];
        let k = 1usize << log2;
        let d = limited();
        let r = check(op, k, &d, Expect::Refuse);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
        prop_assert_eq!(d.memory_stats().unwrap().bytes_in_use, 0);
    }
}

proptest! {
    #![proptest_config(config(12))]

    /// On a PJRT device, outputs past any machine's memory are refused before anything is
    /// compiled or allocated.
    #[test]
    fn size_changing_ops_on_pjrt_past_any_memory(which in 0..OPS.len(), log2 in 40u32..62) {
        let Some(d) = pjrt("size_changing_ops_on_pjrt_past_any_memory") else {
            return Ok(());
        };
        let op = OPS[which];
        let r = check(op, 1usize << log2, &d, Expect::Refuse);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

// ---- the reported cases ------------------------------------------------------------------------

const BIG: usize = 1 << 40;

fn expect_oom(r: Result<Tensor>, bytes: usize, what: &str) {
    match r {
        Err(Error::OutOfMemory {
            requested, what: w, ..
        }) => {
            assert_eq!(requested, bytes, "{w}");
            assert_eq!(w, what);
        }
        other => panic!(
            "expected OutOfMemory, got {:?}",
            other.map(|t| t.shape().to_vec())
        ),
    }
}

#[test]
fn repeat_and_pad_to_two_to_the_forty_elements_are_out_of_memory() {
    let mut devices = vec![Device::cpu(), limited()];
    devices.extend(pjrt(
        "repeat_and_pad_to_two_to_the_forty_elements_are_out_of_memory",
    ));
    for d in &devices {
        let x = Tensor::from_vec(vec![1f32], [1], d).unwrap();
        expect_oom(
            x.repeat(&[BIG]),
            4 * BIG,
            "the output of repeat: f32[1099511627776]",
        );
        expect_oom(
            x.tile(&[BIG]),
            4 * BIG,
            "the output of repeat: f32[1099511627776]",
        );
        expect_oom(
            x.pad(&[BIG, 0], PadMode::Constant(Scalar::Int(0))),
            4 * BIG + 4,
            "the output of pad: f32[1099511627777]",
        );
        let e = x.repeat(&[1 << 62]).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
        let e = x
            .pad(&[usize::MAX, 1], PadMode::Constant(Scalar::Int(0)))
            .unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
    }
    // The small device names its limit.
    let d = limited();
    let e = Tensor::from_vec(vec![1f32], [1], &d)
        .unwrap()
        .repeat(&[BIG])
        .unwrap_err();
    assert!(
        e.to_string().ends_with(&format!("limit {LIMIT} bytes")),
        "{e}"
    );
}

#[test]
fn huge_expanded_views_in_ops_are_out_of_memory() {
    let mut devices = vec![Device::cpu(), limited()];
    devices.extend(pjrt("huge_expanded_views_in_ops_are_out_of_memory"));
    for d in &devices {
        let e = Tensor::from_vec(vec![1f32], [1], d)
            .unwrap()
            .expand([BIG])
            .unwrap();
        // A copy on the CPU is made directly, elsewhere by the `contiguous` op.
        let what = if d.is_cpu() {
            "f32[1099511627776]"
        } else {
            "the output of contiguous: f32[1099511627776]"
        };
        expect_oom(e.contiguous(), 4 * BIG, what);
        expect_oom(e.add(&e), 4 * BIG, "the output of add: f32[1099511627776]");
        let r = cat(&[&e, &e], 0);
        assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{:?}", r.err());
        // A reduction of a huge view needs it dense first, on the CPU.
        if d.is_cpu() {
            let r = e.sum_all();
            assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{:?}", r.err());
        }
    }
}

#[test]
fn empty_outputs_with_huge_dims_need_no_memory() {
    // A dim past any memory beside a 0: nothing to compute, and no table sized by the big dim.
    let d = limited();
    let x = Tensor::zeros([0, 1], DType::F32, &d).unwrap();
    let t = x.repeat(&[1, BIG]).unwrap();
    assert_eq!(t.shape(), &[0, BIG]);
    let t = x
        .pad(&[BIG, BIG], PadMode::Constant(Scalar::Int(0)))
        .unwrap();
    assert_eq!(t.shape(), &[0, 2 * BIG + 1]);
    let i = Tensor::zeros([0], DType::I64, &d).unwrap();
    assert_eq!(i.one_hot(BIG as i64).unwrap().shape(), &[0, BIG]);
    assert_eq!(d.memory_stats().unwrap().bytes_in_use, 0);
}

#[test]
fn conv_and_pool_arguments_past_the_address_space_are_shape_errors() {
    use tpu_ops::ops::conv::MaxPoolOptions;
    let d = Device::cpu();
    let x = Tensor::ones([1, 1, 4, 4], DType::F32, &d).unwrap();
    let w = Tensor::ones([1, 1, 2, 2], DType::F32, &d).unwrap();
    for o in [
        ConvOptions {
            padding: Padding::from([usize::MAX, 0]),
            ..Default::default()
        },
        ConvOptions {
            dilation: usize::MAX.into(),
            ..Default::default()
        },
    ] {
        let e = x.conv2d(&w, None, &o).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
    }
    let o = MaxPoolOptions {
        dilation: (usize::MAX / 2).into(),
        ..MaxPoolOptions::new(2)
    };
    let e = x.max_pool2d(&o).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
}

// ---- fill values -------------------------------------------------------------------------------

#[test]
fn fill_values_are_checked_as_pytorch_checks_them() {
    let mut devices = vec![Device::cpu()];
    devices.extend(pjrt("fill_values_are_checked_as_pytorch_checks_them"));
    for d in &devices {
        let u = Tensor::zeros([4], DType::U8, d).unwrap();
        let m = Tensor::from_vec(vec![true, false, true, false], [4], d).unwrap();
        let idx = Tensor::from_vec(vec![0i64, 1], [2], d).unwrap();
        // u.masked_fill(m, -1) -> [255, 0, 255, 0]; u.scatter(0, idx, -1) -> [255, 255, 0, 0];
        // 255.5 truncates to 255.
        let t = u.masked_fill(&m, -1).unwrap();
        assert_eq!(t.to_vec::<u8>().unwrap(), [255, 0, 255, 0]);
        let t = u.masked_fill(&m, 255.5).unwrap();
        assert_eq!(t.to_vec::<u8>().unwrap(), [255, 0, 255, 0]);
        let t = u.scatter_value(0, &idx, -1).unwrap();
        assert_eq!(t.to_vec::<u8>().unwrap(), [255, 255, 0, 0]);
        // 300, -0.5 and, for F.pad, -1: "value cannot be converted to type uint8_t without
        // overflow".
        for v in [Scalar::Int(300), Scalar::Float(-0.5)] {
            assert!(matches!(
                u.masked_fill(&m, v),
                Err(Error::InvalidArgument { .. })
            ));
            assert!(matches!(
                u.scatter_value(0, &idx, v),
                Err(Error::InvalidArgument { .. })
            ));
        }
        for v in [Scalar::Int(-1), Scalar::Int(300), Scalar::Float(-0.5)] {
            let e = u.pad(&[1, 1], PadMode::Constant(v)).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        }
        let t = u
            .pad(&[1, 1], PadMode::Constant(Scalar::Float(255.5)))
            .unwrap();
        assert_eq!(t.to_vec::<u8>().unwrap(), [255, 0, 0, 0, 0, 255]);
    }
}
