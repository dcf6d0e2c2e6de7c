//! Running a `WgpuPlan`: one command buffer per step, one compute pass per dispatch, one
//! bounded wait, one readback of the named outputs.
//!
//! Invariants: inputs must match the traced dtype and shape exactly, and index inputs (token
//! ids, gathered rows, sampling settings) are checked on the host before anything is
//! submitted, so a bad request never reaches the device and never poisons; activation buffers
//! are reused after their last reader (peak memory is the plan's activation peak); host uploads
//! get fresh buffers because `write_buffer` lands before the step's commands; an input bound
//! from a kept device tensor (`bind_device`) is never pooled, so the step only reads it; the
//! wait and the readback are bounded by the deadline (see `device::Gpu::wait`). Passes execute in recording
//! order and wgpu orders storage writes between passes, so a reused buffer is never read stale.

use std::collections::HashMap;
use std::sync::Arc;

use poot_core::DType;
use poot_graph::{BinaryKind, Op, UnaryKind, ValueId};
use poot_runtime::{HostTensor, LateInput, RuntimeError};

use crate::gpu::Buffer;
use crate::kernels::Kernel;
use crate::plan::WgpuPlan;
use crate::resident::DeviceTensor;
use crate::rope::cos_sin;
use crate::{KvPool, WgpuRuntime};

mod attention_sample;
mod copy;
mod matmul_q8;
mod moe;
mod recorded;
mod sampling;
mod scatter;
mod tensor;

pub(crate) use recorded::{
    tensor_bytes, Dispatch, HostRow, LateSlot, Output, Recorded, StepInputs,
};

fn kernel_err(op: &'static str, detail: String) -> RuntimeError {
    RuntimeError::Kernel { op, detail }
}

/// Workgroups of 64 lanes covering `lanes`, as (grid, lanes per grid row).
fn lane_grid(lanes: usize) -> ([u32; 3], u32) {
    let groups = lanes.div_ceil(64).max(1) as u64;
    let gx = groups.min(65535);
    let gy = groups.div_ceil(gx);
    ([gx as u32, gy as u32, 1], (gx * 64) as u32)
}

pub(crate) struct Exec<'a> {
    rt: &'a WgpuRuntime,
    plan: &'a WgpuPlan,
    inputs: &'a [(&'a str, HostTensor)],
    late_inputs: &'a [(&'a str, LateInput)],
    late: Vec<LateSlot>,
    kv: Option<&'a KvPool>,
    /// Inputs bound from kept device tensors, and the equations whose buffer is one of them
    /// (never returned to the pool).
    device: Vec<(String, DeviceTensor)>,
    pinned: Vec<usize>,
    /// The equation being recorded (`usize::MAX` outside one: the stall kernel), for the
    /// timer's per-equation spans.
    current: usize,
    bufs: Vec<Option<Arc<Buffer>>>,
    /// Reusable activation buffers by size.
    free: HashMap<u64, Vec<Arc<Buffer>>>,
    dispatches: Vec<Dispatch>,
    params: Vec<u8>,
    host_rows: Vec<HostRow>,
    /// Extra readbacks (logits of host-sampled rows): (buffer, bytes).
    extra_reads: Vec<(Arc<Buffer>, u64)>,
}

