//! `node demo` stops every process it started however it ends: also when a signal ends the demo
//! alone, before it can stop them itself.

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
