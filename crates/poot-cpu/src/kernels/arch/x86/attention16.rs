//! The grouped ggml attention's one-token loops on AVX-512 (`attention/grouped_one.rs`, the
//! only caller): scores of up to 3 query heads and their V sums read the f16 cache rows in
//! place, each K and V row widened in registers (no widened copy of the rows, no zeroed
//! padding). Each output sees the per-head ggml attention's operations in its order (8-lane
//! dots folded by `hsum8`'s additions, lane-major V sums from +0 folded by `hsum8`), so results
//! are bit-identical to `attention::ggml_heads::head` (`attention/grouped_tests.rs`).
//!
//! Invariant (soundness): every `unsafe fn` here is reached only from `grouped_one`, after the
//! caller detected AVX2, FMA, F16C, AVX-512F and AVX-512VL, with every row offset `rows[p] + hd` inside
//! the cache it indexes (checked there once per call).

use std::arch::x86_64::*;

use crate::kernels::arch::x86::attention::hsum8x8;

/// Positions per step of [`scores`]: one register of each head's lanes per position.
const STEP: usize = 8;

/// `H` heads' scaled scores (`out[h][p] = scale * dot(q[h], k row p)` in `head`'s order: 8 FMA
/// lanes over the row's 8-float chunks in order, folded by `hsum8`) over the positions whose
/// rows start at `rows[p]` in `k`; returns each head's max score. `q[h]` holds `hd` floats.
///
/// How: 8 positions a step, each K chunk widened once for all `H` heads' FMAs (`H * 8`
/// accumulators), each head's 8 positions folded by one [`hsum8x8`]; the last `len % 8`
/// positions one by one.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512F and AVX-512VL detected; `hd % 8 == 0`; `k[rows[p]..rows[p] + hd]` in bounds
/// for every `p` (the module invariant); each `out[h]` holds `rows.len()` values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
pub(crate) unsafe fn scores<const H: usize>(
    k: &[half::f16],
    rows: &[usize],
    hd: usize,
    q: [&[f32]; H],
    scale: f32,
    out: [&mut [f32]; H],
) -> [f32; H] {
    let n = rows.len();
    assert!(hd.is_multiple_of(8) && q.iter().all(|q| q.len() >= hd));
    assert!(out.iter().all(|o| o.len() >= n));
    let kp = k.as_ptr();
    let mut maxes = [f32::NEG_INFINITY; H];
    let mut p = 0;
    // SAFETY: rows p + j < n inside `k` (the contract), `hd` floats in each query, scores
    // p..p + 8 <= n in each output (asserted).
    unsafe {
        let scale8 = _mm256_set1_ps(scale);
        let mut max8 = [_mm256_set1_ps(f32::NEG_INFINITY); H];
        while p + STEP <= n {
            let r: [*const half::f16; STEP] = std::array::from_fn(|j| kp.add(rows[p + j]));
            let mut acc = [[_mm256_setzero_ps(); STEP]; H];
            for i in (0..hd).step_by(8) {
                let qv: [__m256; H] =
                    std::array::from_fn(|h| _mm256_loadu_ps(q[h].as_ptr().add(i)));
                for (j, rj) in r.iter().enumerate() {
                    let kj = _mm256_cvtph_ps(_mm_loadu_si128(rj.add(i).cast()));
                    for h in 0..H {
                        acc[h][j] = _mm256_fmadd_ps(kj, qv[h], acc[h][j]);
                    }
                }
            }
            for h in 0..H {
                let x = _mm256_mul_ps(hsum8x8(acc[h]), scale8);
                max8[h] = _mm256_max_ps(max8[h], x);
                _mm256_storeu_ps(out[h].as_mut_ptr().add(p), x);
            }
            p += STEP;
        }
        for h in 0..H {
            let mut m8 = [0.0f32; 8];
            _mm256_storeu_ps(m8.as_mut_ptr(), max8[h]);
            for v in m8 {
                maxes[h] = maxes[h].max(v);
            }
        }
    }
    for (pp, &row) in rows.iter().enumerate().skip(p) {
        for h in 0..H {
            // SAFETY: row `pp` inside `k` (the contract); `hd` floats in `q[h]` (asserted).
            let x = unsafe { score_at(kp.add(row), q[h], hd) } * scale;
            out[h][pp] = x;
            maxes[h] = maxes[h].max(x);
        }
    }
    maxes
}

