//! x86 loops of the stored-row integer block dot: weight rows of the Q8-dot formats (Q4_0, Q4_1,
//! Q5_0, Q8_0, and the zero-point Q4_Z, Q8_Z) against Q8 activation blocks. [`Isa::Avx2`](crate::Isa)
//! uses `maddubs` + `madd`; AVX-512 CPUs use VNNI (`vpdpbusd` on 256-bit registers) where they
//! have it, else the AVX2 code. Both compute the same exact `i32` lane sums as the portable loops
//! (`arch/generic/qdot_generic.rs`, `arch/generic/zdot_generic.rs`) and then the same `f32` FMAs,
//! so results are bit-identical to them.
//!
//! One block loop ([`rows`]) serves every format, monomorphized per format id
//! (`format::id`): only the unpacking of a weight block into signed bytes differs. Q4_1 keeps
//! unsigned nibbles and ggml's `summs` term. The zero-point formats fold the zero into the
//! integers: `Q4_Z` with `z <= 128` (every GPTQ/AWQ zero is at most 16) is `nibble - z`, one
//! subtraction; otherwise the lane is `sum(q * q_x) - z * sum(q_x)`. `Q8_Z` is `(q - 128) * q_x`
//! plus `(128 - z) * sum(q_x)`, since `q - z` needs 9 bits.
//!
//! Layout: 4 weight rows are processed together against 4 (VNNI machines, 32 registers) or 2
//! activation rows, then 1, so each weight block is unpacked once per 2-4 tokens, each
//! activation block loaded once per 4 rows, and 8-16 independent FMA chains overlap.
//!
//! Invariant (soundness): [`dot_rows`]' callers hold a `Checked` AVX2 or AVX-512 token (AVX2,
//! FMA and F16C detected), and the VNNI variant runs only after `avx512vnni` and `avx512vl` were
//! detected too.

#![allow(
    clippy::needless_range_loop,
    reason = "the row and token tiles index several arrays at once"
)]

use std::arch::x86_64::*;

use crate::kernels::format::{id, Format};
use crate::kernels::ggml::hsum8v;
use crate::kernels::qact::BlockQ8;
use crate::kernels::simd::Checked;

/// Whether this CPU has the 256-bit VNNI dot (`vpdpbusd ymm`).
pub(crate) fn has_vnni() -> bool {
    crate::CpuFeatures::get().vnni256()
}

/// `out[j * nr + r] = dot(row r, token j)` for `nr <= 4` rows of `row_bytes` at `w` (format
/// `kind`, one whose rows are read by the Q8 dot) and `t` activation rows of
/// `row_bytes / block_bytes` blocks at `a`.
///
/// # Panics
/// If the slices are shorter than that, `nr > 4`, or `kind` has no loop here.
#[allow(
    clippy::too_many_arguments,
    reason = "one tile's shapes and the caller's token"
)]
pub(crate) fn dot_rows(
    ck: Checked,
    kind: Format,
    w: &[u8],
    row_bytes: usize,
    nr: usize,
    a: &[BlockQ8],
    t: usize,
    out: &mut [f32],
) {
    let nb = row_bytes / kind.block_bytes();
    assert!(nr <= 4 && w.len() >= nr * row_bytes && a.len() >= t * nb && out.len() >= t * nr);
    // The AVX2 path stays within AVX2 (so tests cover `maddubs` on any CPU); AVX-512 adds VNNI.
    let vnni = ck.isa().avx512() && has_vnni();
    macro_rules! tile {
        ($r:literal, $t:literal, $w:expr, $a:expr, $out:expr) => {
            match kind {
                Format::Q4_0 => call::<{ id::Q4_0 }, $r, $t>(vnni, $w, row_bytes, $a, nb, $out),
                Format::Q4_1 => call::<{ id::Q4_1 }, $r, $t>(vnni, $w, row_bytes, $a, nb, $out),
                Format::Q5_0 => call::<{ id::Q5_0 }, $r, $t>(vnni, $w, row_bytes, $a, nb, $out),
                Format::Q8_0 => call::<{ id::Q8_0 }, $r, $t>(vnni, $w, row_bytes, $a, nb, $out),
                Format::Q4_Z => call::<{ id::Q4_Z }, $r, $t>(vnni, $w, row_bytes, $a, nb, $out),
                Format::Q8_Z => call::<{ id::Q8_Z }, $r, $t>(vnni, $w, row_bytes, $a, nb, $out),
                other => unreachable!("{other:?} has no Q8 dot"),
            }
        };
    }
    if nr == 4 {
        let mut tok = 0;
        // With AVX-512VL there are 32 vector registers: 16 accumulators fit.
        while vnni && tok + 4 <= t {
            tile!(4, 4, w, &a[tok * nb..], &mut out[tok * 4..]);
            tok += 4;
        }
        while tok + 2 <= t {
            tile!(4, 2, w, &a[tok * nb..], &mut out[tok * 4..]);
            tok += 2;
        }
        if tok < t {
            tile!(4, 1, w, &a[tok * nb..], &mut out[tok * 4..]);
        }
        return;
    }
    let mut one = [0.0f32];
    for tok in 0..t {
        for r in 0..nr {
            tile!(1, 1, &w[r * row_bytes..], &a[tok * nb..], &mut one);
            out[tok * nr + r] = one[0];
        }
    }
}

