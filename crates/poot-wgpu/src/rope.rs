//! Rotary tables on the host: inverse frequencies at compile time and, per step, the cos/sin
//! of each token's angles, in the CPU runtime's exact f32 recipe (`inv_freq[i] = 1 /
//! theta^(2i / rot_dim)`, the scaling rule, `angle = pos as f32 * inv_freq[i]`, libm cos/sin),
//! so the device only rotates. LongRoPE's attention factor multiplies every cos and sin on the
//! host after they are computed, as the CPU runtime does (the same f32 product). Cost: O(rot_dim) per op at compile; O(t * rot_dim / 2) cos/sin
//! per rope op per step.

use poot_graph::{CompileError, RopeConfig, RopeScaling};
use poot_runtime::RuntimeError;

fn bad(detail: String) -> RuntimeError {
    CompileError::Invalid(detail).into()
}

fn check_factor(what: &str, f: f32) -> Result<(), RuntimeError> {
    if f.is_finite() && f > 0.0 {
        Ok(())
    } else {
        Err(bad(format!("{what} {f} is not a positive finite number")))
    }
}

/// A rope op's host table: its inverse frequencies and the factor on every cos and sin.
#[derive(Debug, Clone)]
pub(crate) struct RopeTable {
    inv_freq: Vec<f32>,
    /// LongRoPE's attention factor (`RopeScaling::Factors::attn_factor`); 1 for none.
    mscale: f32,
}

/// `rot_dim / 2` inverse frequencies of `cfg` and its cos/sin factor, as
/// `poot_cpu::RopeTable::new` computes them.
pub(crate) fn inv_freq(cfg: &RopeConfig) -> Result<RopeTable, RuntimeError> {
    if !(cfg.theta.is_finite() && cfg.theta > 0.0) {
        return Err(bad(format!("rope theta {} is not positive", cfg.theta)));
    }
    let half = cfg.rot_dim as usize / 2;
    let dim = cfg.rot_dim as f32;
    let mut f: Vec<f32> = (0..half)
        .map(|i| 1.0 / cfg.theta.powf((2 * i) as f32 / dim))
        .collect();
    let mut mscale = 1.0f32;
    match cfg.scaling {
        RopeScaling::None => {}
        RopeScaling::Factors {
            factors,
            attn_factor,
        } => {
            check_factor("rope attn_factor", attn_factor)?;
            mscale = attn_factor;
            if half > factors.len() {
                return Err(bad(format!(
                    "rope: {half} pairs, at most {} factors",
                    factors.len()
                )));
            }
            for (x, &d) in f.iter_mut().zip(&factors) {
                check_factor("rope frequency factor", d)?;
                *x /= d;
            }
        }
        RopeScaling::Linear { factor } => {
            check_factor("rope linear factor", factor)?;
            f.iter_mut().for_each(|x| *x /= factor);
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
                return Err(bad("rope llama3 factors are inconsistent".into()));
            }
            let old_ctx = original_max_position as f32;
            let low_wavelen = old_ctx / low_freq_factor;
            let high_wavelen = old_ctx / high_freq_factor;
            for x in &mut f {
                let wavelen = 2.0 * std::f32::consts::PI / *x;
                let scaled = if wavelen > low_wavelen {
                    *x / factor
                } else {
                    *x
                };
                let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                *x = if medium {
                    let smooth = (old_ctx / wavelen - low_freq_factor)
                        / (high_freq_factor - low_freq_factor);
                    (1.0 - smooth) * scaled / factor + smooth * scaled
                } else {
                    scaled
                };
            }
        }
    }
    Ok(RopeTable {
        inv_freq: f,
        mscale,
    })
}

/// Per token: `rot_dim / 2` cosines then `rot_dim / 2` sines. Negative positions are refused.
pub(crate) fn cos_sin(table: &RopeTable, positions: &[i32]) -> Result<Vec<f32>, RuntimeError> {
    let inv_freq = &table.inv_freq;
    let half = inv_freq.len();
    let mut out = Vec::with_capacity(positions.len() * half * 2);
    for &p in positions {
        if p < 0 {
            return Err(RuntimeError::Kernel {
                op: "rope",
                detail: format!("negative position {p}"),
            });
        }
        let start = out.len();
        out.resize(start + 2 * half, 0.0);
        for (i, &f) in inv_freq.iter().enumerate() {
            let angle = p as f32 * f;
            out[start + i] = angle.cos();
            out[start + half + i] = angle.sin();
        }
        if table.mscale != 1.0 {
            out[start..].iter_mut().for_each(|c| *c *= table.mscale);
        }
    }
    Ok(out)
}
