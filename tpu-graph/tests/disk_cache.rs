//! The persistent compile cache across real processes: this test binary runs itself as the
//! child (`child_process_compiles` with `TPU_GRAPH_CHILD` set), which compiles one graph on the
//! XLA CPU plugin and prints its cache figures.

use std::path::Path;
use std::process::{Command, Output};

use tpu_graph::{CompileOptions, compile_with, metrics};
use tpu_ops::prelude::*;
use tpu_ops::tpu_tensor::{DType, Generator, Tensor};

const CHILD: &str = "TPU_GRAPH_CHILD";

/// Run by the parent through a new process: compiles, runs, and prints
/// `disk hits=H misses=M rejected=R sum=S`.
#[test]
#[ignore = "run as a child process by the other tests of this file"]
fn child_process_compiles() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let client =
        tpu_ops::tpu_tensor::tpu_runtime::pjrt::testing::client_or_skip("disk cache child")
            .expect("the child runs only where the parent found the plugin");
    let dev = client.device(0).unwrap();
    let f = compile_with(
        CompileOptions::default().name("cached"),
        |a: &[Tensor]| Ok(vec![a[0].matmul(&a[0].t()?)?.tanh()?.sum(&[], false)?]),
    );
    let x = Generator::new(3).randn([16, 8], DType::F32, &dev).unwrap();
    let s = f.call(&[x]).unwrap()[0].to_vec::<f32>().unwrap()[0];
    let m = metrics();
    let row = m.functions.iter().find(|r| r.name == "cached").unwrap();
    println!(
        "disk hits={} misses={} rejected={} sum={}",
        row.disk_hits,
        row.disk_misses,
        row.disk_rejected,
        s.to_bits()
    );
}

/// This binary, set to run only the child test against the cache in `dir`.
fn child_command(dir: &Path) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "child_process_compiles",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, "1")
    .env("TPU_RS_CACHE_DIR", dir);
    c
}

fn child(dir: &Path) -> Output {
    child_command(dir).output().unwrap()
}

/// (hits, misses, rejected, sum bits) as the child printed them.
fn figures(out: &Output) -> (u64, u64, u64, u32) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The harness prints the test's name on the same line before it.
    let line = text
        .lines()
        .find_map(|l| l.find("disk hits=").map(|i| &l[i..]))
        .unwrap_or_else(|| panic!("no figures in:\n{text}"));
    let num = |name: &str| -> u64 {
        let rest = &line[line.find(&format!("{name}=")).unwrap() + name.len() + 1..];
        rest.split(' ').next().unwrap().parse().unwrap()
    };
    (
        num("hits"),
        num("misses"),
        num("rejected"),
        num("sum") as u32,
    )
}

fn entries(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "xla"))
                .collect()
        })
        .unwrap_or_default()
}

fn fresh_dir(name: &str) -> Option<std::path::PathBuf> {
    tpu_ops::tpu_tensor::tpu_runtime::pjrt::testing::client_or_skip(name)?;
    let dir = std::env::temp_dir().join(format!("tpu-graph-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Some(dir)
}

#[test]
fn a_new_process_loads_the_program_and_a_corrupt_entry_is_compiled_again() {
    let Some(dir) = fresh_dir("restart") else {
        return;
    };
    let (h, m, r, sum) = figures(&child(&dir));
    assert_eq!((h, m, r), (0, 1, 0), "the first process compiles");
    assert_eq!(entries(&dir).len(), 1);
    let (h, m, r, sum2) = figures(&child(&dir));
    assert_eq!((h, m, r), (1, 0, 0), "a restart loads from disk");
    assert_eq!(sum, sum2, "the loaded program computes the same bits");
    // Flip one byte of the executable: detected, reported, compiled again, rewritten.
    let path = &entries(&dir)[0];
    let mut bytes = std::fs::read(path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(path, &bytes).unwrap();
    let (h, m, r, sum3) = figures(&child(&dir));
    assert_eq!((h, m, r), (0, 1, 1), "a corrupt entry is rejected");
    assert_eq!(sum, sum3);
    let (h, _, r, _) = figures(&child(&dir));
    assert_eq!((h, r), (1, 0), "and the rewritten entry loads");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_processes_compiling_into_one_directory_at_once() {
    let Some(dir) = fresh_dir("concurrent") else {
        return;
    };
    let spawn = || {
        child_command(&dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (fa, fb) = (
        figures(&a.wait_with_output().unwrap()),
        figures(&b.wait_with_output().unwrap()),
    );
    assert_eq!(fa.3, fb.3, "both compute the same bits");
    assert_eq!((fa.2, fb.2), (0, 0), "neither saw a partial entry");
    assert_eq!(entries(&dir).len(), 1, "one entry, whoever wrote it last");
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .collect();
    assert_eq!(leftovers.len(), 1, "no temporary files left: {leftovers:?}");
    let (h, _, r, _) = figures(&child(&dir));
    assert_eq!((h, r), (1, 0), "the entry they left loads");
    let _ = std::fs::remove_dir_all(&dir);
}
