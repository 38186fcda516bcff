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
//! # "Hi" and TALE: the same two lines with max_new_tokens=8
//! model.generate(ids, max_new_tokens=12, do_sample=False, repetition_penalty=1.3)
//! ```

use tpu_rs::models::{
    ChatMessage, ChatTemplate, FinishReason, GenerateOptions, GenerationConfig, KvCache, Llama,
    LlamaConfig, SMOLLM2, Sampling, TextTokenizer, WeightFormat,
};
use tpu_rs::prelude::*;
use tpu_rs::tpu_tensor::GgufFile;

use std::sync::OnceLock;

mod common;

const PROMPT: &str = "The capital of France is";
const PROMPT_IDS: [u32; 5] = [504, 3575, 282, 4649, 314];
const FIRST_LOGITS: [f32; 6] = [15.65529, 6.82449, 10.59123, 5.10946, 6.59446, 6.25756];
const LAST_LOGITS: [f32; 6] = [1.61364, -11.87187, -7.94445, -9.34691, -10.08523, -10.81282];
/// " Paris.\n\nThe answer is: 201"
const GREEDY: [u32; 12] = [7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34, 32, 33];
/// "Hi": its id, its logits (`lg[0, -1, :6]`) and the greedy continuation "-and-go-to-the".
const HI: u32 = 26843;
const HI_LOGITS: [f32; 6] = [14.0525, 4.63727, 7.8655, 3.16677, 4.53994, 4.18419];
const HI_NEXT: u32 = 29;
const HI_GREEDY: [u32; 8] = [29, 397, 29, 2345, 29, 1141, 29, 1195];
/// "Once upon a time, in a small village by the sea, there lived" and its greedy
/// continuation " a wise and kind woman named Elara".
const TALE: &str = "Once upon a time, in a small village by the sea, there lived";
const TALE_IDS: [u32; 15] = [
    6403, 1980, 253, 655, 28, 281, 253, 1165, 6560, 411, 260, 3426, 28, 665, 4161,
];
const TALE_GREEDY: [u32; 8] = [253, 9357, 284, 1942, 4166, 3365, 3906, 4075];

fn model(dev: &Device, format: WeightFormat) -> Option<(Llama, TextTokenizer)> {
    let path = common::model_or_skip(&SMOLLM2)?;
    let tok = TextTokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    Some((Llama::from_gguf_with(&path, dev, format).unwrap(), tok))
}

/// The quantised model on the native CPU, loaded once for the tests that only use it.
fn cpu_model() -> Option<&'static (Llama, TextTokenizer)> {
    static MODEL: OnceLock<Option<(Llama, TextTokenizer)>> = OnceLock::new();
    MODEL
        .get_or_init(|| model(&Device::cpu(), WeightFormat::Auto))
        .as_ref()
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
    if let Some((llama, tok)) = model(dev, format) {
        check_model(&llama, &tok, dev, format);
    }
}

