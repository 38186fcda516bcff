//! Property: any chain of views reads the same elements as the same index mapping done naively
//! on a dense `Vec`.

use proptest::prelude::*;
use tpu_tensor::{DType, Device, Tensor};

/// A dense row-major array and the reference implementation of each view on it.
#[derive(Clone, Debug)]
struct Naive {
    data: Vec<i64>,
    shape: Vec<usize>,
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

impl Naive {
    /// Builds the output by asking, for every output index, which input index it reads.
    fn map(&self, shape: Vec<usize>, f: impl Fn(&[usize]) -> Vec<usize>) -> Naive {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|i| self.data[ravel(&f(&unravel(i, &shape)), &self.shape)])
            .collect();
        Naive { data, shape }
    }
}

/// One view op, with parameters that are reduced modulo the current shape when applied.
#[derive(Clone, Debug)]
enum Op {
    Transpose(usize, usize),
    Permute(u64),
    Narrow(usize, usize, usize),
    Slice(usize, usize, usize, usize),
    Select(usize, usize),
    Unsqueeze(usize),
    Squeeze(usize),
    Expand(usize, usize),
    Reshape(u64),
    Flatten(usize, usize),
    Chunk(usize, usize, usize),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let u = 0usize..64;
    prop_oneof![
        (u.clone(), u.clone()).prop_map(|(a, b)| Op::Transpose(a, b)),
        any::<u64>().prop_map(Op::Permute),
        (u.clone(), u.clone(), u.clone()).prop_map(|(a, b, c)| Op::Narrow(a, b, c)),
        (u.clone(), u.clone(), u.clone(), 1usize..5).prop_map(|(a, b, c, s)| Op::Slice(a, b, c, s)),
        (u.clone(), u.clone()).prop_map(|(a, b)| Op::Select(a, b)),
        u.clone().prop_map(Op::Unsqueeze),
        u.clone().prop_map(Op::Squeeze),
        (u.clone(), 1usize..4).prop_map(|(a, b)| Op::Expand(a, b)),
        any::<u64>().prop_map(Op::Reshape),
        (u.clone(), u.clone()).prop_map(|(a, b)| Op::Flatten(a, b)),
        (u.clone(), 1usize..4, u).prop_map(|(d, c, i)| Op::Chunk(d, c, i)),
    ]
}

