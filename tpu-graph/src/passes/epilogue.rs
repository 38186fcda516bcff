//! Elementwise consumers of products fused into the products' stores, for the native CPU
//! executor ([`crate::epilogue`]): `sub(w, mul(matmul(a, b), s))` over f32 matrices, where the
//! product and the scaled product are read only there and not returned, becomes one
//! [`SubScaledProduct`] node (plain SGD's update of a weight from its gradient's product).

use std::sync::Arc;

use tpu_ops::ops::elementwise::binary::{Binary, BinaryKind};
use tpu_ops::ops::linalg::Matmul;
use tpu_ops::tpu_tensor::{DType, Result};

use crate::epilogue::SubScaledProduct;
use crate::ir::{Graph, Node, ValueId};

/// The node producing each value, and how many node inputs and graph outputs read it.
struct Uses {
    producer: Vec<Option<usize>>,
    reads: Vec<usize>,
}

impl Uses {
    fn of(graph: &Graph) -> Uses {
        let mut producer = vec![None; graph.num_values()];
        let mut reads = vec![0; graph.num_values()];
        for (i, n) in graph.nodes().iter().enumerate() {
            for v in &n.outputs {
                producer[v.0 as usize] = Some(i);
            }
            for v in &n.inputs {
                reads[v.0 as usize] += 1;
            }
        }
        for v in graph.outputs() {
            reads[v.0 as usize] += 1;
        }
        Uses { producer, reads }
    }

    /// The node producing `v` when `v` is read exactly once (by the node being matched).
    fn sole<'g>(&self, graph: &'g Graph, v: ValueId) -> Option<(usize, &'g Node)> {
        let i = self.producer[v.0 as usize]?;
        (self.reads[v.0 as usize] == 1).then(|| (i, &graph.nodes()[i]))
    }
}

fn binary(n: &Node, kind: BinaryKind) -> Option<&Binary> {
    n.op.as_any()
        .downcast_ref::<Binary>()
        .filter(|b| b.kind == kind && b.numbers == [false, false])
}

/// The fused node that replaces `sub` (node `i`), and the nodes it makes dead.
fn matched(graph: &Graph, uses: &Uses, sub_node: &Node) -> Option<(Node, [usize; 2])> {
    let sub = binary(sub_node, BinaryKind::Sub)?;
    let (&[w, t], &[out]) = (&sub_node.inputs[..], &sub_node.outputs[..]) else {
        return None;
    };
    let (mi, mul_node) = uses.sole(graph, t)?;
    let mul = binary(mul_node, BinaryKind::Mul)?;
    let &[x, y] = &mul_node.inputs[..] else {
        return None;
    };
    let one = |v: ValueId| graph.meta(v).numel() == 1 && graph.meta(v).dtype == DType::F32;
    let (p, s, scale_first) = if one(y) { (x, y, false) } else { (y, x, true) };
    if !one(s) {
        return None;
    }
    let (pi, prod_node) = uses.sole(graph, p)?;
    let product = prod_node.op.as_any().downcast_ref::<Matmul>()?;
    let &[a, b] = &prod_node.inputs[..] else {
        return None;
    };
    let (ma, mb, mp, mw) = (graph.meta(a), graph.meta(b), graph.meta(p), graph.meta(w));
    let f32s = [ma, mb, mp, mw, graph.meta(out)]
        .iter()
        .all(|m| m.dtype == DType::F32);
    let shapes = ma.shape.len() == 2
        && mb.shape.len() == 2
        && mp.shape[..] == [ma.shape[0], mb.shape[1]]
        && mw.shape == mp.shape
        && graph.meta(out).shape == mp.shape;
    if !(f32s && shapes) {
        return None;
    }
    let op = SubScaledProduct {
        product: product.clone(),
        mul: mul.clone(),
        sub: sub.clone(),
        scale_first,
    };
    let node = Node {
        op: Arc::new(op),
        inputs: vec![w, a, b, s],
        outputs: vec![out],
    };
    Some((node, [mi, pi]))
}

/// Fuses every matching product and update (see the module's text); returns how many nodes
/// the fused nodes replaced.
pub fn fuse_product_updates(graph: &mut Graph) -> Result<usize> {
    let uses = Uses::of(graph);
    let mut nodes: Vec<Option<Node>> = graph.nodes().iter().cloned().map(Some).collect();
    let mut replaced = 0;
    for i in 0..nodes.len() {
        let Some(n) = &nodes[i] else { continue };
        if let Some((fused, dead)) = matched(graph, &uses, n) {
            nodes[i] = Some(fused);
            for d in dead {
                nodes[d] = None;
            }
            replaced += 3;
        }
    }
    if replaced == 0 {
        return Ok(0);
    }
    graph.set_nodes(nodes.into_iter().flatten().collect());
    graph.validate()?;
    Ok(replaced)
}