impl<'a> Exec<'a> {
    pub fn new(
        rt: &'a WgpuRuntime,
        plan: &'a WgpuPlan,
        inputs: &'a [(&'a str, HostTensor)],
        late_inputs: &'a [(&'a str, LateInput)],
        kv: Option<&'a KvPool>,
    ) -> Self {
        Self {
            rt,
            plan,
            inputs,
            late_inputs,
            late: Vec::new(),
            kv,
            device: Vec::new(),
            pinned: Vec::new(),
            current: usize::MAX,
            bufs: vec![None; plan.graph.equations.len()],
            free: HashMap::new(),
            dispatches: Vec::new(),
            params: Vec::new(),
            host_rows: Vec::new(),
            extra_reads: Vec::new(),
        }
    }

    /// Inputs to bind from kept device tensors instead of host data (see `resident`).
    pub fn bind_device(&mut self, device: &[(&str, DeviceTensor)]) {
        self.device = device
            .iter()
            .map(|(n, t)| ((*n).to_owned(), t.clone()))
            .collect();
    }

    /// Fault injection: the stall kernel (see `stall.wgsl`), before the step's own work.
    pub fn stall(&mut self, iters: u32) -> Result<(), RuntimeError> {
        let sink = self.alloc(64)?;
        self.dispatch(
            Kernel::Stall,
            DType::F32,
            vec![sink],
            &[iters],
            [256, iters, 1],
        )
    }

    /// Records every equation, reusing buffers after their last reader.
    pub fn record_all(&mut self) -> Result<(), RuntimeError> {
        let plan = self.plan;
        for (i, op) in plan.graph.equations.iter().enumerate() {
            self.current = i;
            if let Some(b) = self.record(i, op)? {
                self.bufs[i] = Some(b);
            }
            for v in op.operands() {
                let r = plan.root[v.index()];
                if plan.last_use[r] == i && !self.pinned.contains(&r) {
                    if let Some(b) = self.bufs[r].take() {
                        let size = b.size();
                        self.free.entry(size).or_default().push(b);
                    }
                }
            }
        }
        Ok(())
    }

    /// The recorded dispatches, parameters, outputs and readbacks.
    pub fn finish(self) -> Result<Recorded, RuntimeError> {
        let mut outputs = Vec::with_capacity(self.plan.graph.outputs.len());
        for (name, v) in &self.plan.graph.outputs {
            let info = self.plan.graph.info(*v);
            let buf = self.bufs[self.plan.root[v.index()]]
                .clone()
                .ok_or_else(|| {
                    kernel_err(
                        "output",
                        format!("output '{name}' is a weight; outputs are activations"),
                    )
                })?;
            let bytes = info.numel() as u64 * 4;
            outputs.push((name.clone(), buf, bytes, (info.dtype, info.shape.clone())));
        }
        Ok(Recorded {
            dispatches: self.dispatches,
            params: self.params,
            outputs,
            extra: self.extra_reads,
            host_rows: self.host_rows,
            late: self.late,
        })
    }

    fn alloc(&mut self, bytes: u64) -> Result<Arc<Buffer>, RuntimeError> {
        let size = bytes.max(4).div_ceil(256) * 256;
        if let Some(b) = self.free.get_mut(&size).and_then(|v| v.pop()) {
            return Ok(b);
        }
        Ok(Arc::new(self.rt.gpu.storage(size, None)?))
    }

    /// A fresh buffer holding `data` (never pooled: the upload lands before every command).
    fn upload(&self, data: &[u8]) -> Result<Arc<Buffer>, RuntimeError> {
        let b = self.fresh(data.len() as u64)?;
        if !data.is_empty() {
            self.rt.gpu.write(&b, 0, data)?;
        }
        Ok(b)
    }

    /// A new buffer of at least `bytes` (never from the pool).
    fn fresh(&self, bytes: u64) -> Result<Arc<Buffer>, RuntimeError> {
        Ok(Arc::new(
            self.rt.gpu.storage(bytes.max(4).div_ceil(4) * 4, None)?,
        ))
    }

    fn param(&mut self, words: &[u32]) -> (u64, u64) {
        let align = self.rt.gpu.uniform_align().max(16);
        let off = (self.params.len() as u64).div_ceil(align) * align;
        self.params.resize(off as usize, 0);
        for w in words {
            self.params.extend_from_slice(&w.to_le_bytes());
        }
        let len = (words.len() as u64 * 4).div_ceil(16) * 16;
        self.params.resize((off + len) as usize, 0);
        (off, len)
    }

    fn dispatch(
        &mut self,
        kernel: Kernel,
        dtype: DType,
        bufs: Vec<Arc<Buffer>>,
        words: &[u32],
        groups: [u32; 3],
    ) -> Result<(), RuntimeError> {
        let pipeline = self.rt.pipeline(kernel, dtype, &self.rt.compile_limits())?;
        let params = self.param(words);
        self.dispatches.push(Dispatch {
            pipeline,
            bufs,
            params,
            groups,
            eq: self.current,
        });
        Ok(())
    }

    fn buf(&self, v: ValueId, op: &'static str) -> Result<Arc<Buffer>, RuntimeError> {
        self.bufs[self.plan.root[v.index()]]
            .clone()
            .ok_or_else(|| kernel_err(op, format!("value {} has no device buffer", v.0)))
    }

    fn shape(&self, v: ValueId) -> &'a [usize] {
        &self.plan.graph.info(v).shape
    }

    fn host(&self, v: ValueId) -> Option<&'a HostTensor> {
        match self.plan.graph.op(v) {
            // An input bound on the device has no host values to check.
            Op::Input { name } if self.device.iter().any(|(n, _)| n == name) => None,
            Op::Input { name } => self.inputs.iter().find(|(n, _)| n == name).map(|(_, t)| t),
            _ => None,
        }
    }

    fn host_i32(&self, v: ValueId) -> Option<&'a [i32]> {
        match self.host(v) {
            Some(HostTensor::I32 { data, .. }) => Some(data),
            _ => None,
        }
    }

    fn host_f32(&self, v: ValueId) -> Option<&'a [f32]> {
        match self.host(v) {
            Some(HostTensor::F32 { data, .. }) => Some(data),
            _ => None,
        }
    }

    /// A float operand as a device f32 buffer: an activation, or a stored tensor decoded on
    /// the device into a temporary (norm weights, biases).
    fn floats(&mut self, v: ValueId, op: &'static str) -> Result<Arc<Buffer>, RuntimeError> {
        let Some(w) = self.plan.weights.get(&v.index()).cloned() else {
            return self.buf(v, op);
        };
        let numel = self.plan.graph.info(v).numel();
        let out = self.alloc(numel as u64 * 4)?;
        let chunks = w.k.div_ceil(32) as u32;
        for part in &w.parts {
            let (grid, lanes_x) = lane_grid(part.rows * chunks as usize);
            let words = [
                w.k as u32,
                w.row_bytes as u32,
                chunks,
                part.rows as u32,
                lanes_x,
                part.row0 as u32,
            ];
            let bufs = vec![part.buffer.clone(), out.clone()];
            self.dispatch(Kernel::Dequant, w.dtype, bufs, &words, grid)?;
        }
        Ok(out)
    }

    /// Records equation `i`; returns the buffer of its value (None for weights and aliases).
    fn record(&mut self, i: usize, op: &Op) -> Result<Option<Arc<Buffer>>, RuntimeError> {
        let graph = &self.plan.graph;
        let info = &graph.values[i];
        let numel = info.numel();
        let out_bytes = numel as u64 * 4;
        Ok(Some(match op {
            Op::Input { name } => {
                if let Some((_, t)) = self.device.iter().find(|(n, _)| n == name) {
                    if t.dtype != info.dtype || t.shape != info.shape {
                        return Err(RuntimeError::InputMismatch {
                            name: name.clone(),
                            expected: format!("{}{:?}", info.dtype, info.shape),
                            got: format!("{}{:?} on the device", t.dtype, t.shape),
                        });
                    }
                    self.pinned.push(i);
                    return Ok(Some(t.buf.clone()));
                }
                let found = self.inputs.iter().find(|(n, _)| n == name);
                if let (None, Some((_, slot))) =
                    (found, self.late_inputs.iter().find(|(n, _)| n == name))
                {
                    // Written between submissions, so never a pooled buffer.
                    let buf = self.fresh(out_bytes)?;
                    self.late.push(LateSlot {
                        name: name.clone(),
                        slot: slot.clone(),
                        buf: buf.clone(),
                        at: self.dispatches.len(),
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                    });
                    return Ok(Some(buf));
                }
                let host = found
                    .map(|(_, t)| t)
                    .ok_or_else(|| RuntimeError::MissingInput { name: name.clone() })?;
                if host.dtype() != info.dtype
                    || host.shape() != info.shape.as_slice()
                    || host.len() != numel
                {
                    return Err(RuntimeError::InputMismatch {
                        name: name.clone(),
                        expected: format!("{}{:?}", info.dtype, info.shape),
                        got: host.describe(),
                    });
                }
                let bytes = tensor_bytes(host);
                self.rt.count_upload(bytes.len() as u64);
                self.upload(&bytes)?
            }
            Op::Weight { .. } => return Ok(None),
            Op::Reshape { x, .. } => {
                if self.plan.weights.contains_key(&x.index()) {
                    return Err(kernel_err("reshape", "reshape of a weight".into()));
                }
                return Ok(None);
            }
            Op::Literal { data } => {
                let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
                self.upload(&bytes)?
            }
            Op::Embedding { table, ids } => {
                let w = self.plan.weights[&table.index()].clone();
                let t = self.shape(*ids).iter().product::<usize>();
                let vocab = self.shape(*table)[0];
                if let Some(ids) = self.host_i32(*ids) {
                    if let Some(&bad) = ids.iter().find(|&&id| id < 0 || id as usize >= vocab) {
                        return Err(kernel_err("embedding", format!("id {bad} of {vocab}")));
                    }
                }
                let out = self.alloc(out_bytes)?;
                let ids = self.buf(*ids, "embedding")?;
                let chunks = w.k.div_ceil(32);
                for part in &w.parts {
                    let (grid, lanes_x) = lane_grid(t * chunks);
                    let words = [
                        w.k as u32,
                        w.row_bytes as u32,
                        chunks as u32,
                        t as u32,
                        part.row0 as u32,
                        part.rows as u32,
                        lanes_x,
                    ];
                    let bufs = vec![part.buffer.clone(), ids.clone(), out.clone()];
                    self.dispatch(Kernel::Embedding, w.dtype, bufs, &words, grid)?;
                }
                out
            }
            Op::MatMul { x, w } => {
                let wt = self.plan.weights[&w.index()].clone();
                let xs = self.shape(*x);
                let (t, k) = (xs[0], xs[1]);
                let n = self.plan.graph.info(*w).matrix().0; // a 1-D weight is one row
                let out = self.alloc(out_bytes)?;
                let xb = self.buf(*x, "matmul")?;
                if self.rt.q8_matmul(wt.dtype, k) {
                    self.matmul_q8(&wt, xb, out.clone(), t, k, n)?;
                    return Ok(Some(out));
                }
                if self.rt.q8k_matmul(wt.dtype, k) {
                    self.matmul_q8k(&wt, xb, out.clone(), t, k, n)?;
                    return Ok(Some(out));
                }
                let kernel = self.rt.matmul_kernel(wt.dtype);
                // matmul.wgsl (and its subgroup variant): workgroups of 8 rows of 8 lanes each;
                // matmul_f16.wgsl: one lane per row, 64 rows a workgroup.
                let rows_per_group = if kernel == Kernel::MatMulF16 { 64 } else { 8 };
                for part in &wt.parts {
                    // Wrapped into y past 65535 workgroups.
                    let groups = part.rows.div_ceil(rows_per_group).max(1);
                    let gx = groups.min(65535);
                    let grid = [
                        gx as u32,
                        groups.div_ceil(gx) as u32,
                        t.div_ceil(8).max(1) as u32,
                    ];
                    let words = [
                        part.rows as u32,
                        k as u32,
                        t as u32,
                        wt.row_bytes as u32,
                        part.row0 as u32,
                        n as u32,
                        k.div_ceil(32) as u32,
                        gx as u32,
                    ];
                    let bufs = vec![part.buffer.clone(), xb.clone(), out.clone()];
                    self.dispatch(kernel, wt.dtype, bufs, &words, grid)?;
                }
                out
            }
            // A cast no reader fused (FuseWeightCasts): dequant.wgsl's exact decode.
            Op::Cast { x, .. } => self.floats(*x, "cast")?,
            Op::RmsNorm { x, weight, eps } => {
                let d = *info.shape.last().unwrap_or(&1);
                let rows = numel / d.max(1);
                let wb = self.floats(*weight, "rms_norm")?;
                let out = self.alloc(out_bytes)?;
                let bufs = vec![self.buf(*x, "rms_norm")?, wb, out.clone()];
                let words = [d as u32, rows as u32, eps.to_bits()];
                self.dispatch(
                    Kernel::RmsNorm,
                    DType::F32,
                    bufs,
                    &words,
                    [rows as u32, 1, 1],
                )?;
                out
            }
            Op::Add { a, b } | Op::Mul { a, b } => {
                let bb = self.floats(*b, op.name())?;
                let bn = graph.info(*b).numel();
                let out = self.alloc(out_bytes)?;
                let code = u32::from(matches!(op, Op::Mul { .. }));
                let (grid, lanes_x) = lane_grid(numel);
                let bufs = vec![self.buf(*a, op.name())?, bb, out.clone()];
                let words = [numel as u32, bn as u32, code, lanes_x];
                self.dispatch(Kernel::Eltwise, DType::F32, bufs, &words, grid)?;
                out
            }
            Op::Silu { x } | Op::Gelu { x } => {
                let out = self.alloc(out_bytes)?;
                let xb = self.buf(*x, op.name())?;
                let code = match op {
                    // ggml's expf: see eltwise.wgsl.
                    Op::Silu { .. } if self.rt.ggml() => 4,
                    Op::Silu { .. } => 2,
                    _ => 3,
                };
                let (grid, lanes_x) = lane_grid(numel);
                let words = [numel as u32, 1, code, lanes_x];
                self.dispatch(
                    Kernel::Eltwise,
                    DType::F32,
                    vec![xb.clone(), xb, out.clone()],
                    &words,
                    grid,
                )?;
                out
            }
            Op::Softcap { x, cap } => {
                let out = self.alloc(out_bytes)?;
                let xb = self.buf(*x, op.name())?;
                let (grid, lanes_x) = lane_grid(numel);
                let words = [numel as u32, cap.to_bits(), 5, lanes_x];
                self.dispatch(
                    Kernel::Eltwise,
                    DType::F32,
                    vec![xb.clone(), xb, out.clone()],
                    &words,
                    grid,
                )?;
                out
            }
            Op::Unary { x, kind } => {
                // eltwise.wgsl codes 6.. in `UnaryKind::ALL` order.
                let k = UnaryKind::ALL.iter().position(|u| u == kind).unwrap_or(0) as u32;
                self.eltwise1(*x, op.name(), numel, out_bytes, 1, 6 + k)?
            }
            Op::Scalar {
                x,
                kind,
                value,
                reverse,
            } => {
                // eltwise.wgsl codes 32..: 32 + 2 * (BinaryKind::ALL index) + reverse; the
                // scalar's bits ride in `bn`.
                let k = BinaryKind::ALL.iter().position(|b| b == kind).unwrap_or(0) as u32;
                let code = 32 + 2 * k + u32::from(*reverse);
                self.eltwise1(*x, op.name(), numel, out_bytes, value.to_bits(), code)?
            }
            Op::Binary { .. }
            | Op::LayerNorm { .. }
            | Op::Permute { .. }
            | Op::Reduce { .. }
            | Op::BatchMatMul { .. }
            | Op::CausalMask { .. } => self.tensor_op(op, i)?,
            Op::Softmax { x } => {
                let d = *info.shape.last().unwrap_or(&1);
                let rows = numel / d.max(1);
                let out = self.alloc(out_bytes)?;
                let bufs = vec![self.buf(*x, "softmax")?, out.clone()];
                self.dispatch(
                    Kernel::Softmax,
                    DType::F32,
                    bufs,
                    &[d as u32, rows as u32],
                    [rows as u32, 1, 1],
                )?;
                out
            }
            Op::Rope { x, positions, cfg } => {
                let pos = self
                    .host_i32(*positions)
                    .ok_or_else(|| kernel_err("rope", "positions are not a host input".into()))?;
                let t = info.shape[0];
                let table = cos_sin(&self.plan.rope[&i], pos)?;
                let tb: Vec<u8> = table.iter().flat_map(|x| x.to_le_bytes()).collect();
                let cs = self.upload(&tb)?;
                let out = self.alloc(out_bytes)?;
                let (grid, lanes_x) = lane_grid(numel);
                let style = u32::from(cfg.style == poot_graph::RopeStyle::NeoX);
                let words = [
                    t as u32,
                    cfg.n_heads,
                    cfg.head_dim,
                    cfg.rot_dim,
                    style,
                    lanes_x,
                ];
                let bufs = vec![self.buf(*x, "rope")?, cs, out.clone()];
                self.dispatch(Kernel::Rope, DType::F32, bufs, &words, grid)?;
                out
            }
            Op::PagedAttention { q, k, v, meta, cfg } => {
                return self.attention(numel, *q, *k, *v, meta, cfg).map(Some);
            }
            Op::Slice {
                x,
                axis,
                start,
                end,
            } => self.slice(out_bytes, *x, *axis, *start, *end)?,
            Op::Concat { xs, axis } => self.concat(out_bytes, xs, *axis, &info.shape)?,
            Op::GatherRows { x, rows } => {
                let (t, d) = (self.shape(*x)[0], self.shape(*x)[1]);
                let r = self.shape(*rows).iter().product::<usize>();
                if let Some(rs) = self.host_i32(*rows) {
                    if let Some(&bad) = rs.iter().find(|&&v| v < 0 || v as usize >= t) {
                        return Err(kernel_err("gather_rows", format!("row {bad} of {t}")));
                    }
                }
                let out = self.alloc(out_bytes)?;
                let (grid, lanes_x) = lane_grid(r * d);
                let words = [r as u32, d as u32, t as u32, lanes_x];
                let bufs = vec![
                    self.buf(*x, "gather_rows")?,
                    self.buf(*rows, "gather_rows")?,
                    out.clone(),
                ];
                self.dispatch(Kernel::Gather, DType::F32, bufs, &words, grid)?;
                out
            }
            Op::Sample { logits, params } if self.rt.samples_on_device() => {
                self.sample_device(*logits, params)?
            }
            Op::Sample { logits, params } => return self.sample(i, *logits, params).map(Some),
            Op::AdjustLogits { logits, adjust } if self.rt.samples_on_device() => {
                self.adjust(*logits, adjust)?
            }
            Op::MaskLogits { logits, mask } if self.rt.samples_on_device() => {
                self.mask(*logits, *mask)?
            }
            Op::TopK { x, k } => self.top_k(*x, *k)?,
            Op::Logprobs { logits, ids } if self.rt.samples_on_device() => {
                self.logprobs(*logits, *ids)?
            }
            Op::MoeMatMul { x, w, ids } => return self.moe_matmul(out_bytes, *x, *w, *ids),
            Op::GatherCols { x, ids } => return self.gather_cols(out_bytes, *x, *ids),
            Op::ScatterAddRows { src, ids, rows } => {
                return self.scatter_add_rows(out_bytes, *src, *ids, *rows)
            }
            Op::MoeCombine { y, weights } => return self.moe_combine(out_bytes, *y, *weights),
            Op::AdjustLogits { .. } | Op::MaskLogits { .. } | Op::Logprobs { .. } => {
                // `compile` refuses these (see `plan::supports`).
                return Err(kernel_err(op.name(), "no wgpu kernel".into()));
            }
        }))
    }
}
