//! How einsum evaluates, once for both backends: diagonals, then operands contracted left to
//! right as products, written against [`Backend`] (CPU tensors in `cpu.rs`, StableHLO values in
//! `lower.rs`), so both run the same sequence of products and round alike.

use tpu_tensor::{Error, Result};

use super::spec::{Label, Spec};

/// The few tensor operations einsum is made of, on the CPU or in StableHLO.
pub(super) trait Backend {
    /// A tensor of this backend.
    type V: Clone;
    /// The generalised diagonal: result dim `j` walks the input dims `groups[j]` together.
    fn diagonal(&mut self, v: &Self::V, dims: &[usize], groups: &[Vec<usize>]) -> Result<Self::V>;
    /// Broadcasts size-1 dims to `to`.
    fn expand(&mut self, v: &Self::V, to: &[usize]) -> Result<Self::V>;
    /// A tensor of ones.
    fn ones(&mut self, dims: &[usize]) -> Result<Self::V>;
    /// `dot_general`: result dims are batch, then `a`'s free dims, then `b`'s.
    fn dot(
        &mut self,
        a: &Self::V,
        b: &Self::V,
        batch: (&[usize], &[usize]),
        contract: (&[usize], &[usize]),
        out: &[usize],
    ) -> Result<Self::V>;
    /// Result dim `i` is input dim `perm[i]`.
    fn permute(&mut self, v: &Self::V, perm: &[usize], out: &[usize]) -> Result<Self::V>;
}

/// A value with one label per dim.
struct Labeled<V> {
    v: V,
    labels: Vec<Label>,
}

/// Sums out the labels `keep` rejects, as a product with ones (so sums round like products).
fn sum_out<B: Backend>(
    be: &mut B,
    spec: &Spec,
    x: Labeled<B::V>,
    keep: impl Fn(Label) -> bool,
) -> Result<Labeled<B::V>> {
    let drop: Vec<usize> = (0..x.labels.len())
        .filter(|&d| !keep(x.labels[d]))
        .collect();
    if drop.is_empty() {
        return Ok(x);
    }
    let dropped: Vec<Label> = drop.iter().map(|&d| x.labels[d]).collect();
    let labels: Vec<Label> = x.labels.iter().copied().filter(|&l| keep(l)).collect();
    let ones = be.ones(&spec.sizes_of(&dropped))?;
    let rhs: Vec<usize> = (0..drop.len()).collect();
    let v = be.dot(
        &x.v,
        &ones,
        (&[], &[]),
        (&drop, &rhs),
        &spec.sizes_of(&labels),
    )?;
    Ok(Labeled { v, labels })
}

/// Contracts two operands, keeping the labels `keep` accepts (and any label only one of them
/// has that `keep` accepts).
fn pair<B: Backend>(
    be: &mut B,
    spec: &Spec,
    a: Labeled<B::V>,
    b: Labeled<B::V>,
    keep: &dyn Fn(Label) -> bool,
) -> Result<Labeled<B::V>> {
    let (la, lb) = (a.labels.clone(), b.labels.clone());
    let a = sum_out(be, spec, a, |l| keep(l) || lb.contains(&l))?;
    let b = sum_out(be, spec, b, |l| keep(l) || la.contains(&l))?;
    let pos = |labels: &[Label], l: Label| labels.iter().position(|&x| x == l).unwrap_or(0);
    let shared: Vec<Label> = a
        .labels
        .iter()
        .copied()
        .filter(|l| b.labels.contains(l))
        .collect();
    let (batch, contracted): (Vec<Label>, Vec<Label>) = shared.iter().partition(|&&l| keep(l));
    let dims =
        |ls: &[Label], of: &[Label]| -> Vec<usize> { ls.iter().map(|&l| pos(of, l)).collect() };
    let (ba, bb) = (dims(&batch, &a.labels), dims(&batch, &b.labels));
    let (ca, cb) = (dims(&contracted, &a.labels), dims(&contracted, &b.labels));
    let mut labels = batch.clone();
    labels.extend(a.labels.iter().filter(|l| !b.labels.contains(l)));
    labels.extend(b.labels.iter().filter(|l| !a.labels.contains(l)));
    let v = be.dot(&a.v, &b.v, (&ba, &bb), (&ca, &cb), &spec.sizes_of(&labels))?;
    Ok(Labeled { v, labels })
}

/// Einsum as PyTorch evaluates it: diagonals first, then operands contracted left to right,
/// each summing out what no later operand or the output needs.
pub(super) fn run_einsum<B: Backend>(be: &mut B, spec: &Spec, inputs: &[B::V]) -> Result<B::V> {
    let mut cur: Option<Labeled<B::V>> = None;
    for (i, v) in inputs.iter().enumerate() {
        let labels = &spec.inputs[i];
        let mut uniq: Vec<Label> = Vec::new();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (d, &l) in labels.iter().enumerate() {
            match uniq.iter().position(|&u| u == l) {
                Some(p) => groups[p].push(d),
                None => {
                    uniq.push(l);
                    groups.push(vec![d]);
                }
            }
        }
        let mut v = v.clone();
        if uniq.len() != labels.len() {
            v = be.diagonal(&v, &spec.shapes[i], &groups)?;
        }
        let own: Vec<usize> = groups.iter().map(|g| spec.shapes[i][g[0]]).collect();
        let full = spec.sizes_of(&uniq);
        if own != full {
            v = be.expand(&v, &full)?;
        }
        let next = Labeled { v, labels: uniq };
        cur = Some(match cur {
            None => next,
            Some(prev) => {
                let later: Vec<Label> = spec.inputs[i + 1..]
                    .iter()
                    .flatten()
                    .chain(&spec.output)
                    .copied()
                    .collect();
                pair(be, spec, prev, next, &|l| later.contains(&l))?
            }
        });
    }
    let cur =
        cur.ok_or_else(|| Error::invalid_argument("einsum", "expected at least one operand"))?;
    let cur = sum_out(be, spec, cur, |l| spec.output.contains(&l))?;
    let perm: Vec<usize> = spec
        .output
        .iter()
        .map(|l| cur.labels.iter().position(|x| x == l).unwrap_or(0))
        .collect();
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        Ok(cur.v)
    } else {
        be.permute(&cur.v, &perm, &spec.sizes_of(&spec.output))
    }
}
