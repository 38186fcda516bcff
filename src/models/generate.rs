//! Text generation with a decoder: one prompt or a batch of them (left-padded to one length),
//! tokens chosen by a [`Sampler`], streamed as they come, stopped by stop tokens or strings;
//! and the generation defaults a Hugging Face folder carries ([`GenerationConfig`]).

use std::path::Path;

use tpu_runtime::{DType, Device, Error, Result};
use tpu_tensor::Tensor;

use super::chat::{ChatMessage, ChatTemplate};
use super::llama::{KvCache, Llama, bucket};
use super::sample::{Sampler, Sampling};
use super::tokenizer::TextTokenizer;

impl Llama {
    /// Greedy generation: [`Llama::generate`] with [`Sampling::greedy`].
    pub fn generate_greedy(
        &self,
        tokenizer: &TextTokenizer,
        prompt: &str,
        max_new: usize,
        stop: &[u32],
        on_token: impl FnMut(&str),
    ) -> Result<Generation> {
        let greedy = Sampling::greedy();
        self.generate(tokenizer, prompt, max_new, stop, &greedy, on_token)
    }

    /// `prompt`'s tokens, then up to `max_new` tokens chosen as `sampling` says, stopping
    /// after a token of `stop`; `on_token` receives each new token's text as it is produced.
    pub fn generate(
        &self,
        tokenizer: &TextTokenizer,
        prompt: &str,
        max_new: usize,
        stop: &[u32],
        sampling: &Sampling,
        on_token: impl FnMut(&str),
    ) -> Result<Generation> {
        let opts = GenerateOptions {
            max_new,
            stop_tokens: stop.to_vec(),
            sampling: sampling.clone(),
            ..GenerateOptions::default()
        };
        let ids = tokenizer.encode(prompt, true)?;
        self.generate_with(tokenizer, &ids, &opts, on_token)
    }

    /// The assistant's answer to `messages`, rendered with the model's chat `template` (with
    /// the generation prompt) and tokenised as it is (the template writes any special tokens).
    pub fn generate_chat(
        &self,
        tokenizer: &TextTokenizer,
        template: &ChatTemplate,
        messages: &[ChatMessage],
        opts: &GenerateOptions,
        on_token: impl FnMut(&str),
    ) -> Result<Generation> {
        let text = template.render(messages, true)?;
        let ids = tokenizer.encode(&text, false)?;
        self.generate_with(tokenizer, &ids, opts, on_token)
    }

    /// Tokens after the prompt `ids`, as `opts` says; `on_token` receives the new text as it is
    /// produced (held back while it could still be the start of a stop string, and never
    /// including one).
    pub fn generate_with(
        &self,
        tokenizer: &TextTokenizer,
        ids: &[u32],
        opts: &GenerateOptions,
        mut on_token: impl FnMut(&str),
    ) -> Result<Generation> {
        let mut g = self.generate_batch(tokenizer, &[ids.to_vec()], opts, |_, t| on_token(t))?;
        Ok(g.remove(0))
    }

