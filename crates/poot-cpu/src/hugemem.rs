//! Long-lived byte buffers backed by transparent huge pages where the OS gives them.
//!
//! Why: a decode step streams every weight once, so with 4 KiB pages it takes a TLB miss every
//! 64 cache lines, and in a VM each miss is a two-level (nested) page walk; the hardware
//! prefetchers also stop at every 4 KiB page; `MADV_HUGEPAGE` made streaming the repacked Q4_0
//! pattern markedly faster (measurements: `docs/performance-history.md`, "Measurements behind the
//! kernels"). Linux's default THP mode on many distributions is `madvise`, so the advice is what
//! turns them on.
//!
//! Invariants: a [`HugeBytes`] is `len` bytes, zeroed when made, 64-byte aligned at least.
//! A buffer of 2 MiB or more is a map of its own, advised over its whole 2 MiB spans only, so
//! its partial tail keeps small pages and resident memory never exceeds what its own bytes
//! touch by more than page rounding. A buffer from 64 KiB up to 2 MiB is a piece of a shared,
//! wholly advised slab (`hugemem_slab.rs`: a small model's matrices are all this size, and on
//! 4 KiB pages SmolLM2's decode read them at 45 GB/s where its 28 MiB head read 53); smaller
//! ones come from the allocator. The advice is a hint: where it is refused (another OS, THP
//! off) the buffer is ordinary memory.

use std::alloc::Layout;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// The x86-64 / aarch64 (4 KiB granule) PMD size: the huge page the advice asks for.
pub(crate) const HUGE: usize = 2 << 20;

/// Whether large buffers ask for huge pages: yes unless the runtime's
/// `CpuOptions::huge_pages` says no (`POOT_CPU_THP=0` by default; for A/B timing, or a host
/// where THP compaction stalls hurt more than TLB misses). Read at each allocation (they are
/// few and large) from the thread's tuning (`crate::tuning`), so one process can hold both
/// kinds.
pub fn enabled() -> bool {
    crate::tuning::Tuning::current().huge_pages
}

/// Whether advised memory can get huge pages here: [`enabled`], and Linux's THP mode is
/// `always` or `madvise` (read once).
pub fn available() -> bool {
    available_with(enabled())
}

/// Whether advised memory gets huge pages here when the tuning's switch is `on`.
pub(crate) fn available_with(on: bool) -> bool {
    static MODE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    on && *MODE.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|m| m.contains("[always]") || m.contains("[madvise]"))
    })
}

/// A zeroed, heap-owned byte buffer (see the module docs).
pub struct HugeBytes {
    ptr: NonNull<u8>,
    len: usize,
    /// How it was allocated, for `Drop`: a private anonymous map of `mapped` bytes, or the
    /// global allocator's `layout`.
    mapped: usize,
    layout: Layout,
    /// The shared slab a buffer under [`HUGE`] bytes was carved from (see [`slab`]); it is
    /// unmapped when its last buffer is dropped.
    #[cfg(target_os = "linux")]
    slab: Option<std::sync::Arc<slab::Slab>>,
}

// SAFETY: `HugeBytes` owns its bytes exclusively (like `Box<[u8]>`); shared access is read-only
// through `&`, mutation needs `&mut`.
unsafe impl Send for HugeBytes {}
// SAFETY: as above.
unsafe impl Sync for HugeBytes {}

impl HugeBytes {
    /// `len` zero bytes; buffers of at least [`HUGE`] bytes start on a 2 MiB boundary and ask
    /// for huge pages over their whole 2 MiB spans.
    pub fn zeroed(len: usize) -> HugeBytes {
        #[cfg(target_os = "linux")]
        if len >= HUGE && enabled() {
            if let Some(b) = Self::mapped(len) {
                return b;
            }
        }
        #[cfg(target_os = "linux")]
        if len >= slab::MIN && enabled() {
            if let Some((ptr, slab)) = slab::carve(len) {
                return HugeBytes {
                    ptr,
                    len,
                    mapped: 0,
                    layout: Layout::new::<u8>(),
                    slab: Some(slab),
                };
            }
        }
        let layout = Layout::from_size_align(len.max(1), 64).expect("buffer size fits isize");
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        HugeBytes {
            ptr,
            len,
            mapped: 0,
            layout,
            #[cfg(target_os = "linux")]
            slab: None,
        }
    }

