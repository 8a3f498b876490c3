//! The head's OpenAI-compatible API, driven by the official `openai` Python client
//! (`tests/api/openai_client.py`) against a real 2-process ring on loopback, and compared with the
//! independent oracle of `node run` on the same messages and the same split.
//!
//! The client runs in the Python that `DAISY_PYTHON` names (`.ci/run` makes a venv with `openai`);
//! without it the test fails under `CI=true` and is skipped elsewhere.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

mod common;

use common::{Served, root, smollm2};

const KEY: &str = "test-key-0123456789";
const QUESTIONS: [&str; 3] = [
    "What is the capital of France?",
    "The three primary colors are",
    "Write a short poem about the sea.",
];

/// `node run` on one user message (or raw text), the same split: the oracle's report.
fn oracle(prompt: &str, chat: bool, tokens: usize, extra: &[&str]) -> Value {
    let (model, tokens) = (smollm2(), tokens.to_string());
    let mut args = vec!["run", "--model", &model, "--prompt", prompt];
    args.extend(["--stages", "15,15", "--max-new-tokens", &tokens]);
    if chat {
        args.push("--chat");
    }
    args.extend(extra);
    common::node_json(&args)
}

fn text(v: &Value) -> &str {
    v["text"].as_str().unwrap()
}

fn client(py: &PathBuf, mode: &str, base: &str) -> Value {
    let script = root().join("crates/node/tests/api/openai_client.py");
    let out = Command::new(py)
        .arg(script)
        .args([mode, base, &smollm2(), KEY])
        .args(QUESTIONS)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the openai client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().expect("a line")).expect("JSON")
}

/// An OpenAI-shaped error of `status`.
fn assert_error(v: &Value, status: u64, what: &str) {
    assert_eq!(v["status"], status, "{what}: {v}");
    let e = &v["body"];
    // The client hands over the `error` object (or the whole body, with `error` in it).
    let e = if e.get("error").is_some() {
        &e["error"]
    } else {
        e
    };
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()) && e["type"].is_string(),
        "{what}: not OpenAI's error shape: {v}"
    );
    assert!(
        e.get("param").is_some() && e.get("code").is_some(),
        "{what}: {v}"
    );
}

