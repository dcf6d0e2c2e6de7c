//! `vdpbf16ps` tiles for BF16 weights under ggml numerics, every token count (one token too, so
//! that a token's result does not depend on the tokens beside it), on CPUs with AVX512-BF16 and
//! no AMX-BF16 path (`arch/x86/amx_bf16.rs`).
//!
//! Why: one `vdpbf16ps zmm` multiplies 32 pairs of bf16 values and adds each pair's two exact
//! products to its lane, twice the work of a 512-bit `f32` FMA for the same issue slot, and
//! its operands are half the bytes (peak rates and llama.cpp's BF16 prefill against the 8-lane
//! `f32` pair tiles of `matmul/lanes8.rs`: `docs/performance-history.md`, "Measurements behind the
//! kernels").
//!
//! How: both operands are packed once, as bf16 bits in 32-element slices (one register each),
//! `k` zero-padded to a multiple of 32 (zeros add exact zeros):
//! - the activations per call, rounded to bf16 as ggml does (`round_bf16`'s bits, 16 at a
//!   time in AVX-512 registers), one token group a task: groups of [`TG`] tokens, then chunks
//!   of [`KC`] elements, then slice `s` of token `j` at `(s * gt + j) * 32`;
//! - the stored rows per block of about [`BLOCK_BYTES`] as the thread takes it (a copy, the
//!   weights are already bf16): chunks, then row quads, slice `s` of row `r` at `(s * NR + r)
//!   * 32`.
//!
//! A tile is `NR` rows against up to [`TG`] tokens: 24 sum registers, the 4 rows' slices and
//! one token slice (29 of 32). Loops: group, chunk, quad, so the group's chunk (12 KiB) stays
//! in L1 while the block's quads stream past it from L2, each quad's sums parked in `part`
//! between chunks.
//!
//! Numerics: lane `l` of output `(j, r)` adds `w x'` for the elements `32 s + 2 l` and `32 s +
//! 2 l + 1` of every slice `s`, products exact, each addition rounded to nearest even, then the
//! 16 lanes are summed (`_mm512_reduce_add_ps`). `vdpbf16ps` treats subnormal inputs as zero
//! and flushes subnormal results. So per output, `|got - sum_k w x'|` is at most `(k / 16 + 8)
//! * 2^-24 * sum_k |w x'| + k * 2^-126 * max(1, max |x'|)`, within `matmul/bf16.rs`'s tested
//! bound for activations up to 1 in magnitude and for the tests' (up to 2: their weights have
//! no subnormals). Results do not depend on the thread count, the token grouping or the
//! chunking (each lane is one chain along `k`).
//!
//! Cost: `2 * t * n * k` flops; memory: the packed activations (`2 * t * k` bytes) and, per
//! thread, a packed row block and `block * TG * 16` parked floats.

use crate::kernels::matmul::lanes8::{put_rows, Aligned, Put};
use crate::kernels::simd::NR;
use crate::pool::{SharedMut, ThreadPool};

/// How far ahead of its copy [`pack_rows`] prefetches the stored rows.
const PACK_AHEAD: usize = 4096;
/// Tokens per tile (and per group).
const TG: usize = 6;
/// Elements per chunk of `k` (a multiple of 32).
const KC: usize = 1024;
/// Bytes of one packed row block (it stays in a 1 MiB L2 beside the group's chunk and the
/// parked sums).
const BLOCK_BYTES: usize = 512 * 1024;

/// Whether the tiles run here: AVX-512F, BW and BF16 detected.
pub(crate) fn available() -> bool {
    crate::CpuFeatures::get().dpbf16()
}

