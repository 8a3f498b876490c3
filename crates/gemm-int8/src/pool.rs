//! The GEMM's compute threads: a persistent pool whose workers spin for the next call for a short
//! while before they park, so back-to-back calls (decode runs seven GEMMs per layer per token) pay
//! no futex wake-up each, as a sleeping rayon worker would.
//!
//! One caller at a time uses the pool; a call that finds it busy (GEMMs issued from several threads
//! at once, as attention's heads are) runs on its own thread. A job is a closure that every
//! participating thread runs once; it shares its work out through its own atomic counter, so a
//! worker that is late (descheduled by other load on the machine) only means the others take more
//! chunks. The caller never waits for a worker that has not joined: it closes the job, then waits
//! only for those that joined.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins for the next job before it parks.
const SPIN: Duration = Duration::from_micros(300);

/// How long an idle worker still spins after [`rest`] before it parks: the hand-off of a lap to the
/// next stage (the step's last additions, encrypting the activation, `sendto`, the next stage's
/// first reads), during which this core staying busy keeps that hand-off on one core. Linux wakes
/// the next stage's thread on an idle core when there is one, and on the sender's core (about to
/// sleep) when there is none; with this core parked at once, a hop moved the lap to the other core
/// and woke it from a halt, and a stage's own data crossed between the cores from step to step.
/// On a host that placed this guest's two vCPUs on different core complexes (a cache line between
/// them 350-400 ns against 75-140 ns on one), that made the ring's three hops 0.31-0.37 ms a lap
/// against 0.22-0.26 ms lingering 150 µs; on one complex the two were alike. The worker yields while
/// it spins, so a thread that wants this core meanwhile — the next stage's worker — gets it.
const REST_LINGER: Duration = Duration::from_micros(150);

/// A job as the workers see it: a pointer to the caller's `&dyn Fn()` (on the caller's stack).
type JobRef<'a> = &'a (dyn Fn(Side) + Sync);

/// `ticket` bits: the job's epoch in the high 32, a closed flag, and the number of workers inside.
const CLOSED: u64 = 1 << 31;
const INSIDE: u64 = CLOSED - 1;

pub(crate) struct Pool {
    /// Threads a job runs on, the caller included.
    threads: usize,
    busy: AtomicBool,
    ticket: AtomicU64,
    job: AtomicPtr<()>,
    /// A worker's job panicked (re-raised on the caller).
    panicked: AtomicBool,
    sleepers: AtomicUsize,
    /// Set by [`rest`]: idle workers park after [`REST_LINGER`] instead of [`SPIN`]; cleared by the
    /// next job.
    resting: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
    /// Memory an idle worker reads ahead of the next GEMM ([`prefetch`]): the runs (address,
    /// length, and what keeps the memory alive), and a count that changes when runs are added.
    ahead: Mutex<Vec<ReadAhead>>,
    ahead_epoch: AtomicU64,
    /// Bumped by [`wake`]: parked workers get up and wait for a job (spinning, then parked again).
    kicks: AtomicU64,
    /// One per worker: where it is steered when woken (see [`Steer`]).
    steer: Box<[Steer]>,
}

static POOL: OnceLock<&'static Pool> = OnceLock::new();

/// The process's pool, started on first use with as many threads as rayon's (so `RAYON_NUM_THREADS`
/// sizes both).
pub(crate) fn pool() -> &'static Pool {
    POOL.get_or_init(|| Pool::start(rayon::current_num_threads().max(1)))
}

