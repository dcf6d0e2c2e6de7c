//! The task loops of the matmuls that read weight rows in place under ggml's numerics.
//!
//! [`over_row_groups`]: the stored rows (the Q8, Q8_K and FP8 dots), `NR` rows a group, groups
//! claimed by the pool's threads, each group dotted against every token by the caller's row dot
//! (a generic closure, monomorphized per caller: no indirection per group or block).
//!
//! [`over_segments`]: the 8-row repacked layouts (`matmul/r8.rs`, `matmul/rk.rs`), whole 8-row
//! groups of one or several weights, claimed by the pool's threads in one dispatch.
//!
//! Several weights that read the same input (a layer's q/k/v, its gate/up) run as the segments
//! of one dispatch: one wake of the pool and one join instead of one per weight, and tasks
//! balanced over all their rows. Each row's arithmetic is the same as in a call of its own, so a
//! fused call is bit-identical to separate ones (`r8_tests.rs`, `rk_tests.rs`).
//!
//! Invariants: every `per`-th group of every segment runs exactly once, in a task no other task
//! shares rows with; at most [`MAX_SEGMENTS`] segments per call.

use crate::kernels::blocks::RG;
use crate::kernels::scratch::Scratch;
use crate::kernels::simd::{prefetch_ahead, NR};
use crate::pool::{SharedMut, ThreadPool};

/// Whether `ck`'s ISA runs the 8-row layouts' x86 loops (AVX2 and up; never off x86); the
/// portable loops run otherwise.
pub(crate) fn simd_rows(ck: crate::kernels::simd::Checked) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::simd::Isa;
        matches!(ck.isa(), Isa::Avx2 | Isa::Avx512 | Isa::Amx)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ck;
        false
    }
}

/// Whether the 8-row loops take AVX-512 VNNI under `ck` (never off x86).
pub(crate) fn vnni_rows(ck: crate::kernels::simd::Checked) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        ck.isa().avx512() && crate::kernels::arch::x86::qdot_r8::has_vnni()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ck;
        false
    }
}

/// How a row dot laid out its results in the group's scratch: `res[tok * tok_stride + r *
/// row_stride]` holds row `r` dotted with token `tok`.
#[derive(Clone, Copy)]
pub(crate) struct Layout {
    pub(crate) tok_stride: usize,
    pub(crate) row_stride: usize,
}

/// The task loop of the stored-row matmuls: `out[tok][row] = dot(W[row], token tok)` for the
/// `n` rows of `row_bytes` bytes at `w` and `t` tokens, `out` being `[t, n]`. Rows go in groups
/// of `NR`, split into tasks (about four per thread) over the pool's threads; for each group
/// `dot(rows, nr, res)` fills `res` (`t * NR` values, the thread's scratch) with the `nr`
/// rows at `rows` dotted with every token and returns where it put them ([`Layout`]).
///
/// Invariant: every row is written by exactly one task, once per token, with the value `dot`
/// computed for it; the order of groups and tasks changes no result.
pub(crate) fn over_row_groups<D>(
    pool: &ThreadPool,
    (w, row_bytes, n): (&[u8], usize, usize),
    t: usize,
    out: &mut [f32],
    dot: D,
) where
    D: Fn(&[u8], usize, &mut [f32]) -> Layout + Sync,
{
    let groups = n.div_ceil(NR);
    let (per_task, tasks) = pool.split(groups);
    let shared = SharedMut::new(out);
    pool.for_each_init(
        tasks,
        || Scratch::zeroed(t * NR),
        |res, task| {
            for g in task * per_task..((task + 1) * per_task).min(groups) {
                let n0 = g * NR;
                let nr = NR.min(n - n0);
                let rows = &w[n0 * row_bytes..(n0 + nr) * row_bytes];
                let at = dot(rows, nr, &mut res[..]);
                for tok in 0..t {
                    for r in 0..nr {
                        let v = res[tok * at.tok_stride + r * at.row_stride];
                        // SAFETY: row n0 + r belongs to this task's groups only, so no other
                        // task writes index tok * n + n0 + r.
                        unsafe { shared.write(tok * n + n0 + r, v) };
                    }
                }
            }
        },
    );
}

/// The most weights one fused call takes (q/k/v is three).
pub(crate) const MAX_SEGMENTS: usize = 4;

/// One weight's part of a call: `groups` 8-row groups walked `per` (1, or 2 for kernels that
/// take two groups at once) at a time, written into `out` (`[t, n]`, padding rows dropped).
pub(crate) struct Segment<'o> {
    pub(crate) groups: usize,
    pub(crate) per: usize,
    pub(crate) n: usize,
    pub(crate) out: &'o mut [f32],
}

