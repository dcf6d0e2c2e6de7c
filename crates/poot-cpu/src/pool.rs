//! A small persistent thread pool with a scoped parallel-for.
//!
//! The runtime creates one pool and hands it to every kernel. `n_threads - 1` workers are
//! spawned once and parked; the calling thread always takes part as worker 0, so a one-thread
//! pool spawns nothing and runs everything inline.
//!
//! Guarantees:
//! - [`ThreadPool::broadcast`] returns only after every worker has finished with the closure,
//!   also when one of them panics (the panic is re-raised on the caller afterwards). This is what
//!   lets closures borrow the caller's stack.
//! - Calls from several threads into one pool are serialized; a call made from inside a pool job
//!   (any pool) runs inline on the calling thread instead of deadlocking.
//! - Tasks of [`ThreadPool::for_each_init`] are claimed dynamically from an atomic counter, so
//!   a worker slowed by another process (the cores are shared) simply claims fewer tasks.
//!
//! Cost: one broadcast is two condvar round trips when workers are parked, and no system call
//! when none is (a notify is made only to a parked thread). Then the hand-off takes no lock:
//! the caller writes the job and stores a new generation on a line the idle workers poll, and
//! each worker reports the generation it finished on a line of its own, so a job's start and
//! end each move one line between the cores (a mutex at the start and at the end and a shared
//! counter had moved four or five). The mutex and condvars are only for parking, and a parked
//! worker is woken at the post, before the caller runs its own part. Idle workers (and a
//! caller waiting for stragglers) first spin briefly, then `yield_now` until
//! [`PoolConfig::spin`] has passed, then park; so back-to-back kernels (a decode step) wake
//! them in about a microsecond, and a waiting thread hands its core to a thread that shares it.
//! The default budget (5 ms; `CpuOptions::spin`, `POOT_CPU_SPIN_US` by default) outlasts the
//! host's work between two decode steps: on a shared VM a worker that parked let its vCPU halt,
//! the hypervisor gave the core away, and every kernel of the next step waited for it to come
//! back (measurements: `docs/performance-history.md`, "Measurements behind the kernels").
//!
//! Prefetch hints ([`ThreadPool::prefetch_hint`]): the caller may post up to
//! [`MAX_HINT_RANGES`] byte ranges (the weights the next job will stream); a worker with no job
//! prefetches them into its L2 a [`HINT_CHUNK`] at a time, checking for a job between chunks,
//! and after a job it goes on where it stopped until a new hint replaces the old one. Worker `i`
//! of `n` threads takes [`PoolConfig::hint_bytes`] from `i / n` of the way through the ranges
//! laid end to end, where [`ThreadPool::for_each_run`] starts its run of the next one-token
//! matmul (the caller, thread 0, is busy with the ops in between). A hint only moves data into
//! caches: it changes no result, and since a prefetch never faults it stays sound when the
//! ranges' memory is freed meanwhile.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::KernelError;

/// How to build a [`ThreadPool`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Threads including the caller; 0 means the number of available cores.
    pub threads: usize,
    /// How long an idle worker spins (then yields) before it parks on a condvar.
    pub spin: Duration,
    /// The kernel tuning the workers run with (installed when each starts; see
    /// `crate::tuning`); `None` leaves them on the process defaults. The caller (worker 0)
    /// keeps its own: a runtime enters its tuning there for each call.
    pub tuning: Option<crate::Tuning>,
    /// Bytes of each [`ThreadPool::prefetch_hint`] each idle worker prefetches (0: hints off).
    pub hint_bytes: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        // See the module docs for why 5 ms.
        let us = crate::tuning::env_usize("POOT_CPU_SPIN_US", 5000);
        PoolConfig {
            threads: 0,
            spin: Duration::from_micros(us as u64),
            tuning: None,
            hint_bytes: 0,
        }
    }
}

type Job = dyn Fn(usize) + Sync;

