//! The ring figures of `cargo xtask bench`, in the same run as the single process: SmolLM2 (or the
//! model of `--model DIR`) int8 on a ring of three processes on loopback (`node demo --stages
//! 10,10,10`, its layers in thirds, real WebRTC) against one process (`node run`) — decode tok/s and the ratio, the decode lap and the one-way hop latency
//! p50/p99, and the prefill of a 512-token prompt with two chunks in flight around the ring against
//! one at a time. Each decode round is printed with the round trip of a cache line between the
//! machine's first two CPUs measured before it, which tells where a hypervisor placed them.

use std::path::Path;

use anyhow::Context;
use serde_json::Value;

use crate::bench::Figure;
use crate::bench_model::{BenchModel, TEXT, node, node_and_stderr, prompt_of, run_int8, timing};

/// Rounds of the decode figures, each one process, the ring twice, one process again.
const ROUNDS: usize = 7;

/// Where `node demo` runs the model: three processes, each a stage of `stages` layers.
struct Ring<'a> {
    model: &'a BenchModel,
    stages: String,
}

/// `node demo` on three processes with `new_tokens` generated, end-of-sequence ignored.
fn ring(
    root: &Path,
    at: &Ring<'_>,
    prompt: &str,
    new_tokens: usize,
    in_flight: usize,
) -> anyhow::Result<Value> {
    Ok(ring_and_peaks(root, at, prompt, new_tokens, in_flight)?.0)
}

/// `layers` in three stages, as even as they go, the larger first (30: 10,10,10; 28: 10,9,9).
fn thirds(layers: usize) -> [usize; 3] {
    [0, 1, 2].map(|i| layers / 3 + usize::from(i < layers % 3))
}

/// Each process's peak RSS in bytes as `node demo` reported it: head, stage-1, stage-2.
type Peaks = Vec<(String, f64)>;

/// [`ring`], and the peak RSS of each of its processes.
fn ring_and_peaks(
    root: &Path,
    at: &Ring<'_>,
    prompt: &str,
    new_tokens: usize,
    in_flight: usize,
) -> anyhow::Result<(Value, Peaks)> {
    let (n, k) = (new_tokens.to_string(), in_flight.to_string());
    let (json, stderr) = node_and_stderr(
        root,
        &[
            "demo",
            "--model",
            &at.model.dir,
            "--stages",
            &at.stages,
            "--prompt",
            prompt,
            "--max-new-tokens",
            &n,
            "--ignore-eos",
            "--path",
            "cached",
            "--precision",
            "int8",
            "--backend",
            "cpu",
            "--in-flight",
            &k,
            "--no-verify",
            "--format",
            "json",
        ],
    )?;
    // "demo: peak RSS head 81.2 MB, stage-1 …, stage-2 …; the ring … MB (N bytes)"
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("demo: peak RSS "))
        .context("node demo reported no peak RSS")?;
    let each = line.split(';').next().unwrap_or_default();
    let peaks = each
        .split(", ")
        .map(|p| {
            let mut w = p.split_whitespace();
            let name = w.next().unwrap_or_default().to_string();
            let mb: f64 = w
                .next()
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("peak RSS `{p}`"))?;
            Ok((name, mb * 1e6))
        })
        .collect::<anyhow::Result<Peaks>>()?;
    Ok((json, peaks))
}

fn stat(j: &Value, key: &str, q: &str) -> anyhow::Result<f64> {
    j[key][q]
        .as_f64()
        .with_context(|| format!("{key}.{q} missing"))
}

