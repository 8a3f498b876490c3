//! The ring across processes: `node head` and `node join` as separate processes talking real WebRTC
//! on loopback, compared with the independent oracle of the same split played in one process
//! (`node run --stages`): the same ids and the same hash of every hop, and Verify's match.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
mod netlab;

use common::Procs;
use netlab::{Faults, Lab};

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn smollm2() -> PathBuf {
    root().join("target/fixtures/SmolLM2-135M-Instruct")
}

fn essay_prompt() -> String {
    let essay = std::fs::read_to_string(root().join("fixtures/text/essay.txt")).unwrap();
    essay.chars().take(400).collect()
}

fn node(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_node"))
        .args(args)
        .output()
        .expect("node runs")
}

fn last_json(stdout: &str) -> Value {
    serde_json::from_str(stdout.lines().last().expect("a line")).expect("JSON on the last line")
}

/// What a ring run left: the head's stdout and stderr, each member's stderr, and exit codes.
struct RingRun {
    head_ok: bool,
    head_out: String,
    head_err: String,
    members_ok: Vec<bool>,
    members_err: Vec<String>,
    join_url: String,
}

impl RingRun {
    /// Every turn's JSON report the head printed (a head reading prompts from stdin prints several).
    fn reports(&self) -> Vec<Value> {
        self.head_out
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The head's line saying which member failed mid-turn and why.
    fn refusal(&self) -> &str {
        self.head_err
            .lines()
            .find(|l| l.contains("failed mid-turn"))
            .unwrap_or_else(|| panic!("no refusal in\n{}", self.head_err))
    }

    fn report(&self) -> Value {
        assert!(
            self.head_ok,
            "the head failed:\n{}\nmembers:\n{}",
            self.head_err,
            self.members_err.join("\n---\n")
        );
        last_json(&self.head_out)
    }
}

fn read_all(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// A ring being run: the head's stderr readable line by line while it runs.
struct Live {
    procs: Procs,
    /// The head's stdin, when it reads its prompts there.
    head_in: Option<std::process::ChildStdin>,
    head_out: std::thread::JoinHandle<String>,
    head_lines: std::sync::mpsc::Receiver<String>,
    head_err: std::thread::JoinHandle<String>,
    members_err: Vec<std::thread::JoinHandle<String>>,
    /// Each member's name, in the order they were started.
    names: Vec<String>,
    /// The head's stderr lines `wait_for` has read.
    history: Vec<String>,
    join_url: String,
    /// The cache folder of this ring's processes (`XDG_CACHE_HOME`, unless a test sets its own):
    /// each test starts without kept layers.
    cache: tempfile::TempDir,
    /// The network namespace of each process, head first, when the ring runs in a [`Lab`].
    netns: Vec<String>,
}

/// `node`, or `ip netns exec NS node` inside namespace `ns`.
fn node_in(ns: Option<&str>) -> Command {
    match ns {
        None => Command::new(env!("CARGO_BIN_EXE_node")),
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_node")]);
            c
        }
    }
}

impl Live {
    /// Start a head on `model` with `head_args`, then one member per entry of `members` (each given
    /// the join URL on stdin, or the URL with the given secret put in place of the head's).
    fn start(model: &Path, head_args: &[&str], members: &[Option<&str>]) -> Self {
        Self::start_with(model, head_args, &[], members)
    }

    /// [`Live::start`] with environment variables for the head.
    fn start_with(
        model: &Path,
        head_args: &[&str],
        head_env: &[(&str, &str)],
        members: &[Option<&str>],
    ) -> Self {
        Self::start_full(model, head_args, head_env, members, Vec::new())
    }

    /// [`Live::start`] with the head on host 0 of `lab` and each member joined later on the next
    /// host.
    fn start_in(model: &Path, head_args: &[&str], lab: &Lab) -> Self {
        let netns = (0..3).map(|i| lab.ns(i).to_string()).collect();
        Self::start_full(model, head_args, &[], &[], netns)
    }

    fn start_full(
        model: &Path,
        head_args: &[&str],
        head_env: &[(&str, &str)],
        members: &[Option<&str>],
        netns: Vec<String>,
    ) -> Self {
        let mut procs = Procs(Vec::new());
        let cache = tempfile::tempdir().unwrap();
        // Prompts come from stdin when the head has no `--prompt`.
        let stdin = if head_args.contains(&"--prompt") {
            Stdio::null()
        } else {
            Stdio::piped()
        };
        let listen = match netns.first() {
            None => "127.0.0.1:0".to_string(),
            Some(_) => format!("{}:0", Lab::addr(0)),
        };
        let mut head = node_in(netns.first().map(String::as_str))
            .args(["head", "--model"])
            .arg(model)
            .args(["--listen", &listen, "--backend", "cpu"])
            .args(head_args)
            .env("XDG_CACHE_HOME", cache.path())
            .env("XDG_DATA_HOME", cache.path())
            .envs(head_env.iter().copied())
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the head starts");
        let head_in = head.stdin.take();
        let mut out = BufReader::new(head.stdout.take().unwrap());
        let err = BufReader::new(head.stderr.take().unwrap());
        let (tx, head_lines) = std::sync::mpsc::channel();
        let head_err = std::thread::spawn(move || {
            let mut all = String::new();
            for line in err.lines().map_while(Result::ok) {
                all.push_str(&line);
                all.push('\n');
                let _ = tx.send(line);
            }
            all
        });
        procs.0.push(head);
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        let join_url = first
            .trim()
            .strip_prefix("join: ")
            .unwrap_or_else(|| panic!("no join URL, got {first:?}"))
            .to_string();
        let head_out = read_all(out);
        let mut live = Self {
            procs,
            head_in,
            head_out,
            head_lines,
            head_err,
            members_err: Vec::new(),
            names: Vec::new(),
            history: Vec::new(),
            join_url,
            cache,
            netns,
        };
        for (i, secret) in members.iter().enumerate() {
            live.join(&format!("member-{i}"), *secret, &[], &[]);
        }
        live
    }

    /// Start a member named `name` with the join URL on stdin (its secret replaced by `secret`
    /// when given), extra arguments and environment.
    fn join(&mut self, name: &str, secret: Option<&str>, args: &[&str], env: &[(&str, &str)]) {
        let url = match secret {
            None => self.join_url.clone(),
            Some(s) => format!("{}#{s}", self.join_url.split('#').next().unwrap()),
        };
        let ns = self.netns.get(self.names.len() + 1).map(String::as_str);
        // The CPU unless the caller names a backend.
        let backend: &[&str] = match args.contains(&"--backend") {
            true => &[],
            false => &["--backend", "cpu"],
        };
        let mut m = node_in(ns)
            .args(["join", "--name", name])
            .args(backend)
            .args(args)
            .env("XDG_CACHE_HOME", self.cache.path())
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("a member starts");
        writeln!(m.stdin.take().unwrap(), "{url}").unwrap();
        self.members_err.push(read_all(m.stderr.take().unwrap()));
        self.names.push(name.to_string());
        self.procs.0.push(m);
    }

