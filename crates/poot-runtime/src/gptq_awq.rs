//! A GPTQ, AWQ, compressed-tensors `pack-quantized` or FP8 safetensors checkpoint as a weight
//! store: each quantized linear layer appears as one `<prefix>.weight` of dtype `Q4_Z` (int4),
//! `Q8_Z` (8-bit) or `F8_S` (FP8 E4M3, its bytes kept, `poot_core::quant::hf_fp8`), shape
//! `[out, in]`. An act-order layer whose groups do not keep to 32-column blocks
//! is re-laid with its input columns sorted by group and also shows `<prefix>.input_perm` (I32
//! `[1, in]`, `perm[new] = original column`), which the tracer's `matmul` gathers the
//! activations with (see `poot_core::quant::hf`).
//!
//! Invariants: the re-lay (`poot_core::quant::hf`) happens once, here, for every layer before
//! the store exists, so a malformed layer is refused before any plan compiles; the Q4_Z copy is
//! 4.75 bits a weight (Q8_Z: 9; no float copy is ever made), and the source tensors' mapped pages
//! are dropped from the resident set once copied, so the quantized layers count once; a runtime
//! that re-lays a layer again (the CPU's 8-row Q4_Z) releases the copy, which then holds no
//! pages until a reader asks for it again (`released_copy`). The
//! source tensors (`qweight`, `qzeros`, `scales`, `g_idx`; `weight_packed`, `weight_scale`,
//! `weight_zero_point`, `weight_g_idx`, `weight_shape`) are hidden; every other tensor
//! (embeddings, norms, a float `lm_head`) is served as stored, from the map.

use std::collections::HashMap;
use std::sync::Arc;

use poot_core::quant::hf::{
    gptq8_to_q8z, groups_for, input_order, int4_to_q4z, HfQuantError, IntPacking, PackedTensors,
};
use poot_core::quant::hf_ct::{
    pack_i8_zero_points, pack_quantized_to_qz, scales_to_f16, CtTensors,
};
use poot_core::DType;
use poot_formats::SafetensorsModel;
use poot_graph::WeightCatalog;

use crate::released_copy::{Rebuild, ReleasedCopy};
use crate::weights::{SafetensorsWeights, WeightStore};

mod fp8;
mod stacks;
use fp8::fp8_layer;

/// Why a GPTQ/AWQ checkpoint could not be laid out; names the tensor at fault.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("{tensor}: {message}")]
pub struct GptqAwqError {
    /// The tensor concerned (`...q_proj.scales`, ...).
    pub tensor: String,
    /// `"missing_tensor"`, `"dtype"`, `"shape"`, `"g_idx"` or `"value"` (an FP8 NaN code).
    pub kind: &'static str,
    pub message: String,
}

/// The checkpoint's layout: GPTQ/AWQ (`qweight`...) or compressed-tensors `pack-quantized`
/// (`weight_packed`...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HfFormat {
    Int(IntPacking),
    PackQuantized,
    /// FP8 E4M3 weights (`float-quantized` or `quant_method: fp8`), held as F8_S; the spec's
    /// `group_size` is the square scale block's edge, or -1 for per-tensor/per-channel scales.
    Fp8,
}

/// How the checkpoint's quantized layers are packed, from its `quantization_config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptqAwqSpec {
    pub format: HfFormat,
    /// `-1`: one group per row.
    pub group_size: i64,
    /// 4 (Q4_Z) or 8 (GPTQ and pack-quantized only: Q8_Z).
    bits: u8,
}

impl GptqAwqSpec {
    /// The spec, or why not: 4 bits for every packing, 8 for GPTQ only.
    pub fn new(packing: IntPacking, group_size: i64, bits: u8) -> Result<Self, String> {
        match (bits, packing) {
            (4, _) | (8, IntPacking::GptqV1 | IntPacking::GptqV2) => Ok(Self {
                format: HfFormat::Int(packing),
                group_size,
                bits,
            }),
            (8, IntPacking::Awq) => Err("AWQ has no 8-bit layout".to_owned()),
            (b, _) => Err(format!("{b}-bit weights are not supported (4 and 8 only)")),
        }
    }

    /// compressed-tensors `pack-quantized`, 4 or 8 bits.
    pub fn pack_quantized(group_size: i64, bits: u8) -> Result<Self, String> {
        match bits {
            4 | 8 => Ok(Self {
                format: HfFormat::PackQuantized,
                group_size,
                bits,
            }),
            b => Err(format!("{b}-bit weights are not supported (4 and 8 only)")),
        }
    }

