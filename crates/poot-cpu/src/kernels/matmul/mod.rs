//! `out[t][n] = sum_k x[t][k] * W[n][k]` with `W` in its stored (packed) dtype.
//!
//! How: rows of `W` are split into tasks of whole row blocks (about 256 KiB of decoded `f32`,
//! a multiple of `NR` rows), claimed dynamically by the pool's threads. For each block the
//! thread decodes its rows (whole `k`, exact, see `decode.rs`) into its own scratch, then runs
//! register-tiled dot products of each `NR`-row quad against tiles of tokens, every token tile
//! against the whole block before the next. So each weight byte is read and decoded once per
//! call whatever `t` is (prefill costs one pass over the weights, not `t`), an activation tile
//! is read from memory once per block, and no weight is dequantized beyond one block per
//! thread. One token against F16 or BF16 weights skips the scratch (`matmul/float.rs`); several
//! tokens against F16, BF16 or F32 weights with `k % 8 == 0` on a SIMD path take packed 8-lane
//! tiles instead (`matmul/lanes8.rs`, within the same bound).
//!
//! Numerics: decoding is exact (bit-identical to poot-core's reference), so the only error is
//! `f32` accumulation: 8 (AVX2, scalar) or 16 (AVX-512) lanes of FMAs/multiply-adds along `k`,
//! then a lane sum. Per output `|got - exact| <= (k / 8 + 16) * 2^-24 * sum_k |x||w|` for every
//! path (the tests assert this bound on real weights). Results are deterministic for a given
//! ISA (independent of the thread count).
//!
//! Cost: `2 * t * n * k` flops; memory: a row block plus `NR * TOKEN_TILE` floats of scratch
//! per thread.
//!
//! [`matmul_numerics`] with [`Numerics::Ggml`] takes llama.cpp's arithmetic instead, bit for bit:
//! for Q4_0, Q4_1, Q5_0, Q8_0 weights activations quantized to Q8 and integer block dots (the
//! cheaper path for one token, `matmul/q8.rs`), for F16 and F32 weights ggml's float dot orders
//! (`matmul/float_ggml.rs`), for Q4_K and Q6_K Q8_K activations and integer super-block dots
//! (`matmul/qdot_k.rs`), for BF16 activations rounded to bf16 (`matmul/bf16.rs`), for Q4_Z and
//! Q8_Z (GPTQ, AWQ) Q8_0 activations and integer dots with the zero point folded in
//! (`matmul/q8.rs` too), for F8_S (FP8) E4M3 widened in registers against `f32` activations
//! (`matmul/f8.rs`; llama.cpp has neither type); each states its bound. Q5_1 and the other k-quants keep this exact path under either numerics.
//!
//! Batch invariance, under both numerics: a token's row of the product is the same bits whatever
//! tokens share the call, so a request's answer does not depend on who else is served nor on how
//! its prefill was chunked. Every path takes one summation order per (weight, shape), never one
//! chosen by the token count: token tiles of different widths run the same chains, and the
//! one-token kernels run the order of the multi-token ones (`invariance_tests.rs` checks every
//! dtype, numerics and ISA). Where llama.cpp itself switches order with the token count (tinyBLAS
//! against vec_dot), poot keeps the multi-token order, except Q4_1 (`matmul/r8.rs`).

use poot_core::DType;

pub(crate) mod bf16;
pub(crate) mod decoded;
pub(crate) mod dpbf16;
pub(crate) mod dpbf16_one;
pub(crate) mod experts;
pub(crate) mod experts_stack;
pub(crate) mod f8;
pub(crate) mod f8g;
pub(crate) mod f8r;
pub(crate) mod float;
pub(crate) mod float_ggml;
pub(crate) mod glu;
pub(crate) mod groups;
pub(crate) mod lanes8;
pub(crate) mod q8;
pub(crate) mod qdot_k;
pub(crate) mod r8;
pub mod repack;
pub mod repack_f8;
pub mod repack_f8g;
pub mod repack_k;
pub(crate) mod repack_zg;
pub(crate) mod rk;
pub(crate) mod stored;

