//! Row-wise ops (rms_norm, SiLU/GELU, RoPE) over the pool when a call holds many rows.
//!
//! Why: a prefill's norms, activations and rotations ran on one thread while the other waited
//! (a tenth of a 512-token SmolLM2 prefill). Rows are independent in each of these kernels, so
//! splitting the output into row chunks gives the same bits as one call, for any chunking;
//! one-row calls (decode) and small ones stay inline, where a pool dispatch costs more than it
//! saves.
//!
//! Errors: every chunk runs the kernel's own checks; the first error is returned and the
//! output buffer (fresh for this op) is dropped by the caller.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Mutex;

use poot_graph::{Op, ValueId};
use poot_runtime::RuntimeError;

use super::{kerr, Buf, Exec};
use crate::kernels::{self, Numerics};
use crate::{DType, KernelError, ThreadPool};

/// Values below which a row-wise op runs inline.
const PAR_MIN: usize = 16 * 1024;

/// `f(rows, chunk)` over chunks of whole rows of `out` (`rows * d` values), on the pool when
/// the call is big enough; the first error wins.
fn par_rows<F>(pool: &ThreadPool, out: &mut [f32], d: usize, f: F) -> Result<(), KernelError>
where
    F: Fn(Range<usize>, &mut [f32]) -> Result<(), KernelError> + Sync,
{
    let rows = out.len().checked_div(d).unwrap_or(0);
    if rows < 2 || out.len() < PAR_MIN || pool.n_threads() == 1 || out.len() != rows * d {
        return f(0..rows, out);
    }
    let (per, _) = pool.split(rows);
    let first = Mutex::new(None);
    pool.for_each_chunk_mut(
        out,
        per * d,
        || (),
        |_, i, o| {
            let r0 = i * per;
            if let Err(e) = f(r0..r0 + o.len() / d, o) {
                first
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
            }
        },
    );
    match first.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// SiLU (ggml's rows of `d` under ggml numerics) or GELU (tanh) of `x` into `o`: the one
/// definition the activation's run and the gated product (`Exec::gated_product`) share.
pub(super) fn act_rows(
    silu: bool,
    ggml: bool,
    x: &[f32],
    d: usize,
    o: &mut [f32],
) -> Result<(), KernelError> {
    match (silu, ggml) {
        (true, true) => kernels::ggml::silu_rows_to(x, d, o),
        (true, false) => kernels::silu_to(x, o),
        (false, _) => kernels::gelu_tanh_to(x, o),
    }
}

impl Exec<'_> {
    pub(super) fn rms_norm(
        &mut self,
        x: ValueId,
        weight: ValueId,
        eps: f32,
        shape: &[usize],
    ) -> Result<Buf, RuntimeError> {
        let d = *shape.last().unwrap_or(&1);
        let numel: usize = shape.iter().product();
        let mut out = self.arena.overwritten(numel);
        let xs = self.f32(x, "rms_norm")?;
        let (wbytes, wdtype): (Cow<'_, [u8]>, DType) = match self.bufs[weight.index()] {
            Buf::Weight => {
                let (b, dt) = self.weight(weight, "rms_norm")?;
                (Cow::Borrowed(b), dt)
            }
            _ => {
                let w = self.f32(weight, "rms_norm")?;
                (
                    Cow::Owned(w.iter().flat_map(|f| f.to_le_bytes()).collect()),
                    DType::F32,
                )
            }
        };
        if xs.len() != numel || d == 0 {
            // The kernel's own length error.
            kernels::rms_norm(xs, numel / d.max(1), d, &wbytes, wdtype, eps, &mut out)
                .map_err(kerr("rms_norm"))?;
            return Ok(Buf::F32(out));
        }
        par_rows(self.pool, &mut out, d, |r, o| {
            let xr = &xs[r.start * d..r.end * d];
            kernels::rms_norm(xr, r.len(), d, &wbytes, wdtype, eps, o)
        })
        .map_err(kerr("rms_norm"))?;
        Ok(Buf::F32(out))
    }

    /// `Add` and `Mul`: `b` of `a`'s shape or one row of it; rows split over the pool when
    /// big (elementwise, so the same bits on any split), any other shape left to the kernel's
    /// checks.
    pub(super) fn binary(
        &mut self,
        op: &Op,
        a: ValueId,
        b: ValueId,
        shape: &[usize],
    ) -> Result<Buf, RuntimeError> {
        let name = op.name();
        let d = *shape.last().unwrap_or(&1);
        let numel: usize = shape.iter().product();
        let mut out = self.arena.overwritten(numel);
        let bv = self.floats(b, name)?;
        let av = self.f32(a, name)?;
        let add = matches!(op, Op::Add { .. });
        let run = |a: &[f32], b: &[f32], o: &mut [f32]| {
            if add {
                kernels::add(a, b, o)
            } else {
                kernels::mul(a, b, o)
            }
        };
        let (same, row) = (bv.len() == av.len(), bv.len() == d);
        if av.len() == numel && d > 0 && (same || row) {
            par_rows(self.pool, &mut out, d, |r, o| {
                let ar = &av[r.start * d..r.end * d];
                run(
                    ar,
                    if same {
                        &bv[r.start * d..r.end * d]
                    } else {
                        &bv
                    },
                    o,
                )
            })
        } else {
            run(av, &bv, &mut out)
        }
        .map_err(kerr(name))?;
        Ok(Buf::F32(out))
    }

    /// Equation `i`, SiLU or GELU of `x`; where the plan fused the multiply that reads it
    /// (`CpuPlan::act_mul`), each row is then multiplied by the other factor's in place, and
    /// the buffer is that multiply's output.
    pub(super) fn activation(
        &mut self,
        i: usize,
        op: &Op,
        x: ValueId,
        shape: &[usize],
    ) -> Result<Buf, RuntimeError> {
        let d = *shape.last().unwrap_or(&1);
        let numel: usize = shape.iter().product();
        let mut out = self.arena.overwritten(numel);
        let xv = self.f32(x, op.name())?;
        let silu = matches!(op, Op::Silu { .. });
        let ggml = self.plan.numerics == Numerics::Ggml;
        crate::error::check_len("activation x", numel, xv.len()).map_err(kerr(op.name()))?;
        let factor = match self.plan.act_mul.get(i).copied().flatten() {
            Some(m) => {
                let f = self.f32(m.other, "mul")?;
                crate::error::check_len("mul factor", numel, f.len()).map_err(kerr("mul"))?;
                Some(f)
            }
            None => None,
        };
        par_rows(self.pool, &mut out, d, |r, o| {
            act_rows(silu, ggml, &xv[r.start * d..r.end * d], d, o)?;
            if let Some(f) = factor {
                let fr = &f[r.start * d..r.end * d];
                o.iter_mut().zip(fr).for_each(|(y, &v)| *y *= v);
            }
            Ok(())
        })
        .map_err(kerr(op.name()))?;
        Ok(Buf::F32(out))
    }

    pub(super) fn rope(
        &mut self,
        i: usize,
        x: ValueId,
        positions: ValueId,
        n_heads: usize,
        shape: &[usize],
    ) -> Result<Buf, RuntimeError> {
        let at = *self.plan.rope.get(&i).ok_or_else(|| RuntimeError::Kernel {
            op: "rope",
            detail: "no rope table was compiled".into(),
        })?;
        let plan = self.plan;
        let table = &plan.rope_tables[at];
        let numel: usize = shape.iter().product();
        let mut out = self.arena.f32s(numel);
        out.extend_from_slice(self.f32(x, "rope")?);
        self.i32(positions, "rope")?; // a typed error unless positions are i32
        let Buf::I32(pos) = &self.bufs[positions.index()] else {
            unreachable!("checked just above")
        };
        // Every layer's rope reads the same positions under the same table: their angles are
        // computed once per run.
        let key = (self.arena.run, positions.index(), at);
        if self.arena.rope_key != Some(key) {
            self.arena.rope_key = None;
            kernels::rope_angles(pos, table, &mut self.arena.rope_angles).map_err(kerr("rope"))?;
            self.arena.rope_key = Some(key);
        }
        let angles = &self.arena.rope_angles;
        let (t, half) = (shape[0], table.rot_dim() / 2);
        if pos.len() != t || angles.len() != t * half || t == 0 || !out.len().is_multiple_of(t) {
            // The kernel's own length errors.
            kernels::rope_with_angles(&mut out, t, n_heads, pos, table, angles)
                .map_err(kerr("rope"))?;
            return Ok(Buf::F32(out));
        }
        let row = out.len() / t;
        par_rows(self.pool, &mut out, row, |r, o| {
            let a = &angles[r.start * half..r.end * half];
            kernels::rope_with_angles(o, r.len(), n_heads, &pos[r], table, a)
        })
        .map_err(kerr("rope"))?;
        Ok(Buf::F32(out))
    }
}