    /// FP8 E4M3 weights with `block`-square scale blocks (-1: per tensor or per channel, told
    /// apart by the scale's shape).
    pub fn fp8(block: i64) -> Result<Self, String> {
        if block == -1 || block > 0 && block % 32 == 0 {
            Ok(Self {
                format: HfFormat::Fp8,
                group_size: block,
                bits: 8,
            })
        } else {
            Err(format!(
                "FP8 scale block {block} is not -1 or a multiple of 32"
            ))
        }
    }

    /// 4 or 8.
    pub fn bits(&self) -> u8 {
        self.bits
    }
}

/// One served tensor: its bytes, dtype and shape (Q4_Z/Q8_Z rows `[out, in]`, or an I32
/// `[1, in]` input permutation).
type Relaid = (ReleasedCopy, DType, [usize; 2]);

/// Tensors of a safetensors checkpoint with its GPTQ/AWQ layers re-laid as Q4_Z or Q8_Z.
#[derive(Debug, Clone)]
pub struct GptqAwqWeights {
    inner: SafetensorsWeights,
    /// `<prefix>.weight` -> (Q4_Z rows, `[out, in]`).
    relaid: Arc<HashMap<String, Relaid>>,
    /// MoE expert stacks over `relaid`'s layers (`gptq_awq/stacks.rs`).
    stacks: Arc<HashMap<String, crate::weights::Stack>>,
    hidden: Arc<std::collections::HashSet<String>>,
    layers: usize,
}

const PARTS: [&str; 4] = ["qweight", "qzeros", "scales", "g_idx"];
const FP8_PARTS: [&str; 4] = ["weight", "weight_scale", "weight_scale_inv", "input_scale"];
const CT_PARTS: [&str; 5] = [
    "weight_packed",
    "weight_scale",
    "weight_zero_point",
    "weight_g_idx",
    "weight_shape",
];

/// The tensor part and error kind a re-lay error names.
fn part_of(e: &HfQuantError, g_idx: &'static str) -> (&'static str, &'static str) {
    match e {
        HfQuantError::Shape { tensor, .. } => (tensor, "shape"),
        HfQuantError::Geometry { .. } => ("", "shape"),
        HfQuantError::GroupIndex { .. } | HfQuantError::ActOrder { .. } => (g_idx, "g_idx"),
        HfQuantError::Scale { .. } => ("", "scale"),
        HfQuantError::NanCode { .. } => ("", "value"),
    }
}

/// `order` as the little-endian I32 bytes of `<prefix>.input_perm`.
fn perm_bytes(order: &[u32]) -> Vec<u8> {
    order
        .iter()
        .flat_map(|&i| (i as i32).to_le_bytes())
        .collect()
}

fn err(tensor: &str, kind: &'static str, message: impl Into<String>) -> GptqAwqError {
    GptqAwqError {
        tensor: tensor.to_owned(),
        kind,
        message: message.into(),
    }
}

/// One re-laid layer: its rows, their dtype, `(in, out)` and its input order (act-order).
type Layer = (Vec<u8>, DType, (usize, usize), Option<Vec<u32>>);

/// A tensor of `model`, or why not: missing (when required), or not `dtype` with `rank` dims.
fn get<'m>(
    model: &'m SafetensorsModel,
    name: &str,
    dtype: DType,
    rank: usize,
    required: bool,
    needs: &str,
) -> Result<
    Option<(
        &'m poot_formats::SafetensorsFile,
        &'m poot_formats::TensorInfo,
    )>,
    GptqAwqError,
> {
    let Some((file, t)) = model.tensor(name) else {
        return if required {
            Err(err(name, "missing_tensor", format!("is missing ({needs})")))
        } else {
            Ok(None)
        };
    };
    if t.dtype != dtype || t.shape.len() != rank {
        return Err(err(
            name,
            "dtype",
            format!(
                "is {} {:?}, expected a {rank}-d {dtype} tensor",
                t.dtype, t.shape
            ),
        ));
    }
    Ok(Some((file, t)))
}

