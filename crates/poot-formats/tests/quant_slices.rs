//! poot-core's reference dequantizers against real quantized data, read through poot-formats.
//!
//! `quant-slices/real-quant-slices.gguf` holds byte-exact row slices of real checkpoints
//! (SmolLM2, Qwen2.5, stories260K) and `real-quant-slices.dequant.safetensors` their `f32`
//! dequantization by the `gguf` Python package, which matches ggml's C code. The first test
//! demands equal bits for every value. The second decodes every tensor of the stories260K
//! F16/Q8_0/Q4_0 files and bounds the distance to the f32 original by what the format can
//! represent, so a layout slip anywhere in a whole file shows up.
//!
//! Both skip, recording why, where `../shared/models` is absent, and fail there under
//! `POOT_REQUIRE_SHARED=1` (see `common`).

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use poot_core::quant::{self, layout};
use poot_core::DType;
use poot_formats::{GgufFile, SafetensorsFile, TensorInfo};

fn models_dir() -> Option<PathBuf> {
    common::shared_models()
}

fn le_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn decode(file: &GgufFile, t: &TensorInfo) -> Vec<f32> {
    let n = usize::try_from(t.n_elements()).expect("tensor fits memory");
    quant::dequantize_to_vec(t.dtype, file.tensor_bytes(t), n)
        .unwrap_or_else(|e| panic!("{}: {e}", t.name))
}

#[test]
fn real_slices_match_gguf_py_bit_for_bit() {
    let Some(dir) = models_dir() else { return };
    let dir = dir.join("quant-slices");
    let src = GgufFile::open(dir.join("real-quant-slices.gguf")).unwrap();
    let refs = SafetensorsFile::open(dir.join("real-quant-slices.dequant.safetensors")).unwrap();
    let mut seen = BTreeSet::new();
    for t in src.tensors() {
        let r = refs
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{}: no reference", t.name));
        assert_eq!(
            (r.dtype, &r.shape),
            (DType::F32, &t.shape),
            "{}: reference shape",
            t.name
        );
        let want = le_f32s(refs.tensor_bytes(r));
        let got = decode(&src, t);
        let bad: Vec<usize> = (0..want.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .collect();
        if let Some(&i) = bad.first() {
            let (g, w) = (got[i], want[i]);
            panic!(
                "{} ({}): {} of {} values differ; first at {i}: got {:#010x} ({g}), want \
                 {:#010x} ({w})",
                t.name,
                t.dtype,
                bad.len(),
                want.len(),
                g.to_bits(),
                w.to_bits(),
            );
        }
        seen.insert(t.dtype.name());
    }
    // The folder's README promises these types; a shrunken file must not pass silently.
    for dt in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
        DType::F16,
    ] {
        assert!(
            seen.contains(dt.name()),
            "no {dt} slice in the file; saw {seen:?}"
        );
    }
}

/// The f16 scale `d` of each 32-element block of a Q8_0 or Q4_0 tensor.
fn block_scales(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    let (l, d) = match dtype {
        DType::Q8_0 => (&layout::q8_0::LAYOUT, layout::q8_0::D),
        DType::Q4_0 => (&layout::q4_0::LAYOUT, layout::q4_0::D),
        _ => unreachable!("only called for Q8_0 and Q4_0"),
    };
    let ds: Vec<u8> = bytes
        .chunks_exact(l.bytes())
        .flat_map(|b| b[d.range()].to_vec())
        .collect();
    quant::dequantize_to_vec(DType::F16, &ds, ds.len() / 2).unwrap()
}

#[test]
fn stories260k_files_decode_within_format_bounds() {
    let Some(dir) = models_dir() else { return };
    let dir = dir.join("stories260K");
    let orig = GgufFile::open(dir.join("stories260K-f32.gguf")).unwrap();
    for name in ["F16", "Q8_0", "Q4_0"] {
        let file = GgufFile::open(dir.join(format!("stories260K-{name}.gguf"))).unwrap();
        assert_eq!(
            file.tensors().len(),
            orig.tensors().len(),
            "{name}: tensor count"
        );
        let mut seen = BTreeSet::new();
        for t in file.tensors() {
            let o = orig
                .tensor(&t.name)
                .unwrap_or_else(|| panic!("{name}/{}: not in f32", t.name));
            assert_eq!(o.shape, t.shape, "{name}/{}: shape", t.name);
            let x = le_f32s(orig.tensor_bytes(o));
            let y = decode(&file, t);
            // Error bounds per value: F16 rounds to nearest (half an ulp <= |x| * 2^-11, 2^-25
            // below the normal range); Q8_0 rounds to the nearest step of d (plus d's own f16
            // rounding); Q4_0 may clip the value opposite the block's extreme by one step.
            let d = match t.dtype {
                DType::Q8_0 | DType::Q4_0 => block_scales(t.dtype, file.tensor_bytes(t)),
                _ => Vec::new(),
            };
            for (i, (&x, &y)) in x.iter().zip(&y).enumerate() {
                let bound = match t.dtype {
                    DType::F32 => 0.0,
                    DType::F16 => x.abs() * 2f32.powi(-11) + 2f32.powi(-25),
                    DType::Q8_0 => 0.6 * d[i / 32].abs(),
                    DType::Q4_0 => 1.01 * d[i / 32].abs(),
                    other => panic!("{name}/{}: unexpected {other}", t.name),
                };
                assert!(
                    (y - x).abs() <= bound,
                    "{name}/{} ({}) [{i}]: got {y}, f32 original {x}, bound {bound}",
                    t.name,
                    t.dtype,
                );
            }
            seen.insert(t.dtype.name());
        }
        assert!(
            seen.contains(name),
            "{name}: no {name} tensor; saw {seen:?}"
        );
    }
}
