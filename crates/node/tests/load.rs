//! Fifty clients at once on a 2-process loopback ring, through the official `openai` Python client
//! (`tests/api/load_client.py`): every request is answered, in turn, with the text `node run` gives
//! for the same messages (the independent oracle), and the head's peak RSS is reported.

use std::process::Command;

use serde_json::Value;

mod common;

use common::{Served, root, smollm2};

const CLIENTS: usize = 50;
const QUESTIONS: [&str; 5] = [
    "What is the capital of France?",
    "Name three fruits.",
    "What is 2 + 2?",
    "Say hello in Spanish.",
    "What colour is the sky?",
];

/// The text `node run` gives for one user message, 8 tokens, the same split.
fn oracle(question: &str) -> String {
    let model = smollm2();
    let v = common::node_json(&[
        "run",
        "--model",
        &model,
        "--chat",
        "--prompt",
        question,
        "--stages",
        "15,15",
        "--max-new-tokens",
        "8",
    ]);
    v["text"].as_str().unwrap().to_string()
}

/// `VmHWM` of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn fifty_clients_at_once_are_all_answered_correctly() {
    let Some(py) = common::python() else { return };
    let queued = (CLIENTS + 5).to_string();
    let mut head = Served::start(
        &smollm2(),
        &["--stages", "15,15", "--max-queued", &queued],
        &[],
    );
    head.join("member-0");
    head.wait_for("ready; serving until stopped");
    let before = peak_rss(head.procs.0[0].id());

    let out = Command::new(&py)
        .arg(root().join("crates/node/tests/api/load_client.py"))
        .args([&head.base, &smollm2(), &CLIENTS.to_string()])
        .args(QUESTIONS)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    let peak = peak_rss(head.procs.0[0].id());

    let expected: Vec<String> = QUESTIONS.iter().map(|q| oracle(q)).collect();
    // The mutation: the five questions have five different answers, so a mixed-up reply shows.
    let mut distinct = expected.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), QUESTIONS.len(), "{expected:?}");
    let results = got["results"].as_array().unwrap();
    assert_eq!(results.len(), CLIENTS);
    for (i, r) in results.iter().enumerate() {
        assert!(r.get("error").is_none(), "client {i} failed: {r}");
        let q = r["question"].as_u64().unwrap() as usize;
        assert_eq!(r["text"], expected[q].as_str(), "client {i}: {r}");
    }
    let turns = head
        .drain()
        .iter()
        .filter(|l| l.contains("head: a turn of"))
        .count();
    assert_eq!(turns, CLIENTS, "one turn per client");
    eprintln!(
        "load: {CLIENTS} clients answered in {:.1} s; the head's peak RSS {:.1} MiB ({:.1} MiB \
         before the load)",
        got["wall_s"].as_f64().unwrap(),
        peak as f64 / (1 << 20) as f64,
        before as f64 / (1 << 20) as f64
    );
}
