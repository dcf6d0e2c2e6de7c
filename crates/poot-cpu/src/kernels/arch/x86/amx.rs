//! AMX-INT8 tiles for the multi-token 8-row integer matmuls (prefill), where the CPU has them.
//!
//! Why: a `tdpbssd` multiplies a 16x32 int8 tile by a 32x16 one into 16x16 exact `i32` sums in
//! one instruction, several times what a core's VNNI registers do per cycle, so a prefill's
//! integer work drops to a small part of its float work (scaling each block's sums).
//!
//! How: tasks take panels of 16 weight rows (two 8-row groups of `matmul/repack.rs`, the second all
//! zeros past the matrix). A task first lays its panel out as tiles, once for every token:
//! per 32-value block, 8 tile rows of 64 bytes, row `c` holding elements `4c..4c+4` of weight
//! row `r` at bytes `4r..4r+4` as signed int8 (the layout a B tile takes: Q4_0 nibbles minus 8,
//! Q5_0's with the fifth bit minus 16, Q8_0's copied), plus the 16 rows' scales as `f32`. The
//! quantized activations are copied once per call into tile order (16 tokens' 32 quants of a block
//! as 512 contiguous bytes, the last tile zero-padded, and their scales side by side). Then for
//! every 16-token tile, block after block: one tile load of each operand, one `tdpbssd`, one store
//! of the 16x16 sums, and per token `acc = fma(dw * dx, sum, acc)` in AVX-512, 16 rows a vector.
//! Q4_1 does not come here: it keeps ggml's order (`matmul/r8.rs`), which whole-block sums cannot
//! give.
//!
//! Numerics: exactly `arch::generic::qdot_generic::dot_scalar_blocks` (integer sums exact, then the same float
//! steps in the same order), so bit-identical to the block order of the other paths on every thread
//! count (tested).
//!
//! Safety: tile instructions fault unless (1) Linux granted this process the tile state (asked
//! once, `arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`; [`available`] is false if refused or not
//! Linux) and (2) the thread loaded a tile configuration. Every kernel call loads its own and
//! releases it before returning, so any thread of the pool may run any call.
//!
//! Cost: reused scratch of `t * k` bytes plus `t * k / 4` for the activations' copy (rounded
//! up to 16 tokens), and per task `nb * 640` bytes for the panel (40 KiB for 2048 columns),
//! written once and read once per 16 tokens.

use std::arch::asm;
use std::arch::x86_64::*;

use crate::kernels::blocks::{header_bytes, superblock_bytes};
use crate::kernels::format::Format;
use crate::kernels::matmul::repack::Repacked;
use crate::kernels::qact::BlockQ8;
use crate::kernels::scratch::Scratch;
use crate::pool::{SharedMut, ThreadPool};
use crate::CpuFeatures;

/// Weight rows per panel (one B tile's columns) and tokens per tile (one A tile's rows).
const P: usize = 16;
/// Bytes of one block's B tile: 8 rows of 64.
const BT: usize = 512;
/// Blocks whose tile products run ahead of the float steps (even).
const DEPTH: usize = 2;

/// Whether AMX-INT8 tiles run here: the CPU has them (with AVX-512 BW/VL for the float steps),
/// the OS enabled their state, and the kernel granted it to this process. Asked once.
/// Detected once, as [`CpuFeatures::amx_int8`].
pub(crate) fn available() -> bool {
    CpuFeatures::get().amx_int8
}

/// [`available`]'s detection, run once by [`CpuFeatures::get`] over the flags `f` found so far.
pub(crate) fn detect(f: &CpuFeatures) -> bool {
    cpu_has_amx(f) && os_grants_tiles()
}

