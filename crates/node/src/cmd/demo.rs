//! `node demo`: the ring on one machine, as separate processes. It starts `node head` and one
//! `node join` per further stage on loopback, hands each member the join URL on its stdin (never on
//! a command line), runs the prompt with Verify, and stops every process it started — also when it
//! fails or is interrupted.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
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

/// How long the demo waits for the head to admit a member before it starts the next anyway.
const ADMISSION_WAIT: Duration = Duration::from_secs(60);

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
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the head")?;
    children.0.push(("head".into(), Some(head)));
    let head = children.0[0].1.as_mut().expect("just started");
    let (stdout, stderr) = (head.stdout.take(), head.stderr.take());
    let mut head_out = HeadOutput::new(
        stdout.expect("piped"),
        stderr.expect("piped"),
        Box::new(std::io::stdout()),
        Box::new(std::io::stderr()),
    )?;
    let first = head_out
        .first_line()
        .context("reading the head's join URL")?
        .unwrap_or_default();
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
    // Each member's log, passed on line by line; each thread returns the peak its member reported.
    let mut relays = Vec::new();
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
        relays.push((
            name.clone(),
            std::thread::spawn(move || {
                let mut peak = None;
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    peak = crate::memory::reported_peak("join", &line).or(peak);
                    eprintln!("[{prefix}] {line}");
                }
                peak
            }),
        ));
        children.0.push((name.clone(), Some(member)));
        let member = children
            .0
            .last_mut()
            .and_then(|c| c.1.as_mut())
            .expect("pushed");
        // The head gives stages in the order it admits members: the next starts once this one is
        // in, so that `stage-i` holds stage i.
        let admitted =
            head_out.until_logged(&super::head::joined(&name), ADMISSION_WAIT, &mut || {
                !matches!(member.try_wait(), Ok(None))
            })?;
        if !admitted && let Ok(Some(status)) = member.try_wait() {
            bail!("{name} stopped before the head admitted it ({status})");
        }
    }
    // The answer streams token by token: pass on whatever the head writes, as it comes.
    head_out.pass_on()?;
    let ended = children.wait_all(Duration::from_secs(10));
    // A member's log ends when it exits: its last lines (its peak) are passed on before the
    // demo's own. A relay still open after a while (a pipe some other process holds) is left.
    let deadline = Instant::now() + Duration::from_secs(2);
    while relays.iter().any(|r| !r.1.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut reported: HashMap<String, u64> = relays
        .into_iter()
        .filter(|r| r.1.is_finished())
        .filter_map(|(name, r)| Some((name, r.join().ok()??)))
        .collect();
    if let Some(peak) = head_out.peak {
        reported.insert("head".into(), peak);
    }
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
    // Each process's own peak as it reported it; where it did not (it was killed), the system's,
    // which also covers what that process ran (see `memory::print_peak`).
    let peaks: Option<Vec<(u64, bool)>> = ended
        .iter()
        .map(|e| match reported.get(&e.name) {
            Some(&own) => Some((own, true)),
            None => e.peak_rss.map(|p| (p, false)),
        })
        .collect();
    if let Some(peaks) = peaks {
        let each: Vec<String> = ended
            .iter()
            .zip(&peaks)
            .map(|(e, (p, own))| {
                let with = if *own { "" } else { " (with what it ran)" };
                format!("{} {:.1} MB{with}", e.name, *p as f64 / 1e6)
            })
            .collect();
        let peaks: Vec<u64> = peaks.iter().map(|p| p.0).collect();
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

/// The head's answer (its stdout) and its log (its stderr), passed on as the head wrote them, as
/// far as two pipes tell. The log goes out a whole line at a time, so that no member's line lands
/// inside one of the head's. Whatever stdout held when a log line was read was written before it or
/// about when it was; which, the pipes do not say, so the text goes first when it ends a line (the
/// answer's closing newline, then the head's summary) and after the log otherwise (the head's "a
/// turn of" line, then the answer's first words). Both pipes are read without blocking, so neither
/// stalls behind the other, and the head never waits on a full pipe.
struct HeadOutput {
    out: ChildStdout,
    err: ChildStderr,
    /// Where the answer and the log go (this process's stdout and stderr).
    answer: Box<dyn Write>,
    report: Box<dyn Write>,
    out_open: bool,
    err_open: bool,
    /// Stdout not passed on: everything until the join URL's line has been read.
    held: Vec<u8>,
    /// That line, until [`HeadOutput::first_line`] takes it.
    first: Option<String>,
    passing: bool,
    /// The head's log as read, up to its last whole line printed.
    log: Vec<u8>,
    /// The peak resident memory the head reported in its log as it exited.
    peak: Option<u64>,
    /// Log lines passed on since [`HeadOutput::until_logged`] last looked.
    seen: Vec<String>,
}

impl HeadOutput {
    fn new(
        out: ChildStdout,
        err: ChildStderr,
        answer: Box<dyn Write>,
        report: Box<dyn Write>,
    ) -> Result<Self> {
        for fd in [out.as_raw_fd(), err.as_raw_fd()] {
            set_nonblocking(fd).context("reading the head's output without blocking")?;
        }
        Ok(Self {
            out,
            err,
            answer,
            report,
            out_open: true,
            err_open: true,
            held: Vec::new(),
            first: None,
            passing: false,
            log: Vec::new(),
            peak: None,
            seen: Vec::new(),
        })
    }

    /// The head's first line on stdout (its join URL; its log is passed on meanwhile), or `None`
    /// when its stdout ends before one — after the rest of its log (why it stopped). What follows
    /// that line is the answer, passed on from now.
    fn first_line(&mut self) -> Result<Option<String>> {
        loop {
            if let Some(line) = self.first.take() {
                return Ok(Some(line));
            }
            if !self.out_open {
                self.pass_on()?;
                return Ok(None);
            }
            self.pump(None)?;
        }
    }

    /// Pass on both until the head closes them (it exits).
    fn pass_on(&mut self) -> Result<()> {
        while self.out_open || self.err_open {
            self.pump(None)?;
            // Nobody waits for a line any more.
            self.seen.clear();
        }
        Ok(())
    }

    /// Pass on both until the head has logged a line that starts with `start`, its log has ended,
    /// `within` has passed, or `gone` says there is nothing to wait for (looked at every 100 ms);
    /// whether it logged it.
    fn until_logged(
        &mut self,
        start: &str,
        within: Duration,
        gone: &mut dyn FnMut() -> bool,
    ) -> Result<bool> {
        let deadline = Instant::now() + within;
        loop {
            if std::mem::take(&mut self.seen)
                .iter()
                .any(|l| l.starts_with(start))
            {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if !self.err_open || left.is_zero() || gone() {
                return Ok(false);
            }
            self.pump(Some(left.min(Duration::from_millis(100))))?;
        }
    }

    /// Wait until either pipe has something (or ends, or `wait` has passed), then read the log,
    /// then stdout, and pass on what came in the order the type describes.
    fn pump(&mut self, wait: Option<Duration>) -> Result<()> {
        let mut fds: Vec<libc::pollfd> = [
            (self.out_open, self.out.as_raw_fd()),
            (self.err_open, self.err.as_raw_fd()),
        ]
        .into_iter()
        .filter(|(open, _)| *open)
        .map(|(_, fd)| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
        let n = libc::nfds_t::try_from(fds.len()).expect("two at most");
        let timeout = wait.map_or(-1, |w| {
            libc::c_int::try_from(w.as_millis().max(1)).unwrap_or(libc::c_int::MAX)
        });
        // SAFETY: `fds` holds `n` initialized pollfds and lives across the call.
        if unsafe { libc::poll(fds.as_mut_ptr(), n, timeout) } < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(e).context("waiting for the head's output");
        }
        if self.err_open {
            let log = &mut self.log;
            self.err_open = drain(&mut self.err, &mut |b| log.extend_from_slice(b))
                .context("reading the head's log")?;
        }
        let mut text = Vec::new();
        if self.out_open {
            self.out_open = drain(&mut self.out, &mut |b| text.extend_from_slice(b))
                .context("reading the head's answer")?;
        }
        if !self.passing {
            // Until its first line (the join URL) the head's stdout is the demo's; after it, the
            // answer.
            self.held.append(&mut text);
            if let Some(end) = self.held.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.held.drain(..=end).collect();
                self.first = Some(String::from_utf8_lossy(&line).into_owned());
                self.passing = true;
                text = std::mem::take(&mut self.held);
            }
        }
        let whole = if self.err_open {
            self.log
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |end| end + 1)
        } else {
            // The log has ended: its last line goes out without its newline too.
            self.log.len()
        };
        let text_first = text.last() == Some(&b'\n');
        if text_first {
            write_out(&mut self.answer, &text).context("passing on the head's answer")?;
        }
        for line in self.log[..whole].split_inclusive(|&b| b == b'\n') {
            // One write a line: stderr's lock keeps a member's line (`eprintln!`) out of it.
            if let Ok(text) = std::str::from_utf8(line) {
                self.peak = crate::memory::reported_peak("head", text).or(self.peak);
                self.seen.push(text.to_string());
            }
            let mut line = line.to_vec();
            if line.last() != Some(&b'\n') {
                line.push(b'\n');
            }
            self.report
                .write_all(&line)
                .and_then(|()| self.report.flush())
                .context("passing on the head's log")?;
        }
        self.log.drain(..whole);
        if !text_first {
            write_out(&mut self.answer, &text).context("passing on the head's answer")?;
        }
        Ok(())
    }
}

/// Everything `from` has now, to `to`; whether it is still open (`false` once it has ended).
fn drain(from: &mut impl Read, to: &mut dyn FnMut(&[u8])) -> Result<bool> {
    let mut buf = [0u8; 8192];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return Ok(false),
            Ok(n) => to(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Part of the answer, passed on at once.
fn write_out(to: &mut dyn Write, bytes: &[u8]) -> Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    to.write_all(bytes)?;
    to.flush()?;
    Ok(())
}

fn set_nonblocking(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: `fcntl` on a pipe this process holds open; F_GETFL/F_SETFL take and return ints.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Both of the demo's outputs in one buffer, as one terminal shows them.
    #[derive(Clone, Default)]
    struct Terminal(Arc<Mutex<Vec<u8>>>);

    impl Write for Terminal {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("terminal").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Terminal {
        fn shown(&self) -> String {
            String::from_utf8(self.0.lock().expect("terminal").clone()).expect("text")
        }
    }

    /// A stand-in head: `sh -c script`, its output passed on to one terminal.
    fn stand_in(script: &str) -> (Child, HeadOutput, Terminal) {
        let mut child = Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sh runs");
        let terminal = Terminal::default();
        let head = HeadOutput::new(
            child.stdout.take().expect("piped"),
            child.stderr.take().expect("piped"),
            Box::new(terminal.clone()),
            Box::new(terminal.clone()),
        )
        .expect("non-blocking pipes");
        (child, head, terminal)
    }

    /// A stand-in head (a shell script) writes a log line and its join URL with the answer's
    /// first words, then — while the demo is not reading — the answer's closing newline and right
    /// after it a log line, then a log line in two writes and a last one without a newline. The
    /// demo passes on the answer from after the URL, and the log in whole lines, in the order
    /// written.
    #[test]
    fn the_heads_log_comes_whole_and_after_the_answer_written_before_it() {
        let script = "printf 'head: loading\\n' >&2; printf 'join: http://h/#s\\nThe answer'; \
                      sleep 1; printf ' ends.\\n'; printf 'head: 3 tokens\\n' >&2; \
                      sleep 1; printf 'head: a line in ' >&2; sleep 0.1; \
                      printf 'two writes\\nhead: last' >&2";
        let (mut child, mut head, terminal) = stand_in(script);
        // The first log line and the URL with the answer's first words come in one read.
        std::thread::sleep(Duration::from_millis(50));
        let first = head.first_line().expect("read").expect("a first line");
        assert_eq!(first, "join: http://h/#s\n");
        // The script writes the answer's end and the log line after it meanwhile (a second after
        // the URL; the margins are wide for a busy machine): the next read finds both.
        std::thread::sleep(Duration::from_millis(1600));
        head.pass_on().expect("passed on");
        child.wait().expect("sh ends");
        let shown = terminal.shown();
        assert_eq!(
            shown,
            "head: loading\nThe answer ends.\nhead: 3 tokens\nhead: a line in two writes\n\
             head: last\n"
        );
    }

    /// A head that stops before its join URL: what it said on its way out reaches the terminal,
    /// its last line too, though it closed stdout first and lacks a newline.
    #[test]
    fn a_head_that_stops_before_its_url_is_heard_to_the_end() {
        let script = "printf 'head: starting\\n' >&2; exec 1>&-; sleep 0.2; \
                      printf 'error: no such model' >&2; exit 1";
        let (mut child, mut head, terminal) = stand_in(script);
        assert_eq!(head.first_line().expect("read"), None);
        child.wait().expect("sh ends");
        let shown = terminal.shown();
        assert_eq!(shown, "head: starting\nerror: no such model\n");
    }

    /// A log read to its end in one go (the head wrote and exited before the demo looked): its
    /// last line, without a newline, goes out with the whole ones before it.
    #[test]
    fn a_log_read_whole_at_once_keeps_its_last_line() {
        let (mut child, mut head, terminal) =
            stand_in("printf 'join: u\\n'; printf 'head: one\\nhead: two' >&2");
        child.wait().expect("sh ends");
        assert_eq!(
            head.first_line().expect("read").as_deref(),
            Some("join: u\n")
        );
        head.pass_on().expect("passed on");
        assert_eq!(terminal.shown(), "head: one\nhead: two\n");
    }

    /// The demo waits for the head's line admitting a member, passing on what the head says
    /// meanwhile; it stops waiting when the time is up, the member is gone, or the head's log
    /// ends.
    #[test]
    fn the_demo_waits_for_a_member_to_be_admitted_and_no_longer_than_it_may() {
        let (mut child, mut head, terminal) = stand_in(
            "printf 'join: u\n'; sleep 0.3; printf 'head: waiting\n' >&2; sleep 0.3; \
             printf 'head: stage-1 joined from 127.0.0.1\n' >&2; sleep 2; \
             printf 'head: stage-2 joined from 127.0.0.1\n' >&2",
        );
        assert_eq!(
            head.first_line().expect("read").as_deref(),
            Some("join: u\n")
        );
        let joined = |d| super::super::head::joined(d);
        let t0 = Instant::now();
        assert!(
            head.until_logged(&joined("stage-1"), Duration::from_secs(30), &mut || false)
                .expect("read")
        );
        assert!(
            t0.elapsed() >= Duration::from_millis(500),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(
            terminal.shown(),
            "head: waiting\nhead: stage-1 joined from 127.0.0.1\n"
        );
        // Not within 0.2 s (the line comes 2 s later), and never once the log has ended.
        assert!(
            !head
                .until_logged(&joined("stage-2"), Duration::from_millis(200), &mut || {
                    false
                })
                .expect("read")
        );
        // Nor once the member it waits for is gone (as a member that exited is), long before the
        // 30 s are up.
        let t0 = Instant::now();
        assert!(
            !head
                .until_logged(&joined("stage-2"), Duration::from_secs(30), &mut || true)
                .expect("read")
        );
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        assert!(
            !head
                .until_logged(&joined("stage-3"), Duration::from_secs(30), &mut || false)
                .expect("read")
        );
        child.wait().expect("sh ends");
        assert!(
            terminal
                .shown()
                .ends_with("head: stage-2 joined from 127.0.0.1\n")
        );
    }
}
