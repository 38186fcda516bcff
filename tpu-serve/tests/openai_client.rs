//! The official `openai` Python client against the server: chat, streaming chat, completions,
//! embeddings and errors (`tests/clients/openai_client.py`).
//!
//! The Python comes from `TPU_RS_OPENAI_PYTHON` (an interpreter with `openai` installed; CI
//! makes a virtual environment and sets `TPU_RS_REQUIRE_OPENAI=1`, which makes its absence a
//! failure instead of a skip).

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_works() {
    let python = match std::env::var("TPU_RS_OPENAI_PYTHON") {
        Ok(p) => p,
        Err(_) => {
            let msg = "TPU_RS_OPENAI_PYTHON is not set: set it to a Python that has `openai`";
            if std::env::var_os("TPU_RS_REQUIRE_OPENAI").is_some_and(|v| v == "1") {
                panic!("{msg}");
            }
            eprintln!("skipped: {msg}");
            return;
        }
    };
    let Some(s) = common::server().await else {
        return;
    };
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/openai_client.py"
    );
    let base = s.url("");
    let out = tokio::process::Command::new(python)
        .arg(script)
        .arg(base)
        .output()
        .await
        .expect("running the Python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count(),
        8,
        "{stdout}"
    );
}
