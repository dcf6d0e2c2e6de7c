//! A GPTQ or AWQ safetensors checkpoint as a weight store: each quantized linear layer appears
//! as one `<prefix>.weight` of dtype `Q4_Z` (int4) or `Q8_Z` (8-bit GPTQ), shape `[out, in]`.
//!
//! Invariants: the re-lay (`poot_core::quant::hf`) happens once, here, for every layer before
//! the store exists, so a malformed layer is refused before any plan compiles; the Q4_Z copy is
//! 4.75 bits a weight (Q8_Z: 9; no float copy is ever made), and the source tensors' mapped pages
//! are dropped from the resident set once copied, so the quantized layers count once. The
//! source tensors (`qweight`, `qzeros`, `scales`, `g_idx`) are hidden; every other tensor
//! (embeddings, norms, a float `lm_head`) is served as stored, from the map.

use std::collections::HashMap;
use std::sync::Arc;

use poot_core::quant::hf::{gptq8_to_q8z, int4_to_q4z, IntPacking, PackedTensors};
use poot_core::DType;
use poot_formats::SafetensorsModel;
use poot_graph::WeightCatalog;

use crate::weights::{SafetensorsWeights, WeightStore};

/// Why a GPTQ/AWQ checkpoint could not be laid out; names the tensor at fault.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("{tensor}: {message}")]
pub struct GptqAwqError {
    /// The tensor concerned (`...q_proj.scales`, ...).
    pub tensor: String,
    /// `"missing_tensor"`, `"dtype"`, `"shape"` or `"g_idx"`.
    pub kind: &'static str,
    pub message: String,
}

/// How the checkpoint's GPTQ/AWQ layers are packed, from its `quantization_config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptqAwqSpec {
    pub packing: IntPacking,
    /// `-1`: one group per row.
    pub group_size: i64,
    /// 4 (GPTQ, AWQ: Q4_Z) or 8 (GPTQ only: Q8_Z).
    bits: u8,
}

impl GptqAwqSpec {
    /// The spec, or why not: 4 bits for every packing, 8 for GPTQ only.
    pub fn new(packing: IntPacking, group_size: i64, bits: u8) -> Result<Self, String> {
        match (bits, packing) {
            (4, _) | (8, IntPacking::GptqV1 | IntPacking::GptqV2) => Ok(Self {
                packing,
                group_size,
                bits,
            }),
            (8, IntPacking::Awq) => Err("AWQ has no 8-bit layout".to_owned()),
            (b, _) => Err(format!("{b}-bit weights are not supported (4 and 8 only)")),
        }
    }

    /// 4 or 8.
    pub fn bits(&self) -> u8 {
        self.bits
    }
}

/// One re-laid layer: its Q4_Z or Q8_Z rows, that dtype and `[out, in]`.
type Relaid = (Vec<u8>, DType, [usize; 2]);

/// Tensors of a safetensors checkpoint with its GPTQ/AWQ layers re-laid as Q4_Z or Q8_Z.
#[derive(Debug, Clone)]
pub struct GptqAwqWeights {
    inner: SafetensorsWeights,
    /// `<prefix>.weight` -> (Q4_Z rows, `[out, in]`).
    relaid: Arc<HashMap<String, Relaid>>,
    hidden: Arc<std::collections::HashSet<String>>,
}

const PARTS: [&str; 4] = ["qweight", "qzeros", "scales", "g_idx"];

fn err(tensor: &str, kind: &'static str, message: impl Into<String>) -> GptqAwqError {
    GptqAwqError {
        tensor: tensor.to_owned(),
        kind,
        message: message.into(),
    }
}

