//! Every row of the op table, for every dtype it lists: the native CPU kernel against XLA
//! through the PJRT CPU plugin; and every dtype it does not list is refused with an error.
//! One test per category, so they run in parallel.

use crate::common::pjrt;
use tpu_ops::testing::assert_close;
use tpu_ops::{OpInfo, op_table_parts};
use tpu_tensor::{DType, Device};

fn check_row(info: &OpInfo, pjrt: Option<&Device>, failures: &mut Vec<String>) {
    let cpu = Device::cpu();
    for dtype in DType::ALL {
        let listed = info.cpu.contains(dtype);
        let on_cpu = (info.sample)(dtype, &cpu);
        match (&on_cpu, listed) {
            (Err(e), true) => failures.push(format!("{} {dtype} on cpu: {e}", info.name)),
            (Ok(_), false) => failures.push(format!(
                "{} {dtype} on cpu: ran, but the table does not list it",
                info.name
            )),
            _ => {}
        }
        let (Some(dev), Ok(expect)) = (pjrt, &on_cpu) else {
            continue;
        };
        if !info.hlo.contains(dtype) {
            continue;
        }
        match (info.sample)(dtype, dev) {
            Err(e) => failures.push(format!("{} {dtype} on {dev}: {e}", info.name)),
            Ok(got) => {
                if got.len() != expect.len() {
                    failures.push(format!(
                        "{} {dtype}: {} outputs on cpu, {} on {dev}",
                        info.name,
                        expect.len(),
                        got.len()
                    ));
                }
                for (i, (a, b)) in expect.iter().zip(&got).enumerate() {
                    if let Err(e) = assert_close(
                        &format!("{} {dtype} output {i}", info.name),
                        a,
                        b,
                        info.tolerance,
                    ) {
                        failures.push(e.to_string());
                    }
                }
            }
        }
    }
}

fn check_category(name: &str) {
    let dev = pjrt(&format!("op_table/{name}"));
    let parts = op_table_parts();
    let (_, rows) = parts.iter().find(|(n, _)| *n == name).expect("category");
    assert!(!rows.is_empty(), "category {name} has no ops");
    let mut failures = Vec::new();
    for info in rows {
        check_row(info, dev.as_ref(), &mut failures);
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

macro_rules! categories {
    ($($name:ident),*) => {$(
        #[test]
        fn $name() {
            check_category(stringify!($name));
        }
    )*};
}

categories!(
    unary, binary, cast, reduce, linalg, conv, movement, nn, fft, view
);

#[test]
fn every_category_is_tested() {
    let names: Vec<&str> = op_table_parts().iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "unary", "binary", "cast", "reduce", "linalg", "conv", "movement", "nn", "fft", "view"
        ]
    );
}

/// The Core ATen list names each op once, every row or backward rule it credits exists in the
/// op table (so the coverage it prints cannot claim an op the table lacks), and every op of the
/// list is covered or excluded with its reason.
#[test]
fn core_aten_covers_only_rows_that_exist() {
    use tpu_ops::op::core_aten::{CORE_ATEN, Cover, core_aten_covered};
    let rows = tpu_ops::op_table();
    let row = |name: &str| rows.iter().find(|r| r.name == name);
    let mut seen = std::collections::HashSet::new();
    for (name, cover) in CORE_ATEN {
        assert!(seen.insert(name), "{name} is listed twice");
        match cover {
            Cover::Rows(names) => {
                assert!(!names.is_empty(), "{name}: no rows");
                for r in names {
                    assert!(row(r).is_some(), "{name}: no row {r} in the op table");
                }
            }
            Cover::Backward(r) => {
                let info = row(r).unwrap_or_else(|| panic!("{name}: no row {r}"));
                assert!(info.backward(), "{name}: row {r} has no backward rule");
            }
            Cover::View(s) | Cover::Composition(s) | Cover::Partial(s) | Cover::Excluded(s) => {
                assert!(!s.is_empty(), "{name}: say how")
            }
            Cover::Missing => {}
        }
    }
    assert_eq!(CORE_ATEN.len(), 160);
    let uncovered: Vec<&str> = CORE_ATEN
        .iter()
        .filter(|(_, c)| !c.is_covered())
        .map(|(n, _)| *n)
        .collect();
    assert!(
        uncovered.is_empty(),
        "Core ATen ops neither covered nor excluded with a reason: {uncovered:?}"
    );
    assert_eq!(core_aten_covered(), 160);
}
