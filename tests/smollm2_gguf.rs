//! The SmolLM2-135M-Instruct GGUF file read and dequantised against the `gguf` Python package
//! (the reader llama.cpp ships), on a real checkpoint.
//!
//! The model comes from the model cache (`TPU_RS_MODELS`); CI installs it first and sets
//! `TPU_RS_REQUIRE_MODELS=1`, which makes a missing model a failure instead of a skip.
//! The literals come from gguf 0.x with numpy:
//!
//! ```python
//! r = gguf.GGUFReader(path); t = [x for x in r.tensors if x.name == name][0]
//! d = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
//! d.reshape(-1)[:6], d.reshape(-1)[-3:], d.astype(np.float64).sum()
//! ```

// The literals are the exact values Python printed, compared bit for bit.
#![allow(clippy::excessive_precision)]

use tpu_rs::models::SMOLLM2;
use tpu_rs::prelude::*;
use tpu_rs::tpu_tensor::{GgmlType, GgufFile};

mod common;

fn file() -> Option<GgufFile> {
    let path = common::model_or_skip(&SMOLLM2)?;
    Some(GgufFile::open(path).unwrap())
}

/// `(tensor, type, shape, first 6, last 3, sum in f64)`.
type Case = (&'static str, GgmlType, [usize; 2], [f32; 6], [f32; 3], f64);

const CASES: [Case; 4] = [
    (
        "token_embd.weight",
        GgmlType::Q8_0,
        [49152, 576],
        [
            -0.10654449462890625,
            0.032978057861328125,
            0.048198699951171875,
            -0.022830963134765625,
            -0.06849288940429688,
            -0.04566192626953125,
        ],
        [
            0.12858200073242188,
            -0.11989402770996094,
            -0.0417022705078125,
        ],
        -15353.04449415207,
    ),
    (
        "blk.0.attn_q.weight",
        GgmlType::Q4_1,
        [576, 576],
        [
            -0.0963134765625,
            0.1573486328125,
            -0.0963134765625,
            -0.73046875,
            1.1719970703125,
            -0.0963134765625,
        ],
        [-0.096832275390625, -0.14984130859375, -0.255859375],
        59.22322082519531,
    ),
    (
        "blk.0.ffn_down.weight",
        GgmlType::Q4_1,
        [576, 1536],
        [
            -0.330810546875,
            0.3460693359375,
            0.0753173828125,
            -0.4661865234375,
            -0.06005859375,
            -0.330810546875,
        ],
        [-0.2421875, -0.0901336669921875, -0.181365966796875],
        150.63577270507812,
    ),
    (
        "blk.3.attn_k.weight",
        GgmlType::Q4_1,
        [192, 576],
        [
            0.1629638671875,
            0.06451416015625,
            0.015289306640625,
            0.06451416015625,
            0.113739013671875,
            0.113739013671875,
        ],
        [-0.0982666015625, 0.60980224609375, -0.5703125],
        -52.82200622558594,
    ),
];

#[test]
fn smollm2_metadata_and_tensor_directory() {
    let Some(f) = file() else { return };
    assert_eq!(f.version(), 3);
    let u = |k: &str| f.meta(k).and_then(|v| v.as_u64()).unwrap();
    assert_eq!(
        f.meta("general.architecture").unwrap().as_str(),
        Some("llama")
    );
    assert_eq!(
        [
            u("llama.block_count"),
            u("llama.embedding_length"),
            u("llama.feed_forward_length"),
            u("llama.attention.head_count"),
            u("llama.attention.head_count_kv"),
            u("llama.context_length"),
        ],
        [30, 576, 1536, 9, 3, 8192]
    );
    let base = f.meta("llama.rope.freq_base").unwrap().as_f64().unwrap();
    assert_eq!(base, 100000.0);
    let tokens = f.meta("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(
        f.meta("tokenizer.ggml.merges")
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        48900
    );
    let template = f.meta("tokenizer.chat_template").unwrap().as_str().unwrap();
    assert!(template.contains("<|im_start|>"), "{template}");
    let count = |t: GgmlType| f.tensors().iter().filter(|i| i.ggml_type == t).count();
    assert_eq!(f.tensors().len(), 272);
    assert_eq!(
        (
            count(GgmlType::Q8_0),
            count(GgmlType::F32),
            count(GgmlType::Q4_1)
        ),
        (1, 61, 210)
    );
}

#[test]
fn smollm2_tensors_dequantise_as_gguf_does() {
    let Some(f) = file() else { return };
    for (name, ty, shape, first, last, sum) in CASES {
        let info = f.info(name).unwrap();
        assert_eq!(
            (info.ggml_type, &info.shape[..]),
            (ty, &shape[..]),
            "{name}"
        );
        let t = f.dequantize(name, &Device::cpu()).unwrap();
        assert_eq!(t.shape(), shape);
        let v = t.to_vec::<f32>().unwrap();
        assert_eq!(v[..6], first, "{name}");
        assert_eq!(v[v.len() - 3..], last, "{name}");
        let s: f64 = v.iter().map(|&x| x as f64).sum();
        assert!(
            (s - sum).abs() <= 1e-9 * sum.abs().max(1.0),
            "{name}: sum {s}, want {sum}"
        );
    }
}
