//! The serving engine: one thread that runs a Llama model over a paged KV cache for many
//! requests at once, with continuous batching (requests join and leave the batch at every
//! pass), chunked prefill under a per-pass token budget, prefix caching, admission control and
//! preemption by recompute.
//!
//! Each pass the scheduler takes, in order: one token of every running sequence that is
//! decoding, the next piece of every running prompt, then new requests while the budget and
//! the free blocks last. A new request first takes the blocks of its prompt's longest cached
//! prefix. When a running sequence needs a block and none is free, the newest running sequence
//! is preempted: its blocks are freed, and it waits again at the front of the queue, to be
//! recomputed from its prompt and the tokens it has made so far (the same tokens follow, the
//! sampler's state is kept).
//!
//! Requests come through a channel from any thread ([`Engine::submit`]); what they produce goes
//! to each request's [`Sink`]. A sink that reports its receiver gone cancels its request at the
//! next pass, and frees its blocks.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tpu_runtime::{DType, Device, Error, Result};

use super::blocks::{BlockManager, ROOT};
use super::metrics::Metrics;
use crate::models::generate::Stream;
use crate::models::llama::{PagedBuckets, PagedCache, PagedChunk};
use crate::models::{FinishReason, GenerateOptions, Llama, TextTokenizer};

/// How the engine is sized.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Positions per KV-cache block.
    pub block_size: usize,
    /// Bytes for the KV cache (rounded down to whole blocks).
    pub kv_cache_bytes: usize,
    /// New tokens one pass takes at most (decodes and prompt pieces together).
    pub max_batch_tokens: usize,
    /// Sequences in the running batch at most.
    pub max_running: usize,
    /// Requests waiting at most; more are turned away ([`Admission::Busy`]).
    pub max_waiting: usize,
    /// Positions one request may take at most (prompt and new tokens); `None`: the model's
    /// context (or the whole cache, when smaller).
    pub max_model_len: Option<usize>,
    /// The sizes compiled passes pad to on a PJRT device; `None`: powers of two up to
    /// `max_running` sequences, `max_batch_tokens` tokens and the context (see
    /// [`PagedBuckets::up_to`]). Every program they name is compiled when the engine starts.
    pub buckets: Option<PagedBuckets>,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            block_size: 16,
            kv_cache_bytes: 512 << 20,
            max_batch_tokens: 512,
            max_running: 64,
            max_waiting: 256,
            max_model_len: None,
            buckets: None,
        }
    }
}

/// One request: a prompt and how to continue it.
#[derive(Clone, Debug)]
pub struct Request {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// Tokens at most, stop tokens and strings, sampling.
    pub options: GenerateOptions,
    /// Log-probabilities to report with each token: `Some(n)` gives the chosen token's and
    /// the `n` most likely ones'.
    pub logprobs: Option<usize>,
    /// When the request is given up (ended with [`Finish::Timeout`]).
    pub deadline: Option<Instant>,
}

/// A token's log-probability, and those of the most likely tokens at its place.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token chosen.
    pub token: u32,
    /// Its log-probability under the model (before sampling's changes).
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// It ran to its token limit.
    Length,
    /// A stop token or string came.
    Stop,
    /// Its deadline passed.
    Timeout,
    /// The engine shut down first.
    Shutdown,
}

/// What a request produced, as it is produced.
#[derive(Clone, Debug)]
pub enum Event {
    /// A new token (`None` for the text held back until the end), and the text that became
    /// final with it (possibly empty: text that could still become a stop string, or an
    /// incomplete character, waits).
    Token {
        /// The token and its log-probabilities, when one came.
        token: Option<(u32, Option<TokenLogprob>)>,
        /// Text that became final.
        text: String,
    },
    /// The request ended; nothing follows.
    Done(Usage),
    /// The request failed; nothing follows.
    Failed(String),
}

/// What a finished request used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Why it ended.
    pub finish: Finish,
    /// Tokens in its prompt.
    pub prompt_tokens: usize,
    /// Of those, tokens found in the prefix cache.
    pub cached_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
}

