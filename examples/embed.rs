//! Sentence embeddings with all-MiniLM-L6-v2: one unit vector per sentence and their cosine
//! similarities. The model is installed into the model cache on first use.
//!
//! ```sh
//! cargo run --release --example embed -- "A cat sits on the mat." "A dog lies on the rug." "Stocks fell."
//! cargo run --release --example embed -- --device pjrt "..."   # or tpu, pjrt:1, ...
//! ```

use std::time::Instant;

use tpu_rs::models::{MINILM, SentenceEncoder, locate};
use tpu_rs::prelude::*;

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut dev_name = "cpu".to_string();
    if let Some(i) = args.iter().position(|a| a == "--device") {
        if i + 1 >= args.len() {
            return Err(Error::invalid_argument("embed", "--device needs a value"));
        }
        dev_name = args.remove(i + 1);
        args.remove(i);
    }
    if args.is_empty() {
        args = vec![
            "The quick brown fox jumps over the lazy dog.".into(),
            "A fast auburn fox leaps above a sleepy hound.".into(),
            "Interest rates rose again this quarter.".into(),
        ];
    }
    let dev = Device::parse(&dev_name)?;
    let folder = locate(&MINILM, true)?;
    let t0 = Instant::now();
    let enc = SentenceEncoder::from_folder(&folder, &dev)?;
    let loaded = t0.elapsed();
    let sentences: Vec<&str> = args.iter().map(String::as_str).collect();
    let t1 = Instant::now();
    let e = enc.embed(&sentences)?;
    let rows = e.to_device(&Device::cpu())?.to_vec::<f32>()?;
    let took = t1.elapsed();
    let dim = e.shape()[1];
    println!("all-MiniLM-L6-v2 on {dev}: {dim} dims");
    for (i, s) in sentences.iter().enumerate() {
        let v = &rows[i * dim..(i + 1) * dim];
        let head: Vec<String> = v[..4].iter().map(|x| format!("{x:+.4}")).collect();
        println!("[{i}] [{}, ...]  {s}", head.join(", "));
    }
    println!("cosine similarity:");
    for i in 0..sentences.len() {
        let row: Vec<String> = (0..sentences.len())
            .map(|j| {
                let dot: f32 = (0..dim)
                    .map(|k| rows[i * dim + k] * rows[j * dim + k])
                    .sum();
                format!("{dot:6.3}")
            })
            .collect();
        println!("[{i}] {}", row.join(" "));
    }
    println!(
        "loaded in {:.0} ms; {} sentences embedded in {:.1} ms",
        loaded.as_secs_f64() * 1e3,
        sentences.len(),
        took.as_secs_f64() * 1e3
    );
    Ok(())
}
