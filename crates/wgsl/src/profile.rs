//! Where a GPU backend's time goes: per submission (one or several dispatches), the host's part up
//! to the submission (writing A (and an activation B) into the queue, the bind groups, the command
//! buffer, the submission), the wait for the GPU (kernel and copy to the read-back buffer),
//! and the read-back (mapping and copying the accumulators out). Counters only; no effect on results.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Running totals of one backend's dispatches.
#[derive(Default, Debug)]
pub(crate) struct Profile {
    submissions: AtomicU64,
    gemv: AtomicU64,
    tiled: AtomicU64,
    on_cpu: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    prepare_ns: AtomicU64,
    submit_ns: AtomicU64,
    wait_ns: AtomicU64,
    readback_ns: AtomicU64,
    cpu_ns: AtomicU64,
    /// GPU time by kernel (dispatches, nanoseconds), where the device times dispatches.
    kernels: Mutex<BTreeMap<String, (u64, u64)>>,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Profile {
    /// One submission of `jobs` dispatches (`gemv` of them `gemv`): bytes sent and read back, and
    /// its [prepare (part of submit), submit, wait, read-back] times.
    pub(crate) fn add(&self, jobs: usize, gemv: usize, up: u64, down: u64, times: [Duration; 4]) {
        self.prepare_ns
            .fetch_add(nanos(times[0]), Ordering::Relaxed);
        let times = [times[1], times[2], times[3]];
        self.submissions.fetch_add(1, Ordering::Relaxed);
        self.gemv.fetch_add(gemv as u64, Ordering::Relaxed);
        self.tiled
            .fetch_add((jobs - gemv) as u64, Ordering::Relaxed);
        self.bytes_up.fetch_add(up, Ordering::Relaxed);
        self.bytes_down.fetch_add(down, Ordering::Relaxed);
        self.submit_ns.fetch_add(nanos(times[0]), Ordering::Relaxed);
        self.wait_ns.fetch_add(nanos(times[1]), Ordering::Relaxed);
        self.readback_ns
            .fetch_add(nanos(times[2]), Ordering::Relaxed);
    }

    /// One product small enough to run on the CPU kernels instead.
    pub(crate) fn add_cpu(&self, time: Duration) {
        self.on_cpu.fetch_add(1, Ordering::Relaxed);
        self.cpu_ns.fetch_add(nanos(time), Ordering::Relaxed);
    }

    /// Dispatches timed on the GPU: (kernel, nanoseconds) each.
    pub(crate) fn add_kernels(&self, timed: impl IntoIterator<Item = (String, u64)>) {
        let mut kernels = self.kernels.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, ns) in timed {
            let e = kernels.entry(name).or_default();
            e.0 += 1;
            e.1 += ns;
        }
    }

    pub(crate) fn snapshot(&self) -> GpuProfile {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let secs = |c: &AtomicU64| get(c) as f64 / 1e9;
        GpuProfile {
            submissions: get(&self.submissions),
            gemv_dispatches: get(&self.gemv),
            tiled_dispatches: get(&self.tiled),
            cpu_products: get(&self.on_cpu),
            bytes_up: get(&self.bytes_up),
            bytes_down: get(&self.bytes_down),
            prepare_s: secs(&self.prepare_ns),
            submit_s: secs(&self.submit_ns),
            wait_s: secs(&self.wait_ns),
            readback_s: secs(&self.readback_ns),
            cpu_s: secs(&self.cpu_ns),
            kernels: {
                let kernels = self.kernels.lock().unwrap_or_else(PoisonError::into_inner);
                let mut v: Vec<(String, u64, f64)> = kernels
                    .iter()
                    .map(|(k, (n, ns))| (k.clone(), *n, *ns as f64 / 1e9))
                    .collect();
                v.sort_by(|a, b| b.2.total_cmp(&a.2));
                v
            },
        }
    }

    pub(crate) fn reset(&self) {
        for c in [
            &self.submissions,
            &self.gemv,
            &self.tiled,
            &self.on_cpu,
            &self.bytes_up,
            &self.bytes_down,
            &self.prepare_ns,
            &self.submit_ns,
            &self.wait_ns,
            &self.readback_ns,
            &self.cpu_ns,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        self.kernels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// A copy of a backend's counters since it was made or last reset.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuProfile {
    /// Submissions, each one round trip (several dispatches where products were batched).
    pub submissions: u64,
    /// Dispatches of the `gemv` entry point.
    pub gemv_dispatches: u64,
    /// Dispatches of the `tiled` entry point.
    pub tiled_dispatches: u64,
    /// Products small enough that the CPU kernels ran them (a round trip costs more).
    pub cpu_products: u64,
    /// Bytes written to the device per call (A, and B when it is an activation).
    pub bytes_up: u64,
    /// Bytes of accumulators read back.
    pub bytes_down: u64,
    /// Seconds from a submission's start to its submission (queue writes, bind groups, encoding).
    pub submit_s: f64,
    /// The part of `submit_s` spent writing operands into the queue and making bind groups.
    pub prepare_s: f64,
    /// Seconds waiting for the GPU (kernel and the copy to the read-back buffer).
    pub wait_s: f64,
    /// Seconds mapping and copying accumulators out.
    pub readback_s: f64,
    /// Seconds of the products run on the CPU.
    pub cpu_s: f64,
    /// GPU time by kernel, most first: (kernel, dispatches, seconds); empty unless the device
    /// times dispatches (`DAISY_GPU_TIMESTAMPS=1`).
    pub kernels: Vec<(String, u64, f64)>,
}

impl GpuProfile {
    /// GPU dispatches of both entry points.
    pub fn dispatches(&self) -> u64 {
        self.gemv_dispatches + self.tiled_dispatches
    }
}

impl std::fmt::Display for GpuProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per = |s: f64| s * 1e6 / self.submissions.max(1) as f64;
        write!(
            f,
            "{} submissions of {} dispatches ({} gemv, {} tiled), {} products on the CPU ({:.3} s); \
             per submission: submit {:.0} µs (writes and bind groups {:.0} µs), wait {:.0} µs, \
             read-back {:.0} µs \
             ({:.3} s, {:.3} s, {:.3} s in all); {:.1} MB up, {:.1} MB down",
            self.submissions,
            self.dispatches(),
            self.gemv_dispatches,
            self.tiled_dispatches,
            self.cpu_products,
            self.cpu_s,
            per(self.submit_s),
            per(self.prepare_s),
            per(self.wait_s),
            per(self.readback_s),
            self.submit_s,
            self.wait_s,
            self.readback_s,
            self.bytes_up as f64 / 1e6,
            self.bytes_down as f64 / 1e6,
        )?;
        if !self.kernels.is_empty() {
            let total: f64 = self.kernels.iter().map(|k| k.2).sum();
            write!(f, "; GPU time {:.3} s by kernel:", total)?;
            for (i, (name, n, s)) in self.kernels.iter().enumerate() {
                write!(
                    f,
                    "{} {name} {:.1}% ({n} × {:.1} µs)",
                    if i == 0 { "" } else { "," },
                    100.0 * s / total.max(1e-12),
                    s * 1e6 / (*n).max(1) as f64
                )?;
            }
        }
        Ok(())
    }
}