    /// Tokens after each of `prompts`, generated together as one batch (prompts of different
    /// lengths left-padded, see [`KvCache::left_padded`]): each row gives what it would alone,
    /// and leaves the batch when it ends. `on_token` receives a prompt's index and its new text
    /// as it is produced (as in [`Llama::generate_with`]).
    pub fn generate_batch(
        &self,
        tokenizer: &TextTokenizer,
        prompts: &[Vec<u32>],
        opts: &GenerateOptions,
        mut on_token: impl FnMut(usize, &str),
    ) -> Result<Vec<Generation>> {
        if prompts.is_empty() {
            return Err(Error::invalid_argument("generate", "no prompts"));
        }
        if let Some(i) = prompts.iter().position(Vec::is_empty) {
            return Err(Error::invalid_argument(
                "generate",
                format!("prompt {i} has no tokens"),
            ));
        }
        if opts.stop_strings.iter().any(String::is_empty) {
            return Err(Error::invalid_argument(
                "generate",
                "a stop string is empty",
            ));
        }
        let mut streams = prompts
            .iter()
            .map(|p| Stream::new(p, opts))
            .collect::<Result<Vec<Stream>>>()?;
        let dev = self.device().clone();
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        // On a PJRT device the passes run compiled over a preallocated cache: the prompts are
        // padded to a length bucket and the cache to a power of two, so a run compiles one
        // prefill and one decode program, and sequences that end stay in the batch (their
        // tokens ignored) rather than change its shape.
        let compiled = dev.as_pjrt().is_some();
        let max = self.config.max_positions;
        let width = match bucket(longest, max) {
            w if compiled && w + opts.max_new <= max + 1 => w,
            _ => longest,
        };
        let pad: Vec<usize> = prompts.iter().map(|p| width - p.len()).collect();
        let ids: Vec<i64> = prompts
            .iter()
            .zip(&pad)
            .flat_map(|(p, &n)| std::iter::repeat_n(0, n).chain(p.iter().map(|&t| t as i64)))
            .collect();
        let mut cache = if pad.iter().all(|&p| p == 0) {
            KvCache::new()
        } else {
            KvCache::left_padded(pad)
        };
        if compiled {
            // The last new token is never fed back.
            let need = width + opts.max_new.max(1) - 1;
            cache = cache.with_capacity(bucket(need, max));
        }
        let mut input = Tensor::from_vec(ids, [prompts.len(), width], &dev)?;
        // Row of the batch -> its prompt, and whether it still generates.
        let mut live: Vec<usize> = (0..prompts.len()).collect();
        let mut done = vec![false; prompts.len()];
        let vocab = self.config.vocab_size;
        let (mut prefill, start) = (None, std::time::Instant::now());
        for step in 0..opts.max_new {
            let logits = self.forward(&input, &mut cache, true)?;
            let logits = logits.to_device(&Device::cpu())?;
            let logits = logits.to_dtype(DType::F32)?.to_vec::<f32>()?;
            let at = *prefill.get_or_insert_with(|| start.elapsed());
            // Each row's next token (0 for a row that has ended).
            let mut next = vec![0i64; live.len()];
            for (row, &i) in live.iter().enumerate() {
                if done[i] {
                    continue;
                }
                let s = &mut streams[i];
                let emit = &mut |t: &str| on_token(i, t);
                match s.step(&logits[row * vocab..(row + 1) * vocab], tokenizer, emit)? {
                    Some(t) => next[row] = t as i64,
                    None => {
                        s.decode = start.elapsed().saturating_sub(at);
                        done[i] = true;
                    }
                }
            }
            if done.iter().all(|&d| d) || step + 1 == opts.max_new {
                break;
            }
            let keep: Vec<usize> = (0..live.len()).filter(|&r| !done[live[r]]).collect();
            if !compiled && keep.len() < live.len() {
                cache = cache.select_rows(&keep)?;
                next = keep.iter().map(|&r| next[r]).collect();
                live = keep.iter().map(|&r| live[r]).collect();
            }
            input = Tensor::from_vec(next, [live.len(), 1], &dev)?;
        }
        let prefill = prefill.unwrap_or_default();
        let end = start.elapsed().saturating_sub(prefill);
        Ok(streams
            .into_iter()
            .enumerate()
            .map(|(i, s)| s.finish(prefill, end, &mut |t: &str| on_token(i, t)))
            .collect())
    }
}

/// One sequence being generated: how it chooses, what it produced, what it streamed.
pub(crate) struct Stream {
    opts: GenerateOptions,
    sampler: Sampler,
    prompt_tokens: usize,
    /// The prompt and the tokens so far, for the repetition penalty.
    history: Vec<u32>,
    pub(crate) out: Vec<u32>,
    pub(crate) text: String,
    /// Bytes of `text` already streamed.
    printed: usize,
    /// Text that could still grow into a stop string is held back this many bytes.
    hold: usize,
    pub(crate) finish: Option<FinishReason>,
    /// Time from the first token to the last; set when the sequence ends early.
    decode: std::time::Duration,
}

impl Stream {
    pub(crate) fn new(ids: &[u32], opts: &GenerateOptions) -> Result<Stream> {
        Ok(Stream {
            opts: opts.clone(),
            sampler: Sampler::new(opts.sampling.clone())?,
            prompt_tokens: ids.len(),
            history: ids.to_vec(),
            out: Vec::new(),
            text: String::new(),
            printed: 0,
            hold: opts.stop_strings.iter().map(String::len).max().unwrap_or(1) - 1,
            finish: None,
            decode: std::time::Duration::ZERO,
        })
    }

