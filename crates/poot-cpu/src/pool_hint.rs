//! The prefetch hint (see the pool's module docs): its slot, which one poster (the pool's
//! caller) writes and idle workers read without a lock (a sequence lock), so posting a hint is
//! plain stores on the poster's side; and each idle worker's cursor through it (`HintCursor`),
//! which prefetches its share a chunk at a time.
//!
//! Why: the hint had been a `Mutex` and a `fetch_add`ed sequence number on lines the spinning
//! workers read, and a worker's byte counter beside them: each post waited on two or three
//! locked instructions for lines held by the other core, 0.4% of a SmolLM2 decode's samples
//! (about 120 posts a step).
//!
//! Invariants: the sequence number is odd while a post is being written and grows by 2 per
//! post; a reader keeps a copy only when it read the same even number before and after the
//! fields, so it never uses a torn hint (a stale one is harmless: hints only move data into
//! caches). Posters exclude each other with `writer`, a spin flag no worker touches, on a line
//! of its own; it is released by a plain store, since a locked instruction after the post's
//! stores would wait for the lines the workers hold (a `Mutex`'s unlock, an `xchg`, was three
//! quarters of the poster's samples).

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::{Padded, Shared};

/// The current hint and its sequence number, on lines of their own.
#[repr(align(128))]
pub(super) struct HintSlot {
    seq: AtomicU64,
    n: AtomicUsize,
    ranges: [(AtomicUsize, AtomicUsize); MAX_HINT_RANGES],
    /// Bytes of each hint an idle worker prefetches (fixed when the pool starts).
    pub(super) bytes: usize,
    writer: Padded<AtomicBool>,
}

impl HintSlot {
    pub(super) fn new(bytes: usize) -> Self {
        HintSlot {
            seq: AtomicU64::new(0),
            n: AtomicUsize::new(0),
            ranges: std::array::from_fn(|_| (AtomicUsize::new(0), AtomicUsize::new(0))),
            bytes,
            writer: Padded(AtomicBool::new(false)),
        }
    }

    /// Replaces the hint with `hint`.
    pub(super) fn post(&self, hint: &Hint) {
        let writer = &self.writer.0;
        while writer
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s + 1, Ordering::Relaxed);
        // The odd number is visible before any field changes.
        fence(Ordering::Release);
        self.n.store(hint.n, Ordering::Relaxed);
        for ((a, l), &(addr, len)) in self.ranges.iter().zip(&hint.ranges) {
            a.store(addr, Ordering::Relaxed);
            l.store(len, Ordering::Relaxed);
        }
        self.seq.store(s + 2, Ordering::Release);
        writer.store(false, Ordering::Release);
    }

    /// The sequence number now (even when no post is under way).
    pub(super) fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// The hint posted as `seq`, or `None` when a post is under way or came since (ask again
    /// later).
    pub(super) fn read(&self, seq: u64) -> Option<Hint> {
        if seq % 2 == 1 {
            return None;
        }
        let mut hint = Hint {
            n: self.n.load(Ordering::Relaxed).min(MAX_HINT_RANGES),
            ..Hint::default()
        };
        for (slot, (a, l)) in hint.ranges.iter_mut().zip(&self.ranges) {
            *slot = (a.load(Ordering::Relaxed), l.load(Ordering::Relaxed));
        }
        // The fields' loads complete before the second read of the number.
        fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == seq).then_some(hint)
    }
}

/// The most byte ranges one prefetch hint holds (a fused matmul's weights).
pub const MAX_HINT_RANGES: usize = 4;

/// Bytes a worker prefetches between two checks for a job: 16 lines, so a job that arrives
/// waits for at most that many prefetches to issue (each may wait for a free miss buffer).
pub const HINT_CHUNK: usize = 1024;

/// A prefetch hint: `ranges[..n]` as (address, length), already cut to the poster's budget.
#[derive(Clone, Copy, Default)]
pub(super) struct Hint {
    pub(super) ranges: [(usize, usize); MAX_HINT_RANGES],
    pub(super) n: usize,
}

/// A worker's progress through the current hint.
pub(super) struct HintCursor {
    seq: u64,
    hint: Hint,
    /// Bytes of the hint (ranges laid end to end) already covered, by this or another worker.
    at: usize,
    total: usize,
}

impl HintCursor {
    pub(super) fn new() -> Self {
        HintCursor {
            seq: 0,
            hint: Hint::default(),
            at: 0,
            total: 0,
        }
    }

    /// Prefetches this worker's next chunk of the current hint; false when nothing is left.
    /// Worker `index` of `idle` (`1..=idle`; the caller is thread 0 of `idle + 1`) takes the
    /// first `hint_bytes` bytes from `index / (idle + 1)` of the way through the ranges laid end
    /// to end: where `ThreadPool::for_each_run` starts its run of the next one-token matmul.
    pub(super) fn step(&mut self, shared: &Shared, index: usize, idle: usize) -> bool {
        let seq = shared.hint.seq();
        if seq != self.seq {
            // A post under way: this worker's old hint until the next look.
            if let Some(hint) = shared.hint.read(seq) {
                self.seq = seq;
                self.hint = hint;
                let all: usize = self.hint.ranges[..self.hint.n].iter().map(|r| r.1).sum();
                self.at = all / (idle + 1) * index + all % (idle + 1) * index / (idle + 1);
                self.total = (self.at + shared.hint.bytes).min(all);
            }
        }
        if self.at < self.total {
            let start = self.at;
            let end = (start + HINT_CHUNK).min(self.total);
            self.at = end;
            // Map [start, end) of the ranges laid end to end back onto the ranges.
            let mut base = 0;
            for &(addr, len) in &self.hint.ranges[..self.hint.n] {
                let (lo, hi) = (start.max(base), end.min(base + len));
                if lo < hi {
                    prefetch_l2(addr.wrapping_add(lo - base), hi - lo);
                }
                base += len;
            }
            shared
                .hinted_bytes
                .0
                .fetch_add((end - start) as u64, Ordering::Relaxed);
            return true;
        }
        false
    }
}

/// Prefetches the lines of `addr..addr + len` into L2 (nothing off x86).
fn prefetch_l2(addr: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(64) {
        // SAFETY: SSE is part of x86-64's baseline, and a prefetch never faults, whatever the
        // address (freed or unmapped memory only gives a useless or no fetch).
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                addr.wrapping_add(off) as *const i8,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (addr, len);
}