#[test]
fn the_openai_client_drives_a_two_process_ring() {
    let Some(py) = common::python() else { return };
    let mut head = Served::start(
        &smollm2(),
        &["--stages", "15,15", "--max-queued", "2"],
        &[("DAISY_API_KEY", KEY)],
    );
    let base = head.base.clone();

    // No ring yet: 503 with Retry-After.
    head.wait_for("waiting for 1 member");
    let early = client(&py, "not-ready", &base);
    assert_error(&early["not_ready"], 503, "before the ring is formed");
    assert!(early["not_ready"]["headers"]["retry-after"].is_string());

    head.join("member-0");
    head.wait_for("ready; serving until stopped");

    let got = client(&py, "main", &base);
    let [q0, q1, q2] = QUESTIONS;
    assert_eq!(got["models"], serde_json::json!([smollm2()]));

    // Non-streamed and streamed at temperature 0: the same text, `node run`'s.
    let chat0 = oracle(q0, true, 24, &[]);
    assert_eq!(got["whole"]["text"], chat0["text"], "{}", got["whole"]);
    assert_eq!(got["stream"]["text"], chat0["text"]);
    assert!(got["stream"]["content_chunks"].as_u64().unwrap() > 1);
    // The mutation: another question's answer is not this one.
    assert_ne!(chat0["text"], oracle(q1, true, 24, &[])["text"]);
    let n_ids = chat0["ids"].as_array().unwrap().len() as u64;
    let n_prompt = chat0["prompt_ids"].as_array().unwrap().len() as u64;
    for usage in [&got["whole"]["usage"], &got["stream"]["usage"]] {
        assert_eq!(usage["prompt_tokens"], n_prompt, "{usage}");
        assert_eq!(usage["completion_tokens"], n_ids, "{usage}");
        assert_eq!(usage["total_tokens"], n_prompt + n_ids, "{usage}");
    }
    let finish = if n_ids == 24 { "length" } else { "stop" };
    assert_eq!(got["whole"]["finish_reason"], finish);
    assert_eq!(got["stream"]["finish_reason"], finish);
    assert_eq!(got["whole"]["verify"]["matched"], true, "{}", got["whole"]);
    assert_eq!(got["verify_header"], "match");

    // Raw completions, and a stop string.
    let raw = oracle(q1, false, 12, &[]);
    assert_eq!(got["completion"]["text"], raw["text"]);
    assert_eq!(
        got["completion"]["usage"]["prompt_tokens"],
        raw["prompt_ids"].as_array().unwrap().len()
    );
    let cut = text(&raw).split(" the").next().unwrap();
    assert_eq!(got["stopped"]["text"], cut, "{}", got["stopped"]);
    assert_eq!(
        got["stopped"]["finish_reason"],
        if cut.len() < text(&raw).len() {
            "stop"
        } else {
            "length"
        }
    );

    // JSON mode parses.
    assert_eq!(got["json"]["parsed"], true, "{}", got["json"]);

    // Seed + temperature 0.8 repeats, and is `node run`'s draw; other seeds draw other text.
    let seeded = got["seeded"].as_array().unwrap();
    assert_eq!(seeded[0], seeded[1]);
    let drawn = oracle(q2, true, 16, &["--temperature", "0.8", "--seed", "7"]);
    assert_eq!(seeded[0], drawn["text"]);
    assert!(
        seeded[2..].iter().any(|s| *s != seeded[0]),
        "three other seeds all drew {:?}",
        seeded[0]
    );

    // Two clients at once: both right, one after the other.
    let (a, b) = (&got["concurrent"]["a"], &got["concurrent"]["b"]);
    assert_eq!(a["text"], oracle(q1, true, 16, &[])["text"]);
    assert_eq!(b["text"], oracle(q2, true, 16, &[])["text"]);
    assert_ne!(a["done"], b["done"]);

    // While a stream owns the ring, two requests wait (and complete once the stream's client goes
    // away) and a third finds the queue (of two) full. (Two, not one: two clients at once may both
    // be queued before the ring takes the first.) A client that reads three tokens and goes
    // away stops its turn there (a token or so later: the one being written when it left).
    assert_eq!(
        got["queued_before_third"], 2,
        "two turns never waited behind the stream"
    );
    assert_error(&got["queue_full"], 429, "the queue is full");
    assert!(got["queue_full"]["headers"]["retry-after"].is_string());
    let read = got["cancelled_after_chunks"].as_u64().unwrap();
    assert_eq!(read, 3);
    let eight = oracle(q1, true, 8, &[]);
    assert_eq!(
        got["after_queue"],
        serde_json::json!([eight["text"], eight["text"]])
    );
    assert_eq!(got["after_cancel"], eight["text"]);
    // The first stream went away too; the second's stop is the one counted.
    head.wait_for("the client went away; its turn stopped after");
    let stopped = head.wait_for("the client went away; its turn stopped after");
    let n: u64 = stopped
        .split("stopped after ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(
        (read..read + 4).contains(&n),
        "the cancelled turn ran {n} tokens after the client read {read}"
    );

    // Bad requests: OpenAI-shaped 4xx, and the server keeps serving.
    let bad = &got["bad"];
    for (what, status) in [
        ("unknown_model", 404),
        ("negative_max_tokens", 400),
        ("n_2", 400),
        ("wrong_key", 401),
        ("malformed_json", 400),
        ("ten_mb_body", 413),
        ("prompt_beyond_context", 413),
    ] {
        assert_error(&bad[what], status, what);
    }
    assert_eq!(got["after_bad"], oracle(q1, true, 16, &[])["text"]);

    // The key never reaches the head's log.
    assert!(
        !head.drain().iter().any(|l| l.contains(KEY)),
        "the API key is in the head's log"
    );
}
