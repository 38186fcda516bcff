//! A checkpoint's tensors: a Hugging Face model folder's `model.safetensors`, or the shards an
//! index (`model.safetensors.index.json`) names, memory-mapped and read one tensor at a time,
//! each checked against the shape the model expects and converted to the dtype it asks for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tpu_runtime::error::fmt_shape;
use tpu_runtime::{DType, Device, Error, Result};
use tpu_tensor::Tensor;
use tpu_tensor::io::SafetensorsFile;

/// The tensors of one checkpoint, over one or several safetensors files.
pub struct Weights {
    files: Vec<(PathBuf, SafetensorsFile)>,
    /// Tensor name -> index into `files`.
    index: BTreeMap<String, usize>,
    device: Device,
    dtype: DType,
}

impl Weights {
    /// The checkpoint in `folder` (its `model.safetensors`, or the shards its
    /// `model.safetensors.index.json` lists), read onto `device` as `dtype` (floating-point
    /// tensors; integer ones keep theirs).
    pub fn from_folder(folder: &Path, device: &Device, dtype: DType) -> Result<Weights> {
        let single = folder.join("model.safetensors");
        let index_path = folder.join("model.safetensors.index.json");
        let paths: Vec<PathBuf> = if single.exists() {
            vec![single]
        } else if index_path.exists() {
            shards(&index_path)?
                .into_iter()
                .map(|s| folder.join(s))
                .collect()
        } else {
            return Err(Error::invalid_argument(
                "weights",
                format!(
                    "{} has neither model.safetensors nor model.safetensors.index.json",
                    folder.display()
                ),
            ));
        };
        Weights::from_files(&paths, device, dtype)
    }

    /// The tensors of the safetensors files `paths`.
    pub fn from_files(paths: &[PathBuf], device: &Device, dtype: DType) -> Result<Weights> {
        let mut files = Vec::with_capacity(paths.len());
        let mut index = BTreeMap::new();
        for (i, p) in paths.iter().enumerate() {
            let f = SafetensorsFile::open(p)?;
            for name in f.names() {
                index.insert(name.to_string(), i);
            }
            files.push((p.clone(), f));
        }
        Ok(Weights {
            files,
            index,
            device: device.clone(),
            dtype,
        })
    }

    /// True when the checkpoint holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The tensor `name`, which must have `shape`; floating-point values come as the dtype the
    /// weights were opened with. A missing tensor or another shape is an error naming the file
    /// and the tensor.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let Some(&i) = self.index.get(name) else {
            let files: Vec<String> = self
                .files
                .iter()
                .map(|(p, _)| p.display().to_string())
                .collect();
            return Err(Error::invalid_argument(
                "weights",
                format!(
                    "the checkpoint ({}) has no tensor {name:?}",
                    files.join(", ")
                ),
            ));
        };
        let (path, file) = &self.files[i];
        let (dtype, have) = file
            .info(name)
            .ok_or_else(|| Error::internal("weights", format!("{name:?} left the index")))?;
        if have != shape {
            return Err(Error::invalid_argument(
                "weights",
                format!(
                    "{}: tensor {name:?} has shape {}, the model expects {}",
                    path.display(),
                    fmt_shape(have),
                    fmt_shape(shape)
                ),
            ));
        }
        let t = file.get(name, &self.device)?;
        if dtype.is_float() && dtype != self.dtype {
            t.to_dtype(self.dtype)
        } else {
            Ok(t)
        }
    }
}

/// The shard files an index names, in order, each once.
fn shards(index: &Path) -> Result<Vec<String>> {
    let (v, bad) = super::read_json(index, "safetensors index")?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no weight_map object".into()))?;
    let mut out: Vec<String> = Vec::new();
    for (name, file) in map {
        let f = file
            .as_str()
            .ok_or_else(|| bad(format!("the shard of {name:?} is not a file name")))?;
        if f.contains('/') || f.contains('\\') || f.starts_with('.') {
            return Err(bad(format!("shard {f:?} is not a file in the folder")));
        }
        if !out.iter().any(|o| o == f) {
            out.push(f.to_string());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpu_tensor::io::save_safetensors;

    /// A folder with `index` as its `model.safetensors.index.json` and two shards.
    fn sharded(tag: &str, index: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tpu-rs-shards-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cpu = Device::cpu();
        let a = Tensor::from_vec(vec![1.0f32, 2.5, -3.0, 4.0], [2, 2], &cpu).unwrap();
        let b = Tensor::from_vec(vec![7i64, 8, 9], [3], &cpu).unwrap();
        let c = Tensor::from_vec(vec![0.1f32; 3], [3], &cpu).unwrap();
        save_safetensors(
            [("a.weight", &a), ("b.ids", &b)],
            dir.join("one.safetensors"),
            None,
        )
        .unwrap();
        save_safetensors([("c.weight", &c)], dir.join("two.safetensors"), None).unwrap();
        std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
        dir
    }

    const INDEX: &str = r#"{"metadata": {"total_size": 52}, "weight_map": {
        "a.weight": "one.safetensors", "b.ids": "one.safetensors",
        "c.weight": "two.safetensors"}}"#;

    #[test]
    fn a_sharded_checkpoint_reads_every_shard_in_the_dtype_asked() {
        let dir = sharded("ok", INDEX);
        let w = Weights::from_folder(&dir, &Device::cpu(), DType::BF16).unwrap();
        let a = w.get("a.weight", &[2, 2]).unwrap();
        assert_eq!(a.dtype(), DType::BF16);
        let a = a.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(a, [1.0, 2.5, -3.0, 4.0]);
        // Integer tensors keep their dtype.
        let b = w.get("b.ids", &[3]).unwrap();
        assert_eq!(b.to_vec::<i64>().unwrap(), [7, 8, 9]);
        assert_eq!(w.get("c.weight", &[3]).unwrap().dtype(), DType::BF16);
        assert!(w.contains("c.weight") && !w.contains("d.weight"));
        let e = w.get("d.weight", &[3]).err().unwrap().to_string();
        assert!(
            e.contains("one.safetensors") && e.contains("two.safetensors"),
            "{e}"
        );
        assert!(e.contains("no tensor \"d.weight\""), "{e}");
        let e = w.get("c.weight", &[4]).err().unwrap().to_string();
        assert!(
            e.contains("two.safetensors") && e.contains("expects [4]"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bad_index_or_a_missing_shard_is_an_error_naming_it() {
        let cpu = Device::cpu();
        for (tag, index, why) in [
            (
                "escape",
                INDEX.replace("\"two.safetensors\"", "\"../two.safetensors\""),
                "is not a file in the folder",
            ),
            ("nomap", r#"{"metadata": {}}"#.to_string(), "no weight_map"),
            (
                "missing",
                INDEX.replace("two.safetensors", "three.safetensors"),
                "three.safetensors",
            ),
        ] {
            let dir = sharded(tag, &index);
            let e = Weights::from_folder(&dir, &cpu, DType::F32)
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains(why), "{tag}: {e}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
        let e = Weights::from_folder(
            &std::env::temp_dir().join("tpu-rs-no-such-folder"),
            &cpu,
            DType::F32,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("neither model.safetensors"), "{e}");
    }
}