impl Pool {
    /// A pool of `threads` threads, the caller included, that lives as long as the process.
    fn start(threads: usize) -> &'static Pool {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            threads,
            busy: AtomicBool::new(false),
            ticket: AtomicU64::new(CLOSED),
            job: AtomicPtr::new(std::ptr::null_mut()),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            resting: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            ahead: Mutex::new(Vec::new()),
            ahead_epoch: AtomicU64::new(0),
            kicks: AtomicU64::new(0),
            steer: (1..threads).map(|_| Steer::default()).collect(),
        }));
        for i in 1..threads {
            let spawned = std::thread::Builder::new()
                .name(format!("gemm-int8-{i}"))
                .spawn(move || pool.worker(&pool.steer[i - 1]));
            if spawned.is_err() {
                // Fewer workers only means the caller does more of each job.
                break;
            }
        }
        pool
    }

    /// Threads a job may run on, the caller included.
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// Run `f` on the calling thread and on every worker that is free to join, and return when all
    /// of them have finished it. `f` must share out its work itself (every thread runs it once).
    pub(crate) fn run(&self, f: &(dyn Fn(Side) + Sync)) {
        if self.threads == 1
            || self
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            f(Side::Front);
            return;
        }
        self.resting.store(false, Ordering::Relaxed);
        let job: JobRef<'_> = f;
        self.job
            .store((&raw const job).cast_mut().cast(), Ordering::Relaxed);
        let epoch = (self.ticket.load(Ordering::Relaxed) >> 32).wrapping_add(1) & 0xFFFF_FFFF;
        // SeqCst pairs with the SeqCst `sleepers` increment and ticket load in `wait`: either a
        // parking worker sees the new ticket, or this thread sees it parking and wakes it.
        self.ticket.store(epoch << 32, Ordering::SeqCst);
        self.wake_parked();
        let mine = catch_unwind(AssertUnwindSafe(|| f(Side::Front)));
        // No worker may join from now on; wait for those inside to leave, after which nothing
        // refers to `job` or `f` any more.
        self.ticket.fetch_or(CLOSED, Ordering::AcqRel);
        let mut spins = 0u32;
        while self.ticket.load(Ordering::Acquire) & INSIDE != 0 {
            // A worker that was preempted inside the job (other load on the machine, possibly on
            // this very core) needs a core to finish: after a short spin, give it this one.
            spins = spins.saturating_add(1);
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let theirs = self.panicked.swap(false, Ordering::Relaxed);
        self.busy.store(false, Ordering::Release);
        if let Err(payload) = mine {
            resume_unwind(payload);
        }
        assert!(!theirs, "a gemm-int8 worker panicked");
    }

    fn worker(&self, steer: &Steer) {
        steer.start();
        let mut seen = self.ticket.load(Ordering::Acquire) >> 32;
        // The runs this worker reads ahead, swapped with the pool's list (which thus keeps a
        // list's capacity: no allocation per `prefetch` in the token loop).
        let mut runs = Vec::new();
        loop {
            let mut ticket = self.wait(seen, steer, &mut runs);
            seen = ticket >> 32;
            // Join unless the job has closed meanwhile.
            loop {
                if ticket >> 32 != seen || ticket & CLOSED != 0 {
                    break;
                }
                match self.ticket.compare_exchange_weak(
                    ticket,
                    ticket + 1,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let job = self.job.load(Ordering::Relaxed).cast::<JobRef<'_>>();
                        // SAFETY: joining an open job (the Acquire above synchronizes with the
                        // caller's store of `job` before it opened the ticket) keeps the caller
                        // inside `run`, so `job` and the closure it points to are alive until the
                        // decrement below.
                        let f = unsafe { *job };
                        if catch_unwind(AssertUnwindSafe(|| f(Side::Back))).is_err() {
                            self.panicked.store(true, Ordering::Relaxed);
                        }
                        self.ticket.fetch_sub(1, Ordering::Release);
                        break;
                    }
                    Err(now) => ticket = now,
                }
            }
        }
    }

    /// Wait for a ticket of an epoch other than `seen` that is still open: spin (yielding now and
    /// then, so other threads on a busy machine get the core), then park.
    fn wait(&self, mut seen: u64, steer: &Steer, runs: &mut Vec<ReadAhead>) -> u64 {
        let mut start = Instant::now();
        let mut spins = 0u32;
        let mut ahead_seen = self.ahead_epoch.load(Ordering::Relaxed);
        loop {
            let ticket = self.ticket.load(Ordering::Acquire);
            if ticket >> 32 != seen {
                if ticket & CLOSED == 0 {
                    return ticket;
                }
                seen = ticket >> 32; // a job that ended without this worker
            }
            let epoch = self.ahead_epoch.load(Ordering::Relaxed);
            if epoch != ahead_seen {
                ahead_seen = epoch;
                self.read_ahead(seen, runs);
                start = Instant::now();
                continue;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) {
                continue;
            }
            let spin = if self.resting.load(Ordering::Relaxed) {
                REST_LINGER
            } else {
                SPIN
            };
            if start.elapsed() < spin {
                std::thread::yield_now();
                continue;
            }
            steer.parked.store(true, Ordering::SeqCst);
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let kicks = self.kicks.load(Ordering::SeqCst);
            let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            while self.ticket.load(Ordering::SeqCst) >> 32 == seen
                && self.kicks.load(Ordering::SeqCst) == kicks
            {
                guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            drop(guard);
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
            steer.woken();
            start = Instant::now();
        }
    }
}

