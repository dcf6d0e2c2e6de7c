//! Shared test helpers: opening the runtime (on the GPU where one exists; else on the CPU
//! emulation of the driver, with the kernels run by the shim; `POOT_REQUIRE_CUDA=1`, as
//! `make test-device-cuda` sets, demands the GPU), an in-memory weight store, packed test
//! weights and the error bounds.
#![allow(dead_code)]

use std::collections::HashMap;

use poot_core::DType;
use poot_cuda::{CudaOptions, CudaRuntime};
use poot_graph::WeightCatalog;
use poot_runtime::WeightStore;

/// The runtime on the GPU, or `None` (with the reason on stderr) where there is none.
pub fn gpu_runtime() -> Option<CudaRuntime> {
    match CudaRuntime::new(CudaOptions::default()) {
        Ok(rt) => Some(rt),
        Err(e) => {
            if std::env::var("POOT_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("POOT_REQUIRE_CUDA=1 but no CUDA runtime: {e}");
            }
            eprintln!("SKIP: no CUDA device on this machine ({e})");
            None
        }
    }
}

/// The runtime on the GPU; where there is none, on the CPU emulation of the driver (the
/// kernels run by the shim), so the runtime's host code is tested everywhere. `None` only
/// where no host C++ compiler exists either.
pub fn runtime() -> Option<CudaRuntime> {
    if let Some(rt) = gpu_runtime() {
        return Some(rt);
    }
    let lib = match poot_cuda::shim::Shim::get() {
        Ok(s) => s.library().to_path_buf(),
        Err(e) => {
            eprintln!("SKIP: no CPU emulation either ({e})");
            return None;
        }
    };
    let options = CudaOptions {
        driver_library: Some(lib.clone()),
        nvrtc_library: Some(lib),
        ..CudaOptions::default()
    };
    let rt = CudaRuntime::new(options).expect("the CPU emulation of the driver opens");
    eprintln!(
        "running on the CPU emulation of the driver ({})",
        rt.device().name
    );
    Some(rt)
}

/// Whether `rt` is the CPU emulation rather than a GPU.
pub fn emulated(rt: &CudaRuntime) -> bool {
    rt.device().name == "poot CPU emulator"
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
/// small enough that dot products stay near 1.
pub fn packed(dtype: DType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let n = rows * k;
    match dtype {
        DType::F32 => rng.vec(n).iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => rng.vec(n).iter().flat_map(|&x| f16_bytes(x)).collect(),
        _ => {
            let be = dtype.block_elems() as usize;
            let bb = dtype.block_bytes() as usize;
            let mut out = Vec::with_capacity(n / be * bb);
            for _ in 0..n / be {
                let mut b: Vec<u8> = (0..bb).map(|_| rng.next_u32() as u8).collect();
                let scale = 0.01 + 0.02 * rng.f32().abs();
                b[0..2].copy_from_slice(&f16_bytes(scale));
                if dtype == DType::Q4_1 {
                    b[2..4].copy_from_slice(&f16_bytes(-0.1 * rng.f32().abs()));
                }
                out.extend_from_slice(&b);
            }
            out
        }
    }
}

/// The exact values of stored bytes (poot-core's reference dequantizers).
pub fn dequant(dtype: DType, bytes: &[u8], elems: usize) -> Vec<f32> {
    poot_core::quant::dequantize_to_vec(dtype, bytes, elems).expect("valid test weights")
}

/// Matmul bound: two f32 dot products of `k` terms in different orders each err by at most
/// `k * 2^-24 * sum |x_i w_i|` from the exact sum, so they differ by at most twice that.
pub fn dot_bound(k: usize, abs_sum: f64) -> f64 {
    2.0 * k as f64 * 2f64.powi(-24) * abs_sum + 1e-30
}

/// `|x| @ |w|^T` per output: what `dot_bound` scales.
pub fn abs_dots(x: &[f32], t: usize, k: usize, w: &[f32], n: usize) -> Vec<f64> {
    let mut out = vec![0.0; t * n];
    for ti in 0..t {
        for ni in 0..n {
            out[ti * n + ni] = (0..k)
                .map(|j| f64::from((x[ti * k + j] * w[ni * k + j]).abs()))
                .sum();
        }
    }
    out
}

/// Dtypes the CUDA matvec reads packed.
pub const MATMUL_DTYPES: [DType; 5] = [
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::F16,
    DType::F32,
];