/// The unscaled score of the f16 row at `r` against `q`: 8 FMA lanes, then `hsum8`'s
/// additions.
///
/// # Safety
/// As [`scores`]; `hd` halves at `r`, `hd` floats in `q`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn score_at(r: *const half::f16, q: &[f32], hd: usize) -> f32 {
    // SAFETY: as this function's contract.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for i in (0..hd).step_by(8) {
            let kv = _mm256_cvtph_ps(_mm_loadu_si128(r.add(i).cast()));
            acc = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q.as_ptr().add(i)), acc);
        }
        crate::kernels::ggml::hsum8v(acc)
    }
}

/// `H` heads' outputs `o[h][d] = hsum8(acc_0..acc_7)` where lane `l`'s accumulator is
/// `fma(v[p][d], w[h][p], .)` from +0 over the positions `p % 8 == l` in order, `head`'s
/// lane-major V sums, over the positions whose rows start at `rows[p]` in `v`.
///
/// How: 16 outputs at a time, all 8 lanes of every head in registers (`8 H` accumulators, 24
/// at most): each row's 16 halves are widened once for the `H` heads' FMAs, the rows read in
/// order. `head` runs its positions to a multiple of 8 with zero rows and weights, which adds
/// `fma(0, 0, acc) = acc` (accumulators start at +0 and never become -0), so stopping at the
/// last position changes nothing.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512F and AVX-512VL detected; `hd % 16 == 0`; `v[rows[p]..rows[p] + hd]` in
/// bounds for every `p` (the module invariant); each `w[h]` holds `rows.len()` weights and
/// each `o[h]` `hd` values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
#[allow(
    clippy::needless_range_loop,
    reason = "lane l indexes every head's accumulators"
)]
pub(crate) unsafe fn v_sums<const H: usize>(
    v: &[half::f16],
    rows: &[usize],
    hd: usize,
    w: [&[f32]; H],
    o: [&mut [f32]; H],
) {
    let n = rows.len();
    assert!(hd.is_multiple_of(16) && w.iter().all(|w| w.len() >= n));
    assert!(o.iter().all(|o| o.len() >= hd));
    let vp = v.as_ptr();
    for d in (0..hd).step_by(16) {
        // SAFETY: rows p < n inside `v` (the contract) with outputs d..d + 16 <= hd; weights
        // p < n and outputs as asserted.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 8]; H];
            let row = |p: usize| _mm512_cvtph_ps(_mm256_loadu_si256(vp.add(rows[p] + d).cast()));
            let mut p = 0;
            while p + 8 <= n {
                for l in 0..8 {
                    let x = row(p + l);
                    for h in 0..H {
                        let wv = _mm512_set1_ps(*w[h].get_unchecked(p + l));
                        acc[h][l] = _mm512_fmadd_ps(x, wv, acc[h][l]);
                    }
                }
                p += 8;
            }
            for l in 0..8 {
                if p + l < n {
                    let x = row(p + l);
                    for h in 0..H {
                        let wv = _mm512_set1_ps(*w[h].get_unchecked(p + l));
                        acc[h][l] = _mm512_fmadd_ps(x, wv, acc[h][l]);
                    }
                }
            }
            for h in 0..H {
                let a = &acc[h];
                let lo = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
                let hi = _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
                _mm512_storeu_ps(o[h].as_mut_ptr().add(d), _mm512_add_ps(lo, hi));
            }
        }
    }
}
