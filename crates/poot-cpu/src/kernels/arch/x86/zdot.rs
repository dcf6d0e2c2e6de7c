//! x86 loops of the zero-point integer dot: weight rows (`Q4_Z`, `Q8_Z`) against Q8_0
//! activations with `maddubs` + `madd` ([`Isa::Avx2`](crate::Isa)) or VNNI `vpdpbusd` on
//! 256-bit registers (AVX-512 CPUs that have it). Both compute each lane's exact `i32` sum of
//! `(q - z) * q_x` and then the float steps of `arch/generic/zdot_generic.rs`, so results are
//! bit-identical to it.
//!
//! The integer weights as signed bytes: `Q4_Z` with `z <= 128` (every GPTQ/AWQ zero is at most
//! 16) is `nibble - z`, one subtraction; otherwise the lane is `sum(q * q_x) - z * sum(q_x)`.
//! `Q8_Z` is `(q - 128) * q_x` plus `(128 - z) * sum(q_x)`, since `q - z` needs 9 bits.
//!
//! Layout: as `qdot.rs` (4 weight rows against 4, 2 or 1 tokens).
//!
//! Invariant (soundness): [`dot_rows`]' callers hold a `Checked` AVX2 or AVX-512 token (AVX2,
//! FMA and F16C detected); the VNNI variant runs only after `has_vnni`.

#![allow(
    clippy::needless_range_loop,
    reason = "the row and token tiles index several arrays at once"
)]

use std::arch::x86_64::*;

use crate::kernels::arch::x86::qdot::{f16_at, has_vnni, lanes_ss, lanes_us, nibbles};
use crate::kernels::blocks::ZKind;
use crate::kernels::ggml::hsum8v;
use crate::kernels::qact::BlockQ8;
use crate::kernels::simd::Checked;

/// `out[j * nr + r] = dot(row r, token j)` for `nr <= 4` rows of `row_bytes` at `w` and `t`
/// activation rows of `row_bytes / block_bytes` blocks at `a`.
#[allow(
    clippy::too_many_arguments,
    reason = "dot_rows' arguments and its token"
)]
pub(crate) fn dot_rows(
    ck: Checked,
    kind: ZKind,
    w: &[u8],
    row_bytes: usize,
    nr: usize,
    a: &[BlockQ8],
    t: usize,
    out: &mut [f32],
) {
    let nb = row_bytes / kind.block_bytes();
    assert!(nr <= 4 && w.len() >= nr * row_bytes && a.len() >= t * nb && out.len() >= t * nr);
    let vnni = ck.isa().avx512() && has_vnni();
    macro_rules! tile {
        ($r:literal, $t:literal, $w:expr, $a:expr, $out:expr) => {
            match kind {
                ZKind::Q4_Z => call::<0, $r, $t>(vnni, $w, row_bytes, $a, nb, $out),
                ZKind::Q8_Z => call::<1, $r, $t>(vnni, $w, row_bytes, $a, nb, $out),
            }
        };
    }
    if nr == 4 {
        let mut tok = 0;
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

/// Block bytes of kind `KIND` (0 `Q4_Z`, 1 `Q8_Z`).
const fn bb(kind: u8) -> usize {
    [19, 36][kind as usize]
}

/// `R` rows against `T` tokens (see [`rows`]) on the VNNI or the AVX2 instantiation, after
/// checking [`rows`]' bounds. Only called from [`dot_rows`] (module invariant).
fn call<const KIND: u8, const R: usize, const T: usize>(
    vnni: bool,
    w: &[u8],
    row_bytes: usize,
    a: &[BlockQ8],
    nb: usize,
    out: &mut [f32],
) {
    let bb = bb(KIND);
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

/// `R` rows (at `w`, `row_bytes` apart) against `T` activation rows (`a`, `nb` blocks apart)
/// into `out[j * R + r]`. Each weight block is unpacked once and used for all `T` tokens.
#[inline(always)]
unsafe fn rows<const KIND: u8, const R: usize, const T: usize, const VNNI: bool>(
    w: &[u8],
    row_bytes: usize,
    a: &[BlockQ8],
    nb: usize,
    out: &mut [f32],
) {
    let bb = bb(KIND);
    debug_assert!(w.len() >= (R - 1) * row_bytes + nb * bb && a.len() >= T * nb);
    let wp = w.as_ptr();
    let ahead = 4 * row_bytes;
    // SAFETY: block `b` of row `r` is bytes `r * row_bytes + b * bb ..+ bb`, inside `w` for
    // `r < R`, `b < nb`, and activation block `j * nb + b` is inside `a` for `j < T` (the
    // contract `call` asserts); the features are enabled by the caller.
    unsafe {
        let ones = _mm256_set1_epi8(1);
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        for b in 0..nb {
            let ab: [&BlockQ8; T] = std::array::from_fn(|j| a.get_unchecked(j * nb + b));
            let y: [__m256i; T] =
                std::array::from_fn(|j| _mm256_loadu_si256(ab[j].qs.as_ptr().cast()));
            let dy: [__m256; T] = std::array::from_fn(|j| _mm256_set1_ps(ab[j].d));
            for r in 0..R {
                let p = wp.add(r * row_bytes + b * bb);
                // As in `qdot.rs`: ask for the next 4-row group's bytes now.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead).cast());
                let dw = _mm256_set1_ps(f16_at(p));
                // `x`: the signed bytes; `c`: the multiple of `sum(q_x)` the lanes still need.
                let (x, c) = if KIND == 0 {
                    let z = i32::from(*p.add(2));
                    if z <= 128 {
                        (
                            _mm256_sub_epi8(nibbles(p.add(3)), _mm256_set1_epi8(z as i8)),
                            0,
                        )
                    } else {
                        (nibbles(p.add(3)), -z)
                    }
                } else {
                    let z = i32::from(p.add(2).cast::<u16>().read_unaligned());
                    let q = _mm256_loadu_si256(p.add(4).cast());
                    (_mm256_xor_si256(q, _mm256_set1_epi8(-128)), 128 - z)
                };
                for j in 0..T {
                    let mut lanes = if KIND == 0 && c != 0 {
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
                out[j * R + r] = hsum8v(acc[r][j]);
            }
        }
    }
}