/// The token loop of one group's (or pair's) kernel: `kernel(tok, tt, res)` fills `res` with
/// `tt` tokens' `width` results from token `tok` on, `tt` being `tile(left)` capped at the
/// tokens left; `write` then stores each token's results.
// Inlined: out of line, its call and the closures' around every 8-row group cost 6-12% of a
// one-thread matmul from L2 (`matmul_bench Q4_1`, 576 and 3072 rows of 576).
#[inline(always)]
pub(crate) fn over_tokens(
    t: usize,
    tile: impl Fn(usize) -> usize,
    width: usize,
    res: &mut [f32],
    write: &dyn Fn(usize, &[f32]),
    mut kernel: impl FnMut(usize, usize, &mut [f32]),
) {
    let mut tok = 0;
    while tok < t {
        let tt = tile(t - tok).min(t - tok);
        kernel(tok, tt, res);
        for j in 0..tt {
            write(tok + j, &res[j * width..(j + 1) * width]);
        }
        tok += tt;
    }
}

/// The most units a one-token thread claims at once: small enough that a thread which falls
/// behind leaves little for the others to wait on (16 Q4_1 groups at k = 576 are 46 KiB).
const STREAM_CHUNK: usize = 16;

/// The segments of one call: the first ones `Some`, the rest `None`.
pub(crate) type Segments<'o> = [Option<Segment<'o>>; MAX_SEGMENTS];

/// One segment per weight of `ws` (at most [`MAX_SEGMENTS`]) writing `outs[i]`, its groups,
/// groups a unit and rows from `of(w)` as `(groups, per, n)`.
pub(crate) fn segments<'o, W>(
    ws: &[W],
    outs: &'o mut [&mut [f32]],
    of: impl Fn(&W) -> (usize, usize, usize),
) -> Segments<'o> {
    let mut segs: Segments<'o> = [None, None, None, None];
    for ((seg, w), out) in segs.iter_mut().zip(ws).zip(outs.iter_mut()) {
        let (groups, per, n) = of(w);
        *seg = Some(Segment {
            groups,
            per,
            n,
            out,
        });
    }
    segs
}

/// The units of a call's segments: `starts[s]` is segment `s`'s first unit (units numbered over
/// all segments in order), `meta[s]` its `(n, per, groups)`, `outs[s]` its output.
struct Units<'o> {
    starts: [usize; MAX_SEGMENTS + 1],
    meta: [(usize, usize, usize); MAX_SEGMENTS],
    outs: [Option<SharedMut<'o, f32>>; MAX_SEGMENTS],
    count: usize,
}

impl<'o> Units<'o> {
    fn new(segs: Segments<'o>) -> Self {
        let mut u = Units {
            starts: [0; MAX_SEGMENTS + 1],
            meta: [(0, 1, 0); MAX_SEGMENTS],
            outs: [None, None, None, None],
            count: 0,
        };
        for (s, seg) in segs.into_iter().map_while(|s| s).enumerate() {
            u.starts[s + 1] = u.starts[s] + seg.groups.div_ceil(seg.per);
            u.meta[s] = (seg.n, seg.per, seg.groups);
            u.outs[s] = Some(SharedMut::new(seg.out));
            u.count = s + 1;
        }
        u
    }

    fn total(&self) -> usize {
        self.starts[self.count]
    }

    /// The segment holding unit `u`.
    fn segment(&self, u: usize) -> usize {
        (0..self.count).rfind(|&s| self.starts[s] <= u).unwrap_or(0)
    }

    /// Unit `u`'s segment and first group.
    fn locate(&self, u: usize) -> (usize, usize) {
        let s = self.segment(u);
        (s, (u - self.starts[s]) * self.meta[s].1)
    }

    fn out(&self, s: usize) -> &SharedMut<'o, f32> {
        let Some(out) = &self.outs[s] else {
            unreachable!("every segment below segs.len() has its output")
        };
        out
    }
}

