//! Hub loading against a real server: `node mirror` in its own process stands in for the Hub, and the
//! node under test fetches through `HF_ENDPOINT` — byte ranges only, the token on demand, and clear
//! refusals of a server that misbehaves.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

mod common;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn smollm2() -> PathBuf {
    let dir = root().join("target/fixtures/SmolLM2-135M-Instruct");
    assert!(
        dir.join("model.safetensors").is_file(),
        "run `cargo xtask fixtures` first: {} is missing",
        dir.display()
    );
    dir
}

struct Mirror {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with('.') {
            std::fs::copy(entry.path(), to.join(name)).unwrap();
        }
    }
}

/// A mirror serving `models` (repo id → local folder) with `extra` flags.
fn mirror(models: &[(&str, &Path)], extra: &[&str], token: Option<&str>) -> Mirror {
    let dir = tempfile::tempdir().unwrap();
    for (id, folder) in models {
        let target = dir.path().join(id);
        // Large weights are linked rather than copied.
        std::fs::create_dir_all(&target).unwrap();
        for entry in std::fs::read_dir(folder).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            std::fs::hard_link(entry.path(), target.join(&name))
                .or_else(|_| std::fs::copy(entry.path(), target.join(&name)).map(|_| ()))
                .unwrap();
        }
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_node"));
    cmd.args([
        "mirror",
        dir.path().to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ])
    .args(extra);
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    match token {
        Some(t) => cmd.env("DAISY_MIRROR_TOKEN", t),
        None => cmd.env_remove("DAISY_MIRROR_TOKEN"),
    };
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_string();
    Mirror {
        child,
        url,
        _dir: dir,
    }
}

/// `node ARGS` with `HF_ENDPOINT` at the mirror, an empty cache, no token unless given, stdin closed.
fn node(endpoint: &str, args: &[&str], token: Option<&str>) -> Output {
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_node"));
    cmd.args(args)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HUB_CACHE", cache.path())
        .env("RUST_LOG", "trace")
        .stdin(Stdio::null());
    match token {
        Some(t) => cmd.env("HF_TOKEN", t),
        None => cmd.env_remove("HF_TOKEN"),
    };
    cmd.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn last_json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "node failed: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    serde_json::from_str(stdout.lines().last().expect("a JSON line")).unwrap()
}

