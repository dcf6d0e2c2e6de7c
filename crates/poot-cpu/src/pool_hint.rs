//! The prefetch hint's slot: one poster (the pool's caller) writes it, idle workers read it
//! without a lock (a sequence lock), so posting a hint is plain stores on the poster's side.
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

use super::{Hint, Padded, MAX_HINT_RANGES};

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