/// Where a request's events go.
pub trait Sink: Send {
    /// Delivers an event; false when nobody receives them any more (the request is then
    /// cancelled).
    fn send(&mut self, event: Event) -> bool;
    /// True when nobody receives events any more (checked before every pass).
    fn closed(&self) -> bool;
}

impl Sink for Sender<Event> {
    fn send(&mut self, event: Event) -> bool {
        Sender::send(self, event).is_ok()
    }

    fn closed(&self) -> bool {
        // A crossbeam sender cannot tell; a send that fails cancels.
        false
    }
}

/// Hands `event` to `sink`; false when its receiver is gone. A sink that panics has failed
/// its own request only: it counts as gone, and the engine goes on.
fn deliver(sink: &mut dyn Sink, event: Event) -> bool {
    catch_unwind(AssertUnwindSafe(|| sink.send(event))).unwrap_or(false)
}

/// Whether `sink`'s receiver is gone (a sink that panics is).
fn gone(sink: &dyn Sink) -> bool {
    catch_unwind(AssertUnwindSafe(|| sink.closed())).unwrap_or(true)
}

/// Whether a request was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Queued; its events will come.
    Queued,
    /// The queue is full: try again later.
    Busy {
        /// Requests waiting now.
        waiting: usize,
    },
}

enum Msg {
    Request(Box<Request>, Box<dyn Sink>, Instant),
    Stop,
}

/// The state the handles share with the engine's thread.
struct Shared {
    metrics: Metrics,
    /// Requests sent and not yet admitted to the running batch.
    waiting: AtomicUsize,
    config: EngineConfig,
    /// Positions one request takes at most.
    context: usize,
    vocab: usize,
    /// Programs compiled at start, and how long that took.
    warm_up: (usize, Duration),
    /// Programs the process had compiled when the engine had warmed up.
    compiles_at_start: u64,
}

/// Programs compiled in this process so far: compiled functions, fused graphs and the eager
/// path's one-op programs.
fn compiles() -> u64 {
    let m = tpu_graph::metrics();
    m.total().compiles + m.fused.compiles + crate::tpu_ops::cache_stats().misses
}

/// A handle to a running engine (cheap to clone; the engine stops when [`Engine::shutdown`]
/// is called or every handle is gone).
#[derive(Clone)]
pub struct Engine {
    tx: Sender<Msg>,
    shared: Arc<Shared>,
    thread: Arc<std::sync::Mutex<Option<std::thread::JoinHandle<()>>>>,
}

