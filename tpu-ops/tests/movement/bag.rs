//! `embedding_bag`: against direct loops over the bags (proptest, CPU), finite differences,
//! PyTorch's documented examples on every device, and bad input.

use crate::common::{
    Rng, check_near, cpu, f32s, gradcheck_or_panic, has, randn, test_device, vals,
};
use proptest::prelude::*;
use tpu_ops::ops::movement::{BagMode, BagOptions, embedding_bag};
use tpu_ops::prelude::*;
use tpu_tensor::{Device, Tensor};

fn i64s(v: &[i64], shape: &[usize], dev: &Device) -> Tensor {
    Tensor::from_slice(v, shape, &cpu())
        .unwrap()
        .to_device(dev)
        .unwrap()
}

/// One case: a table, indices cut into bags, and the options.
#[derive(Clone, Debug)]
struct Case {
    rows: usize,
    dim: usize,
    indices: Vec<i64>,
    /// Bag starts (1-D indices), or `None` for 2-D indices of `per` columns.
    offsets: Option<Vec<i64>>,
    per: usize,
    mode: BagMode,
    weighted: bool,
    include_last_offset: bool,
    padding_idx: Option<i64>,
    seed: u64,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        1usize..6,
        1usize..4,
        0usize..9,
        any::<u64>(),
        0usize..3,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(rows, dim, n, seed, m, weighted, two_d, last, pad)| {
            let mut rng = Rng::new(seed);
            let indices: Vec<i64> = (0..n).map(|_| rng.below(rows) as i64).collect();
            let mode = [BagMode::Sum, BagMode::Mean, BagMode::Max][m];
            let (offsets, per) = if two_d && n > 0 {
                let per = (1..=n)
                    .rev()
                    .find(|p| n % p == 0 && rng.coin())
                    .unwrap_or(1);
                (None, per)
            } else {
                let bags = rng.range(1, 4);
                let mut o: Vec<i64> = (0..bags).map(|_| rng.range(0, n) as i64).collect();
                o.sort();
                o[0] = 0;
                if last {
                    o.push(rng.range(*o.last().unwrap() as usize, n) as i64);
                }
                (Some(o), 0)
            };
            let padding_idx =
                pad.then(|| rng.below(rows) as i64 - if rng.coin() { rows as i64 } else { 0 });
            Case {
                rows,
                dim,
                indices,
                offsets,
                per,
                mode,
                weighted: weighted && mode == BagMode::Sum,
                include_last_offset: last,
                padding_idx,
                seed,
            }
        })
}

impl Case {
    /// The table: small integers, so that sums are exact.
    fn table(&self) -> Vec<f64> {
        let mut rng = Rng::new(self.seed ^ 7);
        (0..self.rows * self.dim)
            .map(|_| rng.below(19) as f64 - 9.0)
            .collect()
    }

    fn sample_weights(&self) -> Vec<f64> {
        let mut rng = Rng::new(self.seed ^ 9);
        (0..self.indices.len())
            .map(|_| rng.below(5) as f64 - 2.0)
            .collect()
    }

    /// The bags as ranges of positions in the indices.
    fn bags(&self) -> Vec<std::ops::Range<usize>> {
        let n = self.indices.len();
        match &self.offsets {
            None => (0..n / self.per)
                .map(|b| b * self.per..(b + 1) * self.per)
                .collect(),
            Some(o) => {
                let bags = if self.include_last_offset {
                    o.len() - 1
                } else {
                    o.len()
                };
                (0..bags)
                    .map(|b| o[b] as usize..o.get(b + 1).map_or(n, |&e| e as usize))
                    .collect()
            }
        }
    }

