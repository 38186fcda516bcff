//! Einsum equations: parsing the subscripts (`ij,jk->ik`, `...`, implicit outputs) and
//! resolving them against the operands' shapes, with PyTorch's rules and error cases.

use std::collections::BTreeMap;

use tpu_tensor::tpu_runtime::error::fmt_shape;
use tpu_tensor::{Error, Result};

/// A subscript: `A`-`Z` are 0-25 and `a`-`z` 26-51 (PyTorch's order for implicit outputs);
/// the dims an ellipsis covers are `ELLIPSIS + i`, right-aligned across operands.
pub(super) type Label = u16;
/// The first label of the dims an ellipsis covers.
const ELLIPSIS: Label = 64;

/// How a label is written in error messages.
fn label_name(l: Label) -> String {
    match l {
        0..26 => char::from(b'A' + l as u8).to_string(),
        26..52 => char::from(b'a' + (l - 26) as u8).to_string(),
        _ => format!("...[{}]", l - ELLIPSIS),
    }
}

/// One term of an equation, as written.
#[derive(Default, Debug)]
struct Term {
    labels: Vec<Label>,
    /// Where the ellipsis stands among the labels.
    ellipsis: Option<usize>,
}

/// The operand terms and the output term (if the equation has `->`) of `eq`.
fn parse_terms(eq: &str) -> Result<(Vec<Term>, Option<Term>)> {
    let bad = |i: usize, why: &str| {
        Error::invalid_argument(
            "einsum",
            format!("malformed equation {eq:?} at index {i}: {why}"),
        )
    };
    let chars: Vec<char> = eq.chars().collect();
    let mut inputs = vec![Term::default()];
    let mut output: Option<Term> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let cur = match output.as_mut() {
            Some(t) => t,
            None => match inputs.last_mut() {
                Some(t) => t,
                None => return Err(bad(i, "no term")),
            },
        };
        match c {
            c if c.is_whitespace() => {}
            'A'..='Z' => cur.labels.push(c as Label - 'A' as Label),
            'a'..='z' => cur.labels.push(26 + c as Label - 'a' as Label),
            '.' => {
                if chars.get(i..i + 3) != Some(&['.', '.', '.'][..]) {
                    return Err(bad(i, "expected '...'"));
                }
                if cur.ellipsis.is_some() {
                    return Err(bad(i, "a term may hold one '...' only"));
                }
                cur.ellipsis = Some(cur.labels.len());
                i += 2;
            }
            ',' if output.is_none() => inputs.push(Term::default()),
            '-' if output.is_none() && chars.get(i + 1) == Some(&'>') => {
                output = Some(Term::default());
                i += 1;
            }
            _ => {
                return Err(bad(
                    i,
                    &format!(
                        "unexpected {c:?}; subscripts are letters a-z and A-Z, with ',', '->' and '...'"
                    ),
                ));
            }
        }
        i += 1;
    }
    Ok((inputs, output))
}

/// An einsum equation resolved against its operands' shapes.
#[derive(Clone, Debug)]
pub(super) struct Spec {
    pub(super) shapes: Vec<Vec<usize>>,
    /// One label per dim of each operand.
    pub(super) inputs: Vec<Vec<Label>>,
    pub(super) output: Vec<Label>,
    pub(super) sizes: BTreeMap<Label, usize>,
}

impl Spec {
    /// The size of label `l` (1 for a label no operand has).
    pub(super) fn size(&self, l: Label) -> usize {
        self.sizes.get(&l).copied().unwrap_or(1)
    }

    /// The sizes of `labels`.
    pub(super) fn sizes_of(&self, labels: &[Label]) -> Vec<usize> {
        labels.iter().map(|&l| self.size(l)).collect()
    }
}

