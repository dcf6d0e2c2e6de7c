//! [`ThreadPool::for_each_run`]: units of work split into one contiguous run per thread, each
//! thread walking its own run from the front and, once it is empty, taking what is left of the
//! others' runs from their backs.
//!
//! Why: a one-token matmul streams its weights from DRAM. With tasks claimed from one counter
//! (`for_each`), the threads take turns along the matrix, so each thread's stream restarts at
//! every task, paying the memory latency and the prefetchers' ramp again; a small matrix (a
//! decode step's q/k/v or output projection, a few hundred KiB) is mostly such restarts. Here each
//! thread reads one stream, and a thread slowed by another process (the cores are shared) still
//! has its work taken from the back by the others, so the balance of dynamic tasks stays.
//!
//! Invariants: every unit in `0..units` is passed to `f` exactly once, inside one range; ranges
//! never overlap; a thread's ranges from its own run come in increasing order. Which thread
//! runs a unit may change from call to call, so `f` must give the same result for a unit
//! whoever runs it (the matmuls' units are independent rows).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use super::ThreadPool;

/// The most threads that get a run each; a bigger pool falls back to [`ThreadPool::for_each`].
const MAX_RUNS: usize = 64;

/// One thread's run, `lo..hi` packed as `lo | hi << 32`, alone on its cache line so that the
/// owner's claims do not bounce another run's line.
#[repr(align(64))]
struct Run(AtomicU64);

impl Run {
    fn new(lo: usize, hi: usize) -> Self {
        Run(AtomicU64::new(lo as u64 | ((hi as u64) << 32)))
    }

    /// Takes up to `chunk` units from the front (the owner's side).
    fn front(&self, chunk: usize) -> Option<Range<usize>> {
        self.take(|lo, hi| {
            let end = (lo + chunk).min(hi);
            (lo..end, end, hi)
        })
    }

    /// Takes up to `chunk` units from the back (another thread's side).
    fn back(&self, chunk: usize) -> Option<Range<usize>> {
        self.take(|lo, hi| {
            let start = hi.saturating_sub(chunk).max(lo);
            (start..hi, lo, start)
        })
    }

    /// Claims the range `cut(lo, hi)` gives and leaves the run at its new bounds; `None` once
    /// the run is empty.
    fn take(
        &self,
        cut: impl Fn(usize, usize) -> (Range<usize>, usize, usize),
    ) -> Option<Range<usize>> {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let (lo, hi) = ((cur & 0xffff_ffff) as usize, (cur >> 32) as usize);
            if lo >= hi {
                return None;
            }
            let (got, lo2, hi2) = cut(lo, hi);
            let new = lo2 as u64 | ((hi2 as u64) << 32);
            // Relaxed suffices: a unit's bounds are the only data, and the join at the end of
            // the broadcast orders every write `f` made before the caller reads it.
            match self
                .0
                .compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(got),
                Err(now) => cur = now,
            }
        }
    }
}