    /// What PyTorch's loops compute: per bag, the rows that are not padding, weighted, then
    /// summed, averaged or maxed per column; empty bags are zeros.
    fn reference(&self) -> Vec<f64> {
        let table = self.table();
        let w = self.sample_weights();
        let pad = self
            .padding_idx
            .map(|p| if p < 0 { p + self.rows as i64 } else { p });
        let mut out = Vec::new();
        for bag in self.bags() {
            let members: Vec<usize> = bag.filter(|&p| Some(self.indices[p]) != pad).collect();
            for c in 0..self.dim {
                let v: Vec<f64> = members
                    .iter()
                    .map(|&p| {
                        let x = table[self.indices[p] as usize * self.dim + c];
                        if self.weighted { x * w[p] } else { x }
                    })
                    .collect();
                out.push(match (self.mode, v.is_empty()) {
                    (_, true) => 0.0,
                    (BagMode::Sum, _) => v.iter().sum(),
                    (BagMode::Mean, _) => v.iter().sum::<f64>() / v.len() as f64,
                    (BagMode::Max, _) => v.iter().copied().fold(f64::MIN, f64::max),
                });
            }
        }
        out
    }

    fn run(&self, weight: &Tensor, psw: Option<Tensor>) -> tpu_tensor::Result<Tensor> {
        let dev = weight.device();
        let indices = match &self.offsets {
            None => i64s(
                &self.indices,
                &[self.indices.len() / self.per, self.per],
                dev,
            ),
            Some(_) => i64s(&self.indices, &[self.indices.len()], dev),
        };
        let psw = psw.map(|w| w.reshape(indices.shape()).unwrap());
        let opts = BagOptions {
            mode: self.mode,
            offsets: self.offsets.as_ref().map(|o| i64s(o, &[o.len()], dev)),
            per_sample_weights: psw,
            include_last_offset: self.include_last_offset,
            padding_idx: self.padding_idx,
        };
        embedding_bag(&indices, weight, &opts)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tpu_ops::testing::proptest_cases(96)))]

    #[test]
    fn embedding_bag_matches_reference(c in cases()) {
        let weight = f32s(&c.table(), &[c.rows, c.dim], &cpu());
        let psw = c.weighted.then(|| f32s(&c.sample_weights(), &[c.indices.len()], &cpu()));
        let out = c.run(&weight, psw).unwrap();
        let want = c.reference();
        prop_assert_eq!(out.shape(), &[want.len() / c.dim, c.dim][..]);
        check_near(&format!("{c:?}"), &vals(&out), &want, 1e-6);
    }

    #[test]
    fn embedding_bag_gradcheck(c in cases()) {
        // randn values: no ties between the maxima.
        let weight = randn(c.seed, &[c.rows, c.dim]);
        let mut inputs = vec![weight];
        if c.weighted {
            inputs.push(randn(c.seed ^ 1, &[c.indices.len()]));
        }
        gradcheck_or_panic(
            "embedding_bag",
            |t| c.run(&t[0], t.get(1).cloned()),
            &inputs,
            1e-6,
            1e-6,
        );
    }
}

