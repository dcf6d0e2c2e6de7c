//! One run of a compiled plan: check and stage the inputs (and each rope's angles, computed
//! on the host by the CPU runtime's recipe), queue the uploads, the plan's launches and the
//! output downloads, then one bounded wait. The host touches the device only through pinned
//! staging, so no call here can block on the GPU.

use poot_core::{DType, Deadline};
use poot_cpu::kernels::rope_angles;
use poot_runtime::sample::{sample_row, SampleSettings};
use poot_runtime::{HostTensor, RuntimeError};

use crate::ops::{self, AttnAddrs, AttnShape, Launch};
use crate::steps::{AttnStep, CudaPlan, Step};
use crate::{CudaRuntime, KvPool};

fn i32s<'a>(inputs: &'a [(&str, HostTensor)], name: &str) -> Result<&'a [i32], RuntimeError> {
    match input(inputs, name)? {
        HostTensor::I32 { data, .. } => Ok(data),
        t => Err(RuntimeError::InputMismatch {
            name: name.into(),
            expected: "I32".into(),
            got: t.describe(),
        }),
    }
}

fn bad(detail: String) -> RuntimeError {
    RuntimeError::Kernel {
        op: "paged_attention",
        detail,
    }
}

/// Checks one attention's metadata against the pool (what the CPU kernel checks: every index
/// a token reads or writes, and that each written slot is its position's slot) and gives its
/// shape. Nothing is queued before every step passed.
fn attention_shape(
    a: &AttnStep,
    pool: &KvPool,
    inputs: &[(&str, HostTensor)],
) -> Result<AttnShape, RuntimeError> {
    let c = &pool.cfg;
    if a.cfg.layer >= c.n_layers || a.cfg.n_kv_heads != c.n_kv_heads || a.cfg.head_dim != c.head_dim
    {
        return Err(bad(format!(
            "layer {} with {} KV heads of {} does not fit the pool ({c:?})",
            a.cfg.layer, a.cfg.n_kv_heads, a.cfg.head_dim
        )));
    }
    let [slots, seqs, positions, tables] = [0, 1, 2, 3].map(|i| i32s(inputs, &a.meta[i]));
    let (slots, seqs, positions, tables) = (slots?, seqs?, positions?, tables?);
    let (bs, mb) = (c.block_size as usize, a.max_blocks as usize);
    // The layer's group's blocks (a windowed group has its own, smaller pool).
    let num_blocks = c.layer_blocks(a.cfg.layer as usize) as usize;
    let n_slots = num_blocks * bs;
    let n_seqs = tables.len() / mb.max(1);
    for i in 0..a.t as usize {
        let (seq, pos, slot) = (seqs[i], positions[i], slots[i]);
        if seq < 0 || seq as usize >= n_seqs {
            return Err(bad(format!(
                "token_seq[{i}] = {seq} is out of range 0..{n_seqs}"
            )));
        }
        if pos < 0 || pos as usize >= mb * bs {
            return Err(bad(format!(
                "positions[{i}] = {pos} is out of range 0..{}",
                mb * bs
            )));
        }
        let row = &tables[seq as usize * mb..][..mb];
        for (b, &blk) in row.iter().enumerate().take(pos as usize / bs + 1) {
            if blk < 0 || blk as usize >= num_blocks {
                return Err(bad(format!(
                    "block_tables[{seq}][{b}] = {blk} is out of range 0..{num_blocks}"
                )));
            }
        }
        let want = row[pos as usize / bs] as usize * bs + pos as usize % bs;
        if slot != -1 && (slot < 0 || slot as usize >= n_slots || slot as usize != want) {
            return Err(bad(format!(
                "slot_mapping[{i}] = {slot}, but its block table puts position {pos} at slot {want}"
            )));
        }
    }
    Ok(AttnShape {
        t: a.t,
        n_heads: a.cfg.n_heads,
        n_kv_heads: a.cfg.n_kv_heads,
        head_dim: a.cfg.head_dim,
        block_size: c.block_size,
        max_blocks: a.max_blocks,
    })
}