impl GptqAwqWeights {
    /// Re-lays every `<prefix>.qweight` of `model` under `spec` (int4: Q4_Z, 8-bit: Q8_Z).
    pub fn new(model: Arc<SafetensorsModel>, spec: GptqAwqSpec) -> Result<Self, GptqAwqError> {
        let mut relaid = HashMap::new();
        let mut hidden = std::collections::HashSet::new();
        let prefixes: Vec<String> = model
            .tensors()
            .filter_map(|(_, t)| t.name.strip_suffix(".qweight").map(str::to_owned))
            .collect();
        for prefix in prefixes {
            let get = |part: &str, dtype: DType, required: bool| {
                let name = format!("{prefix}.{part}");
                let Some((file, t)) = model.tensor(&name) else {
                    return if required {
                        Err(err(
                            &name,
                            "missing_tensor",
                            "is missing (GPTQ/AWQ layers need qweight, qzeros and scales)",
                        ))
                    } else {
                        Ok(None)
                    };
                };
                if t.dtype != dtype || t.shape.len() != 2 && part != "g_idx" {
                    return Err(err(
                        &name,
                        "dtype",
                        format!(
                            "is {} {:?}, expected a 2-d {dtype} tensor",
                            t.dtype, t.shape
                        ),
                    ));
                }
                Ok(Some((file, t)))
            };
            let (qf, qw) = get("qweight", DType::I32, true)?.expect("required");
            let (zf, qz) = get("qzeros", DType::I32, true)?.expect("required");
            let (sf, sc) = get("scales", DType::F16, true)?.expect("required");
            let g_idx = match spec.packing {
                IntPacking::Awq => None,
                _ => get("g_idx", DType::I32, false)?,
            };
            let (r, c) = (qw.shape[0] as usize, qw.shape[1] as usize);
            let (k, n) = match (spec.packing, spec.bits) {
                (IntPacking::Awq, _) => (r, c * 8),
                (_, 8) => (r * 4, c),
                _ => (r * 8, c),
            };
            // The scales' shape is the one the layer's groups must agree with; check it
            // here so the error names the tensor rather than a byte count.
            let groups = poot_core::quant::hf::groups_for(spec.group_size, k, n)
                .map_err(|e| err(&format!("{prefix}.qweight"), "shape", e.to_string()))?;
            if sc.shape != [groups as u64, n as u64] {
                return Err(err(
                    &format!("{prefix}.scales"),
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
            // `GptqAwqSpec::new` allows 8 bits only for GPTQ.
            let (out, dtype) = if spec.bits == 8 {
                let v1 = spec.packing == IntPacking::GptqV1;
                let q = gptq8_to_q8z(v1, tensors, (k, n), spec.group_size);
                (q, DType::Q8_Z)
            } else {
                let q = int4_to_q4z(spec.packing, tensors, (k, n), spec.group_size);
                (q, DType::Q4_Z)
            };
            let out = out.map_err(|e| {
                use poot_core::quant::hf::HfQuantError as E;
                let (part, kind) = match &e {
                    E::Shape { tensor, .. } => (*tensor, "shape"),
                    E::Geometry { .. } => ("qweight", "shape"),
                    E::GroupIndex { .. } | E::ActOrder { .. } => ("g_idx", "g_idx"),
                };
                err(&format!("{prefix}.{part}"), kind, e.to_string())
            })?;
            for part in PARTS {
                let name = format!("{prefix}.{part}");
                if let Some((f, t)) = model.tensor(&name) {
                    // The copy above is the one read from now on: drop the source's pages.
                    f.release_tensor(t);
                }
                hidden.insert(name);
            }
            relaid.insert(format!("{prefix}.weight"), (out, dtype, [n, k]));
        }
        Ok(Self {
            inner: SafetensorsWeights::new(model),
            relaid: Arc::new(relaid),
            hidden: Arc::new(hidden),
        })
    }

    /// How many layers were re-laid.
    pub fn layers(&self) -> usize {
        self.relaid.len()
    }
}

impl WeightCatalog for GptqAwqWeights {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        if let Some((_, dtype, shape)) = self.relaid.get(name) {
            return Some((*dtype, shape.to_vec()));
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
            return Some(b);
        }
        if self.hidden.contains(name) {
            return None;
        }
        self.inner.bytes(name)
    }

    fn pieces(&self, name: &str) -> Option<Vec<&[u8]>> {
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
}
