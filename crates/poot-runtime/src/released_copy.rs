//! A weight copy a store made at load (a GPTQ/AWQ/FP8 layer re-laid into poot's rows) that a
//! runtime may release once it holds its own form of it (the CPU runtime's 8-row re-lay), as a
//! mapped checkpoint's tensor releases its pages.
//!
//! Why a mapping and not a `Vec`: `WeightStore::bytes` lends `&[u8]` for the store's lifetime,
//! so memory behind a lent slice can never be freed. The copy lives in an anonymous mapping
//! instead; releasing it drops its pages from the resident set (`MADV_DONTNEED`) while the
//! mapping, and so every slice into it, stays valid.
//!
//! Invariants: a mapping, once made, is never unmapped while the copy lives (retired ones stay
//! in `maps`, holding no pages). A released copy reads as zeros through slices lent before the
//! release, so the runtime that releases a tensor must not read those slices again (it reads its
//! own copy); [`ReleasedCopy::bytes`] after a release rebuilds the bytes into a fresh mapping
//! from the checkpoint (the same bytes: the re-lay is deterministic), so every later reader
//! sees the copy as it was. A copy that was never released is never rebuilt.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use memmap2::{Mmap, MmapMut};

/// Rebuilds a released copy's bytes from the checkpoint (the load's own re-lay).
pub(crate) type Rebuild = Box<dyn Fn() -> Vec<u8> + Send + Sync>;

/// See the module docs.
pub(crate) struct ReleasedCopy {
    /// Every mapping made for this copy; the last one holds the current bytes.
    maps: Mutex<Vec<Mmap>>,
    /// Where the current bytes are and how many (read without the lock).
    ptr: std::sync::atomic::AtomicPtr<u8>,
    len: usize,
    released: AtomicBool,
    rebuild: Rebuild,
}

impl std::fmt::Debug for ReleasedCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleasedCopy")
            .field("len", &self.len)
            .field("released", &self.released.load(Ordering::Acquire))
            .finish()
    }
}

/// `bytes` in a fresh read-only anonymous mapping (an empty copy gets a one-byte map so that
/// every copy has an address).
fn mapped(bytes: &[u8]) -> std::io::Result<Mmap> {
    let mut m = MmapMut::map_anon(bytes.len().max(1))?;
    m[..bytes.len()].copy_from_slice(bytes);
    m.make_read_only()
}

impl ReleasedCopy {
    /// `bytes` as a releasable copy; `rebuild` makes them again after a release.
    pub(crate) fn new(bytes: Vec<u8>, rebuild: Rebuild) -> std::io::Result<Self> {
        let map = mapped(&bytes)?;
        let ptr = map.as_ptr().cast_mut();
        Ok(Self {
            maps: Mutex::new(vec![map]),
            ptr: std::sync::atomic::AtomicPtr::new(ptr),
            len: bytes.len(),
            released: AtomicBool::new(false),
            rebuild,
        })
    }

    /// The copy's bytes, rebuilt first if it was released.
    pub(crate) fn bytes(&self) -> &[u8] {
        if self.released.load(Ordering::Acquire) {
            let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
            if self.released.load(Ordering::Acquire) {
                let again = (self.rebuild)();
                debug_assert_eq!(again.len(), self.len, "a rebuild is the same bytes");
                // A failed map leaves the copy released: its slice then reads zeros, which
                // the length check below cannot catch, so this is the one place that panics.
                let map = mapped(&again).expect("mapping a rebuilt weight copy");
                self.ptr.store(map.as_ptr().cast_mut(), Ordering::Release);
                maps.push(map);
                self.released.store(false, Ordering::Release);
            }
        }
        let ptr = self.ptr.load(Ordering::Acquire);
        // SAFETY: `ptr` is the start of a live mapping of at least `len` bytes in `maps`, which
        // are never unmapped while `self` lives (module invariant), and nothing writes to a
        // mapping after `mapped` made it read-only.
        unsafe { std::slice::from_raw_parts(ptr, self.len) }
    }

    /// Drops the copy's pages from the resident set (see the module docs).
    pub(crate) fn release(&self) {
        let maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(map) = maps.last() {
            // SAFETY: `MADV_DONTNEED` on a private anonymous map leaves the mapping valid (its
            // pages read as zeros); slices lent before the release are not read again by the
            // releasing runtime, and `bytes` rebuilds the copy for any later reader (module
            // invariant). A refusal by the kernel only leaves the pages resident.
            let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    }

    /// Bytes of the copy.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// Hands the heap's free pages back to the system: each copy was built in a `Vec` and moved
/// into its mapping, and glibc keeps freed blocks below its (adaptive) map threshold in the heap,
/// where they would count as resident beside the copies (measured: 2.5 MB on a 29 MB GPTQ
/// checkpoint, 3.5 MB on a 54 MB FP8 one). Elsewhere the allocator's own policy stands.
pub(crate) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    fn resident_kib() -> usize {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn a_released_copy_leaves_the_resident_set_and_rebuilds_on_the_next_read() {
        let len = 64 << 20;
        let pattern = |i: usize| (i * 31 % 251) as u8;
        let builds = Arc::new(AtomicUsize::new(0));
        let counted = builds.clone();
        let rebuild: Rebuild = Box::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            (0..len).map(pattern).collect()
        });
        let copy = ReleasedCopy::new((0..len).map(pattern).collect(), rebuild).unwrap();
        let before = resident_kib();
        assert!(copy
            .bytes()
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(i)));
        copy.release();
        let after = resident_kib();
        // The copy's 64 MiB left the resident set (other threads' noise is far smaller).
        assert!(before >= after + 48 * 1024, "{before} KiB -> {after} KiB");
        assert_eq!(builds.load(Ordering::SeqCst), 0);
        assert!(copy
            .bytes()
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(i)));
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        // Released twice, rebuilt once per release.
        copy.release();
        copy.release();
        assert_eq!(copy.bytes()[12345], pattern(12345));
        assert_eq!(builds.load(Ordering::SeqCst), 2);
        assert_eq!(copy.len(), len);
    }

    #[test]
    fn a_copy_never_released_is_never_rebuilt() {
        let rebuild: Rebuild = Box::new(|| panic!("rebuilt without a release"));
        let copy = ReleasedCopy::new(vec![7u8; 100], rebuild).unwrap();
        assert_eq!(copy.bytes(), &[7u8; 100][..]);
        assert_eq!(copy.bytes().len(), 100);
    }
}
