//! `node demo` stops every process it started however it ends: also when a signal ends the demo
//! alone, before it can stop them itself.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
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

#[cfg(target_os = "linux")]
#[test]
fn a_signal_to_the_demo_alone_stops_its_ring() {
    let model = root().join("target/fixtures/SmolLM2-135M-Instruct");
    let mut demo = Command::new(env!("CARGO_BIN_EXE_node"))
        .args(["demo", "--model", &model.to_string_lossy()])
        .args(["--stages", "10,10,10", "--prompt", "Once upon a time"])
        .args(["--max-new-tokens", "4000", "--ignore-eos", "--no-verify"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("node demo starts");
    // The first bytes of the answer: the head and both members are up and the turn runs.
    let mut stdout = demo.stdout.take().expect("piped");
    let mut first = [0u8; 16];
    let read = stdout.read(&mut first).expect("the demo's output");
    assert!(read > 0, "the demo ended before answering");
    let ring = children_of(demo.id());
    assert_eq!(ring.len(), 3, "the demo's processes: {ring:?}");
    // SIGTERM to the demo's pid only (a terminal's Ctrl-C would reach its whole process group).
    let demo_pid = libc::pid_t::try_from(demo.id()).expect("a pid");
    // SAFETY: `kill` on our own child, which has not been reaped.
    assert_eq!(unsafe { libc::kill(demo_pid, libc::SIGTERM) }, 0);
    let status = demo.wait().expect("the demo ends");
    assert!(!status.success(), "the demo ended by itself: {status}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left: Vec<u32> = ring.clone();
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left.retain(|&pid| running(pid));
    }
    for &pid in &left {
        // Not to outlive the test whatever it finds.
        let pid = libc::pid_t::try_from(pid).expect("a pid");
        // SAFETY: a process this test's demo started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert!(
        left.is_empty(),
        "still running 10 s after the demo was ended: {left:?} of {ring:?}"
    );
}