use crate::error::{check_len, mul};
use crate::kernels::act_cache::ActCache;
use crate::kernels::blocks::row_bytes;
use crate::kernels::format::{Format, Rows};
use crate::kernels::ggml::Numerics;
use crate::kernels::matmul::repack::{Repack, Repacked};
use crate::kernels::matmul::repack_k::RepackedK;
use crate::kernels::simd::{Checked, Isa};
use crate::pool::ThreadPool;
use crate::KernelError;

/// Every weight dtype [`matmul`] accepts.
pub const MATMUL_DTYPES: [DType; 17] = crate::kernels::format::DECODABLE;

/// `out[t][n] = sum_k x[t][k] * W[n][k]` on the best ISA of this CPU (see the module docs).
///
/// `x` is `[t, k]` row-major `f32`; `w` holds `n` rows of `k` elements of `w_dtype`, row-major
/// as stored (`n * w_dtype.bytes_for(k)` bytes); `out` is `[t, n]`. Every length is checked
/// before anything is written.
#[allow(clippy::too_many_arguments, reason = "the runtime's kernel signature")]
pub fn matmul(
    x: &[f32],
    t: usize,
    k: usize,
    w: &[u8],
    w_dtype: DType,
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    matmul_with(Isa::detect(), x, t, k, w, w_dtype, n, out, pool)
}

/// [`matmul`] on a chosen code path ([`KernelError::IsaUnavailable`] if this CPU lacks it).
#[allow(
    clippy::too_many_arguments,
    reason = "the runtime's kernel signature plus the ISA"
)]
pub fn matmul_with(
    isa: Isa,
    x: &[f32],
    t: usize,
    k: usize,
    w: &[u8],
    w_dtype: DType,
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    matmul_numerics(Numerics::Exact, isa, x, t, k, w, w_dtype, n, out, pool)
}

/// [`matmul_with`] under a chosen [`Numerics`] (see the module docs; the same shape checks).
#[allow(
    clippy::too_many_arguments,
    reason = "the runtime's kernel signature plus the ISA and numerics"
)]
pub fn matmul_numerics(
    numerics: Numerics,
    isa: Isa,
    x: &[f32],
    t: usize,
    k: usize,
    w: &[u8],
    w_dtype: DType,
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    matmul_cached(numerics, isa, x, t, k, w, w_dtype, n, out, pool, None)
}

/// [`matmul_numerics`] with an optional activation cache and the input's key in it.
#[allow(
    clippy::too_many_arguments,
    reason = "the runtime's kernel signature plus the ISA, numerics and cache"
)]
pub(crate) fn matmul_cached(
    numerics: Numerics,
    isa: Isa,
    x: &[f32],
    t: usize,
    k: usize,
    w: &[u8],
    w_dtype: DType,
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
    cache: Option<(&mut ActCache, u64)>,
) -> Result<(), KernelError> {
    let path = MatmulPath::choose(numerics, w_dtype);
    matmul_on_path(
        path, numerics, isa, x, t, k, w, w_dtype, n, out, pool, cache,
    )
}

