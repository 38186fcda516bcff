//! What the serving engine's tests share: running prompts through an engine.

use std::time::Duration;

use tpu_rs::models::GenerateOptions;
use tpu_rs::serve::{Admission, Engine, Event, Request, Usage};

/// Runs `prompts` through `engine` all at once; each one's tokens and usage.
pub fn run_all(
    engine: &Engine,
    prompts: &[Vec<u32>],
    max_new: usize,
) -> Vec<(Vec<u32>, String, Usage)> {
    let receivers: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (tx, rx) = crossbeam_channel::unbounded();
            let r = Request {
                prompt: p.clone(),
                options: GenerateOptions {
                    max_new,
                    ..GenerateOptions::default()
                },
                logprobs: None,
                deadline: None,
            };
            assert_eq!(engine.submit(r, tx).unwrap(), Admission::Queued);
            rx
        })
        .collect();
    receivers
        .into_iter()
        .map(|rx| {
            let (mut ids, mut text) = (Vec::new(), String::new());
            loop {
                match rx.recv_timeout(Duration::from_secs(300)).unwrap() {
                    Event::Token { token, text: t } => {
                        ids.extend(token.map(|(t, _)| t));
                        text.push_str(&t);
                    }
                    Event::Done(u) => return (ids, text, u),
                    Event::Failed(e) => panic!("request failed: {e}"),
                }
            }
        })
        .collect()
}
