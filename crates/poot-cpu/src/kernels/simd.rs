//! Instruction-set selection and the inner loops that differ per ISA.
//!
//! [`Isa`] names a code path; [`Isa::detect`] picks the best one this CPU runs (from the
//! features [`crate::CpuFeatures`] detected once). The portable [`Isa::Scalar`] path always exists,
//! is plain Rust, and is the reference the SIMD paths are tested against.
//!
//! Invariant (soundness): a SIMD function is only reached through a `Checked` token, and a
//! `Checked` is only built after the ISA's features were detected on this CPU.
//!
//! Inner loops here:
//! - `decode`: block decoding; explicit AVX2 decoders (`arch/x86/decode.rs`) on both SIMD paths.
//!   Bit-identical across ISAs.
//! - `dot_rows`: `res[tok][r] = dot(w[r], x[tok])` for `NR` decoded weight rows and all tokens,
//!   register-tiled (AVX2: 4 rows x 2 tokens; AVX-512: 4 rows x 4 tokens), `f32` accumulation in
//!   8 or 16 lanes, horizontal sum, then a scalar tail for `k % 8` (or `% 16`).

use crate::kernels::decode::decode_run;
use crate::kernels::format::Format;
use crate::tuning::Tuning;
use crate::KernelError;

/// Weight rows decoded together and tiled against tokens.
pub(crate) const NR: usize = 4;

/// Bytes ahead of the current read that the streaming integer kernels (the 8-row layouts'
/// one-token dots) prefetch, every line of it. Every line a few KiB ahead streams a decode
/// step's matmuls from DRAM faster than one line per super-block; 2 KiB did best on a Sapphire
/// Rapids-class VM and sits in Zen 3's flat 1-8 KiB range, so it is the default. The F16/BF16
/// matvec does not take it (its long rows already stream well; per-row prefetches made that
/// decode slower). Measurements: `docs/performance-history.md`, "Measurements behind the kernels".
/// `CpuOptions::prefetch` (`POOT_CPU_PREFETCH` by default) overrides it for tuning on another
/// machine (`0`: the old one-line-per-super-block prefetch).
pub(crate) fn prefetch_ahead() -> usize {
    Tuning::current().prefetch
}

/// How far ahead (bytes) the AVX-512 one-token F16/BF16 loops prefetch their row stream into
/// L2 (`CpuOptions::prefetch_float`, `POOT_CPU_PREFETCH_FLOAT` by default, default 8192: two
/// 2048-wide rows on): L2 prefetches 8 KiB ahead streamed a BF16 or F16 matrix from DRAM best
/// (measurements: `docs/performance-history.md`, "Measurements behind the kernels"). `0` prefetches
/// the line being read, in effect none. Quantized rows keep [`prefetch_ahead`].
pub(crate) fn prefetch_float_ahead() -> usize {
    Tuning::current().prefetch_float
}

/// The streaming kernels' per-super-block prefetch for the super-block of `sb` bytes at `s`:
/// every line `ahead` bytes on ([`prefetch_ahead`]), or with `ahead == 0` one line four
/// super-blocks on (the old scheme).
#[inline(always)]
pub(crate) fn prefetch_stream(s: *const u8, sb: usize, ahead: usize) {
    if ahead == 0 {
        prefetch_range(s.wrapping_add(4 * sb), 1);
    } else {
        prefetch_range(s.wrapping_add(ahead), sb);
    }
}

/// The distance (bytes) from a super-block to the same super-block of the next unit a task
/// reads (its next pair of groups, or next group), for [`prefetch_next`]; `unit` is that
/// unit's size in bytes. 0 (off) when `CpuOptions::prefetch_next` is false
/// (`POOT_CPU_PREFETCH_NEXT=0` by default).
pub(crate) fn prefetch_next_distance(unit: usize) -> usize {
    if Tuning::current().prefetch_next {
        unit
    } else {
        0
    }
}

