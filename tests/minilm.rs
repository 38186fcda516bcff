//! all-MiniLM-L6-v2 against transformers: token ids, the last hidden state at chosen positions,
//! and sentence embeddings, on the native CPU and on PJRT (XLA's CPU plugin).
//!
//! The model comes from the model cache (`TPU_RS_MODELS`); CI installs it first and sets
//! `TPU_RS_REQUIRE_MODELS=1`, which makes a missing model a failure instead of a skip.
//!
//! The literals come from transformers 5.24 (torch 2.15, f32) on the same folder:
//!
//! ```python
//! from transformers import AutoTokenizer, AutoModel
//! tok = AutoTokenizer.from_pretrained(p); model = AutoModel.from_pretrained(p).eval()
//! enc = tok(SENTENCES, padding=True, return_tensors="pt")
//! h = model(**enc).last_hidden_state            # h[0, 0, :6], h[0, 5, 100:106], h[1, 3, -6:]
//! m = enc["attention_mask"].unsqueeze(-1).float()
//! e = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=1)
//! ```

use tpu_rs::models::{MINILM, SentenceEncoder};
use tpu_rs::prelude::*;

mod common;

const SENTENCES: [&str; 3] = [
    "The quick brown fox jumps over the lazy dog.",
    "Rust is fast.",
    "A sentence that is quite a bit longer than the other two, with commas.",
];

const IDS: [&[u32]; 3] = [
    &[
        101, 1996, 4248, 2829, 4419, 14523, 2058, 1996, 13971, 3899, 1012, 102,
    ],
    &[101, 18399, 2003, 3435, 1012, 102],
    &[
        101, 1037, 6251, 2008, 2003, 3243, 1037, 2978, 2936, 2084, 1996, 2060, 2048, 1010, 2007,
        4012, 9335, 1012, 102,
    ],
];

/// `(sentence, position, first hidden dim, values)` of the padded batch's last hidden state.
const HIDDEN: [(usize, usize, usize, [f32; 6]); 3] = [
    (
        0,
        0,
        0,
        [0.046444, 0.338061, 0.208205, 0.646797, -0.19571, -0.037074],
    ),
    (
        0,
        5,
        100,
        [-0.035732, 0.238277, 0.503205, 0.421415, -0.700345, 0.649488],
    ),
    (
        1,
        3,
        378,
        [0.346314, -0.15511, 0.49951, 0.058353, 0.412677, 0.578421],
    ),
];

/// The first 8 values of each sentence's embedding.
const EMBEDDINGS: [[f32; 8]; 3] = [
    [
        0.043934, 0.058934, 0.048178, 0.077548, 0.026744, -0.03763, -0.002605, -0.059943,
    ],
    [
        -0.020742, 0.05046, 0.059341, 0.099926, 0.061006, -0.01628, 0.016039, -0.01158,
    ],
    [
        0.097892, 0.098929, 0.02825, -0.026531, 0.013169, -0.010236, -0.029747, 0.039461,
    ],
];

fn encoder(dev: &Device) -> Option<SentenceEncoder> {
    let folder = common::model_or_skip(&MINILM)?;
    Some(SentenceEncoder::from_folder(&folder, dev).unwrap())
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "{what}[{i}]: got {g}, want {w} (±{tol})\n{got:?}"
        );
    }
}

fn check(dev: &Device) {
    let Some(enc) = encoder(dev) else { return };
    for (s, ids) in SENTENCES.iter().zip(IDS) {
        assert_eq!(enc.tokenizer.encode(s, true).unwrap(), ids, "{s}");
    }
    let batch = enc.tokenize(&SENTENCES).unwrap();
    assert_eq!(batch.len, 19);
    let (ids, mask) = batch.tensors(dev).unwrap();
    let hidden = enc.bert.forward(&ids, &mask).unwrap();
    assert_eq!(hidden.shape(), [3, 19, 384]);
    let cpu = Device::cpu();
    for (s, pos, from, want) in HIDDEN {
        let got = hidden
            .select(0, s as i64)
            .unwrap()
            .select(0, pos as i64)
            .unwrap()
            .narrow(0, from as i64, 6)
            .unwrap()
            .to_device(&cpu)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        close(&format!("hidden[{s}, {pos}, {from}..]"), &got, &want, 1e-4);
    }
    let all = enc.embed(&SENTENCES).unwrap().to_device(&cpu).unwrap();
    assert_eq!(all.shape(), [3, 384]);
    let rows = all.to_vec::<f32>().unwrap();
    for (i, want) in EMBEDDINGS.iter().enumerate() {
        close(
            &format!("embedding {i}"),
            &rows[i * 384..i * 384 + 8],
            want,
            1e-4,
        );
        let norm: f32 = rows[i * 384..(i + 1) * 384].iter().map(|x| x * x).sum();
        assert!(
            (norm - 1.0).abs() < 1e-5,
            "embedding {i} has squared norm {norm}"
        );
    }
    // A padded batch gives each sentence's embedding alone.
    for (i, s) in SENTENCES.iter().enumerate() {
        let one = enc.embed(&[s]).unwrap().to_device(&cpu).unwrap();
        close(
            &format!("sentence {i} alone"),
            &one.to_vec::<f32>().unwrap(),
            &rows[i * 384..(i + 1) * 384],
            1e-5,
        );
    }
}

#[test]
fn minilm_matches_transformers_on_cpu() {
    check(&Device::cpu());
}

#[test]
fn minilm_matches_transformers_on_pjrt() {
    if let Some(dev) = tpu_rs::tpu_ops::testing::pjrt_device("minilm on pjrt") {
        check(&dev);
    }
}

#[test]
fn a_missing_tensor_or_a_wrong_shape_names_the_file_and_tensor() {
    let Some(folder) = common::model_or_skip(&MINILM) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("tpu-rs-minilm-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut config = std::fs::read_to_string(folder.join("config.json")).unwrap();
    std::fs::copy(
        folder.join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    // One layer more than the checkpoint has.
    config = config.replace("\"num_hidden_layers\": 6", "\"num_hidden_layers\": 7");
    std::fs::write(dir.join("config.json"), &config).unwrap();
    let err = tpu_rs::models::Bert::from_folder(&dir, &Device::cpu())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("encoder.layer.6.attention.self.query.weight"),
        "{err}"
    );
    // A wider model than the checkpoint.
    config = config
        .replace("\"num_hidden_layers\": 7", "\"num_hidden_layers\": 6")
        .replace("\"intermediate_size\": 1536", "\"intermediate_size\": 2048");
    std::fs::write(dir.join("config.json"), &config).unwrap();
    let err = tpu_rs::models::Bert::from_folder(&dir, &Device::cpu())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("intermediate.dense.weight"),
        "{err}"
    );
    // A truncated file.
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let err = tpu_rs::models::Bert::from_folder(&dir, &Device::cpu())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("model.safetensors"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
