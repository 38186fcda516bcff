//! Loading and saving named tensors in the safetensors format.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype as StDtype, SafeTensors, View};
use tpu_runtime::{Buffer, DType, Device, Error, MappedFile, Result};

use crate::tensor::Tensor;

fn to_st(dtype: DType) -> StDtype {
    match dtype {
        DType::Bool => StDtype::BOOL,
        DType::U8 => StDtype::U8,
        DType::I8 => StDtype::I8,
        DType::I32 => StDtype::I32,
        DType::I64 => StDtype::I64,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
    }
}

fn from_st(dtype: StDtype) -> Option<DType> {
    Some(match dtype {
        StDtype::BOOL => DType::Bool,
        StDtype::U8 => DType::U8,
        StDtype::I8 => DType::I8,
        StDtype::I32 => DType::I32,
        StDtype::I64 => DType::I64,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::F32 => DType::F32,
        StDtype::F64 => DType::F64,
        _ => return None,
    })
}

fn format_err(path: &Path, reason: impl Into<String>) -> Error {
    Error::Format {
        path: path.display().to_string(),
        format: "safetensors",
        reason: reason.into(),
    }
}

/// A safetensors file mapped into memory; tensors are read one at a time, on demand.
pub struct SafetensorsFile {
    file: MappedFile,
    /// Name -> (dtype, shape, byte range within the data section).
    entries: BTreeMap<String, (DType, Vec<usize>, std::ops::Range<usize>)>,
    data_start: usize,
    metadata: HashMap<String, String>,
}

impl SafetensorsFile {
    /// Maps and validates `path`. A truncated or corrupt file is an error naming what is wrong.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let path = path.as_ref();
        let file = MappedFile::open(path)?;
        let bytes = file.bytes();
        let st = SafeTensors::deserialize(bytes).map_err(|e| format_err(path, e.to_string()))?;
        let (header_len, meta) =
            SafeTensors::read_metadata(bytes).map_err(|e| format_err(path, e.to_string()))?;
        let data_start = 8 + header_len;
        let mut entries = BTreeMap::new();
        for (name, view) in st.tensors() {
            let dtype = from_st(view.dtype()).ok_or_else(|| {
                format_err(
                    path,
                    format!(
                        "tensor {name:?} has dtype {:?}, which tpu-rs does not support",
                        view.dtype()
                    ),
                )
            })?;
            let info = meta
                .info(&name)
                .ok_or_else(|| format_err(path, format!("tensor {name:?} has no header entry")))?;
            let (a, b) = info.data_offsets;
            entries.insert(name.clone(), (dtype, view.shape().to_vec(), a..b));
        }
        let metadata = meta.metadata().clone().unwrap_or_default();
        Ok(SafetensorsFile {
            file,
            entries,
            data_start,
            metadata,
        })
    }

    /// Names of the tensors, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.entries.keys().map(|s| s.as_str()).collect()
    }

    /// The dtype and shape of a tensor, without reading it.
    pub fn info(&self, name: &str) -> Option<(DType, &[usize])> {
        self.entries.get(name).map(|(d, s, _)| (*d, s.as_slice()))
    }

    /// The file's free-form metadata.
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    /// Reads one tensor onto `device`.
    pub fn get(&self, name: &str, device: &Device) -> Result<Tensor> {
        let (dtype, shape, range) = self.entries.get(name).ok_or_else(|| {
            format_err(
                self.file.path(),
                format!(
                    "no tensor named {name:?}; the file holds {:?}",
                    self.names()
                ),
            )
        })?;
        let bytes = &self.file.bytes()[self.data_start + range.start..self.data_start + range.end];
        if *dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
            return Err(format_err(
                self.file.path(),
                format!("bool tensor {name:?} holds a byte other than 0 or 1"),
            ));
        }
        Ok(Tensor::from_buffer(Buffer::from_bytes(
            device, *dtype, shape, bytes,
        )?))
    }

    /// Reads every tensor onto `device`.
    pub fn load_all(&self, device: &Device) -> Result<BTreeMap<String, Tensor>> {
        self.entries
            .keys()
            .map(|n| Ok((n.clone(), self.get(n, device)?)))
            .collect()
    }
}

/// Loads every tensor of a safetensors file onto `device` (memory-mapped reading).
pub fn load_safetensors(
    path: impl AsRef<Path>,
    device: &Device,
) -> Result<BTreeMap<String, Tensor>> {
    SafetensorsFile::open(path)?.load_all(device)
}