fn cpu_has_amx(f: &CpuFeatures) -> bool {
    if !(f.avx512f && f.avx512bw && f.avx512vl && f.f16c && f.xsave) {
        return false;
    }
    // CPUID.(7,0):EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
    let l7 = __cpuid_count(7, 0);
    if l7.edx & (3 << 24) != 3 << 24 {
        return false;
    }
    // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS manages tile state. OSXSAVE is CPUID.1:ECX
    // bit 27, which xgetbv needs.
    let l1 = __cpuid(1);
    if l1.ecx & (1 << 27) == 0 {
        return false;
    }
    let (lo, _hi): (u32, u32);
    // SAFETY: XGETBV with ECX = 0 is valid once OSXSAVE is set (checked above).
    unsafe {
        asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") _hi, options(nomem, nostack));
    }
    lo & (3 << 17) == 3 << 17
}

#[cfg(target_os = "linux")]
fn os_grants_tiles() -> bool {
    // arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18): the permission is the
    // whole process's, for threads that exist and threads to come.
    let ret: isize;
    // SAFETY: a plain syscall with integer arguments; it touches no memory of ours.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") 158isize => ret,
            in("rdi") 0x1023usize,
            in("rsi") 18usize,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn os_grants_tiles() -> bool {
    false
}

/// The tile configuration (palette 1): tmm0/tmm3 the 16x16 `i32` sums, tmm1/tmm4 16 tokens'
/// 32 quants, tmm2/tmm5 one block's B tile (8 rows of 64 bytes).
#[repr(C, align(64))]
pub(crate) struct TileConfig {
    pub(super) palette: u8,
    start_row: u8,
    _reserved: [u8; 14],
    pub(super) colsb: [u16; 16],
    pub(super) rows: [u8; 16],
}

impl TileConfig {
    pub(super) fn zeroed() -> TileConfig {
        TileConfig {
            palette: 0,
            start_row: 0,
            _reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        }
    }

    /// This module's int8 configuration (see the type's docs).
    fn new() -> TileConfig {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            _reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for (t, colsb, rows) in [(0, 64, 16), (1, 32, 16), (2, 64, 8)] {
            for tile in [t, t + 3] {
                c.colsb[tile] = colsb;
                c.rows[tile] = rows;
            }
        }
        c
    }
}

/// This thread's tile configuration for one task of [`matmul`]: loaded on creation; on drop,
/// the configuration the thread had before is put back (or the tiles released if it had
/// none). Other libraries in the process may keep their own configuration on a thread across
/// calls (llama.cpp's AMX kernels do, and died with SIGILL after a plain release here, on the
/// caller's thread that both pools share), so a task leaves the thread as it found it.
pub(crate) struct Tiles {
    before: TileConfig,
}

impl Tiles {
    fn load() -> Tiles {
        Tiles::load_config(&TileConfig::new())
    }

    /// Loads `cfg` (a valid palette-1 configuration) on this thread.
    pub(super) fn load_config(cfg: &TileConfig) -> Tiles {
        assert!(available(), "AMX path without AMX");
        let mut before = TileConfig::zeroed();
        // SAFETY: the process holds the tile permission (`available`); `sttilecfg` writes the
        // 64-byte configuration (zeros when the tiles are released) into `before`, and the
        // loaded one is a valid palette-1 configuration (`TileConfig::new`).
        unsafe {
            asm!("sttilecfg [{}]", in(reg) &mut before, options(nostack));
            asm!("ldtilecfg [{}]", in(reg) cfg, options(nostack, readonly));
        }
        Tiles { before }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: tiles were configured on this thread by `load` (a `Tiles` is never sent);
        // `before` is what `sttilecfg` stored, so a valid configuration when its palette is set.
        unsafe {
            if self.before.palette == 0 {
                asm!("tilerelease", options(nostack, nomem));
            } else {
                asm!("ldtilecfg [{}]", in(reg) &self.before, options(nostack, readonly));
            }
        }
    }
}

/// `out[j][r] = dot(W[r], a[j])` in the block order for every token `j < t` and row `r < n`
/// (`out` is `[t, n]`), with `w` repacked (Q4_0, Q5_0 or Q8_0) and `a` its quantized
/// activations (`t * nb` blocks).
///
/// # Panics
/// If the slices disagree with the shapes (internal invariant; `matmul_r8` sizes them), or if
/// AMX is not [`available`] (callers choose this path only through `Isa::Amx`).
pub(crate) fn matmul(w: &Repacked, a: &[BlockQ8], t: usize, out: &mut [f32], pool: &ThreadPool) {
    assert!(available(), "AMX path without AMX");
    assert!(w.kind != Format::Q4_1, "Q4_1 keeps ggml's order");
    assert!(
        w.kind != Format::Q4_Z,
        "Q4_Z has per-row zero points: the VNNI loops run it"
    );
    let (n, nb) = (w.n, w.nb);
    assert!(a.len() >= t * nb && out.len() >= t * n);
    // The activations in tile order, once for every panel: token tile `i`, block `b` is 16
    // rows of 32 quants (512 contiguous bytes: one A tile at stride 32), with the 16 tokens'
    // scales at `dx[(i * nb + b) * 16..]`; rows past `t` stay zero (their outputs are never
    // written).
    let tiles = t.div_ceil(P);
    let mut aq = Scratch::<u8>::zeroed(tiles * nb * 32 * P);
    let mut dx = Scratch::<f32>::zeroed(tiles * nb * P);
    for (tok, blocks) in a[..t * nb].chunks_exact(nb).enumerate() {
        let (i, m) = (tok / P, tok % P);
        for (b, blk) in blocks.iter().enumerate() {
            let at = (i * nb + b) * P + m;
            for (d, &q) in aq[32 * at..32 * at + 32].iter_mut().zip(&blk.qs) {
                *d = q as u8;
            }
            dx[at] = blk.d;
        }
    }
    let (aq, dx) = (&aq[..], &dx[..]);
    let panels = w.groups().div_ceil(2);
    let (per_task, tasks) = pool.split(panels);
    let shared = SharedMut::new(out);
    pool.for_each(tasks, |task| {
        let _tiles = Tiles::load();
        let mut wt = Scratch::<u8>::zeroed(nb * BT);
        let mut scales = Scratch::<f32>::zeroed(nb * P);
        let mut res = [0.0f32; P * P];
        for p in task * per_task..((task + 1) * per_task).min(panels) {
            let cols = P.min(n - p * P);
            // SAFETY: AVX-512 F/BW/VL and F16C are part of `available`; the scratch holds
            // `nb` blocks of tiles and of scales (sized above).
            unsafe { lay_panel(w, p, &mut wt, &mut scales) };
            for i in 0..tiles {
                let r = i * nb * P..(i + 1) * nb * P;
                let tile = Tokens {
                    q: &aq[32 * r.start..32 * r.end],
                    d: &dx[r],
                };
                // SAFETY: tiles configured on this thread (`_tiles`); `tile` holds 16 tokens'
                // `nb` blocks, the panel's scratch `nb` blocks' tiles and scales.
                unsafe { tile_tokens(nb, &tile, &wt, &scales, &mut res) };
                for j in 0..P.min(t - i * P) {
                    let at = (i * P + j) * n + p * P;
                    // SAFETY: columns p*16.. of every row belong to this panel's task alone.
                    let dst = unsafe { shared.slice_mut(at..at + cols) };
                    dst.copy_from_slice(&res[j * P..j * P + cols]);
                }
            }
        }
    });
}

/// One token tile of the activations (see `matmul`): `nb` blocks of 16 rows of 32 quants, and
/// per block the 16 tokens' scales.
struct Tokens<'a> {
    q: &'a [u8],
    d: &'a [f32],
}

