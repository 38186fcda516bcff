//! Dead-code elimination: drops the nodes none of whose outputs reaches a graph output. Ops are
//! pure (random masks are drawn on the host and enter as tensors), so dropping one never changes
//! what the graph returns.

use tpu_ops::tpu_tensor::Result;

use crate::ir::Graph;

/// Removes dead nodes; true when it removed any.
pub fn dce(graph: &mut Graph) -> Result<bool> {
    let mut live = vec![false; graph.num_values()];
    for v in graph.outputs() {
        live[v.0 as usize] = true;
    }
    let mut keep = vec![false; graph.nodes().len()];
    for (i, n) in graph.nodes().iter().enumerate().rev() {
        if n.outputs.iter().any(|v| live[v.0 as usize]) {
            keep[i] = true;
            for v in &n.inputs {
                live[v.0 as usize] = true;
            }
        }
    }
    if keep.iter().all(|&k| k) {
        return Ok(false);
    }
    let nodes = graph
        .nodes()
        .iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|(n, _)| n.clone())
        .collect();
    graph.set_nodes(nodes);
    graph.validate()?;
    Ok(true)
}
