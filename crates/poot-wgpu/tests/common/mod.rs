//! Shared test helpers: opening the runtime (skip with a reason where no adapter exists, fail
//! when `POOT_REQUIRE_WGPU=1`, as `make test-device-wgpu` sets), an in-memory weight store, and
//! packed test weights. `POOT_GPU_API=vulkan` opens every suite's runtime on raw Vulkan
//! (`WgpuRuntime::vulkan`) instead of wgpu, so the same suites check both devices.
#![allow(dead_code)]

pub mod compare;

use std::collections::HashMap;

use poot_core::DType;
use poot_graph::WeightCatalog;
use poot_runtime::WeightStore;
use poot_wgpu::{Api, WgpuOptions, WgpuRuntime};

/// The runtime, or `None` (with the reason on stderr) where this machine has no adapter.
pub fn runtime(options: WgpuOptions) -> Option<WgpuRuntime> {
    open_api(api(), options)
}

/// The API the suites run on: raw Vulkan under `POOT_GPU_API=vulkan`, else wgpu.
pub fn api() -> Api {
    match std::env::var("POOT_GPU_API").as_deref() {
        Ok("vulkan") => Api::Vulkan,
        Ok("wgpu") | Err(_) => Api::Wgpu,
        Ok(other) => panic!("POOT_GPU_API must be wgpu or vulkan, got {other:?}"),
    }
}

/// The runtime on `api`, or `None` (with the reason) where this machine has no device.
pub fn open_api(api: Api, options: WgpuOptions) -> Option<WgpuRuntime> {
    match WgpuRuntime::open(api, options) {
        Ok(rt) => Some(rt),
        Err(e) => {
            if std::env::var("POOT_REQUIRE_WGPU").is_ok_and(|v| v == "1") {
                panic!("POOT_REQUIRE_WGPU=1 but no {} device: {e}", api.name());
            }
            eprintln!("SKIP: no {} device on this machine ({e})", api.name());
            None
        }
    }
}

/// Stored tensors in memory: (dtype, shape, bytes) by name.
#[derive(Default)]
pub struct Store(pub HashMap<String, (DType, Vec<usize>, Vec<u8>)>);

impl Store {
    pub fn add(&mut self, name: &str, dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) {
        self.0.insert(name.to_owned(), (dtype, shape, bytes));
    }
}

impl WeightCatalog for Store {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        self.0.get(name).map(|(d, s, _)| (*d, s.clone()))
    }
}

impl WeightStore for Store {
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.0.get(name).map(|(_, _, b)| b.as_slice())
    }
    fn total_bytes(&self) -> u64 {
        self.0.values().map(|(_, _, b)| b.len() as u64).sum()
    }
}

/// A small deterministic generator (xorshift), so tests need no rand crate.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u32(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32) as u32
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

fn f16_bytes(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// Random but valid stored bytes of `rows` x `k` values in `dtype`: random quants, and scales
/// small enough that dot products stay near 1 (so error bounds are meaningful).
pub fn packed(dtype: DType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let n = rows * k;
    match dtype {
        DType::F32 => rng.vec(n).iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => rng.vec(n).iter().flat_map(|&x| f16_bytes(x)).collect(),
        DType::BF16 => rng
            .vec(n)
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        _ => {
            let be = dtype.block_elems() as usize;
            let bb = dtype.block_bytes() as usize;
            let mut out = Vec::with_capacity(n / be * bb);
            for _ in 0..n / be {
                let mut b: Vec<u8> = (0..bb).map(|_| rng.next_u32() as u8).collect();
                let scale = 0.01 + 0.02 * rng.f32().abs();
                let set = |b: &mut Vec<u8>, at: usize, x: f32| {
                    b[at..at + 2].copy_from_slice(&f16_bytes(x));
                };
                match dtype {
                    DType::Q8_0 | DType::Q4_0 => set(&mut b, 0, scale),
                    DType::Q4_1 => {
                        set(&mut b, 0, scale);
                        set(&mut b, 2, -0.1 * rng.f32().abs());
                    }
                    DType::Q4_K => {
                        set(&mut b, 0, scale / 16.0);
                        set(&mut b, 2, scale / 64.0);
                    }
                    DType::Q6_K => set(&mut b, 208, scale / 64.0),
                    // Q5: quants span twice Q4's range, so half the scale.
                    DType::Q5_0 => set(&mut b, 0, scale / 2.0),
                    DType::Q5_1 => {
                        set(&mut b, 0, scale / 2.0);
                        set(&mut b, 2, -0.1 * rng.f32().abs());
                    }
                    // Q2_K: 4-bit scales times 2-bit quants (up to 45), 4-bit mins.
                    DType::Q2_K => {
                        set(&mut b, 80, scale / 4.0);
                        set(&mut b, 82, scale / 16.0);
                    }
                    // Q3_K: signed 6-bit scales times q - 4 (up to 128 in magnitude).
                    DType::Q3_K => set(&mut b, 108, scale / 32.0),
                    DType::Q5_K => {
                        set(&mut b, 0, scale / 32.0);
                        set(&mut b, 2, scale / 64.0);
                    }
                    // Q8_K's scale is an f32.
                    DType::Q8_K => b[..4].copy_from_slice(&(scale / 8.0).to_le_bytes()),
                    _ => panic!("no test packer for {dtype}"),
                }
                out.extend_from_slice(&b);
            }
            out
        }
    }
}
