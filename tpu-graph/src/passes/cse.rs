//! Common-subexpression elimination: a node whose op, attributes and operands equal an earlier
//! node's is dropped and its outputs read from the earlier one. Ops are pure, so the two would
//! compute the same bits.

use std::collections::HashMap;

use tpu_ops::tpu_tensor::Result;

use crate::ir::{Graph, ValueId};

/// Merges repeated nodes; true when it merged any.
pub fn cse(graph: &mut Graph) -> Result<bool> {
    let mut seen: HashMap<(&'static str, String, Vec<ValueId>), Vec<ValueId>> = HashMap::new();
    let mut rename: Vec<ValueId> = (0..graph.num_values() as u32).map(ValueId).collect();
    let mut nodes = Vec::with_capacity(graph.nodes().len());
    let mut changed = false;
    for n in graph.nodes() {
        let mut n = n.clone();
        for v in &mut n.inputs {
            *v = rename[v.0 as usize];
        }
        let key = (n.op.name(), n.op.attrs(), n.inputs.clone());
        match seen.get(&key) {
            Some(earlier) => {
                for (v, e) in n.outputs.iter().zip(earlier) {
                    rename[v.0 as usize] = *e;
                }
                changed = true;
            }
            None => {
                seen.insert(key, n.outputs.clone());
                nodes.push(n);
            }
        }
    }
    if !changed {
        return Ok(false);
    }
    graph.set_nodes(nodes);
    let map = move |v: ValueId| rename[v.0 as usize];
    graph.rename_uses(&map);
    graph.validate()?;
    Ok(true)
}