fn check_model(llama: &Llama, tok: &TextTokenizer, dev: &Device, format: WeightFormat) {
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
    // A left-padded batch: "Hi" (one token after four of padding) beside the prompt; each
    // row's last logits are its own, then one decode step continues both.
    let padded = Tensor::from_vec(
        [0, 0, 0, 0, HI as i64]
            .into_iter()
            .chain(PROMPT_IDS.map(|i| i as i64))
            .collect(),
        [2, 5],
        dev,
    )
    .unwrap();
    let mut cache = KvCache::left_padded(vec![4, 0]);
    let both = llama.forward(&padded, &mut cache, true).unwrap();
    let both = both.to_device(&Device::cpu()).unwrap();
    close("padded \"Hi\"", &row(&both, 0)[..6], &HI_LOGITS, 1e-3);
    close(
        "padded prompt",
        &row(&both.narrow(0, 1, 1).unwrap(), 0),
        &last,
        1e-4,
    );
    let next = Tensor::from_vec(vec![HI_NEXT as i64, GREEDY[0] as i64], [2, 1], dev).unwrap();
    let step = llama.forward(&next, &mut cache, true).unwrap();
    let mut alone = KvCache::new();
    llama.forward(&ids, &mut alone, true).unwrap();
    let want = llama
        .forward(&next.narrow(0, 1, 1).unwrap(), &mut alone, true)
        .unwrap();
    let step = step.to_device(&Device::cpu()).unwrap();
    close(
        "padded decode",
        &row(&step.narrow(0, 1, 1).unwrap(), 0),
        &row(&want, 0),
        1e-4,
    );
    assert!(KvCache::left_padded(vec![5, 0]).padding() == [5, 0]);
    let e = llama
        .forward(&padded, &mut KvCache::left_padded(vec![5, 0]), true)
        .err()
        .unwrap();
    assert!(e.to_string().contains("leaving a real token"), "{e}");
    let stop = [tok.token_id("<|endoftext|>").unwrap()];
    let mut text = String::new();
    let g = llama
        .generate_greedy(tok, PROMPT, 12, &stop, |t| text.push_str(t))
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
    let Some((llama, tok)) = cpu_model() else {
        return;
    };
    let run = |s: Sampling| llama.generate(tok, PROMPT, 5, &[], &s, |_| {}).unwrap().ids;
    let hot = Sampling {
        temperature: 1.0,
        top_p: 0.95,
        seed: 11,
        ..Sampling::default()
    };
    assert_eq!(run(hot.clone()), run(hot.clone()));
    let one = Sampling { top_k: 1, ..hot };
    assert_eq!(run(one), GREEDY[..5]);
}

#[test]
fn smollm2_matches_transformers_on_cpu_with_quantized_weights() {
    if let Some((llama, tok)) = cpu_model() {
        check_model(llama, tok, &Device::cpu(), WeightFormat::Auto);
    }
}

#[test]
fn smollm2_matches_transformers_on_cpu_with_f32_weights() {
    check(&Device::cpu(), WeightFormat::F32);
}

