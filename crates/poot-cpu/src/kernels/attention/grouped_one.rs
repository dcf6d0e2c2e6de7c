//! The grouped ggml attention for one token on AVX-512 where a KV head has at most 3 query
//! heads (a decode step's; `heads_f16` picks it): their scores, softmax and V sums together,
//! reading the f16 cache rows in place (`arch/x86/attention16.rs` has the loops). The
//! multi-token path (`attention/grouped.rs`) widens blocks of rows into scratch, which a tile
//! of tokens then shares; one token uses each row once, so there the copy and its zeroed
//! padding were most of the time. More heads would need a second pass over the rows (the
//! registers hold 3 heads' V sums), which was slower than the widened block at long contexts.
//! Every head's arithmetic is `attention::ggml_heads::head`'s, so outputs are bit-identical
//! to it (tested in `attention/grouped_tests.rs`).

use crate::kernels::arch::x86::attention16::{scores, v_sums};
use crate::kernels::attention::ggml_heads::softmax_round;
use crate::kernels::scratch::AttnScratch as Scratch;

/// The most query heads one call holds (8 lane accumulators each in [`v_sums`], 24 of the 32
/// registers).
pub(crate) const MAX_HEADS: usize = 3;

/// `heads_f16` (`attention/grouped.rs`) for one token attending over positions `0..len`: `q`
/// holds its `g <= 3` heads (`g * hd` values), `o` receives them.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512F and AVX-512VL detected; `hd % 16 == 0`.
#[allow(clippy::too_many_arguments, reason = "one KV head's inputs")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
pub(crate) unsafe fn heads_one<F: Fn(usize) -> usize>(
    hd: usize,
    g: usize,
    q: &[f32],
    len: usize,
    (k_cache, v_cache): (&[half::f16], &[half::f16]),
    row_of: F,
    scale: f32,
    s: &mut Scratch,
    o: &mut [f32],
) {
    assert!(hd > 0 && hd.is_multiple_of(16) && (1..=MAX_HEADS).contains(&g));
    assert!(q.len() == g * hd && o.len() == g * hd);
    // The scratch only grows: every value below is written before it is read, so a warm
    // step clears nothing.
    grow(&mut s.q, g * hd, 0.0);
    grow(&mut s.rows, len, 0);
    grow(&mut s.scores, g * len, 0.0);
    // SAFETY: AVX2 and F16C, as this function's own contract.
    unsafe { crate::kernels::arch::x86::fdot16::f16_round_into(q, &mut s.q[..g * hd]) };
    // Through a `&mut` slice, which cannot alias what `row_of` reads, so its loads hoist out
    // of the loop (`extend` reloaded the shape's fields per position: 0.5% of a decode).
    let mut last = 0;
    for (p, r) in s.rows[..len].iter_mut().enumerate() {
        *r = row_of(p);
        last = last.max(*r);
    }
    // The loops index the caches at these offsets unchecked.
    let end = last.checked_add(hd).expect("cache rows out of bounds");
    assert!(
        end <= k_cache.len() && end <= v_cache.len(),
        "cache rows out of bounds"
    );
    match g {
        // SAFETY: the features of this function's contract; every row offset checked above.
        3 => unsafe { heads::<3>(hd, len, (k_cache, v_cache), scale, s, o) },
        // SAFETY: as above.
        2 => unsafe { heads::<2>(hd, len, (k_cache, v_cache), scale, s, o) },
        // SAFETY: as above.
        _ => unsafe { heads::<1>(hd, len, (k_cache, v_cache), scale, s, o) },
    }
}

/// `v` at least `n` long, grown with `fill` (never shrunk or cleared).
fn grow<T: Copy>(v: &mut Vec<T>, n: usize, fill: T) {
    if v.len() < n {
        v.resize(n, fill);
    }
}

/// [`heads_one`]'s `H` heads: their scores, softmax (`head`'s) and V sums.
///
/// # Safety
/// As [`heads_one`], with `s.rows` checked against both caches, `s.q` and `s.scores` sized
/// for the token's heads.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn heads<const H: usize>(
    hd: usize,
    len: usize,
    (k_cache, v_cache): (&[half::f16], &[half::f16]),
    scale: f32,
    s: &mut Scratch,
    o: &mut [f32],
) {
    let (q, rows) = (&s.q, &s.rows[..len]);
    let mut score_rows = s.scores[..H * len].chunks_exact_mut(len.max(1));
    let w: [&mut [f32]; H] = std::array::from_fn(|_| score_rows.next().unwrap_or_default());
    let qh: [&[f32]; H] = std::array::from_fn(|h| &q[h * hd..(h + 1) * hd]);
    // SAFETY: this function's contract.
    let maxes = unsafe { scores::<H>(k_cache, rows, hd, qh, scale, w) };
    for (h, &m) in maxes.iter().enumerate() {
        let at = h * len;
        softmax_round::<half::f16, true>(&mut s.scores[at..at + len], m);
    }
    let w: [&[f32]; H] = std::array::from_fn(|h| &s.scores[h * len..(h + 1) * len]);
    let mut outs = o.chunks_exact_mut(hd);
    let oh: [&mut [f32]; H] = std::array::from_fn(|_| outs.next().expect("H heads"));
    // SAFETY: this function's contract.
    unsafe { v_sums::<H>(v_cache, &s.rows[..len], hd, w, oh) };
}
