//! The persistent compile cache: PJRT executables serialised into a directory, so a new process
//! loads a program it compiled before instead of compiling it again.
//!
//! - Location: `TPU_RS_CACHE_DIR`, else the user's cache directory (`tpu-rs/compile` inside it);
//!   `TPU_RS_CACHE_DIR=off` turns it off. The directory is created readable by its owner only:
//!   whoever can write it can make this process run their code.
//! - Names: an entry is named by a SHA-256 over everything the executable depends on (the module
//!   text, the compile call, the plugin's platform name and version, the PJRT API version, the
//!   tpu-rs version). Every compile is stored, however short: there is no threshold below which
//!   a program is not kept.
//! - Trust: an entry holds its full key, its length and a SHA-256 of its bytes. A truncated,
//!   corrupt or foreign entry (another key under this name) is reported, removed and compiled
//!   again, never loaded.
//! - Sharing: entries are written to a temporary file in the same directory and renamed into
//!   place, so processes sharing the directory see whole entries or none; two writers of one
//!   entry write the same bytes.
//! - Size: past `TPU_RS_CACHE_MAX_BYTES` (default 2 GiB) the least recently used entries (by
//!   modification time, refreshed on every hit) are removed.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use tpu_ops::tpu_tensor::{Error, Result};

const MAGIC: &[u8] = b"tpu-rs compile cache v1\n";
const SUFFIX: &str = ".xla";

/// The environment variable naming the cache directory (`off` turns the cache off).
pub const ENV_CACHE_DIR: &str = "TPU_RS_CACHE_DIR";
/// The environment variable bounding the cache's size in bytes.
pub const ENV_CACHE_MAX_BYTES: &str = "TPU_RS_CACHE_MAX_BYTES";

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// An entry with this key, whole and checked.
    Hit(Vec<u8>),
    /// No entry.
    Miss,
    /// An entry that failed its checks (removed); the reason.
    Rejected(String),
}

/// A compile-cache directory.
#[derive(Clone, Debug)]
pub struct DiskCache {
    dir: PathBuf,
    max_bytes: u64,
}

/// The SHA-256 of `parts`, each length-prefixed so that no two lists of parts collide by
/// concatenation, as 64 hex digits.
pub fn key_of(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::invalid_argument("compile cache", format!("{what} {}: {e}", path.display()))
}

impl DiskCache {
    /// The cache the environment asks for: `TPU_RS_CACHE_DIR`, else the user's cache
    /// directory; `None` when it is turned off or no directory is known.
    pub fn from_env() -> Option<DiskCache> {
        let dir = match std::env::var_os(ENV_CACHE_DIR) {
            Some(d) if d == "off" || d.is_empty() => return None,
            Some(d) => PathBuf::from(d),
            None => dirs::cache_dir()?.join("tpu-rs").join("compile"),
        };
        let max_bytes = std::env::var(ENV_CACHE_MAX_BYTES)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(2 << 30);
        Some(DiskCache { dir, max_bytes })
    }

    /// A cache in `dir` holding at most `max_bytes` (the directory is created on first write).
    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> DiskCache {
        DiskCache {
            dir: dir.into(),
            max_bytes,
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}{SUFFIX}"))
    }

    /// Reads the entry of `key`, checking it whole; a failing entry is removed.
    pub fn get(&self, key: &str) -> Lookup {
        let path = self.path(key);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return Lookup::Rejected(format!("unreadable: {e}")),
        };
        match parse(&bytes, key) {
            Ok(payload) => {
                // A hit makes the entry the most recently used.
                if let Ok(f) = fs::File::options().append(true).open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Lookup::Hit(payload.to_vec())
            }
            Err(why) => {
                let _ = fs::remove_file(&path);
                Lookup::Rejected(why)
            }
        }
    }

    /// Stores `payload` under `key` atomically, then trims the directory to its size limit.
    /// Returns the bytes the directory holds afterwards.
    pub fn put(&self, key: &str, payload: &[u8]) -> Result<u64> {
        create_private_dir(&self.dir)?;
        let mut entry = Vec::with_capacity(payload.len() + 160);
        entry.extend_from_slice(MAGIC);
        entry.extend_from_slice(format!("{key}\n{}\n", payload.len()).as_bytes());
        entry.extend_from_slice(hex(&Sha256::digest(payload)).as_bytes());
        entry.push(b'\n');
        entry.extend_from_slice(payload);
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let tmp = self.dir.join(format!(
            ".tmp-{}-{}-{key}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&entry)?;
            f.sync_all()?;
            fs::rename(&tmp, self.path(key))
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(io("writing", &self.path(key), e));
        }
        self.evict()
    }

    /// The entries (path, bytes, last use), oldest first.
    fn entries(&self) -> Vec<(PathBuf, u64, SystemTime)> {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<_> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(SUFFIX))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((
                    e.path(),
                    m.len(),
                    m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                ))
            })
            .collect();
        out.sort_by_key(|(p, _, t)| (*t, p.clone()));
        out
    }

    /// The bytes the entries take.
    pub fn bytes(&self) -> u64 {
        self.entries().iter().map(|(_, n, _)| n).sum()
    }

    /// Removes the least recently used entries until the directory fits its limit; returns the
    /// bytes left.
    pub fn evict(&self) -> Result<u64> {
        let entries = self.entries();
        let mut total: u64 = entries.iter().map(|(_, n, _)| n).sum();
        for (path, n, _) in entries {
            if total <= self.max_bytes {
                break;
            }
            match fs::remove_file(&path) {
                Ok(()) => total -= n,
                // Another process removed it first.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => total -= n,
                Err(e) => return Err(io("removing", &path, e)),
            }
        }
        Ok(total)
    }
}