#[test]
fn smollm2_matches_transformers_on_pjrt() {
    if let Some(dev) = tpu_rs::tpu_ops::testing::pjrt_device("smollm2 on pjrt") {
        let Some((llama, tok)) = model(&dev, WeightFormat::Auto) else {
            return;
        };
        check_model(&llama, &tok, &dev, WeightFormat::Auto);
        // check_model's greedy generation ran compiled (one prefill, one decode program)
        // and gave transformers' tokens.
        assert_eq!(llama.programs(), 2);
        check_batch(&llama, &tok);
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
    let Some((llama, tok)) = cpu_model() else {
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
        .generate_chat(tok, &t, &one, &opts, |s| streamed.push_str(s))
        .unwrap();
    assert_eq!(g.prompt_tokens, CHAT_IDS.len());
    assert_eq!(g.ids, CHAT_ANSWER);
    assert_eq!(g.finish, FinishReason::Stop);
    assert_eq!(g.text, "The capital of France is Paris.");
    assert_eq!(streamed, g.text);
}

#[test]
fn stop_strings_cut_the_text_and_are_never_streamed() {
    let Some((llama, tok)) = cpu_model() else {
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
            .generate_with(tok, &ids, &opts, |s| streamed.push_str(s))
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
    let e = llama
        .generate_with(
            tok,
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

#[test]
fn a_batch_of_prompts_of_different_lengths_gives_what_each_gives_alone() {
    if let Some((llama, tok)) = cpu_model() {
        check_batch(llama, tok);
    }
}

/// The prompt, the tale and "Hi" as one batch: over a preallocated cache (compiled on PJRT),
/// then generated together.
fn check_batch(llama: &Llama, tok: &TextTokenizer) {
    let prompts = [PROMPT, TALE, "Hi"].map(|p| tok.encode(p, true).unwrap());
    assert_eq!(prompts[1], TALE_IDS);
    assert_eq!(prompts[2], [HI]);
    let dev = llama.device();
    let pjrt = dev.as_pjrt().is_some();
    let before = llama.programs();
    // Left-padded to 16 (the length bucket generation pads to) in a cache of 32 slots (what
    // generation allocates for 6 new tokens) on PJRT, so the programs compiled here are the
    // ones generation runs; 16 slots on the CPU, which the decode step then grows.
    let pad = prompts.iter().map(|p| 16 - p.len()).collect::<Vec<_>>();
    let ids = prompts
        .iter()
        .zip(&pad)
        .flat_map(|(p, &n)| std::iter::repeat_n(0, n).chain(p.iter().map(|&t| t as i64)))
        .collect();
    let mut cache = KvCache::left_padded(pad).with_capacity(if pjrt { 32 } else { 16 });
    let ids = Tensor::from_vec(ids, [3, 16], dev).unwrap();
    let last = llama.forward(&ids, &mut cache, true).unwrap();
    let last = last.to_device(&Device::cpu()).unwrap();
    close(
        "preallocated prompt",
        &row(&last, 0)[..6],
        &LAST_LOGITS,
        1e-3,
    );
    close(
        "preallocated \"Hi\"",
        &row(&last.narrow(0, 2, 1).unwrap(), 0)[..6],
        &HI_LOGITS,
        1e-3,
    );
    // Two decode steps. A clone taken before them is written in place only after it has
    // copied its slots: its own step (other tokens at slot 16) leaves the first step's keys
    // alone.
    let mut snapshot = cache.clone();
    let decode = |cache: &mut KvCache, k: usize| {
        let next = [GREEDY[k], TALE_GREEDY[k], [HI_NEXT, HI_GREEDY[1]][k]].map(|t| t as i64);
        let next = Tensor::from_vec(next.to_vec(), [3, 1], dev).unwrap();
        let step = llama.forward(&next, cache, true).unwrap();
        let step = step.argmax(Some(-1), false).unwrap();
        step.to_device(&Device::cpu())
            .unwrap()
            .to_vec::<i64>()
            .unwrap()
    };
    let want = |k: usize| [GREEDY[k], TALE_GREEDY[k], HI_GREEDY[k]].map(|t| t as i64);
    assert_eq!(decode(&mut cache, 0), want(1));
    assert_eq!((cache.len(), cache.capacity()), (17, Some(32)));
    decode(&mut snapshot, 1);
    assert_eq!(decode(&mut cache, 1), want(2));
    let one = Tensor::from_vec(vec![HI as i64], [1, 1], dev).unwrap();
    let e = llama.forward(&one, &mut cache, true).unwrap_err();
    assert!(
        e.to_string()
            .contains("1 rows of token ids for a cache of 3 rows"),
        "{e}"
    );
    // The tale stops at "woman" after five tokens (and leaves the batch, on the CPU); the
    // others go on.
    let opts = GenerateOptions {
        max_new: 6,
        stop_strings: vec!["woman".into()],
        ..GenerateOptions::default()
    };
    let mut streamed = vec![String::new(); 3];
    let g = llama
        .generate_batch(tok, &prompts, &opts, |i, t| streamed[i].push_str(t))
        .unwrap();
    assert_eq!(g[0].ids, GREEDY[..6]);
    assert_eq!(g[1].ids, TALE_GREEDY[..5]);
    assert_eq!(g[2].ids, HI_GREEDY[..6]);
    assert_eq!(
        g.iter().map(|g| g.finish).collect::<Vec<_>>(),
        [
            FinishReason::Length,
            FinishReason::Stop,
            FinishReason::Length
        ]
    );
    assert_eq!(g[1].text, " a wise and kind ");
    assert_eq!(g[2].text, "-and-go-to");
    assert_eq!(
        g.iter().map(|g| g.prompt_tokens).collect::<Vec<_>>(),
        [5, 15, 1]
    );
    for (s, g) in streamed.iter().zip(&g) {
        assert_eq!(s, &g.text);
    }
    // One prefill and one decode program on PJRT, whatever the position; other prompts of
    // the same buckets compile nothing more.
    let programs = before + if pjrt { 2 } else { 0 };
    assert_eq!(llama.programs(), programs);
    let short = [vec![HI], TALE_IDS[..9].to_vec(), PROMPT_IDS.to_vec()];
    let again = llama.generate_batch(tok, &short, &opts, |_, _| {}).unwrap();
    assert_eq!(again[2].ids, GREEDY[..6]);
    assert_eq!(llama.programs(), programs);
    for (bad, why) in [
        (vec![], "no prompts"),
        (vec![vec![1], vec![]], "prompt 1 has no tokens"),
    ] {
        let e = llama
            .generate_batch(tok, &bad, &opts, |_, _| {})
            .unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }
}

/// SmolLM2 written out as a Hugging Face folder (the GGUF's tensors dequantised, the query and
/// key rows put back in transformers' order, `LlamaForCausalLM`'s names) loads with
/// `Llama::from_folder`, gives transformers' logits, and generates with the folder's
/// `generation_config.json` (a repetition penalty of 1.3, as in the snippet above).
#[test]
fn a_hugging_face_folder_gives_the_same_model_and_its_generation_defaults() {
    let Some(path) = common::model_or_skip(&SMOLLM2) else {
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    let cpu = Device::cpu();
    let dir = std::env::temp_dir().join(format!("tpu-rs-hf-llama-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // GGUF rows of a query or key projection interleave each head's rotary halves.
    let unpermute = |w: Tensor, heads: usize| {
        let (out, inp) = (w.shape()[0], w.shape()[1]);
        w.reshape([heads, out / heads / 2, 2, inp])
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
            .reshape([out, inp])
            .unwrap()
    };
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    let mut put = |hf: String, gguf: &str, heads: Option<usize>| {
        let w = f.dequantize(gguf, &cpu).unwrap();
        tensors.push((hf, heads.map_or(w.clone(), |h| unpermute(w, h))));
    };
    put(
        "model.embed_tokens.weight".into(),
        "token_embd.weight",
        None,
    );
    put("model.norm.weight".into(), "output_norm.weight", None);
    for i in 0..30 {
        for (hf, gguf, heads) in [
            ("input_layernorm", "attn_norm", None),
            ("self_attn.q_proj", "attn_q", Some(9)),
            ("self_attn.k_proj", "attn_k", Some(3)),
            ("self_attn.v_proj", "attn_v", None),
            ("self_attn.o_proj", "attn_output", None),
            ("post_attention_layernorm", "ffn_norm", None),
            ("mlp.gate_proj", "ffn_gate", None),
            ("mlp.up_proj", "ffn_up", None),
            ("mlp.down_proj", "ffn_down", None),
        ] {
            put(
                format!("model.layers.{i}.{hf}.weight"),
                &format!("blk.{i}.{gguf}.weight"),
                heads,
            );
        }
    }
    tpu_rs::tpu_tensor::io::save_safetensors(
        tensors.iter().map(|(n, t)| (n, t)),
        dir.join("model.safetensors"),
        None,
    )
    .unwrap();
    drop(tensors);
    // transformers' LlamaConfig of the model it loads from the GGUF (`model.config`), trimmed:
    // the epsilon is the f32 the file stores.
    std::fs::write(
        dir.join("config.json"),
        r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
            "max_position_embeddings": 8192, "rms_norm_eps": 9.999999747378752e-06, "rope_theta": 100000.0,
            "rope_scaling": null, "tie_word_embeddings": true, "vocab_size": 49152,
            "attention_bias": false, "mlp_bias": false, "torch_dtype": "float32"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
            "repetition_penalty": 1.3, "max_new_tokens": 12}"#,
    )
    .unwrap();
    let llama = Llama::from_folder(&dir, &cpu).unwrap();
    let gguf = LlamaConfig::from_gguf(&f).unwrap();
    assert_eq!(llama.config, gguf);
    assert!(!llama.is_quantized());
    let ids = Tensor::from_vec(PROMPT_IDS.map(|i| i as i64).to_vec(), [1, 5], &cpu).unwrap();
    let logits = llama.forward(&ids, &mut KvCache::new(), false).unwrap();
    close("logits[0, 0]", &row(&logits, 0)[..6], &FIRST_LOGITS, 1e-3);
    close("logits[0, 4]", &row(&logits, 4)[..6], &LAST_LOGITS, 1e-3);
    let gc = GenerationConfig::from_folder(&dir).unwrap().unwrap();
    assert_eq!(
        (gc.bos_token_id, gc.eos_token_ids.as_slice()),
        (Some(1), &[2][..])
    );
    let opts = gc.options();
    assert_eq!((opts.max_new, opts.stop_tokens.as_slice()), (12, &[2][..]));
    let tok = TextTokenizer::from_gguf(&f).unwrap();
    let g = llama
        .generate_with(&tok, &PROMPT_IDS, &opts, |_| {})
        .unwrap();
    // " Paris.\n- The United States has a population slightly higher"
    assert_eq!(
        g.ids,
        [
            7042, 30, 198, 29, 378, 1797, 1918, 553, 253, 2155, 5359, 2061
        ]
    );
    // The same folder in bf16 (converted on load), against transformers' bf16 model:
    //
    // ```python
    // model = AutoModelForCausalLM.from_pretrained(d, gguf_file=g, dtype=torch.bfloat16)
    // model(ids).logits[0, -1, :6]           # ids: the prompt's
    // model.generate(ids, max_new_tokens=8, do_sample=False)[0, 5:]   # GREEDY[:8]
    // ```
    drop(llama);
    const LAST_LOGITS_BF16: [f32; 6] = [1.3828125, -12.125, -8.1875, -9.5625, -10.375, -11.0625];
    let bf16 = Llama::from_folder_with(&dir, &cpu, DType::BF16).unwrap();
    assert_eq!(bf16.dtype(), DType::BF16);
    let logits = bf16.forward(&ids, &mut KvCache::new(), true).unwrap();
    assert_eq!(logits.dtype(), DType::BF16);
    let last = row(&logits.to_dtype(DType::F32).unwrap(), 0);
    // bf16 rounds every layer's outputs, so two correct bf16 models differ by a few bf16 steps
    // (0.0625 between 8 and 16) after 30 layers, by the order of their sums. The bound is
    // transformers' own: its bf16 logits lie up to 0.29 from the f32 model's. Ours measured
    // [1.5, -12.0, -8.0625, -9.375, -10.1875, -10.9375]: at most 0.13 from f32 and 0.19 from
    // transformers' bf16 (with faer's product, before the AVX2 kernel, 0.25 and 0.06).
    for ((g, f), w) in last.iter().zip(LAST_LOGITS).zip(LAST_LOGITS_BF16) {
        assert!(
            (g - f).abs() <= 0.3 && (g - w).abs() <= 0.25,
            "bf16 logits: {:?}",
            &last[..6]
        );
    }
    let g = bf16.generate_greedy(&tok, PROMPT, 2, &[], |_| {}).unwrap();
    assert_eq!(g.ids, GREEDY[..2]);
    drop(bf16);
    // The GGUF file rounded to bf16 on load is the same model: the same weights (dequantised,
    // then rounded once), so the same bits.
    let from_gguf = Llama::from_gguf_with(&path, &cpu, WeightFormat::Bf16).unwrap();
    assert_eq!(from_gguf.dtype(), DType::BF16);
    let again = from_gguf
        .forward(&ids, &mut KvCache::new(), true)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    assert_eq!(
        row(&again, 0),
        last,
        "bf16 from GGUF against bf16 from the folder"
    );
    drop(from_gguf);
    let e = Llama::from_folder_with(&dir, &cpu, DType::I32)
        .err()
        .unwrap();
    assert!(e.to_string().contains("f32, bf16 or f16, got i32"), "{e}");
    // What the loader refuses, by name.
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    for (from, to, why) in [
        (
            r#""rope_scaling": null"#,
            r#""rope_scaling": {"rope_type": "yarn"}"#,
            "\"yarn\" is not supported",
        ),
        (
            r#""hidden_act": "silu""#,
            r#""hidden_act": "gelu""#,
            "hidden_act",
        ),
        (
            r#""model_type": "llama""#,
            r#""model_type": "gpt2""#,
            "model_type",
        ),
        (r#""head_dim": 64"#, r#""head_dim": 32"#, "head_dim 32"),
    ] {
        std::fs::write(dir.join("config.json"), cfg.replace(from, to)).unwrap();
        let e = Llama::from_folder(&dir, &cpu).err().unwrap();
        assert!(e.to_string().contains(why), "{why}: {e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
