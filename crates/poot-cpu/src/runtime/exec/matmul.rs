//! Matmul equations: one weight, or a fused group (`CpuPlan::fuse_matmuls`) at its first
//! member, through the re-laid copy, or the path compiling chose for the weight.

use poot_graph::{Op, ValueId};
use poot_runtime::RuntimeError;

use super::{kerr, Buf, Exec};
use crate::kernels;
use crate::kernels::simd::Isa;
use crate::kernels::Numerics;

impl Exec<'_> {
    /// Equation `i`: `x @ W^T` into a fresh buffer of `numel` floats.
    pub(super) fn matmul(
        &mut self,
        i: usize,
        x: ValueId,
        w: ValueId,
        numel: usize,
    ) -> Result<Buf, RuntimeError> {
        let xs = self.shape(x);
        // A 1-D weight is one row.
        let n = self.graph().info(w).matrix().0;
        let plan = self.plan;
        let repacked = plan.repack(w.index());
        // The re-laid kernels write every output; the stored paths keep a zeroed buffer.
        let mut out = if repacked.is_some() {
            self.arena.overwritten(numel)
        } else {
            self.arena.zeros(numel)
        };
        self.f32(x, "matmul")?; // a typed error unless x is an f32 activation
        let Buf::F32(xv) = &self.bufs[x.index()] else {
            unreachable!("checked just above")
        };
        // Matmuls reading the same input (q/k/v, gate/up) quantize it once.
        let key = (self.arena.run << 32) | x.index() as u64;
        if let Some(members) = self.plan.fused.get(&i) {
            if self.plan.glu.get(i).is_some_and(Option::is_some) {
                return self.gated_product(i, members, out, key);
            }
            return self.fused_matmul(members, out, key);
        }
        if let Some(rp) = repacked {
            kernels::matmul::matmul_repacked_cached(
                Isa::detect(),
                xv,
                xs[0],
                xs[1],
                rp,
                &mut out,
                self.pool,
                Some((&mut self.arena.act, key)),
            )
            .map_err(kerr("matmul"))?;
            return Ok(Buf::F32(out));
        }
        // Read only here: a re-laid weight's stored bytes may be released (`WeightStore::release`).
        let (bytes, dtype) = self.weight(w, "matmul")?;
        // The path compiling chose for this weight (a plan built by hand has none).
        let path = self
            .plan
            .matmul_path(w.index())
            .unwrap_or_else(|| kernels::matmul::MatmulPath::choose(self.plan.numerics, dtype));
        kernels::matmul::matmul_on_path(
            path,
            self.plan.numerics,
            Isa::detect(),
            xv,
            xs[0],
            xs[1],
            bytes,
            dtype,
            n,
            &mut out,
            self.pool,
            Some((&mut self.arena.act, key)),
        )
        .map_err(kerr("matmul"))?;
        Ok(Buf::F32(out))
    }

    /// A fused gate/up pair that makes its gated product (`CpuPlan::glu`): into the multiply's
    /// slot, for one token in the matmuls' dispatch (`kernels::matmul::matmul_glu`); otherwise
    /// the pair and then the activation's own run (`activation`, which makes the product), so
    /// the bits are the same either way. Returns the first member's output (or nothing, when
    /// the product was made in the dispatch).
    fn gated_product(
        &mut self,
        i: usize,
        members: &[usize],
        out: Vec<f32>,
        key: u64,
    ) -> Result<Buf, RuntimeError> {
        let plan = self.plan;
        let g = plan.glu[i].expect("matmul() checked that equation i makes a gated product");
        let graph = self.graph();
        let operands = |j: usize| match &graph.equations[j] {
            Op::MatMul { x, w } => (*x, plan.repack(w.index())),
            _ => unreachable!("fuse_glu pairs matmuls"),
        };
        let (gate, up) = if g.gate_first {
            (members[0], members[1])
        } else {
            (members[1], members[0])
        };
        let ((x, Some(wg)), (_, Some(wu))) = (operands(gate), operands(up)) else {
            unreachable!("fuse_glu pairs re-laid weights")
        };
        let xs = self.shape(x);
        let Buf::F32(xv) = &self.bufs[x.index()] else {
            return Err(RuntimeError::Kernel {
                op: "matmul",
                detail: format!("value {} is not an f32 activation", x.0),
            });
        };
        let ggml = plan.numerics == Numerics::Ggml;
        let act = move |src: &[f32], dst: &mut [f32]| {
            super::rows::act_rows(g.silu, ggml, src, src.len(), dst)
                .expect("pieces of a row are non-empty and sized alike");
        };
        let mut product = out;
        let made = kernels::matmul::matmul_glu(
            Isa::detect(),
            xv,
            xs[0],
            (wg, wu),
            &act,
            &mut product,
            self.pool,
            Some((&mut self.arena.act, key)),
        )
        .map_err(kerr("matmul"))?;
        if made {
            self.bufs[g.mul] = Buf::F32(product);
            return Ok(Buf::Empty);
        }
        let first = self.fused_matmul(members, product, key)?;
        self.bufs[members[0]] = first;
        let act_op = &graph.equations[g.act];
        let (Op::Silu { x: a } | Op::Gelu { x: a }) = act_op else {
            unreachable!("fuse_glu names an activation")
        };
        let shape = &graph.info(*a).shape;
        self.bufs[g.mul] = self.activation(g.act, act_op, *a, shape)?;
        Ok(std::mem::replace(&mut self.bufs[members[0]], Buf::Empty))
    }

    /// Runs the fused matmul group `members` (see `CpuPlan::fuse_matmuls`): the first one's
    /// output is returned (in `first`, already sized), the others are stored in their slots.
    fn fused_matmul(
        &mut self,
        members: &[usize],
        first: Vec<f32>,
        key: u64,
    ) -> Result<Buf, RuntimeError> {
        use crate::kernels::matmul::groups::MAX_SEGMENTS;
        let graph = self.graph();
        let mut outs: [Vec<f32>; MAX_SEGMENTS] = Default::default();
        let mut ws: [Option<&crate::kernels::matmul::repack::Repack>; MAX_SEGMENTS] =
            [None; MAX_SEGMENTS];
        let mut x = None;
        outs[0] = first;
        for (m, &j) in members.iter().enumerate() {
            let Op::MatMul { x: xj, w } = &graph.equations[j] else {
                unreachable!("fuse_matmuls groups matmuls only")
            };
            x = Some(*xj);
            ws[m] = self.plan.repack(w.index());
            if m > 0 {
                outs[m] = self.arena.overwritten(graph.values[j].numel());
            }
        }
        let (Some(x), Some(w0)) = (x, ws[0]) else {
            unreachable!("a fused group has a first member with a re-laid weight")
        };
        let ws = ws.map(|w| w.unwrap_or(w0));
        let xs = self.shape(x);
        let Buf::F32(xv) = &self.bufs[x.index()] else {
            return Err(RuntimeError::Kernel {
                op: "matmul",
                detail: format!("value {} is not an f32 activation", x.0),
            });
        };
        let m = members.len();
        {
            let [a, b, c, d] = &mut outs;
            let mut slices: [&mut [f32]; MAX_SEGMENTS] = [a, b, c, d];
            kernels::matmul::matmul_repacked_fused(
                Isa::detect(),
                xv,
                xs[0],
                xs[1],
                &ws[..m],
                &mut slices[..m],
                self.pool,
                Some((&mut self.arena.act, key)),
            )
            .map_err(kerr("matmul"))?;
        }
        let mut outs = outs.into_iter();
        let first = outs.next().unwrap_or_default();
        for (&j, out) in members[1..].iter().zip(outs) {
            self.bufs[j] = Buf::F32(out);
        }
        Ok(Buf::F32(first))
    }
}