    /// A copy of `bytes` (see [`HugeBytes::zeroed`]).
    pub fn copy_of(bytes: &[u8]) -> HugeBytes {
        let mut b = HugeBytes::zeroed(bytes.len());
        b.copy_from_slice(bytes);
        b
    }

    /// [`HugeBytes::copy_of`], by 2 MiB spans spread over `pool`'s threads. The first touch
    /// of each span faults in (and the kernel zeroes) a fresh huge page, slow enough on a KVM
    /// guest to be most of a large model's first request, so every thread takes a share. `copied`,
    /// where given, counts the bytes copied span by span (a progress figure another thread may
    /// read).
    pub fn copy_of_on(
        bytes: &[u8],
        pool: &crate::ThreadPool,
        copied: Option<&std::sync::atomic::AtomicU64>,
    ) -> HugeBytes {
        Self::copy_of_on_then(bytes, pool, |span| {
            if let Some(c) = copied {
                c.fetch_add(span.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
        })
    }

    /// [`HugeBytes::copy_of_on`], calling `then(range)` (on the copying thread) for each span
    /// of `bytes` once it is copied: where the caller releases the source's mapped pages span
    /// by span, the source and the copy never both hold the whole buffer.
    pub fn copy_of_on_then(
        bytes: &[u8],
        pool: &crate::ThreadPool,
        then: impl Fn(std::ops::Range<usize>) + Sync,
    ) -> HugeBytes {
        let mut b = HugeBytes::zeroed(bytes.len());
        pool.for_each_chunk_mut(
            &mut b,
            HUGE,
            || (),
            |(), i, dst| {
                let span = i * HUGE..i * HUGE + dst.len();
                dst.copy_from_slice(&bytes[span.clone()]);
                then(span);
            },
        );
        b
    }

    /// A fresh anonymous map of its own (zero pages, nothing touched yet, so the first touch
    /// of each advised span can fault in one huge page), starting on a 2 MiB boundary.
    #[cfg(target_os = "linux")]
    fn mapped(len: usize) -> Option<HugeBytes> {
        let want = len.checked_next_multiple_of(4096)?;
        // Whole 2 MiB spans only: a huge page over the tail would be resident memory that
        // holds none of the buffer's bytes.
        let start = map_aligned(want, len / HUGE * HUGE)?;
        Some(HugeBytes {
            ptr: NonNull::new(start as *mut u8)?,
            len,
            mapped: want,
            layout: Layout::new::<u8>(),
            slab: None,
        })
    }
}

/// A private anonymous map of `want` bytes (a multiple of 4 KiB) starting on a 2 MiB
/// boundary, its first `advise` bytes advised `MADV_HUGEPAGE`; its address, or `None` where
/// the map failed. Unmapped with `munmap(start, want)`.
#[cfg(target_os = "linux")]
fn map_aligned(want: usize, advise: usize) -> Option<usize> {
    let over = want.checked_add(HUGE)?;
    // SAFETY: a private anonymous map with no address hint has no preconditions; the result
    // is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            over,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let base = p as usize;
    let start = base.next_multiple_of(HUGE);
    let (head, tail) = (start - base, base + over - (start + want));
    // SAFETY: both trimmed ranges lie inside the map just made, page-aligned (mmap returns a
    // page-aligned base; `start` and `want` are page multiples), and nothing points into them.
    // A failed unmap only leaves unused address space mapped; a refused advice (THP off, an
    // old kernel) leaves small pages.
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap((start + want) as *mut libc::c_void, tail);
        }
        if advise > 0 {
            libc::madvise(start as *mut libc::c_void, advise, libc::MADV_HUGEPAGE);
        }
    }
    (start != 0).then_some(start)
}

impl Drop for HugeBytes {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if self.slab.is_some() {
            // The slab's own drop unmaps it once its last buffer is gone.
            return;
        }
        #[cfg(target_os = "linux")]
        if self.mapped > 0 {
            // SAFETY: exactly the range `mapped` kept; nothing borrows it any more.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
            return;
        }
        // SAFETY: allocated by `alloc_zeroed` with this layout and not freed before.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

impl HugeBytes {
    /// Whether this buffer was carved from a shared slab (see [`slab`]).
    pub(crate) fn in_slab(&self) -> bool {
        #[cfg(target_os = "linux")]
        return self.slab.is_some();
        #[cfg(not(target_os = "linux"))]
        false
    }
}

impl Deref for HugeBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialized (zeroed) bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for HugeBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `deref`, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for HugeBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HugeBytes")
            .field("len", &self.len)
            .field("mapped", &(self.mapped > 0))
            .field("slab", &self.in_slab())
            .finish()
    }
}

