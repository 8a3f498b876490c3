//! `--backend gpu` end to end: the SmolLM2 int8 split on the wgpu backend (lavapipe in CI) gives the
//! same ids and hop hashes as the CPU backend, and the JSON names the adapter. A machine without an
//! adapter fails this test: `gpu` never falls back.

use std::path::Path;
use std::process::Command;

fn run(backend: &str) -> serde_json::Value {
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fixtures/SmolLM2-135M-Instruct");
    assert!(
        model.is_dir(),
        "run `cargo xtask fixtures` first: {} is missing",
        model.display()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_node"))
        .args([
            "run",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "The capital of France is",
        ])
        .args([
            "--max-new-tokens",
            "3",
            "--ignore-eos",
            "--stages",
            "10,10,10",
            "--format",
            "json",
        ])
        .args(["--backend", backend])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "--backend {backend} failed: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

#[test]
fn the_gpu_split_equals_the_cpu_split_bit_for_bit() {
    let gpu = run("gpu");
    let cpu = run("cpu");
    let adapter = gpu["backend"]["adapter"]
        .as_str()
        .expect("the JSON names the adapter");
    assert!(!adapter.is_empty());
    assert!(
        gpu["backend"]["name"]
            .as_str()
            .unwrap()
            .starts_with("wgpu:"),
        "{}",
        gpu["backend"]
    );
    assert!(cpu["backend"]["adapter"].is_null());
    assert_eq!(gpu["ids"], cpu["ids"]);
    assert_eq!(gpu["hops"], cpu["hops"]);
    assert_eq!(gpu["hops"].as_array().unwrap().len(), 3);
    eprintln!("adapter: {adapter}");
}
