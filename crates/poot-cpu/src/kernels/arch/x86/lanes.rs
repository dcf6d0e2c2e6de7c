//! Register widths as types, so that a loop written once runs at 256 and at 512 bits.
//!
//! [`Lanes`] is one width's float and integer register and the element-wise ops the shared
//! bodies use (ggml's `GGML_F32_VEC` macros, as traits: `qdot_r.rs`'s integer dot and
//! `fdot.rs`'s `lanes32` float chains are written over it); `lanes_rows.rs`'s `RowLanes` adds
//! how one step of the 8-row interleaved layout (`matmul/repack.rs`) is read at that width:
//! [`Ymm`] one group, [`Zmm`] two side by side. A body generic over the width therefore runs,
//! in every lane, the same instructions on the same values at either width: the results are
//! the same bits.
//!
//! Where a width goes: a new register width is one more implementation of these traits; a
//! shared body stays as it is. A new ISA's registers (NEON's 128 bits under `arch/aarch64/`)
//! would implement them too, the traits then moving up to `arch/` with their x86 types left
//! here.
//!
//! Invariant (codegen and soundness): every register op is `#[inline(always)]` and `unsafe`,
//! with the contract that the caller runs inside a `#[target_feature]` function enabling the
//! width's features (AVX2, FMA, F16C for [`Ymm`]; AVX-512 F/BW/VL and VNNI as well for
//! `Ymm<true>` and [`Zmm`]; AVX-512 F/BW only for `Zmm<false>`); the generic bodies are monomorphized inside such entry functions,
//! so they compile to the intrinsics they name, as the hand-written pairs did.

use std::arch::x86_64::*;

