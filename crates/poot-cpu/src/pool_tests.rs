//! The pool's tests: broadcasts, task loops, panics, serialization and prefetch hints.

use super::*;

#[test]
fn broadcast_runs_every_worker_once() {
    for threads in [1, 2, 3, 5] {
        let pool = ThreadPool::new(threads).unwrap();
        for _ in 0..50 {
            let hits: Vec<AtomicUsize> = (0..threads).map(|_| AtomicUsize::new(0)).collect();
            pool.broadcast(|w| {
                hits[w].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }
}

/// A pool whose idle threads park at once (no spin budget).
fn parking(threads: usize) -> ThreadPool {
    ThreadPool::with_config(PoolConfig {
        threads,
        spin: Duration::ZERO,
        tuning: None,
        hint_bytes: 0,
    })
    .unwrap()
}

/// Parked workers and a parked caller are woken (notifies are skipped when nobody is parked):
/// with no spin budget every idle worker parks between broadcasts, and a slow worker makes the
/// caller park on its result, in both orders of arrival.
#[test]
fn parked_workers_and_a_parked_caller_are_woken() {
    let pool = parking(3);
    for round in 0..40u64 {
        if round % 4 == 0 {
            // Long enough for the workers to park before the next job.
            thread::sleep(Duration::from_millis(2));
        }
        let hits = AtomicUsize::new(0);
        pool.broadcast(|w| {
            if w == (round % 3) as usize && round % 2 == 1 {
                thread::sleep(Duration::from_millis(1));
            }
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 3, "round {round}");
    }
}

/// A parked worker is woken when the job is posted, not after the caller's own part: the
/// caller's part here waits (boundedly) for the worker's to start. Waking it after had left
/// every job that followed a park (a dynamic one: all its tasks) to the caller alone.
#[test]
fn a_parked_worker_starts_while_the_caller_runs_its_part() {
    let pool = parking(2);
    for round in 0..5 {
        // Long enough for the worker to park.
        thread::sleep(Duration::from_millis(5));
        let started = AtomicUsize::new(0);
        let seen = AtomicUsize::new(0);
        pool.broadcast(|w| {
            if w == 1 {
                started.store(1, Ordering::Release);
                return;
            }
            let t0 = std::time::Instant::now();
            while started.load(Ordering::Acquire) == 0 && t0.elapsed() < Duration::from_secs(5) {
                thread::yield_now();
            }
            seen.store(started.load(Ordering::Acquire), Ordering::Relaxed);
        });
        assert_eq!(
            seen.load(Ordering::Relaxed),
            1,
            "round {round}: the worker waited for the caller"
        );
    }
}

#[test]
fn for_each_chunk_mut_covers_everything_once() {
    let pool = ThreadPool::new(3).unwrap();
    let mut data = vec![0u32; 1001];
    pool.for_each_chunk_mut(
        &mut data,
        7,
        || 0usize,
        |seen, i, part| {
            *seen += 1;
            for (j, v) in part.iter_mut().enumerate() {
                *v += (i * 7 + j) as u32 + 1;
            }
        },
    );
    assert!(data.iter().enumerate().all(|(i, &v)| v == i as u32 + 1));
}

#[test]
fn nested_calls_run_inline() {
    let pool = ThreadPool::new(2).unwrap();
    let total = AtomicUsize::new(0);
    pool.for_each(4, |_| {
        pool.for_each(3, |_| {
            total.fetch_add(1, Ordering::Relaxed);
        });
    });
    assert_eq!(total.load(Ordering::Relaxed), 12);
}

#[test]
fn a_worker_panic_reaches_the_caller_and_the_pool_survives() {
    let pool = parking(3);
    let r = panic::catch_unwind(AssertUnwindSafe(|| {
        pool.broadcast(|w| assert_ne!(w, 2, "boom"));
    }));
    assert!(r.is_err());
    let n = AtomicUsize::new(0);
    pool.for_each(100, |_| {
        n.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(n.load(Ordering::Relaxed), 100);
    // The caller and a worker panicking in one job: the caller's panic comes back, and the next
    // job, which panics nowhere, reports none.
    let r = panic::catch_unwind(AssertUnwindSafe(|| {
        pool.broadcast(|w| assert!(w != 0 && w != 1, "boom {w}"));
    }));
    let msg = r.expect_err("both panicked");
    let msg = msg.downcast_ref::<String>().expect("the assert's message");
    assert!(msg.contains("boom 0"), "{msg}");
    pool.broadcast(|_| {});
}

#[test]
fn concurrent_callers_are_serialized() {
    let pool = ThreadPool::new(2).unwrap();
    let n = AtomicUsize::new(0);
    thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for _ in 0..20 {
                    pool.for_each(10, |_| {
                        n.fetch_add(1, Ordering::Relaxed);
                    });
                }
            });
        }
    });
    assert_eq!(n.load(Ordering::Relaxed), 600);
}

/// A pool whose idle workers keep spinning (and so take hints) for the whole test, each hint
/// cut to `hint_bytes`.
fn spinning(threads: usize, hint_bytes: usize) -> ThreadPool {
    ThreadPool::with_config(PoolConfig {
        threads,
        spin: Duration::from_secs(600),
        tuning: None,
        hint_bytes,
    })
    .unwrap()
}

/// Waits until the workers prefetched `bytes` for hints (a liveness bound, not a timing).
fn wait_hinted(pool: &ThreadPool, bytes: u64) {
    let start = Instant::now();
    while pool.hinted_bytes() < bytes {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "workers prefetched {} of {bytes} hinted bytes",
            pool.hinted_bytes()
        );
        thread::yield_now();
    }
}

