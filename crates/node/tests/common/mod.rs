//! Helpers more than one test binary uses.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// Each tensor's byte length in a `.safetensors` file, read from its header.
pub(crate) fn tensor_bytes(file: &Path) -> BTreeMap<String, u64> {
    let mut f = std::fs::File::open(file).unwrap();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).unwrap();
    let mut header = vec![0u8; u64::from_le_bytes(len) as usize];
    f.read_exact(&mut header).unwrap();
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).unwrap();
    header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(k, v)| {
            let o = v["data_offsets"].as_array().unwrap();
            (k, o[1].as_u64().unwrap() - o[0].as_u64().unwrap())
        })
        .collect()
}

/// The bytes a stage's opening reads: the header length, the header and `config.json`.
pub(crate) fn open_bytes(model: &Path) -> u64 {
    let mut f = std::fs::File::open(model.join("model.safetensors")).unwrap();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).unwrap();
    let config = std::fs::metadata(model.join("config.json")).unwrap().len();
    8 + u64::from_le_bytes(len) + config
}

/// The layer a tensor name belongs to (`model.layers.N.` or GPT-2's `h.N.`), `None` for the head's.
pub(crate) fn layer_of(name: &str) -> Option<usize> {
    let rest = name
        .strip_prefix("model.layers.")
        .or_else(|| name.strip_prefix("transformer.h."))
        .or_else(|| name.strip_prefix("h."))?;
    rest.split('.').next()?.parse().ok()
}

/// Every process a test starts, killed when it ends however it ends.
pub(crate) struct Procs(pub(crate) Vec<std::process::Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A head serving its API and page (stdin at `/dev/null`), its stderr readable line by line.
pub(crate) struct Served {
    pub(crate) procs: Procs,
    lines: std::sync::mpsc::Receiver<String>,
    pub(crate) seen: Vec<String>,
    /// `http://127.0.0.1:PORT`.
    pub(crate) base: String,
    join_url: String,
    /// The cache folder of the head and its members (`XDG_CACHE_HOME`, unless `env` sets one).
    cache: tempfile::TempDir,
}

impl Served {
    /// `node head --model MODEL --listen 127.0.0.1:0 --backend cpu ARGS` with `env` (and without
    /// `HF_TOKEN` unless `env` sets it).
    pub(crate) fn start(model: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        use std::io::BufRead;
        let cache = tempfile::tempdir().unwrap();
        let mut head = std::process::Command::new(env!("CARGO_BIN_EXE_node"))
            .args(["head", "--model", model])
            .args(["--listen", "127.0.0.1:0", "--backend", "cpu"])
            .args(args)
            .env_remove("HF_TOKEN")
            .env("XDG_CACHE_HOME", cache.path())
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(head.stdout.take().unwrap());
        let err = std::io::BufReader::new(head.stderr.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        let join_url = first
            .trim()
            .strip_prefix("join: ")
            .unwrap_or_else(|| panic!("no join URL, got {first:?}"))
            .to_string();
        let base = join_url.split("/join").next().unwrap().to_string();
        Self {
            procs: Procs(vec![head]),
            lines,
            seen: Vec::new(),
            base,
            join_url,
            cache,
        }
    }

    /// Start a member named `name`, the join URL on its stdin.
    pub(crate) fn join(&mut self, name: &str) {
        self.join_with(name, &[], std::process::Stdio::null());
    }

    /// [`Served::join`] with environment variables and where its stderr goes.
    pub(crate) fn join_with(
        &mut self,
        name: &str,
        env: &[(&str, &str)],
        stderr: impl Into<std::process::Stdio>,
    ) {
        use std::io::Write;
        let mut member = std::process::Command::new(env!("CARGO_BIN_EXE_node"))
            .args(["join", "--backend", "cpu", "--name", name])
            .env("XDG_CACHE_HOME", self.cache.path())
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        writeln!(member.stdin.take().unwrap(), "{}", self.join_url).unwrap();
        self.procs.0.push(member);
    }

    /// The next line of the head's stderr containing `pattern` (panics after 180 s).
    pub(crate) fn wait_for(&mut self, pattern: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(pattern) {
                        return line;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "the head never printed {pattern:?}; it printed:\n{}",
            self.seen.join("\n")
        );
    }

    /// Everything the head printed until now (without waiting).
    pub(crate) fn drain(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }
}

/// A tool a test needs: found, or `None` (skipped) — a failure under `CI=true`.
pub(crate) fn tool<T>(found: Option<T>, what: &str) -> Option<T> {
    if found.is_none() {
        assert!(
            std::env::var("CI").is_err(),
            "CI=true and {what} is missing (`.ci/run` installs it)"
        );
        eprintln!("skipped: {what} is missing");
    }
    found
}

/// The Python with the official `openai` package: `DAISY_PYTHON`, else the venv `.ci/run` makes;
/// `None` (a failure under `CI=true`) without one.
pub(crate) fn python() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let candidates = [
        std::env::var_os("DAISY_PYTHON").map(PathBuf::from),
        std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".cache/daisychain-infer/venv/bin/python")),
    ];
    let found = candidates.into_iter().flatten().find(|p| {
        std::process::Command::new(p)
            .args(["-c", "import openai"])
            .status()
            .is_ok_and(|s| s.success())
    });
    tool(found, "a Python with the `openai` package (DAISY_PYTHON)")
}

/// The workspace's root.
pub(crate) fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The SmolLM2 fixture folder (`cargo xtask fixtures`), as a command-line argument.
pub(crate) fn smollm2() -> String {
    root()
        .join("target/fixtures/SmolLM2-135M-Instruct")
        .to_string_lossy()
        .into_owned()
}

/// `node ARGS --backend cpu --format json` (a `run`, the oracle of the ring tests): its report,
/// the last line of stdout.
pub(crate) fn node_json(args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_node"))
        .args(args)
        .args(["--backend", "cpu", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "node {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().expect("a line")).expect("JSON on the last line")
}

/// A gated repo (a real mirror that requires a token) behind `$HF_ENDPOINT`, holding the tiny
/// GPT-2 of `fixtures/tiny/gpt2`; its URL.
pub(crate) fn gated_mirror(dir: &std::path::Path, tokens: &[&str], procs: &mut Procs) -> String {
    use std::io::BufRead;
    let repo = dir.join("tiny-org/tiny-gpt2");
    std::fs::create_dir_all(&repo).unwrap();
    for entry in std::fs::read_dir(root().join("fixtures/tiny/gpt2")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), repo.join(entry.file_name())).unwrap();
    }
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_node"))
        .args(["mirror", dir.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .arg("--require-token")
        .env("DAISY_MIRROR_TOKEN", tokens.join(","))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    procs.0.push(child);
    line.trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_string()
}

/// A blocking HTTP client for the head's API (plain HTTP; reqwest still wants a TLS provider).
pub(crate) fn http_client() -> reqwest::blocking::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(300))
        .build()
        .unwrap()
}

/// `POST {base}{path}` with the JSON `body`; the reply's JSON (status 200 asserted).
pub(crate) fn post_json(
    client: &reqwest::blocking::Client,
    base: &str,
    path: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    let reply = client
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .expect("the head answers");
    let status = reply.status();
    let text = reply.text().expect("a body");
    assert!(status.is_success(), "{status}: {text}");
    serde_json::from_str(&text).expect("JSON")
}