    /// Chooses the next token from `logits` and streams the text that became final; the token
    /// to feed back, or `None` when the sequence has ended.
    pub(crate) fn step(
        &mut self,
        logits: &[f32],
        tokenizer: &TextTokenizer,
        emit: &mut dyn FnMut(&str),
    ) -> Result<Option<u32>> {
        let next = self.sampler.next(logits, &self.history)?;
        self.history.push(next);
        self.out.push(next);
        // Decode the whole continuation, so multi-byte characters split across tokens print
        // once complete.
        self.text = tokenizer.decode(&self.out, true)?;
        let text = &mut self.text;
        if let Some(at) = self
            .opts
            .stop_strings
            .iter()
            .filter_map(|s| text.find(s.as_str()))
            .min()
        {
            text.truncate(at);
            self.finish = Some(FinishReason::Stop);
            return Ok(None);
        }
        if self.opts.stop_tokens.contains(&next) {
            self.finish = Some(FinishReason::Stop);
            return Ok(None);
        }
        let mut safe = text.len().saturating_sub(self.hold);
        while !text.is_char_boundary(safe) {
            safe -= 1;
        }
        if safe > self.printed && !text[..safe].ends_with('\u{fffd}') {
            emit(&text[self.printed..safe]);
            self.printed = safe;
        }
        Ok(Some(next))
    }

    /// The generation, its held-back text streamed; `decode` is the time to the end of the
    /// batch for a sequence that ran to its length.
    pub(crate) fn finish(
        self,
        prefill: std::time::Duration,
        decode: std::time::Duration,
        emit: &mut dyn FnMut(&str),
    ) -> Generation {
        let text = self.text;
        if text.len() > self.printed && !text.ends_with('\u{fffd}') {
            emit(&text[self.printed..]);
        }
        let finish = self.finish.unwrap_or(FinishReason::Length);
        Generation {
            prompt_tokens: self.prompt_tokens,
            decode: if self.finish.is_some() {
                self.decode
            } else {
                decode
            },
            ids: self.out,
            text,
            finish,
            prefill,
        }
    }
}

/// What [`Llama::generate_with`] does: how many tokens at most, where to stop, how to choose.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// New tokens at most.
    pub max_new: usize,
    /// Tokens that end the generation (kept in [`Generation::ids`], not in its text).
    pub stop_tokens: Vec<u32>,
    /// Texts that end the generation; the text is cut before the first one found.
    pub stop_strings: Vec<String>,
    /// How each token is chosen.
    pub sampling: Sampling,
}

impl Default for GenerateOptions {
    fn default() -> GenerateOptions {
        GenerateOptions {
            max_new: 32,
            stop_tokens: Vec::new(),
            stop_strings: Vec::new(),
            sampling: Sampling::greedy(),
        }
    }
}

/// Why a generation ended (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_new` tokens were generated.
    Length,
    /// A stop token or stop string came.
    Stop,
}

/// What a generation produced, and how long it took.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The new tokens' ids.
    pub ids: Vec<u32>,
    /// Their text, special tokens skipped, cut before a stop string.
    pub text: String,
    /// Why it ended.
    pub finish: FinishReason,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// The prompt's forward pass and the first new token.
    pub prefill: std::time::Duration,
    /// Every later token.
    pub decode: std::time::Duration,
}

/// A model's generation defaults, from a Hugging Face folder's `generation_config.json`: what
/// transformers' `generate` does when it is given nothing else.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    /// The token a prompt starts with.
    pub bos_token_id: Option<u32>,
    /// Tokens that end a generation (`eos_token_id`: one or a list).
    pub eos_token_ids: Vec<u32>,
    /// Sample (true) or choose greedily.
    pub do_sample: bool,
    /// Sampling temperature (transformers' default 1).
    pub temperature: Option<f32>,
    /// Top-k (transformers' default 50).
    pub top_k: Option<usize>,
    /// Top-p (transformers' default 1).
    pub top_p: Option<f32>,
    /// Min-p (none by default).
    pub min_p: Option<f32>,
    /// The repetition penalty (1: none), applied greedy or sampled.
    pub repetition_penalty: Option<f32>,
    /// New tokens at most.
    pub max_new_tokens: Option<usize>,
}