impl Pool {
    /// Take the runs of memory asked for by [`prefetch`] and bring them towards this core's caches,
    /// until they are done or a job of an epoch other than `seen` opens. `runs` is empty, and is
    /// left so.
    fn read_ahead(&self, seen: u64, runs: &mut Vec<ReadAhead>) {
        std::mem::swap(
            runs,
            &mut *self.ahead.lock().unwrap_or_else(|e| e.into_inner()),
        );
        // Leaving early drops the runs not read (the drain empties `runs` either way).
        for (start, len, keep) in runs.drain(..) {
            let mut at = start;
            while at < start + len {
                if self.ticket.load(Ordering::Relaxed) >> 32 != seen {
                    return;
                }
                let end = (at + READ_AHEAD_STEP).min(start + len);
                while at < end {
                    if keep.is_some() {
                        // SAFETY: the run lies inside the memory `keep` holds alive (see
                        // `prefetch`), which is only ever read once written.
                        unsafe { std::ptr::read_volatile(at as *const u8) };
                    } else {
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: a prefetch is a hint: it never faults, whatever the address.
                        unsafe {
                            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                                at as *const i8,
                            );
                        }
                    }
                    at += 64;
                }
            }
        }
    }
}

/// Bytes read ahead between two looks for a job.
const READ_AHEAD_STEP: usize = 4096;

/// A run of memory to read ahead: its address, its length, and the shared bytes it lies in (held
/// until it has been read, so that the worker may load from it).
type ReadAhead = (usize, usize, Option<crate::SharedBytes>);

/// Ask an idle worker (one spinning for the next job) to bring `w`'s lines towards the caches while
/// the caller does other work, so that the next GEMM finds them there. A worker that is parked, or
/// a job that starts, drops what is left. Nothing is read that a result depends on.
///
/// Where the lines lie in shared bytes (an arena, a kept shard), the worker loads a byte of every
/// cache line, holding the bytes alive until it has read them: software prefetches are dropped
/// once the core's misses in flight run out, so a run of them issued back to back brings in a
/// small part of a megabyte, while loads wait their turn and keep memory busy for as long as the
/// caller's other work lasts (decode's products then took 4–7 % less time in alternating runs).
/// Lines the handle owns itself, which may be freed meanwhile, get prefetch hints, which never
/// fault.
pub(crate) fn prefetch(w: &crate::PackedWeights) {
    let Some(pool) = POOL.get() else { return };
    let bytes: &[u8] = bytemuck::cast_slice(w.lines());
    if pool.threads < 2 || bytes.is_empty() || !cfg!(target_arch = "x86_64") {
        return;
    }
    // The lines lie inside the bytes that own them, which the run holds until it is read.
    let keep = w.lines_owner();
    pool.ahead.lock().unwrap_or_else(|e| e.into_inner()).push((
        bytes.as_ptr() as usize,
        bytes.len(),
        keep,
    ));
    pool.ahead_epoch.fetch_add(1, Ordering::Relaxed);
}

/// Wake parked workers (off the calling thread's CPU) so that they are up when the next job comes:
/// for a caller that knows its next GEMM is near but has other work first.
pub(crate) fn wake() {
    if let Some(pool) = POOL.get() {
        pool.kick();
    }
}

impl Pool {
    /// [`wake`] for this pool.
    fn kick(&self) {
        self.resting.store(false, Ordering::Relaxed);
        // SeqCst pairs with a parking worker's `sleepers` increment and `kicks` load, as in `run`.
        self.kicks.fetch_add(1, Ordering::SeqCst);
        self.wake_parked();
    }

    /// Wake the workers that are parked, each kept off this thread's CPU ([`Steer`]). After a
    /// SeqCst store that a parking worker checks (a ticket, a kick).
    fn wake_parked(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let here = affinity::current_cpu();
            for s in &self.steer {
                s.away_from(here);
            }
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_all();
        }
    }
}

/// Let the pool's idle workers park after [`REST_LINGER`] instead of spinning [`SPIN`] for the next
/// job (which wakes them): for a caller that knows its next GEMM is far off. Does not start the pool.
pub(crate) fn rest() {
    if let Some(pool) = POOL.get() {
        pool.resting.store(true, Ordering::Relaxed);
    }
}

/// Which end of a job's work a thread takes from: the caller the front, the workers the back.
///
/// Successive jobs over the same rows (quantize, multiply, dequantize) thus leave the first rows
/// with the caller and the last with a worker, so rows stay in one core's cache from phase to
/// phase: moving a line between cores costs as much as a trip to memory here.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Front,
    Back,
}