/// Assumes `bench_model::figures` built the release node and the fixtures.
pub(crate) fn figures(model: &BenchModel) -> anyhow::Result<Vec<Figure>> {
    let root = crate::root();
    let text =
        std::fs::read_to_string(root.join(TEXT)).with_context(|| format!("reading {TEXT}"))?;
    let fig = |name: &str, value: f64, unit: &str| Figure {
        name: format!("ring/{}/int8/{name}", model.slug),
        value,
        unit: unit.to_string(),
    };
    let mut figures = Vec::new();
    let inspect = node(
        &root,
        &["inspect", "--model", &model.dir, "--format", "json"],
    )?;
    let layers = inspect["layers"].as_array().context("inspect's layers")?;
    if layers.len() < 3 {
        anyhow::bail!(
            "{} has {} layers; a ring of three stages needs 3 at least",
            model.dir,
            layers.len()
        );
    }
    let split = thirds(layers.len());
    let at = Ring {
        model,
        stages: split.map(|s| s.to_string()).join(","),
    };

    // Decode: the same prompt and length in one process and around the ring, in `ROUNDS` rounds of
    // four runs back to back: one process, the ring, the ring, one process. This machine's speed
    // drifts by 10-20 % from one minute to the next, both sides alike, and a run's place moves it
    // too (a ring run right after another ran 5 % faster than one right after a single process,
    // and a single process after two ring runs up to 15 % faster than one before them); so the
    // ratio is taken within each round, (ring + ring) ÷ (one + one), where a drift and what each
    // place does fall on both sides alike, and the figure is the median of the rounds. The tok/s
    // figures are each side's best.
    let prompt = prompt_of(&root, model, &text, 16)?;
    let mut single = 0f64;
    let mut single_rss = f64::INFINITY;
    let mut ringed = 0f64;
    let mut ratios = Vec::with_capacity(ROUNDS);
    let mut best: Option<Value> = None;
    let mut peaks: Peaks = Vec::new();
    // The host's placement of this machine's first two CPUs, probed before each round (see
    // `core_to_core_ns`): a reader can tell the rounds that ran across core complexes.
    let mut crossings = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let crossing = core_to_core_ns();
        crossings.extend(crossing);
        let one = || -> anyhow::Result<(f64, f64)> {
            let j = run_int8(&root, model, &prompt, 129, "cached")?;
            let rss = j["peak_rss_bytes"].as_f64().context("peak_rss_bytes")?;
            Ok((timing(&j, "decode_tokens_per_s")?, rss))
        };
        let ringed_run = || ring_and_peaks(&root, &at, &prompt, 129, 2);
        let first = one()?;
        let rings = [ringed_run()?, ringed_run()?];
        let last = one()?;
        let mut round_ring = 0f64;
        for (r, p) in rings {
            let tps = timing(&r, "decode_tokens_per_s")?;
            round_ring += tps;
            if tps > ringed {
                ringed = tps;
                best = Some(r);
            }
            // The smallest of the runs, per process (as for the single process).
            if peaks.is_empty() {
                peaks = p;
            } else {
                for ((_, a), (_, b)) in peaks.iter_mut().zip(p) {
                    *a = a.min(b);
                }
            }
        }
        for (tps, rss) in [first, last] {
            single = single.max(tps);
            single_rss = single_rss.min(rss);
        }
        ratios.push(round_ring / (first.0 + last.0));
        eprintln!(
            "bench: ring round {}: ring ÷ single process {:.3}{}",
            ratios.len(),
            ratios[ratios.len() - 1],
            crossing
                .map(|ns| format!(", a cache line between CPUs before it {ns:.0} ns"))
                .unwrap_or_default()
        );
    }
    let best = best.context("no ring run")?;
    let sum: f64 = peaks.iter().map(|p| p.1).sum();
    for (name, bytes) in &peaks {
        figures.push(fig(&format!("peak_rss_{name}"), bytes / 1e6, "MB"));
    }
    figures.push(fig("peak_rss_sum_3_processes", sum / 1e6, "MB"));
    figures.push(fig("peak_rss_1_process", single_rss / 1e6, "MB"));
    figures.push(fig(
        "peak_rss_sum_above_1_process",
        (sum - single_rss) / 1e6,
        "MB",
    ));
    // The middle stage (layers 10..20 of 30) against its weights: one int8 byte per parameter.
    let mid = split[0] as u64..(split[0] + split[1]) as u64;
    let middle: f64 = layers
        .iter()
        .filter(|l| l["layer"].as_u64().is_some_and(|i| mid.contains(&i)))
        .filter_map(|l| l["parameters"].as_f64())
        .sum();
    if let Some((_, stage1)) = peaks.iter().find(|p| p.0 == "stage-1") {
        figures.push(fig(
            "peak_rss_stage-1_above_its_int8_weights",
            (stage1 - middle) / 1e6,
            "MB",
        ));
    }
    if !crossings.is_empty() {
        crossings.sort_by(f64::total_cmp);
        figures.push(fig(
            "core_to_core_round_trip_p50_before_rounds",
            crossings[crossings.len() / 2],
            "ns",
        ));
    }
    figures.push(fig("decode_cached_1_process", single, "tok/s"));
    figures.push(fig("decode_cached_3_processes", ringed, "tok/s"));
    ratios.sort_by(f64::total_cmp);
    eprintln!(
        "bench: ring ÷ single process, decode, per round (sorted): {}",
        ratios
            .iter()
            .map(|r| format!("{r:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    figures.push(fig(
        "decode_ratio_3_processes_to_1",
        ratios[ratios.len() / 2],
        "x",
    ));
    figures.push(fig(
        "decode_lap_p50",
        stat(&best, "decode_lap_ms", "p50_ms")?,
        "ms",
    ));
    figures.push(fig(
        "decode_lap_p99",
        stat(&best, "decode_lap_ms", "p99_ms")?,
        "ms",
    ));
    // Where the best run's decode lap went: each stage's step (p50) and the rest, the wire.
    let split = &best["lap_split"];
    let stages = split["stages"].as_array().context("lap_split.stages")?;
    let compute = split["compute_p50_ms"]
        .as_array()
        .context("lap_split.compute_p50_ms")?;
    for (name, ms) in stages.iter().zip(compute) {
        if let (Some(name), Some(ms)) = (name.as_str(), ms.as_f64()) {
            figures.push(fig(&format!("decode_step_p50_{name}"), ms, "ms"));
        }
    }
    figures.push(fig(
        "decode_lap_wire_p50",
        split["wire_p50_ms"]
            .as_f64()
            .context("lap_split.wire_p50_ms")?,
        "ms",
    ));
    figures.push(fig("hop_p50", stat(&best, "hop_ms", "p50_ms")?, "ms"));
    figures.push(fig("hop_p99", stat(&best, "hop_ms", "p99_ms")?, "ms"));

    // Prefill of a 512-token prompt: two chunks in flight against one, best of 2 each.
    let prompt = prompt_of(&root, model, &text, 512)?;
    let mut rates = [0f64; 2];
    for _ in 0..2 {
        for (i, k) in [1usize, 2].into_iter().enumerate() {
            let r = ring(&root, &at, &prompt, 1, k)?;
            rates[i] = rates[i].max(timing(&r, "prefill_tokens_per_s")?);
        }
    }
    figures.push(fig("prefill_512_one_chunk_in_flight", rates[0], "tok/s"));
    figures.push(fig("prefill_512_two_chunks_in_flight", rates[1], "tok/s"));
    figures.push(fig(
        "prefill_512_ratio_two_to_one",
        rates[1] / rates[0],
        "x",
    ));
    Ok(figures)
}

