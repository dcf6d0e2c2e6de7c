//! [`Numerics`], the runtime's choice of arithmetic, and the scalar primitives of ggml's CPU
//! arithmetic that several kernels share.
//!
//! [`Numerics::Ggml`] reproduces llama.cpp's CPU backend as built for AVX2 (the x86 build every
//! llama.cpp wheel ships; ggml 0.25.3, llama-cpp-python 0.3.36) operation for operation, so
//! that greedy decoding follows llama.cpp's tokens even through near-ties:
//! - matmul with Q4_0/Q4_1/Q5_0/Q8_0 weights quantizes each activation row to Q8_0 (Q8_1 for
//!   Q4_1) and does integer block dot products (`matmul/q8.rs`); F16/F32 weights follow ggml's
//!   float dot orders (`matmul/float_ggml.rs`); Q4_K and Q6_K weights take Q8_K activations
//!   and integer dots as ggml does (`matmul/qdot_k.rs`), in an order of their own (close to, not
//!   bit for bit, llama.cpp's); BF16, Q5_1 and the other k-quants keep the exact matmul;
//! - attention keeps an f16 KV cache, rounds `q` and the softmax weights to f16 and follows
//!   ggml's lane order and `expf` (`attention/ggml_heads.rs`);
//! - RoPE builds `theta` by repeated multiplication and fuses as gcc does (`rope.rs`);
//! - SiLU uses ggml's vector `expf` ([`expf`]) on whole 8-lane groups, libm on a row's tail.
//!
//! Invariant: every function here is a lane of the corresponding AVX2 code, built from IEEE
//! operations only (`mul_add` is one fused rounding), so results are bit-identical to ggml's
//! on any CPU and with any ISA poot picks. Checked against llama.cpp itself: per op on
//! SmolLM2-135M Q4_1 (prefill and decode, every layer kind) and stories260K, and end to end
//! (SmolLM2's and stories260K F16/Q8_0/Q4_0's logits equal llama.cpp's to the bit). Cost: a few
//! flops per element, no allocation.

use crate::error::check_len;
use crate::KernelError;

/// Which arithmetic the CPU kernels follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Numerics {
    /// Weights decoded exactly to `f32`, `f32` activations and KV cache; the most accurate
    /// evaluation (each kernel's docs give its bound against exact arithmetic).
    #[default]
    Exact,
    /// llama.cpp's CPU arithmetic (see the module docs): integer dots over Q8-quantized
    /// activations and an f16 KV cache (half the KV memory).
    Ggml,
}

impl Numerics {
    /// `"exact"` or `"ggml"`.
    pub fn name(self) -> &'static str {
        match self {
            Numerics::Exact => "exact",
            Numerics::Ggml => "ggml",
        }
    }

    /// The numerics named `name` (`"exact"`, `"ggml"`).
    pub fn from_name(name: &str) -> Option<Numerics> {
        match name {
            "exact" => Some(Numerics::Exact),
            "ggml" => Some(Numerics::Ggml),
            _ => None,
        }
    }
}

/// `_mm256_fnmadd_ps(a, b, c)` lane: `c - a * b`, one rounding.
#[inline(always)]
fn fnmadd(a: f32, b: f32, c: f32) -> f32 {
    (-a).mul_add(b, c)
}

/// One lane of ggml's AVX2 `ggml_v_expf` (ARM's optimized-routines `expf`: at most 1.95 ulp
/// from `exp`, overflow to `inf` above 88.38, flush to 0 below -103.97, `exp(-inf) = 0`).
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r);
    let n = z - r;
    let b = fnmadd(
        n,
        f32::from_bits(0x35bf_be8e),
        fnmadd(n, f32::from_bits(0x3f31_7200), x),
    );
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let c = n.abs() > 126.0;
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010)
        .mul_add(b, f32::from_bits(0x3d2b_9f17))
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)),
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6) * b);
    if !c {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    if n.abs() > 192.0 {
        return s1 * s1;
    }
    let s2 = f32::from_bits(e.wrapping_sub(g));
    s2.mul_add(j, s2) * s1
}

/// One lane of ggml's AVX2 `ggml_v_silu`: `x / (1 + expf(0 - x))` with [`expf`].
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(0.0 - x))
}