/// One register width: a float register of `f32` lanes and an integer one of the same size.
///
/// # Safety (every method)
/// The width's target features enabled by the calling function (see the module docs).
pub(crate) trait Lanes: Copy {
    /// `LANES` f32 values.
    type F: Copy;
    /// `f32` lanes of `F`.
    const LANES: usize;
    /// `LANES` i32 values (or `4 * LANES` bytes).
    type I: Copy;
    /// Whether the integer dot is VNNI's `vpdpbusd` (else `maddubs` + `madd`).
    const VNNI: bool;
    unsafe fn zero() -> Self::F;
    unsafe fn splat(v: f32) -> Self::F;
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    /// `a * b + c`, one rounding.
    unsafe fn fma(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// The lanes stored at `p` (unaligned).
    unsafe fn store(p: *mut f32, v: Self::F);
    /// `LANES` floats at `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self::F;
    /// `LANES` f16 values at `p` (unaligned), widened (exact).
    unsafe fn load_f16(p: *const u8) -> Self::F;
    /// How far ahead a one-token float row stream prefetches (`simd::prefetch_float_ahead`),
    /// or 0 where [`Lanes::prefetch_float`] does nothing.
    fn float_ahead() -> usize;
    /// Prefetches the line at `p` into L2 where this width's float rows stream from DRAM
    /// (512 bits: measured with `CpuOptions::prefetch_float`); nothing at 256 bits, whose
    /// loops were never tuned with it. A hint: never faults.
    fn prefetch_float(p: *const u8);
    /// Each `i32` lane as `f32` (round to nearest).
    unsafe fn to_f(v: Self::I) -> Self::F;
    /// `a - b`, one rounding.
    unsafe fn sub(a: Self::F, b: Self::F) -> Self::F;
    /// Each `i32` lane's bits read as an `f32` (no conversion).
    unsafe fn bits_f(v: Self::I) -> Self::F;
    unsafe fn izero() -> Self::I;
    unsafe fn isplat(v: i32) -> Self::I;
    unsafe fn isplat8(v: i8) -> Self::I;
    /// The 32-bit word at `p` in every lane.
    unsafe fn word(p: *const i8) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn xor(a: Self::I, b: Self::I) -> Self::I;
    /// Each 16-bit lane shifted right by 4.
    unsafe fn srli16_4(a: Self::I) -> Self::I;
    /// Exact per-lane `init + sum(u * s)` over the lane's 4 byte products, `u` unsigned, with
    /// `u * s` pairs that fit `i16` without VNNI (`maddubs` cannot saturate: callers pass
    /// `u <= 31`, or `|w| <= 128` against `|y| <= 127`).
    unsafe fn dot(init: Self::I, u: Self::I, s: Self::I) -> Self::I;
    /// Bytes of `a` negated where `b`'s are negative and zeroed where they are zero
    /// (`vpsignb`).
    unsafe fn sign8(a: Self::I, b: Self::I) -> Self::I;
    /// Adjacent unsigned-by-signed byte products summed into `i16` lanes (`vpmaddubsw`).
    unsafe fn maddubs(u: Self::I, s: Self::I) -> Self::I;
    unsafe fn add16(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn add32(a: Self::I, b: Self::I) -> Self::I;
    /// Adjacent `i16` lanes summed into `i32` lanes (`vpmaddwd` by ones).
    unsafe fn widen16(a: Self::I) -> Self::I;
}

/// 256 bits: `ymm` registers, one 8-row group a step; `VNNI` takes `vpdpbusd ymm`
/// (AVX-512 VNNI + VL), else `maddubs` + `madd` (AVX2).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ymm<const VNNI: bool>;

/// 512 bits: `zmm` registers, two 8-row groups a step; `VNNI` (the default) takes `vpdpbusd
/// zmm` (AVX-512 VNNI), else `maddubs` + `madd` (AVX-512 BW).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Zmm<const VNNI: bool = true>;

/// AVX2 (no VNNI).
pub(crate) type Avx2 = Ymm<false>;
/// 256-bit registers on an AVX-512 VNNI machine.
pub(crate) type Avx2Vnni = Ymm<true>;

impl<const VNNI: bool> Lanes for Ymm<VNNI> {
    type F = __m256;
    type I = __m256i;
    const LANES: usize = 8;
    const VNNI: bool = VNNI;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> __m256 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    fn float_ahead() -> usize {
        0
    }
    #[inline(always)]
    fn prefetch_float(_: *const u8) {}
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m256 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn to_f(v: __m256i) -> __m256 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_cvtepi32_ps(v) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn bits_f(v: __m256i) -> __m256 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_castsi256_ps(v) }
    }
    #[inline(always)]
    unsafe fn izero() -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    unsafe fn isplat(v: i32) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn isplat8(v: i8) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_set1_epi8(v) }
    }
    #[inline(always)]
    unsafe fn word(p: *const i8) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
    }
    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_and_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_or_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn xor(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_xor_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn srli16_4(a: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_srli_epi16::<4>(a) }
    }
    #[inline(always)]
    unsafe fn dot(init: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe {
            if VNNI {
                _mm256_dpbusd_epi32(init, u, s)
            } else {
                let p = _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(u, s));
                _mm256_add_epi32(p, init)
            }
        }
    }
    #[inline(always)]
    unsafe fn sign8(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_sign_epi8(a, b) }
    }
    #[inline(always)]
    unsafe fn maddubs(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_maddubs_epi16(u, s) }
    }
    #[inline(always)]
    unsafe fn add16(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_add_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn add32(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn widen16(a: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm256_madd_epi16(a, _mm256_set1_epi16(1)) }
    }
}

