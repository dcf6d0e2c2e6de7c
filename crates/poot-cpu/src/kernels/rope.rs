//! Rotary position embeddings, in place on `[t, n_heads, head_dim]`.
//!
//! Styles: [`RopeStyle::Interleaved`] rotates pairs `(2i, 2i + 1)` (GPT-J, ggml's "normal"
//! mode, llama2.c); [`RopeStyle::NeoX`] rotates pairs `(i, i + rot_dim / 2)` (HF `rotate_half`,
//! ggml's NEOX mode). Only the first `rot_dim` values of each head rotate (partial rotary); the
//! rest are left untouched.
//!
//! Numerics (the choice, and why): everything is `f32`, in the order of HF transformers'
//! `_compute_default_rope_parameters` and llama2.c's `run.c`:
//! `inv_freq[i] = 1 / theta^((2i) / rot_dim)` (`powf` of `f32`s), then the scaling rule, then
//! `angle = (pos as f32) * inv_freq[i]`, `cos`/`sin` of that `f32` (libm `cosf`/`sinf`), and
//! `x0' = x0 * cos - x1 * sin`, `x1' = x0 * sin + x1 * cos` (unfused). With the same libm this
//! is bit-identical to run.c (the stories260K reference). ggml instead builds `theta^(-2i/d)`
//! by repeated multiplication, and torch uses its own vectorized `pow`/`cos`; both differ from
//! this by rounding only. Note that an `f32` angle at position `p` carries an absolute error of
//! up to `ulp(p)`; every engine shares that, so the tests charge it to the reference too.
//!
//! [`RopeTable::with_numerics`] with [`Numerics::Ggml`] follows ggml instead (llama.cpp's CPU
//! `rope_f32`, AVX2 build with gcc): `theta_scale = powf(theta, -2 / rot_dim)`, per position
//! `t_0 = pos`, `t_{i+1} = t_i * theta_scale` (rounded each step), `cos`/`sin` of
//! `freq_scale * t_i`, and the rotation fused as gcc emits it: `x0' = fma(x0, cos, -(x1 * sin))`,
//! `x1' = fma(x0, sin, x1 * cos)` (checked bit for bit against llama.cpp on SmolLM2's
//! interleaved heads). Llama 3 scaling has no such form (ggml reads per-frequency factors from
//! the checkpoint) and keeps the recipe above.
//!
//! Scaling: `Linear` divides `inv_freq` by the factor (HF "linear"; ggml `freq_scale = 1 /
//! factor`). `Llama3` follows HF `_compute_llama3_parameters` step by step in `f32`.
//! `Factors` divides `inv_freq[i]` by `factors[i]` (HF LongRoPE's `ext_factors`, ggml's
//! `freq_factors`) and multiplies each cos and sin by `attn_factor` (HF's `attention_scaling`,
//! ggml's `mscale`); it takes the f32 recipe under both numerics.
//!
//! Cost: building a [`RopeTable`] is O(rot_dim); [`rope`] is O(t * rot_dim) `sin`/`cos` plus
//! O(t * n_heads * rot_dim) multiply-adds, with one `rot_dim`-sized scratch per call;
//! [`rope_angles`] once per step and [`rope_with_angles`] per op split the two parts.

use crate::error::{check_len, mul};
use crate::kernels::ggml::Numerics;
use crate::KernelError;

// The pairing and scaling types are the graph IR's own (`RopeStyle::Interleaved` pairs
// `(2i, 2i + 1)` as GPT-J, ggml mode 0 and llama2.c do; `NeoX` pairs `(i, i + rot_dim / 2)` as
// HF `rotate_half` and ggml mode 2 do), so a traced rope op reaches the kernel unconverted.
pub use poot_graph::{RopeScaling, RopeStyle};

/// What a model's config says about its rotary embedding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    pub style: RopeStyle,
    pub head_dim: usize,
    /// Rotated values per head (even, at most `head_dim`); `head_dim` unless partial.
    pub rot_dim: usize,
    /// The frequency base (`rope_theta`, ggml `freq_base`).
    pub theta: f32,
    pub scaling: RopeScaling,
}

