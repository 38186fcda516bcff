//! Reading GGUF files (llama.cpp's format: metadata, a tensor directory, and tensors that are
//! often quantised in blocks), memory-mapped, with dequantisation to f32 tensors.
//!
//! The header is checked as it is read: every length and count against the bytes left, every
//! tensor's bytes against the data section, so a truncated or corrupt file is an error naming
//! the file and what is wrong, never a panic or a huge allocation. Dims are given in PyTorch's
//! order (GGUF lists the fastest-varying dim first): a matrix of `ne0` columns and `ne1` rows
//! is `[ne1, ne0]`.
//!
//! Dequantised types: F32, F16, BF16, Q8_0, Q4_0 and Q4_1. A tensor of another type opens (its
//! bytes can be read raw) but dequantising it is an error naming the type.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use half::{bf16, f16};
use tpu_runtime::{Buffer, DType, Device, Error, MappedFile, Result};

use crate::tensor::Tensor;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float32`.
    F32(f32),
    /// `float64`.
    F64(f64),
    /// `bool`.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// An array of values of one type.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, when it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, when it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, when the value is an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// How a tensor's elements are stored (ggml's type numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit floats.
    F32,
    /// 16-bit IEEE floats.
    F16,
    /// bfloat16.
    BF16,
    /// Blocks of 32: an f16 scale and 32 signed bytes.
    Q8_0,
    /// Blocks of 32: an f16 scale and 32 4-bit values offset by 8.
    Q4_0,
    /// Blocks of 32: an f16 scale, an f16 minimum and 32 4-bit values.
    Q4_1,
    /// A type this reader does not dequantise, by its ggml number.
    Other(u32),
}

impl GgmlType {
    fn from_code(c: u32) -> GgmlType {
        match c {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            30 => GgmlType::BF16,
            c => GgmlType::Other(c),
        }
    }

    /// ggml's name of the type.
    pub fn name(self) -> String {
        match self {
            GgmlType::F32 => "F32".into(),
            GgmlType::F16 => "F16".into(),
            GgmlType::BF16 => "BF16".into(),
            GgmlType::Q8_0 => "Q8_0".into(),
            GgmlType::Q4_0 => "Q4_0".into(),
            GgmlType::Q4_1 => "Q4_1".into(),
            GgmlType::Other(c) => {
                let known = [
                    (6, "Q5_0"),
                    (7, "Q5_1"),
                    (9, "Q8_1"),
                    (10, "Q2_K"),
                    (11, "Q3_K"),
                    (12, "Q4_K"),
                    (13, "Q5_K"),
                    (14, "Q6_K"),
                    (15, "Q8_K"),
                    (16, "IQ2_XXS"),
                    (17, "IQ2_XS"),
                    (18, "IQ3_XXS"),
                    (19, "IQ1_S"),
                    (20, "IQ4_NL"),
                    (21, "IQ3_S"),
                    (22, "IQ2_S"),
                    (23, "IQ4_XS"),
                    (24, "I8"),
                    (25, "I16"),
                    (26, "I32"),
                    (27, "I64"),
                    (28, "F64"),
                    (29, "IQ1_M"),
                ];
                match known.iter().find(|(k, _)| *k == c) {
                    Some((_, n)) => format!("{n} (ggml type {c})"),
                    None => format!("ggml type {c}"),
                }
            }
        }
    }

    /// `(elements per block, bytes per block)`, for the types this reader knows.
    pub fn block(self) -> Option<(usize, usize)> {
        Some(match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Other(_) => return None,
        })
    }
}

/// One entry of the tensor directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Its shape, in PyTorch's order (the fastest-varying dim last).
    pub shape: Vec<usize>,
    /// How its elements are stored.
    pub ggml_type: GgmlType,
    /// Where its bytes start, from the start of the data section.
    pub offset: u64,
    /// How many bytes it takes (`None` for types this reader does not know).
    pub bytes: Option<usize>,
}

/// A GGUF file mapped into memory.
pub struct GgufFile {
    file: MappedFile,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    index: HashMap<String, usize>,
    data_start: usize,
}

/// Reads the header's fields one after the other, each checked against the bytes left.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> std::result::Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "the file ends inside {what} (at byte {}, {} bytes long)",
                    self.at,
                    self.bytes.len()
                )
            })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> std::result::Result<[u8; N], String> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items of at least `min_size` bytes each, refused when they could not fit
    /// in the bytes left (a corrupt count must not allocate).
    fn count(&mut self, min_size: usize, what: &str) -> std::result::Result<usize, String> {
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.at) as u64;
        if n.saturating_mul(min_size.max(1) as u64) > left {
            return Err(format!(
                "{what} is {n}, more than the {left} bytes left could hold"
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> std::result::Result<String, String> {
        let n = self.count(1, what)?;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }

    fn value(
        &mut self,
        ty: u32,
        what: &str,
        depth: usize,
    ) -> std::result::Result<GgufValue, String> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(what)?[0]),
            1 => GgufValue::I8(self.array::<1>(what)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            4 => GgufValue::U32(self.u32(what)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(format!("{what} is a bool of byte {b}")),
            },
            8 => GgufValue::String(self.string(what)?),
            9 => {
                if depth > 0 {
                    return Err(format!("{what} nests arrays"));
                }
                let elem = self.u32(what)?;
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    _ => 8,
                };
                let n = self.count(min, what)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(elem, what, depth + 1)?);
                }
                GgufValue::Array(v)
            }
            10 => GgufValue::U64(self.u64(what)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            t => return Err(format!("{what} has the unknown value type {t}")),
        })
    }
}

fn format_err(path: &Path, reason: impl Into<String>) -> Error {
    Error::Format {
        path: path.display().to_string(),
        format: "GGUF",
        reason: reason.into(),
    }
}

impl GgufFile {
    /// Maps and reads the header of `path`; an error names the file and what is wrong.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let file = MappedFile::open(path)?;
        let parsed = parse(file.bytes()).map_err(|why| format_err(path, why))?;
        let (version, metadata, tensors, data_start) = parsed;
        let index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            file,
            version,
            metadata,
            tensors,
            index,
            data_start,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// One metadata value.
    pub fn meta(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// The tensor directory, in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// One tensor's directory entry.
    pub fn info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    fn entry(&self, name: &str) -> Result<&GgufTensorInfo> {
        self.info(name).ok_or_else(|| {
            format_err(
                self.file.path(),
                format!("no tensor named {name:?} ({} tensors)", self.tensors.len()),
            )
        })
    }

    /// A tensor's bytes as stored (quantised blocks included).
    pub fn raw(&self, name: &str) -> Result<&[u8]> {
        let t = self.entry(name)?;
        let bytes = t.bytes.ok_or_else(|| self.unsupported(t))?;
        let start = self.data_start + t.offset as usize;
        Ok(&self.file.bytes()[start..start + bytes])
    }

    fn unsupported(&self, t: &GgufTensorInfo) -> Error {
        format_err(
            self.file.path(),
            format!(
                "tensor {:?} is stored as {}, which tpu-rs does not read (it reads F32, F16, \
                 BF16, Q8_0, Q4_0 and Q4_1)",
                t.name,
                t.ggml_type.name()
            ),
        )
    }

    /// A tensor dequantised to f32, on `device`.
    pub fn dequantize(&self, name: &str, device: &Device) -> Result<Tensor> {
        let t = self.entry(name)?;
        if t.bytes.is_none() {
            return Err(self.unsupported(t));
        }
        let raw = self.raw(name)?;
        let numel: usize = t.shape.iter().product();
        let values = dequantize(t.ggml_type, raw, numel).ok_or_else(|| self.unsupported(t))?;
        Ok(Tensor::from_buffer(Buffer::from_bytes(
            device,
            DType::F32,
            &t.shape,
            bytemuck::cast_slice(&values),
        )?))
    }
}

type Parsed = (u32, BTreeMap<String, GgufValue>, Vec<GgufTensorInfo>, usize);

fn parse(bytes: &[u8]) -> std::result::Result<Parsed, String> {
    let mut c = Cursor { bytes, at: 0 };
    if c.take(4, "the magic number")? != MAGIC {
        return Err("not a GGUF file (the first bytes are not \"GGUF\")".into());
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(format!("version {version}, tpu-rs reads versions 2 and 3"));
    }
    // A tensor entry takes at least 24 bytes, a metadata entry at least 13.
    let n_tensors = c.count(24, "the tensor count")?;
    let n_kv = c.count(13, "the metadata count")?;
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key {i}"))?;
        let ty = c.u32(&format!("the type of {key:?}"))?;
        let v = c.value(ty, &format!("metadata {key:?}"), 0)?;
        metadata.insert(key, v);
    }
    let mut tensors = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&format!("the name of tensor {i}"))?;
        let what = format!("tensor {name:?}");
        let n_dims = c.u32(&what)?;
        if n_dims > 8 {
            return Err(format!("{what} has {n_dims} dims"));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = c.u64(&what)?;
            dims.push(usize::try_from(d).map_err(|_| format!("{what} has a dim of {d}"))?);
        }
        let ggml_type = GgmlType::from_code(c.u32(&what)?);
        let offset = c.u64(&what)?;
        dims.reverse();
        let numel = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| format!("{what} has more elements than the address space"))?;
        let bytes = match ggml_type.block() {
            Some((per, size)) => {
                let row = dims.last().copied().unwrap_or(1);
                if !row.is_multiple_of(per) {
                    return Err(format!(
                        "{what} has rows of {row} elements, not a multiple of the {per}-element \
                         blocks of {}",
                        ggml_type.name()
                    ));
                }
                Some(numel / per * size)
            }
            None => None,
        };
        tensors.push(GgufTensorInfo {
            name,
            shape: dims,
            ggml_type,
            offset,
            bytes,
        });
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => v
            .as_u64()
            .filter(|a| a.is_power_of_two())
            .ok_or_else(|| format!("general.alignment is {v:?}, not a power of two"))?,
    };
    let data_start = (c.at as u64).next_multiple_of(alignment);
    let data_len = (bytes.len() as u64).saturating_sub(data_start);
    for t in &tensors {
        if t.offset % alignment != 0 {
            return Err(format!(
                "tensor {:?} starts at {}, not a multiple of the alignment {alignment}",
                t.name, t.offset
            ));
        }
        if let Some(b) = t.bytes
            && t.offset
                .checked_add(b as u64)
                .is_none_or(|end| end > data_len)
        {
            return Err(format!(
                "tensor {:?} ({} bytes at {}) ends past the data section ({data_len} bytes): \
                 the file is truncated",
                t.name, b, t.offset
            ));
        }
    }
    Ok((version, metadata, tensors, data_start as usize))
}

fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// `numel` f32 values from `raw` stored as `ty` (its length already checked); `None` for a type
/// this reader does not dequantise.
pub fn dequantize(ty: GgmlType, raw: &[u8], numel: usize) -> Option<Vec<f32>> {
    let mut out = vec![0f32; numel];
    match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        GgmlType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(raw.chunks_exact(34)) {
                let d = half_at(b, 0);
                for (x, &q) in o.iter_mut().zip(&b[2..]) {
                    *x = (q as i8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(raw.chunks_exact(18)) {
                let d = half_at(b, 0);
                let (lo, hi) = o.split_at_mut(16);
                for (j, &q) in b[2..].iter().enumerate() {
                    lo[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
                    hi[j] = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(32).zip(raw.chunks_exact(20)) {
                let (d, m) = (half_at(b, 0), half_at(b, 2));
                let (lo, hi) = o.split_at_mut(16);
                for (j, &q) in b[4..].iter().enumerate() {
                    lo[j] = (q & 0x0f) as f32 * d + m;
                    hi[j] = (q >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Other(_) => return None,
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF file built field by field.
    #[derive(Default)]
    struct Writer {
        kv: Vec<u8>,
        n_kv: u64,
        infos: Vec<u8>,
        n_tensors: u64,
        data: Vec<u8>,
    }

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    impl Writer {
        fn kv(&mut self, key: &str, ty: u32, value: &[u8]) {
            string(&mut self.kv, key);
            self.kv.extend(ty.to_le_bytes());
            self.kv.extend(value);
            self.n_kv += 1;
        }

        fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, bytes: &[u8]) {
            while !self.data.len().is_multiple_of(32) {
                self.data.push(0);
            }
            string(&mut self.infos, name);
            self.infos.extend((ne.len() as u32).to_le_bytes());
            for d in ne {
                self.infos.extend(d.to_le_bytes());
            }
            self.infos.extend(ty.to_le_bytes());
            self.infos.extend((self.data.len() as u64).to_le_bytes());
            self.data.extend(bytes);
            self.n_tensors += 1;
        }

        fn finish(&self) -> Vec<u8> {
            let mut out = b"GGUF".to_vec();
            out.extend(3u32.to_le_bytes());
            out.extend(self.n_tensors.to_le_bytes());
            out.extend(self.n_kv.to_le_bytes());
            out.extend(&self.kv);
            out.extend(&self.infos);
            while !out.len().is_multiple_of(32) {
                out.push(0);
            }
            out.extend(&self.data);
            out
        }
    }

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_bits().to_le_bytes()
    }

    fn sample() -> Vec<u8> {
        let mut w = Writer::default();
        let mut s = Vec::new();
        string(&mut s, "llama");
        w.kv("general.architecture", 8, &s);
        w.kv("llama.block_count", 4, &30u32.to_le_bytes());
        w.kv("llama.rope.freq_base", 6, &100000f32.to_le_bytes());
        w.kv("tokenizer.ggml.add_bos_token", 7, &[0]);
        let mut arr = 8u32.to_le_bytes().to_vec();
        arr.extend(2u64.to_le_bytes());
        string(&mut arr, "a");
        string(&mut arr, "bc");
        w.kv("tokenizer.ggml.tokens", 9, &arr);
        // Q8_0: scale 0.5, values -16..16.
        let mut q8 = h(0.5).to_vec();
        q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
        w.tensor("q8", &[32, 1], 8, &q8);
        // Q4_0: scale 2, nibbles j (low) and 15 - j (high).
        let mut q40 = h(2.0).to_vec();
        q40.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        w.tensor("q40", &[32], 2, &q40);
        // Q4_1: scale 0.25, minimum -1, nibbles j and j.
        let mut q41 = h(0.25).to_vec();
        q41.extend(h(-1.0));
        q41.extend((0..16u8).map(|j| j | (j << 4)));
        w.tensor("q41", &[32], 3, &q41);
        let f32s: Vec<u8> = [1.5f32, -2.0, 3.25, 0.0, 7.0, 8.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        w.tensor("f32", &[3, 2], 0, &f32s);
        w.tensor("f16", &[2], 1, &[h(0.5), h(-3.0)].concat());
        let b: Vec<u8> = [bf16::from_f32(2.5), bf16::from_f32(-0.125)]
            .iter()
            .flat_map(|x| x.to_bits().to_le_bytes())
            .collect();
        w.tensor("bf16", &[2], 30, &b);
        // Q4_K (ggml type 12): opens, but is not dequantised.
        w.tensor("q4k", &[256], 12, &[0u8; 144]);
        w.finish()
    }

    fn open(bytes: &[u8], name: &str) -> Result<GgufFile> {
        let dir = std::env::temp_dir().join(format!("tpu-rs-gguf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        GgufFile::open(&path)
    }

    fn values(f: &GgufFile, name: &str) -> Vec<f32> {
        f.dequantize(name, &Device::cpu())
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    }

    #[test]
    fn metadata_shapes_and_every_type_read_back() {
        let f = open(&sample(), "sample.gguf").unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(
            f.meta("general.architecture").unwrap().as_str(),
            Some("llama")
        );
        assert_eq!(f.meta("llama.block_count").unwrap().as_u64(), Some(30));
        assert_eq!(
            f.meta("llama.rope.freq_base").unwrap().as_f64(),
            Some(100000.0)
        );
        assert_eq!(
            f.meta("tokenizer.ggml.add_bos_token").unwrap().as_bool(),
            Some(false)
        );
        let tokens = f.meta("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
        assert_eq!(tokens[1].as_str(), Some("bc"));
        assert_eq!(f.info("f32").unwrap().shape, [2, 3]);
        assert_eq!(f.info("q8").unwrap().shape, [1, 32]);
        let want: Vec<f32> = (0..32).map(|i| (i - 16) as f32 * 0.5).collect();
        assert_eq!(values(&f, "q8"), want);
        let mut want: Vec<f32> = (0..16).map(|j| (j - 8) as f32 * 2.0).collect();
        want.extend((0..16).map(|j| (7 - j) as f32 * 2.0));
        assert_eq!(values(&f, "q40"), want);
        let half: Vec<f32> = (0..16).map(|j| j as f32 * 0.25 - 1.0).collect();
        assert_eq!(values(&f, "q41"), [half.clone(), half].concat());
        assert_eq!(values(&f, "f32"), [1.5, -2.0, 3.25, 0.0, 7.0, 8.0]);
        assert_eq!(values(&f, "f16"), [0.5, -3.0]);
        assert_eq!(values(&f, "bf16"), [2.5, -0.125]);
        let err = f.dequantize("q4k", &Device::cpu()).unwrap_err().to_string();
        assert!(err.contains("\"q4k\"") && err.contains("Q4_K"), "{err}");
        let err = f
            .dequantize("nope", &Device::cpu())
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"nope\""), "{err}");
    }

    #[test]
    fn truncated_and_corrupt_files_are_errors_that_say_what_is_wrong() {
        let good = sample();
        let err = |bytes: &[u8], name: &str| open(bytes, name).err().unwrap().to_string();
        // Cut inside the last tensor's bytes, and inside the header.
        let e = err(&good[..good.len() - 180], "cut.gguf");
        assert!(e.contains("cut.gguf") && e.contains("truncated"), "{e}");
        let e = err(&good[..300], "header.gguf");
        assert!(e.contains("ends inside"), "{e}");
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(err(&bad, "magic.gguf").contains("not a GGUF file"));
        // A tensor count no file could hold.
        let mut bad = good.clone();
        bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = err(&bad, "count.gguf");
        assert!(e.contains("tensor count"), "{e}");
        // A string length past the end.
        let mut bad = good;
        bad[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let e = err(&bad, "key.gguf");
        assert!(e.contains("metadata key 0"), "{e}");
    }
}