/// [`matmul_cached`] on the `path` a plan chose for this weight when it compiled; the same
/// shape checks, and [`KernelError::InvalidArgument`] unless `path` is the one
/// [`MatmulPath::choose`] gives for `numerics` and `w_dtype` (a plan stores what it chose from
/// the same store, so this only guards against a mixed-up plan).
#[allow(
    clippy::too_many_arguments,
    reason = "the runtime's kernel signature plus the path, ISA, numerics and cache"
)]
pub(crate) fn matmul_on_path(
    path: MatmulPath,
    numerics: Numerics,
    isa: Isa,
    x: &[f32],
    t: usize,
    k: usize,
    w: &[u8],
    w_dtype: DType,
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
    cache: Option<(&mut ActCache, u64)>,
) -> Result<(), KernelError> {
    if path != MatmulPath::choose(numerics, w_dtype) {
        return Err(KernelError::InvalidArgument {
            what: "matmul path",
            detail: format!("{path:?} is not the path of {w_dtype} weights under {numerics:?}"),
        });
    }
    let ck = isa.checked()?;
    let p = Format::of(w_dtype).ok_or(KernelError::UnsupportedDType {
        op: "matmul",
        dtype: w_dtype,
    })?;
    let row_bytes = row_bytes("matmul", w_dtype, k)?;
    check_len("matmul x", mul(t, k, "matmul x")?, x.len())?;
    check_len("matmul out", mul(t, n, "matmul out")?, out.len())?;
    check_len("matmul w", mul(n, row_bytes, "matmul w")?, w.len())?;
    if t == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        out.fill(0.0);
        return Ok(());
    }
    path.run(
        ck,
        numerics,
        p,
        x,
        (t, k),
        (w, row_bytes, n),
        out,
        pool,
        cache,
    )
}

/// How one weight is multiplied: the choice that depends only on the runtime's numerics and
/// the weight's dtype, made once per weight when a plan compiles and stored in it
/// (`CpuPlan::matmul_path`), as ggml keeps a type's kernels in its type traits. What depends on
/// the call (the token count, the ISA's tiles) each family still picks per call. Weights the
/// runtime re-laid (`repack.rs`) take [`matmul_repacked`] instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MatmulPath {
    /// [`Numerics::Ggml`], BF16: bf16-rounded activations (`bf16.rs`).
    Bf16Ggml,
    /// [`Numerics::Ggml`], Q4_0/Q4_1/Q5_0/Q8_0 and the zero-point Q4_Z/Q8_Z (GPTQ, AWQ) as
    /// stored ([`Rows::Q8`]): Q8 activations, integer dots (`q8.rs`).
    Q8(Format),
    /// [`Numerics::Ggml`], Q4_K/Q6_K as stored ([`Rows::Q8K`]): Q8_K activations, integer dots
    /// (`qdot_k.rs`).
    Q8K(Format),
    /// [`Numerics::Ggml`], F16/F32: ggml's float orders (`float_ggml.rs`).
    FloatGgml,
    /// [`Numerics::Ggml`], F8_S (FP8 checkpoints) as stored: E4M3 widened in registers against
    /// `f32` activations (`f8.rs`).
    F8,
    /// Weights decoded inside the kernel (`decoded.rs`): every dtype under
    /// [`Numerics::Exact`], and the ones ggml's numerics have no path of their own for.
    Decoded,
}

impl MatmulPath {
    /// The path for weights of `dtype` under `numerics` (see the variants): under ggml's
    /// numerics, the one its format's [`Rows`] names.
    pub(crate) fn choose(numerics: Numerics, dtype: DType) -> MatmulPath {
        let Some(format) = Format::of(dtype) else {
            return MatmulPath::Decoded;
        };
        if numerics != Numerics::Ggml {
            return MatmulPath::Decoded;
        }
        match format.rows() {
            Rows::Bf16 => MatmulPath::Bf16Ggml,
            Rows::Q8 => MatmulPath::Q8(format),
            Rows::Q8K => MatmulPath::Q8K(format),
            Rows::F8 => MatmulPath::F8,
            Rows::Float => MatmulPath::FloatGgml,
            Rows::Decoded => MatmulPath::Decoded,
        }
    }

