//! Cross-check against an implementation someone else wrote, for every dtype that has one.
//!
//! The `gguf` Python package's numpy dequantizers (`gguf/quants.py`, gguf 0.19.0) were run on the
//! blocks [`generated`] makes, and the FNV-1a digests of their `f32` bits are pinned below. This
//! covers Q5_1, Q2_K, Q3_K, Q5_K and BF16, which the real-data slices lack; the input digest
//! pins the generator, so a change there is reported as such rather than as a decoder bug.
//!
//! To regenerate: xorshift32 seeded with `ggml_id + 1`, one byte per step (`state >> 24`), each
//! block's `f16` fields masked with `0xBFFF` (finite, |x| < 2, subnormals included); feed the
//! bytes to `gguf.quants.dequantize` and digest the little-endian `f32` output.

use super::layout::layout;
use super::{dequantize, DType};

/// (dtype, FNV-1a of the input bytes, FNV-1a of gguf-py's output bits) for 2048 elements.
const GGUF_PY: [(DType, u64, u64); 13] = [
    (DType::F32, 0x5582a779d32737ab, 0x5582a779d32737ab),
    (DType::F16, 0x73efaa263de59dc0, 0x6fd6ad5106dd9d36),
    (DType::BF16, 0xf43a342f4264b992, 0x7e4fdce5cd28f2d2),
    (DType::Q4_0, 0xa11773450478c0b6, 0x472732469c59181d),
    (DType::Q4_1, 0x8bc3d76ddb574763, 0xb4d2ba0ffc943d98),
    (DType::Q5_0, 0x1be3d998c5dc0a09, 0xcf7f229129e0b14c),
    (DType::Q5_1, 0x8b3ac0a3240619c4, 0xdba7714d0d3fa1ea),
    (DType::Q8_0, 0x1534c87837387d86, 0xd21916de0c7a577c),
    (DType::Q2_K, 0x96e35fa772c84c71, 0x773f54a8f37d8f8d),
    (DType::Q3_K, 0xc227fec85618fb0c, 0xcab33f9e1428d580),
    (DType::Q4_K, 0x5da24674fbb6a181, 0x23836b01a8367ea9),
    (DType::Q5_K, 0xfac08731b26e27f2, 0x3caf8b70ced359a4),
    (DType::Q6_K, 0xc67740c7e0ceffb4, 0xe9bcc93ec706a369),
];

const ELEMS: usize = 2048;

fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Random blocks of `dtype` for `ELEMS` elements, with every `f16` field finite.
fn generated(dtype: DType) -> Vec<u8> {
    let l = layout(dtype).expect("supported dtypes have layouts");
    let mut s = dtype.ggml_id().expect("GGUF dtype") + 1;
    let mut out = Vec::new();
    for _ in 0..ELEMS / l.elems {
        let start = out.len();
        out.extend((0..l.bytes()).map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 24) as u8
        }));
        let block = &mut out[start..];
        for f in l.fields.iter().filter(|f| f.what.starts_with("f16")) {
            let v = u16::from_le_bytes([block[f.offset], block[f.offset + 1]]) & 0xBFFF;
            block[f.range()].copy_from_slice(&v.to_le_bytes());
        }
    }
    out
}

#[test]
fn bit_identical_to_gguf_py_on_generated_blocks() {
    for (dtype, input, output) in GGUF_PY {
        let src = generated(dtype);
        assert_eq!(
            fnv1a(src.iter().copied()),
            input,
            "{dtype}: the generator changed"
        );
        let mut y = vec![0.0f32; ELEMS];
        dequantize(dtype, &src, &mut y).unwrap();
        let got = fnv1a(y.iter().flat_map(|v| v.to_bits().to_le_bytes()));
        assert_eq!(got, output, "{dtype}: output bits differ from gguf-py's");
    }
}