/// `R` rows against `T` tokens of format id `KIND` (see [`rows`]) on the VNNI or the AVX2
/// instantiation, after checking [`rows`]' bounds. Only called from [`dot_rows`] (module
/// invariant).
fn call<const KIND: u8, const R: usize, const T: usize>(
    vnni: bool,
    w: &[u8],
    row_bytes: usize,
    a: &[BlockQ8],
    nb: usize,
    out: &mut [f32],
) {
    let bb = const { Format::from_id(KIND).block_bytes() };
    assert!(row_bytes >= nb * bb && w.len() >= (R - 1) * row_bytes + nb * bb);
    assert!(a.len() >= (T - 1) * nb + nb && out.len() >= T * R);
    if vnni {
        // SAFETY: AVX2/FMA/F16C by the module invariant, AVX512-VNNI/VL detected by
        // `has_vnni`; the asserts above are `rows`' bounds contract.
        unsafe { rows_vnni::<KIND, R, T>(w, row_bytes, a, nb, out) }
    } else {
        // SAFETY: AVX2/FMA/F16C by the module invariant; bounds asserted above.
        unsafe { rows_avx2::<KIND, R, T>(w, row_bytes, a, nb, out) }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2<const KIND: u8, const R: usize, const T: usize>(
    w: &[u8],
    row_bytes: usize,
    a: &[BlockQ8],
    nb: usize,
    out: &mut [f32],
) {
    // SAFETY: same contract; this function's features cover the body's.
    unsafe { rows::<KIND, R, T, false>(w, row_bytes, a, nb, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn rows_vnni<const KIND: u8, const R: usize, const T: usize>(
    w: &[u8],
    row_bytes: usize,
    a: &[BlockQ8],
    nb: usize,
    out: &mut [f32],
) {
    // SAFETY: same contract; this function's features cover the body's, VNNI included.
    unsafe { rows::<KIND, R, T, true>(w, row_bytes, a, nb, out) }
}

/// One f16 (little-endian at `p`) to f32 with F16C.
#[inline(always)]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller passes a pointer to 2 readable bytes; F16C is enabled by the caller.
    unsafe {
        let bits = i32::from(p.cast::<u16>().read_unaligned());
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
    }
}

/// 32 nibbles to 32 bytes in `0..16`, low nibbles first (elements 0..16, then 16..32).
#[inline(always)]
pub(crate) unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: 16 readable bytes at `p` (caller); AVX2 enabled by the caller.
    unsafe {
        let t = _mm_loadu_si128(p.cast());
        _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16::<4>(t), t),
            _mm256_set1_epi8(0x0f),
        )
    }
}

/// Byte `e` = 0xFF where bit `e` of the 32 bits at `p` is set (ggml's `bytes_from_bits_32`).
#[inline(always)]
unsafe fn bits_to_bytes(p: *const u8) -> __m256i {
    // SAFETY: 4 readable bytes at `p` (caller); AVX2 enabled by the caller.
    unsafe {
        let x32 = p.cast::<i32>().read_unaligned();
        let shuf = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32), shuf);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }
}

/// Eight exact `i32` lane sums of `u * s` (4 byte products per lane), `u` unsigned.
#[inline(always)]
pub(crate) unsafe fn lanes_us<const VNNI: bool>(u: __m256i, s: __m256i) -> __m256i {
    // SAFETY: AVX2 (and for VNNI, AVX512-VNNI + VL) enabled by the caller. `maddubs` cannot
    // saturate here: |u| <= 128 and |s| <= 127 give pair sums of at most 32512.
    unsafe {
        if VNNI {
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
        } else {
            _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(u, s))
        }
    }
}

