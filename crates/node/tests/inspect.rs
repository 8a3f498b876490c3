//! `node inspect` run as a user would: the refusal corpus (`crates/loader/tests/err/`) through the
//! built binary — exit non-zero, one `error: …` line naming the problem, no panic — and the
//! SmolLM2 GGUF and its converted folder described as the same model.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn inspect(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_node"))
        .arg("inspect")
        .args(args)
        .output()
        .expect("node runs")
}

#[test]
fn every_err_case_is_one_error_line_naming_the_problem() {
    let dir = root().join("crates/loader/tests/err");
    let mut failures = Vec::new();
    let mut seen = 0;
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for case in entries.into_iter().filter(|p| p.is_dir()) {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let expect = std::fs::read_to_string(case.join("expect")).unwrap();
        let expect = expect.trim_end_matches('\n');
        if expect.is_empty() {
            continue; // an unmutated base (checked by the loader's tests)
        }
        seen += 1;
        let model = if case.join("model.gguf").is_file() {
            case.join("model.gguf")
        } else {
            case.clone()
        };
        let out = inspect(&["--model", &model.to_string_lossy()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        let ok = !out.status.success()
            && out.status.code().is_some()
            && lines.len() == 1
            && lines[0].starts_with("error: ")
            && lines[0].contains(expect)
            && !stderr.contains("panicked");
        if !ok {
            failures.push(format!(
                "{name}: status {:?}, stderr {stderr:?}, expected `{expect}`",
                out.status
            ));
        }
    }
    assert!(seen >= 20, "only {seen} err cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `node inspect --model MODEL` run in the workspace root, with an empty Hugging Face cache and a Hub
/// endpoint nothing listens on; its stderr, after checking it is one error line and a failure.
fn inspect_nowhere(model: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_node"))
        .args(["inspect", "--model", model])
        .current_dir(root())
        .env("HF_HUB_CACHE", tmp.path())
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .env_remove("HF_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}

#[test]
fn a_model_that_is_nowhere_is_one_error_line() {
    let stderr = inspect_nowhere("nobody/nothing@main");
    assert!(
        stderr.starts_with("error: ") && stderr.contains("nobody/nothing"),
        "{stderr}"
    );
}

#[test]
fn a_mistyped_local_path_says_no_such_path_and_which_endpoint_was_tried() {
    // Meant `fixtures/tiny`, typed `fixture/tiny`: it parses as a repo id, so the Hub is tried.
    let stderr = inspect_nowhere("fixture/tiny");
    assert!(
        stderr.contains("no local path `fixture/tiny` exists")
            && stderr.contains("http://127.0.0.1:9"),
        "{stderr}"
    );
}

#[test]
fn a_repo_id_resolves_through_the_hugging_face_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let commit = "89abcdef0123456789abcdef0123456789abcdef";
    let repo = tmp.path().join("models--tiny-org--tiny-gpt2");
    let snap = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), commit).unwrap();
    for entry in std::fs::read_dir(root().join("fixtures/tiny/gpt2")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), snap.join(entry.file_name())).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_node"))
        .args([
            "inspect",
            "--model",
            "tiny-org/tiny-gpt2",
            "--format",
            "json",
        ])
        .env("HF_HUB_CACHE", tmp.path())
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["repo_id"], "tiny-org/tiny-gpt2");
    assert_eq!(report["commit"], commit);
    assert_eq!(report["config"]["model_type"], "gpt2");
}

fn fixture(name: &str) -> PathBuf {
    let path = root().join("target/fixtures").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo xtask fixtures` first",
        path.display()
    );
    path
}

fn inspect_json(model: &Path) -> Value {
    let out = inspect(&["--model", &model.to_string_lossy(), "--format", "json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "inspect {}: {stderr}",
        model.display()
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

#[test]
fn the_gguf_and_the_converted_folder_describe_the_same_model() {
    let gguf = inspect_json(&fixture("SmolLM2-135M-Instruct.Q4_1.gguf"));
    let hf = inspect_json(&fixture("SmolLM2-135M-Instruct"));
    for r in [&gguf, &hf] {
        let c = &r["config"];
        assert_eq!(c["num_layers"], 30);
        assert_eq!(c["hidden_size"], 576);
        assert_eq!(c["num_heads"], 9);
        assert_eq!(c["num_kv_heads"], 3);
        assert_eq!(c["vocab_size"], 49152);
        assert_eq!(r["tokenizer_vocab_size"], 49152);
        assert_eq!(r["embeddings"]["tied"], true);
        assert_eq!(r["values_checked"], true);
        assert_eq!(r["layers"].as_array().unwrap().len(), 30);
        assert_eq!(r["tensors"].as_array().unwrap().len(), 272);
    }
    assert_eq!(gguf["config"], hf["config"]);
    assert_eq!(gguf["parameters"], hf["parameters"]);
    assert_eq!(gguf["format"], "gguf");
    assert_eq!(hf["format"], "safetensors");
    // BF16: two bytes per parameter.
    assert_eq!(
        hf["total_bytes"].as_u64().unwrap(),
        2 * hf["parameters"].as_u64().unwrap()
    );
}

#[test]
fn the_text_report_names_the_sizes_and_tying() {
    let out = inspect(&[
        "--model",
        &root().join("fixtures/tiny/llama").to_string_lossy(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "layers 3",
        "hidden 64",
        "untied (lm_head.weight)",
        "layer   2",
        "lm_head.weight",
        "every weight read and finite",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in\n{text}");
    }
    let out = inspect(&[
        "--model",
        &root().join("fixtures/tiny/gpt2").to_string_lossy(),
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("tied (lm_head is wte.weight)"), "{text}");
}
