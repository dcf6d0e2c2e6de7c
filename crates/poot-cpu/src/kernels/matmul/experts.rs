//! The mixture-of-experts matmul over an expert stack re-laid 8 rows at a time: `out[s] =
//! W[ids[s]] @ x[row(s)]` for every (token, slot) pair `s` of a step, in one pool dispatch.
//!
//! The stack `[E, N, K]` is re-laid as one `[E * N, K]` matrix (`matmul/repack.rs`,
//! `matmul/repack_k.rs`) with `N` a multiple of 8, so expert `e`'s rows are exactly groups
//! `e * N / 8 .. (e + 1) * N / 8`: re-laying the stack whole is re-laying each expert alone,
//! which is how a [`Stack::Lazy`] stack is filled, expert by expert on first use
//! (`matmul/experts_stack.rs`); both read alike.
//!
//! How: every activation row is quantized once per call (Q8_0/Q8_1 for the 32-value quants,
//! Q8_K for the k-quants; through the activation cache when the caller has one, so an expert
//! stack's gate and up projections share it), then the pairs are ordered by expert (stable in
//! `s`) and their quantized rows gathered expert by expert. The work units are (selected expert,
//! 8-row group) pairs over all selected experts, claimed by the pool's threads in one dispatch,
//! so the threads split the whole op rather than each expert's small matmul; each unit dots its
//! group against that expert's tokens with the same group kernels `matmul/r8.rs` and
//! `matmul/rk.rs` run, one group a unit on every ISA (the dense kernels' two-group AVX-512 VNNI
//! steps and AMX tiles give the same bits, and are not taken here yet). Experts no pair chose
//! are never read.
//!
//! Numerics: each output is bit-identical to the dense re-laid kernel (`matmul_repacked`) on that
//! expert's rows and token (tested on every ISA), and so batch-invariant: a pair's result depends
//! only on its activation row and its expert's rows, not on which other tokens share the step or
//! how they group by expert.
//!
//! Cost: one pass over the selected experts' rows; memory: the quantized rows twice (as
//! quantized, and gathered) plus the Q8 lane corrections and the routing (pairs sorted by
//! expert), all in the thread's reused kernel scratch (`kernels::scratch`).

use crate::error::{check_len, mul};
use crate::kernels::act_cache::ActCache;
use crate::kernels::blocks::RG;
use crate::kernels::format::Format;
use crate::kernels::matmul::experts_stack::LazyStack;
use crate::kernels::matmul::groups::{over_tokens, stream_units};
use crate::kernels::matmul::qdot_k::{dot_scalar, quantized_k};
use crate::kernels::matmul::r8::{corrections, lane_mult};
use crate::kernels::matmul::repack::Repack;
use crate::kernels::matmul::repack_k::stored_row_of;
use crate::kernels::qact::{BlockQ8, BlockQ8K};
use crate::kernels::scratch::{Parked, Scratch};
use crate::kernels::simd::{prefetch_ahead, prefetch_range, Checked, Isa};
use crate::pool::{SharedMut, ThreadPool};
use crate::KernelError;

/// Which pairs read which expert: `order` holds the pair indices sorted by expert (stable),
/// and selected expert `i` is `selected[3 i..3 i + 3] = (expert, first, count)`: its pairs are
/// `order[first..first + count]`. Both live in the thread's kernel scratch, so a warm step
/// allocates nothing here.
struct Routing {
    order: Scratch<usize>,
    selected: Scratch<usize>,
}

impl Routing {
    /// Ids already checked to lie in `0..n_exp`.
    fn new(ids: &[i32], n_exp: usize) -> Routing {
        let mut counts = Scratch::<usize>::zeroed(n_exp + 1);
        for &id in ids {
            counts[id as usize + 1] += 1;
        }
        for e in 0..n_exp {
            counts[e + 1] += counts[e];
        }
        let mut selected = Scratch::<usize>::zeroed(0);
        for e in 0..n_exp {
            if counts[e + 1] > counts[e] {
                selected.extend_from_slice(&[e, counts[e], counts[e + 1] - counts[e]]);
            }
        }
        let mut order = Scratch::<usize>::zeroed(ids.len());
        for (s, &id) in ids.iter().enumerate() {
            let at = &mut counts[id as usize];
            order[*at] = s;
            *at += 1;
        }
        Routing { order, selected }
    }

    /// Selected experts.
    fn len(&self) -> usize {
        self.selected.len() / 3
    }