/// The round trip of one cache line between the first two CPUs this process may run on, in ns (the
/// mean of 20,000, or of those done in 100 ms), or `None` where it may run on one CPU only or
/// cannot pin its threads. A hypervisor may place a guest's vCPUs on one core complex (a round trip
/// of about 100 ns on a 2-vCPU Zen 5 guest) or on two (350-400 ns), minute by minute; a ring on one
/// machine hands every lap between the cores, and its ratio to one process moves with that placement
/// (`docs/performance.md`). The calling thread's affinity is restored before it returns.
#[cfg(target_os = "linux")]
fn core_to_core_ns() -> Option<f64> {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use std::sync::atomic::{AtomicU64, Ordering};

    const TRIPS: u64 = 20_000;
    const LONGEST: std::time::Duration = std::time::Duration::from_millis(100);
    const STOP: u64 = u64::MAX;
    // One line of its own.
    #[repr(align(128))]
    struct Line(AtomicU64);

    // Pid 0: the calling thread alone.
    let this = nix::unistd::Pid::from_raw(0);
    let pin = |cpu: usize| {
        let mut one = CpuSet::new();
        one.set(cpu).is_ok() && sched_setaffinity(this, &one).is_ok()
    };
    let saved = sched_getaffinity(this).ok()?;
    let mut cpus = (0..CpuSet::count()).filter(|&c| saved.is_set(c).unwrap_or(false));
    let (a, b) = (cpus.next()?, cpus.next()?);
    let line = Line(AtomicU64::new(0));
    let (pinned, took) = std::thread::scope(|s| {
        // Spawned before this thread is pinned, so that it starts with every CPU: if pinning is
        // refused, the trips still end (and the figure is dropped).
        let other = s.spawn(|| {
            let pinned = pin(b);
            for i in 0.. {
                let mut seen = line.0.load(Ordering::Acquire);
                while seen != 2 * i + 1 && seen != STOP {
                    std::hint::spin_loop();
                    seen = line.0.load(Ordering::Acquire);
                }
                if seen == STOP {
                    break;
                }
                line.0.store(2 * i + 2, Ordering::Release);
            }
            pinned
        });
        let here = pin(a);
        let start = std::time::Instant::now();
        let mut trips = 0;
        // At most `LONGEST`: on a machine busy with other work a trip can wait for a time slice.
        while trips < TRIPS && (trips % 64 != 0 || start.elapsed() < LONGEST) {
            line.0.store(2 * trips + 1, Ordering::Release);
            while line.0.load(Ordering::Acquire) != 2 * trips + 2 {
                std::hint::spin_loop();
            }
            trips += 1;
        }
        let took = start.elapsed();
        line.0.store(STOP, Ordering::Release);
        (
            here && other.join().unwrap_or(false),
            took.as_secs_f64() / trips as f64,
        )
    });
    // Back to every CPU it had, before any process is started from this thread again.
    let _ = sched_setaffinity(this, &saved);
    pinned.then_some(took * 1e9)
}

#[cfg(not(target_os = "linux"))]
fn core_to_core_ns() -> Option<f64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn the_core_to_core_probe_times_a_round_trip_and_gives_the_thread_its_cpus_back() {
        use nix::sched::{CpuSet, sched_getaffinity};
        let this = nix::unistd::Pid::from_raw(0);
        let cpus = || {
            let set = sched_getaffinity(this).expect("this thread's affinity");
            (0..CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .collect::<Vec<_>>()
        };
        let before = cpus();
        let ns = core_to_core_ns();
        assert_eq!(ns.is_some(), before.len() > 1, "{ns:?}");
        if let Some(ns) = ns {
            assert!(ns.is_finite() && ns > 0.0, "{ns}");
        }
        assert_eq!(cpus(), before);
    }

    #[test]
    fn layers_go_in_thirds_the_larger_first() {
        assert_eq!(thirds(30), [10, 10, 10]);
        assert_eq!(thirds(28), [10, 9, 9]);
        assert_eq!(thirds(29), [10, 10, 9]);
        assert_eq!(thirds(24), [8, 8, 8]);
        assert_eq!(thirds(3), [1, 1, 1]);
        assert_eq!(thirds(30).iter().sum::<usize>(), 30);
    }
}
