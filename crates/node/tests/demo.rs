//! `node demo` stops every process it started however it ends: also when a signal ends the demo
//! alone, before it can stop them itself. And what its three processes print reaches the user as
//! whole lines, in the order they were written.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The processes whose parent is `pid`, from `/proc`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc") {
        let Ok(entry) = entry else { continue };
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid …": the command name may hold spaces; it ends at the last ')'.
        let after = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
        let ppid = after
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// Whether `pid` still runs (a zombie, waiting to be reaped, does not).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let after = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
            after.split_whitespace().next() != Some("Z")
        }
        Err(_) => false,
    }
}

/// The demo and the processes found under it, killed when the test ends, whichever way it ends.
struct Started {
    demo: Child,
    ring: Vec<u32>,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.demo.kill();
        let _ = self.demo.wait();
        for &pid in &self.ring {
            if running(pid)
                && let Ok(pid) = libc::pid_t::try_from(pid)
            {
                // SAFETY: a process this test's demo started, still running.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_signal_to_the_demo_alone_stops_its_ring() {
    let model = root().join("target/fixtures/SmolLM2-135M-Instruct");
    let demo = Command::new(env!("CARGO_BIN_EXE_node"))
        .args(["demo", "--model", &model.to_string_lossy()])
        .args(["--stages", "10,10,10", "--prompt", "Once upon a time"])
        .args(["--max-new-tokens", "4000", "--ignore-eos", "--no-verify"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("node demo starts");
    let mut started = Started {
        demo,
        ring: Vec::new(),
    };
    // The first bytes of the answer: the head and both members are up and the turn runs.
    let mut stdout = started.demo.stdout.take().expect("piped");
    let mut first = [0u8; 16];
    let read = stdout.read(&mut first).expect("the demo's output");
    assert!(read > 0, "the demo ended before answering");
    started.ring = children_of(started.demo.id());
    let ring = started.ring.clone();
    assert_eq!(ring.len(), 3, "the demo's processes: {ring:?}");
    // SIGTERM to the demo's pid only (a terminal's Ctrl-C would reach its whole process group).
    let demo_pid = libc::pid_t::try_from(started.demo.id()).expect("a pid");
    // SAFETY: `kill` on our own child, which has not been reaped.
    assert_eq!(unsafe { libc::kill(demo_pid, libc::SIGTERM) }, 0);
    let status = started.demo.wait().expect("the demo ends");
    assert!(!status.success(), "the demo ended by itself: {status}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left = ring.clone();
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left.retain(|&pid| running(pid));
    }
    // Whatever is left is killed as `started` drops.
    assert!(
        left.is_empty(),
        "still running 10 s after the demo was ended: {left:?} of {ring:?}"
    );
}

/// The demo's answer and logs in one file, as a terminal shows them: each log line whole, at the
/// start of its own line (a member's line never inside one of the head's), and the head's summary
/// after the answer's closing newline rather than glued to the answer's last word. (What goes wrong
/// without it is a race between the processes' writes, so two runs; `cmd::demo`'s unit test holds
/// the order itself.)
#[test]
fn the_demo_passes_on_whole_lines_in_the_order_they_were_written() {
    for run in 0..2 {
        let shown = demo_as_a_terminal_shows_it();
        for line in shown.lines() {
            for tag in ["head: ", "[stage-1] ", "[stage-2] ", "demo: "] {
                if let Some(at) = line.find(tag) {
                    assert_eq!(
                        at, 0,
                        "run {run}: a log line glued to other output: {line:?}\n{shown}"
                    );
                }
            }
        }
        // The demo starts a member once the one before it is in: `stage-i` holds stage i.
        for i in 1..=2 {
            let plan = format!("head: stage {i} = stage-{i} holds layers ");
            assert!(shown.contains(&plan), "run {run}: no `{plan}` in\n{shown}");
        }
        let lines: Vec<&str> = shown.lines().collect();
        let turn = lines
            .iter()
            .position(|l| l.starts_with("head: a turn of "))
            .unwrap_or_else(|| panic!("run {run}: no turn in\n{shown}"));
        let summary = lines
            .iter()
            .position(|l| l.starts_with("head: 24 tokens, prefill "))
            .unwrap_or_else(|| panic!("run {run}: no whole summary of 24 tokens in\n{shown}"));
        let answer = lines[turn + 1..summary].concat();
        assert!(
            answer.trim().len() > 10,
            "run {run}: the answer is not between the turn's line and its summary:\n{shown}"
        );
        // Outside the answer every line says whose it is, the engine's notes too (a shard read,
        // the backend chosen): the head's and the demo's by their names, a member's by its stage
        // and then its command's.
        for line in lines[..=turn].iter().chain(&lines[summary..]) {
            let own = ["head: ", "demo: "].iter().any(|t| line.starts_with(t))
                || ["[stage-1] join: ", "[stage-2] join: "]
                    .iter()
                    .any(|t| line.starts_with(t));
            assert!(
                own,
                "run {run}: a line that does not say whose it is: {line:?}\n{shown}"
            );
        }
    }
}

/// The demo's memory line gives each process's own peak, the one it reported as it exited — not
/// the system's figure for the reaped child, which also holds the peak of any process that child
/// ran: with `--backend auto` each node asks a child `node adapters`, which loads the software
/// Vulkan driver where there is one (about 70 MB, above a member's own peak).
#[test]
fn the_demos_memory_line_gives_each_process_its_own_peak() {
    let shown = demo_as_a_terminal_shows_it();
    let reported = |prefix: &str| -> f64 {
        let bytes: u64 = shown
            .lines()
            .find_map(|l| l.strip_prefix(prefix)?.strip_suffix(" bytes"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no `{prefix}N bytes` in\n{shown}"));
        bytes as f64 / 1e6
    };
    let line = shown
        .lines()
        .find_map(|l| l.strip_prefix("demo: peak RSS "))
        .unwrap_or_else(|| panic!("no memory line in\n{shown}"));
    let each = line.split(';').next().unwrap_or_default();
    let shown_mb: Vec<(&str, f64)> = each
        .split(", ")
        .map(|p| {
            let mut w = p.split(' ');
            let name = w.next().unwrap_or_default();
            let mb = w.next().and_then(|v| v.parse().ok());
            (name, mb.unwrap_or_else(|| panic!("`{p}` in {line}")))
        })
        .collect();
    let names: Vec<&str> = shown_mb.iter().map(|p| p.0).collect();
    assert_eq!(names, ["head", "stage-1", "stage-2"], "{line}");
    for (name, mb) in shown_mb {
        let own = match name {
            "head" => reported("head: peak RSS "),
            stage => reported(&format!("[{stage}] join: peak RSS ")),
        };
        assert!(
            (mb - own).abs() < 0.051,
            "{name}: the demo says {mb} MB, the process itself {own:.1} MB\n{shown}"
        );
    }
}

/// `node demo`'s stdout and stderr, written to one open file as to a terminal.
fn demo_as_a_terminal_shows_it() -> String {
    let model = root().join("target/fixtures/SmolLM2-135M-Instruct");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("terminal.txt");
    let out = std::fs::File::create(&path).expect("the output file");
    // One open file for both, as a terminal is: every write lands after the one before it.
    let err = out.try_clone().expect("the same file again");
    let status = Command::new(env!("CARGO_BIN_EXE_node"))
        .args(["demo", "--model", &model.to_string_lossy()])
        .args([
            "--stages",
            "10,10,10",
            "--prompt",
            "The three primary colors are",
        ])
        .args(["--max-new-tokens", "24", "--ignore-eos", "--no-verify"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .expect("node demo runs");
    let shown = std::fs::read_to_string(&path).expect("the demo's output");
    assert!(status.success(), "the demo failed: {status}\n{shown}");
    shown
}