/// Lane sums of two signed byte vectors via the sign trick (`|x|` times `y * sign(x)`).
#[inline(always)]
pub(crate) unsafe fn lanes_ss<const VNNI: bool>(x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: AVX2 enabled by the caller; activations never hold -128 (see `qact.rs`), so
    // negating `y` cannot wrap.
    unsafe { lanes_us::<VNNI>(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
}

/// One weight block of format id `KIND` at `p` as the block loop reads it: the 32 weights as
/// bytes (`x`: signed, or unsigned for Q4_1 and for Q4_Z with a zero above 128), Q4_1's block
/// offset `m` (else 0), and `c`, the multiple of `sum(q_x)` the zero-point lanes still need
/// (else 0).
///
/// # Safety
/// A whole block of `KIND` readable at `p`; AVX2 and F16C enabled by the caller.
#[inline(always)]
unsafe fn unpack<const KIND: u8>(p: *const u8) -> (__m256i, f32, i32) {
    // SAFETY: the offsets below are inside the block (the caller's contract).
    unsafe {
        match KIND {
            id::Q4_0 => (
                _mm256_sub_epi8(nibbles(p.add(2)), _mm256_set1_epi8(8)),
                0.0,
                0,
            ),
            id::Q4_1 => (nibbles(p.add(4)), f16_at(p.add(2)), 0),
            id::Q5_0 => {
                let hi = _mm256_andnot_si256(bits_to_bytes(p.add(2)), _mm256_set1_epi8(-16));
                (_mm256_or_si256(nibbles(p.add(6)), hi), 0.0, 0)
            }
            id::Q8_0 => (_mm256_loadu_si256(p.add(2).cast()), 0.0, 0),
            id::Q4_Z => {
                let z = i32::from(*p.add(2));
                if z <= 128 {
                    let x = _mm256_sub_epi8(nibbles(p.add(3)), _mm256_set1_epi8(z as i8));
                    (x, 0.0, 0)
                } else {
                    (nibbles(p.add(3)), 0.0, -z)
                }
            }
            _ => {
                // Q8_Z (`call` only instantiates the formats `dot_rows` lists).
                let z = i32::from(p.add(2).cast::<u16>().read_unaligned());
                let q = _mm256_loadu_si256(p.add(4).cast());
                (_mm256_xor_si256(q, _mm256_set1_epi8(-128)), 0.0, 128 - z)
            }
        }
    }
}

/// `R` rows (at `w`, `row_bytes` apart) against `T` activation rows (`a`, `nb` blocks apart)
/// into `out[j * R + r]`, format id `KIND`. Each weight block is unpacked once ([`unpack`]) and
/// used for all `T` tokens; per token the exact `i32` lane sums, then
/// `acc = fma(dw * dy, lanes, acc)` (and Q4_1's `summs = fma(m, s, summs)`), then `hsum8`.
#[inline(always)]
unsafe fn rows<const KIND: u8, const R: usize, const T: usize, const VNNI: bool>(
    w: &[u8],
    row_bytes: usize,
    a: &[BlockQ8],
    nb: usize,
    out: &mut [f32],
) {
    let bb = const { Format::from_id(KIND).block_bytes() };
    debug_assert!(w.len() >= (R - 1) * row_bytes + nb * bb && a.len() >= T * nb);
    let wp = w.as_ptr();
    let ahead = 4 * row_bytes;
    // SAFETY: block `b` of row `r` is bytes `r * row_bytes + b * bb ..+ bb`, inside `w` for
    // `r < R`, `b < nb`, and activation block `j * nb + b` is inside `a` for `j < T` (the
    // contract `call` asserts); the features are enabled by the caller.
    unsafe {
        let ones = _mm256_set1_epi8(1);
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        let mut summs = [[0.0f32; T]; R];
        for b in 0..nb {
            let ab: [&BlockQ8; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            let y: [__m256i; T] =
                std::array::from_fn(|j| _mm256_loadu_si256(ab[j].qs.as_ptr().cast()));
            // Scales broadcast once per block; `dw * dy` is the product ggml broadcasts.
            let dy: [__m256; T] = std::array::from_fn(|j| _mm256_set1_ps(ab[j].d));
            for r in 0..R {
                let p = wp.add(r * row_bytes + b * bb);
                // Streaming from DRAM is latency-bound at one core's few outstanding misses;
                // asking now for the same spot of the next 4-row group (the next bytes this
                // thread will read, usually) keeps more of them in flight. A prefetch never
                // faults, so running past the matrix's end is harmless.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead).cast());
                let dw = _mm256_set1_ps(f16_at(p));
                let (x, m, c) = unpack::<KIND>(p);
                for j in 0..T {
                    let mut lanes = if KIND == id::Q4_1 {
                        summs[r][j] = m.mul_add(ab[j].s, summs[r][j]);
                        lanes_us::<VNNI>(x, y[j])
                    } else if KIND == id::Q4_Z && c != 0 {
                        lanes_us::<VNNI>(x, y[j])
                    } else {
                        lanes_ss::<VNNI>(x, y[j])
                    };
                    if c != 0 {
                        let sums = lanes_us::<VNNI>(ones, y[j]);
                        lanes =
                            _mm256_add_epi32(lanes, _mm256_mullo_epi32(sums, _mm256_set1_epi32(c)));
                    }
                    acc[r][j] = _mm256_fmadd_ps(
                        _mm256_mul_ps(dw, dy[j]),
                        _mm256_cvtepi32_ps(lanes),
                        acc[r][j],
                    );
                }
            }
        }
        for r in 0..R {
            for j in 0..T {
                out[j * R + r] = if KIND == id::Q4_1 {
                    hsum8v(acc[r][j]) + summs[r][j]
                } else {
                    hsum8v(acc[r][j])
                };
            }
        }
    }
}