/// A lifetime-erased pointer to the current job.
#[derive(Clone, Copy)]
struct JobPtr(*const Job);

// SAFETY: the pointee is `Sync`, so calling it from any thread is sound; `broadcast` keeps it
// alive until every worker has reported back, and workers only dereference it before that.
unsafe impl Send for JobPtr {}

/// A value on lines of its own (128 bytes: the line and the one the adjacent-line prefetcher
/// pairs with it), so that writing it does not take a line other threads poll.
#[repr(align(128))]
#[derive(Default)]
struct Padded<T>(T);

/// What the caller writes for each job, on lines of their own that idle workers poll.
#[repr(align(128))]
struct Post {
    generation: AtomicU64,
    /// The current job. Written by the caller only while no worker can read it (before it
    /// publishes the next generation, after every worker reported the last one done); read by
    /// a worker only after it saw that generation.
    job: std::cell::UnsafeCell<Option<JobPtr>>,
    shutdown: AtomicBool,
}

// SAFETY: `job` is written and read only as its doc says: the caller's write happens before
// its store of the generation (SeqCst, so a release), which a worker acquires before reading,
// and the caller's next write happens after it acquired every worker's finished store, which
// follows that worker's read.
unsafe impl Sync for Post {}

/// Who is parked, read at every job's start (by the caller) and end (by the workers), written
/// only on the way into and out of a park: a line that stays shared between the cores.
#[repr(align(128))]
#[derive(Default)]
struct Sleepers {
    /// Workers parked on `work` (or about to be).
    workers: AtomicUsize,
    /// Whether the caller is parked on `done` (or about to be).
    caller: AtomicBool,
}

struct Shared {
    /// Held only to park and to wake a parked thread; never on a job's way.
    lock: Mutex<()>,
    work: Condvar,
    done: Condvar,
    post: Post,
    sleepers: Sleepers,
    /// Per worker (index 1..): the last generation it finished, each on its own lines, written
    /// only by its worker and read by the caller.
    finished: Box<[Padded<AtomicU64>]>,
    panicked: Padded<AtomicBool>,
    spin: Duration,
    /// The current prefetch hint (see the module docs), read by idle workers without a lock.
    hint: hint::HintSlot,
    /// Bytes workers prefetched for hints (for tests and profiles).
    hinted_bytes: Padded<AtomicU64>,
}

impl Shared {
    /// Whether every worker finished generation `g` (`order` for each load).
    fn all_finished(&self, g: u64, order: Ordering) -> bool {
        self.finished[1..].iter().all(|f| f.0.load(order) == g)
    }
}

fn lock(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    // Jobs run outside the lock under `catch_unwind`, so poisoning cannot hide a broken state.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

thread_local! {
    /// Set while this thread runs a pool job; nested calls then run inline.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// Marks the current thread as running a job until dropped.
struct InJob(bool);

impl InJob {
    fn enter() -> Self {
        InJob(IN_JOB.with(|c| c.replace(true)))
    }
}

impl Drop for InJob {
    fn drop(&mut self) {
        IN_JOB.with(|c| c.set(self.0));
    }
}

/// A persistent pool of worker threads (see the module docs).
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
    serial: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads)
            .field("spin", &self.shared.spin)
            .field("hint_bytes", &self.shared.hint.bytes)
            .finish()
    }
}

impl ThreadPool {
    /// A pool of `threads` threads including the caller (0 = available cores).
    pub fn new(threads: usize) -> Result<Self, KernelError> {
        Self::with_config(PoolConfig {
            threads,
            ..PoolConfig::default()
        })
    }