    /// Selected expert `i`: (expert, first pair in `order`, pairs).
    fn expert(&self, i: usize) -> (usize, usize, usize) {
        let s = &self.selected[3 * i..3 * i + 3];
        (s[0], s[1], s[2])
    }
}

/// An expert stack in the 8-row layout: re-laid whole as one `[E * n, k]` matrix, or expert by
/// expert on first use (`matmul/experts_stack.rs`), which gives the same bytes per expert.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stack<'a> {
    Whole(&'a Repack),
    Lazy(&'a LazyStack),
}

impl<'a> Stack<'a> {
    /// The layout every group has (kind, blocks per row).
    fn layout(self) -> &'a Repack {
        match self {
            Stack::Whole(w) => w,
            Stack::Lazy(l) => l.layout(),
        }
    }

    /// Rows of every expert together, `E * n`, when the stack is `n_exp` experts of whole
    /// 8-row groups.
    fn rows(self, n_exp: usize) -> Option<usize> {
        let rows = match self {
            Stack::Whole(w) => w.n(),
            Stack::Lazy(l) => {
                let (e, n, _) = l.shape();
                (e == n_exp).then_some(e * n)?
            }
        };
        let whole = n_exp > 0 && rows.is_multiple_of(n_exp) && (rows / n_exp).is_multiple_of(RG);
        whole.then_some(rows)
    }

    /// Group `g` of expert `e` (`per_expert` groups each).
    fn group(self, e: usize, g: usize, per_expert: usize) -> &'a [u8] {
        match self {
            Stack::Whole(Repack::Q(w)) => w.group(e * per_expert + g),
            Stack::Whole(Repack::K(w)) => w.group(e * per_expert + g),
            Stack::Whole(Repack::F8(_) | Repack::F8G(_)) => {
                unreachable!("FP8 stacks are refused first")
            }
            Stack::Lazy(l) => l.group(e, g),
        }
    }
}

/// `out[s][n] = dot(W[ids[s]][n], x[row(s)])` for a stack `w` re-laid as `[n_exp * n, k]` (see
/// the module docs; a lazy stack must have every expert `ids` names ready, else a typed error),
/// `ids` being `[t, slots]` (`t * slots` pairs). `x` holds either one row per
/// token (`[t, k]`, row `s / slots`, shared by the token's slots) or one per pair (`[t * slots,
/// k]`, row `s`); `out` is `[t * slots, n]`. Every length and id is checked before anything is
/// written: `n` must be a multiple of 8 and `w` must hold `n_exp` experts of `k` columns.
#[allow(
    clippy::too_many_arguments,
    reason = "the op's operands plus the cache"
)]
pub(crate) fn matmul_experts(
    isa: Isa,
    x: &[f32],
    k: usize,
    w: Stack<'_>,
    n_exp: usize,
    (ids, slots): (&[i32], usize),
    out: &mut [f32],
    pool: &ThreadPool,
    cache: Option<(&mut ActCache, u64)>,
) -> Result<(), KernelError> {
    let ck = isa.checked()?;
    let bad = |detail: String| KernelError::InvalidArgument {
        what: "expert matmul",
        detail,
    };
    let Some(rows) = w.rows(n_exp) else {
        let (rows, what) = match w {
            Stack::Whole(w) => (w.n(), "rows"),
            Stack::Lazy(l) => (l.shape().0, "experts"),
        };
        return Err(bad(format!(
            "{rows} {what} are not {n_exp} experts of 8-row groups"
        )));
    };
    let n = rows / n_exp;
    let layout = w.layout();
    if k != layout.k() {
        return Err(KernelError::Length {
            what: "expert matmul k",
            expected: layout.k(),
            got: k,
        });
    }
    let pairs = ids.len();
    if slots == 0 || !pairs.is_multiple_of(slots) {
        return Err(bad(format!(
            "{pairs} ids are not whole rows of {slots} slots"
        )));
    }
    // One row per pair, or one per token shared by its slots (the same when slots == 1).
    let per_pair = x.len() / k.max(1) == pairs;
    if !per_pair {
        check_len(
            "expert matmul x",
            mul(pairs / slots, k, "expert matmul x")?,
            x.len(),
        )?;
    } else {
        check_len(
            "expert matmul x",
            mul(pairs, k, "expert matmul x")?,
            x.len(),
        )?;
    }
    check_len(
        "expert matmul out",
        mul(pairs, n, "expert matmul out")?,
        out.len(),
    )?;
    if let Some(&id) = ids.iter().find(|&&id| id < 0 || id as usize >= n_exp) {
        return Err(bad(format!("expert id {id} outside 0..{n_exp}")));
    }
    if let Stack::Lazy(l) = w {
        if let Some(&id) = ids.iter().find(|&&id| !l.is_ready(id as usize)) {
            return Err(bad(format!("expert {id} is not re-laid yet")));
        }
    }
    if pairs == 0 || n == 0 {
        return Ok(());
    }
    let routing = Routing::new(ids, n_exp);
    let row = |s: usize| if per_pair { s } else { s / slots };
    match layout {
        Repack::Q(l) => experts_r8(
            ck,
            (w, l.kind, l.nb),
            x,
            &routing,
            &row,
            n,
            out,
            pool,
            cache,
        ),
        Repack::K(l) => experts_rk(
            ck,
            (w, l.kind, l.nb),
            x,
            &routing,
            &row,
            n,
            out,
            pool,
            cache,
        ),
        // `relaid` keeps FP8 stacks in their stored layout, so none reaches here.
        Repack::F8(_) | Repack::F8G(_) => {
            return Err(bad("an FP8 expert stack has no 8-row group kernel".into()))
        }
    }
    Ok(())
}