fn stats(url: &str) -> serde_json::Value {
    let host = url.strip_prefix("http://").unwrap();
    let mut s = TcpStream::connect(host).unwrap();
    write!(
        s,
        "GET /__stats HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    serde_json::from_str(raw.split("\r\n\r\n").nth(1).unwrap()).unwrap()
}

/// The data-section bytes of every tensor, read from the safetensors header by this test itself.
#[test]
fn three_stages_each_fetch_only_their_own_bytes() {
    let model = smollm2();
    let m = mirror(
        &[("HuggingFaceTB/SmolLM2-135M-Instruct", &model)],
        &[],
        None,
    );
    let sizes = common::tensor_bytes(&model.join("model.safetensors"));
    let layer_of = common::layer_of;
    let mut covered = 0;
    for (id, layers, head) in [
        ("s0", (0, 10), true),
        ("s1", (10, 20), false),
        ("s2", (20, 30), false),
    ] {
        let range = format!("{}..{}", layers.0, layers.1);
        let mut args = vec![
            "fetch",
            "--model",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "--layers",
            &range,
            "--client-id",
            id,
            "--format",
            "json",
        ];
        if head {
            args.push("--head");
        }
        let report = last_json(&node(&m.url, &args, None));
        let expected: u64 = sizes
            .iter()
            .filter(|(name, _)| match layer_of(name) {
                Some(l) => (layers.0..layers.1).contains(&l),
                None => head,
            })
            .map(|(_, b)| b)
            .sum();
        assert_eq!(report["tensor_bytes"], expected, "stage {id}");
        covered += expected;
        let served = stats(&m.url)["bytes_served"][id].as_u64().unwrap();
        let open = report["open_bytes"].as_u64().unwrap();
        // What the server sent this process: its tensors plus opening (config and the header reads).
        assert_eq!(served, expected + open, "stage {id}");
        let header_len = {
            let mut f = std::fs::File::open(model.join("model.safetensors")).unwrap();
            let mut len = [0u8; 8];
            f.read_exact(&mut len).unwrap();
            u64::from_le_bytes(len)
        };
        let config_len = std::fs::metadata(model.join("config.json")).unwrap().len();
        assert_eq!(
            open,
            8 + header_len + config_len,
            "stage {id}: opening reads only config and header"
        );
        eprintln!("stage {id}: layers {range}, head {head}: {served} bytes served");
    }
    assert_eq!(
        covered,
        sizes.values().sum::<u64>(),
        "the three stages cover every tensor once"
    );
    assert_eq!(stats(&m.url)["authorization_on_redirect_host"], 0);
}

#[test]
fn a_run_through_the_mirror_equals_the_local_folder() {
    let model = smollm2();
    let m = mirror(
        &[("HuggingFaceTB/SmolLM2-135M-Instruct", &model)],
        &[],
        None,
    );
    let args = |model: &str| -> Vec<String> {
        [
            "run",
            "--model",
            model,
            "--prompt",
            "The capital of France is",
            "--max-new-tokens",
            "6",
            "--ignore-eos",
            "--format",
            "json",
            "--stages",
            "10,10,10",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let remote = args("HuggingFaceTB/SmolLM2-135M-Instruct");
    let remote: Vec<&str> = remote.iter().map(String::as_str).collect();
    let via_mirror = last_json(&node(&m.url, &remote, None));
    let local = args(model.to_str().unwrap());
    let local: Vec<&str> = local.iter().map(String::as_str).collect();
    let from_disk = last_json(&node(&m.url, &local, None));
    assert_eq!(via_mirror["ids"], from_disk["ids"]);
    assert_eq!(via_mirror["ids"].as_array().unwrap().len(), 6);
    assert_eq!(via_mirror["prompt_ids"], from_disk["prompt_ids"]);
}

fn tiny() -> PathBuf {
    root().join("fixtures/tiny/llama")
}

#[test]
fn a_gated_repo_asks_for_the_token_only_then_and_never_leaks_it() {
    const SECRET: &str = "hf_gatedSecretValue1234567890";
    let m = mirror(
        &[("org/gated", &tiny())],
        &["--require-token"],
        Some(SECRET),
    );
    let args = [
        "fetch",
        "--model",
        "org/gated",
        "--layers",
        "0..1",
        "--head",
        "--format",
        "json",
    ];

    let without = node(&m.url, &args, None);
    assert!(!without.status.success());
    let err = text(&without.stderr);
    assert!(err.contains("token is needed"), "{err}");
    assert!(err.contains("org/gated"), "{err}");
    assert_eq!(
        err.trim().lines().count(),
        1,
        "one line naming the problem: {err}"
    );

    let wrong = node(&m.url, &args, Some("hf_wrong"));
    assert!(!wrong.status.success());
    assert!(
        text(&wrong.stderr).contains("refused the token"),
        "{}",
        text(&wrong.stderr)
    );

    let with = node(&m.url, &args, Some(SECRET));
    let report = last_json(&with);
    assert!(report["tensor_bytes"].as_u64().unwrap() > 0);
    assert_eq!(
        stats(&m.url)["authorization_on_redirect_host"],
        0,
        "the token followed a redirect"
    );

    for out in [&without, &wrong, &with] {
        for stream in [&out.stdout, &out.stderr] {
            assert!(
                !text(stream).contains(SECRET),
                "the token appears in the output"
            );
            assert!(
                !text(stream).contains("gatedSecret"),
                "part of the token appears in the output"
            );
        }
    }
}

#[test]
fn a_missing_repo_is_named() {
    let m = mirror(&[("org/tiny", &tiny())], &[], None);
    let out = node(&m.url, &["inspect", "--model", "org/absent"], None);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("org/absent") && err.contains("does not exist"),
        "{err}"
    );
}

/// Each misbehaving server is refused with an error that names what it did.
#[test]
fn a_broken_server_is_refused_by_name() {
    let cases: [(&str, &str); 5] = [
        ("ignore-range", "ignored the Range request"),
        ("short-body", "short body"),
        ("wrong-content-range", "Content-Range says"),
        ("redirect-loop", "redirect loop"),
        ("commit-changes", "commit changed mid-run"),
    ];
    for (fault, expected) in cases {
        let m = mirror(&[("org/tiny", &tiny())], &["--fault", fault], None);
        let out = node(
            &m.url,
            &["fetch", "--model", "org/tiny", "--layers", "0..1", "--head"],
            None,
        );
        assert!(!out.status.success(), "{fault}: accepted");
        let err = text(&out.stderr);
        // A body cut short before the headers went out reaches the client as a closed connection.
        let also = (fault == "short-body").then_some("connection closed before message completed");
        assert!(
            err.contains(expected) || also.is_some_and(|a| err.contains(a)),
            "{fault}: {err}"
        );
        assert!(!err.contains("panicked"), "{fault}: {err}");
    }
}

#[test]
fn a_header_length_past_the_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    copy_dir(&tiny(), &model);
    let file = model.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let past = bytes.len() as u64 * 2;
    bytes[..8].copy_from_slice(&past.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
    let m = mirror(&[("org/bad", &model)], &[], None);
    let out = node(&m.url, &["inspect", "--model", "org/bad"], None);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("past the end") || err.contains("header length"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
