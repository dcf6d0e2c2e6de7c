//! Test helpers: the shared real-weight slices, deterministic random data, packed weights, and
//! the record of tests that could not run here.
//!
//! A test that cannot run (no `../shared`, or an ISA this CPU lacks) never passes silently:
//! [`real_slices`] panics under `POOT_REQUIRE_SHARED=1` and [`isa_runs`] under
//! `POOT_REQUIRE_ISA` naming the ISA; otherwise both append a line to the file named by
//! `POOT_SKIP_LOG` (which `scripts/test_summary.py` counts by reason) and to stderr.

use std::io::Write;
use std::path::PathBuf;

use poot_core::quant::layout;
use poot_core::DType;
use poot_formats::GgufFile;

/// The running test's name: libtest names each test's thread after it.
fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_string()
}

/// Records that the running test did not run its body, and why: a `rust<TAB>crate<TAB>test<TAB>
/// reason` line appended to `POOT_SKIP_LOG` when set (one `write` per line, so concurrent tests
/// do not interleave), and the reason on stderr.
pub fn record_skip(reason: &str) {
    let line = format!("rust\tpoot-cpu\t{}\t{reason}\n", test_name());
    eprint!("SKIPPED: {line}");
    if let Some(path) = std::env::var_os("POOT_SKIP_LOG") {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path);
        match file {
            Ok(mut f) => f
                .write_all(line.as_bytes())
                .unwrap_or_else(|e| panic!("POOT_SKIP_LOG {path:?}: {e}")),
            Err(e) => panic!("POOT_SKIP_LOG {path:?}: {e}"),
        }
    }
}

/// Whether a test of the `isa` code path (`"avx2"`, `"avx512"`, `"vnni"`, `"bf16"`, `"amx"`) can
/// run here (`present`). When it cannot: panics if `POOT_REQUIRE_ISA` (a comma-separated list,
/// or `all`) names `isa`, else records the skip and returns false.
pub fn isa_runs(isa: &str, present: bool) -> bool {
    if present {
        return true;
    }
    let required = std::env::var("POOT_REQUIRE_ISA").unwrap_or_default();
    if required
        .split(',')
        .map(str::trim)
        .any(|r| r == isa || r == "all")
    {
        panic!("POOT_REQUIRE_ISA={required} but this CPU has no {isa}");
    }
    record_skip(&format!("no {isa} on this CPU"));
    false
}

/// `quant-slices/real-quant-slices.gguf` from `../shared/models`, or `None` (the skip recorded)
/// when the shared folder is absent; panics instead under `POOT_REQUIRE_SHARED=1`.
pub fn real_slices() -> Option<GgufFile> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/models/quant-slices/real-quant-slices.gguf");
    if !path.is_file() {
        let reason = format!("../shared missing: {} not found", path.display());
        if std::env::var("POOT_REQUIRE_SHARED").as_deref() == Ok("1") {
            panic!("POOT_REQUIRE_SHARED=1 but {reason}");
        }
        record_skip(&reason);
        return None;
    }
    Some(GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// xorshift32: reproducible data without a dependency.
#[derive(Debug)]
pub struct Rng(u32);

impl Rng {
    pub fn new(seed: u32) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9).max(1))
    }

    pub fn next_u32(&mut self) -> u32 {
        let mut s = self.0;
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        self.0 = s;
        s
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * (self.next_u32() >> 8) as f32 / (1u32 << 24) as f32
    }

    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    /// [`Rng::vec`] rounded to f16 (an f16 KV cache's contents).
    pub fn f16_vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<half::f16> {
        self.vec(n, lo, hi)
            .into_iter()
            .map(half::f16::from_f32)
            .collect()
    }
}

/// `n` rows of `k` elements of `dtype` with random quants and finite, realistic scales.
pub fn synthetic_weights(dtype: DType, n: usize, k: usize, seed: u32) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let elems = n * k;
    match dtype {
        DType::F32 => {
            return rng
                .vec(elems, -1.0, 1.0)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect()
        }
        DType::F16 => {
            return (0..elems)
                .flat_map(|_| half::f16::from_f32(rng.uniform(-1.0, 1.0)).to_le_bytes())
                .collect()
        }
        DType::BF16 => {
            return (0..elems)
                .flat_map(|_| half::bf16::from_f32(rng.uniform(-1.0, 1.0)).to_le_bytes())
                .collect()
        }
        _ => {}
    }
    let l = layout::layout(dtype).expect("packed dtype");
    let mut bytes: Vec<u8> = (0..dtype.bytes_for(elems as u64).unwrap())
        .map(|_| rng.next_u32() as u8)
        .collect();
    for block in bytes.chunks_exact_mut(l.bytes()) {
        if dtype == DType::F8_S {
            // E4M3's NaN codes (0x7f, 0xff) would make every sum NaN: use the largest finite.
            let qs = &mut block[layout::f8_s::QS.range()];
            for q in qs.iter_mut().filter(|q| **q & 0x7f == 0x7f) {
                *q &= 0xfe;
            }
        }
        for f in l.fields {
            let v = match f.name {
                "d" => rng.uniform(0.001, 0.05),
                "m" | "dmin" => rng.uniform(-0.05, 0.05),
                _ => continue,
            };
            if f.len == 4 {
                block[f.range()].copy_from_slice(&v.to_le_bytes());
            } else {
                block[f.range()].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
    }
    bytes
}

/// poot-core's exact reference dequantization of `elems` values.
pub fn reference(dtype: DType, bytes: &[u8], elems: usize) -> Vec<f32> {
    poot_core::quant::dequantize_to_vec(dtype, bytes, elems).unwrap()
}

/// Asserts `|got - want| <= tol` elementwise, naming `what` and the first failure.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], tol: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for i in 0..got.len() {
        let err = (f64::from(got[i]) - want[i]).abs();
        assert!(
            err <= tol[i],
            "{what}[{i}]: got {}, want {}, |err| {err:e} > bound {:e}",
            got[i],
            want[i],
            tol[i]
        );
    }
}