/// `0..count` consumed from both ends: `front` in the low 32 bits, `back` in the high.
struct Ends(AtomicU64);

/// The most items [`Ends`] holds (a larger job runs on the calling thread alone).
const MAX_COUNT: usize = u32::MAX as usize;

impl Ends {
    /// `count ≤ MAX_COUNT`.
    fn new(count: usize) -> Self {
        Self(AtomicU64::new((count as u64) << 32))
    }

    /// Take a run from `side`: `size(left)` items of those left (at least one); `None` once all
    /// are taken.
    fn take(&self, side: Side, size: impl Fn(u64) -> u64) -> Option<(usize, usize)> {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let (front, back) = (cur & 0xFFFF_FFFF, cur >> 32);
            if front >= back {
                return None;
            }
            let n = size(back - front).clamp(1, back - front);
            let (next, run) = match side {
                Side::Front => (cur + n, (front, front + n)),
                Side::Back => (cur - (n << 32), (back - n, back)),
            };
            match self
                .0
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some((run.0 as usize, run.1 as usize)),
                Err(now) => cur = now,
            }
        }
    }
}

/// Run `f(chunk)` for every chunk in `0..count` on the pool (on the calling thread alone when
/// `count < 2`), chunks taken one at a time from both ends.
pub(crate) fn for_each_chunk(count: usize, f: impl Fn(usize) + Sync) {
    if !(2..=MAX_COUNT).contains(&count) {
        (0..count).for_each(f);
        return;
    }
    let ends = Ends::new(count);
    pool().run(&|side| {
        while let Some((c, _)) = ends.take(side, |_| 1) {
            f(c);
        }
    });
}

/// Run `f` on every item, the items shared out over the pool.
pub(crate) fn for_each_item<T: Send>(items: Vec<T>, f: impl Fn(T) + Sync) {
    let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|i| Mutex::new(Some(i))).collect();
    for_each_chunk(slots.len(), |c| {
        let item = slots[c].lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(item) = item {
            f(item);
        }
    });
}

/// Rows per chunk when `rows × cols` element-wise work is shared out: about four chunks per thread
/// of at least `min / 4` elements each; `rows` (one chunk) when there are fewer than `min`
/// elements.
pub(crate) fn rows_per_chunk(rows: usize, cols: usize, min: usize) -> usize {
    let threads = pool().threads();
    if threads < 2 || rows < 2 || rows * cols < min {
        return rows.max(1);
    }
    let by_size = (min / 4).div_ceil(cols.max(1));
    rows.div_ceil(4 * threads).max(by_size).max(1)
}

/// Run `f(i0, i1)` over runs `[i0, i1)` that together cover `0..count`, on the pool, taken from
/// both ends: each take is `left / (2 · threads)` items (at least one), so runs shrink as the work
/// runs out and the threads end close together (guided scheduling).
pub(crate) fn for_each_guided(count: usize, f: impl Fn(usize, usize) + Sync) {
    let pool = pool();
    if !(2..=MAX_COUNT).contains(&count) || pool.threads() < 2 {
        if count > 0 {
            f(0, count);
        }
        return;
    }
    let share = 2 * pool.threads() as u64;
    let ends = Ends::new(count);
    pool.run(&|side| {
        while let Some((i0, i1)) = ends.take(side, |left| left / share) {
            f(i0, i1);
        }
    });
}

/// Element types whose all-zero bit pattern is the value zero.
///
/// # Safety
/// Every implementor must be valid, and zero, when all its bytes are 0.
pub(crate) unsafe trait ZeroBits: Copy + Default + Send {}
// SAFETY: integers and IEEE floats are 0 (or +0.0) when all bits are 0.
unsafe impl ZeroBits for i8 {}
// SAFETY: as above.
unsafe impl ZeroBits for u8 {}
// SAFETY: as above.
unsafe impl ZeroBits for f32 {}

