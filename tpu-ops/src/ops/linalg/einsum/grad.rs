//! Einsum's backward rule: each operand's gradient is an einsum of the output's gradient with
//! the other operands, broadcast along the subscripts the forward summed and masked to the
//! diagonal where a subscript repeats.

use std::collections::BTreeMap;

use tpu_tensor::{Error, Result, Tensor};

use super::Einsum;
use super::spec::{Label, Spec, resolve};
use crate::autograd::Saved;
use crate::hlo::Precision;
use crate::op::Grads;

/// [`Einsum`]'s backward: one einsum per operand.
pub(super) fn einsum(op: &Einsum, saved: &Saved, g: &Tensor) -> Grads {
    let n = saved.inputs.len();
    let shapes: Vec<&[usize]> = saved.inputs.iter().map(|t| t.shape()).collect();
    let spec = resolve(&op.equation, &shapes)?;
    let names = letters(&spec, &op.equation)?;
    (0..n)
        .map(|i| einsum_grad(&spec, &names, i, g, &saved.inputs, op.precision).map(Some))
        .collect()
}

/// A letter for every label of `spec`, for writing the equations of the gradients: letters
/// name themselves, and the dims an ellipsis covers get letters the equation does not use, so
/// the gradients' equations need no ellipsis.
fn letters(spec: &Spec, equation: &str) -> Result<BTreeMap<Label, char>> {
    let name = |l: Label| match l {
        0..26 => Some(char::from(b'A' + l as u8)),
        26..52 => Some(char::from(b'a' + (l - 26) as u8)),
        _ => None,
    };
    let mut map = BTreeMap::new();
    let mut free = (0..52).filter(|&l| !spec.sizes.contains_key(&l)).map(name);
    for &l in spec.sizes.keys() {
        let c = match name(l) {
            Some(c) => c,
            None => free.next().flatten().ok_or_else(|| {
                Error::invalid_argument(
                    "einsum",
                    format!(
                        "backward of {equation:?}: its subscripts and ellipsis dims need more than 52 letters"
                    ),
                )
            })?,
        };
        map.insert(l, c);
    }
    Ok(map)
}

/// The gradient of einsum operand `i`: the einsum of the output's gradient with the other
/// operands, producing operand `i`'s subscripts. Subscripts only operand `i` has were summed
/// in the forward, so the gradient is broadcast along them; a subscript repeated in operand
/// `i` (a diagonal) gets the gradient on the diagonal and zeros elsewhere. The result has the
/// subscripts' full sizes; autograd sums it down where the operand was broadcast (size 1).
fn einsum_grad(
    spec: &Spec,
    names: &BTreeMap<Label, char>,
    i: usize,
    g: &Tensor,
    inputs: &[Tensor],
    precision: Precision,
) -> Result<Tensor> {
    let term = |ls: &[Label]| -> String { ls.iter().filter_map(|l| names.get(l)).collect() };
    let labels = &spec.inputs[i];
    let mut uniq: Vec<Label> = Vec::new();
    for &l in labels {
        if !uniq.contains(&l) {
            uniq.push(l);
        }
    }
    let elsewhere = |l: Label| {
        spec.output.contains(&l)
            || spec
                .inputs
                .iter()
                .enumerate()
                .any(|(j, t)| j != i && t.contains(&l))
    };
    let avail: Vec<Label> = uniq.iter().copied().filter(|&l| elsewhere(l)).collect();
    let mut terms = vec![term(&spec.output)];
    let mut ops = vec![g];
    for (j, t) in inputs.iter().enumerate() {
        if j != i {
            terms.push(term(&spec.inputs[j]));
            ops.push(t);
        }
    }
    let mut t = if ops.len() == 1 && spec.output == avail {
        g.clone()
    } else {
        let op = Einsum {
            equation: format!("{}->{}", terms.join(","), term(&avail)),
            precision,
        };
        crate::exec::dispatch::run1(&op, &ops)?
    };
    // Subscripts missing from the product become size-1 dims at the end, then every dim moves
    // to its place in `uniq` and takes the subscript's full size.
    let mut have = avail.clone();
    for &l in &uniq {
        if !avail.contains(&l) {
            t = t.unsqueeze(t.rank() as i64)?;
            have.push(l);
        }
    }
    let pos = |ls: &[Label], l: Label| ls.iter().position(|&x| x == l).unwrap_or(0);
    let perm: Vec<usize> = uniq.iter().map(|&l| pos(&have, l)).collect();
    let mut t = t.permute(perm)?.expand(spec.sizes_of(&uniq))?;
    if uniq.len() != labels.len() {
        // Each repeat of a subscript becomes a further broadcast dim, masked to the diagonal
        // by an identity matrix over the repeat and the subscript's first dim.
        let mut dims: Vec<usize> = Vec::with_capacity(labels.len());
        let mut extra = uniq.len();
        let mut sizes = spec.sizes_of(&uniq);
        let mut masks = Vec::new();
        for (d, &l) in labels.iter().enumerate() {
            let first = labels.iter().position(|&x| x == l).unwrap_or(d);
            if first == d {
                dims.push(pos(&uniq, l));
            } else {
                t = t.unsqueeze(t.rank() as i64)?;
                sizes.push(spec.size(l));
                dims.push(extra);
                extra += 1;
                masks.push((first, d, spec.size(l)));
            }
        }
        t = t.expand(&sizes)?.permute(dims)?;
        for (first, d, size) in masks {
            let mut shape = vec![1usize; labels.len()];
            shape[first] = size;
            shape[d] = size;
            let eye = Tensor::eye(size, None, t.dtype(), t.device())?.reshape(shape)?;
            t = crate::ops::elementwise::binary::binary(
                &t,
                &eye,
                crate::ops::elementwise::binary::BinaryKind::Mul,
            )?;
        }
    }
    if !t.is_contiguous() {
        t = t.contiguous()?;
    }
    Ok(t)
}