    /// A pool built from `config`.
    pub fn with_config(config: PoolConfig) -> Result<Self, KernelError> {
        let tuning = config.tuning;
        let n_threads = match config.threads {
            0 => thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let shared = Arc::new(Shared {
            lock: Mutex::new(()),
            work: Condvar::new(),
            done: Condvar::new(),
            post: Post {
                generation: AtomicU64::new(0),
                job: std::cell::UnsafeCell::new(None),
                shutdown: AtomicBool::new(false),
            },
            sleepers: Sleepers::default(),
            finished: (0..n_threads).map(|_| Padded::default()).collect(),
            panicked: Padded::default(),
            spin: config.spin,
            hint: hint::HintSlot::new(config.hint_bytes),
            hinted_bytes: Padded::default(),
        });
        let mut pool = ThreadPool {
            shared,
            workers: Vec::with_capacity(n_threads - 1),
            n_threads,
            serial: Mutex::new(()),
        };
        for index in 1..n_threads {
            let shared = Arc::clone(&pool.shared);
            let handle = thread::Builder::new()
                .name(format!("poot-cpu-{index}"))
                .spawn(move || {
                    if let Some(t) = tuning {
                        t.install();
                    }
                    worker(&shared, index, n_threads - 1)
                })
                .map_err(|e| KernelError::Spawn {
                    index,
                    detail: e.to_string(),
                })?; // `pool`'s Drop stops the workers spawned so far.
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Threads that run jobs, the caller included.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// `(per_task, tasks)`: `units` of work in runs of `per_task`, about four tasks per thread
    /// (`tasks * per_task >= units`, each task at least one unit). Four a thread balances the
    /// load when other processes share the cores, and keeps each task's run long enough for
    /// its memory stream.
    pub fn split(&self, units: usize) -> (usize, usize) {
        let per_task = units.div_ceil(self.n_threads * 4).max(1);
        (per_task, units.div_ceil(per_task))
    }

    /// Runs `f(worker)` once for every worker index `0..n_threads()` and returns when all are
    /// done. The caller runs index 0. A panic in any of them is re-raised here after all
    /// finished.
    pub fn broadcast<F: Fn(usize) + Sync>(&self, f: F) {
        if self.n_threads == 1 || IN_JOB.with(Cell::get) {
            let _in = InJob::enter();
            (0..self.n_threads).for_each(&f);
            return;
        }
        let _serial = self.serial.lock().unwrap_or_else(PoisonError::into_inner);
        let job: &(dyn Fn(usize) + Sync + '_) = &f;
        // SAFETY: only the lifetime is erased (same fat-pointer layout). The pointer is
        // dereferenced by workers only until they store this job's generation as finished, and
        // this function does not return or unwind before every worker has (the caller's own
        // part runs under `catch_unwind`), so `f` outlives every use.
        let job: *const Job =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync + '_), &'static Job>(job) };
        let shared = &*self.shared;
        let g = shared.post.generation.load(Ordering::Relaxed) + 1;
        // SAFETY: no worker reads `job` now: each finished the last generation (the last
        // broadcast returned only then, and the serial lock orders this one after it), and
        // none reads it again before it sees `g`, stored below (see `Post::job`).
        unsafe { *shared.post.job.get() = Some(JobPtr(job)) };
        // SeqCst with the parked count's load below: a worker on its way into a park either
        // is counted there or sees `g` when it checks after counting itself. The wake-up
        // comes before the caller's own part: waking a parked worker only after it (when the
        // post's store had long drained) left a dynamic job all to the caller, and a 512-token
        // prefill, whose serial stretches let the worker park, ran about 30% slower.
        shared.post.generation.store(g, Ordering::SeqCst);
        if shared.sleepers.workers.load(Ordering::SeqCst) > 0 {
            let _lock = lock(&shared.lock);
            shared.work.notify_all();
        }
        let mine = {
            let _in = InJob::enter();
            panic::catch_unwind(AssertUnwindSafe(|| f(0)))
        };
        wait_finished(shared, g);
        // Cleared here whoever panicked, so a later job does not report this one's.
        let worker_panicked = shared.panicked.0.load(Ordering::Acquire);
        if worker_panicked {
            shared.panicked.0.store(false, Ordering::Relaxed);
        }
        if let Err(payload) = mine {
            panic::resume_unwind(payload);
        }
        if worker_panicked {
            panic!("a poot-cpu pool worker panicked");
        }
    }

    /// Posts a prefetch hint (see the module docs): each idle worker prefetches
    /// [`PoolConfig::hint_bytes`] bytes of `ranges` ((address, length) pairs, laid end to end;
    /// the first [`MAX_HINT_RANGES`] of them) from its own share's start into its L2,
    /// replacing the previous hint; an
    /// empty `ranges` withdraws it. The addresses need not stay valid (a prefetch never
    /// faults). Does nothing on a one-thread pool or with `hint_bytes == 0`; never waits.
    pub fn prefetch_hint(&self, ranges: &[(usize, usize)]) {
        let shared = &*self.shared;
        if self.n_threads == 1 || shared.hint.bytes == 0 {
            return;
        }
        let mut hint = Hint::default();
        for &(addr, len) in ranges.iter().take(MAX_HINT_RANGES) {
            hint.ranges[hint.n] = (addr, len);
            hint.n += 1;
        }
        shared.hint.post(&hint);
    }

    /// Bytes the workers prefetched for hints since the pool started.
    pub fn hinted_bytes(&self) -> u64 {
        self.shared.hinted_bytes.0.load(Ordering::Relaxed)
    }

    /// Calls `f(&mut state, i)` for every `i in 0..n_tasks`, spread over the workers; each
    /// worker that claims a task builds its `state` once with `init` (per-thread scratch).
    pub fn for_each_init<S, I, F>(&self, n_tasks: usize, init: I, f: F)
    where
        I: Fn() -> S + Sync,
        F: Fn(&mut S, usize) + Sync,
    {
        if n_tasks == 0 {
            return;
        }
        if n_tasks == 1 || self.n_threads == 1 {
            let mut state = init();
            (0..n_tasks).for_each(|i| f(&mut state, i));
            return;
        }
        let next = AtomicUsize::new(0);
        self.broadcast(|_| {
            let mut state = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n_tasks {
                    break;
                }
                f(state.get_or_insert_with(&init), i);
            }
        });
    }

    /// Calls `f(i)` for every `i in 0..n_tasks`, spread over the workers.
    pub fn for_each<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        self.for_each_init(n_tasks, || (), |_, i| f(i));
    }

    /// Splits `data` into chunks of `chunk` elements (the last may be shorter) and calls
    /// `f(&mut state, i, chunk_i)` for each, spread over the workers, with per-worker `state`.
    /// `chunk == 0` is treated as one chunk holding everything.
    pub fn for_each_chunk_mut<T, S, I, F>(&self, data: &mut [T], chunk: usize, init: I, f: F)
    where
        T: Send,
        I: Fn() -> S + Sync,
        F: Fn(&mut S, usize, &mut [T]) + Sync,
    {
        let len = data.len();
        let chunk = if chunk == 0 { len.max(1) } else { chunk };
        let shared = SharedMut::new(data);
        self.for_each_init(len.div_ceil(chunk), init, |state, i| {
            let range = i * chunk..((i + 1) * chunk).min(len);
            // SAFETY: task `i` is claimed exactly once and the chunk ranges are disjoint.
            let part = unsafe { shared.slice_mut(range) };
            f(state, i, part);
        });
    }
}

/// Spin-then-yield waiting: a few pure spins (a wake-up in well under a microsecond when the
/// other thread has its own core), then `yield_now` so a thread sharing this core (the cores
/// are shared with other processes, and the pool may be oversubscribed) can run; `done()`
/// turns true once `limit` has passed and the caller should park on its condvar.
struct Backoff {
    /// When the pure spins ran out: the clock is read only by a wait that outlasts them (most
    /// of a decode step's joins end within them, and each read was a `clock_gettime`).
    start: Option<Instant>,
    limit: Duration,
    spins: u32,
}

impl Backoff {
    const PURE_SPINS: u32 = 64;