impl Engine {
    /// Starts an engine for `model` on its own thread, with a KV cache sized by `config` on
    /// the model's device.
    pub fn start(
        model: Arc<Llama>,
        tokenizer: Arc<TextTokenizer>,
        config: EngineConfig,
    ) -> Result<Engine> {
        let c = &config;
        if c.block_size == 0 || c.max_batch_tokens == 0 || c.max_running == 0 {
            return Err(Error::invalid_argument(
                "engine",
                format!(
                    "block size {}, batch tokens {}, running sequences {}: each must be at \
                     least 1",
                    c.block_size, c.max_batch_tokens, c.max_running
                ),
            ));
        }
        let per_block = PagedCache::block_bytes(&model, c.block_size);
        let blocks = c.kv_cache_bytes / per_block;
        if blocks == 0 {
            return Err(Error::invalid_argument(
                "engine",
                format!(
                    "a KV cache of {} bytes holds no block of {} positions ({per_block} bytes)",
                    c.kv_cache_bytes, c.block_size
                ),
            ));
        }
        let context = model
            .config
            .max_positions
            .min(blocks * c.block_size)
            .min(c.max_model_len.unwrap_or(usize::MAX));
        if context == 0 {
            return Err(Error::invalid_argument(
                "engine",
                "a max_model_len of 0 positions, expected at least 1",
            ));
        }
        let buckets = match &c.buckets {
            Some(b) => b.clone(),
            None => PagedBuckets::up_to(c.max_running, c.max_batch_tokens, context),
        };
        let cache = PagedCache::new(&model, blocks, c.block_size)?.with_buckets(buckets);
        let t0 = Instant::now();
        let programs = model.warm_up_paged(&cache)?;
        let warm_up = (programs, t0.elapsed());
        let shared = Arc::new(Shared {
            metrics: Metrics::default(),
            waiting: AtomicUsize::new(0),
            config: config.clone(),
            context,
            vocab: model.config.vocab_size,
            warm_up,
            compiles_at_start: compiles(),
        });
        shared.metrics.update(|m| m.warm_up = warm_up);
        let (tx, rx) = crossbeam_channel::unbounded();
        let state = Loop {
            model,
            tokenizer,
            cache,
            blocks: BlockManager::new(blocks, config.block_size),
            shared: shared.clone(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            next_id: 0,
        };
        let thread = std::thread::Builder::new()
            .name("tpu-rs-engine".into())
            .spawn(move || state.run(rx))
            .map_err(|e| Error::io("starting the engine's thread", e))?;
        Ok(Engine {
            tx,
            shared,
            thread: Arc::new(std::sync::Mutex::new(Some(thread))),
        })
    }

    /// Queues a request whose events go to `sink`; an error names what is wrong with it (an
    /// empty prompt, one longer than the model's context or the cache, bad sampling values).
    pub fn submit(&self, request: Request, sink: impl Sink + 'static) -> Result<Admission> {
        let s = &self.shared;
        let n = request.prompt.len();
        let bad = |m: String| Err(Error::invalid_argument("request", m));
        if n == 0 {
            return bad("the prompt has no tokens".into());
        }
        if let Some(&t) = request.prompt.iter().find(|&&t| t as usize >= s.vocab) {
            return bad(format!(
                "the prompt has token {t}, the vocabulary has {}",
                s.vocab
            ));
        }
        let max_new = request.options.max_new;
        if max_new == 0 {
            return bad("max_tokens is 0, expected at least 1".into());
        }
        let limit = s.context;
        // The last new token is never fed back.
        if n + max_new - 1 > limit {
            return bad(format!(
                "the prompt's {n} tokens and up to {max_new} new ones need {} positions, the \
                 context holds {limit}",
                n + max_new - 1
            ));
        }
        if request.options.stop_strings.iter().any(String::is_empty) {
            return bad("a stop string is empty".into());
        }
        request.options.sampling.check()?;
        let waiting = s.waiting.fetch_add(1, Ordering::SeqCst);
        if waiting >= s.config.max_waiting {
            s.waiting.fetch_sub(1, Ordering::SeqCst);
            return Ok(Admission::Busy { waiting });
        }
        let msg = Msg::Request(Box::new(request), Box::new(sink), Instant::now());
        if self.tx.send(msg).is_err() {
            s.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::internal("engine", "the engine has stopped"));
        }
        Ok(Admission::Queued)
    }

    /// The engine's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Positions one request can take at most (prompt and new tokens): the model's context,
    /// or the whole KV cache or `max_model_len` when smaller.
    pub fn context(&self) -> usize {
        self.shared.context
    }

    /// Programs compiled when the engine started (on a PJRT device: one per bucket), and how
    /// long that took.
    pub fn warm_up(&self) -> (usize, Duration) {
        self.shared.warm_up
    }

    /// The model's vocabulary size (token ids must be below it).
    pub fn vocab(&self) -> usize {
        self.shared.vocab
    }