test_device!(embedding_bag_matches_pytorch, |dev| {
    // weight = torch.arange(30.).view(10, 3)
    // input = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]); offsets = torch.tensor([0, 4])
    let weight = f32s(&(0..30).map(f64::from).collect::<Vec<_>>(), &[10, 3], &dev);
    let input = i64s(&[1, 2, 4, 5, 4, 3, 2, 9], &[8], &dev);
    let offsets = Some(i64s(&[0, 4], &[2], &dev));
    let run = |input: &Tensor, opts: BagOptions| {
        let out = embedding_bag(input, &weight, &opts).unwrap();
        assert_eq!(out.device(), &dev);
        (out.shape().to_vec(), vals(&out))
    };
    let with = |mode: BagMode| BagOptions {
        mode,
        offsets: offsets.clone(),
        ..BagOptions::default()
    };
    // F.embedding_bag(input, weight, offsets) -> [[9., 10., 11.], [13.5, 14.5, 15.5]]
    let want = [9., 10., 11., 13.5, 14.5, 15.5];
    assert_eq!(
        run(&input, with(BagMode::Mean)),
        (vec![2, 3], want.to_vec())
    );
    // mode="sum" -> [[36., 40., 44.], [54., 58., 62.]]
    let want = [36., 40., 44., 54., 58., 62.];
    assert_eq!(run(&input, with(BagMode::Sum)), (vec![2, 3], want.to_vec()));
    // mode="max" -> [[15., 16., 17.], [27., 28., 29.]]
    let want = [15., 16., 17., 27., 28., 29.];
    assert_eq!(run(&input, with(BagMode::Max)), (vec![2, 3], want.to_vec()));
    // The documentation's padding example: all of bag 0 is padding.
    // F.embedding_bag(torch.tensor([2, 2, 2, 2, 4, 3, 2, 9]), weight, offsets,
    //     padding_idx=2, mode="sum") -> [[0., 0., 0.], [48., 51., 54.]]; "mean" -> [[0, 0, 0],
    //     [16., 17., 18.]]
    let padded = i64s(&[2, 2, 2, 2, 4, 3, 2, 9], &[8], &dev);
    for (mode, want) in [
        (BagMode::Sum, [0., 0., 0., 48., 51., 54.]),
        (BagMode::Mean, [0., 0., 0., 16., 17., 18.]),
    ] {
        let opts = BagOptions {
            padding_idx: Some(2),
            ..with(mode)
        };
        assert_eq!(run(&padded, opts), (vec![2, 3], want.to_vec()), "{mode:?}");
    }
    // 2-D input, one bag per row, with per-sample weights:
    // F.embedding_bag(torch.tensor([[0, 2], [1, 1]]), weight, mode="sum",
    //     per_sample_weights=torch.tensor([[1., -1.], [0.5, 2.]])) -> [[-6., -6., -6.],
    //     [7.5, 10., 12.5]]
    let opts = BagOptions {
        mode: BagMode::Sum,
        per_sample_weights: Some(f32s(&[1., -1., 0.5, 2.], &[2, 2], &dev)),
        ..BagOptions::default()
    };
    let two_d = i64s(&[0, 2, 1, 1], &[2, 2], &dev);
    let want = vec![-6., -6., -6., 7.5, 10., 12.5];
    assert_eq!(run(&two_d, opts), (vec![2, 3], want));
    // include_last_offset, with an empty bag:
    // F.embedding_bag(input, weight, torch.tensor([0, 3, 3, 8]), mode="max",
    //     include_last_offset=True) -> [[12., 13., 14.], [0., 0., 0.], [27., 28., 29.]]
    let opts = BagOptions {
        mode: BagMode::Max,
        offsets: Some(i64s(&[0, 3, 3, 8], &[4], &dev)),
        include_last_offset: true,
        ..BagOptions::default()
    };
    let want = vec![12., 13., 14., 0., 0., 0., 27., 28., 29.];
    assert_eq!(run(&input, opts), (vec![3, 3], want));
});

test_device!(embedding_bag_gradients_match_pytorch, |dev| {
    // w = torch.arange(12.).view(4, 3).requires_grad_()
    // out = F.embedding_bag(torch.tensor([3, 3, 1, 0]), w, torch.tensor([0, 3]), mode="mean")
    // (out * torch.tensor([[3., 6., 9.], [1., 2., 3.]])).sum().backward(); w.grad
    //   -> [[1., 2., 3.], [1., 2., 3.], [0., 0., 0.], [2., 4., 6.]]
    let weight = f32s(&(0..12).map(f64::from).collect::<Vec<_>>(), &[4, 3], &dev)
        .requires_grad_(true)
        .unwrap();
    let opts = BagOptions {
        offsets: Some(i64s(&[0, 3], &[2], &dev)),
        ..BagOptions::default()
    };
    let indices = i64s(&[3, 3, 1, 0], &[4], &dev);
    let out = embedding_bag(&indices, &weight, &opts).unwrap();
    let g = f32s(&[3., 6., 9., 1., 2., 3.], &[2, 3], &dev);
    out.backward_with(Some(&g), false).unwrap();
    let want = [1., 2., 3., 1., 2., 3., 0., 0., 0., 2., 4., 6.];
    assert_eq!(vals(&weight.grad().unwrap()), want);
    // mode="max" on the same bags: the max of bag 0 is row 3 (twice), of bag 1 row 0:
    //   w.grad -> [[1., 2., 3.], [0., 0., 0.], [0., 0., 0.], [3., 6., 9.]]
    let weight = weight.detach().requires_grad_(true).unwrap();
    let opts = BagOptions {
        mode: BagMode::Max,
        ..opts
    };
    let out = embedding_bag(&indices, &weight, &opts).unwrap();
    out.backward_with(Some(&g), false).unwrap();
    let want = [1., 2., 3., 0., 0., 0., 0., 0., 0., 3., 6., 9.];
    assert_eq!(vals(&weight.grad().unwrap()), want);
});

