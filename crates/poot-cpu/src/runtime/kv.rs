//! The runtime's paged KV pool: per layer, K and V in the element its numerics stores (f32 for
//! exact, f16 for ggml, as llama.cpp's default cache). The runtime sizes and allocates it
//! (`configure_kv`, refused over `max_kv_bytes` before allocating); attention in the executor
//! is its only writer.

use half::f16;
use poot_runtime::KvCacheConfig;

use crate::kernels::Numerics;

/// Per layer, K and V of `[blocks, block_size, n_kv_heads, head_dim]` entries, `blocks` the
/// layer's group's (`KvCacheConfig::layer_blocks`).
#[derive(Debug)]
pub(crate) enum KvLayers {
    /// [`Numerics::Exact`].
    F32 { k: Vec<Vec<f32>>, v: Vec<Vec<f32>> },
    /// [`Numerics::Ggml`], as llama.cpp's default cache.
    F16 { k: Vec<Vec<f16>>, v: Vec<Vec<f16>> },
}

impl KvLayers {
    pub(crate) fn n_layers(&self) -> usize {
        match self {
            KvLayers::F32 { k, .. } => k.len(),
            KvLayers::F16 { k, .. } => k.len(),
        }
    }
}

/// The KV pool.
#[derive(Debug)]
pub(crate) struct KvPool {
    pub(crate) cfg: KvCacheConfig,
    pub(crate) layers: KvLayers,
}

/// Bytes of a pool of `cfg` with entries of `numerics`' KV element (f32 or f16).
pub(crate) fn kv_bytes(cfg: &KvCacheConfig, numerics: Numerics) -> Option<u64> {
    let f32_bytes = cfg.bytes_f32()?;
    Some(match numerics {
        Numerics::Exact => f32_bytes,
        Numerics::Ggml => f32_bytes / 2,
    })
}
