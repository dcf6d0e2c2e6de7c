//! What this CPU can run, detected once per process.
//!
//! [`CpuFeatures::get`] is the crate's only reader of the CPU's feature flags: every kernel that
//! picks a path asks it (or an [`Isa`] derived from it), never `is_x86_feature_detected!`
//! itself, so the set a process runs with is one value that can be printed and reasoned about.
//! The code path ([`Isa`]) follows from it ([`CpuFeatures::best_isa`], [`CpuFeatures::runs`]).
//!
//! Invariant (soundness): a flag is true only when the CPU (and for AMX the OS and the kernel's
//! grant of tile state) supports it, so a `#[target_feature]` function guarded by a flag is
//! sound to call.
//!
//! Cost: detection runs once (a `OnceLock`); each later read is one atomic load.

use std::sync::OnceLock;

use crate::Isa;

/// The instruction-set extensions this process may use (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuFeatures {
    pub avx: bool,
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    pub xsave: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vl: bool,
    pub avx512vnni: bool,
    pub avx512bf16: bool,
    /// AMX-TILE and AMX-INT8 on the CPU, tile state enabled by the OS and granted to this
    /// process by the kernel (`kernels::amx`), with AVX-512 BW/VL and F16C for the float steps.
    pub amx_int8: bool,
    /// [`CpuFeatures::amx_int8`] plus AMX-BF16.
    pub amx_bf16: bool,
}

impl CpuFeatures {
    /// This CPU's features, detected on the first call.
    pub fn get() -> &'static CpuFeatures {
        static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
        FEATURES.get_or_init(CpuFeatures::detect)
    }

    #[cfg(target_arch = "x86_64")]
    fn detect() -> CpuFeatures {
        let mut f = CpuFeatures {
            avx: is_x86_feature_detected!("avx"),
            avx2: is_x86_feature_detected!("avx2"),
            fma: is_x86_feature_detected!("fma"),
            f16c: is_x86_feature_detected!("f16c"),
            xsave: is_x86_feature_detected!("xsave"),
            avx512f: is_x86_feature_detected!("avx512f"),
            avx512bw: is_x86_feature_detected!("avx512bw"),
            avx512vl: is_x86_feature_detected!("avx512vl"),
            avx512vnni: is_x86_feature_detected!("avx512vnni"),
            avx512bf16: is_x86_feature_detected!("avx512bf16"),
            amx_int8: false,
            amx_bf16: false,
        };
        f.amx_int8 = crate::kernels::arch::x86::amx::detect(&f);
        // CPUID.(7,0):EDX bit 22: AMX-BF16.
        f.amx_bf16 = f.amx_int8 && std::arch::x86_64::__cpuid_count(7, 0).edx & (1 << 22) != 0;
        f
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn detect() -> CpuFeatures {
        CpuFeatures::default()
    }

    /// AVX2, FMA and F16C: what every SIMD [`Isa`] includes.
    pub fn avx2_fma_f16c(&self) -> bool {
        self.avx2 && self.fma && self.f16c
    }

    /// The 256-bit VNNI dot (`vpdpbusd ymm`).
    pub fn vnni256(&self) -> bool {
        self.avx512vnni && self.avx512vl
    }

    /// The 512-bit VNNI dot and the byte ops the Q4 unpacking uses.
    pub fn vnni512(&self) -> bool {
        self.vnni256() && self.avx512f && self.avx512bw
    }

    /// The 512-bit byte and word ops (with F16C and FMA) of the 16-row K-quant dots.
    pub fn avx512_bytes(&self) -> bool {
        self.avx512f && self.avx512bw && self.f16c && self.fma
    }

    /// AVX-512 F, BW and BF16: the `vdpbf16ps` tiles.
    pub fn dpbf16(&self) -> bool {
        self.avx512f && self.avx512bw && self.avx512bf16
    }

    /// Whether this CPU runs the code path `isa`.
    pub fn runs(&self, isa: Isa) -> bool {
        match isa {
            Isa::Scalar => true,
            Isa::Avx2 => self.avx2_fma_f16c(),
            Isa::Avx512 => self.avx2_fma_f16c() && self.avx512f,
            Isa::Amx => self.avx2_fma_f16c() && self.avx512f && self.amx_int8,
        }
    }

    /// The best code path this CPU runs.
    pub fn best_isa(&self) -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|isa| self.runs(*isa))
            .unwrap_or(Isa::Scalar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paths_nest() {
        let f = CpuFeatures::get();
        assert!(f.runs(Isa::Scalar));
        assert!(f.runs(f.best_isa()));
        for pair in Isa::ALL.windows(2) {
            assert!(!f.runs(pair[1]) || f.runs(pair[0]), "{pair:?}");
        }
        assert!(std::ptr::eq(f, CpuFeatures::get()), "detected once");
    }
}
