//! Finding PJRT plugins on disk and loading each one once per process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use libtpu_sys::PjrtLibrary;

use crate::error::{Error, Result};

/// Environment variable: path of a PJRT plugin for `pjrt` devices.
pub const ENV_PJRT_PLUGIN: &str = "TPU_RS_PJRT_PLUGIN";
/// Environment variable: path of libtpu.so (the variable libtpu's own packaging uses).
pub const ENV_TPU_LIBRARY_PATH: &str = "TPU_LIBRARY_PATH";
/// Environment variable: create options for the default PJRT client, `key=value,key=value`.
pub const ENV_PJRT_OPTIONS: &str = "TPU_RS_PJRT_OPTIONS";
/// The project-local folder that `scripts/install-pjrt-cpu.sh` fills (plugins under
/// `plugins/`), looked for in the current directory, the executable's directory and their
/// ancestors.
pub const LOCAL_PLUGIN_DIR: &str = ".pjrt";

/// A create option value for a PJRT client.
#[derive(Clone, Debug, PartialEq)]
pub enum OptionValue {
    /// A string.
    Str(String),
    /// A 64-bit integer.
    Int(i64),
    /// A list of 64-bit integers.
    IntList(Vec<i64>),
    /// A float.
    Float(f32),
    /// A boolean.
    Bool(bool),
}

/// Parses `key=value,key=value` create options; values are read as bool, integer, float or,
/// failing those, string.
pub fn parse_create_options(text: &str) -> Result<Vec<(String, OptionValue)>> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = item.split_once('=').ok_or_else(|| Error::InvalidEnv {
            var: ENV_PJRT_OPTIONS,
            value: text.to_string(),
            expected: format!("key=value pairs separated by commas; {item:?} has no '='"),
        })?;
        let v = v.trim();
        let value = match v {
            "true" => OptionValue::Bool(true),
            "false" => OptionValue::Bool(false),
            _ => match (v.parse::<i64>(), v.parse::<f32>()) {
                (Ok(i), _) => OptionValue::Int(i),
                (_, Ok(f)) => OptionValue::Float(f),
                _ => OptionValue::Str(v.to_string()),
            },
        };
        out.push((k.trim().to_string(), value));
    }
    Ok(out)
}

/// Loads the plugin at `path`, once per process: later calls with the same file return the
/// same library. Plugins stay loaded until the process ends, since they keep threads and
/// process-wide state that unloading would pull out from under them.
pub fn load_plugin(path: &Path) -> Result<&'static PjrtLibrary> {
    static LOADED: OnceLock<Mutex<HashMap<PathBuf, &'static PjrtLibrary>>> = OnceLock::new();
    let key = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mut map = LOADED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(lib) = map.get(&key) {
        return Ok(lib);
    }
    let lib: &'static PjrtLibrary = Box::leak(Box::new(PjrtLibrary::open(&key)?));
    lib.initialize()?;
    map.insert(key, lib);
    Ok(lib)
}

fn search_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.extend(cwd.ancestors().map(Path::to_path_buf));
    }
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    roots.dedup();
    roots
}

/// Plugins in the project-local folder: `.pjrt/plugins/*.so`, sorted by name.
pub fn local_plugins() -> Vec<PathBuf> {
    for root in search_roots() {
        let dir = root.join(LOCAL_PLUGIN_DIR).join("plugins");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            let mut found: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "so") && p.exists())
                .collect();
            found.sort();
            if !found.is_empty() {
                return found;
            }
        }
    }
    Vec::new()
}

/// The file the environment variable `var` names: `None` when it is not set, an error when it
/// names no file.
fn path_from_env(var: &str) -> Option<Result<PathBuf>> {
    let p = std::env::var(var).ok()?;
    let path = PathBuf::from(&p);
    Some(if path.exists() {
        Ok(path)
    } else {
        Err(Error::NoPlugin {
            looked_at: format!("{var}={p:?} names no file"),
        })
    })
}

/// The plugin for `pjrt` devices: `TPU_RS_PJRT_PLUGIN`, else the first plugin in the
/// project-local folder.
pub fn find_pjrt_plugin() -> Result<PathBuf> {
    if let Some(path) = path_from_env(ENV_PJRT_PLUGIN) {
        return path;
    }
    local_plugins().into_iter().next().ok_or_else(|| Error::NoPlugin {
        looked_at: format!(
            "{ENV_PJRT_PLUGIN} is not set and no {LOCAL_PLUGIN_DIR}/plugins/*.so was found in the \
             current directory, the executable's directory or their parents; run \
             scripts/install-pjrt-cpu.sh to install XLA's CPU plugin, or set {ENV_PJRT_PLUGIN} to \
             a plugin's path"
        ),
    })
}

/// libtpu.so: `TPU_LIBRARY_PATH`, else `.pjrt/libtpu/libtpu.so` in the project-local folder.
pub fn find_libtpu() -> Result<PathBuf> {
    if let Some(path) = path_from_env(ENV_TPU_LIBRARY_PATH) {
        return path;
    }
    for root in search_roots() {
        let p = root.join(LOCAL_PLUGIN_DIR).join("libtpu").join("libtpu.so");
        if p.exists() {
            return Ok(p);
        }
    }
    Err(Error::NoPlugin {
        looked_at: format!(
            "{ENV_TPU_LIBRARY_PATH} is not set and no {LOCAL_PLUGIN_DIR}/libtpu/libtpu.so was \
             found; install the libtpu package and set {ENV_TPU_LIBRARY_PATH} to its libtpu.so"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let o = parse_create_options("cpu_device_count=4, flag=true,ratio=0.5,name=abc").unwrap();
        assert_eq!(
            o,
            vec![
                ("cpu_device_count".to_string(), OptionValue::Int(4)),
                ("flag".to_string(), OptionValue::Bool(true)),
                ("ratio".to_string(), OptionValue::Float(0.5)),
                ("name".to_string(), OptionValue::Str("abc".into())),
            ]
        );
        assert!(parse_create_options("oops").is_err());
        assert!(parse_create_options("").unwrap().is_empty());
    }
}
