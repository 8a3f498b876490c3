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

/// `node adapters` lists what `--backend gpu` opens, and `--backend auto` (which asks a child
/// `node adapters`) keeps to the CPU when every adapter is a software rasterizer.
#[test]
fn adapters_lists_the_gpu_and_auto_skips_a_software_rasterizer() {
    let out = Command::new(env!("CARGO_BIN_EXE_node"))
        .args(["adapters", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let gpu = run("gpu");
    let opened = gpu["backend"]["adapter"].as_str().unwrap();
    let listed = list
        .iter()
        .find(|a| opened.starts_with(a["name"].as_str().unwrap()))
        .unwrap_or_else(|| {
            panic!("`node adapters` {list:?} lacks the adapter gpu opened, {opened}")
        });
    let bad = Command::new(env!("CARGO_BIN_EXE_node"))
        .args(["adapters", "--format", "yaml"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--format `yaml`"));
    if list.iter().all(|a| a["software"] == true) {
        let auto = run("auto");
        assert!(listed["software"].as_bool().unwrap());
        assert!(auto["backend"]["adapter"].is_null(), "{}", auto["backend"]);
        assert_eq!(auto["ids"], gpu["ids"]);
    }
}
