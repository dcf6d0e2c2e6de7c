//! Casts of stored float weights: `Tracer::cast`, and the cast the tracer records at each read
//! of a half-precision weight (`Tracer::read_stored`).
//!
//! Invariant: every op that reads a stored F16 or BF16 weight reads it through an `Op::Cast`
//! to F32 recorded just before it (one per read, so a weight read at both ends of a graph, a
//! tied embedding and head, has its cast beside each reader). F32 and packed weights are read
//! as they are.

use poot_core::DType;

use super::{is_float, shape_err, Tracer};
use crate::error::TraceError;
use crate::ir::{Op, ValueId, ValueInfo};
use crate::limits::Resource;

impl Tracer {
    /// The stored float weight `x` read as `to` (only F32: activations are f32).
    pub fn cast(&mut self, x: ValueId, to: DType) -> Result<ValueId, TraceError> {
        let info = self.info(x)?.clone();
        if !matches!(self.graph.op(x), Op::Weight { .. }) || !is_float(info.dtype) {
            return Err(shape_err(
                "cast",
                format!(
                    "x must be a stored F32, F16 or BF16 weight, got {} {}",
                    self.graph.op(x).name(),
                    info.dtype
                ),
            ));
        }
        if to != DType::F32 {
            return Err(shape_err("cast", format!("casts go to F32, not {to}")));
        }
        self.push(Op::Cast { x, to }, ValueInfo::new(to, info.shape), 0, 0)
    }

    /// Each of `vs` as an op reads it: a stored F16/BF16 weight through a new cast to F32,
    /// anything else as it is. Room for the casts and the reading equation is checked first,
    /// so a refusal records none of them.
    pub(super) fn read_stored<const N: usize>(
        &mut self,
        vs: [ValueId; N],
    ) -> Result<[ValueId; N], TraceError> {
        let half = |t: &Self, v: ValueId| {
            matches!(t.graph.op(v), Op::Weight { .. })
                && matches!(t.graph.values[v.index()].dtype, DType::F16 | DType::BF16)
        };
        let casts = vs.iter().filter(|v| half(self, **v)).count();
        let (equations, values) = (self.usage.equations, self.usage.values);
        Self::check(
            Resource::Equations,
            self.limits.max_equations,
            equations + casts + 1,
        )?;
        Self::check(Resource::Values, self.limits.max_values, values + casts + 1)?;
        let mut out = vs;
        for v in out.iter_mut() {
            if half(self, *v) {
                *v = self.cast(*v, DType::F32)?;
            }
        }
        Ok(out)
    }

    /// [`Tracer::read_stored`] of an optional operand.
    pub(super) fn read_stored_opt(
        &mut self,
        v: Option<ValueId>,
    ) -> Result<Option<ValueId>, TraceError> {
        v.map(|v| self.read_stored([v]).map(|[v]| v)).transpose()
    }
}