/// ggml's scalar `ggml_silu_f32` (a row's last `len % 8` values): libm `expf`.
#[inline]
pub fn silu_libm(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// ggml's `swiglu`/`silu` rows: `out = silu(x)` over rows of `d` values, [`silu`] on each row's
/// whole groups of 8 and [`silu_libm`] on its last `d % 8` (ggml's vector loop, then its tail).
///
/// # Errors
/// [`KernelError::Length`] unless `out.len() == x.len()`, [`KernelError::InvalidArgument`]
/// unless that is a multiple of `d > 0` (nothing is written then).
pub fn silu_rows_to(x: &[f32], d: usize, out: &mut [f32]) -> Result<(), KernelError> {
    check_len("silu out", x.len(), out.len())?;
    if d == 0 || !x.len().is_multiple_of(d) {
        return Err(KernelError::InvalidArgument {
            what: "silu rows",
            detail: format!("{} values are not rows of {d}", x.len()),
        });
    }
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::detect() != crate::Isa::Scalar {
        // SAFETY: every SIMD path poot detects includes AVX2 and FMA.
        unsafe { silu_rows_fma(x, d, out) };
        return Ok(());
    }
    silu_rows(x, d, out);
    Ok(())
}

/// [`silu_rows`] in AVX2 registers: each whole group of 8 through [`expf8`] (the same float
/// steps as [`expf`], lane by lane), then `x / (1 + e)` (IEEE division, as the scalar one), so
/// the same bits; the scalar loop did not vectorize (about 2.5 ns a value, 9% of a prefill).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn silu_rows_fma(x: &[f32], d: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let body = d - d % 8;
    for (xr, yr) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        for (y, v) in yr[..body]
            .chunks_exact_mut(8)
            .zip(xr[..body].chunks_exact(8))
        {
            // SAFETY: 8 floats in `v` and `y`; AVX2 and FMA enabled here.
            unsafe {
                let xv = _mm256_loadu_ps(v.as_ptr());
                // In registers: through arrays, every group waited on store-to-load forwarding.
                let e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), xv));
                let r = _mm256_div_ps(xv, _mm256_add_ps(_mm256_set1_ps(1.0), e));
                _mm256_storeu_ps(y.as_mut_ptr(), r);
            }
        }
        for (y, &v) in yr[body..].iter_mut().zip(&xr[body..]) {
            *y = silu_libm(v);
        }
    }
}

#[inline(always)]
fn silu_rows(x: &[f32], d: usize, out: &mut [f32]) {
    let body = d - d % 8;
    for (xr, yr) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        for (y, &v) in yr[..body].iter_mut().zip(&xr[..body]) {
            *y = silu(v);
        }
        for (y, &v) in yr[body..].iter_mut().zip(&xr[body..]) {
            *y = silu_libm(v);
        }
    }
}

/// tinyBLAS' float dot (llamafile `tinyBLAS<8>`; llama.cpp takes it for two or more tokens, poot for every count): 8 FMA
/// lanes (`i % 8`) over `a.len()` (a multiple of 8), then [`hsum8`].
#[inline(always)]
pub(crate) fn dot_lanes8(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    hsum8(&acc)
}

/// `ggml_vec_dot_f16` (one token): 32 FMA lanes (`i % 32`) over the whole 32-groups, folded by
/// [`fold32`], then the tail products (rounded in `f32`) added in `f64`.
#[inline(always)]
pub(crate) fn dot_lanes32(a: &[f32], b: &[f32]) -> f32 {
    let np = a.len() & !31;
    let mut sum = f64::from(fold32(&lanes32(&a[..np], &b[..np])));
    for (x, y) in a[np..].iter().zip(&b[np..]) {
        sum += f64::from(x * y);
    }
    sum as f32
}

/// `ggml_vec_dot_f32` (one token): as [`dot_lanes32`], but its sum is an `f32` and gcc
/// vectorizes the tail loop `sum += a_i * b_i`: in its 8- and 4-wide parts the products are
/// rounded and added in order, in the last `tail % 4` they are fused (`sum = fma(a_i, b_i,
/// sum)`).
#[inline(always)]
pub(crate) fn dot_lanes32_f32(a: &[f32], b: &[f32]) -> f32 {
    let np = a.len() & !31;
    let rem = a.len() - np;
    let fused = np + rem - rem % 8 + (rem % 8) / 4 * 4;
    let mut sum = fold32(&lanes32(&a[..np], &b[..np]));
    for (x, y) in a[np..fused].iter().zip(&b[np..fused]) {
        sum += x * y;
    }
    for (x, y) in a[fused..].iter().zip(&b[fused..]) {
        sum = x.mul_add(*y, sum);
    }
    sum
}

