//! `cargo xtask bench --compare-llama-cpp DIR`: llama.cpp beside ours in the same run, on the same
//! weights. DIR is a llama.cpp that the user built (never shipped, never committed): its
//! `llama-bench` (and `llama-quantize`, `convert_hf_to_gguf.py`, and for the split an RPC server)
//! are looked for in DIR, DIR/bin and DIR/build/bin, the script in DIR or above its binaries.
//!
//! The Q8_0 GGUF is made by llama.cpp's own converter (to f32) and quantizer from the benched
//! model's safetensors (the SmolLM2 fixture, or `--model DIR`), once, under `target/bench-llama/`,
//! named by the model's folder (`--llama-gguf FILE` takes one made
//! elsewhere; the converter runs with `$PYTHON`, default `python3`, which needs its
//! requirements). Figures: `pp512` and `tg128` (`llama-bench -t` = this machine's threads, as
//! ours), the peak RSS of a `tg128` run, and the same model split over two RPC servers on loopback
//! (`-ngl 99 --rpc`, the two-machine split llama.cpp offers) — then ours over theirs.
//!
//! The speed ratios come from [`PAIRED_ROUNDS`] interleaved rounds, each of eight runs: ours
//! prefill, their pp512 twice, ours prefill; ours decode, their tg128 twice, ours decode. A round's
//! ratio is ours summed over theirs summed, and a figure the median of the rounds' ratios: a shared
//! machine's speed drifts by tens of percent from one minute to the next, both sides of a ratio
//! should see the same minutes, and with each side first and last in turn a steady drift across
//! the round weighs on both alike. Each side's median of the rounds' means is printed beside it
//! (theirs as `pp512` and `tg128`, with the peak RSS of the `tg128` runs), and how far the rounds
//! spread: the lowest and highest round's ratio, and the share of the CPUs' time that the host's
//! hypervisor took for others during the rounds (`steal` in `/proc/stat`), so that a reader can
//! tell a quiet run from a loud one.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::bench::Figure;
use crate::bench_model::BenchModel;

/// What `--compare-llama-cpp` was given.
pub(crate) struct Llama {
    pub(crate) dir: PathBuf,
    pub(crate) gguf: Option<PathBuf>,
}

/// The tools found under DIR.
struct Tools {
    bench: PathBuf,
    quantize: Option<PathBuf>,
    rpc_server: Option<PathBuf>,
    convert: Option<PathBuf>,
}

fn find_tools(dir: &Path) -> anyhow::Result<Tools> {
    let bins = [dir.to_path_buf(), dir.join("bin"), dir.join("build/bin")];
    let find = |names: &[&str]| {
        bins.iter()
            .flat_map(|b| names.iter().map(move |n| b.join(n)))
            .find(|p| p.is_file())
    };
    let bench = find(&["llama-bench"]).with_context(|| {
        format!(
            "no llama-bench in {} (nor in its bin/ or build/bin/): build llama.cpp there first",
            dir.display()
        )
    })?;
    let convert = bench
        .ancestors()
        .skip(1)
        .map(|d| d.join("convert_hf_to_gguf.py"))
        .find(|p| p.is_file());
    Ok(Tools {
        quantize: find(&["llama-quantize"]),
        rpc_server: find(&["ggml-rpc-server", "rpc-server"]),
        convert,
        bench,
    })
}