/// Re-lays one GPTQ/AWQ layer: its rows, dtype, `[k, n]` and input order.
fn gptq_awq_layer(
    model: &SafetensorsModel,
    prefix: &str,
    packing: IntPacking,
    spec: GptqAwqSpec,
) -> Result<Layer, GptqAwqError> {
    const NEEDS: &str = "GPTQ/AWQ layers need qweight, qzeros and scales";
    let name = |part: &str| format!("{prefix}.{part}");
    let req = |part: &str, dtype| {
        get(model, &name(part), dtype, 2, true, NEEDS).map(|t| t.expect("required"))
    };
    let (qf, qw) = req("qweight", DType::I32)?;
    let (zf, qz) = req("qzeros", DType::I32)?;
    let (sf, sc) = req("scales", DType::F16)?;
    let g_idx = match packing {
        IntPacking::Awq => None,
        _ => get(model, &name("g_idx"), DType::I32, 1, false, NEEDS)?,
    };
    let (r, c) = (qw.shape[0] as usize, qw.shape[1] as usize);
    let (k, n) = match (packing, spec.bits) {
        (IntPacking::Awq, _) => (r, c * 8),
        (_, 8) => (r * 4, c),
        _ => (r * 8, c),
    };
    // The scales' shape is the one the layer's groups must agree with; check it here so the
    // error names the tensor rather than a byte count.
    let groups = groups_for(spec.group_size, k, n)
        .map_err(|e| err(&name("qweight"), "shape", e.to_string()))?;
    if sc.shape != [groups as u64, n as u64] {
        return Err(err(
            &name("scales"),
            "shape",
            format!(
                "has shape {:?}, expected [{groups}, {n}] (group_size {})",
                sc.shape, spec.group_size
            ),
        ));
    }
    let tensors = PackedTensors {
        qweight: qf.tensor_bytes(qw),
        qzeros: zf.tensor_bytes(qz),
        scales: sf.tensor_bytes(sc),
        g_idx: g_idx.map(|(f, t)| f.tensor_bytes(t)),
    };
    let relay = || {
        let order = input_order(tensors.g_idx, k, n, groups)?;
        // `GptqAwqSpec::new` allows 8 bits only for GPTQ.
        let (out, dtype) = if spec.bits == 8 {
            let v1 = packing == IntPacking::GptqV1;
            (
                gptq8_to_q8z(v1, tensors, (k, n), spec.group_size)?,
                DType::Q8_Z,
            )
        } else {
            (
                int4_to_q4z(packing, tensors, (k, n), spec.group_size)?,
                DType::Q4_Z,
            )
        };
        Ok((out, dtype, (k, n), order))
    };
    relay().map_err(|e: HfQuantError| {
        let (part, kind) = part_of(&e, "g_idx");
        let part = if part.is_empty() { "qweight" } else { part };
        err(&name(part), kind, e.to_string())
    })
}

/// Re-lays one compressed-tensors `pack-quantized` layer.
fn pack_quantized_layer(
    model: &SafetensorsModel,
    prefix: &str,
    spec: GptqAwqSpec,
) -> Result<Layer, GptqAwqError> {
    const NEEDS: &str = "pack-quantized layers need weight_packed, weight_scale and weight_shape";
    let name = |part: &str| format!("{prefix}.{part}");
    let (pf, pk) = get(model, &name("weight_packed"), DType::I32, 2, true, NEEDS)?.expect("req");
    let (hf, sh) = get(model, &name("weight_shape"), DType::I32, 1, true, NEEDS)?.expect("req");
    let Some((sf, sc)) = model.tensor(&name("weight_scale")) else {
        return Err(err(
            &name("weight_scale"),
            "missing_tensor",
            format!("is missing ({NEEDS})"),
        ));
    };
    if !matches!(sc.dtype, DType::F16 | DType::BF16 | DType::F32) || sc.shape.len() != 2 {
        return Err(err(
            &name("weight_scale"),
            "dtype",
            format!(
                "is {} {:?}, expected a 2-d F16, BF16 or F32 tensor",
                sc.dtype, sc.shape
            ),
        ));
    }
    // Older releases stored zero points unpacked (I8 `[n, groups]`); newer ones pack them.
    let zp_i8 = model
        .tensor(&name("weight_zero_point"))
        .filter(|(_, t)| t.dtype == DType::I8);
    let zp = match zp_i8 {
        Some(_) => None,
        None => get(
            model,
            &name("weight_zero_point"),
            DType::I32,
            2,
            false,
            NEEDS,
        )?,
    };
    let g_idx = get(model, &name("weight_g_idx"), DType::I32, 1, false, NEEDS)?;
    let shape: Vec<i64> = hf
        .tensor_bytes(sh)
        .chunks_exact(4)
        .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        .collect();
    let f = 32 / usize::from(spec.bits);
    let (n, k) = match shape[..] {
        [n, k] if n > 0 && k > 0 => (n as usize, k as usize),
        _ => {
            return Err(err(
                &name("weight_shape"),
                "shape",
                format!("is {shape:?}, expected [out_features, in_features]"),
            ))
        }
    };
    if pk.shape != [n as u64, k.div_ceil(f) as u64] {
        return Err(err(
            &name("weight_packed"),
            "shape",
            format!(
                "has shape {:?}, expected [{n}, {}] ({}-bit quants, {f} a word, of a {n} x {k} \
                 weight)",
                pk.shape,
                k.div_ceil(f),
                spec.bits
            ),
        ));
    }
    let groups = groups_for(spec.group_size, k, n)
        .map_err(|e| err(&name("weight_packed"), "shape", e.to_string()))?;
    if sc.shape != [n as u64, groups as u64] {
        return Err(err(
            &name("weight_scale"),
            "shape",
            format!(
                "has shape {:?}, expected [{n}, {groups}] (group_size {})",
                sc.shape, spec.group_size
            ),
        ));
    }
    let relay = || {
        let scale = scales_to_f16(sc.dtype, sf.tensor_bytes(sc))?;
        let unpacked = zp_i8
            .map(|(f, t)| pack_i8_zero_points(f.tensor_bytes(t), (k, n), groups, spec.bits))
            .transpose()?;
        let t = CtTensors {
            packed: pf.tensor_bytes(pk),
            scale: &scale,
            zero_point: unpacked.as_deref().or(zp.map(|(f, t)| f.tensor_bytes(t))),
            g_idx: g_idx.map(|(f, t)| f.tensor_bytes(t)),
        };
        let order = input_order(t.g_idx, k, n, groups)?;
        let out = pack_quantized_to_qz(spec.bits, t, (k, n), spec.group_size)?;
        let dtype = if spec.bits == 8 {
            DType::Q8_Z
        } else {
            DType::Q4_Z
        };
        Ok((out, dtype, (k, n), order))
    };
    relay().map_err(|e: HfQuantError| {
        let (part, kind) = part_of(&e, "weight_g_idx");
        let part = match (part, kind) {
            ("", "scale") => "weight_scale",
            ("", _) => "weight_packed",
            (p, _) => p,
        };
        err(&name(part), kind, e.to_string())
    })
}