#[test]
fn an_idle_worker_prefetches_a_hint_up_to_its_budget_once() {
    let pool = spinning(2, 3 * HINT_CHUNK + 100);
    let data = vec![7u8; 100_000];
    pool.prefetch_hint(&[span(&data)]);
    wait_hinted(&pool, 3 * HINT_CHUNK as u64 + 100);
    // Jobs in between: the worker resumes the same hint, which has nothing left.
    for _ in 0..20 {
        pool.broadcast(|_| {});
    }
    assert_eq!(pool.hinted_bytes(), 3 * HINT_CHUNK as u64 + 100);
    // A range shorter than the budget: the worker's share (its second half), no more.
    let short = 2 * HINT_CHUNK + 7;
    pool.prefetch_hint(&[span(&data[..short])]);
    let want = (3 * HINT_CHUNK + 100 + short - short / 2) as u64;
    wait_hinted(&pool, want);
    pool.broadcast(|_| {});
    assert_eq!(pool.hinted_bytes(), want);
}

/// Each worker takes the budget from where its run of `ThreadPool::for_each_run` starts (worker
/// `i` of `n` threads: `i / n` of the way through the ranges laid end to end), across ranges.
#[test]
fn each_worker_prefetches_from_its_own_share_across_ranges() {
    let pool = spinning(3, 20_000);
    let (a, b, c) = (vec![1u8; 10_000], vec![2u8; 3_000], vec![3u8; 50_000]);
    // 63_000 bytes: worker 1 from 21_000 (inside c) to 41_000, worker 2 from 42_000 to 62_000.
    pool.prefetch_hint(&[span(&a), span(&b), span(&c)]);
    wait_hinted(&pool, 40_000);
    pool.broadcast(|_| {});
    assert_eq!(pool.hinted_bytes(), 40_000);
    // Shares shorter than the budget stop at the end: worker 1 takes 1_000..3_000, worker 2
    // 2_000..3_000.
    let small = vec![4u8; 3_000];
    pool.prefetch_hint(&[span(&small)]);
    wait_hinted(&pool, 40_000 + 1_000 + 2_000);
    pool.broadcast(|_| {});
    assert_eq!(pool.hinted_bytes(), 43_000);
    // An empty hint withdraws the last one.
    pool.prefetch_hint(&[]);
    pool.broadcast(|_| {});
    assert_eq!(pool.hinted_bytes(), 43_000);
}

#[test]
fn hints_change_no_job_and_a_one_thread_pool_ignores_them() {
    let pool = spinning(2, 64 << 10);
    let data: Vec<u32> = (0..200_000).collect();
    let whole = (data.as_ptr() as usize, std::mem::size_of_val(&data[..]));
    for round in 0..50 {
        pool.prefetch_hint(&[whole]);
        let sum = AtomicU64::new(0);
        pool.for_each(8, |i| {
            let s: u64 = data[i * 25_000..(i + 1) * 25_000]
                .iter()
                .map(|&v| u64::from(v))
                .sum();
            sum.fetch_add(s, Ordering::Relaxed);
        });
        assert_eq!(
            sum.load(Ordering::Relaxed),
            199_999 * 200_000 / 2,
            "round {round}"
        );
    }
    // No workers to take it; and a pool built with hints off ignores them too.
    for pool in [spinning(1, 1 << 20), spinning(2, 0)] {
        pool.prefetch_hint(&[whole]);
        pool.broadcast(|_| {});
        assert_eq!(pool.hinted_bytes(), 0);
    }
}

/// `data` as a hint range.
fn span(data: &[u8]) -> (usize, usize) {
    (data.as_ptr() as usize, data.len())
}

/// The hint's sequence lock never hands a reader a torn hint: a poster writes hints whose
/// fields all hold the same number while a reader copies them as fast as it can.
#[test]
fn a_hint_read_during_posts_is_never_torn() {
    use super::hint::HintSlot;
    use super::{Hint, MAX_HINT_RANGES};
    let slot = HintSlot::new(1);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for k in 1..200_000usize {
                let hint = Hint {
                    ranges: [(k, k); MAX_HINT_RANGES],
                    n: k % (MAX_HINT_RANGES + 1),
                };
                slot.post(&hint);
            }
            stop.store(true, Ordering::Release);
        });
        let (mut seen, mut torn) = (0u64, 0u64);
        // Reads race the posts until the poster is done, then one more after its last post: on
        // a loaded machine this thread may first run after all of them (the test had failed
        // with no read at all, `seen == 0`).
        loop {
            let done = stop.load(Ordering::Acquire);
            if let Some(h) = slot.read(slot.seq()) {
                let k = h.ranges[0].0;
                let whole = h.ranges.iter().all(|&r| r == (k, k));
                torn += u64::from(!whole || (k > 0 && h.n != k % (MAX_HINT_RANGES + 1)));
                seen += 1;
            }
            if done {
                break;
            }
        }
        assert_eq!(torn, 0, "torn reads among {seen}");
        assert!(seen > 0);
    });
}