#[test]
fn embedding_bag_rejects_bad_input() {
    let dev = cpu();
    let weight = f32s(&[0.; 6], &[3, 2], &dev);
    let one_d = i64s(&[0, 1, 2], &[3], &dev);
    let err = |indices: &Tensor, weight: &Tensor, opts: BagOptions| {
        embedding_bag(indices, weight, &opts)
            .unwrap_err()
            .to_string()
    };
    let at = |o: &[i64]| BagOptions {
        offsets: Some(i64s(o, &[o.len()], &dev)),
        ..BagOptions::default()
    };
    has(
        err(&one_d, &weight, BagOptions::default()),
        &["embedding_bag", "offsets"],
    );
    has(
        err(&one_d, &weight, at(&[1])),
        &["offsets[0] to be 0", "got 1"],
    );
    has(
        err(&one_d, &weight, at(&[0, 2, 1])),
        &["non-decreasing", "1 after 2"],
    );
    has(
        err(&one_d, &weight, at(&[0, 4])),
        &["no larger than", "3", "got 4"],
    );
    let two_d = i64s(&[0, 1], &[1, 2], &dev);
    has(err(&two_d, &weight, at(&[0])), &["no offsets with 2-D"]);
    let three_d = i64s(&[0, 1], &[1, 1, 2], &dev);
    has(
        err(&three_d, &weight, BagOptions::default()),
        &["1-D or 2-D", "[1, 1, 2]"],
    );
    let int_weight = i64s(&[0; 6], &[3, 2], &dev);
    has(
        err(&one_d, &int_weight, at(&[0])),
        &["floating-point weight", "i64"],
    );
    let ints = f32s(&[0., 1.], &[2], &dev);
    has(
        err(&ints, &weight, at(&[0])),
        &["indices of dtype i64", "f32"],
    );
    has(
        err(&i64s(&[0, 3], &[2], &dev), &weight, at(&[0])),
        &["embedding", "3"],
    );
    let opts = BagOptions {
        padding_idx: Some(3),
        ..at(&[0])
    };
    has(
        err(&one_d, &weight, opts),
        &["padding_idx in [-3, 3)", "got 3"],
    );
    let opts = BagOptions {
        per_sample_weights: Some(f32s(&[1., 1., 1.], &[3], &dev)),
        ..at(&[0])
    };
    has(
        err(&one_d, &weight, opts),
        &["only supported for mode sum", "Mean"],
    );
    let opts = BagOptions {
        mode: BagMode::Sum,
        per_sample_weights: Some(f32s(&[1., 1.], &[2], &dev)),
        ..at(&[0])
    };
    has(
        err(&one_d, &weight, opts),
        &["indices' shape [3]", "got [2]"],
    );
    let opts = BagOptions {
        include_last_offset: true,
        ..at(&[0])
    };
    has(err(&one_d, &weight, opts), &["at least 2 offsets"]);
    has(
        "median".parse::<BagMode>().unwrap_err().to_string(),
        &["sum, mean, max", "median"],
    );
}