/// The payload of an entry, or why the entry is not to be trusted.
fn parse<'a>(bytes: &'a [u8], key: &str) -> std::result::Result<&'a [u8], String> {
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or("not a tpu-rs cache entry (no header)")?;
    let mut lines = rest.splitn(4, |&b| b == b'\n');
    let (Some(k), Some(len), Some(sum), Some(payload)) =
        (lines.next(), lines.next(), lines.next(), lines.next())
    else {
        return Err("truncated header".into());
    };
    if k != key.as_bytes() {
        return Err(format!(
            "a foreign entry (it holds key {})",
            String::from_utf8_lossy(k)
        ));
    }
    let len: usize = std::str::from_utf8(len)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or("unreadable length")?;
    if payload.len() != len {
        return Err(format!("truncated: {} of {len} bytes", payload.len()));
    }
    if sum != hex(&Sha256::digest(payload)).as_bytes() {
        return Err("corrupt: its checksum does not match".into());
    }
    Ok(payload)
}

fn create_private_dir(dir: &Path) -> Result<()> {
    let mut b = fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(dir).map_err(|e| io("creating", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> DiskCache {
        let dir =
            std::env::temp_dir().join(format!("tpu-graph-disk-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        DiskCache::new(dir, 1 << 20)
    }

    #[test]
    fn an_entry_comes_back_whole() {
        let c = tmp("whole");
        let k = key_of(&[b"module", b"options"]);
        assert!(matches!(c.get(&k), Lookup::Miss));
        c.put(&k, b"executable bytes").unwrap();
        match c.get(&k) {
            Lookup::Hit(b) => assert_eq!(b, b"executable bytes"),
            other => panic!("{other:?}"),
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(c.dir()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
        }
        let _ = fs::remove_dir_all(c.dir());
    }

    #[test]
    fn keys_separate_their_parts() {
        assert_ne!(key_of(&[b"ab", b"c"]), key_of(&[b"a", b"bc"]));
        assert_eq!(key_of(&[b"x"]).len(), 64);
    }

    #[test]
    fn corrupt_truncated_and_foreign_entries_are_rejected_and_removed() {
        let c = tmp("bad");
        let (k1, k2) = (key_of(&[b"one"]), key_of(&[b"two"]));
        c.put(&k1, b"payload one").unwrap();
        let good = fs::read(c.path(&k1)).unwrap();
        let cases: [(&str, Vec<u8>); 4] = [
            ("corrupt", {
                let mut b = good.clone();
                *b.last_mut().unwrap() ^= 1;
                b
            }),
            ("truncated", good[..good.len() - 3].to_vec()),
            ("header", b"garbage".to_vec()),
            ("foreign", good.clone()),
        ];
        for (what, bytes) in cases {
            let key = if what == "foreign" { &k2 } else { &k1 };
            fs::write(c.path(key), &bytes).unwrap();
            match c.get(key) {
                Lookup::Rejected(_) => {}
                other => panic!("{what}: {other:?}"),
            }
            assert!(!c.path(key).exists(), "{what}: the entry is removed");
        }
        let _ = fs::remove_dir_all(c.dir());
    }

    #[test]
    fn a_full_directory_evicts_the_least_recently_used() {
        let mut c = tmp("evict");
        c.max_bytes = 3 * 1200;
        let keys: Vec<String> = (0..5u8).map(|i| key_of(&[&[i]])).collect();
        for (i, k) in keys.iter().enumerate() {
            c.put(k, &[i as u8; 1000]).unwrap();
            // Key 0 is used again after key 1 was written. The sleep keeps modification times
            // apart: writes stamp them from a clock coarser than a hit's.
            if i == 1 {
                assert!(matches!(c.get(&keys[0]), Lookup::Hit(_)));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let present: Vec<bool> = keys.iter().map(|k| c.path(k).exists()).collect();
        assert_eq!(present, [false, false, true, true, true]);
        assert!(c.bytes() <= c.max_bytes);
        let _ = fs::remove_dir_all(c.dir());
    }
}