/// Lays panel `p` (groups `2p`, `2p + 1`) out as B tiles in `tiles` (`nb * 512` bytes) and its
/// scales in `scales[b * 16..]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn lay_panel(w: &Repacked, p: usize, tiles: &mut [u8], scales: &mut [f32]) {
    let (kind, nb) = (w.kind, w.nb);
    let (sb, hdr) = (superblock_bytes(kind), header_bytes(kind));
    assert!(tiles.len() >= nb * BT && scales.len() >= nb * P);
    let g0 = w.group(2 * p);
    let g1 = (2 * p + 1 < w.groups()).then(|| w.group(2 * p + 1));
    // SAFETY: every read is within a superblock of `g0`/`g1` (`nb * sb` bytes each), every
    // write within the asserted scratch; the features are this function's.
    unsafe {
        let zero = _mm256_setzero_si256();
        let m4 = _mm512_set1_epi8(0x0f);
        let half = |g: Option<&[u8]>, off: usize| match g {
            Some(g) => _mm256_loadu_si256(g.as_ptr().add(off).cast()),
            None => zero,
        };
        let wide =
            |lo: __m256i, hi: __m256i| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        let half16 = |g: Option<&[u8]>, off: usize| match g {
            Some(g) => _mm_loadu_si128(g.as_ptr().add(off).cast()),
            None => _mm_setzero_si128(),
        };
        for b in 0..nb {
            let s = b * sb;
            let d = _mm256_set_m128i(half16(g1, s), half16(Some(g0), s));
            _mm512_storeu_ps(scales.as_mut_ptr().add(b * P), _mm512_cvtph_ps(d));
            let t = tiles.as_mut_ptr().add(b * BT);
            if kind == Format::Q8_0 {
                for c in 0..8 {
                    let v = wide(half(Some(g0), s + hdr + 32 * c), half(g1, s + hdr + 32 * c));
                    _mm512_storeu_si512(t.add(64 * c).cast(), v);
                }
                continue;
            }
            for c in 0..4 {
                let v = wide(half(Some(g0), s + hdr + 32 * c), half(g1, s + hdr + 32 * c));
                let mut lo = _mm512_and_si512(v, m4);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                match kind {
                    Format::Q4_0 => {
                        lo = _mm512_sub_epi8(lo, _mm512_set1_epi8(8));
                        hi = _mm512_sub_epi8(hi, _mm512_set1_epi8(8));
                    }
                    Format::Q5_0 => {
                        let bits = |g: Option<&[u8]>| match g {
                            Some(g) => crate::kernels::arch::x86::lanes_rows::fifth_bits(
                                g.as_ptr().add(s + 16),
                                c,
                            ),
                            None => (zero, zero),
                        };
                        let ((l0, h0), (l1, h1)) = (bits(Some(g0)), bits(g1));
                        let sixteen = _mm512_set1_epi8(16);
                        lo = _mm512_sub_epi8(_mm512_or_si512(lo, wide(l0, l1)), sixteen);
                        hi = _mm512_sub_epi8(_mm512_or_si512(hi, wide(h0, h1)), sixteen);
                    }
                    _ => {}
                }
                _mm512_storeu_si512(t.add(64 * c).cast(), lo);
                _mm512_storeu_si512(t.add(64 * (4 + c)).cast(), hi);
            }
        }
    }
}

