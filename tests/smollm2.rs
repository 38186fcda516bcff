//! SmolLM2-135M-Instruct (its Q4_1 GGUF file) against transformers on the same file, which
//! dequantises it to f32: token ids, logits, the KV cache, and greedy generation, on the native
//! CPU with the weights kept quantised (f32 activations: the same numbers up to rounding) and
//! dequantised, and on PJRT (dequantised).
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

use tpu_rs::models::{
    ChatMessage, ChatTemplate, FinishReason, GenerateOptions, KvCache, Llama, SMOLLM2, Sampling,
    TextTokenizer, WeightFormat,
};
use tpu_rs::prelude::*;
use tpu_rs::tpu_tensor::GgufFile;

mod common;

const PROMPT: &str = "The capital of France is";
const PROMPT_IDS: [u32; 5] = [504, 3575, 282, 4649, 314];
const FIRST_LOGITS: [f32; 6] = [15.65529, 6.82449, 10.59123, 5.10946, 6.59446, 6.25756];
const LAST_LOGITS: [f32; 6] = [1.61364, -11.87187, -7.94445, -9.34691, -10.08523, -10.81282];
/// " Paris.\n\nThe answer is: 201"
const GREEDY: [u32; 12] = [7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34, 32, 33];

fn model(dev: &Device, format: WeightFormat) -> Option<(Llama, TextTokenizer)> {
    let path = common::model_or_skip(&SMOLLM2)?;
    let tok = TextTokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    Some((Llama::from_gguf_with(&path, dev, format).unwrap(), tok))
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

fn check(dev: &Device, format: WeightFormat) {
    let Some((llama, tok)) = model(dev, format) else {
        return;
    };
    // Q4_1 and Q8_0 blocks take 0.6 and 1.1 bytes a weight; f32 takes 4 (135 M weights).
    let quantized = dev.is_cpu() && format != WeightFormat::F32;
    assert_eq!(llama.is_quantized(), quantized);
    let mb = llama.nbytes() / 1_000_000;
    assert!(if quantized { mb < 110 } else { mb > 500 }, "{mb} MB");
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
    let Some((llama, tok)) = model(&Device::cpu(), WeightFormat::Auto) else {
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
fn smollm2_matches_transformers_on_cpu_with_quantized_weights() {
    check(&Device::cpu(), WeightFormat::Auto);
}

#[test]
fn smollm2_matches_transformers_on_cpu_with_f32_weights() {
    check(&Device::cpu(), WeightFormat::F32);
}

#[test]
fn smollm2_matches_transformers_on_pjrt() {
    if let Some(dev) = tpu_rs::tpu_ops::testing::pjrt_device("smollm2 on pjrt") {
        check(&dev, WeightFormat::Auto);
        let e = Llama::from_gguf_with(
            &common::model_or_skip(&SMOLLM2).unwrap(),
            &dev,
            WeightFormat::Quantized,
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("run on the native CPU"), "{e}");
    }
}

/// transformers' `apply_chat_template` on the GGUF's template (`/tmp`-free snippet):
///
/// ```python
/// one = [{"role": "user", "content": "What is the capital of France?"}]
/// multi = [{"role": "system", "content": "Answer in one word."},
///          {"role": "user", "content": "Capital of Italy?"},
///          {"role": "assistant", "content": "Rome"},
///          {"role": "user", "content": "And Spain? ünïcødé"}]
/// tok.apply_chat_template(one, tokenize=False, add_generation_prompt=True)
/// tok.apply_chat_template(multi, tokenize=False, add_generation_prompt=False)
/// ids = tok.apply_chat_template(one, add_generation_prompt=True, return_tensors="pt",
///                               return_dict=True)["input_ids"]
/// model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:]
/// ```
const CHAT_ONE: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained \
                        by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of \
                        France?<|im_end|>\n<|im_start|>assistant\n";
const CHAT_MULTI: &str = "<|im_start|>system\nAnswer in one word.<|im_end|>\n<|im_start|>user\n\
                          Capital of Italy?<|im_end|>\n<|im_start|>assistant\nRome<|im_end|>\n\
                          <|im_start|>user\nAnd Spain? ünïcødé<|im_end|>\n";
const CHAT_IDS: [u32; 37] = [
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
    19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531,
    198,
];
/// "The capital of France is Paris.<|im_end|>"
const CHAT_ANSWER: [u32; 8] = [504, 3575, 282, 4649, 314, 7042, 30, 2];

#[test]
fn the_chat_template_renders_like_transformers_and_the_answer_matches() {
    let Some((llama, tok)) = model(&Device::cpu(), WeightFormat::Auto) else {
        return;
    };
    let f = GgufFile::open(common::model_or_skip(&SMOLLM2).unwrap()).unwrap();
    let t = ChatTemplate::from_gguf(&f).unwrap().unwrap();
    let one = [ChatMessage::user("What is the capital of France?")];
    assert_eq!(t.render(&one, true).unwrap(), CHAT_ONE);
    let multi = [
        ChatMessage::system("Answer in one word."),
        ChatMessage::user("Capital of Italy?"),
        ChatMessage::assistant("Rome"),
        ChatMessage::user("And Spain? ünïcødé"),
    ];
    assert_eq!(t.render(&multi, false).unwrap(), CHAT_MULTI);
    assert_eq!(tok.encode(CHAT_ONE, false).unwrap(), CHAT_IDS);
    let opts = GenerateOptions {
        max_new: 16,
        stop_tokens: vec![tok.token_id("<|im_end|>").unwrap()],
        ..GenerateOptions::default()
    };
    let mut streamed = String::new();
    let g = llama
        .generate_chat(&tok, &t, &one, &opts, |s| streamed.push_str(s))
        .unwrap();
    assert_eq!(g.prompt_tokens, CHAT_IDS.len());
    assert_eq!(g.ids, CHAT_ANSWER);
    assert_eq!(g.finish, FinishReason::Stop);
    assert_eq!(g.text, "The capital of France is Paris.");
    assert_eq!(streamed, g.text);
}

#[test]
fn stop_strings_cut_the_text_and_are_never_streamed() {
    let Some((llama, tok)) = model(&Device::cpu(), WeightFormat::Auto) else {
        return;
    };
    let ids = tok.encode(PROMPT, true).unwrap();
    let run = |stop: &[&str], max_new: usize| {
        let opts = GenerateOptions {
            max_new,
            stop_strings: stop.iter().map(|s| s.to_string()).collect(),
            ..GenerateOptions::default()
        };
        let mut streamed = String::new();
        let g = llama
            .generate_with(&tok, &ids, &opts, |s| streamed.push_str(s))
            .unwrap();
        assert_eq!(streamed, g.text, "stop {stop:?}");
        g
    };
    // Greedy: " Paris.\n\nThe answer is: 201".
    let g = run(&["answer", "zzz"], 12);
    assert_eq!(
        (g.text.as_str(), g.finish),
        (" Paris.\n\nThe ", FinishReason::Stop)
    );
    assert_eq!(g.ids, GREEDY[..6]);
    let g = run(&[": 2"], 12);
    assert_eq!(g.text, " Paris.\n\nThe answer is");
    let g = run(&["never"], 12);
    assert_eq!(
        (g.text.as_str(), g.finish),
        (" Paris.\n\nThe answer is: 201", FinishReason::Length)
    );
    let e = llama
        .generate_with(
            &tok,
            &ids,
            &GenerateOptions {
                stop_strings: vec![String::new()],
                ..GenerateOptions::default()
            },
            |_| {},
        )
        .unwrap_err();
    assert!(e.to_string().contains("stop string is empty"), "{e}");
}