impl ThreadPool {
    /// Calls `f(range, fresh)` for disjoint ranges covering `0..units` (see the module docs):
    /// thread `i` first takes runs of up to `chunk` units from the front of its own share
    /// (`i * units / n..(i + 1) * units / n`), then up to `chunk` at a time from the back of
    /// the others'. `fresh` is false when the range starts where the same thread's previous
    /// one ended (a stream going on), true otherwise. Allocates nothing.
    pub fn for_each_run<F: Fn(Range<usize>, bool) + Sync>(&self, units: usize, chunk: usize, f: F) {
        let n = self.n_threads();
        let chunk = chunk.max(1);
        if units == 0 {
            return;
        }
        if n == 1 || units <= chunk || units > u32::MAX as usize || n > MAX_RUNS {
            // One thread, too little work to split, or more threads (or units) than runs
            // hold: plain tasks of `chunk` units.
            let tasks = units.div_ceil(chunk);
            return self.for_each(tasks, |i| f(i * chunk..((i + 1) * chunk).min(units), true));
        }
        // Only the first `n` runs are set up: writing all 64 padded lines (4 KiB) had been
        // about 450 cycles of every one-token matmul's start.
        // The caller's first range is cut before the runs are shared: its first claim would
        // otherwise be a locked instruction right after the job's post, waiting for the line
        // the spinning workers hold.
        let first = 0..chunk.min(units / n);
        let mut slots = [const { std::mem::MaybeUninit::<Run>::uninit() }; MAX_RUNS];
        for (i, slot) in slots.iter_mut().enumerate().take(n) {
            let lo = if i == 0 { first.end } else { i * units / n };
            slot.write(Run::new(lo, (i + 1) * units / n));
        }
        // SAFETY: the first `n <= MAX_RUNS` slots were written just above; `Run` has no drop
        // glue, so leaving the slots as `MaybeUninit` leaks nothing.
        let runs: &[Run] = unsafe { std::slice::from_raw_parts(slots.as_ptr().cast::<Run>(), n) };
        self.broadcast(|w| {
            let mut fresh = true;
            if w == 0 && !first.is_empty() {
                f(first.clone(), true);
                fresh = false;
            }
            while let Some(r) = runs[w].front(chunk) {
                f(r, fresh);
                fresh = false;
            }
            for d in 1..n {
                let other = &runs[(w + d) % n];
                while let Some(r) = other.back(chunk) {
                    f(r, true);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Range;
    use std::sync::Mutex;
    use std::time::Duration;

    use crate::ThreadPool;

    /// Every range `for_each_run` handed out, with the thread that got it and its `fresh` flag.
    fn ranges(
        pool: &ThreadPool,
        units: usize,
        chunk: usize,
        slow: bool,
    ) -> Vec<(Range<usize>, bool, std::thread::ThreadId)> {
        let got = Mutex::new(Vec::new());
        let caller = std::thread::current().id();
        pool.for_each_run(units, chunk, |r, fresh| {
            if slow && std::thread::current().id() != caller {
                std::thread::sleep(Duration::from_micros(200));
            }
            got.lock()
                .unwrap()
                .push((r, fresh, std::thread::current().id()));
        });
        got.into_inner().unwrap()
    }

    /// Every unit once, in disjoint ranges of at most `chunk`; each thread's non-fresh range
    /// starts where its previous one ended.
    #[test]
    fn every_unit_runs_once_and_runs_go_on_where_they_stopped() {
        for threads in [1, 2, 3, 5] {
            let pool = ThreadPool::new(threads).unwrap();
            for (units, chunk) in [
                (0, 1),
                (1, 1),
                (7, 1),
                (72, 4),
                (100, 16),
                (1000, 3),
                (5, 0),
            ] {
                for slow in [false, true] {
                    let got = ranges(&pool, units, chunk, slow);
                    let mut seen = vec![0u32; units];
                    for (r, _, _) in &got {
                        assert!(r.len() <= chunk.max(1) && !r.is_empty(), "{r:?}");
                        for u in r.clone() {
                            seen[u] += 1;
                        }
                    }
                    assert!(
                        seen.iter().all(|&c| c == 1),
                        "{threads} threads, {units} units"
                    );
                    // Per thread, in the order it ran them: a range that is not fresh goes on
                    // from the one before.
                    let mut last: Vec<(std::thread::ThreadId, usize)> = Vec::new();
                    for (r, fresh, id) in &got {
                        let prev = last.iter().find(|(t, _)| t == id).map(|(_, e)| *e);
                        if !fresh {
                            assert_eq!(prev, Some(r.start), "{threads} threads: {r:?}");
                        }
                        last.retain(|(t, _)| t != id);
                        last.push((*id, r.end));
                    }
                }
            }
        }
    }

    /// A thread slowed down (another process on its core) has its run taken from the back by
    /// the others: the fast caller ends up with more than its own share.
    #[test]
    fn a_slow_thread_has_its_run_taken_from_the_back() {
        let pool = ThreadPool::new(2).unwrap();
        let got = ranges(&pool, 64, 1, true);
        let caller = std::thread::current().id();
        let mine: usize = got
            .iter()
            .filter(|g| g.2 == caller)
            .map(|g| g.0.len())
            .sum();
        assert!(mine > 32, "the caller ran {mine} of 64 units");
        // What it took from the worker's half came from the back, highest first.
        let stolen: Vec<usize> = got
            .iter()
            .filter(|g| g.2 == caller && g.0.start >= 32)
            .map(|g| g.0.start)
            .collect();
        assert!(stolen.windows(2).all(|w| w[0] > w[1]), "{stolen:?}");
        assert_eq!(stolen.first(), Some(&63));
    }

    /// Called from inside a pool job it runs inline, every unit once.
    #[test]
    fn nested_in_a_job_it_runs_inline() {
        let pool = ThreadPool::new(2).unwrap();
        let inner = ThreadPool::new(3).unwrap();
        pool.broadcast(|_| {
            let got = ranges(&inner, 50, 4, false);
            assert_eq!(got.iter().map(|g| g.0.len()).sum::<usize>(), 50);
        });
    }
}