    /// The next line of the head's stderr that contains `pattern` (panics after 120 s).
    fn wait_for(&mut self, pattern: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.head_lines.recv_timeout(left) {
                Ok(line) => {
                    self.history.push(line.clone());
                    if line.contains(pattern) {
                        return line;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "the head never printed {pattern:?}; it printed:\n{}",
            self.history.join("\n")
        );
    }

    /// The last line the head printed so far (read by `wait_for`) that contains `pattern`.
    fn seen(&self, pattern: &str) -> String {
        self.history
            .iter()
            .rev()
            .find(|l| l.contains(pattern))
            .unwrap_or_else(|| panic!("the head has not printed {pattern:?}"))
            .clone()
    }

    /// The process of the member named `device` (`member-N`).
    fn member(&mut self, device: &str) -> &mut Child {
        let i = self.names.iter().position(|n| n == device).unwrap();
        &mut self.procs.0[i + 1]
    }

    /// Send `signal` (`KILL`, `STOP`) to the member holding stage `stage`, named in the head's plan
    /// line `head: stage N = member-M holds …` (which `wait_for` must have returned).
    fn signal(&mut self, plan_line: &str, signal: &str) -> String {
        let device = plan_line
            .split(" = ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap()
            .to_string();
        let pid = self.member(&device).id().to_string();
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal} {pid}");
        device
    }

    /// Type one prompt on the head's stdin.
    fn prompt(&mut self, line: &str) {
        let stdin = self
            .head_in
            .as_mut()
            .expect("a head reading prompts from stdin");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Wait for the head to end (up to 300 s) and the members after it (up to 15 s more; the rest
    /// are killed), and collect what they left.
    fn finish(mut self) -> RingRun {
        // End of prompts: the head stops the ring.
        drop(self.head_in.take());
        let mut deadline = Instant::now() + Duration::from_secs(300);
        let mut codes = Vec::new();
        for (i, c) in self.procs.0.iter_mut().enumerate() {
            if i == 1 {
                deadline = deadline.min(Instant::now() + Duration::from_secs(15));
            }
            let status = loop {
                if let Some(s) = c.try_wait().unwrap() {
                    break Some(s);
                }
                if Instant::now() > deadline {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            codes.push(status.is_some_and(|s| s.success()));
        }
        drop(self.procs);
        drop(self.head_in);
        RingRun {
            head_ok: codes[0],
            head_out: self.head_out.join().unwrap(),
            head_err: self.head_err.join().unwrap(),
            members_ok: codes[1..].to_vec(),
            members_err: self
                .members_err
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect(),
            join_url: self.join_url,
        }
    }
}

fn ring(model: &Path, head_args: &[&str], members: &[Option<&str>]) -> RingRun {
    Live::start(model, head_args, members).finish()
}

/// The oracle: the same split in one process, every hop through the same wire.
fn one_process(model: &Path, stages: &str, prompt: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "run",
        "--model",
        model.to_str().unwrap(),
        "--stages",
        stages,
        "--prompt",
        prompt,
        "--backend",
        "cpu",
        "--format",
        "json",
    ];
    args.extend(extra);
    let out = node(&args);
    assert!(
        out.status.success(),
        "node run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    last_json(&String::from_utf8_lossy(&out.stdout))
}

/// The ids and the hops (layer and hash of each) of a report.
fn ids_and_hops(v: &Value) -> (Value, Vec<(u64, String)>) {
    let hops = v["hops"]
        .as_array()
        .expect("hops")
        .iter()
        .map(|h| {
            (
                h["after_layer"].as_u64().unwrap(),
                h["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (v["ids"].clone(), hops)
}

fn check_ring_matches_one_process(model: &Path, stages: &str, prompt: &str, path: &str) {
    check_ring_matches_one_process_at(model, stages, prompt, path, "int8");
}

/// [`check_ring_matches_one_process`] with the head (and so every member, through its assignment)
/// and the oracle at `precision`.
fn check_ring_matches_one_process_at(
    model: &Path,
    stages: &str,
    prompt: &str,
    path: &str,
    precision: &str,
) {
    let generate = [
        "--max-new-tokens",
        "8",
        "--ignore-eos",
        "--path",
        path,
        "--precision",
        precision,
    ];
    let mut head_args = vec!["--stages", stages, "--prompt", prompt, "--format", "json"];
    head_args.extend(generate);
    let n_members = stages.split(',').count() - 1;
    let run = ring(model, &head_args, &vec![None; n_members]);
    let report = run.report();
    assert!(
        run.members_ok.iter().all(|ok| *ok),
        "a member failed: {:?}",
        run.members_err
    );
    let oracle = one_process(model, stages, prompt, &generate);
    let (ids, hops) = ids_and_hops(&report);
    assert_eq!(ids.as_array().unwrap().len(), 8, "{path}");
    assert_eq!((ids.clone(), hops.clone()), ids_and_hops(&oracle), "{path}");
    assert_eq!(hops.len(), n_members + 1, "one hop per stage");
    assert_eq!(
        report["laps"], oracle["laps"],
        "the same laps (prefill chunks and decode)"
    );
    assert_eq!(
        report["verify"]["match"], true,
        "{path}: {}",
        report["verify"]
    );
    let n_layers: usize = stages.split(',').map(|s| s.parse::<usize>().unwrap()).sum();
    assert_eq!(
        report["verify"]["hops_compared"],
        serde_json::json!([n_layers]),
        "the last stage's output, in both runs"
    );
    assert_eq!(report["devices"].as_array().unwrap().len(), n_members + 1);
    assert_eq!(report["path"], path);
    // The head's memory told apart: the peak when its layers had loaded, at most the peak since
    // (Verify's unsplit run loads every layer after it).
    let (load, peak) = (
        report["load_peak_rss_bytes"].as_u64(),
        report["peak_rss_bytes"].as_u64(),
    );
    assert!(
        load.is_some_and(|l| l > 0 && Some(l) <= peak),
        "load peak {load:?}, peak {peak:?}"
    );
    // The mutation: another split's hops are not these (the comparison can fail).
    let other: Vec<usize> = {
        let n: Vec<usize> = stages.split(',').map(|s| s.parse().unwrap()).collect();
        let total: usize = n.iter().sum();
        vec![n[0], total - n[0]]
    };
    let other = one_process(
        model,
        &format!("{},{}", other[0], other[1]),
        prompt,
        &generate,
    );
    assert_ne!(
        ids_and_hops(&other).1,
        hops,
        "a different split must not compare equal"
    );
    // Through the head's folder, each member fetched exactly its own layers' tensor bytes, plus the
    // config and the safetensors header it opened.
    let sizes = common::tensor_bytes(&model.join("model.safetensors"));
    let counts: Vec<usize> = stages.split(',').map(|s| s.parse().unwrap()).collect();
    let mut start = counts[0];
    for (i, count) in counts.iter().enumerate().skip(1) {
        let layers = start..start + count;
        start += count;
        let own: u64 = sizes
            .iter()
            .filter(|(name, _)| common::layer_of(name).is_some_and(|l| layers.contains(&l)))
            .map(|(_, b)| b)
            .sum();
        assert!(own > 0);
        // Members take their stages in the order they were admitted, which the report lists.
        let device = report["devices"][i].as_str().unwrap();
        let served = report["bytes_served"][device].as_u64();
        assert_eq!(
            served,
            Some(own + common::open_bytes(model)),
            "stage {i}, layers {layers:?}: {}",
            report["bytes_served"]
        );
    }
    assert_eq!(
        report["bytes_served"].as_object().unwrap().len(),
        n_members,
        "no one else fetched from the head: {}",
        report["bytes_served"]
    );
    // The secret is shown once, on the head's stdout; no log carries it.
    let secret = run.join_url.split('#').nth(1).unwrap();
    assert!(!run.head_err.contains(secret));
    assert!(run.members_err.iter().all(|e| !e.contains(secret)));
}

#[test]
fn three_processes_full_window_give_the_ids_and_hop_hashes_of_one_process() {
    check_ring_matches_one_process(&smollm2(), "10,10,10", &essay_prompt(), "full-window");
}

#[test]
fn three_processes_cached_give_the_ids_and_hop_hashes_of_one_process() {
    check_ring_matches_one_process(&smollm2(), "10,10,10", &essay_prompt(), "cached");
}

#[test]
fn a_head_of_zero_layers_over_three_processes() {
    let gpt2 = root().join("fixtures/tiny/gpt2");
    for path in ["full-window", "cached"] {
        check_ring_matches_one_process(&gpt2, "0,2,1", "Hello there, ring", path);
    }
}

#[test]
fn a_ring_at_int8x2_gives_the_bits_of_one_process_at_int8x2() {
    let llama = root().join("fixtures/tiny/llama");
    let prompt = "Hello there, ring";
    for path in ["full-window", "cached"] {
        check_ring_matches_one_process_at(&llama, "1,1,1", prompt, path, "int8x2");
    }
    // Mutation: the members ran two planes, not one — one process at int8 gives other hop hashes.
    let at = |precision| {
        let extra = [
            "--max-new-tokens",
            "8",
            "--ignore-eos",
            "--precision",
            precision,
        ];
        ids_and_hops(&one_process(&llama, "1,1,1", prompt, &extra)).1
    };
    assert_ne!(
        at("int8"),
        at("int8x2"),
        "int8 and int8x2 give the same hops"
    );
}

/// The prompt of [`llama_ring`].
const RING_PROMPT: &str = "Hello there, ring";

/// A head on tiny Llama split 1,1,1 over [`RING_PROMPT`] with `generate`'s flags (JSON out),
/// waiting for its two members; and the model's folder.
fn llama_ring(generate: &[&str]) -> (PathBuf, Live) {
    let llama = root().join("fixtures/tiny/llama");
    let mut head_args = vec![
        "--stages",
        "1,1,1",
        "--prompt",
        RING_PROMPT,
        "--format",
        "json",
    ];
    head_args.extend(generate);
    let live = Live::start_full(&llama, &head_args, &[], &[], Vec::new());
    (llama, live)
}

#[test]
fn members_on_the_gpu_give_the_bits_of_one_cpu_process() {
    // Each member runs its layers whole on its GPU (lavapipe in CI); the head stays on the CPU.
    let (prompt, generate) = (
        RING_PROMPT,
        ["--max-new-tokens", "8", "--ignore-eos", "--path", "cached"],
    );
    let (llama, mut live) = llama_ring(&generate);
    for i in 0..2 {
        live.join(&format!("member-{i}"), None, &["--backend", "gpu"], &[]);
    }
    let run = live.finish();
    assert!(run.head_ok, "{}", run.head_err);
    assert!(
        run.members_ok.iter().all(|ok| *ok),
        "a member failed: {:?}",
        run.members_err
    );
    let gpu_members = run
        .head_err
        .lines()
        .filter(|l| l.starts_with("head: member-") && l.contains(": wgpu:"))
        .count();
    assert_eq!(gpu_members, 2, "both members on a GPU: {}", run.head_err);
    let report = run.report();
    let oracle = one_process(&llama, "1,1,1", prompt, &generate);
    assert_eq!(ids_and_hops(&report), ids_and_hops(&oracle));
    assert_eq!(report["verify"]["match"], true, "{}", report["verify"]);
    // Mutation: the hops of another split are not these (the comparison can fail).
    let other = one_process(&llama, "2,1", prompt, &generate);
    assert_ne!(ids_and_hops(&other).1, ids_and_hops(&report).1);
}

#[test]
fn slow_steps_keep_their_link_alive() {
    // A member whose first two steps take 3 s each (a GPU compiling its shaders on first use)
    // must not go silent on the link they came on: a peer that hears nothing for 2.5 s takes the
    // connection for dead, and the turn would be replayed without the member. (Steps run on the
    // link's thread only after a quick one.)
    let generate = ["--max-new-tokens", "4", "--ignore-eos", "--path", "cached"];
    let (llama, mut live) = llama_ring(&generate);
    live.join("member-0", None, &[], &[("DAISY_TEST_SLOW_STEPS", "3000")]);
    live.join("member-1", None, &[], &[]);
    let run = live.finish();
    assert!(run.head_ok, "{}", run.head_err);
    assert!(
        run.members_err
            .iter()
            .any(|e| e.matches("DAISY_TEST_SLOW_STEPS=3000").count() == 2),
        "the hook did not run: {:?}",
        run.members_err
    );
    check_whole_without_replay(&llama, &run, &generate);
}

/// A [`llama_ring`] turn that replayed nothing and gave the ids and hop hashes of one process of
/// the same split: no member was left out.
fn check_whole_without_replay(llama: &Path, run: &RingRun, generate: &[&str]) {
    let report = run.report();
    assert_eq!(report["replays"], 0, "{}", run.head_err);
    let oracle = one_process(llama, "1,1,1", RING_PROMPT, generate);
    assert_eq!(ids_and_hops(&report), ids_and_hops(&oracle));
}

#[test]
fn a_link_offered_again_replaces_the_attempt_its_offerer_gave_up() {
    // A member whose side of a handshake timed out while the peer's side opened offers the link
    // again. The peer must take the new attempt (the old one is closed on the offerer's side):
    // the head, which awaits the link back from the last member, must not refuse it as one it did
    // not ask for (the ring then waited for a member waiting for an answer); a member already
    // reading the old one (the offerer waits a few seconds before it offers again) must read the
    // new one, or the first lap is lost on a link no one sends on.
    let generate = ["--max-new-tokens", "4", "--ignore-eos", "--path", "cached"];
    let (llama, mut live) = llama_ring(&generate);
    // One member offers the link to the other, the last offers the one to the head.
    let hook = [("DAISY_TEST_ABANDON_LINK", "1")];
    live.join("member-0", None, &[], &hook);
    live.join("member-1", None, &[], &hook);
    let run = live.finish();
    assert!(run.head_ok, "{}", run.head_err);
    for err in &run.members_err {
        assert_eq!(
            err.matches("given up on purpose (a test hook); offering it again")
                .count(),
            1,
            "the hook did not run once in each member: {:?}",
            run.members_err
        );
    }
    assert!(
        run.members_err
            .iter()
            .any(|e| e
                .contains("from the previous stage was offered again; the new one replaces it")),
        "the member-to-member link was not replaced while read: {:?}",
        run.members_err
    );
    check_whole_without_replay(&llama, &run, &generate);
}

#[test]
fn a_member_without_the_secret_is_refused_at_signaling() {
    let gpt2 = root().join("fixtures/tiny/gpt2");
    let wrong = "00000000000000000000000000000000";
    let run = ring(
        &gpt2,
        &[
            "--stages",
            "1,2",
            "--prompt",
            "Hello",
            "--max-new-tokens",
            "3",
            "--format",
            "json",
        ],
        &[Some(wrong), None],
    );
    assert!(
        !run.members_ok[0],
        "the member with a wrong secret must fail"
    );
    assert!(
        run.members_err[0].contains("the head refused this device: wrong ring secret"),
        "{}",
        run.members_err[0]
    );
    assert!(
        !run.members_err[0].contains("admitted"),
        "{}",
        run.members_err[0]
    );
    assert!(run.head_err.contains("refused: wrong ring secret"));
    // The head went on: the member with the secret joined and the turn was verified.
    let report = run.report();
    assert_eq!(report["verify"]["match"], true);
    assert_eq!(report["devices"][1], "member-1");
    assert!(run.members_ok[1], "{}", run.members_err[1]);
}

/// A long turn on three processes, in which something happens to a member once the turn runs.
fn long_turn() -> Vec<&'static str> {
    vec![
        "--stages",
        "10,10,10",
        "--prompt",
        "Once upon a time",
        "--max-new-tokens",
        "300",
        "--ignore-eos",
        "--format",
        "json",
    ]
}

fn check_one_replay(signal: &str) {
    check_one_replay_of(
        "head: stage 2 = ",
        signal,
        serde_json::json!([[0, 10], [10, 30]]),
    );
}

/// [`check_one_replay`] of the member named on the head's line starting `stage`, with `plan` the
/// plan of the replay.
fn check_one_replay_of(stage: &str, signal: &str, plan: Value) {
    let mut live = Live::start(&smollm2(), &long_turn(), &[None, None]);
    let plan_line = live.wait_for(stage);
    live.wait_for("head: a turn of");
    std::thread::sleep(Duration::from_millis(300));
    let gone = live.signal(&plan_line, signal);
    live.wait_for("replaying the turn from the start");
    live.wait_for("head: verify");
    // A stopped member never ends by itself.
    let _ = live.member(&gone).kill();
    let run = live.finish();
    let report = run.report();
    assert_eq!(report["replays"], 1, "{}", run.head_err);
    assert_eq!(report["ids"].as_array().unwrap().len(), 300);
    assert_eq!(report["verify"]["match"], true, "{}", report["verify"]);
    let devices: Vec<&str> = report["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert_eq!(devices.len(), 2, "{devices:?}");
    assert!(!devices.contains(&gone.as_str()), "{devices:?}");
    assert_eq!(report["plan"], plan);
    assert!(
        report["excluded"][0]
            .as_str()
            .unwrap()
            .starts_with(&format!("{gone}: dropped")),
        "{}",
        report["excluded"]
    );
    let survivor = if gone == "member-0" { 1 } else { 0 };
    assert!(run.members_ok[survivor], "{}", run.members_err[survivor]);
}

#[test]
fn a_member_killed_mid_turn_costs_exactly_one_replay() {
    check_one_replay("KILL");
}

#[test]
fn a_member_stopped_mid_turn_costs_exactly_one_replay() {
    check_one_replay("STOP");
}

#[test]
fn a_middle_member_stopped_mid_turn_costs_exactly_one_replay_without_its_neighbour() {
    // The member after the silent one loses its link from it too; the head must drop the silent
    // member, not the one behind it.
    check_one_replay_of(
        "head: stage 1 = ",
        "STOP",
        serde_json::json!([[0, 20], [20, 30]]),
    );
}

#[test]
fn a_second_kill_in_the_replay_ends_the_turn_with_one_clear_error() {
    let mut live = Live::start(&smollm2(), &long_turn(), &[None, None]);
    let stage1 = live.wait_for("head: stage 1 = ");
    let stage2 = live.wait_for("head: stage 2 = ");
    live.wait_for("head: a turn of");
    std::thread::sleep(Duration::from_millis(300));
    live.signal(&stage2, "KILL");
    live.wait_for("replaying the turn from the start");
    live.wait_for("head: the ring is connected");
    std::thread::sleep(Duration::from_millis(300));
    let second = live.signal(&stage1, "KILL");
    let run = live.finish();
    assert!(!run.head_ok, "the head must fail: {}", run.head_err);
    let last = run.head_err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: the turn failed again in its replay: member ")
            && last.contains(&second),
        "{}",
        run.head_err
    );
}

fn tiny_turn() -> Vec<&'static str> {
    tiny_turn_of("1,2")
}

/// Four tokens of the tiny GPT-2 from "Hello" on the split `stages`, reported as JSON.
fn tiny_turn_of(stages: &'static str) -> Vec<&'static str> {
    vec![
        "--stages",
        stages,
        "--prompt",
        "Hello",
        "--max-new-tokens",
        "4",
        "--ignore-eos",
        "--format",
        "json",
    ]
}

#[test]
fn a_member_holding_another_models_slice_is_refused_by_fingerprint() {
    let gpt2 = root().join("fixtures/tiny/gpt2");
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("gpt2-other");
    std::fs::create_dir(&other).unwrap();
    for entry in std::fs::read_dir(&gpt2).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), other.join(entry.file_name())).unwrap();
    }
    // Another model: the same shapes, another layer-norm epsilon.
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(other.join("config.json")).unwrap()).unwrap();
    config["layer_norm_epsilon"] = serde_json::json!(1e-3);
    std::fs::write(other.join("config.json"), config.to_string()).unwrap();

    let mut live = Live::start(&gpt2, &tiny_turn(), &[]);
    live.join("member-0", None, &["--model", other.to_str().unwrap()], &[]);
    let run = live.finish();
    let report = run.report();
    assert_eq!(
        report["devices"],
        serde_json::json!(["head"]),
        "{}",
        run.head_err
    );
    assert_eq!(report["plan"], serde_json::json!([[0, 3]]));
    let excluded = report["excluded"][0].as_str().unwrap();
    assert!(
        excluded
            .starts_with("member-0: dropped, refused: it holds another model's slice (fingerprint"),
        "{excluded}"
    );
    assert_eq!(report["verify"]["match"], true);
    // The mutation: the same copy, unchanged, is the same model and is taken.
    std::fs::copy(gpt2.join("config.json"), other.join("config.json")).unwrap();
    let mut live = Live::start(&gpt2, &tiny_turn(), &[]);
    live.join("member-0", None, &["--model", other.to_str().unwrap()], &[]);
    let report = live.finish().report();
    assert_eq!(report["devices"], serde_json::json!(["head", "member-0"]));
    assert_eq!(
        report["bytes_served"]["member-0"],
        Value::Null,
        "read locally, fetched nothing"
    );
}

#[test]
fn a_member_whose_probe_disagrees_is_left_out_visibly() {
    if !test_hooks() {
        return;
    }
    let gpt2 = root().join("fixtures/tiny/gpt2");
    let mut live = Live::start(&gpt2, &tiny_turn(), &[]);
    live.join("member-0", None, &[], &[("DAISY_TEST_CORRUPT_KERNEL", "1")]);
    let line = live.wait_for("member-0: left out");
    assert!(line.contains("probe"), "{line}");
    live.join("member-1", None, &[], &[]);
    let run = live.finish();
    let report = run.report();
    assert_eq!(report["devices"], serde_json::json!(["head", "member-1"]));
    let excluded = report["excluded"][0].as_str().unwrap();
    assert!(
        excluded.starts_with("member-0: left out, its probe"),
        "{excluded}"
    );
    assert_eq!(report["verify"]["match"], true);
}

/// Whether the test hooks are compiled in; under `CI=true` their absence fails the test.
fn test_hooks() -> bool {
    if cfg!(feature = "test-hooks") {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "this test needs `--features node/test-hooks` (cargo xtask ci enables it)"
    );
    eprintln!("skipped: build with --features node/test-hooks to run it");
    false
}

/// `node mirror` serving the tiny GPT-2 as the gated repo `tiny-org/tiny-gpt2`, accepting `tokens`.
#[test]
fn a_members_token_reaches_no_other_process_and_no_frame_the_head_sent() {
    if !test_hooks() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (head_token, token_0, token_1) = (
        "hf_headSecretToken01",
        "hf_memberZeroToken01",
        "hf_memberOneToken001",
    );
    let mut mirror = Procs(Vec::new());
    let url = common::gated_mirror(
        &tmp.path().join("hub"),
        &[head_token, token_0, token_1],
        &mut mirror,
    );
    let sent = tmp.path().join("sent-by-head.bin");
    let sent_str = sent.to_str().unwrap();
    let mut live = Live::start_with(
        Path::new("tiny-org/tiny-gpt2"),
        &tiny_turn_of("1,1,1"),
        &[
            ("HF_ENDPOINT", &url),
            ("HF_TOKEN", head_token),
            ("DAISY_TEST_DUMP_SENT", sent_str),
        ],
        &[],
    );
    live.join(
        "member-0",
        None,
        &[],
        &[("HF_ENDPOINT", &url), ("HF_TOKEN", token_0)],
    );
    live.join(
        "member-1",
        None,
        &[],
        &[("HF_ENDPOINT", &url), ("HF_TOKEN", token_1)],
    );
    let run = live.finish();
    let report = run.report();
    assert_eq!(report["devices"].as_array().unwrap().len(), 3);
    assert_eq!(report["verify"]["match"], true);
    let frames = std::fs::read(&sent).unwrap();
    // The positive control: the frames the head sent are where an assignment names the repo.
    let contains =
        |hay: &[u8], needle: &str| hay.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(
        contains(&frames, "tiny-org/tiny-gpt2"),
        "the dump holds the head's frames"
    );
    for (token, owner) in [(token_0, 0), (token_1, 1)] {
        assert!(
            !contains(&frames, token),
            "a member's token in a frame the head sent"
        );
        assert!(!run.head_out.contains(token) && !run.head_err.contains(token));
        for (i, err) in run.members_err.iter().enumerate() {
            assert!(
                !err.contains(token),
                "member {i} printed member {owner}'s token"
            );
        }
    }
    assert!(
        !contains(&frames, head_token),
        "the head's token in a frame it sent"
    );
    assert!(run.members_err.iter().all(|e| !e.contains(head_token)));
    assert!(!run.head_err.contains(head_token) && !run.head_out.contains(head_token));
}

#[test]
fn verify_says_so_when_the_head_cannot_hold_even_two_layers() {
    let gpt2 = root().join("fixtures/tiny/gpt2");
    let mut args = tiny_turn();
    args.extend(["--memory-limit", "1000"]);
    let report = ring(&gpt2, &args, &[None]).report();
    assert_eq!(report["verify"], Value::Null);
    let why = report["verify_unavailable"].as_str().unwrap();
    assert!(
        why.starts_with(
            "verify: not run, the head cannot hold even the embedding and two layers ("
        ),
        "{why}"
    );
    assert!(why.ends_with("this answer is unverified"), "{why}");
    // The mutation: with room, Verify runs and passes.
    let report = ring(&gpt2, &tiny_turn(), &[None]).report();
    assert_eq!(report["verify"]["match"], true);
    assert_eq!(report["verify_unavailable"], Value::Null);
}

#[test]
fn a_dropped_member_that_joins_again_takes_part_in_the_next_turn() {
    let mut live = Live::start(
        &smollm2(),
        &[
            "--stages",
            "10,10,10",
            "--max-new-tokens",
            "6",
            "--ignore-eos",
            "--format",
            "json",
        ],
        &[None, None],
    );
    live.wait_for("head: the ring is connected");
    live.prompt("The first turn");
    live.wait_for("head: verify");
    // Killed between turns: the next turn finds it gone, drops it and is replayed without it.
    let line = live.seen("head: stage 2 = ");
    let gone = live.signal(&line, "KILL");
    live.prompt("The second turn");
    live.wait_for("replaying the turn from the start");
    live.wait_for("head: verify");
    // It comes back (a new process, the same name) and is in the third turn's ring.
    live.join(&gone, None, &[], &[]);
    live.wait_for(&format!("head: {gone} joined"));
    live.prompt("The third turn");
    live.wait_for("head: verify");
    let run = live.finish();
    assert!(run.head_ok, "{}", run.head_err);
    let reports = run.reports();
    assert_eq!(reports.len(), 3, "{}", run.head_out);
    assert_eq!(reports[0]["devices"].as_array().unwrap().len(), 3);
    assert_eq!(reports[1]["replays"], 1);
    assert_eq!(reports[1]["devices"].as_array().unwrap().len(), 2);
    assert_eq!(reports[2]["replays"], 0);
    assert_eq!(
        reports[2]["plan"],
        serde_json::json!([[0, 10], [10, 20], [20, 30]])
    );
    assert!(
        reports[2]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d == gone.as_str()),
        "{}",
        reports[2]["devices"]
    );
    for r in &reports {
        assert_eq!(r["verify"]["match"], true);
    }
}

#[test]
fn a_second_prompt_waits_for_the_ring_tokenized() {
    let gpt2 = root().join("fixtures/tiny/gpt2");
    let mut live = Live::start(
        &gpt2,
        &[
            "--stages",
            "1,2",
            "--max-new-tokens",
            "200",
            "--ignore-eos",
            "--format",
            "json",
        ],
        &[None],
    );
    live.wait_for("head: the ring is connected");
    live.prompt("The first prompt of the two");
    live.prompt("And the second");
    let first = live.wait_for("is queued");
    let second = live.wait_for("is queued");
    let run = live.finish();
    let reports = run.reports();
    assert_eq!(reports.len(), 2, "{}", run.head_err);
    // The second was tokenized before the first turn ended (it was queued while it ran).
    let queued_at = run.head_err.find(&second).unwrap();
    let first_done = run.head_err.find("head: verify").unwrap();
    assert!(queued_at < first_done, "{}", run.head_err);
    for (r, line) in reports.iter().zip([first, second]) {
        let n = r["prompt_ids"].as_array().unwrap().len();
        assert!(line.contains(&format!("a prompt of {n} tokens")), "{line}");
        assert_eq!(r["verify"]["match"], true);
        assert_eq!(r["ids"].as_array().unwrap().len(), 200);
    }
    assert_ne!(reports[0]["prompt_ids"], reports[1]["prompt_ids"]);
    // The prepared prompt (tokenized while the first turn ran) gives what tokenizing it on arrival
    // does: `node run` of the same split, alone.
    let alone = one_process(
        &gpt2,
        "1,2",
        "And the second",
        &["--max-new-tokens", "200", "--ignore-eos"],
    );
    assert_eq!(reports[1]["prompt_ids"], alone["prompt_ids"]);
    assert_eq!(reports[1]["ids"], alone["ids"]);
    // The mutation: the first prompt's ids are not the second's.
    assert_ne!(reports[0]["ids"], alone["ids"]);
}

#[test]
fn the_conversation_prefix_record_survives_a_restart_and_keeps_chats_apart() {
    let data = tempfile::tempdir().unwrap();
    let gpt2 = root().join("fixtures/tiny/gpt2");
    let env = [("XDG_DATA_HOME", data.path().to_str().unwrap())];
    // Two chats that share their first block (an opening of more than 16 tokens).
    let opening = "System: you are a helpful assistant who answers briefly, politely and in plain \
                   English. User:";
    let a = format!("{opening} what is the capital of France?");
    let b = format!("{opening} name three fruits.");
    // Each turn is a head of its own: every one after the first is a restart.
    let turn = |prompt: &str| -> Value {
        let args = [
            "--stages",
            "1,2",
            "--prompt",
            prompt,
            "--max-new-tokens",
            "4",
            "--format",
            "json",
        ];
        let run = Live::start_with(&gpt2, &args, &env, &[None]).finish();
        assert!(
            run.head_err.contains("conversation prefixes on record in"),
            "{}",
            run.head_err
        );
        run.report()["conversation"].clone()
    };
    let a1 = turn(&a);
    let b1 = turn(&b);
    let a2 = turn(&a);
    assert_eq!(
        (a1["turns"].as_u64(), b1["turns"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(a2["turns"], 2, "the record was read back on restart: {a2}");
    assert_eq!(a1["prefix_sha256"], a2["prefix_sha256"]);
    assert_eq!(a1["block_sha256"], b1["block_sha256"], "one first block");
    assert_ne!(a1["prefix_sha256"], b1["prefix_sha256"]);
    // On disk: one first block, two conversations under it, neither erased.
    let file = data.path().join("daisychain-infer/prefixes.json");
    let record: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let blocks = record["blocks"].as_object().unwrap();
    assert_eq!(blocks.len(), 1, "{record}");
    let chats = blocks.values().next().unwrap().as_array().unwrap();
    let turns: Vec<(String, u64)> = chats
        .iter()
        .map(|c| {
            (
                c["prefix_sha256"].as_str().unwrap().to_string(),
                c["turns"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        turns,
        vec![
            (a1["prefix_sha256"].as_str().unwrap().to_string(), 2),
            (b1["prefix_sha256"].as_str().unwrap().to_string(), 1),
        ]
    );
}

/// The first `join: peak RSS N bytes` a member printed.
fn member_peak_rss(err: &str) -> u64 {
    err.lines()
        .find_map(|l| l.strip_prefix("join: peak RSS "))
        .and_then(|l| l.strip_suffix(" bytes"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS in:\n{err}"))
}

#[test]
fn no_secret_reaches_a_log_at_trace_a_command_line_or_a_file() {
    let token = "hf_lab0nlyT0kenNeverShown";
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().to_str().unwrap();
    let env = [
        ("RUST_LOG", "trace"),
        ("HF_TOKEN", token),
        ("XDG_CACHE_HOME", files),
        ("XDG_DATA_HOME", files),
    ];
    let mut live = Live::start_with(&smollm2(), &long_turn(), &env, &[]);
    for i in 0..2 {
        live.join(&format!("member-{i}"), None, &[], &env);
    }
    live.wait_for("head: a turn of");
    let secret = live.join_url.split('#').nth(1).unwrap().to_string();
    assert!(secret.len() >= 16, "{secret}");
    // Every process while the turn runs: its command line holds neither.
    for child in &live.procs.0 {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline);
        assert!(
            !cmdline.contains(&secret) && !cmdline.contains(token),
            "{cmdline}"
        );
    }
    for child in &mut live.procs.0[1..] {
        let _ = child.kill();
    }
    let run = live.finish();
    for (who, log) in std::iter::once(("the head", &run.head_err))
        .chain(run.members_err.iter().map(|e| ("a member", e)))
    {
        assert!(!log.is_empty(), "{who} said nothing");
        assert!(!log.contains(&secret), "{who} logged the ring secret");
        assert!(!log.contains(token), "{who} logged the token");
    }
    // Nor any file the ring wrote (kept layers, the prefix record).
    let mut seen = 0;
    let mut dirs = vec![dir.path().to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let bytes = std::fs::read(&path).unwrap_or_default();
            seen += 1;
            for needle in [secret.as_bytes(), token.as_bytes()] {
                assert!(
                    !bytes.windows(needle.len()).any(|w| w == needle),
                    "{} holds a secret",
                    path.display()
                );
            }
        }
    }
    assert!(seen > 0, "the ring wrote no file to look in");
}

/// SmolLM2's turn of 12 tokens on the split 2,28 that the restart tests run: the head's arguments,
/// `node run`'s report of the same split, and the bytes of the member's layers 2..30.
fn member_restart_turn(model: &Path) -> (Vec<&'static str>, Value, u64) {
    let prompt = "The capital of France is";
    let generate = ["--max-new-tokens", "12", "--ignore-eos"];
    let mut head_args = vec!["--stages", "2,28", "--prompt", prompt, "--format", "json"];
    head_args.extend(generate);
    let oracle = one_process(model, "2,28", prompt, &generate);
    let own: u64 = common::tensor_bytes(&model.join("model.safetensors"))
        .iter()
        .filter(|(name, _)| common::layer_of(name).is_some_and(|l| (2..30).contains(&l)))
        .map(|(_, b)| b)
        .sum();
    (head_args, oracle, own)
}

#[test]
fn a_restarted_member_maps_its_kept_layers_and_fetches_none_of_them() {
    let model = smollm2();
    let cache = tempfile::tempdir().unwrap();
    let env = [("XDG_CACHE_HOME", cache.path().to_str().unwrap())];
    let (head_args, oracle, own) = member_restart_turn(&model);
    let open = common::open_bytes(&model);
    let turn = |args: &[&str]| {
        let mut live = Live::start(&model, &head_args, &[]);
        live.join("member-0", None, args, &env);
        live.finish()
    };
    // First start: fetched, then kept. A restart: read from the shard, no layer fetched. With
    // `--keep-layers off` (the mutation) the restart fetches them all again.
    for (round, args, said, fetched) in [
        (0, &[][..], "written to", own + open),
        (1, &[][..], "read from", open),
        (2, &["--keep-layers", "off"][..], "", own + open),
    ] {
        let run = turn(args);
        let report = run.report();
        let err = &run.members_err[0];
        assert!(err.contains(said), "round {round}:\n{err}");
        if round == 2 {
            assert!(
                !err.contains("read from") && !err.contains("written to"),
                "round {round}:\n{err}"
            );
        }
        assert_eq!(
            report["bytes_served"]["member-0"].as_u64(),
            Some(fetched),
            "round {round}: {}",
            report["bytes_served"]
        );
        assert_eq!(
            ids_and_hops(&report),
            ids_and_hops(&oracle),
            "round {round}"
        );
        assert_eq!(report["verify"]["match"], true, "round {round}");
    }
}

#[test]
fn a_member_streaming_its_layers_gives_the_same_ids_below_their_size() {
    let model = smollm2();
    let cache = tempfile::tempdir().unwrap();
    let env = [("XDG_CACHE_HOME", cache.path().to_str().unwrap())];
    let prompt = "The capital of France is";
    let generate = ["--max-new-tokens", "16", "--ignore-eos"];
    let mut head_args = vec!["--stages", "2,28", "--prompt", prompt, "--format", "json"];
    head_args.extend(generate);
    let oracle = one_process(&model, "2,28", prompt, &generate);
    let turn = || {
        let mut live = Live::start(&model, &head_args, &[]);
        live.join("member-0", None, &["--max-resident-layers", "2"], &env);
        live.finish()
    };
    // The first run writes the shard; the second (a restart) finds it and reads no layer tensor.
    for (round, how) in ["written now", "the shard was there already"]
        .iter()
        .enumerate()
    {
        let run = turn();
        let report = run.report();
        let err = &run.members_err[0];
        assert!(err.contains(how), "round {round}:\n{err}");
        assert_eq!(
            ids_and_hops(&report),
            ids_and_hops(&oracle),
            "round {round}"
        );
        assert_eq!(report["verify"]["match"], true);
        let shard = std::fs::read_dir(cache.path().join("daisychain-infer/shards"))
            .unwrap()
            .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
            .map(|f| f.unwrap().path())
            .next()
            .expect("the shard in the cache folder");
        let layers = std::fs::metadata(&shard).unwrap().len();
        let peak = member_peak_rss(err);
        assert!(
            peak < layers,
            "round {round}: the member's peak RSS {peak} is not below its layers' {layers} bytes"
        );
        if round == 1 {
            // The mutation: one byte of the shard changed on disk is refused by its hash, and the
            // turn recovers by one replay without the member.
            let mut bytes = std::fs::read(&shard).unwrap();
            let at = bytes.len() / 2;
            bytes[at] ^= 0x10;
            std::fs::write(&shard, bytes).unwrap();
            let run = turn();
            let report = run.report();
            assert_eq!(report["replays"], 1, "{}", run.head_err);
            assert!(
                run.members_err[0].contains("does not match its SHA-256"),
                "{}",
                run.members_err[0]
            );
            assert_eq!(report["ids"], oracle["ids"]);
        }
    }
}

/// Every file under the cache folder's shards, by name.
fn shard_files(cache: &Path) -> Vec<String> {
    let Ok(dirs) = std::fs::read_dir(cache.join("daisychain-infer/shards")) else {
        return Vec::new();
    };
    dirs.flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|f| f.unwrap().file_name().into_string().unwrap())
        .collect()
}

#[test]
fn a_member_killed_mid_download_refetches_and_never_reads_what_it_left() {
    if !test_hooks() {
        return;
    }
    let model = smollm2();
    let cache = tempfile::tempdir().unwrap();
    let env = [("XDG_CACHE_HOME", cache.path().to_str().unwrap())];
    let (head_args, oracle, own) = member_restart_turn(&model);
    // A streaming member writes its shard while its layers arrive: killed (SIGKILL) at half of
    // them, it leaves a part-written temporary file and no shard. The head plans around it.
    let mut live = Live::start(&model, &head_args, &[]);
    let killed = [env[0], ("DAISY_TEST_KILL_AT_FETCHED", "50")];
    live.join("member-0", None, &["--max-resident-layers", "2"], &killed);
    let run = live.finish();
    assert!(!run.members_ok[0], "{}", run.members_err[0]);
    assert!(
        run.members_err[0].contains("killed with"),
        "{}",
        run.members_err[0]
    );
    assert!(
        run.head_err.contains("member-0 is left out"),
        "{}",
        run.head_err
    );
    assert_eq!(run.report()["ids"], oracle["ids"]);
    let left = shard_files(cache.path());
    assert!(
        left.len() == 1 && left[0].ends_with(".tmp"),
        "what the killed member left: {left:?}"
    );
    // Started again: the part is not read as a shard; every layer is fetched again, the shard
    // written whole, and the dead writer's part removed.
    let mut live = Live::start(&model, &head_args, &[]);
    live.join("member-0", None, &["--max-resident-layers", "2"], &env);
    let run = live.finish();
    let report = run.report();
    let err = &run.members_err[0];
    assert!(
        err.contains("written now") && !err.contains("was there already"),
        "{err}"
    );
    assert!(
        report["bytes_served"]["member-0"].as_u64() > Some(own),
        "{}",
        report["bytes_served"]
    );
    assert_eq!(ids_and_hops(&report), ids_and_hops(&oracle));
    assert_eq!(report["verify"]["match"], true);
    let left = shard_files(cache.path());
    assert!(
        left.len() == 1 && left[0].ends_with(".shard"),
        "the cache after the restart: {left:?}"
    );
}

#[test]
fn verify_beyond_the_heads_memory_streams_the_layers_and_catches_a_dropped_one() {
    if !test_hooks() {
        return;
    }
    let model = smollm2();
    let cache = tempfile::tempdir().unwrap();
    let env = [("XDG_CACHE_HOME", cache.path().to_str().unwrap())];
    // Room for the embedding and two layers, not for the whole model.
    let args = |path: &'static str| {
        vec![
            "--stages",
            "10,10,10",
            "--prompt",
            "The capital of France is",
            "--max-new-tokens",
            "8",
            "--ignore-eos",
            "--path",
            path,
            "--memory-limit",
            "60000000",
            "--format",
            "json",
        ]
    };
    for path in ["cached", "full-window"] {
        let run = Live::start_with(&model, &args(path), &env, &[None, None]).finish();
        let report = run.report();
        assert_eq!(
            report["verify"]["match"], true,
            "{path}: {}",
            report["verify"]
        );
        assert!(
            run.head_err
                .contains("verify streams the layers from their shard"),
            "{}",
            run.head_err
        );
        assert_eq!(report["verify_unavailable"], Value::Null);
    }
    // The mutation: a member that silently drops a layer is a mismatch, with where.
    let mut live = Live::start_with(&model, &args("cached"), &env, &[]);
    live.join("member-0", None, &[], &[]);
    live.join("member-1", None, &[], &[("DAISY_TEST_DROP_LAYER", "1")]);
    let run = live.finish();
    let report = last_json(&run.head_out);
    assert_eq!(report["verify"]["match"], false, "{}", report["verify"]);
    assert!(
        report["verify"]["first_difference"]["position"].is_u64()
            || report["verify"]["hop_difference"].is_u64(),
        "{}",
        report["verify"]
    );
    assert!(run.head_err.contains("verify failed"), "{}", run.head_err);
}

/// A turn `report` that replayed `replays` times and still matched Verify and the ids of
/// `oracle` (`node run` of the same split); `what` names the case in a failure.
fn replayed_to_the_oracle(report: &Value, replays: u64, oracle: &Value, what: &str) {
    assert_eq!(report["replays"], replays, "{what}");
    assert_eq!(report["verify"]["match"], true, "{what}");
    assert_eq!(report["ids"], oracle["ids"], "{what}");
}

#[test]
fn a_member_sending_a_bad_activation_is_refused_by_name_and_the_turn_replays() {
    if !test_hooks() {
        return;
    }
    let gpt2 = root().join("fixtures/tiny/gpt2");
    // Five tokens: the third activation, the bad one, is a decode lap's.
    let mut args = tiny_turn();
    args[5] = "5";
    let oracle = one_process(
        &gpt2,
        "1,2",
        "Hello",
        &["--max-new-tokens", "5", "--ignore-eos"],
    );
    for (kind, named) in [
        ("hash", "activation integrity hash"),
        ("replay", "the head expected"),
        ("stage", "is addressed to"),
        ("garbage", "the head refused its activation"),
        ("unfinished", "on a message it began and never finished"),
    ] {
        let mut live = Live::start(&gpt2, &args, &[]);
        live.join("member-0", None, &[], &[("DAISY_TEST_BAD_FRAME", kind)]);
        let run = live.finish();
        let report = run.report();
        let refused = run.refusal();
        assert!(
            refused.contains("member-0") && refused.contains(named),
            "{kind}: {refused}"
        );
        replayed_to_the_oracle(&report, 1, &oracle, kind);
    }
}

#[test]
fn a_member_replaying_an_earlier_turns_activation_is_refused_by_name() {
    if !test_hooks() {
        return;
    }
    let gpt2 = root().join("fixtures/tiny/gpt2");
    let mut live = Live::start(
        &gpt2,
        &[
            "--stages",
            "1,2",
            "--max-new-tokens",
            "5",
            "--ignore-eos",
            "--format",
            "json",
        ],
        &[],
    );
    // Its third activation of the second turn is its first of the first turn again.
    live.join("member-0", None, &[], &[("DAISY_TEST_BAD_FRAME", "turn")]);
    live.wait_for("head: the ring is connected");
    live.prompt("Hello");
    live.prompt("Once upon a time");
    let run = live.finish();
    let reports = run.reports();
    assert_eq!(reports.len(), 2, "{}", run.head_err);
    let refused = run.refusal();
    assert!(
        refused.contains("member-0")
            && refused.contains("lap 0 of turn 1 is no lap in flight")
            && refused.contains("replayed"),
        "{refused}"
    );
    let extra = ["--max-new-tokens", "5", "--ignore-eos"];
    for (report, (prompt, replays)) in reports.iter().zip([("Hello", 0), ("Once upon a time", 1)]) {
        let oracle = one_process(&gpt2, "1,2", prompt, &extra);
        replayed_to_the_oracle(report, replays, &oracle, prompt);
    }
}

#[test]
fn a_replayed_activation_is_refused_by_the_member_it_reaches() {
    if !test_hooks() {
        return;
    }
    let gpt2 = root().join("fixtures/tiny/gpt2");
    let mut args = tiny_turn_of("1,1,1");
    args[5] = "5";
    let mut live = Live::start(&gpt2, &args, &[]);
    // Each member would send its second activation again in place of its third: stage 1's
    // reaches stage 2 before stage 2 sends a third (the plan picks which member is which).
    for name in ["member-0", "member-1"] {
        live.join(name, None, &[], &[("DAISY_TEST_BAD_FRAME", "replay")]);
    }
    let run = live.finish();
    let report = run.report();
    let second = run
        .head_err
        .lines()
        .find_map(|l| l.strip_prefix("head: stage 2 = "))
        .and_then(|l| l.split(' ').next())
        .unwrap_or_else(|| panic!("no stage 2 in\n{}", run.head_err));
    let refused = run.refusal();
    assert!(
        refused.starts_with(&format!("head: {second} failed mid-turn"))
            && refused.contains("stage 2 refused lap 1 of turn 1: it ran lap 1 of turn 1 already"),
        "{refused}"
    );
    let oracle = one_process(
        &gpt2,
        "1,1,1",
        "Hello",
        &["--max-new-tokens", "5", "--ignore-eos"],
    );
    replayed_to_the_oracle(&report, 1, &oracle, "a replay");
}

/// A turn of SmolLM2 over three hosts of a [`Lab`] — the head on host 0 (10.77.0.1), a member on
/// each of hosts 1 and 2, each member reading its layers from its own copy — with `during` run
/// once the turn has begun.
fn turn_in_lab(tag: &str, faults: Faults, during: impl FnOnce(&Live, &Lab)) -> (RingRun, Lab) {
    let lab = Lab::new(tag, 3, faults);
    let model = smollm2();
    let mut args = long_turn();
    args[5] = "64";
    let mut live = Live::start_in(&model, &args, &lab);
    for i in 0..2 {
        live.join(
            &format!("member-{i}"),
            None,
            &["--model", model.to_str().unwrap()],
            &[],
        );
    }
    let begun = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        live.wait_for("head: a turn of");
    }));
    if let Err(e) = begun {
        // What the members said is the story when the ring never formed.
        for c in &mut live.procs.0 {
            let _ = c.kill();
        }
        let said: Vec<String> = live
            .members_err
            .drain(..)
            .map(|h| h.join().unwrap())
            .collect();
        eprintln!("members:\n{}", said.join("\n---\n"));
        std::panic::resume_unwind(e);
    }
    during(&live, &lab);
    (live.finish(), lab)
}

/// The same ids as Verify, and as the same split in one process.
fn equals_verify_and_the_oracle(run: &RingRun) -> Value {
    let report = run.report();
    assert_eq!(report["verify"]["match"], true, "{}", report["verify"]);
    let mut args = long_turn();
    args[5] = "64";
    let oracle = one_process(&smollm2(), "10,10,10", "Once upon a time", &args[4..7]);
    assert_eq!(report["ids"], oracle["ids"]);
    report
}

#[test]
fn links_of_50_ms_each_way_give_the_ids_of_verify() {
    let delay = Duration::from_millis(50);
    let faults = Faults {
        delay,
        ..Faults::default()
    };
    let (run, lab) = turn_in_lab("delay", faults, |_, _| {});
    let report = equals_verify_and_the_oracle(&run);
    assert_eq!(report["replays"], 0, "{}", run.head_err);
    // The mutation check of the lab itself: a decode lap crosses three links, so it cannot be
    // shorter than three delays.
    let median = report["decode_lap_ms"]["p50_ms"]
        .as_f64()
        .expect("decode_lap_ms");
    assert!(
        median >= 150.0,
        "a lap of {median} ms over three 50 ms links"
    );
    // The report's split of a lap puts those delays on the wire, not in any stage's step.
    let split = &report["lap_split"];
    let wire = split["wire_p50_ms"]
        .as_f64()
        .expect("lap_split.wire_p50_ms");
    assert!(wire >= 150.0, "{split}");
    let steps = split["compute_p50_ms"].as_array().expect("compute_p50_ms");
    assert_eq!(steps.len(), 3, "{split}");
    for ms in steps {
        let ms = ms.as_f64().expect("every stage reported its steps");
        assert!(ms > 0.0 && ms < 50.0, "{split}");
    }
    assert!(lab.counts().0 > 0);
}

#[test]
fn links_losing_2_percent_of_packets_give_the_ids_of_verify() {
    let faults = Faults {
        loss: 0.02,
        delay: Duration::from_millis(5),
        ..Faults::default()
    };
    let (run, lab) = turn_in_lab("loss", faults, |_, _| {});
    let report = equals_verify_and_the_oracle(&run);
    assert_eq!(report["replays"], 0, "{}", run.head_err);
    let (carried, dropped) = lab.counts();
    assert!(
        dropped > 0 && (dropped as f64) < 0.05 * (carried + dropped) as f64,
        "carried {carried}, dropped {dropped}"
    );
}

#[test]
fn a_link_cut_for_10_s_mid_turn_costs_one_replay() {
    let (run, lab) = turn_in_lab("cut", Faults::default(), |_, lab| {
        // Mid-turn by the turn's own progress, not by a clock (a fixed 300 ms outlasted the whole
        // 64-token turn on a fast machine): once the lab has carried 40 more packets, some ten
        // laps in.
        let begun = lab.counts().0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while lab.counts().0 < begun + 40 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        lab.set(|f| f.cut = Some((2, Instant::now() + Duration::from_secs(10))));
    });
    let report = equals_verify_and_the_oracle(&run);
    assert_eq!(report["replays"], 1, "{}", run.head_err);
    assert!(lab.counts().1 > 0, "the cut dropped nothing");
    assert_eq!(report["devices"].as_array().unwrap().len(), 2);
}
