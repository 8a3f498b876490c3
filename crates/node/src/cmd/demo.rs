//! `node demo`: the ring on one machine, as separate processes. It starts `node head` and one
//! `node join` per further stage on loopback, hands each member the join URL on its stdin (never on
//! a command line), runs the prompt with Verify, and stops every process it started — also when it
//! fails or is interrupted.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::options::{ComputeArgs, FormatArgs, GenerateArgs};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A local model folder in Hugging Face layout, or a repo id fetched from `$HF_ENDPOINT`.
    #[arg(long)]
    model: String,
    /// Layer count of each stage, head first (default: the layers split over 3 processes).
    #[arg(long, value_delimiter = ',')]
    stages: Option<Vec<usize>>,
    /// The prompt.
    #[arg(long, default_value = "The three primary colors are")]
    prompt: String,
    /// Prefill chunks around the ring at once (1: one at a time).
    #[arg(long, default_value_t = 2)]
    in_flight: usize,
    /// Skip Verify (the head's re-run of the turn with every layer).
    #[arg(long)]
    no_verify: bool,
    #[command(flatten)]
    generate: GenerateArgs,
    #[command(flatten)]
    compute: ComputeArgs,
    #[command(flatten)]
    format: FormatArgs,
}

/// Children killed when dropped, so none outlives the demo.
/// The ring's processes, each until it has been reaped.
struct Children(Vec<(String, Option<Child>)>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in self.0.iter_mut().filter_map(|(_, c)| c.as_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How one process of the ring ended: its exit status (none if it had to be killed) and its peak
/// resident memory, where the system reports it.
struct Ended {
    name: String,
    status: Option<std::process::ExitStatus>,
    peak_rss: Option<u64>,
}

impl Children {
    /// Wait up to `within` for every child to exit by itself; the rest are killed on drop.
    fn wait_all(&mut self, within: Duration) -> Vec<Ended> {
        let deadline = Instant::now() + within;
        let mut out = Vec::new();
        for (name, slot) in &mut self.0 {
            let Some(child) = slot.as_mut() else {
                continue;
            };
            let (status, peak_rss) = loop {
                match reap(child) {
                    Ok(Some(ended)) => {
                        // Reaped: nothing may signal or wait for its pid any more.
                        *slot = None;
                        break ended;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => break (None, None),
                }
            };
            out.push(Ended {
                name: name.clone(),
                status,
                peak_rss,
            });
        }
        out
    }
}

/// The child's exit status and peak RSS once it has exited (`wait4`, which reports its resource
/// use); `None` while it runs.
#[cfg(target_os = "linux")]
#[allow(clippy::type_complexity)]
fn reap(
    child: &mut Child,
) -> std::io::Result<Option<(Option<std::process::ExitStatus>, Option<u64>)>> {
    use std::os::unix::process::ExitStatusExt;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not yet reaped (std reaps only in `wait`/`try_wait`, never called
    // on it; once this reaps it, the caller drops the handle); the pointers are to live locals.
    let got = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
    match got {
        0 => Ok(None),
        p if p == pid => {
            let exit = std::process::ExitStatus::from_raw(status);
            // Linux reports ru_maxrss in KiB.
            let peak = u64::try_from(usage.ru_maxrss).ok().map(|kb| kb * 1024);
            Ok(Some((Some(exit), peak)))
        }
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(not(target_os = "linux"))]
#[allow(clippy::type_complexity)]
fn reap(
    child: &mut Child,
) -> std::io::Result<Option<(Option<std::process::ExitStatus>, Option<u64>)>> {
    Ok(child.try_wait()?.map(|s| (Some(s), None)))
}

/// A child that gets SIGTERM when the demo dies, however it dies: `Children` stops the ring when
/// the demo ends or fails, but a signal sent to the demo alone (not to its process group, as a
/// terminal's Ctrl-C is) would end it before that, and leave the ring running.
#[cfg(target_os = "linux")]
fn with_the_demo(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    let demo = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    // SAFETY: between fork and exec the closure only calls `prctl` and `getppid` and builds an
    // `io::Error` from an errno, none of which allocates or takes a lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The demo may have died before the request took: then no signal would come.
            if libc::getppid() != demo {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        })
    }
}

#[cfg(not(target_os = "linux"))]
fn with_the_demo(cmd: &mut Command) -> &mut Command {
    cmd
}

/// Even split of `n` layers over `k` stages, the remainder to the last ones.
fn even_split(n: usize, k: usize) -> Vec<usize> {
    (0..k)
        .map(|i| n / k + usize::from(i >= k - n % k))
        .collect()
}

pub(crate) fn run(args: Args) -> Result<()> {
    let exe = std::env::current_exe().context("finding this node binary")?;
    let n_layers = super::checkpoint(&args.model)?.config().num_layers;
    let stages = args
        .stages
        .clone()
        .unwrap_or_else(|| even_split(n_layers, 3.min(n_layers + 1)));
    if stages.len() < 2 {
        bail!("--stages {stages:?}: the demo needs the head and at least one member");
    }
    let counts = stages
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut head_args: Vec<String> = vec![
        "head".into(),
        "--model".into(),
        args.model.clone(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--stages".into(),
        counts.clone(),
        "--prompt".into(),
        args.prompt.clone(),
        "--format".into(),
        if args.format.json() { "json" } else { "text" }.into(),
        "--in-flight".into(),
        args.in_flight.to_string(),
    ];
    if args.no_verify {
        head_args.push("--no-verify".into());
    }
    head_args.extend(args.generate.to_args());
    head_args.extend(args.compute.to_args());
    eprintln!(
        "demo: a ring of {} processes on loopback, stages {counts}",
        stages.len()
    );
    let mut children = Children(Vec::new());
    let head = with_the_demo(&mut Command::new(&exe))
        .args(&head_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting the head")?;
    children.0.push(("head".into(), Some(head)));
    let stdout: ChildStdout = children.0[0]
        .1
        .as_mut()
        .and_then(|c| c.stdout.take())
        .expect("piped");
    let mut head_out = BufReader::new(stdout);
    let mut first = String::new();
    head_out
        .read_line(&mut first)
        .context("reading the head's join URL")?;
    let Some(url) = first.trim().strip_prefix("join: ") else {
        let status = children.wait_all(Duration::from_secs(5));
        bail!(
            "the head stopped before printing its join URL ({})",
            status
                .first()
                .and_then(|e| e.status)
                .map_or("still running".to_string(), |s| s.to_string())
        );
    };
    let url = url.to_string();
    for i in 1..stages.len() {
        let name = format!("stage-{i}");
        let mut member = with_the_demo(&mut Command::new(&exe))
            .args(["join", "--name", &name])
            .args(args.compute.backend_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting member {name}"))?;
        // The join URL carries the secret: it goes on stdin, never on a command line.
        let mut stdin = member.stdin.take().expect("piped");
        writeln!(stdin, "{url}").context("handing the join URL to a member")?;
        drop(stdin);
        let stderr = member.stderr.take().expect("piped");
        let prefix = name.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[{prefix}] {line}");
            }
        });
        children.0.push((name, Some(member)));
    }
    // The answer streams token by token: pass on whatever the head wrote, as it comes.
    let mut out = std::io::stdout().lock();
    let mut buf = [0u8; 4096];
    loop {
        let n = head_out.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        out.flush()?;
    }
    drop(out);
    let ended = children.wait_all(Duration::from_secs(10));
    let mut failed = Vec::new();
    for e in &ended {
        match e.status {
            Some(s) if s.success() => {}
            Some(s) => failed.push(format!("{} exited with {s}", e.name)),
            None => failed.push(format!(
                "{} did not stop within 10 s and was killed",
                e.name
            )),
        }
    }
    if !failed.is_empty() {
        bail!("the demo's ring failed: {}", failed.join("; "));
    }
    let peaks: Option<Vec<u64>> = ended.iter().map(|e| e.peak_rss).collect();
    if let Some(peaks) = peaks {
        let each: Vec<String> = ended
            .iter()
            .zip(&peaks)
            .map(|(e, p)| format!("{} {:.1} MB", e.name, *p as f64 / 1e6))
            .collect();
        eprintln!(
            "demo: peak RSS {}; the ring {:.1} MB ({} bytes)",
            each.join(", "),
            peaks.iter().sum::<u64>() as f64 / 1e6,
            peaks.iter().sum::<u64>()
        );
    }
    eprintln!("demo: every process of the ring has stopped");
    Ok(())
}