/// Precomputed inverse frequencies for one [`RopeConfig`]; build once per model.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeTable {
    style: RopeStyle,
    head_dim: usize,
    inv_freq: Vec<f32>,
    /// ggml's recipe: `(theta_scale, freq_scale)`.
    ggml: Option<(f32, f32)>,
    /// Multiplies every cos and sin (`RopeScaling::Factors::attn_factor`); 1 for none.
    mscale: f32,
}

fn invalid(what: &'static str, detail: String) -> KernelError {
    KernelError::InvalidArgument { what, detail }
}

impl RopeTable {
    /// [`RopeTable::new`], or ggml's recipe under [`Numerics::Ggml`] (see the module docs).
    pub fn with_numerics(cfg: &RopeConfig, numerics: Numerics) -> Result<Self, KernelError> {
        let mut table = Self::new(cfg)?;
        let freq_scale = match cfg.scaling {
            RopeScaling::None => Some(1.0),
            RopeScaling::Linear { factor } => Some(1.0 / factor),
            RopeScaling::Llama3 { .. } | RopeScaling::Factors { .. } => None,
        };
        if numerics == Numerics::Ggml && cfg.rot_dim > 0 {
            let theta_scale = cfg.theta.powf(-2.0 / cfg.rot_dim as f32);
            table.ggml = freq_scale.map(|f| (theta_scale, f));
        }
        Ok(table)
    }

    /// Validates `cfg` and computes `inv_freq` (see the module docs for the exact recipe).
    pub fn new(cfg: &RopeConfig) -> Result<Self, KernelError> {
        if !cfg.rot_dim.is_multiple_of(2) || cfg.rot_dim > cfg.head_dim {
            return Err(invalid(
                "rope rot_dim",
                format!(
                    "{} must be even and at most head_dim {}",
                    cfg.rot_dim, cfg.head_dim
                ),
            ));
        }
        if !(cfg.theta.is_finite() && cfg.theta > 0.0) {
            return Err(invalid(
                "rope theta",
                format!("{} is not positive", cfg.theta),
            ));
        }
        let half = cfg.rot_dim / 2;
        let dim = cfg.rot_dim as f32;
        let mut inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / cfg.theta.powf((2 * i) as f32 / dim))
            .collect();
        let mut mscale = 1.0f32;
        match cfg.scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => {
                check_factor("rope linear factor", factor)?;
                inv_freq.iter_mut().for_each(|f| *f /= factor);
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position,
            } => {
                check_factor("rope llama3 factor", factor)?;
                check_factor("rope llama3 low_freq_factor", low_freq_factor)?;
                check_factor("rope llama3 high_freq_factor", high_freq_factor)?;
                if high_freq_factor <= low_freq_factor || original_max_position == 0 {
                    return Err(invalid(
                        "rope llama3",
                        format!(
                            "need high_freq_factor {high_freq_factor} > low_freq_factor \
                             {low_freq_factor} and original_max_position > 0"
                        ),
                    ));
                }
                let old_ctx = original_max_position as f32;
                let low_wavelen = old_ctx / low_freq_factor;
                let high_wavelen = old_ctx / high_freq_factor;
                for f in &mut inv_freq {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    // HF: low frequencies (long wavelengths) are divided by `factor` ...
                    let scaled = if wavelen > low_wavelen {
                        *f / factor
                    } else {
                        *f
                    };
                    // ... and the medium band is interpolated between the two. (HF writes
                    // `~(w < high) * ~(w > low)`; the same for the non-NaN wavelengths here.)
                    let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                    *f = if medium {
                        let smooth = (old_ctx / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    };
                }
            }
            RopeScaling::Factors {
                factors,
                attn_factor,
            } => {
                if half > factors.len() {
                    return Err(invalid(
                        "rope factors",
                        format!("{half} pairs, at most {} factors", factors.len()),
                    ));
                }
                check_factor("rope attn_factor", attn_factor)?;
                for (f, &d) in inv_freq.iter_mut().zip(&factors) {
                    check_factor("rope frequency factor", d)?;
                    *f /= d;
                }
                mscale = attn_factor;
            }
        }
        Ok(RopeTable {
            style: cfg.style,
            head_dim: cfg.head_dim,
            inv_freq,
            ggml: None,
            mscale,
        })
    }

    /// `inv_freq[i]` for rotation pair `i` (`rot_dim / 2` values).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    pub fn style(&self) -> RopeStyle {
        self.style
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Rotated values per head.
    pub fn rot_dim(&self) -> usize {
        2 * self.inv_freq.len()
    }
}

