//! Chat templates: the Jinja templates that checkpoints carry (`tokenizer.chat_template` in GGUF
//! metadata, `chat_template` in a Hugging Face `tokenizer_config.json` or a
//! `chat_template.jinja` file), rendered as transformers' `apply_chat_template` renders them.
//!
//! The engine is minijinja with its Python-compatibility methods (`.strip()`, `.startswith()`,
//! `.items()` ...), set up like transformers' environment: blocks trimmed and left-stripped,
//! loop controls, `raise_exception(msg)` (an error carrying the template's message),
//! `strftime_now(fmt)`, and `tojson` spaced like Python's `json.dumps` with non-ASCII kept.

use std::path::Path;
use std::sync::Arc;

use minijinja::value::Serde;
use minijinja::{Environment, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};
use tpu_runtime::{Error, Result};
use tpu_tensor::GgufFile;

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (or whatever roles the template knows).
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message from `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
}

/// A compiled chat template with the special tokens it may print. Cheap to clone, `Send +
/// Sync`.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

fn template_error(e: minijinja::Error) -> Error {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    Error::invalid_argument("chat template", msg)
}

impl ChatTemplate {
    /// Compiles `source`; `bos` and `eos` are the texts of the model's begin- and
    /// end-of-sequence tokens (templates print them as `bos_token` and `eos_token`).
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(template_error)?;
        env.set_syntax(syntax);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_template_owned("chat", source.to_string())
            .map_err(template_error)?;
        Ok(ChatTemplate {
            env: Arc::new(env),
            bos: bos.into(),
            eos: eos.into(),
        })
    }

    /// The template in a GGUF file's metadata (`tokenizer.chat_template`), with its BOS and EOS
    /// tokens' texts; `None` when the file has none.
    pub fn from_gguf(f: &GgufFile) -> Result<Option<ChatTemplate>> {
        let Some(src) = f.meta("tokenizer.chat_template").and_then(|v| v.as_str()) else {
            return Ok(None);
        };
        let tokens = f.meta("tokenizer.ggml.tokens").and_then(|v| v.as_array());
        let token = |key: &str| -> String {
            let id = f.meta(key).and_then(|v| v.as_u64());
            id.and_then(|i| tokens?.get(i as usize)?.as_str().map(str::to_string))
                .unwrap_or_default()
        };
        let (bos, eos) = (
            token("tokenizer.ggml.bos_token_id"),
            token("tokenizer.ggml.eos_token_id"),
        );
        ChatTemplate::new(src, &bos, &eos).map(Some)
    }

    /// The template of a Hugging Face model folder: `chat_template.jinja`, else the
    /// `chat_template` of `tokenizer_config.json` (a string, or a list of named templates of
    /// which `default` is taken); `None` when there is neither.
    pub fn from_folder(dir: &Path) -> Result<Option<ChatTemplate>> {
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: serde_json::Value = match std::fs::read_to_string(&cfg_path) {
            Ok(s) => serde_json::from_str(&s).map_err(|e| Error::Format {
                path: cfg_path.display().to_string(),
                format: "JSON",
                reason: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::Value::Null,
            Err(e) => return Err(Error::io(cfg_path.display().to_string(), e)),
        };
        // A special token is a string or `{"content": ...}`.
        let token = |k: &str| -> String {
            match &cfg[k] {
                serde_json::Value::String(s) => s.clone(),
                v => v["content"].as_str().unwrap_or_default().to_string(),
            }
        };
        let jinja = dir.join("chat_template.jinja");
        let src = match std::fs::read_to_string(&jinja) {
            Ok(s) => Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match &cfg["chat_template"] {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Array(named) => named
                    .iter()
                    .find(|t| t["name"] == "default")
                    .and_then(|t| t["template"].as_str().map(str::to_string)),
                _ => None,
            },
            Err(e) => return Err(Error::io(jinja.display().to_string(), e)),
        };
        match src {
            Some(s) => ChatTemplate::new(&s, &token("bos_token"), &token("eos_token")).map(Some),
            None => Ok(None),
        }
    }

    /// The conversation as the model's prompt text; with `add_generation_prompt`, ending where
    /// the assistant's answer starts. An error carries the template's own message (as from
    /// `raise_exception`).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let t = self.env.get_template("chat").map_err(template_error)?;
        t.render(context! {
            messages => Value::from(Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
        })
        .map_err(template_error)
    }
}

/// Today's date and time (UTC) formatted with the C `strftime` codes templates use (`%Y %y %m
/// %d %e %B %b %A %a %H %M %S %j %%`); another code is an error naming it.
fn strftime_now(fmt: &str) -> std::result::Result<String, minijinja::Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    format_time(secs, fmt)
}

/// `secs` since 1970 (UTC) formatted as [`strftime_now`] says.
fn format_time(secs: i64, fmt: &str) -> std::result::Result<String, minijinja::Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (the proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let before = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334][(m - 1) as usize];
    let yday = before + d + i64::from(leap && m > 2);
    let (month, wday) = (MONTHS[(m - 1) as usize], DAYS[days.rem_euclid(7) as usize]);
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(wday),
            Some('a') => out.push_str(&wday[..3]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: %{} is not a code tpu-rs formats",
                        other.map_or(String::new(), String::from)
                    ),
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_format_like_strftime() {
        // 2024-02-29 13:05:09 UTC was a Thursday, day 60 of the year.
        let t = 1_709_211_909;
        assert_eq!(
            format_time(t, "%Y-%m-%d %H:%M:%S %j %a %A %b %B %y|%e|%%").unwrap(),
            "2024-02-29 13:05:09 060 Thu Thursday Feb February 24|29|%"
        );
        assert_eq!(format_time(0, "%d %b %Y").unwrap(), "01 Jan 1970");
        assert!(format_time(0, "%Q").is_err());
    }

    #[test]
    fn python_methods_tojson_and_raise_exception() {
        let src = "{{ bos_token }}{% for m in messages %}{{ m.role.upper() }}:{{ m.content.strip() \
                   }}|{% endfor %}{{ {'b': [1, 2], 'a': 'é'}|tojson }}\n{% if messages|length > 2 \
                   %}{{ raise_exception('too many: ' ~ messages|length) }}{% endif %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let two = [ChatMessage::system(" x "), ChatMessage::user("y")];
        assert_eq!(
            t.render(&two, false).unwrap(),
            "<s>SYSTEM:x|USER:y|{\"b\": [1, 2], \"a\": \"é\"}\n"
        );
        let three = [two[0].clone(), two[1].clone(), ChatMessage::assistant("z")];
        let e = t.render(&three, false).unwrap_err().to_string();
        assert!(e.contains("too many: 3"), "{e}");
        let e = ChatTemplate::new("{% for %}", "", "")
            .unwrap_err()
            .to_string();
        assert!(e.contains("chat template"), "{e}");
    }
}
