//! Text generation with SmolLM2-135M-Instruct (a GGUF file, dequantised to f32): the prompt's
//! continuation, greedy or sampled (`--temperature`, `--top-k`, `--top-p`, `--min-p`,
//! `--repetition-penalty`, `--seed`), printed token by token, then prefill and decode speed. The model is installed
//! into the model cache on first use.
//!
//! ```sh
//! cargo run --release --example generate -- "The capital of France is"
//! cargo run --release --example generate -- --device pjrt --max-new 20 "Rust is"
//! cargo run --release --example generate -- --temperature 0.8 --top-p 0.95 --seed 7 "Once upon"
//! ```

use std::io::Write;

use tpu_rs::models::{Llama, SMOLLM2, Sampling, TextTokenizer, locate};
use tpu_rs::prelude::*;
use tpu_rs::tpu_tensor::GgufFile;

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
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
        seed: number(take("--seed")?, "--seed", 0.0)? as u64,
    };
    sampling.check()?;
    let prompt = if args.is_empty() {
        "The capital of France is".to_string()
    } else {
        args.join(" ")
    };
    let path = locate(&SMOLLM2, true)?;
    let t0 = std::time::Instant::now();
    let model = Llama::from_gguf(&path, &dev)?;
    let tokenizer = TextTokenizer::from_gguf(&GgufFile::open(&path)?)?;
    eprintln!(
        "SmolLM2-135M-Instruct on {dev}, loaded in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let stop: Vec<u32> = ["<|endoftext|>", "<|im_end|>"]
        .iter()
        .filter_map(|t| tokenizer.token_id(t))
        .collect();
    print!("{prompt}");
    let g = model.generate(&tokenizer, &prompt, max_new, &stop, &sampling, |t| {
        print!("{t}");
        let _ = std::io::stdout().flush();
    })?;
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
    Ok(())
}