/// `out[t][n] = sum_k W[n][k] x'[t][k]` (see the module docs) for BF16 rows of `row_bytes`;
/// the caller checked [`available`] and an AVX-512 path, and `matmul_cached`
/// validated the shapes.
pub(crate) fn matmul(
    x: &[f32],
    (t, k): (usize, usize),
    (w, row_bytes, n): (&[u8], usize, usize),
    out: &mut [f32],
    pool: &ThreadPool,
) {
    assert!(available() && t >= 1 && x.len() >= t * k && out.len() >= t * n);
    assert!(row_bytes >= 2 * k && w.len() >= n * row_bytes);
    let kp = k.next_multiple_of(32);
    let xp = pack_x(x, (t, k), pool);
    let block = (BLOCK_BYTES / 2 / kp / NR).clamp(1, 64) * NR;
    let blocks = n.div_ceil(block);
    let (per_task, tasks) = pool.split(blocks);
    let shared = SharedMut::new(out);
    pool.for_each_init(
        tasks,
        || {
            let rows = Aligned::<u16>::zeroed(block * kp);
            (rows, Aligned::<f32>::zeroed(block * TG * 16))
        },
        |(rows, part), task| {
            for b in task * per_task..((task + 1) * per_task).min(blocks) {
                let n0 = b * block;
                let nr = block.min(n - n0);
                pack_rows(&w[n0 * row_bytes..], row_bytes, (nr, k), block, rows);
                let mut put = |tok: usize, r: usize, v: &[f32]| {
                    let at = tok * n + n0 + r;
                    // SAFETY: rows n0 + r.. (inside the block) belong to this task's blocks
                    // only, so no other task writes these indices.
                    put_rows(unsafe { shared.slice_mut(at..at + v.len()) }, v);
                };
                tiles((rows, block, nr), &xp, (t, kp), part, &mut put);
            }
        },
    );
}

/// Offset of chunk `c0` of the group starting at token `g0` (`gt` tokens) in the packed
/// activations (rows of `kp` elements).
fn x_offset(g0: usize, gt: usize, kp: usize, c0: usize) -> usize {
    g0 * kp + c0 * gt
}

/// The activations rounded to bf16, in tile order (see the module docs), one token group a
/// task.
pub(super) fn pack_x(x: &[f32], (t, k): (usize, usize), pool: &ThreadPool) -> Aligned<u16> {
    let kp = k.next_multiple_of(32);
    let mut xp = Aligned::<u16>::zeroed(t * kp);
    pool.for_each_chunk_mut(
        &mut xp,
        TG * kp,
        || (),
        |(), i, dst| {
            let (g0, gt) = (i * TG, dst.len() / kp);
            for c0 in (0..kp).step_by(KC) {
                let kc = KC.min(kp - c0);
                let base = x_offset(0, gt, kp, c0);
                for j in 0..gt {
                    let src = &x[(g0 + j) * k..(g0 + j + 1) * k];
                    for s in 0..kc / 32 {
                        let e0 = c0 + 32 * s;
                        let at = base + (s * gt + j) * 32;
                        let d: &mut [u16; 32] =
                            (&mut dst[at..at + 32]).try_into().expect("32 halves");
                        round32(&src[e0.min(k)..(e0 + 32).min(k)], d);
                    }
                }
            }
        },
    );
    xp
}

/// Up to 32 floats rounded to bf16 bits as `ggml::round_bf16` does, zeros past
/// `src.len()`.
fn round32(src: &[f32], dst: &mut [u16; 32]) {
    #[cfg(target_arch = "x86_64")]
    if src.len() == 32 {
        // SAFETY: `available()` (asserted by `matmul`, the only caller's caller) proves
        // AVX-512F and BW.
        unsafe { x86::round32(src.try_into().expect("32 floats"), dst) };
        return;
    }
    for (i, d) in dst.iter_mut().enumerate() {
        *d = src
            .get(i)
            .map_or(0, |&v| crate::kernels::ggml::round_bf16(v));
    }
}