    /// Runs the path on shapes `matmul_cached` validated (`t, n, k > 0`).
    #[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
    fn run(
        self,
        ck: Checked,
        numerics: Numerics,
        p: Format,
        x: &[f32],
        (t, k): (usize, usize),
        (w, row_bytes, n): (&[u8], usize, usize),
        out: &mut [f32],
        pool: &ThreadPool,
        cache: Option<(&mut ActCache, u64)>,
    ) -> Result<(), KernelError> {
        match self {
            MatmulPath::Bf16Ggml => {
                return bf16::matmul_bf16_ggml(ck, x, t, k, w, row_bytes, n, out, pool)
            }
            MatmulPath::Q8(kind) => {
                q8::matmul_q8(ck, kind, x, t, k, w, row_bytes, n, out, pool, cache)
            }
            MatmulPath::Q8K(kind) => {
                qdot_k::matmul_q8k(ck, kind, x, t, k, w, row_bytes, n, out, pool, cache)
            }
            MatmulPath::F8 => f8::matmul_f8(ck, x, t, k, w, row_bytes, n, out, pool),
            MatmulPath::FloatGgml => {
                float_ggml::matmul_float_ggml(ck, p, x, t, k, w, row_bytes, n, out, pool)
            }
            MatmulPath::Decoded => {
                let f = decoded::matmul_decoded;
                f(ck, numerics, p, x, (t, k), (w, row_bytes, n), out, pool)
            }
        }
        Ok(())
    }
}

/// `w` (`n` rows of `k` elements of `w_dtype`, as stored) re-laid for a faster kernel on this
/// `isa` under `numerics`, or `None` when the stored layout is already the fast one: under
/// [`Numerics::Ggml`], Q4_0, Q4_1, Q5_0, Q8_0 and Q4_Z (`matmul/repack.rs`; a Q4_Z tensor
/// whose zero points are all 8 as Q4_0, one whose scales and zero points repeat over runs of
/// 2 or 4 blocks, GPTQ/AWQ group 64 or 128, one header a group: `matmul/repack_zg.rs`), Q4_K and Q6_K
/// (`matmul/repack_k.rs`) and F8_S without NaN codes (`matmul/repack_f8.rs`) go 8 rows at a
/// time. On every path, the scalar one too, so that a forced
/// path computes what the fast ones do: Q4_0, Q5_0 and Q8_0 on this layout take the block order
/// (`matmul/r8.rs`). The copy is the tensor's size; the caller owns it and passes it to
/// [`matmul_repacked`].
pub fn repack_for(
    numerics: Numerics,
    isa: Isa,
    w: &[u8],
    w_dtype: DType,
    n: usize,
    k: usize,
) -> Result<Option<Repack>, KernelError> {
    repack_for_on(numerics, isa, (w, w_dtype), (n, k), None)
}

/// Whether [`repack_for`] re-lays weights of `dtype` under `numerics` (on every ISA alike).
pub(crate) fn relaid(numerics: Numerics, dtype: DType) -> bool {
    numerics == Numerics::Ggml
        && Format::of(dtype).is_some_and(|f| Repacked::supports(f) || RepackedK::supports(f))
}

