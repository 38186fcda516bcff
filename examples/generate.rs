//! Text generation with SmolLM2-135M-Instruct (a Q4_1 GGUF file, kept quantised on the native
//! CPU, dequantised to f32 on other devices or with `--weights f32`, and to bf16 or f16 with
//! `--weights bf16|f16`; a Hugging Face folder's weights in f32, or `--weights bf16|f16`): the
//! prompt's
//! continuation (or with `--chat`, the assistant's answer to it as a user message, through the
//! model's chat template), greedy or sampled (`--temperature`, `--top-k`, `--top-p`,
//! `--min-p`, `--repetition-penalty`, `--presence-penalty`, `--frequency-penalty`, `--seed`),
//! ending at `--max-new` tokens, an end token or a `--stop` text, printed token by token, then
//! prefill and decode speed. Several `--prompt`s generate together as one batch (prompts of
//! different lengths left-padded), each printed when done. `--model` takes another GGUF file or
//! a Hugging Face Llama folder (`config.json`, safetensors, `tokenizer.json`, and its
//! `generation_config.json` end tokens).
//! SmolLM2 is installed into the model cache on first use.
//!
//! ```sh
//! cargo run --release --example generate -- "The capital of France is"
//! cargo run --release --example generate -- --device pjrt --max-new 20 "Rust is"
//! cargo run --release --example generate -- --weights f32 "The capital of France is"
//! cargo run --release --example generate -- --chat "What is the capital of France?"
//! cargo run --release --example generate -- --temperature 0.8 --top-p 0.95 --seed 7 "Once upon"
//! cargo run --release --example generate -- --prompt "The capital of France is" --prompt "Hi"
//! ```

use std::io::Write;