/// Applies `op` to both sides; `None` when it does not apply to this shape (kept as a no-op).
fn apply(op: &Op, t: &Tensor, n: &Naive) -> Option<(Tensor, Naive)> {
    let rank = n.shape.len();
    let shape = n.shape.clone();
    match *op {
        Op::Transpose(a, b) if rank > 0 => {
            let (a, b) = (a % rank, b % rank);
            let mut s = shape.clone();
            s.swap(a, b);
            let out = n.map(s, |i| {
                let mut j = i.to_vec();
                j.swap(a, b);
                j
            });
            Some((t.transpose(a, b as i64 - rank as i64).unwrap(), out))
        }
        Op::Permute(seed) => {
            let mut perm: Vec<usize> = (0..rank).collect();
            let mut s = seed;
            for i in (1..rank).rev() {
                perm.swap(i, (s % (i as u64 + 1)) as usize);
                s /= 7;
            }
            let new_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let out = n.map(new_shape, |i| {
                let mut j = vec![0; rank];
                for (k, &p) in perm.iter().enumerate() {
                    j[p] = i[k];
                }
                j
            });
            Some((t.permute(perm.clone()).unwrap(), out))
        }
        Op::Narrow(d, start, len) if rank > 0 => {
            let d = d % rank;
            let start = start % (shape[d] + 1);
            let len = len % (shape[d] - start + 1);
            let mut s = shape.clone();
            s[d] = len;
            let out = n.map(s, |i| {
                let mut j = i.to_vec();
                j[d] += start;
                j
            });
            Some((t.narrow(d, start as i64, len).unwrap(), out))
        }
        Op::Slice(d, a, b, step) if rank > 0 => {
            let d = d % rank;
            let size = shape[d];
            let (a, b) = (a % (size + 2), b % (size + 2));
            let len = if b > a {
                (b.min(size).saturating_sub(a)).div_ceil(step)
            } else {
                0
            };
            let mut s = shape.clone();
            s[d] = len;
            let out = n.map(s, |i| {
                let mut j = i.to_vec();
                j[d] = a + j[d] * step;
                j
            });
            Some((
                t.slice(d as i64 - rank as i64, a as i64..b as i64, step)
                    .unwrap(),
                out,
            ))
        }
        Op::Select(d, idx) if rank > 0 && shape[d % rank] > 0 => {
            let d = d % rank;
            let idx = idx % shape[d];
            let mut s = shape.clone();
            s.remove(d);
            let out = n.map(s, |i| {
                let mut j = i.to_vec();
                j.insert(d, idx);
                j
            });
            Some((t.select(d, idx as i64).unwrap(), out))
        }
        Op::Unsqueeze(d) if rank < 6 => {
            let d = d % (rank + 1);
            let mut s = shape.clone();
            s.insert(d, 1);
            let out = n.map(s, |i| {
                let mut j = i.to_vec();
                j.remove(d);
                j
            });
            Some((t.unsqueeze(d).unwrap(), out))
        }
        Op::Squeeze(d) if rank > 0 => {
            let d = d % rank;
            if shape[d] != 1 {
                return Some((t.squeeze_dim(d).unwrap(), n.clone()));
            }
            let mut s = shape.clone();
            s.remove(d);
            let out = n.map(s, |i| {
                let mut j = i.to_vec();
                j.insert(d, 0);
                j
            });
            Some((t.squeeze_dim(d).unwrap(), out))
        }
        Op::Expand(d, k) if rank > 0 && shape[d % rank] == 1 && n.data.len() < 200 => {
            let d = d % rank;
            let mut s = shape.clone();
            s[d] = k;
            let out = n.map(s.clone(), |i| {
                let mut j = i.to_vec();
                j[d] = 0;
                j
            });
            Some((t.expand(s).unwrap(), out))
        }
        Op::Reshape(seed) => {
            // Factor the element count into a random shape of up to 4 dims.
            let total = n.data.len();
            let mut s = vec![];
            let mut rest = total;
            let mut r = seed;
            while rest > 1 && s.len() < 3 {
                let divs: Vec<usize> = (1..=rest).filter(|d| rest.is_multiple_of(*d)).collect();
                let d = divs[(r % divs.len() as u64) as usize];
                r /= 11;
                s.push(d);
                rest /= d;
            }
            s.push(rest);
            if total == 0 {
                s = vec![0];
            }
            let out = Naive {
                data: n.data.clone(),
                shape: s.clone(),
            };
            let mut arg: Vec<i64> = s.iter().map(|&v| v as i64).collect();
            if total > 0 {
                let k = (seed % arg.len() as u64) as usize;
                arg[k] = -1;
            }
            Some((t.reshape(arg).unwrap(), out))
        }
        Op::Flatten(a, b) if rank > 0 => {
            let (a, b) = (a % rank, b % rank);
            let (a, b) = (a.min(b), a.max(b));
            let mut s = shape[..a].to_vec();
            s.push(shape[a..=b].iter().product());
            s.extend_from_slice(&shape[b + 1..]);
            let out = Naive {
                data: n.data.clone(),
                shape: s,
            };
            Some((t.flatten(a, b).unwrap(), out))
        }
        Op::Chunk(d, chunks, i) if rank > 0 && shape[d % rank] > 0 => {
            let d = d % rank;
            let parts = t.chunk(chunks, d).unwrap();
            let step = shape[d].div_ceil(chunks);
            let i = i % parts.len();
            let start = i * step;
            let mut s = shape.clone();
            s[d] = step.min(shape[d] - start);
            let out = n.map(s, |ix| {
                let mut j = ix.to_vec();
                j[d] += start;
                j
            });
            Some((parts[i].clone(), out))
        }
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn view_chains_match_naive_indexing(
        shape in proptest::collection::vec(prop_oneof![12 => 1usize..6, 1 => Just(0usize)], 0..5),
        ops in proptest::collection::vec(op_strategy(), 0..8),
    ) {
        let numel: usize = shape.iter().product();
        let data: Vec<i64> = (0..numel as i64).map(|v| v * 3 - 7).collect();
        let mut t = Tensor::from_vec(data.clone(), &shape, &Device::cpu()).unwrap();
        let mut n = Naive { data, shape };
        for op in &ops {
            if let Some((t2, n2)) = apply(op, &t, &n) {
                t = t2;
                n = n2;
            }
            prop_assert_eq!(t.shape(), &n.shape[..], "after {:?}", op);
            prop_assert_eq!(t.to_vec::<i64>().unwrap(), n.data.clone(), "after {:?}", op);
        }
        // A copy and a cast of the final view agree with the reference too.
        prop_assert_eq!(t.contiguous().unwrap().to_vec::<i64>().unwrap(), n.data.clone());
        let f: Vec<f64> = n.data.iter().map(|&v| v as f64).collect();
        prop_assert_eq!(t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(), f);
    }
}
