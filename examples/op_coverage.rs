//! Prints the op table: for each op, the dtypes its native CPU kernel and its StableHLO
//! lowering support, and whether it has a backward rule. Generated from the op definitions.
//! Then PyTorch's Core ATen opset, each op with what covers it here, and the count.
//!
//! `cargo run --release --example op_coverage`

use tpu_rs::ops::core_aten::{CORE_ATEN, Cover, core_aten_covered};
use tpu_rs::ops::{DTypeSet, op_table};
use tpu_rs::prelude::*;

fn cells(set: DTypeSet) -> String {
    DType::ALL
        .iter()
        .map(|&d| format!("{:>5}", if set.contains(d) { "x" } else { "." }))
        .collect()
}

fn main() {
    let rows = op_table();
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    let head: String = DType::ALL
        .iter()
        .map(|d| format!("{:>5}", d.name()))
        .collect();
    println!(
        "{:width$} | cpu kernel{} | lowering{} | backward",
        "op", head, head
    );
    for r in &rows {
        let backward = if r.backward() { "yes" } else { "no" };
        println!(
            "{:width$} |           {} |         {} | {backward}",
            r.name,
            cells(r.cpu),
            cells(r.hlo)
        );
    }
    let with_backward = rows.iter().filter(|r| r.backward()).count();
    println!(
        "\n{} ops, {with_backward} with a backward rule; x = supported, . = not defined for that dtype",
        rows.len()
    );
    println!("\nCore ATen op (torch 2.15)           | covered by");
    for (name, cover) in CORE_ATEN {
        let how = match cover {
            Cover::Rows(rows) => format!("op {}", rows.join(", ")),
            Cover::Backward(row) => format!("backward rule of {row}"),
            Cover::View(v) => format!("view {v}"),
            Cover::Composition(c) => format!("composition: {c}"),
            Cover::Partial(p) => format!("PARTIAL: {p}"),
            Cover::Excluded(why) => format!("excluded: {why}"),
            Cover::Missing => "MISSING".to_string(),
        };
        println!("{name:35} | {how}");
    }
    println!(
        "\nCore ATen: {} of {} covered",
        core_aten_covered(),
        CORE_ATEN.len()
    );
}