fn check_factor(what: &'static str, f: f32) -> Result<(), KernelError> {
    if f.is_finite() && f > 0.0 {
        Ok(())
    } else {
        Err(invalid(
            what,
            format!("{f} is not a positive finite number"),
        ))
    }
}

/// Rotates `x` (`[t, n_heads, table.head_dim()]`) in place; token `i` is at `positions[i]`.
///
/// Checks lengths and that positions are non-negative before touching `x`.
pub fn rope(
    x: &mut [f32],
    t: usize,
    n_heads: usize,
    positions: &[i32],
    table: &RopeTable,
) -> Result<(), KernelError> {
    check(x, t, n_heads, positions, table)?;
    let half = table.inv_freq.len();
    if half == 0 || n_heads * table.head_dim == 0 {
        return Ok(());
    }
    // At most 256 pairs on the stack (head_dim 512); wider heads take the heap.
    let mut stack = [(0.0f32, 0.0f32); 256];
    let mut heap = Vec::new();
    let cs: &mut [(f32, f32)] = if half <= stack.len() {
        &mut stack[..half]
    } else {
        heap.resize(half, (0.0, 0.0));
        &mut heap
    };
    for (&pos, xt) in positions
        .iter()
        .zip(x.chunks_exact_mut(n_heads * table.head_dim))
    {
        angles(pos, table, cs);
        rotate_token(xt, table, cs);
    }
    Ok(())
}

/// `(cos, sin)` of every rotation pair at every position of `positions`, `rot_dim / 2` pairs
/// per position, into `cs` (cleared first): what [`rope_with_angles`] takes. A step's layers
/// share their positions and table, so the runtime computes these once per step instead of
/// once per rope op (the `cosf`/`sinf` calls were most of rope's time).
pub fn rope_angles(
    positions: &[i32],
    table: &RopeTable,
    cs: &mut Vec<(f32, f32)>,
) -> Result<(), KernelError> {
    check_positions(positions)?;
    let half = table.inv_freq.len();
    cs.clear();
    cs.resize(positions.len() * half, (0.0, 0.0));
    if half > 0 {
        for (&pos, c) in positions.iter().zip(cs.chunks_exact_mut(half)) {
            angles(pos, table, c);
        }
    }
    Ok(())
}

/// [`rope`] with the angles from [`rope_angles`] of the same `positions` and `table`: the same
/// bits. Checks lengths (and the angles' count) before touching `x`.
pub fn rope_with_angles(
    x: &mut [f32],
    t: usize,
    n_heads: usize,
    positions: &[i32],
    table: &RopeTable,
    cs: &[(f32, f32)],
) -> Result<(), KernelError> {
    check(x, t, n_heads, positions, table)?;
    let half = table.inv_freq.len();
    check_len("rope angles", mul(t, half, "rope angles")?, cs.len())?;
    if half == 0 || n_heads * table.head_dim == 0 {
        return Ok(());
    }
    let rows = x.chunks_exact_mut(n_heads * table.head_dim);
    for (xt, c) in rows.zip(cs.chunks_exact(half)) {
        rotate_token(xt, table, c);
    }
    Ok(())
}

fn check(
    x: &[f32],
    t: usize,
    n_heads: usize,
    positions: &[i32],
    table: &RopeTable,
) -> Result<(), KernelError> {
    let row = mul(n_heads, table.head_dim, "rope x")?;
    check_len("rope x", mul(t, row, "rope x")?, x.len())?;
    check_len("rope positions", t, positions.len())?;
    check_positions(positions)
}

