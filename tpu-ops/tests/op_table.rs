//! Every row of the op table, for every dtype it lists: the native CPU kernel against XLA
//! through the PJRT CPU plugin; and every dtype it does not list is refused with an error.

use tpu_ops::testing::assert_close;
use tpu_ops::{OpInfo, op_table};
use tpu_tensor::tpu_runtime::pjrt::testing::client_or_skip;
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

#[test]
fn every_op_agrees_with_xla_and_refuses_unlisted_dtypes() {
    let client = client_or_skip("every_op_agrees_with_xla_and_refuses_unlisted_dtypes");
    let dev = client.map(|c| c.device(0).unwrap());
    let mut failures = Vec::new();
    for info in op_table() {
        check_row(&info, dev.as_ref(), &mut failures);
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