fn input<'a>(inputs: &'a [(&str, HostTensor)], name: &str) -> Result<&'a HostTensor, RuntimeError> {
    inputs
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| t)
        .ok_or_else(|| RuntimeError::MissingInput { name: name.into() })
}

fn bytes_of(t: &HostTensor) -> Vec<u8> {
    match t {
        HostTensor::F32 { data, .. } => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        HostTensor::I32 { data, .. } => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

pub(crate) fn run(
    rt: &CudaRuntime,
    plan: &CudaPlan,
    inputs: &[(&str, HostTensor)],
    deadline: Deadline,
) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
    // Host side first: every check happens before anything is queued.
    let mut staged: Vec<(u64, Vec<u8>)> = Vec::new();
    for slot in &plan.inputs {
        let t = input(inputs, &slot.name)?;
        if t.dtype() != slot.dtype || t.shape() != slot.shape.as_slice() {
            return Err(RuntimeError::InputMismatch {
                name: slot.name.clone(),
                expected: format!("{}{:?}", slot.dtype, slot.shape),
                got: t.describe(),
            });
        }
        if let (Some((bound, op)), HostTensor::I32 { data, .. }) = (slot.bound, t) {
            if let Some((i, &id)) = data
                .iter()
                .enumerate()
                .find(|(_, &id)| id < 0 || id as usize >= bound)
            {
                return Err(RuntimeError::Kernel {
                    op,
                    detail: format!("{}[{i}] = {id} is out of range 0..{bound}", slot.name),
                });
            }
        }
        staged.push((slot.offset, bytes_of(t)));
    }
    let mut cs = Vec::new();
    for r in &plan.ropes {
        let HostTensor::I32 { data, .. } = input(inputs, &r.positions)? else {
            return Err(RuntimeError::InputMismatch {
                name: r.positions.clone(),
                expected: "I32 positions".into(),
                got: input(inputs, &r.positions)?.describe(),
            });
        };
        rope_angles(data, &r.table, &mut cs).map_err(|e| RuntimeError::Kernel {
            op: "rope",
            detail: e.to_string(),
        })?;
        staged.push((
            r.offset,
            cs.iter()
                .flat_map(|(c, s)| [c.to_le_bytes(), s.to_le_bytes()])
                .flatten()
                .collect(),
        ));
    }
    let in_bytes: usize = staged.iter().map(|(_, b)| b.len()).sum();
    let device_outputs = || plan.outputs.iter().filter(|o| o.sample.is_none());
    let out_bytes: usize = device_outputs()
        .map(|o| o.shape.iter().product::<usize>() * 4)
        .sum();
    let logits_bytes: usize = plan.samples.iter().map(|h| h.rows * h.vocab * 4).sum();
    // Sampling settings are host inputs: read (and refused if impossible) before launching.
    let mut settings = Vec::new();
    for h in &plan.samples {
        let f = |i: usize| -> Result<Vec<f32>, RuntimeError> {
            match input(inputs, &h.params[i])? {
                HostTensor::F32 { data, .. } => Ok(data.clone()),
                HostTensor::I32 { data, .. } => Ok(data.iter().map(|&v| v as f32).collect()),
            }
        };
        let (t, k, p, m, u) = (f(0)?, f(1)?, f(2)?, f(3)?, f(4)?);
        let rows: Vec<SampleSettings> = (0..h.rows)
            .map(|r| SampleSettings {
                temperature: t[r],
                top_k: k[r] as i32,
                top_p: p[r],
                min_p: m[r],
                uniform: u[r],
            })
            .collect();
        for r in &rows {
            r.check()?;
        }
        settings.push(rows);
    }

    // Attention steps: checked against the pool, then formed over the shared scratch.
    let kv = rt.kv.lock().unwrap_or_else(|e| e.into_inner());
    let mut scratch = rt.scratch.lock().unwrap_or_else(|e| e.into_inner());
    let mut shapes = Vec::new();
    for step in &plan.steps {
        if let Step::Attention(a) = step {
            let pool = kv.as_ref().ok_or(RuntimeError::KvNotConfigured)?;
            shapes.push((a, attention_shape(a, pool, inputs)?));
        }
    }
    let need = shapes
        .iter()
        .map(|(_, s)| s.scratch_floats() * 4)
        .max()
        .unwrap_or(0);
    if need > scratch.as_ref().map_or(0, |b| b.bytes) {
        *scratch = None; // the device is idle between runs: free before allocating
        *scratch = Some(rt.alloc(need)?);
    }
    let mut attention: Vec<[Launch; 4]> = Vec::new();
    if let (Some(pool), Some(buf)) = (kv.as_ref(), scratch.as_ref()) {
        for (a, shape) in &shapes {
            let layer = a.cfg.layer as usize;
            let [q, k, v, out, slots, seqs, positions, tables] = a.addrs;
            let addrs = AttnAddrs {
                q,
                k,
                v,
                out,
                slots,
                seqs,
                positions,
                tables,
                k_cache: pool.k[layer].ptr,
                v_cache: pool.v[layer].ptr,
                scratch: buf.ptr,
            };
            attention.push(ops::paged_attention(
                shape,
                &addrs,
                a.cfg.scale,
                a.cfg.window,
                a.cfg.softcap,
            ));
        }
    }

    let base = plan.arena.ptr;
    let mut s = rt.dev.session()?;
    s.reserve_staging(in_bytes + out_bytes + logits_bytes)?;
    let mut at = 0;
    for (_, b) in &staged {
        s.staging.as_mut_slice(at + b.len())[at..].copy_from_slice(b);
        at += b.len();
    }
    let queued = (|| {
        let mut at = 0;
        for (off, b) in &staged {
            s.htod(base + off, at, b.len())?;
            at += b.len();
        }
        let stall = rt.stall_ns.load(std::sync::atomic::Ordering::Relaxed);
        if stall > 0 {
            s.launch(&ops::stall(stall, rt.sink.ptr))?;
        }
        let mut attention = attention.iter();
        for step in &plan.steps {
            match step {
                Step::Fixed(l) => s.launch(l)?,
                Step::Attention(_) => {
                    for l in attention.next().expect("one set per attention step") {
                        s.launch(l)?;
                    }
                }
            }
        }
        for o in device_outputs() {
            let n = o.shape.iter().product::<usize>() * 4;
            s.dtoh(base + o.offset, at, n)?;
            at += n;
        }
        for h in &plan.samples {
            s.dtoh(base + h.offset, at, h.rows * h.vocab * 4)?;
            at += h.rows * h.vocab * 4;
        }
        s.wait("run", deadline)
    })();
    queued.map_err(|e| rt.fail(e, "run"))?;

    let all = s.staging.as_mut_slice(in_bytes + out_bytes + logits_bytes);
    let mut at = in_bytes + out_bytes;
    let mut sampled = Vec::with_capacity(plan.samples.len());
    for (h, rows) in plan.samples.iter().zip(&settings) {
        let mut ids = Vec::with_capacity(h.rows);
        let mut row = vec![0f32; h.vocab];
        for (r, st) in rows.iter().enumerate() {
            let bytes = &all[at + r * h.vocab * 4..][..h.vocab * 4];
            for (x, c) in row.iter_mut().zip(bytes.chunks_exact(4)) {
                *x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
            ids.push(sample_row(&row, *st)?);
        }
        sampled.push(ids);
        at += h.rows * h.vocab * 4;
    }
    let mut at = in_bytes;
    let mut out = Vec::with_capacity(plan.outputs.len());
    for o in &plan.outputs {
        if let Some(i) = o.sample {
            let data = sampled[i].clone();
            out.push((
                o.name.clone(),
                HostTensor::I32 {
                    shape: o.shape.clone(),
                    data,
                },
            ));
            continue;
        }
        let n = o.shape.iter().product::<usize>();
        let words = all[at..at + 4 * n]
            .chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]]);
        let t = match o.dtype {
            DType::I32 => HostTensor::I32 {
                shape: o.shape.clone(),
                data: words.map(i32::from_le_bytes).collect(),
            },
            _ => HostTensor::F32 {
                shape: o.shape.clone(),
                data: words.map(f32::from_le_bytes).collect(),
            },
        };
        out.push((o.name.clone(), t));
        at += 4 * n;
    }
    Ok(out)
}