/// The Q8_0 GGUF of `model`: given, or made (once) by llama.cpp's converter and quantizer.
fn q8_gguf(
    root: &Path,
    model: &BenchModel,
    tools: &Tools,
    given: Option<&Path>,
) -> anyhow::Result<PathBuf> {
    if let Some(g) = given {
        if !g.is_file() {
            bail!("--llama-gguf {}: no such file", g.display());
        }
        return Ok(g.to_path_buf());
    }
    let dir = crate::target_dir()?.join("bench-llama");
    let stem = model.folder_name();
    let q8 = dir.join(format!("{stem}-Q8_0.gguf"));
    if q8.is_file() {
        return Ok(q8);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let convert = tools.convert.as_ref().context(
        "no convert_hf_to_gguf.py above llama-bench: pass --llama-gguf with a Q8_0 GGUF of the model",
    )?;
    let quantize = tools
        .quantize
        .as_ref()
        .context("no llama-quantize beside llama-bench: build it, or pass --llama-gguf")?;
    let f32 = dir.join(format!("{stem}-f32.gguf"));
    let python = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    run_quiet(
        Command::new(&python)
            .arg(convert)
            .arg(model.path(root))
            .args(["--outtype", "f32", "--outfile"])
            .arg(&f32),
        "llama.cpp's convert_hf_to_gguf.py (it needs its Python requirements: torch, numpy, …)",
    )?;
    let partial = dir.join(format!("{stem}-Q8_0.gguf.partial"));
    run_quiet(
        Command::new(quantize).arg(&f32).arg(&partial).arg("Q8_0"),
        "llama-quantize",
    )?;
    std::fs::rename(&partial, &q8)?;
    let _ = std::fs::remove_file(&f32);
    Ok(q8)
}

fn run_quiet(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    eprintln!("$ {cmd:?}");
    let out = cmd
        .output()
        .with_context(|| format!("could not start {what}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        bail!(
            "{what} failed with {}: {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        );
    }
    Ok(())
}

/// Run llama-bench to its end; its stdout.
fn run_bench(cmd: &mut Command) -> anyhow::Result<String> {
    eprintln!("$ {cmd:?}");
    let out = cmd.output().context("could not start llama-bench")?;
    if !out.status.success() {
        bail!(
            "llama-bench failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `llama-bench -o json`'s throughput (tokens/s) of its test with these prompt and generated counts.
fn rate(json: &str, n_prompt: u64, n_gen: u64) -> anyhow::Result<f64> {
    let tests: Value = serde_json::from_str(json).context("llama-bench's JSON")?;
    tests
        .as_array()
        .context("llama-bench's JSON is not a list")?
        .iter()
        .find(|t| t["n_prompt"].as_u64() == Some(n_prompt) && t["n_gen"].as_u64() == Some(n_gen))
        .and_then(|t| t["avg_ts"].as_f64())
        .with_context(|| format!("llama-bench reported no test of {n_prompt}+{n_gen} tokens"))
}

/// A port free on loopback now.
fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// RPC servers that are killed when this is dropped.
struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(crate) fn figures(
    root: &Path,
    model: &BenchModel,
    llama: &Llama,
) -> anyhow::Result<Vec<Figure>> {
    let tools = find_tools(&llama.dir)?;
    let gguf = q8_gguf(root, model, &tools, llama.gguf.as_deref())?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let fig = |name: &str, value: f64, unit: &str| Figure {
        name: format!("llama.cpp/{}/q8_0/{name}", model.slug),
        value,
        unit: unit.to_string(),
    };
    let t = threads.to_string();
    // `llama-bench` with `reps` repetitions and these arguments.
    let bench = |reps: &str, extra: &[&str]| {
        let mut cmd = Command::new(&tools.bench);
        cmd.arg("-m")
            .arg(&gguf)
            .args(["-t", &t, "-r", reps, "-o", "json"]);
        cmd.args(extra);
        cmd
    };
    let mut figures = paired(root, model, &|extra: &[&str]| bench("1", extra))?;
    match &tools.rpc_server {
        None => eprintln!("llama.cpp: no RPC server beside llama-bench; the split is not measured"),
        Some(server) => {
            let mut servers = Servers(Vec::new());
            let mut endpoints = Vec::new();
            for _ in 0..2 {
                let port = free_port()?.to_string();
                let child = Command::new(server)
                    .args(["-H", "127.0.0.1", "-p", &port, "-t", "1"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .with_context(|| format!("could not start {}", server.display()))?;
                servers.0.push(child);
                endpoints.push(format!("127.0.0.1:{port}"));
            }
            std::thread::sleep(Duration::from_millis(500));
            let rpc = endpoints.join(",");
            let out = run_bench(&mut bench(
                "3",
                &["-p", "512", "-n", "128", "-ngl", "99", "--rpc", &rpc],
            ))?;
            figures.push(fig("rpc_2_servers/pp512", rate(&out, 512, 0)?, "tok/s"));
            figures.push(fig("rpc_2_servers/tg128", rate(&out, 0, 128)?, "tok/s"));
        }
    }
    Ok(figures)
}

/// Interleaved rounds of each side's prefill and decode behind the speed ratios.
const PAIRED_ROUNDS: usize = 5;

/// [`PAIRED_ROUNDS`] rounds of ours (the release `node`, as the model figures run it) and theirs
/// (`bench` makes a one-repetition `llama-bench`), ours, theirs, theirs, ours; each side's median of
/// the rounds' means, the median of the rounds' ratios, and the largest peak RSS of their `tg128`
/// runs.
fn paired(
    root: &Path,
    model: &BenchModel,
    bench: &dyn Fn(&[&str]) -> Command,
) -> anyhow::Result<Vec<Figure>> {
    use crate::bench_model::{build_release, prompt_of, run_int8, timing};
    build_release(model)?;
    let text = std::fs::read_to_string(root.join(crate::bench_model::TEXT))?;
    let long = prompt_of(root, model, &text, 512)?;
    let short = prompt_of(root, model, &text, 16)?;
    let slug = &model.slug;
    // (ours, theirs) per round, for prefill and for decode.
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    let mut peak: Option<u64> = None;
    let our_prefill = || -> anyhow::Result<f64> {
        let j = run_int8(root, model, &long, 1, "full-window")?;
        let tokens = j["prompt_ids"].as_array().map_or(0, Vec::len) as f64;
        Ok(tokens / timing(&j, "prefill_s")?)
    };
    let our_decode = || -> anyhow::Result<f64> {
        timing(
            &run_int8(root, model, &short, 129, "cached")?,
            "decode_tokens_per_s",
        )
    };
    let cpu_before = cpu_times();
    for round in 0..PAIRED_ROUNDS {
        eprintln!("paired round {} of {PAIRED_ROUNDS}", round + 1);
        let first = our_prefill()?;
        let mut theirs = 0.0;
        for _ in 0..2 {
            theirs += rate(&run_bench(&mut bench(&["-p", "512", "-n", "0"]))?, 512, 0)?;
        }
        let ours = first + our_prefill()?;
        prefill.push((ours / 2.0, theirs / 2.0));
        let first = our_decode()?;
        let mut theirs = 0.0;
        for _ in 0..2 {
            let (tg, tg_peak) = peak_of(&mut bench(&["-p", "0", "-n", "128"]))?;
            theirs += rate(&tg, 0, 128)?;
            peak = peak.max(tg_peak);
        }
        let ours = first + our_decode()?;
        decode.push((ours / 2.0, theirs / 2.0));
    }
    let fig = |name: &str, value: f64, unit: &str| Figure {
        name: name.to_string(),
        value,
        unit: unit.to_string(),
    };
    let mut figures = Vec::new();
    for (rounds, what, ours, theirs) in [
        (&prefill, "prefill_512_vs_pp512", "prefill_512", "pp512"),
        (&decode, "decode_vs_tg128", "decode_cached_1_stage", "tg128"),
    ] {
        let side = |f: fn(&(f64, f64)) -> f64| median(rounds.iter().map(f).collect());
        figures.push(fig(
            &format!("paired/{slug}/int8/{ours}_median"),
            side(|r| r.0),
            "tok/s",
        ));
        figures.push(fig(
            &format!("llama.cpp/{slug}/q8_0/{theirs}"),
            side(|r| r.1),
            "tok/s",
        ));
        figures.push(fig(
            &format!("ours_vs_llama.cpp/{slug}/{what}"),
            side(|r| r.0 / r.1),
            "x",
        ));
        let (low, high) = spread(rounds.iter().map(|r| r.0 / r.1));
        figures.push(fig(
            &format!("ours_vs_llama.cpp/{slug}/{what}_lowest_round"),
            low,
            "x",
        ));
        figures.push(fig(
            &format!("ours_vs_llama.cpp/{slug}/{what}_highest_round"),
            high,
            "x",
        ));
    }
    if let (Some(before), Some(after)) = (cpu_before, cpu_times()) {
        figures.push(fig(
            &format!("host/{slug}/steal_during_paired_rounds"),
            steal_share(before, after),
            "%",
        ));
    }
    if let Some(peak) = peak {
        figures.push(fig(
            &format!("llama.cpp/{slug}/q8_0/peak_rss_tg128"),
            peak as f64 / 1e6,
            "MB",
        ));
    }
    Ok(figures)
}

/// The lowest and highest of `v` (NaN for none).
fn spread(v: impl Iterator<Item = f64>) -> (f64, f64) {
    v.fold((f64::NAN, f64::NAN), |(lo, hi), x| (x.min(lo), x.max(hi)))
}

/// The CPUs' time so far, summed over every state, and the part of it stolen by the hypervisor
/// (the `cpu` line of `/proc/stat`); none where there is no such file or line.
fn cpu_times() -> Option<(u64, u64)> {
    parse_cpu_times(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// [`cpu_times`] from the text of `/proc/stat`: the first line, `cpu` and then user, nice, system,
/// idle, iowait, irq, softirq, steal (guest time is counted inside user and nice already).
fn parse_cpu_times(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    (ticks.len() == 8).then(|| (ticks.iter().sum(), ticks[7]))
}

/// The percentage of the time between two [`cpu_times`] that was stolen.
fn steal_share((total0, steal0): (u64, u64), (total1, steal1): (u64, u64)) -> f64 {
    let total = total1.saturating_sub(total0);
    if total == 0 {
        return 0.0;
    }
    100.0 * steal1.saturating_sub(steal0) as f64 / total as f64
}

/// The middle value (the mean of the two middle ones for an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// [`run_bench`], and the peak RSS of the process (read by `wait4`; none off Linux).
fn peak_of(cmd: &mut Command) -> anyhow::Result<(String, Option<u64>)> {
    #[cfg(target_os = "linux")]
    {
        use std::io::Read;
        eprintln!("$ {cmd:?}");
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("could not start llama-bench")?;
        let mut stdout = String::new();
        child
            .stdout
            .take()
            .context("piped")?
            .read_to_string(&mut stdout)?;
        let pid = child.id() as libc::pid_t;
        let mut status = 0;
        // SAFETY: a zeroed rusage is a valid value for wait4 to overwrite.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `pid` is our child, which std has not reaped (no wait on it); the handle is
        // dropped right after without waiting, so nothing uses the pid again.
        let got = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        drop(child);
        if got != pid {
            bail!(
                "waiting for llama-bench: {}",
                std::io::Error::last_os_error()
            );
        }
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            bail!("llama-bench failed (wait status {status})");
        }
        let peak = u64::try_from(usage.ru_maxrss).ok().map(|kb| kb * 1024);
        Ok((stdout, peak))
    }
    #[cfg(not(target_os = "linux"))]
    Ok((run_bench(cmd)?, None))
}

/// Ours over theirs, for the figures both runs produced on the model named `slug`.
pub(crate) fn ratios(figures: &[Figure], slug: &str) -> Vec<Figure> {
    let get = |name: &str| figures.iter().find(|f| f.name == name).map(|f| f.value);
    // The speed ratios come from the paired rounds (see `paired`).
    let pairs = [
        (
            "peak_rss_vs_tg128_peak_rss",
            format!("model/{slug}/int8/peak_rss"),
            format!("llama.cpp/{slug}/q8_0/peak_rss_tg128"),
        ),
        (
            "ring_3_processes_decode_vs_rpc_2_servers_tg128",
            format!("ring/{slug}/int8/decode_cached_3_processes"),
            format!("llama.cpp/{slug}/q8_0/rpc_2_servers/tg128"),
        ),
    ];
    pairs
        .iter()
        .filter_map(|(name, ours, theirs)| {
            Some(Figure {
                name: format!("ours_vs_llama.cpp/{slug}/{name}"),
                value: get(ours)? / get(theirs)?,
                unit: "x".into(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_read_from_llama_bench_json_by_test_shape() {
        let json = r#"[{"n_prompt": 512, "n_gen": 0, "avg_ts": 570.5},
                       {"n_prompt": 0, "n_gen": 128, "avg_ts": 80.25}]"#;
        assert_eq!(rate(json, 512, 0).unwrap(), 570.5);
        assert_eq!(rate(json, 0, 128).unwrap(), 80.25);
        let missing = rate(json, 0, 64).unwrap_err().to_string();
        assert!(missing.contains("0+64"), "{missing}");
        assert!(rate("not json", 512, 0).is_err());
    }

    #[test]
    fn ratios_pair_ours_with_theirs_and_skip_what_is_missing() {
        let f = |name: &str, value: f64| Figure {
            name: name.into(),
            value,
            unit: String::new(),
        };
        let figures = [
            f("model/smollm2-135m/int8/peak_rss", 170.0),
            f("llama.cpp/smollm2-135m/q8_0/peak_rss_tg128", 200.0),
            f("ring/smollm2-135m/int8/decode_cached_3_processes", 100.0),
        ];
        let r = ratios(&figures, "smollm2-135m");
        assert_eq!(r.len(), 1, "the RPC split is missing, so only the RSS pair");
        assert_eq!(
            r[0].name,
            "ours_vs_llama.cpp/smollm2-135m/peak_rss_vs_tg128_peak_rss"
        );
        assert_eq!(r[0].value, 0.85);
    }

    #[test]
    fn the_steal_share_is_read_from_proc_stat() {
        let stat = |steal: u64| {
            format!(
                "cpu  100 0 50 800 10 0 0 {steal} 0 0\ncpu0 50 0 25 400 5 0 0 0 0 0\nintr 1 2 3\n"
            )
        };
        let before = parse_cpu_times(&stat(40)).unwrap();
        assert_eq!(before, (1000, 40));
        let after = parse_cpu_times(&stat(140)).unwrap();
        // 100 more ticks, all of them stolen, against 1000 + 100 - 1000 = 100 more in total.
        assert_eq!(steal_share(before, after), 100.0);
        let busier = parse_cpu_times("cpu  400 0 50 1400 10 0 0 140 0 0\n").unwrap();
        assert_eq!(steal_share(before, busier), 10.0);
        assert_eq!(steal_share(before, before), 0.0);
        assert!(parse_cpu_times("cpu0 1 2 3\n").is_none(), "no summed line");
        assert!(
            parse_cpu_times("cpu  1 2 x 4 5 6 7 8\n").is_none(),
            "a field that is no number"
        );
        assert!(
            parse_cpu_times("cpu  1 2 3\n").is_none(),
            "a kernel too old to count steal"
        );
    }

    #[test]
    fn the_spread_is_the_lowest_and_highest_round() {
        assert_eq!(spread([1.2, 0.9, 1.4].into_iter()), (0.9, 1.4));
        let (lo, hi) = spread(std::iter::empty());
        assert!(lo.is_nan() && hi.is_nan());
    }

    #[test]
    fn medians_take_the_middle() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
    }
}
