//! The ring figures of `cargo xtask bench`, in the same run as the single process: SmolLM2 int8 on a
//! ring of three processes on loopback (`node demo --stages 10,10,10`, real WebRTC) against one
//! process (`node run`) — decode tok/s and the ratio, the decode lap and the one-way hop latency
//! p50/p99, and the prefill of a 512-token prompt with two chunks in flight around the ring against
//! one at a time.

use std::path::Path;

use anyhow::Context;
use serde_json::Value;

use crate::bench::Figure;
use crate::bench_model::{MODEL, TEXT, node, prompt_of, run_int8, timing};

/// `node demo` on three processes with `new_tokens` generated, end-of-sequence ignored.
fn ring(root: &Path, prompt: &str, new_tokens: usize, in_flight: usize) -> anyhow::Result<Value> {
    let (n, k) = (new_tokens.to_string(), in_flight.to_string());
    node(
        root,
        &[
            "demo",
            "--model",
            MODEL,
            "--stages",
            "10,10,10",
            "--prompt",
            prompt,
            "--max-new-tokens",
            &n,
            "--ignore-eos",
            "--path",
            "cached",
            "--precision",
            "int8",
            "--backend",
            "cpu",
            "--in-flight",
            &k,
            "--no-verify",
            "--format",
            "json",
        ],
    )
}

fn stat(j: &Value, key: &str, q: &str) -> anyhow::Result<f64> {
    j[key][q]
        .as_f64()
        .with_context(|| format!("{key}.{q} missing"))
}

/// Assumes `bench_model::figures` built the release node and the fixtures.
pub(crate) fn figures() -> anyhow::Result<Vec<Figure>> {
    let root = crate::root();
    let text =
        std::fs::read_to_string(root.join(TEXT)).with_context(|| format!("reading {TEXT}"))?;
    let fig = |name: &str, value: f64, unit: &str| Figure {
        name: format!("ring/smollm2-135m/int8/{name}"),
        value,
        unit: unit.to_string(),
    };
    let mut figures = Vec::new();

    // Decode: the same prompt and length in one process and around the ring, best of 2 each.
    let prompt = prompt_of(&root, &text, 16)?;
    let mut single = 0f64;
    let mut ringed = 0f64;
    let mut best: Option<Value> = None;
    for _ in 0..2 {
        let j = run_int8(&root, &prompt, 129, "cached")?;
        single = single.max(timing(&j, "decode_tokens_per_s")?);
        let r = ring(&root, &prompt, 129, 2)?;
        let tps = timing(&r, "decode_tokens_per_s")?;
        if tps > ringed {
            ringed = tps;
            best = Some(r);
        }
    }
    let best = best.context("no ring run")?;
    figures.push(fig("decode_cached_1_process", single, "tok/s"));
    figures.push(fig("decode_cached_3_processes", ringed, "tok/s"));
    figures.push(fig("decode_ratio_3_processes_to_1", ringed / single, "x"));
    figures.push(fig(
        "decode_lap_p50",
        stat(&best, "decode_lap_ms", "p50_ms")?,
        "ms",
    ));
    figures.push(fig(
        "decode_lap_p99",
        stat(&best, "decode_lap_ms", "p99_ms")?,
        "ms",
    ));
    figures.push(fig("hop_p50", stat(&best, "hop_ms", "p50_ms")?, "ms"));
    figures.push(fig("hop_p99", stat(&best, "hop_ms", "p99_ms")?, "ms"));

    // Prefill of a 512-token prompt: two chunks in flight against one, best of 2 each.
    let prompt = prompt_of(&root, &text, 512)?;
    let mut rates = [0f64; 2];
    for _ in 0..2 {
        for (i, k) in [1usize, 2].into_iter().enumerate() {
            let r = ring(&root, &prompt, 1, k)?;
            rates[i] = rates[i].max(timing(&r, "prefill_tokens_per_s")?);
        }
    }
    figures.push(fig("prefill_512_one_chunk_in_flight", rates[0], "tok/s"));
    figures.push(fig("prefill_512_two_chunks_in_flight", rates[1], "tok/s"));
    figures.push(fig(
        "prefill_512_ratio_two_to_one",
        rates[1] / rates[0],
        "x",
    ));
    Ok(figures)
}