    fn new(limit: Duration) -> Self {
        Backoff {
            start: None,
            limit,
            spins: 0,
        }
    }

    /// Waits a little; false once the spin budget is spent.
    fn wait(&mut self) -> bool {
        self.spins += 1;
        if self.spins < Self::PURE_SPINS {
            std::hint::spin_loop();
            return true;
        }
        if self.start.get_or_insert_with(Instant::now).elapsed() > self.limit {
            return false;
        }
        thread::yield_now();
        true
    }
}

/// Waits (spinning, then yielding, then parked) until every worker has finished generation `g`.
fn wait_finished(shared: &Shared, g: u64) {
    let mut backoff = Backoff::new(shared.spin);
    while !shared.all_finished(g, Ordering::Acquire) {
        if !backoff.wait() {
            let mut st = lock(&shared.lock);
            // SeqCst with the workers' finished stores and their load of this flag: the last
            // worker either sees it (and notifies under the lock) or is seen finished here.
            shared.sleepers.caller.store(true, Ordering::SeqCst);
            while !shared.all_finished(g, Ordering::SeqCst) {
                st = shared.done.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
            shared.sleepers.caller.store(false, Ordering::Relaxed);
            return;
        }
    }
}

/// Worker `index` (`1..=idle`, `idle` being the pool's spawned workers).
fn worker(shared: &Shared, index: usize, idle: usize) {
    IN_JOB.with(|c| c.set(true));
    let post = &shared.post;
    let mut seen = 0u64;
    let mut cursor = HintCursor::new();
    loop {
        let mut backoff = Backoff::new(shared.spin);
        // Idle: the hint's next chunk if any is left, else a spin, yield or park.
        while post.generation.load(Ordering::Acquire) == seen
            && !post.shutdown.load(Ordering::Relaxed)
            && (cursor.step(shared, index, idle) || backoff.wait())
        {}
        if post.generation.load(Ordering::Acquire) == seen && !post.shutdown.load(Ordering::Relaxed)
        {
            let mut st = lock(&shared.lock);
            // SeqCst with the caller's generation store and its load of this count (see
            // `broadcast`); the notify comes under the lock, so none is lost.
            shared.sleepers.workers.fetch_add(1, Ordering::SeqCst);
            while post.generation.load(Ordering::SeqCst) == seen
                && !post.shutdown.load(Ordering::SeqCst)
            {
                st = shared.work.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
            shared.sleepers.workers.fetch_sub(1, Ordering::Relaxed);
        }
        if post.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = post.generation.load(Ordering::Acquire);
        // SAFETY: this worker saw `seen` (acquire), after which the caller wrote the job, and
        // the caller writes it again only after this worker's finished store below.
        if let Some(job) = unsafe { *post.job.get() } {
            // SAFETY: `broadcast` keeps the closure alive until every worker finished this
            // generation, which this worker reports only below.
            let ran = panic::catch_unwind(AssertUnwindSafe(|| unsafe { (*job.0)(index) }));
            if ran.is_err() {
                shared.panicked.0.store(true, Ordering::Release);
            }
        }
        // SeqCst with the caller's flag (see `wait_finished`).
        shared.finished[index].0.store(seen, Ordering::SeqCst);
        if shared.sleepers.caller.load(Ordering::SeqCst) {
            let _lock = lock(&shared.lock);
            shared.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.post.shutdown.store(true, Ordering::SeqCst);
        {
            let _lock = lock(&self.shared.lock);
            self.shared.work.notify_all();
        }
        for w in self.workers.drain(..) {
            // A worker never panics outside `catch_unwind`; nothing to report if one did.
            let _ = w.join();
        }
    }
}

#[path = "pool_hint.rs"]
mod hint;
use hint::{Hint, HintCursor};
pub use hint::{HINT_CHUNK, MAX_HINT_RANGES};
#[path = "pool_runs.rs"]
mod runs;
#[path = "pool_shared.rs"]
mod shared;
pub(crate) use shared::SharedMut;

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