struct HostTensor {
    dtype: DType,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &HostTensor {
    fn dtype(&self) -> StDtype {
        to_st(self.dtype)
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Saves named tensors (from any device) to `path`, with optional free-form metadata. The file
/// is written beside the target and renamed into place, so a failure never leaves half a file.
pub fn save_safetensors<'a, S: AsRef<str>>(
    tensors: impl IntoIterator<Item = (S, &'a Tensor)>,
    path: impl AsRef<Path>,
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let path = path.as_ref();
    let mut host = BTreeMap::new();
    for (name, t) in tensors {
        let name = name.as_ref().to_string();
        let entry = HostTensor {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            bytes: t.to_host_bytes()?,
        };
        if host.insert(name.clone(), entry).is_some() {
            return Err(Error::invalid_argument(
                "save_safetensors",
                format!("the name {name:?} is given twice"),
            ));
        }
    }
    let tmp = path.with_extension("safetensors.tmp");
    safetensors::tensor::serialize_to_file(
        host.iter().map(|(k, v)| (k.as_str(), v)),
        &metadata,
        &tmp,
    )
    .map_err(|e| format_err(path, format!("could not write: {e}")))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        Error::io(
            format!("renaming {} to {}", tmp.display(), path.display()),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use tpu_runtime::bf16;

    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tpu-rs-io-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("t.safetensors")
    }

    #[test]
    fn round_trip_every_dtype() {
        let d = Device::cpu();
        let p = tmp("rt");
        let base = Tensor::new([[1.5f32, -2.0, 0.0], [3.0, 4.25, -0.5]], &d).unwrap();
        let mut named = Vec::new();
        for dt in DType::ALL {
            named.push((format!("w.{dt}"), base.to_dtype(dt).unwrap()));
        }
        // A non-contiguous view is saved as its values.
        named.push(("t".into(), base.t().unwrap()));
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        save_safetensors(named.iter().map(|(n, t)| (n.as_str(), t)), &p, Some(meta)).unwrap();
        let f = SafetensorsFile::open(&p).unwrap();
        assert_eq!(f.metadata()["format"], "pt");
        assert_eq!(f.info("w.bf16"), Some((DType::BF16, &[2usize, 3][..])));
        let back = f.load_all(&d).unwrap();
        for (n, t) in &named {
            assert_eq!(
                back[n].to_host_bytes().unwrap(),
                t.to_host_bytes().unwrap(),
                "{n}"
            );
            assert_eq!(back[n].shape(), t.shape());
            assert_eq!(back[n].dtype(), t.dtype());
        }
        assert_eq!(
            back["w.bf16"].to_vec::<bf16>().unwrap()[4],
            bf16::from_f32(4.25)
        );
        let e = f.get("missing", &d).unwrap_err().to_string();
        assert!(e.contains("no tensor named \"missing\""), "{e}");
    }

    #[test]
    fn truncated_and_corrupt_files_are_errors() {
        let d = Device::cpu();
        let p = tmp("bad");
        let t = Tensor::ones([64], DType::F32, &d).unwrap();
        save_safetensors([("a", &t)], &p, None).unwrap();
        let good = std::fs::read(&p).unwrap();
        for cut in [0, 4, 8, 20, good.len() - 1] {
            std::fs::write(&p, &good[..cut]).unwrap();
            let e = load_safetensors(&p, &d).unwrap_err();
            assert!(matches!(e, Error::Format { .. }), "cut {cut}: {e}");
        }
        let mut corrupt = good.clone();
        corrupt[8] = b'!';
        std::fs::write(&p, &corrupt).unwrap();
        assert!(load_safetensors(&p, &d).is_err());
        let mut huge = good.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&p, &huge).unwrap();
        assert!(load_safetensors(&p, &d).is_err());
        let e = load_safetensors(p.with_file_name("absent.safetensors"), &d).unwrap_err();
        assert!(e.to_string().contains("absent.safetensors"), "{e}");
    }

    #[test]
    fn duplicate_names_are_refused() {
        let d = Device::cpu();
        let t = Tensor::ones([1], DType::F32, &d).unwrap();
        let e = save_safetensors([("a", &t), ("a", &t)], tmp("dup"), None).unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
    }
}
