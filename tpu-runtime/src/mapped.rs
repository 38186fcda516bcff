//! Read-only memory-mapped files, the source for loading weights without reading them twice.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A file mapped read-only into memory.
pub struct MappedFile {
    map: memmap2::Mmap,
    path: PathBuf,
}

impl MappedFile {
    /// Maps `path` read-only.
    pub fn open(path: impl AsRef<Path>) -> Result<MappedFile> {
        let path = path.as_ref();
        let file =
            File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        // SAFETY: the mapping is read-only and private to this handle. The one hazard of a file
        // mapping, another process truncating or rewriting the file while it is mapped, is the
        // documented contract of memory-mapped loading (as in every safetensors loader); the
        // bytes are only ever copied out, never handed out as references that outlive this map.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Error::io(format!("memory-mapping {}", path.display()), e))?;
        Ok(MappedFile {
            map,
            path: path.to_path_buf(),
        })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