/// [`repack_for`], the re-lay spread over `pool`'s threads where there is one (the same bytes).
pub fn repack_for_on(
    numerics: Numerics,
    isa: Isa,
    (w, w_dtype): (&[u8], DType),
    (n, k): (usize, usize),
    pool: Option<&ThreadPool>,
) -> Result<Option<Repack>, KernelError> {
    isa.checked()?;
    if numerics != Numerics::Ggml {
        return Ok(None);
    }
    let checked = || -> Result<(), KernelError> {
        let rb = row_bytes("matmul", w_dtype, k)?;
        check_len("matmul w", mul(n, rb, "matmul w")?, w.len())
    };
    let format = Format::of(w_dtype);
    let q = format.filter(|&kind| Repacked::supports(kind));
    let kq = format.filter(|&kind| RepackedK::supports(kind));
    Ok(match (q, kq) {
        (Some(Format::Q4_Z), _) => {
            checked()?;
            let nb = k / 32;
            let rp = Repacked::symmetric_q4z_on(w, n, nb, pool)
                .or_else(|| Repacked::grouped_q4z_on(w, n, nb, pool))
                .unwrap_or_else(|| Repacked::new_on(Format::Q4_Z, w, n, nb, pool));
            Some(Repack::Q(rp))
        }
        (Some(kind), _) => {
            checked()?;
            Some(Repack::Q(Repacked::new_on(kind, w, n, k / 32, pool)))
        }
        (None, Some(kind)) => {
            checked()?;
            Some(Repack::K(RepackedK::new_on(
                kind,
                w,
                n,
                k / crate::kernels::qact::QK_K,
                pool,
            )))
        }
        (None, None) if format == Some(Format::F8_S) => {
            checked()?;
            // Scales repeated over 128 columns (every FP8 checkpoint layout poot reads): one a
            // span; otherwise one a block.
            let nb = k / 32;
            repack_f8g::RepackedF8G::new_on(w, n, nb, pool)
                .map(Repack::F8G)
                .or_else(|| repack_f8::RepackedF8::new_on(w, n, nb, pool).map(Repack::F8))
        }
        (None, None) => None,
    })
}

/// [`matmul_numerics`] under [`Numerics::Ggml`] with weights from [`repack_for`] (`[n, k]`),
/// bit-identical to the stored layout's result; the same shape checks.
#[allow(clippy::too_many_arguments, reason = "the runtime's kernel signature")]
pub fn matmul_repacked(
    isa: Isa,
    x: &[f32],
    t: usize,
    k: usize,
    w: &Repack,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    matmul_repacked_cached(isa, x, t, k, w, out, pool, None)
}

/// [`matmul_repacked`] with the activation cache of [`matmul_cached`].
#[allow(
    clippy::too_many_arguments,
    reason = "matmul_repacked's plus the cache"
)]
pub(crate) fn matmul_repacked_cached(
    isa: Isa,
    x: &[f32],
    t: usize,
    k: usize,
    w: &Repack,
    out: &mut [f32],
    pool: &ThreadPool,
    cache: Option<(&mut ActCache, u64)>,
) -> Result<(), KernelError> {
    let ck = isa.checked()?;
    if k != w.k() {
        return Err(KernelError::Length {
            what: "matmul k (repacked weights)",
            expected: w.k(),
            got: k,
        });
    }
    check_len("matmul x", mul(t, k, "matmul x")?, x.len())?;
    check_len("matmul out", mul(t, w.n(), "matmul out")?, out.len())?;
    if t == 0 || w.n() == 0 {
        return Ok(());
    }
    match w {
        Repack::Q(w) => crate::kernels::matmul::r8::matmul_r8(ck, w, x, t, k, out, pool, cache),
        Repack::K(w) => crate::kernels::matmul::rk::matmul_rk(ck, w, x, t, k, out, pool, cache),
        Repack::F8(w) => f8r::matmul_f8r(ck, w, x, t, k, out, pool),
        Repack::F8G(w) => f8g::matmul_f8g(ck, w, x, t, k, out, pool),
    }
    Ok(())
}

/// One token's gated FFN product `act(x @ gate^T) * (x @ up^T)` into `out` in the gate/up
/// dispatch (`matmul/glu.rs`; `act(src, dst)` on pieces of the gate row); `Ok(false)` with
/// nothing written where that path does not apply (several tokens, other re-lays), and the
/// caller runs the matmuls and the product apart.
#[allow(clippy::too_many_arguments, reason = "matmul's validated arguments")]
pub(crate) fn matmul_glu(
    isa: Isa,
    x: &[f32],
    t: usize,
    (gate, up): (&Repack, &Repack),
    act: &(dyn Fn(&[f32], &mut [f32]) + Sync),
    out: &mut [f32],
    pool: &ThreadPool,
    cache: Option<(&mut ActCache, u64)>,
) -> Result<bool, KernelError> {
    let ck = isa.checked()?;
    match (t, gate, up) {
        (1, Repack::Q(g), Repack::Q(u)) => {
            Ok(glu::matmul_glu_one(ck, (g, u), x, act, out, pool, cache))
        }
        _ => Ok(false),
    }
}