impl<const VNNI: bool> Lanes for Zmm<VNNI> {
    type F = __m512;
    type I = __m512i;
    const LANES: usize = 16;
    const VNNI: bool = VNNI;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> __m512 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    fn float_ahead() -> usize {
        crate::kernels::simd::prefetch_float_ahead()
    }
    #[inline(always)]
    fn prefetch_float(p: *const u8) {
        // SAFETY: a prefetch never faults; SSE is baseline on x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast()) }
    }
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m512 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn to_f(v: __m512i) -> __m512 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_cvtepi32_ps(v) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn bits_f(v: __m512i) -> __m512 {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_castsi512_ps(v) }
    }
    #[inline(always)]
    unsafe fn izero() -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    unsafe fn isplat(v: i32) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn isplat8(v: i8) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_set1_epi8(v) }
    }
    #[inline(always)]
    unsafe fn word(p: *const i8) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_set1_epi32(p.cast::<i32>().read_unaligned()) }
    }
    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_and_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_or_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn xor(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_xor_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn srli16_4(a: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_srli_epi16::<4>(a) }
    }
    #[inline(always)]
    unsafe fn dot(init: __m512i, u: __m512i, s: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe {
            if VNNI {
                _mm512_dpbusd_epi32(init, u, s)
            } else {
                let p = _mm512_madd_epi16(_mm512_set1_epi16(1), _mm512_maddubs_epi16(u, s));
                _mm512_add_epi32(p, init)
            }
        }
    }
    // The four below serve the non-VNNI branches of the shared bodies (`Zmm<false>`: the
    // 512-bit Q4_K dot on AVX-512 BW, `arch/x86/qdot_rk.rs`).
    #[inline(always)]
    unsafe fn sign8(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe {
            let z = _mm512_setzero_si512();
            let neg = _mm512_movepi8_mask(b);
            let nonzero = _mm512_test_epi8_mask(b, b);
            _mm512_maskz_mov_epi8(nonzero, _mm512_mask_sub_epi8(a, neg, z, a))
        }
    }
    #[inline(always)]
    unsafe fn maddubs(u: __m512i, s: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_maddubs_epi16(u, s) }
    }
    #[inline(always)]
    unsafe fn add16(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_add_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn add32(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn widen16(a: __m512i) -> __m512i {
        // SAFETY: the trait's contract (the width's features enabled).
        unsafe { _mm512_madd_epi16(a, _mm512_set1_epi16(1)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    /// The integer ops at 512 bits, halves joined, against the 256-bit ones on each half
    /// (the non-VNNI ones included, which `Zmm<false>` bodies take).
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI detected.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn both_widths(a: &[i8; 64], b: &[i8; 64], c: &[i32; 16]) -> ([i32; 16], [i32; 16]) {
        type Y = Avx2;
        // SAFETY: the features this function enables; every pointer covers what it reads.
        unsafe {
            let y = |p: &[i8; 64], h: usize| _mm256_loadu_si256(p.as_ptr().add(32 * h).cast());
            let z = |p: &[i8; 64]| _mm512_loadu_si512(p.as_ptr().cast());
            let yc = |h: usize| _mm256_loadu_si256(c.as_ptr().add(8 * h).cast());
            let zc = _mm512_loadu_si512(c.as_ptr().cast());
            let mut want = [0i32; 16];
            for h in 0..2 {
                let (ya, yb) = (y(a, h), y(b, h));
                // |a| fits maddubs' unsigned side; the sign moves to b.
                let u = Y::sign8(ya, ya);
                let s = Y::sign8(yb, ya);
                let p = Y::add16(Y::maddubs(u, s), Y::maddubs(Y::and(u, Y::isplat8(15)), s));
                let r = Y::add32(Y::widen16(p), Y::dot(yc(h), Y::and(u, Y::isplat8(15)), yb));
                _mm256_storeu_si256(want.as_mut_ptr().add(8 * h).cast(), r);
            }
            let (za, zb) = (z(a), z(b));
            let u = <Zmm>::sign8(za, za);
            let s = <Zmm>::sign8(zb, za);
            let low = <Zmm>::and(u, <Zmm>::isplat8(15));
            let p = <Zmm>::add16(<Zmm>::maddubs(u, s), <Zmm>::maddubs(low, s));
            let r = <Zmm>::add32(<Zmm>::widen16(p), <Zmm>::dot(zc, low, zb));
            let mut got = [0i32; 16];
            _mm512_storeu_si512(got.as_mut_ptr().cast(), r);
            (got, want)
        }
    }

    #[test]
    fn the_512_bit_integer_ops_are_the_256_bit_ones_on_each_half() {
        if !crate::testutil::isa_runs("vnni", crate::CpuFeatures::get().vnni512()) {
            return;
        }
        let mut rng = Rng::new(3);
        for round in 0..200 {
            let mut bytes = || -> [i8; 64] {
                // -128 included, and zeros (sign8's third case), more of them in early rounds.
                std::array::from_fn(|_| {
                    let v = rng.next_u32();
                    if v.is_multiple_of(7) || round < 20 && v.is_multiple_of(3) {
                        0
                    } else {
                        (v >> 8) as i8
                    }
                })
            };
            let (a, b) = (bytes(), bytes());
            let c: [i32; 16] = std::array::from_fn(|i| i as i32 * 1000 - 7000);
            // SAFETY: AVX-512 VNNI (with F/BW/VL, AVX2, FMA, F16C) detected above.
            let (got, want) = unsafe { both_widths(&a, &b, &c) };
            assert_eq!(got, want, "round {round}");
        }
    }
}
