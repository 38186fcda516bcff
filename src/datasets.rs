//! Data sets the examples train on.

use std::io::Read;
use std::path::{Path, PathBuf};

use tpu_runtime::{Error, Result};

/// Where Debian's `dataset-fashion-mnist` package installs Fashion-MNIST.
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// Images and labels of one split of an MNIST-format data set.
#[derive(Clone, Debug)]
pub struct Split {
    /// Pixels, `len * rows * cols` bytes, row-major.
    pub images: Vec<u8>,
    /// One label per image.
    pub labels: Vec<u8>,
    /// Image height.
    pub rows: usize,
    /// Image width.
    pub cols: usize,
}

impl Split {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when the split is empty.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// Fashion-MNIST: 60 000 training and 10 000 test images of 28x28 pixels in 10 classes.
#[derive(Clone, Debug)]
pub struct FashionMnist {
    /// The training split.
    pub train: Split,
    /// The test split.
    pub test: Split,
}

/// The class names, by label.
pub const FASHION_MNIST_CLASSES: [&str; 10] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

fn read_file(path: &Path) -> Result<Vec<u8>> {
    let raw =
        std::fs::read(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| Error::Format {
                path: path.display().to_string(),
                format: "gzip",
                reason: e.to_string(),
            })?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

fn bad(path: &Path, reason: String) -> Error {
    Error::Format {
        path: path.display().to_string(),
        format: "IDX",
        reason,
    }
}

/// Parses an IDX file of unsigned bytes with `want_dims` dims; returns the dims and the data.
fn parse_idx(path: &Path, want_dims: u8) -> Result<(Vec<usize>, Vec<u8>)> {
    let bytes = read_file(path)?;
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad(path, "expected the IDX magic number 0x0000....".into()));
    }
    if bytes[2] != 0x08 {
        return Err(bad(
            path,
            format!(
                "expected unsigned bytes (type 0x08), got type 0x{:02x}",
                bytes[2]
            ),
        ));
    }
    if bytes[3] != want_dims {
        return Err(bad(
            path,
            format!("expected {want_dims} dims, got {}", bytes[3]),
        ));
    }
    let header = 4 + 4 * want_dims as usize;
    if bytes.len() < header {
        return Err(bad(path, "truncated header".into()));
    }
    let dims: Vec<usize> = (0..want_dims as usize)
        .map(|i| {
            u32::from_be_bytes([
                bytes[4 + 4 * i],
                bytes[5 + 4 * i],
                bytes[6 + 4 * i],
                bytes[7 + 4 * i],
            ]) as usize
        })
        .collect();
    let n: usize = dims.iter().product();
    if bytes.len() != header + n {
        return Err(bad(
            path,
            format!(
                "expected {} bytes for dims {dims:?}, got {}",
                header + n,
                bytes.len()
            ),
        ));
    }
    Ok((dims, bytes[header..].to_vec()))
}

fn find(dir: &Path, stem: &str) -> PathBuf {
    let gz = dir.join(format!("{stem}.gz"));
    if gz.exists() { gz } else { dir.join(stem) }
}

fn load_split(dir: &Path, images: &str, labels: &str) -> Result<Split> {
    let (idims, images) = parse_idx(&find(dir, images), 3)?;
    let (ldims, labels) = parse_idx(&find(dir, labels), 1)?;
    if idims[0] != ldims[0] {
        return Err(Error::invalid_argument(
            "FashionMnist",
            format!(
                "{} images but {} labels in {}",
                idims[0],
                ldims[0],
                dir.display()
            ),
        ));
    }
    Ok(Split {
        images,
        labels,
        rows: idims[1],
        cols: idims[2],
    })
}

impl FashionMnist {
    /// Loads the IDX files (gzipped or not) from `dir`. A missing file is an error that says how
    /// to install the data set.
    pub fn load(dir: impl AsRef<Path>) -> Result<FashionMnist> {
        let dir = dir.as_ref();
        if !find(dir, "train-images-idx3-ubyte").exists() {
            return Err(Error::invalid_argument(
                "FashionMnist",
                format!(
                    "no Fashion-MNIST files in {}: install them with `apt-get install dataset-fashion-mnist` (they go to {FASHION_MNIST_DIR}), or pass the folder holding train-images-idx3-ubyte[.gz]",
                    dir.display()
                ),
            ));
        }
        Ok(FashionMnist {
            train: load_split(dir, "train-images-idx3-ubyte", "train-labels-idx1-ubyte")?,
            test: load_split(dir, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idx_parsing_checks_sizes() {
        let dir = std::env::temp_dir().join(format!("tpu-rs-idx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x");
        std::fs::write(&p, [0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9]).unwrap();
        assert_eq!(parse_idx(&p, 1).unwrap(), (vec![3], vec![7, 8, 9]));
        std::fs::write(&p, [0, 0, 8, 1, 0, 0, 0, 4, 7, 8, 9]).unwrap();
        assert!(parse_idx(&p, 1).is_err());
        assert!(parse_idx(&p, 3).is_err());
        let e = FashionMnist::load(&dir).unwrap_err().to_string();
        assert!(e.contains("apt-get install dataset-fashion-mnist"), "{e}");
    }
}