/// Prefetches into L2 the `sb`-byte super-block `next` bytes after the one at `s` (nothing when
/// `next` is 0): while a task reads one unit (two groups side by side), the next unit's lines
/// arrive. Why: each group is a short stream (9 KiB for a 2048-wide Q4_0 row block), and the
/// second stream of every new pair starts cold; the hardware prefetchers and the near
/// [`prefetch_stream`] cover the rest. It sped up a one-token Q4_0 matmul from DRAM on one
/// core; Q8_0 did not change (measurements: `docs/performance-history.md`, "Measurements behind the
/// kernels").
#[inline(always)]
pub(crate) fn prefetch_next(s: *const u8, sb: usize, next: usize) {
    if next > 0 {
        prefetch_lines::<L2>(s.wrapping_add(next), sb);
    }
}

/// Prefetches the cache lines of `p..p + len` into L1 (a hint: it never faults, and does
/// nothing off x86). A task's first [`prefetch_ahead`] bytes, before its stream's own
/// prefetches reach them.
#[inline(always)]
pub(crate) fn prefetch_range(p: *const u8, len: usize) {
    prefetch_lines::<L1>(p, len);
}

/// `_MM_HINT_T0` and `_MM_HINT_T1`, named off x86 too.
const L1: i32 = 3;
const L2: i32 = 2;

/// Prefetches the cache lines of `p..p + len` with `HINT` ([`L1`] or [`L2`]); nothing off x86.
#[inline(always)]
fn prefetch_lines<const HINT: i32>(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(64) {
        // SAFETY: SSE is part of x86-64's baseline; a prefetch never faults, whatever the
        // address (past a matrix's end it only fetches a useless line).
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(p.wrapping_add(off).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// A code path for the compute kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust; always available; the reference in tests.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512F (plus the AVX2 set).
    Avx512,
    /// [`Isa::Avx512`] plus AMX-INT8 tiles for the multi-token integer matmuls (`arch/x86/amx.rs`);
    /// every other kernel runs its AVX-512 path. Needs the kernel's grant of tile state.
    Amx,
}

impl Isa {
    /// Every path, best last.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx];

    /// Whether this CPU can run the path.
    pub fn is_available(self) -> bool {
        crate::CpuFeatures::get().runs(self)
    }

    /// The path the kernels on this thread take: inside a runtime's compile or run, the one
    /// its `CpuOptions::isa` chose; elsewhere the process default, the best one this CPU runs
    /// or the one `POOT_CPU_ISA` forces (`scalar`, `avx2`, `avx512`, `amx`; read once per
    /// process). See `crate::tuning`.
    pub fn detect() -> Isa {
        Tuning::current().isa
    }

    /// The best path this CPU runs that is no better than `cap` (a path this CPU lacks gives
    /// the best one below it).
    pub fn capped(cap: Isa) -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .filter(|isa| *isa as u8 <= cap as u8)
            .find(|isa| isa.is_available())
            .unwrap_or(Isa::Scalar)
    }

    /// The best path this CPU runs, ignoring `POOT_CPU_ISA`.
    pub fn best() -> Isa {
        crate::CpuFeatures::get().best_isa()
    }

    /// `"scalar"`, `"avx2"`, `"avx512"` or `"amx"`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
        }
    }

    /// The path named `name` (see [`Isa::name`]).
    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == name)
    }

    /// The paths this CPU runs, scalar first.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    /// Whether the path has AVX-512 (the AMX path runs AVX-512 code outside its tiles).
    pub(crate) fn avx512(self) -> bool {
        matches!(self, Isa::Avx512 | Isa::Amx)
    }

    pub(crate) fn checked(self) -> Result<Checked, KernelError> {
        if self.is_available() {
            Ok(Checked(self))
        } else {
            Err(KernelError::IsaUnavailable { isa: self })
        }
    }
}

/// Proof that the wrapped ISA was detected on this CPU (see the module invariant).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checked(Isa);

impl Checked {
    pub(crate) fn isa(self) -> Isa {
        self.0
    }
}