/// 32 FMA lanes over whole 32-groups of `a`, `b`.
#[inline(always)]
fn lanes32(a: &[f32], b: &[f32]) -> [f32; 32] {
    let mut acc = [0.0f32; 32];
    for (x, y) in a.chunks_exact(32).zip(b.chunks_exact(32)) {
        for l in 0..32 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    acc
}

/// [`expf`] on the 8 lanes of a register, bit-identical lane by lane: the same operations as
/// ggml's `ggml_v_expf`, vectorized, its slow path (`|n| > 126`) blended in. Register in and
/// out: loops that went through arrays stalled on store-to-load forwarding.
///
/// # Safety
/// The caller has detected AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn expf8(xv: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 and FMA by the caller's contract; register-only operations.
    unsafe {
        let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
        let r = c(0x4b40_0000);
        let z = _mm256_fmadd_ps(xv, c(0x3fb8_aa3b), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), xv));
        let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
        let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f80_0000)));
        let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let u = _mm256_mul_ps(b, b);
        let hi = _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17));
        let lo = _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb));
        let j = _mm256_fmadd_ps(hi, u, lo);
        let j = _mm256_fmadd_ps(j, u, _mm256_mul_ps(c(0x3f7f_fff6), b));
        let mut r = _mm256_fmadd_ps(j, k, k);
        // `|n| > 126` (results near or past the float range): ggml's blended slow path, the
        // scalar `expf`'s steps lane by lane. Scores far below their row's maximum land here,
        // which the scalar fallback made 4x slower in attention over random-weight models.
        let slow = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, c(0x42fc_0000));
        if _mm256_movemask_ps(slow) != 0 {
            let g = _mm256_and_si256(
                _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
                _mm256_set1_epi32(0x8200_0000_u32 as i32),
            );
            let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
            let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
            let huge = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, c(0x4340_0000));
            let near = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
            let rc = _mm256_blendv_ps(near, _mm256_mul_ps(s1, s1), huge);
            r = _mm256_blendv_ps(r, rc, slow);
        }
        r
    }
}

/// `GGML_F32x8_REDUCE` of four 8-lane accumulators (`acc[8j..8j+8]` is accumulator `j`):
/// `(0 + 2) + (1 + 3)` lane by lane, then [`hsum8_hadd`].
#[inline(always)]
pub(crate) fn fold32(acc: &[f32; 32]) -> f32 {
    let mut s = [0.0f32; 8];
    for (l, s) in s.iter_mut().enumerate() {
        *s = (acc[l] + acc[16 + l]) + (acc[8 + l] + acc[24 + l]);
    }
    hsum8_hadd(&s)
}

