//! `POST /v1/chat/completions` and `POST /v1/completions`: the request read and checked
//! parameter by parameter, its prompts (times `n`) handed to the engine, the tokens answered as
//! one JSON body or streamed as server-sent events (OpenAI's chunks, then `data: [DONE]`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body as HttpBody, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tpu_rs::models::{ChatMessage, GenerateOptions, Sampling};
use tpu_rs::serve::{Admission, Event, Finish, Request, Sink, TokenLogprob, Usage};

use crate::error::ApiError;
use crate::params::{Body, wrong};
use crate::state::AppState;

/// Which endpoint: their chunks and bodies differ.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    Chat,
    Text,
}

/// A request read and checked.
struct Job {
    api: Api,
    prompts: Vec<Vec<u32>>,
    n: usize,
    stream: bool,
    options: GenerateOptions,
    /// Log-probabilities wanted: `Some(top)`.
    logprobs: Option<usize>,
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    match read(&s, &body, Api::Chat) {
        Ok(job) => run(s, job).await,
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/completions`.
pub async fn completions(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    match read(&s, &body, Api::Text) {
        Ok(job) => run(s, job).await,
        Err(e) => e.into_response(),
    }
}

/// A seed for a request that gives none: different for every request.
fn fresh_seed() -> u64 {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ COUNT
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Reads and checks a request body.
fn read(s: &AppState, bytes: &[u8], api: Api) -> Result<Job, ApiError> {
    if s.shutting_down() {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    let b = Body::parse(bytes)?;
    let model = b.string("model")?;
    if model != s.model_name {
        return Err(ApiError::unknown_model(&model, &s.served()));
    }
    for unsupported in ["tools", "functions", "suffix", "response_format"] {
        if b.get(unsupported).is_some() {
            return Err(ApiError::bad(
                format!("'{unsupported}' is not supported by this server"),
                Some(unsupported),
            ));
        }
    }
    if b.boolean("echo")? == Some(true) {
        return Err(ApiError::bad(
            "'echo' is not supported by this server",
            Some("echo"),
        ));
    }
    let (prompts, prompt_param) = match api {
        Api::Chat => (vec![chat_prompt(s, &b)?], "messages"),
        Api::Text => (text_prompts(s, &b)?, "prompt"),
    };
    let n = b
        .integer("n", 1..=16, "a whole number from 1 to 16")?
        .unwrap_or(1) as usize;
    let stream = b.boolean("stream")?.unwrap_or(false);
    let sampling = Sampling {
        temperature: b
            .number("temperature", 0.0..=2.0, "a number from 0 to 2")?
            .unwrap_or(1.0) as f32,
        top_p: match b.number("top_p", 0.0..=1.0, "a number in (0, 1]")? {
            Some(p) if p <= 0.0 => return Err(wrong("top_p", "a number in (0, 1]", &json!(p))),
            p => p.unwrap_or(1.0) as f32,
        },
        top_k: match b.integer(
            "top_k",
            -1..=i64::MAX,
            "a whole number >= -1 (-1 or 0: all)",
        )? {
            Some(k) if k > 0 => k as usize,
            _ => 0,
        },
        min_p: b
            .number("min_p", 0.0..=1.0, "a number from 0 to 1")?
            .unwrap_or(0.0) as f32,
        repetition_penalty: match b.number("repetition_penalty", 0.0..=f64::MAX, "a number > 0")? {
            Some(p) if p <= 0.0 => {
                return Err(wrong("repetition_penalty", "a number > 0", &json!(p)));
            }
            p => p.unwrap_or(1.0) as f32,
        },
        presence_penalty: b
            .number("presence_penalty", -2.0..=2.0, "a number from -2 to 2")?
            .unwrap_or(0.0) as f32,
        frequency_penalty: b
            .number("frequency_penalty", -2.0..=2.0, "a number from -2 to 2")?
            .unwrap_or(0.0) as f32,
        seed: match b.integer("seed", i64::MIN..=i64::MAX, "a whole number")? {
            Some(v) => v as u64,
            None => fresh_seed(),
        },
    };
    let stop_strings = b.strings("stop", 4)?;
    let max = match api {
        Api::Chat => {
            match b.integer("max_completion_tokens", 1..=i64::MAX, "a whole number >= 1")? {
                Some(m) => Some(m),
                None => b.integer("max_tokens", 1..=i64::MAX, "a whole number >= 1")?,
            }
        }
        Api::Text => Some(
            b.integer("max_tokens", 1..=i64::MAX, "a whole number >= 1")?
                .unwrap_or(16),
        ),
    };
    let context = s.engine.context();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    if longest > context {
        return Err(ApiError::too_long(
            format!(
                "this model's maximum context length is {context} tokens, the {prompt_param} \
                 take {longest}"
            ),
            prompt_param,
        ));
    }
    // The last new token is never fed back, so a full context still gives one.
    let room = context + 1 - longest;
    let max_new = match max {
        Some(m) if m as usize > room => {
            return Err(ApiError::too_long(
                format!(
                    "this model's maximum context length is {context} tokens; the \
                     {prompt_param} take {longest} and {m} more were asked for (at most {room})"
                ),
                "max_tokens",
            ));
        }
        Some(m) => m as usize,
        None => room,
    };
    let ignore_eos = b.boolean("ignore_eos")?.unwrap_or(false);
    let logprobs = match api {
        Api::Chat => match b.boolean("logprobs")? {
            Some(true) => Some(
                b.integer("top_logprobs", 0..=20, "a whole number from 0 to 20")?
                    .unwrap_or(0) as usize,
            ),
            _ => {
                if b.get("top_logprobs").is_some() {
                    return Err(ApiError::bad(
                        "'top_logprobs' needs 'logprobs' set to true",
                        Some("top_logprobs"),
                    ));
                }
                None
            }
        },
        Api::Text => b
            .integer("logprobs", 0..=20, "a whole number from 0 to 20")?
            .map(|n| n as usize),
    };
    Ok(Job {
        api,
        prompts,
        n,
        stream,
        options: GenerateOptions {
            max_new,
            stop_tokens: if ignore_eos {
                Vec::new()
            } else {
                s.stop_tokens.clone()
            },
            stop_strings,
            sampling,
        },
        logprobs,
    })
}

/// The chat's prompt: its messages through the model's template.
fn chat_prompt(s: &AppState, b: &Body) -> Result<Vec<u32>, ApiError> {
    let template = s.template.as_ref().ok_or_else(|| {
        ApiError::bad("this model has no chat template; use /v1/completions", None)
    })?;
    let messages = match b.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => {
            return Err(ApiError::bad("'messages' is empty", Some("messages")));
        }
        Some(v) => return Err(wrong("messages", "a list of messages", v)),
        None => return Err(ApiError::bad("'messages' is required", Some("messages"))),
    };
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let at = |f: &str| format!("messages[{i}].{f}");
        let role = match m.get("role") {
            Some(Value::String(r))
                if ["system", "developer", "user", "assistant", "tool"].contains(&r.as_str()) =>
            {
                r.clone()
            }
            Some(v) => {
                return Err(wrong(
                    &at("role"),
                    "one of system, developer, user, assistant, tool",
                    v,
                ));
            }
            None => {
                return Err(ApiError::bad(
                    format!("'{}' is required", at("role")),
                    Some(&at("role")),
                ));
            }
        };
        let content = match m.get("content") {
            Some(Value::String(c)) => c.clone(),
            Some(Value::Null) | None if role == "assistant" => String::new(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => text.push_str(t),
                        _ => {
                            return Err(ApiError::bad(
                                format!(
                                    "'{}' is not a text part: this model reads text only",
                                    at(&format!("content[{j}]"))
                                ),
                                Some(&at("content")),
                            ));
                        }
                    }
                }
                text
            }
            Some(v) => return Err(wrong(&at("content"), "a string or a list of text parts", v)),
            None => {
                return Err(ApiError::bad(
                    format!("'{}' is required", at("content")),
                    Some(&at("content")),
                ));
            }
        };
        // The template knows system, user and assistant; a developer message is a system one.
        let role = if role == "developer" {
            "system".into()
        } else {
            role
        };
        out.push(ChatMessage::new(role, content));
    }
    let text = template
        .render(&out, true)
        .map_err(|e| ApiError::bad(e.to_string(), Some("messages")))?;
    // The template writes the special tokens itself.
    Ok(s.tokenizer.encode(&text, false)?)
}

/// The completion's prompts: a string, a list of strings, a list of token ids, or a list of
/// those.
fn text_prompts(s: &AppState, b: &Body) -> Result<Vec<Vec<u32>>, ApiError> {
    let vocab = s.engine.vocab();
    let ids = |v: &[Value], at: &str| -> Result<Vec<u32>, ApiError> {
        v.iter()
            .map(|t| match t.as_u64() {
                Some(id) if (id as usize) < vocab => Ok(id as u32),
                _ => Err(wrong(at, &format!("token ids below {vocab}"), t)),
            })
            .collect()
    };
    let encode = |t: &str| -> Result<Vec<u32>, ApiError> { Ok(s.tokenizer.encode(t, true)?) };
    let prompts = match b.get("prompt") {
        Some(Value::String(t)) => vec![encode(t)?],
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::bad("'prompt' is empty", Some("prompt")));
        }
        Some(Value::Array(a)) => match &a[0] {
            Value::Number(_) => vec![ids(a, "prompt")?],
            _ => a
                .iter()
                .enumerate()
                .map(|(i, p)| match p {
                    Value::String(t) => encode(t),
                    Value::Array(t) => ids(t, &format!("prompt[{i}]")),
                    v => Err(wrong(
                        &format!("prompt[{i}]"),
                        "a string or a list of token ids",
                        v,
                    )),
                })
                .collect::<Result<_, _>>()?,
        },
        Some(v) => {
            return Err(wrong(
                "prompt",
                "a string, a list of strings or a list of token ids",
                v,
            ));
        }
        None => return Err(ApiError::bad("'prompt' is required", Some("prompt"))),
    };
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(ApiError::bad(
            format!("prompt {i} has no tokens"),
            Some("prompt"),
        ));
    }
    Ok(prompts)
}

/// Where a choice's events go: the request's one channel, tagged with the choice.
struct Tagged {
    choice: usize,
    tx: UnboundedSender<(usize, Event)>,
}

impl Sink for Tagged {
    fn send(&mut self, event: Event) -> bool {
        self.tx.send((self.choice, event)).is_ok()
    }

    fn closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Submits every choice of `job`; the receiver of their events.
fn submit(s: &AppState, job: &Job) -> Result<UnboundedReceiver<(usize, Event)>, ApiError> {
    let (tx, rx) = unbounded_channel();
    let deadline = s.config.request_timeout.map(|t| Instant::now() + t);
    for (p, prompt) in job.prompts.iter().enumerate() {
        for j in 0..job.n {
            let mut options = job.options.clone();
            options.sampling.seed = options.sampling.seed.wrapping_add(j as u64);
            let request = Request {
                prompt: prompt.clone(),
                options,
                logprobs: job.logprobs,
                deadline,
            };
            let sink = Tagged {
                choice: p * job.n + j,
                tx: tx.clone(),
            };
            match s.engine.submit(request, sink)? {
                Admission::Queued => {}
                // The choices already queued end when `rx` is dropped.
                Admission::Busy { waiting } => return Err(ApiError::busy(waiting)),
            }
        }
    }
    Ok(rx)
}

/// Runs a checked request: one body, or a stream.
async fn run(s: Arc<AppState>, job: Job) -> Response {
    let rx = match submit(&s, &job) {
        Ok(rx) => rx,
        Err(e) => return e.into_response(),
    };
    let head = Head::new(&s, job.api);
    if job.stream {
        stream(s, job, head, rx)
    } else {
        whole(s, job, head, rx).await
    }
}

/// What every chunk or body of a response repeats.
struct Head {
    id: String,
    created: u64,
    model: String,
}

impl Head {
    fn new(s: &AppState, api: Api) -> Head {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let prefix = match api {
            Api::Chat => "chatcmpl",
            Api::Text => "cmpl",
        };
        Head {
            id: format!(
                "{prefix}-{:x}{:06x}",
                s.created,
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: s.model_name.clone(),
        }
    }
}

/// One choice as it accumulates.
#[derive(Default)]
struct Choice {
    text: String,
    tokens: Vec<(u32, Option<TokenLogprob>)>,
    usage: Option<Usage>,
}

/// The usage object of all choices (each prompt counted once).
fn usage_json(job: &Job, choices: &HashMap<usize, Usage>) -> Value {
    let mut prompt = 0;
    let mut cached = 0;
    let mut completion = 0;
    for (&i, u) in choices {
        if i % job.n == 0 {
            prompt += u.prompt_tokens;
            cached += u.cached_tokens;
        }
        completion += u.completion_tokens;
    }
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": { "cached_tokens": cached },
    })
}

fn finish_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length | Finish::Timeout | Finish::Shutdown => "length",
    }
}

/// The error a choice ending this way means, if any.
fn finish_error(s: &AppState, f: Finish) -> Option<ApiError> {
    match f {
        Finish::Timeout => Some(ApiError::timeout(
            s.config.request_timeout.map_or(0.0, |t| t.as_secs_f64()),
        )),
        Finish::Shutdown => Some(ApiError::unavailable(
            "the server shut down before the request finished",
        )),
        Finish::Stop | Finish::Length => None,
    }
}

/// A token's text and UTF-8 bytes.
fn token_text(s: &AppState, t: u32) -> String {
    s.tokenizer.decode(&[t], false).unwrap_or_default()
}

/// Chat's log-probabilities of `tokens`.
fn chat_logprobs(s: &AppState, tokens: &[(u32, Option<TokenLogprob>)]) -> Value {
    let entry = |t: u32, lp: f32| {
        let text = token_text(s, t);
        json!({ "token": text, "logprob": lp, "bytes": text.as_bytes() })
    };
    let content: Vec<Value> = tokens
        .iter()
        .filter_map(|(_, lp)| lp.as_ref())
        .map(|lp| {
            let mut e = entry(lp.token, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
            e
        })
        .collect();
    json!({ "content": content })
}

/// Completions' log-probabilities of `tokens`, the first starting at text offset `offset`.
fn text_logprobs(s: &AppState, tokens: &[(u32, Option<TokenLogprob>)], mut offset: usize) -> Value {
    let (mut toks, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for lp in tokens.iter().filter_map(|(_, lp)| lp.as_ref()) {
        let text = token_text(s, lp.token);
        offsets.push(offset);
        offset += text.len();
        toks.push(text);
        lps.push(lp.logprob);
        let top: serde_json::Map<String, Value> = lp
            .top
            .iter()
            .map(|&(t, l)| (token_text(s, t), json!(l)))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({ "tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets })
}

/// Waits for every choice and answers one body.
async fn whole(
    s: Arc<AppState>,
    job: Job,
    head: Head,
    mut rx: UnboundedReceiver<(usize, Event)>,
) -> Response {
    let total = job.prompts.len() * job.n;
    let mut choices: Vec<Choice> = (0..total).map(|_| Choice::default()).collect();
    let mut done = 0;
    while done < total {
        let Some((i, event)) = rx.recv().await else {
            return ApiError::internal("the engine stopped answering").into_response();
        };
        let c = &mut choices[i];
        match event {
            Event::Token { token, text } => {
                c.text.push_str(&text);
                c.tokens.extend(token);
            }
            Event::Done(u) => {
                if let Some(e) = finish_error(&s, u.finish) {
                    return e.into_response();
                }
                c.usage = Some(u);
                done += 1;
            }
            Event::Failed(m) => return ApiError::internal(m).into_response(),
        }
    }
    let usages: HashMap<usize, Usage> = choices
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.usage.map(|u| (i, u)))
        .collect();
    let list: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let finish = c.usage.map(|u| finish_reason(u.finish));
            let want = job.logprobs.is_some();
            match job.api {
                Api::Chat => json!({
                    "index": i,
                    "message": { "role": "assistant", "content": c.text },
                    "logprobs": if want { chat_logprobs(&s, &c.tokens) } else { Value::Null },
                    "finish_reason": finish,
                }),
                Api::Text => json!({
                    "index": i,
                    "text": c.text,
                    "logprobs": if want { text_logprobs(&s, &c.tokens, 0) } else { Value::Null },
                    "finish_reason": finish,
                }),
            }
        })
        .collect();
    let object = match job.api {
        Api::Chat => "chat.completion",
        Api::Text => "text_completion",
    };
    axum::Json(json!({
        "id": head.id,
        "object": object,
        "created": head.created,
        "model": head.model,
        "choices": list,
        "usage": usage_json(&job, &usages),
    }))
    .into_response()
}

/// What the stream has left to say.
struct Streaming {
    s: Arc<AppState>,
    job: Job,
    head: Head,
    rx: UnboundedReceiver<(usize, Event)>,
    /// Per choice: text bytes sent (for completions' text offsets), its usage once done.
    sent: Vec<usize>,
    usages: HashMap<usize, Usage>,
    /// Chunks ready to go out.
    queue: std::collections::VecDeque<String>,
    finished: bool,
}

impl Streaming {
    fn chunk(&self, choices: Value, usage: Value) -> String {
        let object = match self.job.api {
            Api::Chat => "chat.completion.chunk",
            Api::Text => "text_completion",
        };
        let mut c = json!({
            "id": self.head.id,
            "object": object,
            "created": self.head.created,
            "model": self.head.model,
            "choices": choices,
        });
        if !usage.is_null() {
            c["usage"] = usage;
        }
        format!("data: {c}\n\n")
    }

    /// The chunk of choice `i`'s new text and token, or its end.
    fn choice(
        &mut self,
        i: usize,
        text: &str,
        token: Option<(u32, Option<TokenLogprob>)>,
        finish: Option<&str>,
    ) -> String {
        let tokens: Vec<_> = token.into_iter().collect();
        let want = self.job.logprobs.is_some() && !tokens.is_empty();
        let c = match self.job.api {
            Api::Chat => {
                let delta = match finish {
                    Some(_) => json!({}),
                    None => json!({ "content": text }),
                };
                json!([{
                    "index": i,
                    "delta": delta,
                    "logprobs": if want { chat_logprobs(&self.s, &tokens) } else { Value::Null },
                    "finish_reason": finish,
                }])
            }
            Api::Text => json!([{
                "index": i,
                "text": text,
                "logprobs": if want { text_logprobs(&self.s, &tokens, self.sent[i]) } else { Value::Null },
                "finish_reason": finish,
            }]),
        };
        self.sent[i] += text.len();
        self.chunk(c, Value::Null)
    }

    /// Turns the next event into chunks; false when the stream is over.
    async fn advance(&mut self) -> bool {
        if self.finished {
            return false;
        }
        let total = self.job.prompts.len() * self.job.n;
        let Some((i, event)) = self.rx.recv().await else {
            self.error(ApiError::internal("the engine stopped answering"));
            return true;
        };
        match event {
            Event::Token { token, text } => {
                if !text.is_empty() || (self.job.logprobs.is_some() && token.is_some()) {
                    let c = self.choice(i, &text, token, None);
                    self.queue.push_back(c);
                }
            }
            Event::Done(u) => {
                if let Some(e) = finish_error(&self.s, u.finish) {
                    self.error(e);
                    return true;
                }
                let c = self.choice(i, "", None, Some(finish_reason(u.finish)));
                self.queue.push_back(c);
                self.usages.insert(i, u);
                if self.usages.len() == total {
                    let usage = usage_json(&self.job, &self.usages);
                    let c = self.chunk(json!([]), usage);
                    self.queue.push_back(c);
                    self.queue.push_back("data: [DONE]\n\n".into());
                    self.finished = true;
                }
            }
            Event::Failed(m) => self.error(ApiError::internal(m)),
        }
        true
    }

    /// Ends the stream with an error object (the status is already sent).
    fn error(&mut self, e: ApiError) {
        self.queue.push_back(format!("data: {}\n\n", e.body()));
        self.queue.push_back("data: [DONE]\n\n".into());
        self.finished = true;
    }
}

/// Streams the choices as server-sent events.
fn stream(
    s: Arc<AppState>,
    job: Job,
    head: Head,
    rx: UnboundedReceiver<(usize, Event)>,
) -> Response {
    let total = job.prompts.len() * job.n;
    let mut st = Streaming {
        s,
        job,
        head,
        rx,
        sent: vec![0; total],
        usages: HashMap::new(),
        queue: Default::default(),
        finished: false,
    };
    // Chat streams open with the assistant's role, per choice.
    if st.job.api == Api::Chat {
        for i in 0..total {
            let c = st.chunk(
                json!([{
                    "index": i,
                    "delta": { "role": "assistant", "content": "" },
                    "logprobs": Value::Null,
                    "finish_reason": Value::Null,
                }]),
                Value::Null,
            );
            st.queue.push_back(c);
        }
    }
    let body = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(c) = st.queue.pop_front() {
                return Some((Ok::<_, Infallible>(Bytes::from(c)), st));
            }
            if !st.advance().await {
                return None;
            }
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        HttpBody::from_stream(body),
    )
        .into_response()
}