/// The quantized rows of `xq` (`nb` blocks each) in `routing`'s pair order.
fn gathered<T: Parked>(
    xq: &[T],
    nb: usize,
    routing: &Routing,
    row: &dyn Fn(usize) -> usize,
) -> Scratch<T> {
    let mut out = Scratch::<T>::zeroed(0);
    for &s in routing.order.iter() {
        let r = row(s);
        out.extend_from_slice(&xq[r * nb..(r + 1) * nb]);
    }
    out
}

/// The one dispatch: `body(i, g, write)` for every 8-row group `g` of every selected expert `i`,
/// units of (expert, group) claimed by the pool's threads; `write(tok, res)` stores `res` (8
/// rows' results) for the expert's `tok`-th pair. `group(e, g)` gives a group's bytes, whose
/// first ones each task prefetches. One pair per expert (decode) streams: `stream_units`.
fn over_experts<'w>(
    pool: &ThreadPool,
    routing: &Routing,
    n: usize,
    out: &mut [f32],
    group: &(dyn Fn(usize, usize) -> &'w [u8] + Sync),
    body: impl Fn(usize, usize, &dyn Fn(usize, &[f32])) + Sync,
) {
    let per_expert = n / RG;
    let units = routing.len() * per_expert;
    let shared = SharedMut::new(out);
    let run = |range: std::ops::Range<usize>| {
        for u in range {
            let (i, g) = (u / per_expert, u % per_expert);
            let (_, first, _) = routing.expert(i);
            body(i, g, &|tok, res| {
                let s = routing.order[first + tok];
                for (r, &v) in res.iter().take(RG).enumerate() {
                    // SAFETY: rows 8g..8g + 8 of pair s's output belong to unit (i, g) only (a
                    // pair reads one expert), so no other range writes index s * n + 8g + r.
                    unsafe { shared.write(s * n + g * RG + r, v) };
                }
            });
        }
    };
    let first = |u: usize| group(routing.expert(u / per_expert).0, u % per_expert);
    if routing.order.len() == routing.len() {
        // One pair per selected expert (a decode step): the experts' weights stream from DRAM.
        return stream_units(pool, units, &first, run);
    }
    let (per_task, tasks) = pool.split(units);
    pool.for_each(tasks, |task| {
        let begin = task * per_task;
        let bytes = first(begin);
        prefetch_range(bytes.as_ptr(), bytes.len().min(prefetch_ahead()));
        run(begin..(begin + per_task).min(units));
    });
}

