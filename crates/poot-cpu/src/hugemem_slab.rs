//! Shared slabs for buffers under 2 MiB: [`carve`] hands out consecutive pieces of one
//! 2 MiB-aligned anonymous map advised `MADV_HUGEPAGE` over its whole length, so a small
//! model's weights (each matrix of SmolLM2-135M is 0.2-1.1 MiB) stream from huge pages like a
//! large model's do, instead of from the allocator's 4 KiB pages.
//!
//! Invariants: a piece is never handed out twice, so it is zero when carved (the map is fresh
//! and pieces are only ever cut from its untouched end); pieces are 64-byte aligned and do
//! not overlap; each piece holds its slab (`Arc`), and the cursor only a `Weak`, so a slab is
//! unmapped when its last piece is dropped, and a new slab is mapped when the cursor's slab
//! is full or gone. Resident memory: what the pieces' bytes touch, rounded up to huge pages,
//! plus the bytes of dropped pieces whose slab still holds a live one (weights are made and
//! dropped together with their plan, so a slab's pieces usually go together). So a temporary
//! buffer must not be a `HugeBytes`: a MoE step's new experts had each been re-laid into one
//! and copied into their stack, which left a 32 MiB slab resident (`matmul/experts_stack.rs`
//! now re-lays them in place).

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::{map_aligned, HUGE};

/// The smallest buffer carved from a slab: smaller ones (norm weights, biases) are few and
/// read once a layer, so the allocator keeps them.
pub(super) const MIN: usize = 64 << 10;

/// Bytes of address space per slab (pieces are under [`HUGE`], so at most 1/16 of a slab is
/// left unused at its end, and that tail is never touched).
const SLAB: usize = 16 * HUGE;

/// One shared map, unmapped on drop.
#[derive(Debug)]
pub(super) struct Slab {
    start: usize,
    len: usize,
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: exactly the range `map_aligned` returned; the last piece borrowing it is
        // being dropped.
        unsafe { libc::munmap(self.start as *mut libc::c_void, self.len) };
    }
}

/// The slab pieces are being cut from and the offset of its untouched end.
struct Cursor {
    slab: Weak<Slab>,
    at: usize,
}

static CURSOR: Mutex<Cursor> = Mutex::new(Cursor {
    slab: Weak::new(),
    at: 0,
});

/// A zeroed piece of `len` bytes (`MIN <= len < HUGE`) and the slab that holds it; `None`
/// where a new slab could not be mapped.
pub(super) fn carve(len: usize) -> Option<(NonNull<u8>, Arc<Slab>)> {
    carve_in(
        &mut CURSOR.lock().unwrap_or_else(PoisonError::into_inner),
        len,
    )
}

/// [`carve`] with the cursor `cur`.
fn carve_in(cur: &mut Cursor, len: usize) -> Option<(NonNull<u8>, Arc<Slab>)> {
    debug_assert!((MIN..HUGE).contains(&len));
    let need = len.next_multiple_of(64);
    let slab = match cur.slab.upgrade() {
        Some(s) if cur.at + need <= s.len => s,
        _ => {
            let start = map_aligned(SLAB, SLAB)?;
            let s = Arc::new(Slab { start, len: SLAB });
            cur.slab = Arc::downgrade(&s);
            cur.at = 0;
            s
        }
    };
    let ptr = NonNull::new((slab.start + cur.at) as *mut u8)?;
    cur.at += need;
    Some((ptr, slab))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor() -> Cursor {
        Cursor {
            slab: Weak::new(),
            at: 0,
        }
    }

    /// Pieces of one slab are zeroed, aligned, disjoint and writable; the slab lives while a
    /// piece does and goes with the last.
    #[test]
    fn pieces_are_zeroed_disjoint_and_their_slab_goes_with_the_last() {
        let mut cur = cursor();
        let sizes = [MIN, MIN + 1, 300_001, HUGE - 1, 777_777];
        let pieces: Vec<_> = sizes
            .iter()
            .map(|&n| (carve_in(&mut cur, n).expect("a map"), n))
            .collect();
        let slab = Arc::downgrade(&pieces[0].0 .1);
        for (i, ((p, s), n)) in pieces.iter().enumerate() {
            assert!(Arc::ptr_eq(s, &pieces[0].0 .1), "one slab holds them all");
            assert_eq!(p.as_ptr() as usize % 64, 0);
            // SAFETY: `n` bytes of a live piece, no other reference to them.
            let b = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), *n) };
            assert!(b.iter().all(|&v| v == 0), "piece {i}");
            b.fill(i as u8 + 1);
        }
        // Writing each piece left every other piece's bytes as written: none overlap.
        for (i, ((p, _), n)) in pieces.iter().enumerate() {
            // SAFETY: as above.
            let b = unsafe { std::slice::from_raw_parts(p.as_ptr(), *n) };
            assert!(b.iter().all(|&v| v == i as u8 + 1), "piece {i} overwritten");
        }
        let mut pieces = pieces;
        let last = pieces.pop().expect("pieces");
        drop(pieces);
        assert!(
            slab.upgrade().is_some(),
            "the last piece still holds the slab"
        );
        drop(last);
        assert!(slab.upgrade().is_none(), "the slab outlived its pieces");
        // The cursor's slab is gone, so the next piece starts a fresh one at its start.
        let (p, s) = carve_in(&mut cur, MIN).expect("a map");
        assert_eq!(p.as_ptr() as usize, s.start);
    }

    /// A piece that does not fit in what is left of a slab starts a new one.
    #[test]
    fn a_full_slab_is_replaced() {
        let mut cur = cursor();
        let n = HUGE - 4096;
        let pieces: Vec<_> = (0..SLAB / n + 1)
            .map(|_| carve_in(&mut cur, n).expect("a map"))
            .collect();
        let mut starts: Vec<usize> = pieces.iter().map(|(_, s)| s.start).collect();
        starts.dedup();
        assert_eq!(starts.len(), 2, "{starts:?}");
        for (p, s) in &pieces {
            let at = p.as_ptr() as usize;
            assert!(at >= s.start && at + n <= s.start + s.len);
            assert_eq!(s.start % HUGE, 0);
        }
    }
}