/// `rows × cols` zeros, written in chunks of `per` rows shared out from both ends like the rows job
/// that will fill them (see [`Side`]), so that each row's lines are first written on the core that
/// fills them, not pulled over from the core that zeroed them.
pub(crate) fn zeroed_rows<T: ZeroBits>(rows: usize, cols: usize, per: usize) -> Vec<T> {
    let len = rows * cols;
    if per == 0 || per >= rows || len == 0 {
        return vec![T::default(); len];
    }
    let mut v: Vec<T> = Vec::with_capacity(len);
    struct Base<T>(*mut T);
    impl<T> Base<T> {
        /// Zero rows `[r0, r1)`.
        ///
        /// # Safety
        /// The rows must lie inside the allocation and no other thread may touch them meanwhile.
        unsafe fn zero(&self, r0: usize, r1: usize, cols: usize) {
            // SAFETY: forwarded from the caller; zero bytes are a valid `T` (`ZeroBits`).
            unsafe { self.0.add(r0 * cols).write_bytes(0, (r1 - r0) * cols) };
        }
    }
    // SAFETY: the pointer is only used for disjoint writes (one chunk of rows per call).
    unsafe impl<T> Sync for Base<T> {}
    let base = Base(v.as_mut_ptr());
    for_each_chunk(rows.div_ceil(per), |c| {
        let (r0, r1) = (c * per, ((c + 1) * per).min(rows));
        // SAFETY: rows [r0, r1) lie inside the capacity of `v` (rows × cols elements) and chunks
        // are disjoint.
        unsafe { base.zero(r0, r1, cols) };
    });
    // SAFETY: every chunk of rows, so every element, was written above.
    unsafe { v.set_len(len) };
    v
}

/// Where a parked worker may wake. Linux places a woken thread on its waker's CPU, queued behind
/// it, when the cache domain looks busy on average (its scan for an idle CPU is cut short), and a
/// ring member's compute keeps it busy: a member's worker, parked while the lap was elsewhere, then
/// waited behind its own caller for the whole step (1.5-2 ms, a tenth of the steps or more) while
/// the other core idled. The caller therefore keeps a parked worker off its own CPU for the wake-up
/// (its affinity without that CPU), and the worker takes back the process's affinity once it runs.
#[derive(Default)]
struct Steer {
    tid: std::sync::atomic::AtomicI32,
    parked: AtomicBool,
    /// Its affinity was narrowed for a wake-up.
    narrowed: AtomicBool,
    /// The affinity the worker started with.
    allowed: OnceLock<affinity::CpuSet>,
    /// Times it got up from parking (for the tests).
    #[cfg(test)]
    wakes: AtomicU64,
}

impl Steer {
    /// On the worker's thread, before its first job.
    fn start(&self) {
        // The thread id first: `allowed` being set is what says the worker can be steered.
        self.tid.store(affinity::tid(), Ordering::Relaxed);
        if let Some(set) = affinity::get() {
            let _ = self.allowed.set(set);
        }
    }

    /// On the caller, before waking the workers: keep this worker, if parked, off `cpu`.
    fn away_from(&self, cpu: Option<usize>) {
        let (Some(cpu), Some(allowed)) = (cpu, self.allowed.get()) else {
            return;
        };
        let tid = self.tid.load(Ordering::Relaxed);
        // (0 would name the calling thread.)
        if tid == 0 || !self.parked.load(Ordering::SeqCst) {
            return;
        }
        if let Some(narrow) = allowed.without(cpu) {
            // Marked first: a worker that wakes meanwhile (a spurious wake-up) takes its affinity
            // back at once, or at its next wake-up if this narrowing lands after that.
            self.narrowed.store(true, Ordering::Relaxed);
            affinity::set(tid, &narrow);
        }
    }

    /// On the worker's thread, once it runs again.
    fn woken(&self) {
        #[cfg(test)]
        self.wakes.fetch_add(1, Ordering::Relaxed);
        self.parked.store(false, Ordering::SeqCst);
        if self.narrowed.swap(false, Ordering::Relaxed)
            && let Some(allowed) = self.allowed.get()
        {
            affinity::set(0, allowed);
        }
    }
}

#[cfg(target_os = "linux")]
mod affinity {
    /// A set of CPUs, as `sched_setaffinity` takes it.
    pub(super) struct CpuSet(libc::cpu_set_t);

    // SAFETY: a plain bit set.
    unsafe impl Send for CpuSet {}
    unsafe impl Sync for CpuSet {}

    impl CpuSet {
        /// The set without `cpu`; `None` if that leaves it empty or `cpu` is not in it.
        pub(super) fn without(&self, cpu: usize) -> Option<CpuSet> {
            let mut set = self.0;
            // SAFETY (the three blocks): bit operations on a set, `cpu` below its size.
            if cpu >= libc::CPU_SETSIZE as usize || !unsafe { libc::CPU_ISSET(cpu, &set) } {
                return None;
            }
            unsafe { libc::CPU_CLR(cpu, &mut set) };
            (unsafe { libc::CPU_COUNT(&set) } > 0).then_some(CpuSet(set))
        }

