//! `node mirror` as a real HTTP server in its own process: the Hub's URL layout, ranges, the redirect
//! of weight files to a second host, gating, and per-client byte counts.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

struct Mirror {
    child: Child,
    url: String,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &std::path::Path, extra: &[&str], token: Option<&str>) -> Mirror {
    start_on(dir, "127.0.0.1:0", extra, token)
}

fn start_on(dir: &std::path::Path, listen: &str, extra: &[&str], token: Option<&str>) -> Mirror {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_node"));
    cmd.args(["mirror", dir.to_str().unwrap(), "--listen", listen])
        .args(extra);
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    match token {
        Some(t) => cmd.env("DAISY_MIRROR_TOKEN", t),
        None => cmd.env_remove("DAISY_MIRROR_TOKEN"),
    };
    let mut child = cmd.spawn().expect("start node mirror");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .expect("first line names the URL")
        .to_string();
    Mirror { child, url }
}

/// A minimal HTTP/1.1 GET, so the test does not share the client code it is testing. A `Host` among
/// `headers` replaces the URL's (the request still goes to the URL's address).
fn get(url: &str, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut s = TcpStream::connect(host).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req += &format!("Host: {host}\r\n");
    }
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let body = raw[split + 4..].to_vec();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    (status, headers, body)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("org/tiny");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("config.json"), b"{\"model_type\":\"llama\"}").unwrap();
    let weights: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    std::fs::write(model.join("model.safetensors"), weights).unwrap();
    dir
}

#[test]
fn serves_ranges_and_redirects_weights_to_another_host() {
    let dir = repo();
    let m = start(dir.path(), &[], None);
    let (status, h, body) = get(&format!("{}/org/tiny/resolve/main/config.json", m.url), &[]);
    assert_eq!(status, 200);
    assert_eq!(body, b"{\"model_type\":\"llama\"}");
    let commit = header(&h, "x-repo-commit").unwrap().to_string();
    assert_eq!(commit.len(), 40);
    assert!(header(&h, "etag").is_some());

    let (status, h, body) = get(
        &format!("{}/org/tiny/resolve/main/config.json", m.url),
        &[("Range", "bytes=2-6")],
    );
    assert_eq!(status, 206);
    assert_eq!(body, b"model");
    assert_eq!(header(&h, "content-range"), Some("bytes 2-6/22"));

    let (status, h, _) = get(
        &format!("{}/org/tiny/resolve/main/model.safetensors", m.url),
        &[],
    );
    assert_eq!(status, 302);
    assert_eq!(header(&h, "x-repo-commit"), Some(commit.as_str()));
    let location = header(&h, "location").unwrap().to_string();
    assert!(location.starts_with("http://127.0.0.2:"), "{location}");
    let (status, _, body) = get(
        &location,
        &[("Range", "bytes=9990-"), ("X-Daisy-Client", "stage-1")],
    );
    assert_eq!(status, 206);
    assert_eq!(body.len(), 10);
    assert_eq!(body[0], (9990 % 256) as u8);
    let tampered = location.replace("sig=", "sig=0");
    assert_eq!(get(&tampered, &[]).0, 403);

    let (_, _, stats) = get(&format!("{}/__stats", m.url), &[]);
    let stats: serde_json::Value = serde_json::from_slice(&stats).unwrap();
    assert_eq!(stats["bytes_served"]["stage-1"], 10);
    assert_eq!(stats["authorization_on_redirect_host"], 0);
}

#[test]
fn a_second_device_is_redirected_to_the_host_it_reached_the_mirror_at() {
    let dir = repo();
    let m = start_on(dir.path(), "0.0.0.0:0", &[], None);
    // Bound to every interface, the printed URL is one another device can use.
    assert!(!m.url.contains("0.0.0.0"), "{}", m.url);
    let port = m.url.rsplit(':').next().unwrap().to_string();
    let local = format!("http://127.0.0.1:{port}");
    // A device of the LAN that reached this machine as `gpu-box.lan` is sent back to that name.
    let (status, h, _) = get(
        &format!("{local}/org/tiny/resolve/main/model.safetensors"),
        &[("Host", &format!("gpu-box.lan:{port}"))],
    );
    assert_eq!(status, 302);
    let location = header(&h, "location").unwrap().to_string();
    let rest = location
        .strip_prefix("http://gpu-box.lan:")
        .unwrap_or_else(|| panic!("{location} does not name the host the request came to"));
    let (cdn_port, path) = rest.split_at(rest.find('/').unwrap());
    assert_ne!(
        cdn_port, port,
        "weights are served by the redirect host's own port"
    );
    // That host listens on every interface too: following the redirect (here over loopback) works.
    let (status, _, body) = get(
        &format!("http://127.0.0.1:{cdn_port}{path}"),
        &[("Range", "bytes=0-3")],
    );
    assert_eq!(status, 206);
    assert_eq!(body, [0, 1, 2, 3]);
    // A request that came over loopback still goes to the loopback redirect address.
    let (_, h, _) = get(
        &format!("{local}/org/tiny/resolve/main/model.safetensors"),
        &[],
    );
    assert!(
        header(&h, "location")
            .unwrap()
            .starts_with("http://127.0.0.2:"),
        "{h:?}"
    );
}

#[test]
fn refuses_what_the_hub_refuses() {
    let dir = repo();
    let m = start(dir.path(), &[], None);
    let (status, h, _) = get(
        &format!("{}/org/missing/resolve/main/config.json", m.url),
        &[],
    );
    assert_eq!(status, 401);
    assert_eq!(header(&h, "x-error-code"), Some("RepoNotFound"));
    let (status, h, _) = get(&format!("{}/org/tiny/resolve/main/nope.json", m.url), &[]);
    assert_eq!(status, 404);
    assert_eq!(header(&h, "x-error-code"), Some("EntryNotFound"));
    let (status, h, _) = get(&format!("{}/org/tiny/resolve/v9/config.json", m.url), &[]);
    assert_eq!(status, 404);
    assert_eq!(header(&h, "x-error-code"), Some("RevisionNotFound"));
    let (status, _, _) = get(
        &format!("{}/org/tiny/resolve/main/config.json", m.url),
        &[("Range", "bytes=50-60")],
    );
    assert_eq!(status, 416);
    let (status, _, _) = get(
        &format!("{}/org/tiny/resolve/main/..%2F..%2Fetc%2Fpasswd", m.url),
        &[],
    );
    assert!(status == 400 || status == 404, "{status}");
}

#[test]
fn a_gated_repo_needs_the_bearer_token() {
    let dir = repo();
    let m = start(dir.path(), &["--require-token"], Some("hf_test_secret"));
    let url = format!("{}/org/tiny/resolve/main/config.json", m.url);
    let (status, h, _) = get(&url, &[]);
    assert_eq!(status, 401);
    assert_eq!(header(&h, "x-error-code"), Some("GatedRepo"));
    assert_eq!(get(&url, &[("Authorization", "Bearer wrong")]).0, 401);
    assert_eq!(
        get(&url, &[("Authorization", "Bearer hf_test_secret")]).0,
        200
    );
}

#[test]
fn require_token_without_a_token_is_refused_by_name() {
    let dir = repo();
    let out = Command::new(env!("CARGO_BIN_EXE_node"))
        .args([
            "mirror",
            dir.path().to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--require-token",
        ])
        .env_remove("DAISY_MIRROR_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("DAISY_MIRROR_TOKEN"), "{err}");
}