    /// How the engine is sized.
    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// Ends every request (with [`Finish::Shutdown`]) and stops the engine's thread; waits for
    /// it.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Msg::Stop);
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// One sequence in the engine.
struct Seq {
    id: u64,
    /// The prompt and the tokens generated so far.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Positions whose keys and values are in the cache.
    computed: usize,
    blocks: Vec<usize>,
    /// Blocks named in the prefix cache so far, and the last one's name.
    named: usize,
    last_name: u64,
    cached_tokens: usize,
    /// Whether its prompt was counted in the metrics (a preempted sequence comes back).
    counted: bool,
    stream: Stream,
    max_new: usize,
    logprobs: Option<usize>,
    deadline: Option<Instant>,
    sink: Box<dyn Sink>,
    arrived: Instant,
    last_token: Option<Instant>,
}

impl Seq {
    /// Gives back its blocks; it starts again from position 0 (its tokens are kept, so a
    /// preempted or postponed sequence is recomputed from them).
    fn forget_blocks(&mut self, blocks: &mut BlockManager) {
        blocks.release(&self.blocks);
        self.blocks.clear();
        self.computed = 0;
        self.named = 0;
        self.last_name = ROOT;
    }
}

/// The engine thread's state.
struct Loop {
    model: Arc<Llama>,
    tokenizer: Arc<TextTokenizer>,
    cache: PagedCache,
    blocks: BlockManager,
    shared: Arc<Shared>,
    running: Vec<Seq>,
    waiting: VecDeque<Seq>,
    next_id: u64,
}

/// What one pass does for one sequence: `tokens` new positions from `computed`.
struct Planned {
    /// Index into `running`.
    seq: usize,
    tokens: usize,
}

impl Loop {
    fn run(mut self, rx: Receiver<Msg>) {
        loop {
            let idle = self.running.is_empty() && self.waiting.is_empty();
            let first = if idle { rx.recv().ok() } else { None };
            if idle && first.is_none() {
                // Every handle is gone.
                return;
            }
            let mut stop = false;
            for msg in first.into_iter().chain(rx.try_iter()) {
                match msg {
                    Msg::Request(r, sink, at) => self.accept(*r, sink, at),
                    Msg::Stop => stop = true,
                }
            }
            if stop {
                self.stop_all();
                return;
            }
            self.drop_cancelled();
            let plan = self.schedule();
            if !plan.is_empty() {
                self.pass(&plan);
            }
            self.publish();
        }
    }