/// [`matmul_repacked_cached`] for several weights that read the same `x` (`outs[i]` is
/// `[t, ws[i].n()]`), in one pool dispatch when they are the same kind of re-lay with the same
/// kind and `k` (a layer's q/k/v or gate/up; otherwise one call each). Each output is
/// bit-identical to its own call's. The same shape checks.
#[allow(
    clippy::too_many_arguments,
    reason = "matmul_repacked's, several weights"
)]
pub(crate) fn matmul_repacked_fused(
    isa: Isa,
    x: &[f32],
    t: usize,
    k: usize,
    ws: &[&Repack],
    outs: &mut [&mut [f32]],
    pool: &ThreadPool,
    mut cache: Option<(&mut ActCache, u64)>,
) -> Result<(), KernelError> {
    let ck = isa.checked()?;
    if ws.len() != outs.len() || ws.is_empty() || ws.len() > groups::MAX_SEGMENTS {
        return Err(KernelError::InvalidArgument {
            what: "fused matmul",
            detail: format!("{} weights, {} outputs", ws.len(), outs.len()),
        });
    }
    for (w, out) in ws.iter().zip(outs.iter()) {
        if k != w.k() {
            return Err(KernelError::Length {
                what: "matmul k (repacked weights)",
                expected: w.k(),
                got: k,
            });
        }
        check_len("matmul out", mul(t, w.n(), "matmul out")?, out.len())?;
    }
    check_len("matmul x", mul(t, k, "matmul x")?, x.len())?;
    if t == 0 {
        return Ok(());
    }
    // One dispatch needs one kernel: every weight the same re-lay, kind and block count.
    let m = ws.len();
    match ws[0] {
        Repack::Q(first) => {
            let mut q = [first; groups::MAX_SEGMENTS];
            for (slot, w) in q.iter_mut().zip(ws) {
                if let Repack::Q(r) = w {
                    *slot = r;
                }
            }
            if ws
                .iter()
                .all(|w| matches!(w, Repack::Q(r) if r.kind == first.kind))
            {
                r8::matmul_r8_fused(ck, &q[..m], x, t, k, outs, pool, cache);
                return Ok(());
            }
        }
        Repack::K(first) => {
            let mut kq = [first; groups::MAX_SEGMENTS];
            for (slot, w) in kq.iter_mut().zip(ws) {
                if let Repack::K(r) = w {
                    *slot = r;
                }
            }
            if ws
                .iter()
                .all(|w| matches!(w, Repack::K(r) if r.kind == first.kind))
            {
                rk::matmul_rk_fused(ck, &kq[..m], x, t, k, outs, pool, cache);
                return Ok(());
            }
        }
        Repack::F8G(first) => {
            let mut f = [first; groups::MAX_SEGMENTS];
            for (slot, w) in f.iter_mut().zip(ws) {
                if let Repack::F8G(r) = w {
                    *slot = r;
                }
            }
            if ws.iter().all(|w| matches!(w, Repack::F8G(_))) {
                f8g::matmul_f8g_fused(ck, &f[..m], x, t, k, outs, pool);
                return Ok(());
            }
        }
        // The per-block FP8 layout reads no quantized activations: one call each costs
        // nothing shared but the dispatch.
        Repack::F8(_) => {}
    }
    for (w, out) in ws.iter().zip(outs.iter_mut()) {
        let c = cache.as_mut().map(|(c, key)| (&mut **c, *key));
        matmul_repacked_cached(isa, x, t, k, w, out, pool, c)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

#[cfg(test)]
#[path = "invariance_tests.rs"]
mod invariance_tests;

#[cfg(test)]
#[path = "fused_tests.rs"]
mod fused_tests;
