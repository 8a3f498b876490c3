//! A small network lab for the bad-network tests: one network namespace per host (`ip netns add`),
//! each with a TUN device `dc0` at `10.77.0.N/24`, and one forwarding thread in this process that
//! carries every IPv4 packet from the TUN it left by to the TUN of its destination — after a delay,
//! or not at all (random loss, a cut link). It stands where `tc netem` would, because this machine's
//! kernel has no `sch_netem`: the processes under test still talk through their own kernel's UDP
//! and TCP stacks, across namespaces, only the wire between them is this thread.
//!
//! The lab needs root (namespaces, TUN devices). Everything it made is removed when it drops.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the wire does to packets now; changed while the lab runs.
#[derive(Clone, Debug, Default)]
pub(crate) struct Faults {
    /// Added to every packet, each direction.
    pub(crate) delay: Duration,
    /// The chance that a packet is dropped.
    pub(crate) loss: f64,
    /// Every packet to or from this host (index) is dropped until this instant.
    pub(crate) cut: Option<(usize, Instant)>,
}

pub(crate) struct Lab {
    names: Vec<String>,
    faults: Arc<Mutex<Faults>>,
    stop: Arc<AtomicBool>,
    forwarder: Option<std::thread::JoinHandle<()>>,
    /// Packets carried and dropped so far.
    counts: Arc<Mutex<(u64, u64)>>,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("`ip` (iproute2) is needed for the namespace tests: {e}"));
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

impl Lab {
    /// `hosts` namespaces named `{tag}-{i}`, host `i` at `10.77.0.{i + 1}`.
    pub(crate) fn new(tag: &str, hosts: usize, faults: Faults) -> Self {
        let names: Vec<String> = (0..hosts)
            .map(|i| format!("dc{}-{tag}-{i}", std::process::id()))
            .collect();
        for (i, ns) in names.iter().enumerate() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
            ip(&["netns", "add", ns]);
            let addr = format!("10.77.0.{}/24", i + 1);
            for args in [
                &["link", "set", "lo", "up"][..],
                &["tuntap", "add", "dev", "dc0", "mode", "tun"],
                &["addr", "add", &addr, "dev", "dc0"],
                &["link", "set", "dc0", "up"],
            ] {
                let mut all = vec!["netns", "exec", ns, "ip"];
                all.extend_from_slice(args);
                ip(&all);
            }
        }
        let faults = Arc::new(Mutex::new(faults));
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Mutex::new((0, 0)));
        let (tx, rx) = std::sync::mpsc::channel();
        let forwarder = {
            let (names, faults, stop, counts) =
                (names.clone(), faults.clone(), stop.clone(), counts.clone());
            std::thread::spawn(move || {
                // This thread enters each namespace in turn to attach to its TUN device; the file
                // stays attached to that device wherever the thread goes next.
                let tuns: Vec<File> = names.iter().map(|ns| attach(ns)).collect();
                tx.send(()).unwrap();
                forward(&tuns, &faults, &stop, &counts);
            })
        };
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the forwarder attached to every TUN device");
        Self {
            names,
            faults,
            stop,
            forwarder: Some(forwarder),
            counts,
        }
    }

    /// The namespace of host `i`.
    pub(crate) fn ns(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// The address of host `i`.
    pub(crate) fn addr(i: usize) -> String {
        format!("10.77.0.{}", i + 1)
    }

    pub(crate) fn set(&self, change: impl FnOnce(&mut Faults)) {
        change(&mut self.faults.lock().unwrap());
    }

    /// Packets carried and dropped so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        *self.counts.lock().unwrap()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(f) = self.forwarder.take() {
            let _ = f.join();
        }
        for ns in &self.names {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// Open `/dev/net/tun` inside namespace `ns` and attach to its `dc0`.
fn attach(ns: &str) -> File {
    let target = File::open(format!("/var/run/netns/{ns}")).expect("the namespace file");
    // SAFETY: setns on this thread only, with a namespace file descriptor it holds.
    let entered = unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(
        entered,
        0,
        "setns into {ns}: {}",
        std::io::Error::last_os_error()
    );
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .expect("/dev/net/tun");
    // SAFETY: an all-zero ifreq is valid; the name fits IFNAMSIZ with its NUL.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(b"dc0") {
        *d = *s as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads (and writes back) the ifreq it is given, which lives for the call.
    let attached = unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut req) };
    assert_eq!(
        attached,
        0,
        "TUNSETIFF dc0 in {ns}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: fcntl on a descriptor this function owns.
    unsafe {
        let flags = libc::fcntl(tun.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(tun.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    tun
}

/// Carry packets between the TUN devices until `stop`.
fn forward(tuns: &[File], faults: &Mutex<Faults>, stop: &AtomicBool, counts: &Mutex<(u64, u64)>) {
    let mut queue: VecDeque<(Instant, usize, Vec<u8>)> = VecDeque::new();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while queue.front().is_some_and(|(at, ..)| *at <= now) {
            let (_, to, packet) = queue.pop_front().unwrap();
            let _ = (&tuns[to]).write(&packet);
        }
        let wait = queue
            .front()
            .map_or(Duration::from_millis(5), |(at, ..)| {
                at.saturating_duration_since(now)
            })
            .min(Duration::from_millis(5));
        let mut fds: Vec<libc::pollfd> = tuns
            .iter()
            .map(|t| libc::pollfd {
                fd: t.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: poll over descriptors this function's caller keeps open for the call.
        unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                wait.as_millis().max(1) as libc::c_int,
            )
        };
        for (from, fd) in fds.iter().enumerate() {
            if fd.revents & libc::POLLIN == 0 {
                continue;
            }
            while let Ok(n) = (&tuns[from]).read(&mut buf) {
                let packet = &buf[..n];
                // IPv4 to 10.77.0.N only; anything else (IPv6 router chatter) goes nowhere.
                if n < 20 || packet[0] >> 4 != 4 || packet[16..19] != [10, 77, 0] {
                    continue;
                }
                let to = usize::from(packet[19]).wrapping_sub(1);
                if to >= tuns.len() {
                    continue;
                }
                let f = faults.lock().unwrap().clone();
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let cut = f
                    .cut
                    .is_some_and(|(h, until)| (h == from || h == to) && Instant::now() < until);
                let lost = (rng >> 11) as f64 / (1u64 << 53) as f64 <= f.loss && f.loss > 0.0;
                let mut c = counts.lock().unwrap();
                if cut || lost {
                    c.1 += 1;
                    continue;
                }
                c.0 += 1;
                queue.push_back((Instant::now() + f.delay, to, packet.to_vec()));
            }
        }
    }
}
