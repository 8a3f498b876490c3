//! Lookahead across a real 3-process ring (issue 18, acceptance 1): SmolLM2 split [10, 10, 10] over
//! WebRTC gives the ids of the unsplit run on the head (Verify, [30]) and of `node run` in one
//! process, with lookahead on, greedy and seeded at T = 0.8, on both paths, for ten prompts;
//! a repetitive prompt takes fewer laps; and how often lookahead's ids differ from plain decoding
//! is printed (expected only at near-ties).

mod common;

use common::{Served, node_json, smollm2};
use serde_json::{Value, json};

const PROMPTS: [&str; 10] = [
    "The list: apple, banana, cherry, apple, banana, cherry, apple, banana, cherry, apple,",
    "Count: one two three, one two three, one two three, one two",
    "The capital of France is",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
    "Once upon a time, in a small village by the sea,",
    "Red, green, blue. Red, green, blue. Red, green,",
    "Water boils at 100 degrees Celsius. Water freezes at",
    "A B C D E F G A B C D E F G A B C",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Explain in one sentence why the sky is blue.",
];

/// `POST /v1/completions` with `body`; the reply's JSON.
fn complete(client: &reqwest::blocking::Client, base: &str, body: &Value) -> Value {
    common::post_json(client, base, "/v1/completions", body)
}

#[test]
fn lookahead_over_three_processes_gives_the_ids_of_one_process() {
    let model = smollm2();
    let mut served = Served::start(&model, &["--stages", "10,10,10"], &[]);
    served.join("member-1");
    served.join("member-2");
    served.wait_for("head: the ring is connected");
    let client = common::http_client();
    let max_tokens = 16;
    let mut summary = Vec::new();
    for path in ["cached", "full-window"] {
        for (temperature, seed) in [(0.0, 0u64), (0.8, 7)] {
            let case = format!("{path} T={temperature}");
            let (mut tokens, mut on_laps, mut plain_laps, mut differ, mut kept) = (0, 0, 0, 0, 0);
            for (i, prompt) in PROMPTS.iter().enumerate() {
                let request = |lookahead: bool| {
                    json!({
                        "model": model, "prompt": prompt, "max_tokens": max_tokens,
                        "temperature": temperature, "seed": seed, "path": path,
                        "lookahead": lookahead, "verify": true,
                    })
                };
                let on = complete(&client, &served.base, &request(true));
                let off = complete(&client, &served.base, &request(false));
                for (r, what) in [(&on, "lookahead"), (&off, "plain")] {
                    assert_eq!(
                        r["verify"]["matched"], true,
                        "{case}, prompt {i}, {what}: {}",
                        r["verify"]
                    );
                    assert_eq!(r["verify"]["report"]["path"], path);
                }
                let ids = &on["verify"]["report"]["ids"];
                let laps = |r: &Value| r["timings"]["laps"].as_u64().unwrap() as usize;
                tokens += ids.as_array().unwrap().len();
                on_laps += laps(&on);
                plain_laps += laps(&off);
                if ids != &off["verify"]["report"]["ids"] {
                    differ += 1;
                }
                kept += on["timings"]["accepted"].as_u64().unwrap();
                if i == 0 {
                    if temperature == 0.0 {
                        // The repetitive prompt, greedy: drafts kept, fewer laps than plain decoding.
                        let accepted = on["timings"]["accepted"].as_u64().unwrap();
                        assert!(accepted > 0, "{case}: {}", on["timings"]);
                        assert!(
                            laps(&on) < laps(&off),
                            "{case}: lookahead {} laps, plain {}",
                            laps(&on),
                            laps(&off)
                        );
                    }
                    // The independent oracle: `node run` in one process, [30].
                    let t = temperature.to_string();
                    let s = seed.to_string();
                    let n = max_tokens.to_string();
                    let one = node_json(&[
                        "run",
                        "--model",
                        &model,
                        "--prompt",
                        prompt,
                        "--max-new-tokens",
                        &n,
                        "--temperature",
                        &t,
                        "--seed",
                        &s,
                        "--path",
                        path,
                        "--lookahead",
                        "on",
                    ]);
                    assert_eq!(&one["ids"], ids, "{case}: node run and the ring");
                    assert_eq!(one["laps"], on["timings"]["laps"], "{case}");
                }
            }
            assert!(kept > 0, "{case}: no draft was ever kept");
            summary.push(format!(
                "{case}: {tokens} tokens in {on_laps} laps with lookahead ({kept} drafts kept), \
                 {plain_laps} without; \
                 ids differ from plain decoding on {differ} of {} prompts",
                PROMPTS.len()
            ));
        }
    }
    eprintln!("{}", summary.join("\n"));
}