#[cfg(target_os = "linux")]
#[path = "hugemem_slab.rs"]
mod slab;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_buffers_are_zeroed_aligned_and_writable() {
        for len in [
            0,
            1,
            4095,
            slab::MIN,
            300_001,
            HUGE - 1,
            HUGE,
            3 * HUGE + 12345,
        ] {
            let mut b = HugeBytes::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&v| v == 0), "len {len}");
            assert_eq!(b.as_ptr() as usize % 64, 0);
            if len >= HUGE {
                assert_eq!(b.as_ptr() as usize % HUGE, 0, "len {len}");
            }
            for (i, v) in b.iter_mut().enumerate() {
                *v = i as u8;
            }
            assert!(b.iter().enumerate().all(|(i, &v)| v == i as u8));
        }
    }

    #[test]
    fn a_copy_on_the_pool_is_the_bytes() {
        let pool = crate::ThreadPool::new(3).expect("pool");
        for len in [0, 1, HUGE - 1, HUGE, 3 * HUGE + 12345] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
            let copied = std::sync::atomic::AtomicU64::new(0);
            let b = HugeBytes::copy_of_on(&src, &pool, Some(&copied));
            assert_eq!(&b[..], &src[..], "len {len}");
            assert_eq!(copied.into_inner(), len as u64, "len {len}");
        }
    }

    #[test]
    fn a_copy_reports_each_span_once_after_copying_it() {
        let pool = crate::ThreadPool::new(3).expect("pool");
        let len = 3 * HUGE + 12345;
        let src: Vec<u8> = (0..len).map(|i| (i * 13 + i / 4099) as u8).collect();
        let spans = std::sync::Mutex::new(Vec::new());
        let b = HugeBytes::copy_of_on_then(&src, &pool, |span| {
            spans.lock().unwrap().push(span);
        });
        assert_eq!(&b[..], &src[..]);
        let mut spans = spans.into_inner().unwrap();
        spans.sort_by_key(|s| s.start);
        // Whole 2 MiB spans in order, the last one short, covering every byte once.
        let want: Vec<_> = (0..4)
            .map(|i| i * HUGE..((i + 1) * HUGE).min(len))
            .collect();
        assert_eq!(spans, want);
    }

    /// Where the kernel grants THP for advised memory, a touched large buffer is backed by
    /// huge pages (`AnonHugePages` in smaps), and so are buffers under 2 MiB (slab pieces).
    /// Skips where THP is off or set to never.
    #[cfg(target_os = "linux")]
    #[test]
    fn advised_spans_get_huge_pages_where_thp_is_on() {
        if !available() {
            eprintln!("THP off here (or POOT_CPU_THP=0); skipping");
            return;
        }
        let mut b = HugeBytes::zeroed(4 * HUGE);
        b.fill(1);
        assert!(!b.in_slab());
        assert!(huge_kb_at(b.as_ptr() as usize) >= 2048);
        // Enough half-megabyte pieces to fill whole huge pages of their slab.
        let mut small: Vec<HugeBytes> = (0..12).map(|_| HugeBytes::zeroed(HUGE / 4)).collect();
        for s in &mut small {
            assert!(s.in_slab());
            s.fill(1);
        }
        assert!(huge_kb_at(small[6].as_ptr() as usize) >= 2048);
    }

    /// `AnonHugePages` of the mapping holding address `at`, from smaps.
    #[cfg(target_os = "linux")]
    fn huge_kb_at(at: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        // Mapping headers read "lo-hi perms ..."; their fields ("Name:  value") follow.
        let range = |l: &str| -> Option<(usize, usize)> {
            let (lo, hi) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                usize::from_str_radix(lo, 16).ok()?,
                usize::from_str_radix(hi, 16).ok()?,
            ))
        };
        let mut lines = smaps
            .lines()
            .skip_while(|l| !range(l).is_some_and(|(lo, hi)| lo <= at && at < hi));
        let header = lines.next().expect("the buffer's mapping in smaps");
        let huge_kb: usize = lines
            .take_while(|l| range(l).is_none())
            .find_map(|l| l.strip_prefix("AnonHugePages:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("an AnonHugePages line for the buffer's mapping");
        // Memory pressure may deny some huge pages; one is enough to show the advice works.
        if huge_kb < 2048 {
            eprintln!("no huge pages in:\n{header}");
        }
        huge_kb
    }
}
