//! The server on a loopback port, driven over HTTP by a real client (reqwest), with the real
//! SmolLM2 (quantised, native CPU) and MiniLM models.
//!
//! The models come from the model cache (`TPU_RS_MODELS`); CI installs them and sets
//! `TPU_RS_REQUIRE_MODELS=1`, which makes a missing model a failure instead of a skip.

mod common;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use common::{Server, server};

/// POSTs `body` to `path`; the status and the JSON answer.
async fn post(s: &Server, path: &str, body: Value) -> (u16, Value) {
    let r = s.client.post(s.url(path)).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// The `data:` payloads of a server-sent-event stream, `[DONE]` included.
async fn events(s: &Server, path: &str, body: Value) -> Vec<String> {
    let r = s.client.post(s.url(path)).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an event: {e:?}"))
                .to_string()
        })
        .collect()
}

fn chat(content: &str, max_tokens: usize) -> Value {
    json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_and_metrics() {
    let Some(s) = server().await else { return };
    let r = s.client.get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let m: Value = s
        .client
        .get(s.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = m["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["smollm2", "all-minilm-l6-v2"]);
    assert_eq!(m["data"][0]["max_model_len"], 8192);
    let text = s.metrics().await;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ] {
        assert!(
            text.contains(&format!("{name}{{model_name=\"smollm2\"")),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streamed_and_whole_say_the_same() {
    let Some(s) = server().await else { return };
    let (status, r) = post(
        s,
        "/v1/chat/completions",
        chat("What is the capital of France?", 8),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "chat.completion");
    assert!(r["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &r["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let content = choice["message"]["content"].as_str().unwrap().to_string();
    assert!(content.contains("Paris"), "{content:?}");
    let u = &r["usage"];
    let completion = u["completion_tokens"].as_u64().unwrap();
    assert!((1..=8).contains(&completion));
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + completion
    );
    // The end token counts as a completion token: 8 tokens may still end with a stop.
    let reason = choice["finish_reason"].as_str().unwrap();
    assert!(
        reason == "stop" || (reason == "length" && completion == 8),
        "{r}"
    );

    let mut body = chat("What is the capital of France?", 8);
    body["stream"] = json!(true);
    let ev = events(s, "/v1/chat/completions", body).await;
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content);
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], reason);
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], completion);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_with_several_prompts_choices_and_logprobs() {
    let Some(s) = server().await else { return };
    let (status, r) = post(
        s,
        "/v1/completions",
        json!({
            "model": "smollm2",
            "prompt": ["The capital of France is", "Rust is"],
            "n": 2,
            "max_tokens": 5,
            "temperature": 0,
            "logprobs": 2,
        }),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    let choices = r["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    // Greedy: both choices of a prompt agree; the prompts differ.
    assert_eq!(choices[0]["text"], choices[1]["text"]);
    assert_eq!(choices[2]["text"], choices[3]["text"]);
    assert_ne!(choices[0]["text"], choices[2]["text"]);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["finish_reason"], "length");
        let lp = &c["logprobs"];
        assert_eq!(lp["tokens"].as_array().unwrap().len(), 5);
        let joined: String = lp["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(joined, c["text"].as_str().unwrap());
        for (j, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
            let top = top.as_object().unwrap();
            assert_eq!(top.len(), 2);
            // Greedy chose the most likely token.
            let best = top
                .values()
                .map(|v| v.as_f64().unwrap())
                .fold(f64::MIN, f64::max);
            let chosen = lp["token_logprobs"][j].as_f64().unwrap();
            assert!(
                chosen <= 0.0 && (chosen - best).abs() < 1e-6,
                "{chosen} {best}"
            );
        }
    }
    // Prompt tokens count each prompt once; completion tokens every choice.
    assert_eq!(r["usage"]["completion_tokens"], 20);
    // Streamed, the texts come back piece by piece, tagged with their choice.
    let ev = events(
        s,
        "/v1/completions",
        json!({"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 5,
               "temperature": 0, "stream": true}),
    )
    .await;
    let text: String = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, choices[0]["text"].as_str().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_each_get_what_they_get_alone() {
    let Some(s) = server().await else { return };
    // Few and short: tests run unoptimised model code.
    let prompts = [
        "The capital of France is",
        "Rust is a programming language that",
        "Once upon a time",
        "def fibonacci(n):",
    ];
    let body =
        |p: &str| json!({"model": "smollm2", "prompt": p, "max_tokens": 6, "temperature": 0});
    let mut alone = Vec::new();
    for p in prompts {
        let (status, r) = post(s, "/v1/completions", body(p)).await;
        assert_eq!(status, 200, "{r}");
        alone.push(r["choices"][0]["text"].as_str().unwrap().to_string());
    }
    let together = futures_util::future::join_all(prompts.iter().map(|p| {
        let b = body(p);
        async move { post(s, "/v1/completions", b).await }
    }))
    .await;
    for ((p, want), (status, r)) in prompts.iter().zip(&alone).zip(&together) {
        assert_eq!(*status, 200, "{r}");
        assert_eq!(r["choices"][0]["text"].as_str().unwrap(), want, "{p}");
    }
    // On the native CPU the passes run eagerly: serving compiles nothing.
    assert_eq!(s.metric("tpu_rs:compiles_since_start_total").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_system_prompt_is_found_in_the_prefix_cache() {
    let Some(s) = server().await else { return };
    let system = "You are a terse assistant for a geography quiz. Answer with the name of \
                  the place only, without any punctuation, explanation or greeting at all.";
    let ask = |q: &str| {
        json!({"model": "smollm2", "max_tokens": 2, "temperature": 0, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": q}]})
    };
    let (_, first) = post(s, "/v1/chat/completions", ask("Capital of Peru?")).await;
    let (status, second) = post(s, "/v1/chat/completions", ask("Capital of Chile?")).await;
    assert_eq!(status, 200, "{second}");
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= 32 && cached < prompt,
        "{cached} of {prompt}; first: {first}"
    );
    let hits = s.metric("vllm:prefix_cache_hits_total").await;
    assert!(hits >= cached as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_its_request() {
    let Some(s) = server().await else { return };
    let aborted = s.metric_with("vllm:request_success_total", "abort").await;
    let mut body = chat("Write a very long story about a dragon.", 2000);
    body["stream"] = json!(true);
    body["ignore_eos"] = json!(true);
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    // Read until a token came, then hang up.
    let mut seen = String::new();
    while !seen.contains("\"content\":\"") || seen.matches("data:").count() < 3 {
        seen.push_str(&String::from_utf8_lossy(
            &stream.next().await.unwrap().unwrap(),
        ));
    }
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = s.metric_with("vllm:request_success_total", "abort").await;
        if now > aborted {
            break;
        }
        assert!(Instant::now() < deadline, "the request was not cancelled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_naming_the_parameter() {
    let Some(s) = server().await else { return };
    let raw = s
        .client
        .post(s.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{\"model\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    let e: Value = raw.json().await.unwrap();
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );

    let cases: Vec<(Value, u16, Option<&str>, &str)> = vec![
        (
            json!({"model": "gpt-4", "messages": [{"role": "user", "content": "Hi"}]}),
            404,
            Some("model"),
            "does not exist",
        ),
        (
            json!({"messages": []}),
            400,
            Some("model"),
            "'model' is required",
        ),
        (
            json!({"model": "smollm2"}),
            400,
            Some("messages"),
            "'messages' is required",
        ),
        (
            json!({"model": "smollm2", "messages": [{"role": "wizard", "content": "Hi"}]}),
            400,
            Some("messages[0].role"),
            "got \"wizard\"",
        ),
        (
            json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}],
                   "temperature": 3}),
            400,
            Some("temperature"),
            "'temperature' must be a number from 0 to 2, got 3",
        ),
        (
            json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}],
                   "top_p": 0}),
            400,
            Some("top_p"),
            "(0, 1]",
        ),
        (
            json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}],
                   "n": 0}),
            400,
            Some("n"),
            "from 1 to 16",
        ),
        (
            json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}],
                   "max_tokens": "many"}),
            400,
            Some("max_tokens"),
            "got \"many\"",
        ),
        (
            json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}],
                   "stop": ["a", "b", "c", "d", "e"]}),
            400,
            Some("stop"),
            "at most 4",
        ),
        (
            json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}],
                   "logprobs": true, "top_logprobs": 30}),
            400,
            Some("top_logprobs"),
            "from 0 to 20",
        ),
        (
            json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}],
                   "max_tokens": 9000}),
            400,
            Some("max_tokens"),
            "maximum context length is 8192",
        ),
    ];
    for (body, status, param, message) in cases {
        let (got, e) = post(s, "/v1/chat/completions", body.clone()).await;
        assert_eq!(got, status, "{body} -> {e}");
        assert_eq!(e["error"]["param"].as_str(), param, "{body} -> {e}");
        let m = e["error"]["message"].as_str().unwrap();
        assert!(m.contains(message), "{body} -> {m}");
    }
    let long = "word ".repeat(9000);
    let (got, e) = post(
        s,
        "/v1/completions",
        json!({"model": "smollm2", "prompt": long, "max_tokens": 1}),
    )
    .await;
    assert_eq!(got, 400);
    assert_eq!(e["error"]["code"], "context_length_exceeded");
    assert_eq!(e["error"]["param"], "prompt");
    let (got, e) = post(
        s,
        "/v1/completions",
        json!({"model": "smollm2", "prompt": [99999]}),
    )
    .await;
    assert_eq!(got, 400);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("token ids below 49152"),
        "{e}"
    );
    let r = s.client.get(s.url("/v1/nothing")).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_are_unit_vectors_and_similar_sentences_are_close() {
    let Some(s) = server().await else { return };
    let (status, r) = post(
        s,
        "/v1/embeddings",
        json!({"model": "all-minilm-l6-v2", "input": [
            "A man is eating food.", "A man is eating a piece of bread.", "The sky is blue."]}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let v: Vec<Vec<f64>> = r["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(v.len(), 3);
    assert!(v.iter().all(|e| e.len() == 384));
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    assert!((dot(&v[0], &v[0]) - 1.0).abs() < 1e-5);
    assert!(dot(&v[0], &v[1]) > dot(&v[0], &v[2]) + 0.2);
    assert!(r["usage"]["prompt_tokens"].as_u64().unwrap() > 10);
    let (status, e) = post(
        s,
        "/v1/embeddings",
        json!({"model": "smollm2", "input": "x"}),
    )
    .await;
    assert_eq!(status, 404, "{e}");
    let (status, e) = post(s, "/v1/embeddings", json!({"model": "all-minilm-l6-v2"})).await;
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("input")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_with_retry_after() {
    let Some(s) = common::small_server().await else {
        return;
    };
    // One runs, one waits; the third is turned away.
    let body = json!({"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 60,
                      "temperature": 0, "ignore_eos": true});
    let send = || s.client.post(s.url("/v1/completions")).json(&body).send();
    let first = tokio::spawn(send());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = tokio::spawn(send());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let third = send().await.unwrap();
    assert_eq!(third.status(), 429);
    assert_eq!(third.headers()["retry-after"], "1");
    let e: Value = third.json().await.unwrap();
    assert_eq!(e["error"]["code"], "rate_limit_exceeded");
    first.abort();
    second.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_serve_reports_every_request() {
    let Some(s) = server().await else { return };
    let c = tpu_serve::bench::BenchConfig {
        base_url: s.url(""),
        num_prompts: 4,
        input_len: 16,
        output_len: 4,
        max_concurrency: 2,
        request_rate: Some(50.0),
        ..Default::default()
    };
    let r = tpu_serve::bench::run(&c).await;
    assert_eq!((r.completed, r.failed), (4, 0), "{}", r.table());
    assert_eq!((r.input_tokens, r.output_tokens), (64, 16));
    assert!(r.ttft.median > 0.0 && r.tpot.median > 0.0 && r.e2el.p99 >= r.e2el.median);
    assert!(r.table().contains("Output token throughput (tok/s):"));
    let chat = tpu_serve::bench::BenchConfig {
        dataset: "chat".into(),
        num_prompts: 2,
        request_rate: None,
        ..c
    };
    let r = tpu_serve::bench::run(&chat).await;
    assert_eq!((r.completed, r.failed), (2, 0), "{}", r.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_finishes_the_requests_in_flight_and_refuses_new_ones() {
    let Some((s, stop, done)) = common::stoppable_server().await else {
        return;
    };
    let body = json!({"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 8,
                      "temperature": 0, "ignore_eos": true, "stream": true});
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    stop.send(()).unwrap();
    // The request in flight runs to its end.
    let mut rest = String::from_utf8_lossy(&first).into_owned();
    while let Some(chunk) = stream.next().await {
        rest.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(rest.contains("\"finish_reason\":\"length\""), "{rest}");
    assert!(rest.ends_with("data: [DONE]\n\n"));
    // The server stops; new connections are refused.
    tokio::time::timeout(Duration::from_secs(60), done)
        .await
        .expect("the server stopped")
        .unwrap();
    assert!(s.client.get(s.url("/health")).send().await.is_err());
}