/// One quantized layer under `spec`, re-laid (see the layer functions above).
fn layer(model: &SafetensorsModel, prefix: &str, spec: GptqAwqSpec) -> Result<Layer, GptqAwqError> {
    match spec.format {
        HfFormat::Int(packing) => gptq_awq_layer(model, prefix, packing, spec),
        HfFormat::PackQuantized => pack_quantized_layer(model, prefix, spec),
        HfFormat::Fp8 => fp8_layer(model, prefix, spec),
    }
}

impl GptqAwqWeights {
    /// Re-lays every quantized layer of `model` (`<prefix>.qweight`, or `.weight_packed` for
    /// compressed-tensors) under `spec` (int4: Q4_Z, 8-bit: Q8_Z).
    pub fn new(model: Arc<SafetensorsModel>, spec: GptqAwqSpec) -> Result<Self, GptqAwqError> {
        let (suffix, parts): (&str, &[&str]) = match spec.format {
            HfFormat::Int(_) => (".qweight", &PARTS),
            HfFormat::PackQuantized => (".weight_packed", &CT_PARTS),
            HfFormat::Fp8 => (".weight", &FP8_PARTS),
        };
        let mut relaid = HashMap::new();
        let mut hidden = std::collections::HashSet::new();
        // FP8 layers are the `.weight`s stored as E4M3; the others are named by their packing.
        let prefixes: Vec<String> = model
            .tensors()
            .filter(|(_, t)| spec.format != HfFormat::Fp8 || t.dtype == DType::F8E4M3)
            .filter_map(|(_, t)| t.name.strip_suffix(suffix).map(str::to_owned))
            .collect();
        let mut layers = 0;
        let copy = |bytes: Vec<u8>, rebuild: Rebuild, name: &str| {
            ReleasedCopy::new(bytes, rebuild)
                .map_err(|e| err(name, "memory", format!("mapping its re-laid copy: {e}")))
        };
        for prefix in prefixes {
            let (out, dtype, (k, n), order) = layer(&model, &prefix, spec)?;
            for part in parts {
                let name = format!("{prefix}.{part}");
                if let Some((f, t)) = model.tensor(&name) {
                    // The copy above is the one read from now on: drop the source's pages.
                    f.release_tensor(t);
                }
                hidden.insert(name);
            }
            if let Some(order) = order {
                let (name, bytes) = (format!("{prefix}.input_perm"), perm_bytes(&order));
                let again = bytes.clone();
                let perm = copy(bytes, Box::new(move || again.clone()), &name)?;
                relaid.insert(name, (perm, DType::I32, [1, k]));
            }
            // A runtime that re-lays this layer again releases the copy (`released_copy`);
            // a reader after that gets it rebuilt from the checkpoint, as at load.
            let (m, p) = (model.clone(), prefix.clone());
            let rebuild: Rebuild = Box::new(move || match layer(&m, &p, spec) {
                Ok(l) => l.0,
                Err(e) => panic!("{p} re-laid at load but not again: {e}"),
            });
            let name = format!("{prefix}.weight");
            let out = copy(out, rebuild, &name)?;
            relaid.insert(name, (out, dtype, [n, k]));
            layers += 1;
        }
        let stacks = stacks::expert_stacks(&relaid)?;
        let store = Self {
            inner: SafetensorsWeights::new(model),
            relaid: Arc::new(relaid),
            stacks: Arc::new(stacks),
            hidden: Arc::new(hidden),
            layers,
        };
        // Reading a layer faults in the page-cache folios around it, which hold the sources of
        // layers already re-laid and released (measured: 5 MB of a 114 MB GPTQ SmolLM2 stayed
        // mapped until the runtime's preparation ended): released once more, all of them.
        store.release_unserved();
        crate::released_copy::trim_heap();
        Ok(store)
    }

