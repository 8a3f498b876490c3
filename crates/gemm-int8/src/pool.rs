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

/// A job as the workers see it: a pointer to the caller's `&dyn Fn()` (on the caller's stack).
type JobRef<'a> = &'a (dyn Fn() + Sync);

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
    /// The CPU the caller of the latest job ran on (`usize::MAX` when unknown).
    caller_cpu: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

static POOL: OnceLock<&'static Pool> = OnceLock::new();

/// The process's pool, started on first use with as many threads as rayon's (so `RAYON_NUM_THREADS`
/// sizes both).
pub(crate) fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let threads = rayon::current_num_threads().max(1);
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            threads,
            busy: AtomicBool::new(false),
            ticket: AtomicU64::new(CLOSED),
            job: AtomicPtr::new(std::ptr::null_mut()),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            caller_cpu: AtomicUsize::new(usize::MAX),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }));
        for i in 1..threads {
            let spawned = std::thread::Builder::new()
                .name(format!("gemm-int8-{i}"))
                .spawn(move || pool.worker());
            if spawned.is_err() {
                // Fewer workers only means the caller does more of each job.
                break;
            }
        }
        pool
    })
}

impl Pool {
    /// Threads a job may run on, the caller included.
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// Run `f` on the calling thread and on every worker that is free to join, and return when all
    /// of them have finished it. `f` must share out its work itself (every thread runs it once).
    pub(crate) fn run(&self, f: &(dyn Fn() + Sync)) {
        if self.threads == 1
            || self
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            f();
            return;
        }
        self.caller_cpu.store(current_cpu(), Ordering::Relaxed);
        let job: JobRef<'_> = f;
        self.job
            .store((&raw const job).cast_mut().cast(), Ordering::Relaxed);
        let epoch = (self.ticket.load(Ordering::Relaxed) >> 32).wrapping_add(1) & 0xFFFF_FFFF;
        // SeqCst pairs with the SeqCst `sleepers` increment and ticket load in `wait`: either a
        // parking worker sees the new ticket, or this thread sees it parking and wakes it.
        self.ticket.store(epoch << 32, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(f));
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

    fn worker(&self) {
        let mut seen = self.ticket.load(Ordering::Acquire) >> 32;
        loop {
            let mut ticket = self.wait(seen);
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
                        if catch_unwind(AssertUnwindSafe(f)).is_err() {
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
    fn wait(&self, mut seen: u64) -> u64 {
        let mut start = Instant::now();
        let mut spins = 0u32;
        loop {
            let ticket = self.ticket.load(Ordering::Acquire);
            if ticket >> 32 != seen {
                if ticket & CLOSED == 0 {
                    return ticket;
                }
                seen = ticket >> 32; // a job that ended without this worker
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) {
                continue;
            }
            // Spinning on the caller's own core (other load on the machine left no other core)
            // only takes time from the caller: park instead; a wake-up places a thread on an idle
            // core when there is one.
            let cpu = current_cpu();
            let shared = cpu != usize::MAX && cpu == self.caller_cpu.load(Ordering::Relaxed);
            if start.elapsed() < SPIN && !shared {
                std::thread::yield_now();
                continue;
            }
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            while self.ticket.load(Ordering::SeqCst) >> 32 == seen {
                guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            drop(guard);
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
            start = Instant::now();
        }
    }
}

/// The CPU this thread runs on, `usize::MAX` where unknown.
fn current_cpu() -> usize {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sched_getcpu takes no arguments and only reads the current CPU number.
        let cpu = unsafe { libc::sched_getcpu() };
        if let Ok(cpu) = usize::try_from(cpu) {
            return cpu;
        }
    }
    usize::MAX
}

/// Split `0..count` into chunks taken in turn from a shared counter by every thread of a job.
pub(crate) struct Chunks {
    next: AtomicUsize,
    count: usize,
}

impl Chunks {
    pub(crate) fn new(count: usize) -> Self {
        Self {
            next: AtomicUsize::new(0),
            count,
        }
    }

    /// Run `f` on chunks until none is left.
    pub(crate) fn for_each(&self, f: impl Fn(usize)) {
        loop {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            if c >= self.count {
                return;
            }
            f(c);
        }
    }
}

/// Run `f(chunk)` for every chunk in `0..count` on the pool (on the calling thread alone when
/// `count < 2`).
pub(crate) fn for_each_chunk(count: usize, f: impl Fn(usize) + Sync) {
    if count < 2 {
        (0..count).for_each(f);
        return;
    }
    let chunks = Chunks::new(count);
    pool().run(&|| chunks.for_each(&f));
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

/// Rows per chunk when `rows × cols` element-wise work is shared out: chunks of at least
/// [`crate::PARALLEL_MIN_ELEMENTS`] / 4 elements, about four per thread; `rows` (one chunk) when the
/// work is too small to share.
pub(crate) fn rows_per_chunk(rows: usize, cols: usize) -> usize {
    let threads = pool().threads();
    if threads < 2 || rows < 2 || rows * cols < crate::PARALLEL_MIN_ELEMENTS {
        return rows.max(1);
    }
    let by_size = (crate::PARALLEL_MIN_ELEMENTS / 4).div_ceil(cols.max(1));
    rows.div_ceil(4 * threads).max(by_size).max(1)
}

/// Run `f(i0, i1)` over runs `[i0, i1)` that together cover `0..count`, on the pool: each thread
/// takes the next run of `(count − taken) / (2 · threads)` items (at least one), so runs shrink as
/// the work runs out and the threads end close together (guided scheduling).
pub(crate) fn for_each_guided(count: usize, f: impl Fn(usize, usize) + Sync) {
    let pool = pool();
    if count < 2 || pool.threads() < 2 {
        if count > 0 {
            f(0, count);
        }
        return;
    }
    let share = 2 * pool.threads();
    let next = AtomicUsize::new(0);
    pool.run(&|| {
        let mut cur = next.load(Ordering::Relaxed);
        while cur < count {
            let end = (cur + ((count - cur) / share).max(1)).min(count);
            match next.compare_exchange_weak(cur, end, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    f(cur, end);
                    cur = next.load(Ordering::Relaxed);
                }
                Err(now) => cur = now,
            }
        }
    });
}