/// `res[j * 16 + r]` = panel row `r` dotted with token `j` of `a` in the block order, from
/// the panel's tiles `wt` and `scales` (`lay_panel`). The caller holds this thread's
/// [`Tiles`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn tile_tokens(
    nb: usize,
    a: &Tokens<'_>,
    wt: &[u8],
    scales: &[f32],
    res: &mut [f32; P * P],
) {
    assert!(a.q.len() >= nb * 32 * P && a.d.len() >= nb * P);
    assert!(wt.len() >= nb * BT && scales.len() >= nb * P);
    // `DEPTH + 2` sum buffers of 1 KiB: the float steps of blocks `b, b + 1` read sums stored
    // `DEPTH` blocks earlier, while the tiles of `b + DEPTH, b + DEPTH + 1` run. (Measured on
    // a Sapphire Rapids-class VM: the two units barely overlap either way, about 15 ns of tile
    // work and 6 of float work per block and 16 tokens, 21 together; depths 2 to 6 and loading
    // the configuration per call or per task all timed alike.)
    #[repr(C, align(64))]
    struct Sums([[i32; P * P]; DEPTH + 2]);
    let mut sums = Sums([[0; P * P]; DEPTH + 2]);
    // SAFETY: tile loads read block `b`'s 512 bytes of `a.q` (16 rows of 32) and of `wt` (8
    // rows of 64), within the asserted lengths; stores write the 1 KiB buffers of `sums`; the
    // tiles are configured (the caller's `Tiles`); the float steps read within the asserted
    // slices.
    unsafe {
        let sp = sums.0.as_mut_ptr();
        let issue = |b: usize| {
            if b >= nb {
                return;
            }
            let (ap, wp, cp) = (
                a.q.as_ptr().add(b * 32 * P),
                wt.as_ptr().add(b * BT),
                sp.add(b % 4),
            );
            if b.is_multiple_of(2) {
                asm!(
                    "tilezero tmm0",
                    "tileloadd tmm1, [{a} + {s32} * 1]",
                    "tileloadd tmm2, [{w} + {s64} * 1]",
                    "tdpbssd tmm0, tmm1, tmm2",
                    "tilestored [{c} + {s64} * 1], tmm0",
                    a = in(reg) ap, w = in(reg) wp, c = in(reg) cp,
                    s32 = in(reg) 32usize, s64 = in(reg) 64usize,
                    options(nostack)
                );
            } else {
                asm!(
                    "tilezero tmm3",
                    "tileloadd tmm4, [{a} + {s32} * 1]",
                    "tileloadd tmm5, [{w} + {s64} * 1]",
                    "tdpbssd tmm3, tmm4, tmm5",
                    "tilestored [{c} + {s64} * 1], tmm3",
                    a = in(reg) ap, w = in(reg) wp, c = in(reg) cp,
                    s32 = in(reg) 32usize, s64 = in(reg) 64usize,
                    options(nostack)
                );
            }
        };
        let mut acc = [_mm512_setzero_ps(); P];
        for b in 0..DEPTH {
            issue(b);
        }
        let mut b = 0;
        while b < nb {
            issue(b + DEPTH);
            issue(b + DEPTH + 1);
            scale_add(&mut acc, &*sp.add(b % (DEPTH + 2)), scales, a, b);
            if b + 1 < nb {
                scale_add(&mut acc, &*sp.add((b + 1) % (DEPTH + 2)), scales, a, b + 1);
            }
            b += 2;
        }
        for (j, v) in acc.iter().enumerate() {
            _mm512_storeu_ps(res.as_mut_ptr().add(j * P), *v);
        }
    }
}

/// Block `b`'s float steps for 16 tokens: `acc[j] = fma(dw * dx_j, sums_j, acc[j])`
/// (`arch::generic::qdot_generic::dot_scalar_blocks`' order), 16 rows a vector.
#[inline(always)]
unsafe fn scale_add(
    acc: &mut [__m512; P],
    sums: &[i32; P * P],
    scales: &[f32],
    a: &Tokens<'_>,
    b: usize,
) {
    // SAFETY: `b < nb` and the lengths `tile_tokens` asserted; AVX-512F enabled there.
    unsafe {
        let dw = _mm512_loadu_ps(scales.as_ptr().add(b * P));
        let dx = a.d.as_ptr().add(b * P);
        for (j, acc) in acc.iter_mut().enumerate() {
            let sum = _mm512_cvtepi32_ps(_mm512_loadu_si512(sums.as_ptr().add(j * P).cast()));
            let sc = _mm512_mul_ps(dw, _mm512_set1_ps(*dx.add(j)));
            *acc = _mm512_fmadd_ps(sc, sum, *acc);
        }
    }
}

#[cfg(test)]
#[path = "amx_tests.rs"]
mod tests;