/// [`matmul_experts`] for the 32-value quants (`matmul/r8.rs`'s kernels and orders).
#[allow(
    clippy::too_many_arguments,
    reason = "matmul_experts' validated operands"
)]
fn experts_r8(
    ck: Checked,
    (w, kind, nb): (Stack<'_>, Format, usize),
    x: &[f32],
    routing: &Routing,
    row: &dyn Fn(usize) -> usize,
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
    cache: Option<(&mut ActCache, u64)>,
) {
    let mut local = Scratch::<BlockQ8>::zeroed(0);
    let xq = crate::kernels::matmul::q8::quantized(x, kind.act_sum(), cache, &mut local, pool);
    let xg = gathered(xq, nb, routing, row);
    // Blocks per scale and zero point of a grouped Q4_Z stack (`repack_zg.rs`), else 1.
    let qgroup = match w.layout() {
        Repack::Q(r) => r.qgroup,
        _ => 1,
    };
    let simd = crate::kernels::matmul::groups::simd_rows(ck);
    let vnni = crate::kernels::matmul::groups::vnni_rows(ck);
    let (mult, blocks) = (lane_mult(kind, vnni), kind != Format::Q4_1);
    let mut corr = Scratch::<[i32; 8]>::zeroed(0);
    corr.resize(routing.order.len() * nb, [0; 8]);
    if simd && mult != 0 {
        corrections(&xg, mult, &mut corr);
        if blocks {
            for c in corr.iter_mut() {
                *c = [c.iter().sum(), 0, 0, 0, 0, 0, 0, 0];
            }
        }
    }
    let (xg, corr): (&[BlockQ8], &[[i32; 8]]) = (&xg, &corr);
    let per_expert = n / RG;
    let group = |e: usize, g: usize| w.group(e, g, per_expert);
    over_experts(pool, routing, n, out, &group, |i, g, write| {
        let (e, first, t) = routing.expert(i);
        let grp = group(e, g);
        let (a, c) = (&xg[first * nb..], &corr[first * nb..]);
        if !simd {
            use crate::kernels::arch::generic::qdot_r8_generic;
            let mut res = Scratch::<f32>::zeroed(t * RG);
            if qgroup > 1 {
                use crate::kernels::arch::generic::qdot_zg_generic::group_z;
                group_z(qgroup, grp, nb, &a[..t * nb], t, &mut res);
            } else if blocks {
                qdot_r8_generic::group_blocks(kind, grp, nb, &a[..t * nb], t, &mut res);
            } else {
                qdot_r8_generic::group(kind, grp, nb, &a[..t * nb], t, &mut res);
            }
            for tok in 0..t {
                write(tok, &res[tok * RG..(tok + 1) * RG]);
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            use crate::kernels::arch::x86::qdot_r8::{group, group_blocks, tile_tokens};
            let mut res = [0.0f32; 4 * RG];
            let tile = |_| tile_tokens(vnni, kind, blocks);
            over_tokens(t, tile, RG, &mut res, write, |tok, tt, res| {
                let (a, c) = (&a[tok * nb..], &c[tok * nb..]);
                if qgroup > 1 {
                    use crate::kernels::arch::x86::qdot_zg::group_z;
                    group_z(vnni, qgroup, grp, nb, a, c, tt, res);
                } else if blocks {
                    group_blocks(vnni, kind, grp, nb, a, c, tt, res);
                } else {
                    group(vnni, kind, grp, nb, a, c, tt, res);
                }
            });
        }
    });
}

/// [`matmul_experts`] for the k-quants (`matmul/rk.rs`'s kernels).
#[allow(
    clippy::too_many_arguments,
    reason = "matmul_experts' validated operands"
)]
fn experts_rk(
    ck: Checked,
    (w, kind, nb): (Stack<'_>, Format, usize),
    x: &[f32],
    routing: &Routing,
    row: &dyn Fn(usize) -> usize,
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
    cache: Option<(&mut ActCache, u64)>,
) {
    let mut local = Scratch::<BlockQ8K>::zeroed(0);
    let xq = quantized_k(x, cache, &mut local);
    let xg = gathered(xq, nb, routing, row);
    let xg: &[BlockQ8K] = &xg;
    let simd = crate::kernels::matmul::groups::simd_rows(ck);
    let per_expert = n / RG;
    let group = |e: usize, g: usize| w.group(e, g, per_expert);
    over_experts(pool, routing, n, out, &group, |i, g, write| {
        let (e, first, t) = routing.expert(i);
        let a = &xg[first * nb..(first + t) * nb];
        if !simd {
            let mut stored = Scratch::<u8>::zeroed(nb * kind.block_bytes());
            let mut res = [0.0f32; RG];
            let grp = group(e, g);
            for tok in 0..t {
                for (r, v) in res.iter_mut().enumerate() {
                    stored_row_of(kind, nb, grp, r, &mut stored);
                    *v = dot_scalar(kind, &stored, &a[tok * nb..(tok + 1) * nb]);
                }
                write(tok, &res);
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            use crate::kernels::arch::x86::qdot_rk::{group as group_rk, tile_tokens};
            let grp = group(e, g);
            let mut res = [0.0f32; 4 * RG];
            let tile = |left| tile_tokens(kind, left);
            over_tokens(t, tile, RG, &mut res, write, |tok, tt, res| {
                group_rk(ck, kind, grp, nb, &a[tok * nb..], tt, res);
            });
        }
    });
}

#[cfg(test)]
#[path = "experts_tests.rs"]
mod tests;