fn check_positions(positions: &[i32]) -> Result<(), KernelError> {
    if let Some(at) = positions.iter().position(|&p| p < 0) {
        return Err(KernelError::IndexOutOfRange {
            what: "rope positions",
            at,
            value: i64::from(positions[at]),
            bound: i32::MAX as usize,
        });
    }
    Ok(())
}

/// `(cos, sin)` of each pair's angle at position `pos` (see the module docs for both recipes).
fn angles(pos: i32, table: &RopeTable, cs: &mut [(f32, f32)]) {
    let p = pos as f32;
    if let Some((theta_scale, freq_scale)) = table.ggml {
        let mut theta = p;
        for c in cs.iter_mut() {
            let angle = freq_scale * theta;
            *c = (angle.cos(), angle.sin());
            theta *= theta_scale;
        }
    } else {
        for (c, &f) in cs.iter_mut().zip(&table.inv_freq) {
            let angle = p * f;
            *c = (angle.cos(), angle.sin());
        }
        if table.mscale != 1.0 {
            let m = table.mscale;
            cs.iter_mut().for_each(|c| *c = (c.0 * m, c.1 * m));
        }
    }
}

/// Rotates every head of one token (`xt`, `n_heads * head_dim` values) by the pairs `cs`.
fn rotate_token(xt: &mut [f32], table: &RopeTable, cs: &[(f32, f32)]) {
    if table.ggml.is_none() {
        return rotate_pairs(xt, table, cs, rotate_plain);
    }
    #[cfg(target_arch = "x86_64")]
    if crate::CpuFeatures::get().fma {
        // SAFETY: FMA was just detected.
        return unsafe { rotate_token_fma(xt, table, cs) };
    }
    rotate_pairs(xt, table, cs, rotate_ggml);
}

/// [`rotate_token`]'s ggml recipe compiled with FMA: `mul_add` is then one instruction instead
/// of a call to libm's `fmaf` per product (the same bits either way; the calls had made rope
/// about 1% of a prefill).
///
/// # Safety
/// The caller detected FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn rotate_token_fma(xt: &mut [f32], table: &RopeTable, cs: &[(f32, f32)]) {
    rotate_pairs(xt, table, cs, rotate_ggml);
}

/// Every head of `xt` rotated by the pairs `cs` through `rotate`, in the table's style.
#[inline(always)]
fn rotate_pairs(
    xt: &mut [f32],
    table: &RopeTable,
    cs: &[(f32, f32)],
    rotate: impl Fn(f32, f32, (f32, f32)) -> (f32, f32),
) {
    let half = cs.len();
    for head in xt.chunks_exact_mut(table.head_dim) {
        match table.style {
            RopeStyle::Interleaved => {
                for (pair, &cs) in head.chunks_exact_mut(2).zip(cs.iter()) {
                    (pair[0], pair[1]) = rotate(pair[0], pair[1], cs);
                }
            }
            RopeStyle::NeoX => {
                let (lo, hi) = head[..2 * half].split_at_mut(half);
                for ((a, b), &cs) in lo.iter_mut().zip(hi).zip(cs.iter()) {
                    (*a, *b) = rotate(*a, *b, cs);
                }
            }
        }
    }
}

/// `(x0 cos - x1 sin, x0 sin + x1 cos)`, every product rounded.
#[inline(always)]
fn rotate_plain(x0: f32, x1: f32, (cos, sin): (f32, f32)) -> (f32, f32) {
    (x0 * cos - x1 * sin, x0 * sin + x1 * cos)
}

/// The same, fused as gcc compiles ggml's `rotate_pairs` (see the module docs).
#[inline(always)]
fn rotate_ggml(x0: f32, x1: f32, (cos, sin): (f32, f32)) -> (f32, f32) {
    (x0.mul_add(cos, -(x1 * sin)), x0.mul_add(sin, x1 * cos))
}

#[cfg(test)]
#[path = "rope_tests.rs"]
mod tests;