/// `hsum_float_8` (quants, tinyBLAS, softmax): `(a0+a4 + a2+a6) + (a1+a5 + a3+a7)`.
#[inline(always)]
pub fn hsum8(a: &[f32; 8]) -> f32 {
    let r = [a[4] + a[0], a[5] + a[1], a[6] + a[2], a[7] + a[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// [`hsum8`] of a register, the same additions.
///
/// # Safety
/// The caller has detected AVX.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn hsum8v(a: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: AVX by the caller's contract; register-only operations.
    unsafe {
        // [a0+a4, a1+a5, a2+a6, a3+a7], then lanes 0 + 2 and 1 + 3, then their sum.
        let v = _mm_add_ps(_mm256_extractf128_ps::<1>(a), _mm256_castps256_ps128(a));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
    }
}

/// `GGML_F32x8_REDUCE`'s last steps (two `hadd`s): `(a0+a4 + a1+a5) + (a2+a6 + a3+a7)`.
#[inline(always)]
pub fn hsum8_hadd(a: &[f32; 8]) -> f32 {
    let r = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (r[0] + r[1]) + (r[2] + r[3])
}

/// `v` rounded to bf16 as ggml does (nearest even; NaNs stay NaNs, quieted).
pub(crate) fn round_bf16(v: f32) -> u16 {
    let u = v.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`expf8`] on an array.
    ///
    /// # Safety
    /// AVX2 and FMA detected.
    #[cfg(target_arch = "x86_64")]
    unsafe fn expf8_lanes(x: &[f32; 8]) -> [f32; 8] {
        use std::arch::x86_64::*;
        let mut out = [0.0f32; 8];
        // SAFETY: AVX2 and FMA (the contract); 8 floats in each array.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), expf8(_mm256_loadu_ps(x.as_ptr()))) };
        out
    }

    #[test]
    fn expf_within_two_ulp_and_saturates() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32; // normal results only: ulps of subnormals are not relative
        while x < 88.0 {
            let want = f64::from(x).exp();
            let got = f64::from(expf(x));
            let ulp = f64::from(f32::EPSILON) * want.abs().max(f64::from(f32::MIN_POSITIVE));
            worst = worst.max((got - want).abs() / ulp);
            x += 0.001_37;
        }
        assert!(worst <= 2.0, "worst {worst} ulp");
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(100.0), f32::INFINITY);
    }

    #[test]
    fn silu_close_to_libm() {
        for i in -400..400 {
            let x = i as f32 * 0.05;
            let (a, b) = (silu(x), silu_libm(x));
            assert!(
                (a - b).abs() <= 4.0 * f32::EPSILON * b.abs().max(1e-30),
                "{x}"
            );
        }
    }

    #[test]
    fn lane_sums_follow_their_orders() {
        // Lane pairs (i, i + 4) first; then hsum8 adds pairs (0, 2), (1, 3), hsum8_hadd (0, 1),
        // (2, 3). Big values cancel in one order and swallow small ones in the other.
        let a = [1e8f32, 1.0, -1e8, 1.0, 0.0, 0.5, 0.0, 3.0];
        assert_eq!(hsum8(&a), 0.0 + (1.5 + 4.0));
        assert_eq!(hsum8_hadd(&a), (1e8 + 1.5) + (-1e8 + 4.0));
        assert_ne!(hsum8(&a), hsum8_hadd(&a));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn silu_rows_in_registers_give_the_scalar_bits() {
        let f = crate::CpuFeatures::get();
        if !crate::testutil::isa_runs("avx2", f.avx2 && f.fma) {
            return;
        }
        // Rows of 21 (two groups of 8 and a libm tail); values across expf's range, past its
        // saturation (|x| > 87: the scalar fallback inside expf8), zeros of both signs, infinities.
        let mut x: Vec<f32> = (0..21 * 40).map(|i| (i as f32 - 420.0) * 0.37).collect();
        x[..6].copy_from_slice(&[0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1e-40, -200.0]);
        let mut want = vec![0.0f32; x.len()];
        silu_rows(&x, 21, &mut want);
        let mut got = vec![f32::NAN; x.len()];
        // SAFETY: AVX2 and FMA detected above.
        unsafe { silu_rows_fma(&x, 21, &mut got) };
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
    }

    /// The register fold is `hsum8`'s additions: orders that differ only in rounding would
    /// pass every attention test, whose results are rounded to f16.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn hsum8v_is_hsum8() {
        if !crate::testutil::isa_runs("avx2", crate::CpuFeatures::get().avx) {
            return;
        }
        let mut rng = crate::testutil::Rng::new(5);
        for _ in 0..2000 {
            let a: [f32; 8] = rng.vec(8, -1e3, 1e3).try_into().expect("8 values");
            // SAFETY: AVX was just detected; `a` holds 8 floats.
            let got = unsafe { hsum8v(std::arch::x86_64::_mm256_loadu_ps(a.as_ptr())) };
            assert_eq!(got.to_bits(), hsum8(&a).to_bits(), "{a:?}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn expf8_is_expf_lane_by_lane() {
        let f = crate::CpuFeatures::get();
        if !crate::testutil::isa_runs("avx2", f.avx2 && f.fma) {
            return;
        }
        let mut x = -110.0f32;
        while x < 95.0 {
            let v: [f32; 8] = std::array::from_fn(|l| x + l as f32 * 0.37);
            // SAFETY: AVX2 and FMA were just detected.
            let got = unsafe { expf8_lanes(&v) };
            for l in 0..8 {
                assert_eq!(got[l].to_bits(), expf(v[l]).to_bits(), "x = {}", v[l]);
            }
            x += 0.913;
        }
        // Fast lanes beside slow ones (|n| > 126: near and past the float range).
        let specials = [
            [
                f32::NEG_INFINITY,
                0.0,
                -0.0,
                1e-30,
                -1e-30,
                88.0,
                -87.0,
                1.0,
            ],
            [
                -200.0,
                150.0,
                f32::INFINITY,
                -104.0,
                -103.9,
                88.7,
                100.0,
                -88.0,
            ],
            [-1.0, -95.5, 2.0, 89.0, -0.5, -150.0, 3.0, -87.5],
        ];
        for special in specials {
            // SAFETY: as above.
            let got = unsafe { expf8_lanes(&special) };
            for l in 0..8 {
                assert_eq!(
                    got[l].to_bits(),
                    expf(special[l]).to_bits(),
                    "x = {}",
                    special[l]
                );
            }
        }
    }
}
