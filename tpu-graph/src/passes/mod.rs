//! Graph passes. Each is a function from a graph to a smaller or equal graph computing the same
//! outputs; [`optimize`] runs them in turn until none changes the graph.

mod cse;
mod dce;

pub use cse::cse;
pub use dce::dce;

use tpu_ops::tpu_tensor::Result;

use crate::ir::Graph;

/// What the passes did to one graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Nodes before the passes.
    pub nodes_before: usize,
    /// Nodes after them.
    pub nodes_after: usize,
    /// Rounds until nothing changed.
    pub rounds: usize,
}

/// Runs every pass until the graph stops changing.
pub fn optimize(graph: &mut Graph) -> Result<PassReport> {
    let nodes_before = graph.nodes().len();
    let mut rounds = 0;
    loop {
        rounds += 1;
        let changed = cse(graph)? | dce(graph)?;
        if !changed {
            break;
        }
    }
    Ok(PassReport {
        nodes_before,
        nodes_after: graph.nodes().len(),
        rounds,
    })
}