/// The block's `nr` stored rows (from `src`, `row_bytes` apart, `k` bf16 values each) in
/// packed order: chunk `c0` at `c0 * block`, quad `q` of it at `q * kc`, slice `s` of the
/// quad's row `r % NR` at `(s * NR + r % NR) * 32`; the padding past `k` and rows past `nr`
/// stay zero (they only ever hold zeros: every block writes the same positions).
fn pack_rows(
    src: &[u8],
    row_bytes: usize,
    (nr, k): (usize, usize),
    block: usize,
    rows: &mut [u16],
) {
    let kp = k.next_multiple_of(32);
    for r in 0..nr {
        let row = &src[r * row_bytes..r * row_bytes + 2 * k];
        let (q, rr) = (r / NR * NR, r % NR);
        for c0 in (0..kp).step_by(KC) {
            let kc = KC.min(kp - c0);
            let base = c0 * block + q * kc;
            for s in 0..kc / 32 {
                let e0 = c0 + 32 * s;
                let at = base + (s * NR + rr) * 32;
                let d = &mut rows[at..at + 32];
                let e1 = (e0 + 32).min(k);
                let src = &row[2 * e0..2 * e1];
                // The block comes from DRAM: run the copy's loads a few KiB ahead.
                crate::kernels::simd::prefetch_range(src.as_ptr().wrapping_add(PACK_AHEAD), 64);
                if cfg!(target_endian = "little") && e1 - e0 == 32 {
                    // SAFETY: 64 bytes each side (`src` and `d` sliced above); on a
                    // little-endian target the stored bytes are the `u16` values' bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src.as_ptr(), d.as_mut_ptr().cast(), 64)
                    };
                } else {
                    for (d, h) in d.iter_mut().zip(src.chunks_exact(2)) {
                        *d = u16::from_le_bytes([h[0], h[1]]);
                    }
                }
            }
        }
    }
    // Rows past `nr` in the last quad: zeros, so that their (dropped) sums stay finite.
    let q_end = nr.next_multiple_of(NR);
    for r in nr..q_end.min(block) {
        let (q, rr) = (r / NR * NR, r % NR);
        for c0 in (0..kp).step_by(KC) {
            let kc = KC.min(kp - c0);
            for s in 0..kc / 32 {
                let at = c0 * block + q * kc + (s * NR + rr) * 32;
                rows[at..at + 32].fill(0);
            }
        }
    }
}

