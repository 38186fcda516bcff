//! SmolLM2-135M-Instruct (its GGUF file, dequantised to f32) against transformers on the same
//! file: token ids, logits, the KV cache, and greedy generation, on the native CPU and on PJRT.
//!
//! The model comes from the model cache (`TPU_RS_MODELS`); CI installs it first and sets
//! `TPU_RS_REQUIRE_MODELS=1`, which makes a missing model a failure instead of a skip.
//! The literals come from transformers 5.24 (torch 2.15, f32; gguf and accelerate installed):
//!
//! ```python
//! tok = AutoTokenizer.from_pretrained(d, gguf_file=g)
//! model = AutoModelForCausalLM.from_pretrained(d, gguf_file=g, dtype=torch.float32).eval()
//! ids = tok("The capital of France is", return_tensors="pt").input_ids
//! lg = model(ids).logits                            # lg[0, 0, :6], lg[0, -1, :6]
//! model.generate(ids, max_new_tokens=12, do_sample=False)
//! ```

use tpu_rs::models::{KvCache, Llama, SMOLLM2, Sampling, TextTokenizer};
use tpu_rs::prelude::*;
use tpu_rs::tpu_tensor::GgufFile;

mod common;

const PROMPT: &str = "The capital of France is";
const PROMPT_IDS: [u32; 5] = [504, 3575, 282, 4649, 314];
const FIRST_LOGITS: [f32; 6] = [15.65529, 6.82449, 10.59123, 5.10946, 6.59446, 6.25756];
const LAST_LOGITS: [f32; 6] = [1.61364, -11.87187, -7.94445, -9.34691, -10.08523, -10.81282];
/// " Paris.\n\nThe answer is: 201"
const GREEDY: [u32; 12] = [7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34, 32, 33];

fn model(dev: &Device) -> Option<(Llama, TextTokenizer)> {
    let path = common::model_or_skip(&SMOLLM2)?;
    let tok = TextTokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    Some((Llama::from_gguf(&path, dev).unwrap(), tok))
}

fn close(what: &str, got: &[f32], want: &[f32], rel: f32) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = rel * w.abs().max(1.0);
        assert!(
            (g - w).abs() <= tol,
            "{what}[{i}]: got {g}, want {w} (±{tol})\n{got:?}"
        );
    }
}

fn row(logits: &Tensor, pos: i64) -> Vec<f32> {
    logits
        .select(0, 0)
        .unwrap()
        .select(0, pos)
        .unwrap()
        .to_device(&Device::cpu())
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

fn check(dev: &Device) {
    let Some((llama, tok)) = model(dev) else {
        return;
    };
    assert_eq!(tok.encode(PROMPT, true).unwrap(), PROMPT_IDS);
    let ids = Tensor::from_vec(PROMPT_IDS.map(|i| i as i64).to_vec(), [1, 5], dev).unwrap();
    let logits = llama.forward(&ids, &mut KvCache::new(), false).unwrap();
    assert_eq!(logits.shape(), [1, 5, 49152]);
    let last = row(&logits, 4);
    close("logits[0, 0]", &row(&logits, 0)[..6], &FIRST_LOGITS, 1e-3);
    close("logits[0, 4]", &last[..6], &LAST_LOGITS, 1e-3);
    // The cache: 3 tokens, then 2 one at a time, give the last position's logits again.
    let mut cache = KvCache::new();
    llama
        .forward(&ids.narrow(1, 0, 3).unwrap(), &mut cache, true)
        .unwrap();
    llama
        .forward(&ids.narrow(1, 3, 1).unwrap(), &mut cache, true)
        .unwrap();
    let step = llama
        .forward(&ids.narrow(1, 4, 1).unwrap(), &mut cache, true)
        .unwrap();
    assert_eq!(cache.len(), 5);
    close("cached logits[0, 4]", &row(&step, 0), &last, 1e-4);
    // Two new tokens after a cached prefix at once (a causal mask over the cache).
    let mut cache = KvCache::new();
    llama
        .forward(&ids.narrow(1, 0, 3).unwrap(), &mut cache, true)
        .unwrap();
    let two = llama
        .forward(&ids.narrow(1, 3, 2).unwrap(), &mut cache, false)
        .unwrap();
    close("chunked logits[0, 4]", &row(&two, 1), &last, 1e-4);
    let stop = [tok.token_id("<|endoftext|>").unwrap()];
    let mut text = String::new();
    let g = llama
        .generate_greedy(&tok, PROMPT, 12, &stop, |t| text.push_str(t))
        .unwrap();
    assert_eq!(g.ids, GREEDY);
    assert_eq!(text, " Paris.\n\nThe answer is: 201");
}

#[test]
fn the_gguf_tokenizer_matches_transformers() {
    let Some(path) = common::model_or_skip(&SMOLLM2) else {
        return;
    };
    let tok = TextTokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let cases: [(&str, &[u32]); 3] = [
        (
            "Hello 2024 world!  x",
            &[19556, 216, 34, 32, 34, 36, 905, 17, 216, 1792],
        ),
        ("<|im_start|>user\nhi<|im_end|>", &[1, 4093, 198, 6004, 2]),
        (PROMPT, &PROMPT_IDS),
    ];
    for (text, ids) in cases {
        assert_eq!(tok.encode(text, true).unwrap(), ids, "{text:?}");
        assert_eq!(tok.decode(ids, false).unwrap(), text);
    }
}

#[test]
fn seeded_sampling_repeats_and_top_k_1_is_greedy() {
    let Some((llama, tok)) = model(&Device::cpu()) else {
        return;
    };
    let run = |s: Sampling| {
        llama
            .generate(&tok, PROMPT, 8, &[], &s, |_| {})
            .unwrap()
            .ids
    };
    let hot = Sampling {
        temperature: 1.0,
        top_p: 0.95,
        seed: 11,
        ..Sampling::default()
    };
    assert_eq!(run(hot.clone()), run(hot.clone()));
    let one = Sampling { top_k: 1, ..hot };
    assert_eq!(run(one), GREEDY[..8]);
}

#[test]
fn smollm2_matches_transformers_on_cpu() {
    check(&Device::cpu());
}

#[test]
fn smollm2_matches_transformers_on_pjrt() {
    if let Some(dev) = tpu_rs::tpu_ops::testing::pjrt_device("smollm2 on pjrt") {
        check(&dev);
    }
}