        /// Whether `cpu` is in the set.
        #[cfg(test)]
        pub(super) fn has(&self, cpu: usize) -> bool {
            // SAFETY: a bit test, `cpu` below the set's size.
            cpu < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu, &self.0) }
        }
    }

    /// The calling thread's affinity.
    pub(super) fn get() -> Option<CpuSet> {
        of(0)
    }

    /// Thread `tid`'s affinity (0: the calling thread).
    pub(super) fn of(tid: i32) -> Option<CpuSet> {
        // SAFETY: a zeroed cpu_set_t is an empty set; the call writes at most its size.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let r = unsafe {
            libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set)
        };
        (r == 0).then_some(CpuSet(set))
    }

    /// Set thread `tid`'s affinity (0: the calling thread); whether it took.
    pub(super) fn set(tid: i32, set: &CpuSet) -> bool {
        // SAFETY: reads `size_of::<cpu_set_t>()` bytes of `set`.
        unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set.0) == 0 }
    }

    pub(super) fn tid() -> i32 {
        // SAFETY: no preconditions.
        unsafe { libc::gettid() }
    }

    /// The CPU the calling thread runs on now.
    pub(super) fn current_cpu() -> Option<usize> {
        // SAFETY: no preconditions.
        usize::try_from(unsafe { libc::sched_getcpu() }).ok()
    }
}

#[cfg(not(target_os = "linux"))]
mod affinity {
    /// Affinity is left to the system here.
    pub(super) struct CpuSet;

    impl CpuSet {
        pub(super) fn without(&self, _cpu: usize) -> Option<CpuSet> {
            None
        }
    }

    pub(super) fn get() -> Option<CpuSet> {
        None
    }

    pub(super) fn set(_tid: i32, _set: &CpuSet) -> bool {
        false
    }

    pub(super) fn tid() -> i32 {
        0
    }

    pub(super) fn current_cpu() -> Option<usize> {
        None
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Wait up to two seconds for `ready`.
    fn until(ready: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        while !ready() {
            if start.elapsed() > Duration::from_secs(2) {
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        true
    }

    /// A pool of two threads whose worker has run a job and parked.
    fn parked_pool() -> &'static Pool {
        let pool = Pool::start(2);
        pool.run(&|_| {});
        pool.resting.store(true, Ordering::Relaxed);
        let steer = &pool.steer[0];
        assert!(
            until(|| steer.parked.load(Ordering::SeqCst)),
            "the worker never parked"
        );
        pool
    }

    #[test]
    fn a_parked_worker_is_woken_off_the_callers_cpu_and_takes_back_its_affinity() {
        let pool = parked_pool();
        let steer = &pool.steer[0];
        let allowed = steer.allowed.get().expect("the worker's affinity");
        let tid = steer.tid.load(Ordering::Relaxed);
        let cpu = (0..libc::CPU_SETSIZE as usize)
            .find(|&c| allowed.has(c))
            .expect("a CPU");
        let several = allowed.without(cpu).is_some();

        // The waker keeps the parked worker off its CPU (if the process may run elsewhere).
        steer.away_from(Some(cpu));
        let narrowed = affinity::of(tid).expect("the worker's affinity");
        assert_eq!(
            narrowed.has(cpu),
            !several,
            "CPU {cpu} while the worker is parked"
        );

        // Woken by a job it joins, it takes back every CPU it had.
        let joined = AtomicBool::new(false);
        pool.run(&|side| {
            if side == Side::Back {
                joined.store(true, Ordering::Release);
            } else {
                until(|| joined.load(Ordering::Acquire));
            }
        });
        assert!(joined.load(Ordering::Acquire), "the worker never joined");
        let back = affinity::of(tid).expect("the worker's affinity");
        assert!((0..libc::CPU_SETSIZE as usize).all(|c| back.has(c) == allowed.has(c)));
        assert!(!steer.narrowed.load(Ordering::Relaxed));
    }

    #[test]
    fn a_kick_gets_a_parked_worker_up_before_any_job() {
        let pool = parked_pool();
        let steer = &pool.steer[0];
        let wakes = steer.wakes.load(Ordering::Relaxed);
        pool.kick();
        assert!(
            until(|| steer.wakes.load(Ordering::Relaxed) > wakes),
            "the worker stayed parked"
        );
        // With nothing to do it parks again.
        assert!(
            until(|| steer.parked.load(Ordering::SeqCst)),
            "the worker never parked again"
        );
    }
}