use tpu_rs::models::{
    ChatMessage, ChatTemplate, GenerateOptions, GenerationConfig, Llama, SMOLLM2, Sampling,
    TextTokenizer, WeightFormat, locate,
};
use tpu_rs::prelude::*;
use tpu_rs::tpu_tensor::GgufFile;

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let chat = match args.iter().position(|a| a == "--chat") {
        Some(i) => {
            args.remove(i);
            true
        }
        None => false,
    };
    let mut repeated = |flag: &str| -> Result<Vec<String>> {
        let mut values = Vec::new();
        while let Some(i) = args.iter().position(|a| a == flag) {
            if i + 1 >= args.len() {
                return Err(Error::invalid_argument(
                    "generate",
                    format!("{flag} needs a value"),
                ));
            }
            values.push(args.remove(i + 1));
            args.remove(i);
        }
        Ok(values)
    };
    let stop_strings = repeated("--stop")?;
    let batch = repeated("--prompt")?;
    let mut take = |flag: &str| -> Result<Option<String>> {
        match args.iter().position(|a| a == flag) {
            Some(i) if i + 1 < args.len() => {
                let v = args.remove(i + 1);
                args.remove(i);
                Ok(Some(v))
            }
            Some(_) => Err(Error::invalid_argument(
                "generate",
                format!("{flag} needs a value"),
            )),
            None => Ok(None),
        }
    };
    let dev = Device::parse(&take("--device")?.unwrap_or_else(|| "cpu".into()))?;
    let max_new: usize = match take("--max-new")? {
        Some(v) => v.parse().map_err(|_| {
            Error::invalid_argument("generate", format!("--max-new {v:?} is not a count"))
        })?,
        None => 32,
    };
    // A GGUF file's matrices stay quantised or become dense; a folder's weights take the
    // format's dtype.
    let weights = match take("--weights")?.as_deref() {
        None | Some("auto") => WeightFormat::Auto,
        Some("quantized") => WeightFormat::Quantized,
        Some("f32") => WeightFormat::F32,
        Some("bf16") => WeightFormat::Bf16,
        Some("f16") => WeightFormat::F16,
        Some(w) => {
            return Err(Error::invalid_argument(
                "generate",
                format!("--weights {w:?}: expected auto, quantized, f32, bf16 or f16"),
            ));
        }
    };
    let number = |v: Option<String>, flag: &str, default: f64| -> Result<f64> {
        match v {
            Some(v) => v.parse().map_err(|_| {
                Error::invalid_argument("generate", format!("{flag} {v:?} is not a number"))
            }),
            None => Ok(default),
        }
    };
    let sampling = Sampling {
        temperature: number(take("--temperature")?, "--temperature", 0.0)? as f32,
        top_k: number(take("--top-k")?, "--top-k", 0.0)? as usize,
        top_p: number(take("--top-p")?, "--top-p", 1.0)? as f32,
        min_p: number(take("--min-p")?, "--min-p", 0.0)? as f32,
        repetition_penalty: number(take("--repetition-penalty")?, "--repetition-penalty", 1.0)?
            as f32,
        presence_penalty: number(take("--presence-penalty")?, "--presence-penalty", 0.0)? as f32,
        frequency_penalty: number(take("--frequency-penalty")?, "--frequency-penalty", 0.0)? as f32,
        seed: number(take("--seed")?, "--seed", 0.0)? as u64,
    };
    sampling.check()?;
    let model_path = take("--model")?;
    let mut prompts = batch;
    if !args.is_empty() || prompts.is_empty() {
        prompts.insert(
            0,
            if args.is_empty() {
                "The capital of France is".to_string()
            } else {
                args.join(" ")
            },
        );
    }
    let path = match model_path {
        Some(p) => std::path::PathBuf::from(p),
        None => locate(&SMOLLM2, true)?,
    };
    let t0 = std::time::Instant::now();
    // A Hugging Face folder, or a GGUF file.
    let (model, tokenizer, template, end_tokens) = if path.is_dir() {
        if weights == WeightFormat::Quantized {
            return Err(Error::invalid_argument(
                "generate",
                "--weights quantized takes a GGUF file; a folder's weights are f32, bf16 or f16",
            ));
        }
        let model = Llama::from_folder_with(&path, &dev, weights.dtype())?;
        let tokenizer = TextTokenizer::from_file(&path.join("tokenizer.json"))?;
        let ends = GenerationConfig::from_folder(&path)?
            .map(|g| g.eos_token_ids)
            .unwrap_or_default();
        (model, tokenizer, ChatTemplate::from_folder(&path)?, ends)
    } else {
        let file = GgufFile::open(&path)?;
        let model = Llama::from_gguf_with(&path, &dev, weights)?;
        let tokenizer = TextTokenizer::from_gguf(&file)?;
        (
            model,
            tokenizer,
            ChatTemplate::from_gguf(&file)?,
            Vec::new(),
        )
    };
    eprintln!(
        "{} on {dev}, {} weights ({:.0} MB), loaded in {:.1} s",
        path.file_name().unwrap_or_default().to_string_lossy(),
        if model.is_quantized() {
            "quantised".to_string()
        } else {
            model.dtype().to_string()
        },
        model.nbytes() as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    let mut stop: Vec<u32> = ["<|endoftext|>", "<|im_end|>", "<|eot_id|>", "</s>"]
        .iter()
        .filter_map(|t| tokenizer.token_id(t))
        .collect();
    for t in end_tokens {
        if !stop.contains(&t) {
            stop.push(t);
        }
    }
    let opts = GenerateOptions {
        max_new,
        stop_tokens: stop,
        stop_strings,
        sampling,
    };
    let template = || {
        template.as_ref().ok_or_else(|| {
            Error::invalid_argument("generate", "--chat: the model has no chat template")
        })
    };
    let ids = |p: &str| -> Result<Vec<u32>> {
        if chat {
            tokenizer.encode(&template()?.render(&[ChatMessage::user(p)], true)?, false)
        } else {
            tokenizer.encode(p, true)
        }
    };
    if prompts.len() > 1 {
        let all = prompts.iter().map(|p| ids(p)).collect::<Result<Vec<_>>>()?;
        let start = std::time::Instant::now();
        let gs = model.generate_batch(&tokenizer, &all, &opts, |_, _| {})?;
        let took = start.elapsed().as_secs_f64();
        for (p, g) in prompts.iter().zip(&gs) {
            println!("[{p}]{}", g.text);
        }
        let new: usize = gs.iter().map(|g| g.ids.len()).sum();
        eprintln!(
            "{} prompts as one batch: {new} new tokens in {:.1} ms ({:.1} tok/s, prefill {:.1} ms)",
            prompts.len(),
            took * 1e3,
            new as f64 / took,
            gs[0].prefill.as_secs_f64() * 1e3
        );
        report_compiles(&model);
        return Ok(());
    }
    let prompt = &prompts[0];
    let print = |t: &str| {
        print!("{t}");
        let _ = std::io::stdout().flush();
    };
    if !chat {
        print!("{prompt}");
    }
    let g = model.generate_with(&tokenizer, &ids(prompt)?, &opts, print)?;
    println!();
    let later = g.ids.len().saturating_sub(1);
    eprintln!(
        "prefill: {} tokens in {:.1} ms ({:.1} tok/s); decode: {later} tokens in {:.1} ms ({:.1} tok/s)",
        g.prompt_tokens,
        g.prefill.as_secs_f64() * 1e3,
        g.prompt_tokens as f64 / g.prefill.as_secs_f64(),
        g.decode.as_secs_f64() * 1e3,
        later as f64 / g.decode.as_secs_f64().max(1e-9)
    );
    report_compiles(&model);
    Ok(())
}

/// On a PJRT device the passes run compiled: how many programs, and how long compiling (or
/// loading from the disk cache) took, which the times above include.
fn report_compiles(model: &Llama) {
    if model.programs() == 0 {
        return;
    }
    let m = tpu_rs::graph::metrics();
    let llama = m.functions.iter().filter(|f| f.name.starts_with("llama."));
    let (time, disk) = llama.fold((0.0, 0), |(t, d), f| {
        (t + f.compile_time.as_secs_f64(), d + f.disk_hits)
    });
    eprintln!(
        "compiled: {} programs in {:.1} ms ({disk} loaded from the disk cache), included above",
        model.programs(),
        time * 1e3
    );
}