    /// How many layers were re-laid.
    pub fn layers(&self) -> usize {
        self.layers
    }
}

impl WeightCatalog for GptqAwqWeights {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        if let Some((_, dtype, shape)) = self.relaid.get(name) {
            return Some((*dtype, shape.to_vec()));
        }
        if let Some((dtype, shape, _)) = self.stacks.get(name) {
            return Some((*dtype, shape.clone()));
        }
        if self.hidden.contains(name) {
            return None;
        }
        self.inner.describe(name)
    }
}

impl WeightStore for GptqAwqWeights {
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        if let Some((b, _, _)) = self.relaid.get(name) {
            return Some(b.bytes());
        }
        if self.hidden.contains(name) {
            return None;
        }
        self.inner.bytes(name)
    }

    fn pieces(&self, name: &str) -> Option<Vec<&[u8]>> {
        if let Some((_, _, names)) = self.stacks.get(name) {
            return names.iter().map(|n| self.bytes(n)).collect();
        }
        if self.relaid.contains_key(name) || self.hidden.contains(name) {
            return self.bytes(name).map(|b| vec![b]);
        }
        self.inner.pieces(name)
    }

    fn total_bytes(&self) -> u64 {
        let hidden: u64 = self
            .hidden
            .iter()
            .filter_map(|n| self.inner.describe(n).and(self.inner.bytes(n)))
            .map(|b| b.len() as u64)
            .sum();
        let relaid: u64 = self.relaid.values().map(|(b, _, _)| b.len() as u64).sum();
        self.inner.total_bytes() - hidden + relaid
    }

    /// The tensors served from the map (embeddings, norms, a float `lm_head`) release as the
    /// inner store does; a re-laid layer's copy drops its pages (`released_copy`).
    fn release(&self, name: &str) {
        if let Some((_, _, names)) = self.stacks.get(name) {
            names.iter().for_each(|n| self.release(n));
        } else if let Some((b, _, _)) = self.relaid.get(name) {
            b.release();
        } else if !self.hidden.contains(name) {
            self.inner.release(name);
        }
    }

    /// A stack releases each expert wholly inside `range` (its experts' bytes one after another).
    fn release_range(&self, name: &str, range: std::ops::Range<usize>) {
        if let Some((_, _, names)) = self.stacks.get(name) {
            let mut at = 0;
            for n in names {
                let len = self.relaid.get(n).map_or(0, |(b, _, _)| b.len());
                if range.start <= at && at + len <= range.end {
                    self.release(n);
                }
                at += len;
            }
        } else if !self.relaid.contains_key(name) && !self.hidden.contains(name) {
            self.inner.release_range(name, range);
        }
    }

    /// The re-laid layers' source tensors, released at load, once more: a read of a tensor
    /// beside them (a norm between two layers) faults in the page-cache folio around it
    /// (measured: 8 MB of a 114 MB GPTQ SmolLM2's `qweight`/`scales` after the first plan).
    fn release_unserved(&self) {
        for name in self.hidden.iter() {
            self.inner.release(name);
        }
    }

    fn mapped(&self, name: &str) -> bool {
        !self.relaid.contains_key(name)
            && !self.stacks.contains_key(name)
            && self.inner.mapped(name)
    }
}