impl GenerationConfig {
    /// Reads a `generation_config.json`; a value of the wrong kind is an error naming it.
    pub fn from_file(path: &Path) -> Result<GenerationConfig> {
        let (v, bad) = super::read_json(path, "generation_config.json")?;
        let int = |k: &str| -> Result<Option<u64>> {
            match &v[k] {
                serde_json::Value::Null => Ok(None),
                x => x
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| bad(format!("{k} is {x}, not a count"))),
            }
        };
        let float = |k: &str| -> Result<Option<f32>> {
            match &v[k] {
                serde_json::Value::Null => Ok(None),
                x => x
                    .as_f64()
                    .map(|f| Some(f as f32))
                    .ok_or_else(|| bad(format!("{k} is {x}, not a number"))),
            }
        };
        let token = |x: &serde_json::Value| -> Result<u32> {
            x.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| bad(format!("token id {x} is not a token id")))
        };
        let eos_token_ids = match &v["eos_token_id"] {
            serde_json::Value::Null => Vec::new(),
            serde_json::Value::Array(ids) => ids.iter().map(token).collect::<Result<_>>()?,
            x => vec![token(x)?],
        };
        let bos_token_id = match &v["bos_token_id"] {
            serde_json::Value::Null => None,
            x => Some(token(x)?),
        };
        let do_sample = match &v["do_sample"] {
            serde_json::Value::Null => false,
            x => x
                .as_bool()
                .ok_or_else(|| bad(format!("do_sample is {x}, not true or false")))?,
        };
        Ok(GenerationConfig {
            bos_token_id,
            eos_token_ids,
            do_sample,
            temperature: float("temperature")?,
            top_k: int("top_k")?.map(|k| k as usize),
            top_p: float("top_p")?,
            min_p: float("min_p")?,
            repetition_penalty: float("repetition_penalty")?,
            max_new_tokens: int("max_new_tokens")?.map(|n| n as usize),
        })
    }

    /// The defaults of the model folder `dir`; `None` when it has no `generation_config.json`.
    pub fn from_folder(dir: &Path) -> Result<Option<GenerationConfig>> {
        let path = dir.join("generation_config.json");
        if !path.exists() {
            return Ok(None);
        }
        GenerationConfig::from_file(&path).map(Some)
    }

    /// Generation options as transformers would take them from this file: greedy unless
    /// `do_sample`, transformers' defaults for unset sampling values, the EOS tokens as stop
    /// tokens, and `max_new_tokens` when set (else [`GenerateOptions::default`]'s).
    pub fn options(&self) -> GenerateOptions {
        let mut sampling = if self.do_sample {
            Sampling {
                temperature: self.temperature.unwrap_or(1.0),
                top_k: self.top_k.unwrap_or(50),
                top_p: self.top_p.unwrap_or(1.0),
                min_p: self.min_p.unwrap_or(0.0),
                ..Sampling::default()
            }
        } else {
            Sampling::greedy()
        };
        sampling.repetition_penalty = self.repetition_penalty.unwrap_or(1.0);
        GenerateOptions {
            max_new: self
                .max_new_tokens
                .unwrap_or(GenerateOptions::default().max_new),
            stop_tokens: self.eos_token_ids.clone(),
            stop_strings: Vec::new(),
            sampling,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> Result<GenerationConfig> {
        let dir = std::env::temp_dir().join(format!(
            "tpu-rs-genconfig-{}-{}",
            std::process::id(),
            json.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("generation_config.json"), json).unwrap();
        let c = GenerationConfig::from_folder(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        c.map(Option::unwrap)
    }

    #[test]
    fn sampling_defaults_follow_transformers() {
        // Llama 3's file: sampling at 0.6 / 0.9, three end tokens, top_k unset (50).
        let c = config(
            r#"{"bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128008,
                128009], "temperature": 0.6, "top_p": 0.9}"#,
        )
        .unwrap();
        let o = c.options();
        assert_eq!(o.stop_tokens, [128001, 128008, 128009]);
        assert_eq!(
            (o.sampling.temperature, o.sampling.top_k, o.sampling.top_p),
            (0.6, 50, 0.9)
        );
        assert_eq!(o.max_new, GenerateOptions::default().max_new);
        // do_sample false: greedy whatever the temperature says.
        let c = config(r#"{"temperature": 0.7, "repetition_penalty": 1.1}"#).unwrap();
        let o = c.options();
        assert_eq!(o.sampling.temperature, 0.0);
        assert_eq!(o.sampling.repetition_penalty, 1.1);
        assert!(o.stop_tokens.is_empty());
    }

    #[test]
    fn bad_values_are_errors_naming_them() {
        for (json, why) in [
            (r#"{"do_sample": "yes"}"#, "do_sample"),
            (r#"{"top_k": -1}"#, "top_k"),
            (r#"{"eos_token_id": [2, "x"]}"#, "token id"),
            (r#"{"temperature": "hot"}"#, "temperature"),
            ("{", "generation_config.json"),
        ] {
            let e = config(json).unwrap_err();
            assert!(e.to_string().contains(why), "{json}: {e}");
        }
        let none = std::env::temp_dir().join("tpu-rs-no-such-folder");
        assert!(GenerationConfig::from_folder(&none).unwrap().is_none());
    }
}