/// Parses `eq` and checks it against the operands' `shapes`.
pub(super) fn resolve(eq: &str, shapes: &[&[usize]]) -> Result<Spec> {
    let (terms, out) = parse_terms(eq)?;
    let all_shapes = || {
        shapes
            .iter()
            .map(|s| fmt_shape(s))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if terms.len() != shapes.len() {
        return Err(Error::invalid_argument(
            "einsum",
            format!(
                "the equation {eq:?} has {} operand terms, but {} operands were given (shapes {})",
                terms.len(),
                shapes.len(),
                all_shapes()
            ),
        ));
    }
    let mut ell_lens = Vec::with_capacity(terms.len());
    for (i, (t, s)) in terms.iter().zip(shapes).enumerate() {
        let n = t.labels.len();
        let ok = if t.ellipsis.is_some() {
            s.len() >= n
        } else {
            s.len() == n
        };
        if !ok {
            return Err(Error::shape(
                "einsum",
                format!(
                    "operand {i} has shape {} ({} dims) but its term in {eq:?} names {n} subscripts{}",
                    fmt_shape(s),
                    s.len(),
                    if t.ellipsis.is_some() {
                        " and an ellipsis"
                    } else {
                        ""
                    }
                ),
            ));
        }
        ell_lens.push(s.len() - n);
    }
    let ell_rank = ell_lens.iter().copied().max().unwrap_or(0);
    let mut inputs = Vec::with_capacity(terms.len());
    let mut sizes: BTreeMap<Label, usize> = BTreeMap::new();
    // Where each label's size was first fixed, for error messages.
    let mut seen_at: BTreeMap<Label, usize> = BTreeMap::new();
    for (i, t) in terms.iter().enumerate() {
        let mut labels = t.labels.clone();
        if let Some(pos) = t.ellipsis {
            let ell = (0..ell_lens[i]).map(|j| ELLIPSIS + (ell_rank - ell_lens[i] + j) as Label);
            labels.splice(pos..pos, ell);
        }
        let shape = shapes[i];
        for (d, &l) in labels.iter().enumerate() {
            if let Some(e) = labels[..d].iter().position(|&x| x == l) {
                if shape[e] != shape[d] {
                    return Err(Error::shape(
                        "einsum",
                        format!(
                            "subscript {} is repeated in operand {i} (shape {}) with sizes {} and {}",
                            label_name(l),
                            fmt_shape(shape),
                            shape[e],
                            shape[d]
                        ),
                    ));
                }
                continue;
            }
            match sizes.get(&l).copied() {
                None => {
                    sizes.insert(l, shape[d]);
                    seen_at.insert(l, i);
                }
                Some(s) if s == shape[d] || shape[d] == 1 => {}
                Some(1) => {
                    sizes.insert(l, shape[d]);
                    seen_at.insert(l, i);
                }
                Some(s) => {
                    let j = seen_at.get(&l).copied().unwrap_or(0);
                    return Err(Error::shape(
                        "einsum",
                        format!(
                            "subscript {} has size {} in operand {i} (shape {}) but size {s} in operand {j} (shape {}); sizes must match or be 1",
                            label_name(l),
                            shape[d],
                            fmt_shape(shape),
                            fmt_shape(shapes[j])
                        ),
                    ));
                }
            }
        }
        inputs.push(labels);
    }
    let output = match out {
        Some(t) => {
            if t.ellipsis.is_some() && terms.iter().all(|t| t.ellipsis.is_none()) {
                return Err(Error::invalid_argument(
                    "einsum",
                    format!("the output of {eq:?} has '...' but no operand term does"),
                ));
            }
            let mut labels = t.labels.clone();
            if let Some(pos) = t.ellipsis {
                labels.splice(pos..pos, (0..ell_rank).map(|j| ELLIPSIS + j as Label));
            }
            for (d, &l) in t.labels.iter().enumerate() {
                if t.labels[..d].contains(&l) {
                    return Err(Error::invalid_argument(
                        "einsum",
                        format!(
                            "output subscript {} appears more than once in {eq:?}",
                            label_name(l)
                        ),
                    ));
                }
                if !sizes.contains_key(&l) {
                    return Err(Error::invalid_argument(
                        "einsum",
                        format!(
                            "output subscript {} of {eq:?} names no dim of any operand",
                            label_name(l)
                        ),
                    ));
                }
            }
            labels
        }
        None => {
            // Ellipsis dims first, then the subscripts that occur once, in label order.
            let mut count: BTreeMap<Label, usize> = BTreeMap::new();
            for l in inputs.iter().flatten() {
                *count.entry(*l).or_default() += 1;
            }
            let mut labels: Vec<Label> = (0..ell_rank).map(|j| ELLIPSIS + j as Label).collect();
            labels.extend(
                count
                    .iter()
                    .filter(|&(&l, &c)| c == 1 && l < ELLIPSIS)
                    .map(|(&l, _)| l),
            );
            labels
        }
    };
    Ok(Spec {
        shapes: shapes.iter().map(|s| s.to_vec()).collect(),
        inputs,
        output,
        sizes,
    })
}
