//! The head's page in a real headless Chromium (npm `playwright-core` driving Debian's `chromium`;
//! `tests/page/page.cjs`), on a real 3-process ring on loopback: the ring drawn with every member's
//! layers and finished download, a chat answer streamed and verified, a second prompt waiting its
//! turn. The answers are compared with the independent oracle of `node run` on the same split.
//!
//! Needs `node`, `chromium` (or `CHROMIUM`) and playwright-core (`DAISY_NODE_MODULES`, default
//! `~/.cache/daisychain-infer/npm/node_modules`; `.ci/run` installs all three); without them the
//! test fails under `CI=true` and is skipped elsewhere.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

mod common;

use common::Served;

const QUESTIONS: [&str; 2] = [
    "What are the three primary colors?",
    "Name a large animal that lives in the sea.",
];
const MAX_TOKENS: usize = 48;

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn smollm2() -> String {
    root()
        .join("target/fixtures/SmolLM2-135M-Instruct")
        .to_string_lossy()
        .into_owned()
}

/// `node` with playwright-core reachable, and a Chromium.
fn browser() -> Option<(PathBuf, String)> {
    let modules = std::env::var_os("DAISY_NODE_MODULES")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache/daisychain-infer/npm/node_modules"))
        })?;
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let ok = std::path::Path::new(&chromium).exists()
        && Command::new("node")
            .args(["-e", "require('playwright-core')"])
            .env("NODE_PATH", &modules)
            .status()
            .is_ok_and(|s| s.success());
    ok.then_some((modules, chromium))
}

fn oracle(question: &str) -> Value {
    let model = smollm2();
    let tokens = MAX_TOKENS.to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_node"))
        .args(["run", "--model", &model, "--chat", "--prompt", question])
        .args(["--stages", "10,10,10", "--max-new-tokens", &tokens])
        .args(["--backend", "cpu", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

#[test]
fn the_page_draws_the_ring_and_streams_a_verified_answer() {
    let Some((modules, chromium)) = common::tool(
        browser(),
        "node with playwright-core (DAISY_NODE_MODULES) and chromium (CHROMIUM)",
    ) else {
        return;
    };
    let mut head = Served::start(&smollm2(), &["--stages", "10,10,10"], &[]);
    head.join("member-0");
    head.join("member-1");
    head.wait_for("ready; serving until stopped");

    let shots = root().join("target/screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let out = Command::new("node")
        .arg(root().join("crates/node/tests/page/page.cjs"))
        .arg(&head.base)
        .arg(&shots)
        .args(QUESTIONS)
        .arg(MAX_TOKENS.to_string())
        .env("NODE_PATH", &modules)
        .env("CHROMIUM", &chromium)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the browser test failed:\n{}\nthe head printed:\n{}",
        String::from_utf8_lossy(&out.stderr),
        head.drain().join("\n")
    );
    let got: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();

    // The ring: the head and both members, each with its layers; the members' downloads done.
    let devices = got["devices"].as_array().unwrap();
    let layers: Vec<(&str, &str)> = devices
        .iter()
        .map(|d| (d["name"].as_str().unwrap(), d["layers"].as_str().unwrap()))
        .collect();
    assert_eq!(
        layers,
        [
            ("head", "0..10"),
            ("member-0", "10..20"),
            ("member-1", "20..30")
        ]
    );
    for d in &devices[1..] {
        assert_eq!(d["ready"], true, "{d}");
        assert!(d["download"].as_str().unwrap().contains(", done"), "{d}");
    }
    assert_eq!(
        got["ring_nodes"],
        serde_json::json!(["head", "member-0", "member-1"])
    );
    assert_eq!(got["verify_ticked"], true);

    // The answers: streamed in more than one update, verified, and `node run`'s text.
    assert!(got["updates"].as_u64().unwrap() > 1, "{got}");
    for (turn, question) in got["turns"].as_array().unwrap().iter().zip(QUESTIONS) {
        let expected = oracle(question);
        assert_eq!(turn["answer"], expected["text"], "{question}: {turn}");
        assert_eq!(turn["verify_class"], "verify match", "{turn}");
        assert!(
            turn["verify"]
                .as_str()
                .unwrap()
                .starts_with("Verify: match")
        );
        assert!(
            turn["status"].as_str().unwrap().starts_with("done"),
            "{turn}"
        );
        assert!(turn["chart"].as_u64().unwrap() > 0, "the latency picture");
    }
    // The mutation: the two questions' answers differ, so the comparison can fail.
    assert_ne!(got["turns"][0]["answer"], got["turns"][1]["answer"]);
    assert!(
        got["second_waiting"]
            .as_str()
            .unwrap()
            .starts_with("waiting ("),
        "{got}"
    );
    assert_eq!(got["page_errors"], serde_json::json!([]));
    for shot in got["screenshots"].as_array().unwrap() {
        assert!(std::fs::metadata(shot.as_str().unwrap()).unwrap().len() > 1000);
    }
}