/// The task loop: `body(s, g, write)` runs for every `per`-th group `g` of every segment `s`, in
/// whole units of `per` groups; `write(tok, res)` stores `res` (rows `8g..8g + res.len()` of
/// segment `s`) for token `tok`. Without `first`, units go in tasks (about four per thread over
/// all segments together, which balances load when other processes share the cores). With
/// `first` (one token, whose call streams the weights; `first(s, g)` gives a group's bytes),
/// the units go as in [`over_segments_one`], a group per call.
pub(crate) fn over_segments<'w, B>(
    pool: &ThreadPool,
    segs: Segments<'_>,
    first: Option<&(dyn Fn(usize, usize) -> &'w [u8] + Sync)>,
    body: B,
) where
    B: Fn(usize, usize, &dyn Fn(usize, &[f32])) + Sync,
{
    let units = Units::new(segs);
    let total = units.total();
    let run = |range: std::ops::Range<usize>| {
        for u in range {
            let (s, g) = units.locate(u);
            let (n, _, _) = units.meta[s];
            let out = units.out(s);
            body(s, g, &|tok, res| {
                // The group's rows (padding rows past `n` dropped), stored at once.
                let rows = res.len().min(n.saturating_sub(g * RG));
                let at = tok * n + g * RG;
                // SAFETY: rows of unit u of segment s belong to this range only, so no other
                // range writes indices tok * n + 8g + r (r < per * 8) of that segment's output.
                unsafe { out.slice_mut(at..at + rows) }.copy_from_slice(&res[..rows]);
            });
        }
    };
    let Some(first) = first else {
        let (per_task, tasks) = pool.split(total);
        pool.for_each(tasks, |task| {
            run(task * per_task..((task + 1) * per_task).min(total))
        });
        return;
    };
    let first_of = |u: usize| {
        let (s, g) = units.locate(u);
        first(s, g)
    };
    stream_units(pool, total, &first_of, run);
}

/// The one-token task loop: `body(s, g0, g1, out)` runs groups `g0..g1` of segment `s` (whole
/// units, within one segment), `out` being their rows of that segment's output (`[n]`; padding
/// rows past `n` dropped, so a segment's last group may be short). Each thread walks one
/// contiguous run of units and then takes from the back of the others'
/// (`ThreadPool::for_each_run`), prefetching the first [`prefetch_ahead`] bytes of each range
/// that does not continue its stream (`first(s, g)` gives a group's bytes): a thread's stream
/// restarting at every task had made a small matrix mostly restarts.
///
/// Why a range per call and not a group: a group at SmolLM2's `k = 576` is under 300 cycles of
/// kernel work, and a call per group (finding its segment, the kernel's entry checks and
/// set-up, a result store through a closure) had cost a tenth of that.
pub(crate) fn over_segments_one<'w, B>(
    pool: &ThreadPool,
    segs: Segments<'_>,
    first: &(dyn Fn(usize, usize) -> &'w [u8] + Sync),
    body: B,
) where
    B: Fn(usize, usize, usize, &mut [f32]) + Sync,
{
    let units = Units::new(segs);
    let run = |range: std::ops::Range<usize>| {
        let mut u = range.start;
        while u < range.end {
            let s = units.segment(u);
            let (n, per, groups) = units.meta[s];
            let end = units.starts[s + 1].min(range.end);
            let g0 = (u - units.starts[s]) * per;
            let g1 = ((end - units.starts[s]) * per).min(groups);
            // SAFETY: units u..end of segment s belong to this range only, so no other range
            // writes rows 8 * g0..8 * g1 of that segment's output.
            let out = unsafe { units.out(s).slice_mut(g0 * RG..(g1 * RG).min(n)) };
            body(s, g0, g1, out);
            u = end;
        }
    };
    let first_of = |u: usize| {
        let (s, g) = units.locate(u);
        first(s, g)
    };
    stream_units(pool, units.total(), &first_of, run);
}

/// The dispatch of a one-token call that streams its weights from DRAM: `run(range)` over
/// ranges covering `0..units`, each thread walking one contiguous run of units and then taking
/// from the back of the others' (`ThreadPool::for_each_run`), in claims of up to
/// [`STREAM_CHUNK`]. A range that does not continue its thread's stream (its first, or one
/// taken from another's back) first prefetches [`prefetch_ahead`] bytes of its first unit
/// (`first(u)` gives a unit's bytes).
pub(crate) fn stream_units<'w>(
    pool: &ThreadPool,
    units: usize,
    first: &(dyn Fn(usize) -> &'w [u8] + Sync),
    run: impl Fn(std::ops::Range<usize>) + Sync,
) {
    let chunk = (units / (pool.n_threads() * 8)).clamp(1, STREAM_CHUNK);
    pool.for_each_run(units, chunk, |range, fresh| {
        if fresh {
            let bytes = first(range.start);
            crate::kernels::simd::prefetch_range(bytes.as_ptr(), bytes.len().min(prefetch_ahead()));
        }
        run(range);
    });
}