/// Decodes `dst.len()` values of `p` from `src` (whole blocks; see `decode_run`).
pub(crate) fn decode(ck: Checked, p: Format, src: &[u8], dst: &mut [f32]) {
    match ck.0 {
        Isa::Scalar => decode_run(p, src, dst),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Checked` proves AVX2, FMA and F16C were detected (AVX-512 implies them here).
        // The AVX-512 path decodes with the AVX2 code (decoding is not the bottleneck there).
        Isa::Avx2 | Isa::Avx512 | Isa::Amx => unsafe {
            crate::kernels::arch::x86::decode::decode_avx2(p, src, dst)
        },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 | Isa::Amx => decode_run(p, src, dst),
    }
}

/// `res[tok * NR + r] = sum_i w[r * k + i] * x[tok * k + i]` for `r < NR`, `tok < t`.
///
/// # Panics
/// If `w.len() < NR * k`, `x.len() < t * k` or `res.len() < t * NR` (internal invariant; the
/// public kernels validate shapes first).
pub(crate) fn dot_rows(ck: Checked, w: &[f32], k: usize, x: &[f32], t: usize, res: &mut [f32]) {
    assert!(
        w.len() >= NR * k && x.len() >= t * k && res.len() >= t * NR,
        "dot_rows shapes"
    );
    match ck.0 {
        Isa::Scalar => dot_rows_scalar(w, k, x, t, res),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Checked` proves AVX2 and FMA were detected; shapes asserted above.
        Isa::Avx2 => unsafe { x86::dot_rows_avx2(w, k, x, t, res) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Checked` proves AVX-512F was detected; shapes asserted above.
        Isa::Avx512 | Isa::Amx => unsafe { x86::dot_rows_avx512(w, k, x, t, res) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 | Isa::Amx => dot_rows_scalar(w, k, x, t, res),
    }
}

fn dot_rows_scalar(w: &[f32], k: usize, x: &[f32], t: usize, res: &mut [f32]) {
    for tok in 0..t {
        let xr = &x[tok * k..(tok + 1) * k];
        for r in 0..NR {
            res[tok * NR + r] = dot(&w[r * k..(r + 1) * k], xr);
        }
    }
}

/// Portable dot product: 8 `f32` lanes, then a pairwise lane sum, then the tail.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (at, bt) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in at.iter().zip(bt) {
        s += x * y;
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[allow(
    clippy::needless_range_loop,
    reason = "register tiles read clearest with indices"
)]
mod x86 {
    use std::arch::x86_64::*;

    use crate::kernels::simd::NR;

    /// `ggml::hsum8`'s additions on a register.
    #[target_feature(enable = "avx2,fma")]
    fn hsum256(v: __m256) -> f32 {
        // SAFETY: AVX2 enabled on this function.
        unsafe { crate::kernels::ggml::hsum8v(v) }
    }

    /// The scalar tail `i0..k` of row `r` and token `j`, added to `s`.
    #[inline(always)]
    fn tail(s: f32, w: &[f32], x: &[f32], k: usize, r: usize, j: usize, i0: usize) -> f32 {
        let mut s = s;
        for i in i0..k {
            s += w[r * k + i] * x[j * k + i];
        }
        s
    }

    /// `TT` tokens against the `NR` rows, `U`-way unrolled over k.
    #[target_feature(enable = "avx2,fma")]
    fn tile_avx2<const TT: usize, const U: usize>(w: &[f32], k: usize, x: &[f32], res: &mut [f32]) {
        assert!(w.len() >= NR * k && x.len() >= TT * k && res.len() >= TT * NR);
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut acc = [[[_mm256_setzero_ps(); TT]; NR]; U];
        let main = k - k % (8 * U);
        let mut i = 0;
        while i < main {
            for u in 0..U {
                let o = i + 8 * u;
                let mut xv = [_mm256_setzero_ps(); TT];
                for j in 0..TT {
                    // SAFETY: o + 8 <= k and j < TT: inside x (asserted TT * k).
                    xv[j] = unsafe { _mm256_loadu_ps(xp.add(j * k + o)) };
                }
                for r in 0..NR {
                    // SAFETY: o + 8 <= k and r < NR: inside w (asserted NR * k).
                    let wv = unsafe { _mm256_loadu_ps(wp.add(r * k + o)) };
                    for j in 0..TT {
                        acc[u][r][j] = _mm256_fmadd_ps(wv, xv[j], acc[u][r][j]);
                    }
                }
            }
            i += 8 * U;
        }
        while i + 8 <= k {
            for j in 0..TT {
                // SAFETY: i + 8 <= k and j < TT: inside x.
                let xv = unsafe { _mm256_loadu_ps(xp.add(j * k + i)) };
                for r in 0..NR {
                    // SAFETY: i + 8 <= k and r < NR: inside w.
                    let wv = unsafe { _mm256_loadu_ps(wp.add(r * k + i)) };
                    acc[0][r][j] = _mm256_fmadd_ps(wv, xv, acc[0][r][j]);
                }
            }
            i += 8;
        }
        for r in 0..NR {
            for j in 0..TT {
                let mut v = acc[0][r][j];
                for u in 1..U {
                    v = _mm256_add_ps(v, acc[u][r][j]);
                }
                res[j * NR + r] = tail(hsum256(v), w, x, k, r, j, i);
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot_rows_avx2(w: &[f32], k: usize, x: &[f32], t: usize, res: &mut [f32]) {
        let mut tok = 0;
        while tok + 2 <= t {
            tile_avx2::<2, 1>(w, k, &x[tok * k..], &mut res[tok * NR..]);
            tok += 2;
        }
        // One chain per output in every tile (no unrolling along k), so that a token's result
        // does not depend on the tile it lands in, and so on the tokens beside it.
        if tok < t {
            tile_avx2::<1, 1>(w, k, &x[tok * k..], &mut res[tok * NR..]);
        }
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    fn tile_avx512<const TT: usize, const U: usize>(
        w: &[f32],
        k: usize,
        x: &[f32],
        res: &mut [f32],
    ) {
        assert!(w.len() >= NR * k && x.len() >= TT * k && res.len() >= TT * NR);
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut acc = [[[_mm512_setzero_ps(); TT]; NR]; U];
        let main = k - k % (16 * U);
        let mut i = 0;
        while i < main {
            for u in 0..U {
                let o = i + 16 * u;
                let mut xv = [_mm512_setzero_ps(); TT];
                for j in 0..TT {
                    // SAFETY: o + 16 <= k and j < TT: inside x (asserted TT * k).
                    xv[j] = unsafe { _mm512_loadu_ps(xp.add(j * k + o)) };
                }
                for r in 0..NR {
                    // SAFETY: o + 16 <= k and r < NR: inside w (asserted NR * k).
                    let wv = unsafe { _mm512_loadu_ps(wp.add(r * k + o)) };
                    for j in 0..TT {
                        acc[u][r][j] = _mm512_fmadd_ps(wv, xv[j], acc[u][r][j]);
                    }
                }
            }
            i += 16 * U;
        }
        while i + 16 <= k {
            for j in 0..TT {
                // SAFETY: i + 16 <= k and j < TT: inside x.
                let xv = unsafe { _mm512_loadu_ps(xp.add(j * k + i)) };
                for r in 0..NR {
                    // SAFETY: i + 16 <= k and r < NR: inside w.
                    let wv = unsafe { _mm512_loadu_ps(wp.add(r * k + i)) };
                    acc[0][r][j] = _mm512_fmadd_ps(wv, xv, acc[0][r][j]);
                }
            }
            i += 16;
        }
        for r in 0..NR {
            for j in 0..TT {
                let mut v = acc[0][r][j];
                for u in 1..U {
                    v = _mm512_add_ps(v, acc[u][r][j]);
                }
                res[j * NR + r] = tail(_mm512_reduce_add_ps(v), w, x, k, r, j, i);
            }
        }
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) fn dot_rows_avx512(w: &[f32], k: usize, x: &[f32], t: usize, res: &mut [f32]) {
        let mut tok = 0;
        while tok + 4 <= t {
            tile_avx512::<4, 1>(w, k, &x[tok * k..], &mut res[tok * NR..]);
            tok += 4;
        }
        // One chain per output in every tile, as `dot_rows_avx2`.
        if tok + 2 <= t {
            tile_avx512::<2, 1>(w, k, &x[tok * k..], &mut res[tok * NR..]);
            tok += 2;
        }
        if tok < t {
            tile_avx512::<1, 1>(w, k, &x[tok * k..], &mut res[tok * NR..]);
        }
    }
}