    fn accept(&mut self, r: Request, sink: Box<dyn Sink>, arrived: Instant) {
        let stream = match Stream::new(&r.prompt, &r.options) {
            Ok(s) => s,
            Err(e) => {
                let mut sink = sink;
                deliver(&mut *sink, Event::Failed(e.to_string()));
                self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        };
        self.next_id += 1;
        self.waiting.push_back(Seq {
            id: self.next_id,
            prompt_len: r.prompt.len(),
            tokens: r.prompt,
            computed: 0,
            blocks: Vec::new(),
            named: 0,
            last_name: ROOT,
            cached_tokens: 0,
            counted: false,
            stream,
            max_new: r.options.max_new,
            logprobs: r.logprobs,
            deadline: r.deadline,
            sink,
            arrived,
            last_token: None,
        });
    }

    /// Ends every request because the engine stops.
    fn stop_all(&mut self) {
        let all: Vec<Seq> = self
            .running
            .drain(..)
            .chain(self.waiting.drain(..))
            .collect();
        for s in all {
            self.end(s, Finish::Shutdown);
        }
        self.shared.waiting.store(0, Ordering::SeqCst);
    }

    /// Removes requests whose receivers are gone or whose deadlines passed.
    fn drop_cancelled(&mut self) {
        let now = Instant::now();
        let expired = |s: &Seq| s.deadline.is_some_and(|d| now >= d);
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            if gone(&*s.sink) || expired(s) {
                let mut s = self.running.remove(i);
                let timeout = expired(&s);
                self.release(&mut s);
                self.cancelled(s, timeout);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.waiting.len() {
            let s = &self.waiting[i];
            if gone(&*s.sink) || expired(s) {
                let mut s = self.waiting.remove(i).expect("index in range");
                self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
                let timeout = expired(&s);
                self.release(&mut s);
                self.cancelled(s, timeout);
            } else {
                i += 1;
            }
        }
    }

    fn cancelled(&mut self, s: Seq, timeout: bool) {
        if timeout {
            self.end(s, Finish::Timeout);
        } else {
            self.shared.metrics.update(|m| m.finish("abort"));
        }
    }

    fn release(&mut self, s: &mut Seq) {
        s.forget_blocks(&mut self.blocks);
    }

    /// Blocks a sequence needs to hold `end` positions, beyond those it has.
    fn missing(&self, s: &Seq, end: usize) -> usize {
        end.div_ceil(self.blocks.block_size())
            .saturating_sub(s.blocks.len())
    }

    /// Chooses this pass's work (see the module doc); new sequences join `running`.
    fn schedule(&mut self) -> Vec<Planned> {
        let mut budget = self.shared.config.max_batch_tokens;
        let mut plan: Vec<Planned> = Vec::new();
        // Decodes first, then prompt pieces, in arrival order.
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        order.sort_by_key(|&i| {
            let s = &self.running[i];
            (s.tokens.len() - s.computed > 1, s.id)
        });
        let mut preempted = Vec::new();
        for i in order {
            if budget == 0 {
                break;
            }
            if preempted.contains(&i) {
                continue;
            }
            let s = &self.running[i];
            let want = (s.tokens.len() - s.computed).min(budget);
            let end = s.computed + want;
            // Free blocks for it, preempting the newest other sequences not yet planned.
            while self.blocks.available() < self.missing(&self.running[i], end) {
                let victim = (0..self.running.len())
                    .filter(|&v| {
                        v != i && !preempted.contains(&v) && !plan.iter().any(|p| p.seq == v)
                    })
                    .max_by_key(|&v| self.running[v].id);
                match victim {
                    Some(v) => {
                        self.preempt(v);
                        preempted.push(v);
                    }
                    None => break,
                }
            }
            let s = &self.running[i];
            let fits = (s.blocks.len() + self.blocks.available()) * self.blocks.block_size();
            let tokens = want.min(fits.saturating_sub(s.computed));
            if tokens == 0 {
                // Nothing fits even alone: wait for blocks.
                continue;
            }
            self.grow(i, s.computed + tokens);
            budget -= tokens;
            plan.push(Planned { seq: i, tokens });
        }
        // Preempted sequences leave the batch (highest index first, so indices hold).
        preempted.sort_unstable();
        for &v in preempted.iter().rev() {
            let s = self.running.remove(v);
            for p in &mut plan {
                debug_assert_ne!(p.seq, v);
                if p.seq > v {
                    p.seq -= 1;
                }
            }
            self.waiting.push_front(s);
            self.shared.waiting.fetch_add(1, Ordering::SeqCst);
        }
        if !preempted.is_empty() {
            // Blocks are short: admitting now would only preempt again.
            return plan;
        }
        // Admit new sequences while the budget, the batch and the blocks last; keep a few
        // blocks back for the running sequences' next tokens.
        let reserve = self.running.len().div_ceil(8).max(1);
        while budget > 0 && self.running.len() < self.shared.config.max_running {
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            if s.blocks.is_empty() && s.computed == 0 {
                let bs = self.blocks.block_size();
                // At least one prompt token is computed, for the logits.
                let limit = (s.tokens.len() - 1) / bs;
                let (found, name) = self.blocks.lookup(&s.tokens, limit);
                let hit = found.len() * bs;
                if !s.counted {
                    s.cached_tokens = hit;
                }
                s.named = found.len();
                s.last_name = name;
                s.computed = hit;
                s.blocks = found;
            }
            let bs = self.blocks.block_size();
            let room = (s.blocks.len() + self.blocks.available().saturating_sub(reserve)) * bs;
            let tokens = (s.tokens.len() - s.computed)
                .min(budget)
                .min(room.saturating_sub(s.computed));
            if tokens == 0 {
                // No room now: it stays first in the queue, its prefix blocks given back.
                s.forget_blocks(&mut self.blocks);
                self.waiting.push_front(s);
                break;
            }
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
            if !s.counted {
                s.counted = true;
                let (n, hit) = (s.prompt_len as u64, s.cached_tokens as u64);
                self.shared.metrics.update(|m| {
                    m.prompt_tokens += n;
                    m.prefix_queries += n;
                    m.prefix_hits += hit;
                });
            }
            self.running.push(s);
            let i = self.running.len() - 1;
            self.grow(i, self.running[i].computed + tokens);
            budget -= tokens;
            plan.push(Planned { seq: i, tokens });
        }
        plan
    }

    /// Gives running sequence `i` the blocks to hold `end` positions (they are free).
    fn grow(&mut self, i: usize, end: usize) {
        for _ in 0..self.missing(&self.running[i], end) {
            match self.blocks.take() {
                Some(b) => self.running[i].blocks.push(b),
                None => unreachable!("blocks were counted before"),
            }
        }
    }

    /// Frees running sequence `v`'s blocks; it will be recomputed from its tokens.
    fn preempt(&mut self, v: usize) {
        self.running[v].forget_blocks(&mut self.blocks);
        self.shared.metrics.update(|m| m.preemptions += 1);
    }

    /// Runs one pass of the model over `plan` and hands each sequence its next token.
    fn pass(&mut self, plan: &[Planned]) {
        let chunks: Vec<PagedChunk> = plan
            .iter()
            .map(|p| {
                let s = &self.running[p.seq];
                let end = s.computed + p.tokens;
                PagedChunk {
                    tokens: &s.tokens[s.computed..end],
                    start: s.computed,
                    blocks: &s.blocks,
                    logits: end == s.tokens.len(),
                }
            })
            .collect();
        let vocab = self.shared.vocab;
        let logits = catch_unwind(AssertUnwindSafe(|| -> Result<Vec<f32>> {
            let l = self.model.forward_paged(&self.cache, &chunks)?;
            let l = l.to_device(&Device::cpu())?.to_dtype(DType::F32)?;
            l.to_vec::<f32>()
        }));
        drop(chunks);
        self.shared.metrics.update(|m| m.steps += 1);
        let logits = match logits {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return self.fail(plan, e.to_string()),
            Err(panic) => return self.fail(plan, panic_text(&panic)),
        };
        let mut row = 0;
        let mut ended = Vec::new();
        for p in plan {
            let bs = self.blocks.block_size();
            let s = &mut self.running[p.seq];
            s.computed += p.tokens;
            while (s.named + 1) * bs <= s.computed {
                let at = s.named * bs;
                s.last_name =
                    self.blocks
                        .name(s.blocks[s.named], s.last_name, &s.tokens[at..at + bs]);
                s.named += 1;
            }
            if s.computed < s.tokens.len() {
                continue;
            }
            let l = &logits[row * vocab..(row + 1) * vocab];
            row += 1;
            let (tokenizer, metrics) = (&self.tokenizer, &self.shared.metrics);
            let outcome = catch_unwind(AssertUnwindSafe(|| next_token(s, l, tokenizer, metrics)));
            match outcome {
                Ok(Ok(Some(finish))) => ended.push((p.seq, Ok(finish))),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => ended.push((p.seq, Err(e.to_string()))),
                Err(panic) => ended.push((p.seq, Err(panic_text(&panic)))),
            }
        }
        self.settle(ended);
    }

    /// Ends the sequences listed (indices into `running`), finished or failed.
    fn settle(&mut self, mut ended: Vec<(usize, std::result::Result<Option<Finish>, String>)>) {
        ended.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, outcome) in ended {
            let mut s = self.running.remove(i);
            self.release(&mut s);
            match outcome {
                Ok(Some(f)) => self.end(s, f),
                // The receiver is gone.
                Ok(None) => self.shared.metrics.update(|m| m.finish("abort")),
                Err(e) => {
                    deliver(&mut *s.sink, Event::Failed(e));
                    self.shared.metrics.update(|m| m.finish("error"));
                }
            }
        }
    }

    /// Fails every sequence of a pass that failed.
    fn fail(&mut self, plan: &[Planned], e: String) {
        let ended = plan.iter().map(|p| (p.seq, Err(e.clone()))).collect();
        self.settle(ended);
    }

    /// Ends a sequence whose blocks are already released: its held-back text, its usage.
    fn end(&mut self, s: Seq, finish: Finish) {
        let Seq {
            stream,
            mut sink,
            prompt_len,
            cached_tokens,
            arrived,
            ..
        } = s;
        let mut rest = String::new();
        let generation = catch_unwind(AssertUnwindSafe(|| {
            stream.finish(Duration::ZERO, Duration::ZERO, &mut |t: &str| {
                rest.push_str(t)
            })
        }));
        let generation = match generation {
            Ok(g) => g,
            Err(panic) => {
                deliver(&mut *sink, Event::Failed(panic_text(&panic)));
                self.shared.metrics.update(|m| m.finish("error"));
                return;
            }
        };
        if !rest.is_empty() {
            deliver(
                &mut *sink,
                Event::Token {
                    token: None,
                    text: rest,
                },
            );
        }
        let usage = Usage {
            finish,
            prompt_tokens: prompt_len,
            cached_tokens,
            completion_tokens: generation.ids.len(),
        };
        let reason = match finish {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Timeout | Finish::Shutdown => "abort",
        };
        // Counted before the receiver hears of it, so what it reads next includes it.
        self.shared.metrics.update(|m| {
            m.finish(reason);
            m.e2e.observe(arrived.elapsed());
        });
        deliver(&mut *sink, Event::Done(usage));
    }

    /// Publishes the gauges.
    fn publish(&self) {
        let (running, waiting) = (self.running.len(), self.waiting.len());
        let usage = self.blocks.used() as f64 / self.blocks.total() as f64;
        let compiled = compiles().saturating_sub(self.shared.compiles_at_start);
        self.shared.metrics.update(|m| {
            m.compiles_after_start = compiled;
            m.running = running;
            m.waiting = waiting;
            m.kv_usage = usage;
        });
    }
}

/// Chooses sequence `s`'s next token from `logits` and sends it; `Some` when the sequence
/// ends (`Ok(None)` inside when its receiver is gone).
fn next_token(
    s: &mut Seq,
    logits: &[f32],
    tokenizer: &TextTokenizer,
    metrics: &Metrics,
) -> Result<Option<Option<Finish>>> {
    let mut text = String::new();
    let next = s
        .stream
        .step(logits, tokenizer, &mut |t: &str| text.push_str(t))?;
    let chosen = *s
        .stream
        .out
        .last()
        .ok_or_else(|| Error::internal("engine", "a step that chose no token"))?;
    let now = Instant::now();
    let first = s.last_token.is_none();
    let since = s.last_token.map_or(now - s.arrived, |t| now - t);
    s.last_token = Some(now);
    let logprob = s.logprobs.map(|n| logprobs(logits, chosen, n));
    let alive = deliver(
        &mut *s.sink,
        Event::Token {
            token: Some((chosen, logprob)),
            text,
        },
    );
    metrics.update(|m| {
        m.generation_tokens += 1;
        match first {
            true => m.ttft.observe(since),
            false => m.itl.observe(since),
        }
    });
    if !alive {
        return Ok(Some(None));
    }
    match next {
        None => Ok(Some(Some(match s.stream.finish {
            Some(FinishReason::Length) | None => Finish::Length,
            Some(FinishReason::Stop) => Finish::Stop,
        }))),
        Some(t) => {
            s.tokens.push(t);
            if s.stream.out.len() >= s.max_new {
                Ok(Some(Some(Finish::Length)))
            } else {
                Ok(None)
            }
        }
    }
}

/// The log-probability of `chosen` and the `n` most likely tokens under `logits`.
fn logprobs(logits: &[f32], chosen: u32, n: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let lp = |t: usize| (logits[t] as f64 - lse) as f32;
    let mut top: Vec<usize> = (0..logits.len()).collect();
    let n = n.min(logits.len());
    if n > 0 {
        top.select_nth_unstable_by(n - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
    }
    top.truncate(n);
    top.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    TokenLogprob {
        token: chosen,
        logprob: lp(chosen as usize),
        top: top.into_iter().map(|t| (t as u32, lp(t))).collect(),
    }
}

/// The message of a caught panic.
fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    format!("internal error while serving the request: {what}")
}