/// Every tile of one packed row block (`nr` of its `block` rows) against the packed
/// activations: per group and chunk, every quad of the block against the whole group, each
/// quad's sums kept in `part` (`block * TG * 16` floats) between chunks.
fn tiles(
    (rows, block, nr): (&[u16], usize, usize),
    xp: &[u16],
    (t, kp): (usize, usize),
    part: &mut [f32],
    put: Put<'_>,
) {
    assert!(rows.len() >= block * kp && block.is_multiple_of(NR) && nr <= block);
    assert!(xp.len() >= t * kp && part.len() >= block * TG * 16 && available());
    let mut res = [0.0f32; TG * NR];
    for g0 in (0..t).step_by(TG) {
        let gt = TG.min(t - g0);
        for c0 in (0..kp).step_by(KC) {
            let kc = KC.min(kp - c0);
            let ends = (c0 == 0, c0 + kc == kp);
            let xs = xp[x_offset(g0, gt, kp, c0)..][..gt * kc].as_ptr();
            for q in (0..nr).step_by(NR) {
                let wq = rows[c0 * block + q * kc..][..NR * kc].as_ptr();
                let pt = &mut part[q * TG * 16..][..NR * TG * 16];
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `available()` (asserted) proves AVX-512F, BW and BF16. Quad q's
                // chunk holds NR * kc halves at `wq`, the group's chunk gt * kc at `xs` (both
                // sliced above); kc is a multiple of 32; `pt` holds NR * TG * 16 floats.
                unsafe {
                    use x86::tile as z;
                    let sl = kc / 32;
                    match gt {
                        6.. => z::<6>(wq, xs, sl, pt, ends, &mut res),
                        5 => z::<5>(wq, xs, sl, pt, ends, &mut res),
                        4 => z::<4>(wq, xs, sl, pt, ends, &mut res),
                        3 => z::<3>(wq, xs, sl, pt, ends, &mut res),
                        2 => z::<2>(wq, xs, sl, pt, ends, &mut res),
                        _ => z::<1>(wq, xs, sl, pt, ends, &mut res),
                    }
                }
                if ends.1 {
                    for j in 0..gt {
                        put(g0 + j, q, &res[j * NR..j * NR + NR.min(nr - q)]);
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The AVX-512 pieces. Invariant (soundness): every function here is `unsafe` with the
    //! contract that the caller has detected AVX-512F, BW and BF16 (`available`), and that the
    //! pointers cover the lengths stated.

    use std::arch::x86_64::*;

    use super::{NR, TG};

    /// 32 floats rounded to bf16 bits as `round_bf16` does (nearest even; NaNs quieted).
    ///
    /// # Safety
    /// AVX-512F and BW detected.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn round32(src: &[f32; 32], dst: &mut [u16; 32]) {
        // SAFETY: 32 floats in, 32 halves out; the features this function enables.
        unsafe {
            for h in 0..2 {
                let u = _mm512_loadu_si512(src.as_ptr().add(16 * h).cast());
                let hi = _mm512_srli_epi32::<16>(u);
                let odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
                let bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd);
                let r = _mm512_srli_epi32::<16>(_mm512_add_epi32(u, bias));
                // NaN: magnitude above infinity's bits (both sides below 2^31).
                let mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7fff_ffff));
                let nan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7f80_0000));
                let quiet = _mm512_or_si512(hi, _mm512_set1_epi32(64));
                let v = _mm512_mask_blend_epi32(nan, r, quiet);
                _mm256_storeu_si256(
                    dst.as_mut_ptr().add(16 * h).cast(),
                    _mm512_cvtepi32_epi16(v),
                );
            }
        }
    }

    /// 32 bf16 values at `p`.
    ///
    /// # Safety
    /// AVX-512F detected; 64 readable bytes at `p`.
    #[inline(always)]
    unsafe fn load(p: *const u16) -> __m512bh {
        // SAFETY: the caller's contract; `__m512i` and `__m512bh` are the same 64 bytes.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.cast())) }
    }

    /// [`tile`]'s slice loop for a whole group (`TT == TG`), allocated by hand: the sums in
    /// `zmm0-23` (row `r`, token `j` in `zmm(6r + j)`), the rows' slices in `zmm24-27`, the
    /// tokens' in `zmm28-29`. The compiler's allocation of the same loop kept several sums on
    /// the stack (a store and a reload on each of their chains, 1.6x slower).
    ///
    /// # Safety
    /// As [`tile`], with `slices >= 1`.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[inline]
    unsafe fn slices_full(a: &mut [[__m512; TG]; NR], w: *const u16, x: *const u16, slices: usize) {
        // SAFETY: the caller's contract: `slices` slices of NR rows (256 bytes each) at `w`
        // and of TG tokens (384 bytes each) at `x`; AVX-512F and BF16 detected.
        unsafe {
            std::arch::asm!(
            "2:",
            "vmovups zmm24, [{w} + 0]",
            "vmovups zmm25, [{w} + 64]",
            "vmovups zmm26, [{w} + 128]",
            "vmovups zmm27, [{w} + 192]",
            "vmovups zmm28, [{x} + 0]",
            "vdpbf16ps zmm0, zmm24, zmm28",
            "vdpbf16ps zmm6, zmm25, zmm28",
            "vdpbf16ps zmm12, zmm26, zmm28",
            "vdpbf16ps zmm18, zmm27, zmm28",
            "vmovups zmm29, [{x} + 64]",
            "vdpbf16ps zmm1, zmm24, zmm29",
            "vdpbf16ps zmm7, zmm25, zmm29",
            "vdpbf16ps zmm13, zmm26, zmm29",
            "vdpbf16ps zmm19, zmm27, zmm29",
            "vmovups zmm28, [{x} + 128]",
            "vdpbf16ps zmm2, zmm24, zmm28",
            "vdpbf16ps zmm8, zmm25, zmm28",
            "vdpbf16ps zmm14, zmm26, zmm28",
            "vdpbf16ps zmm20, zmm27, zmm28",
            "vmovups zmm29, [{x} + 192]",
            "vdpbf16ps zmm3, zmm24, zmm29",
            "vdpbf16ps zmm9, zmm25, zmm29",
            "vdpbf16ps zmm15, zmm26, zmm29",
            "vdpbf16ps zmm21, zmm27, zmm29",
            "vmovups zmm28, [{x} + 256]",
            "vdpbf16ps zmm4, zmm24, zmm28",
            "vdpbf16ps zmm10, zmm25, zmm28",
            "vdpbf16ps zmm16, zmm26, zmm28",
            "vdpbf16ps zmm22, zmm27, zmm28",
            "vmovups zmm29, [{x} + 320]",
            "vdpbf16ps zmm5, zmm24, zmm29",
            "vdpbf16ps zmm11, zmm25, zmm29",
            "vdpbf16ps zmm17, zmm26, zmm29",
            "vdpbf16ps zmm23, zmm27, zmm29",
            "add {w}, 256",
            "add {x}, 384",
            "dec {n}",
            "jnz 2b",
            w = inout(reg) w => _,
            x = inout(reg) x => _,
            n = inout(reg) slices => _,
            inout("zmm0") a[0][0],
            inout("zmm1") a[0][1],
            inout("zmm2") a[0][2],
            inout("zmm3") a[0][3],
            inout("zmm4") a[0][4],
            inout("zmm5") a[0][5],
            inout("zmm6") a[1][0],
            inout("zmm7") a[1][1],
            inout("zmm8") a[1][2],
            inout("zmm9") a[1][3],
            inout("zmm10") a[1][4],
            inout("zmm11") a[1][5],
            inout("zmm12") a[2][0],
            inout("zmm13") a[2][1],
            inout("zmm14") a[2][2],
            inout("zmm15") a[2][3],
            inout("zmm16") a[2][4],
            inout("zmm17") a[2][5],
            inout("zmm18") a[3][0],
            inout("zmm19") a[3][1],
            inout("zmm20") a[3][2],
            inout("zmm21") a[3][3],
            inout("zmm22") a[3][4],
            inout("zmm23") a[3][5],
            out("zmm24") _,
            out("zmm25") _,
            out("zmm26") _,
            out("zmm27") _,
            out("zmm28") _,
            out("zmm29") _,
            options(nostack, readonly),
            );
        }
    }

    /// One chunk of `NR` rows against `TT` tokens, `slices` 32-element slices of each: slice
    /// `s` of row `r` at `w + (s * NR + r) * 32`, of token `j` at `x + (s * TT + j) * 32`.
    /// The sums start at zero when `first`, else from `part` (row `r`, token `j` at `(r * TG
    /// + j) * 16`); when `last` their lane sums go to `res[j * NR + r]`, else they go back to
    /// `part`. Splitting `k` into chunks changes no bit.
    ///
    /// # Safety
    /// AVX-512F, BW and BF16 detected; `NR * slices * 32` halves at `w`, `TT * slices * 32`
    /// at `x`; `part.len() >= NR * TG * 16`; `TT <= TG`.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn tile<const TT: usize>(
        w: *const u16,
        x: *const u16,
        slices: usize,
        part: &mut [f32],
        (first, last): (bool, bool),
        res: &mut [f32; TG * NR],
    ) {
        assert!(TT <= TG && part.len() >= NR * TG * 16);
        let pp = part.as_mut_ptr();
        assert!(
            pp.cast::<__m512>().is_aligned(),
            "`part` starts on a 64-byte boundary"
        );
        // SAFETY: slice s < slices stays inside both operands (the contract); `part` holds
        // NR * TG * 16 floats (asserted), so every parked register is inside it.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); TT]; NR];
            if !first {
                for (r, a) in acc.iter_mut().enumerate() {
                    for (j, v) in a.iter_mut().enumerate() {
                        // Volatile: plain loads let the compiler keep the sums in a stack
                        // copy and spill inside the loop (`arch::x86::fdot16::chunk16` saw the
                        // same).
                        *v = pp.add((r * TG + j) * 16).cast::<__m512>().read_volatile();
                    }
                }
            }
            let (mut wp, mut xp) = (w, x);
            let mut left = slices;
            if TT == TG && left > 0 {
                // SAFETY: TT == TG, so the two array types are the same.
                let a = &mut *(&raw mut acc).cast::<[[__m512; TG]; NR]>();
                slices_full(a, wp, xp, left);
                left = 0;
            }
            for _ in 0..left {
                let mut wv = [load(wp); NR];
                for (r, v) in wv.iter_mut().enumerate().skip(1) {
                    *v = load(wp.add(r * 32));
                }
                for j in 0..TT {
                    let xv = load(xp.add(j * 32));
                    for (r, a) in acc.iter_mut().enumerate() {
                        a[j] = _mm512_dpbf16_ps(a[j], wv[r], xv);
                    }
                }
                wp = wp.add(NR * 32);
                xp = xp.add(TT * 32);
            }
            for (r, a) in acc.iter().enumerate() {
                for (j, v) in a.iter().enumerate() {
                    if last {
                        res[j * NR + r] = _mm512_reduce_add_ps(*v);
                    } else {
                        pp.add((r * TG + j) * 16)
                            .cast::<__m512>()
                            .write_volatile(*v);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::ggml::round_bf16;
    use crate::testutil::Rng;

    #[test]
    fn vector_rounding_matches_round_bf16() {
        if !crate::testutil::isa_runs("bf16", available()) {
            return;
        }
        let mut v: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffc0_1234),
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            f32::MAX,
            3.0e-40,
        ];
        let mut s = 0x9e37_79b9u32;
        while v.len() < 32 * 64 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            v.push(f32::from_bits(s));
        }
        for c in v.chunks_exact(32) {
            let mut d = [0u16; 32];
            round32(c, &mut d);
            for (i, (&x, &h)) in c.iter().zip(&d).enumerate() {
                assert_eq!(h, round_bf16(x), "lane {i} of {:#x}", x.to_bits());
            }
        }
        // A short piece: the scalar path, zeros past its end.
        let mut d = [7u16; 32];
        round32(&v[..5], &mut d);
        assert!(d[5..].iter().all(|&h| h == 0));
        assert_eq!(
            d[..5],
            v[..5].iter().map(|&x| round_bf16(x)).collect::<Vec<_>>()[..]
        );
    }

    /// Against an `f64` reference of the bf16-rounded product: the module's bound, every
    /// token group size, several chunks (k = 2080: 1024 + 1024 + 32), a padded `k` (k = 45),
    /// partial quads and blocks, and independent of the thread count.
    #[test]
    fn within_bound_and_thread_independent() {
        if !crate::testutil::isa_runs("bf16", available()) {
            return;
        }
        for (n, k) in [(7, 45), (9, 64), (70, 1024), (134, 2080)] {
            let mut rng = Rng::new(n as u32 * 31 + k as u32);
            let wf: Vec<f32> = rng.vec(n * k, -1.0, 1.0);
            let w: Vec<u8> = wf
                .iter()
                .flat_map(|&v| round_bf16(v).to_le_bytes())
                .collect();
            for t in [1, 2, 5, 6, 7, 13] {
                let x = Rng::new(5 + t as u32).vec(t * k, -2.0, 2.0);
                let mut runs = Vec::new();
                for threads in [1, 2] {
                    let pool = ThreadPool::new(threads).unwrap();
                    let mut out = vec![f32::NAN; t * n];
                    matmul(&x, (t, k), (&w, 2 * k, n), &mut out, &pool);
                    runs.push(out);
                }
                assert!(
                    runs[0]
                        .iter()
                        .zip(&runs[1])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "n={n} k={k} t={t}: depends on the thread count"
                );
                for tok in 0..t {
                    for r in 0..n {
                        let (mut s, mut a) = (0.0f64, 0.0f64);
                        for i in 0..k {
                            let wv = f64::from(f32::from_bits(
                                u32::from(round_bf16(wf[r * k + i])) << 16,
                            ));
                            let xv = f64::from(f32::from_bits(
                                u32::from(round_bf16(x[tok * k + i])) << 16,
                            ));
                            (s, a) = (s + wv * xv, a + (wv * xv).abs());
                        }
                        let tol = (k / 16 + 8) as f64 * 2f64.powi(-24) * a
                            + 2.0 * k as f64 * 2f64.powi(-126);
                        let got = f64::from(runs[0][tok * n + r]);
                        assert!(
                            (got - s).abs() <= tol,
                            "n={n} k={k} t={t} [{tok},{r}]: {got} vs {s}"
                        );
                    }
                }
            }
        }
    }
}
