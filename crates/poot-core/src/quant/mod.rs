//! Exact reference dequantizers: packed ggml blocks (and plain floats) to `f32`.
//!
//! This is a test reference, not a kernel. Kernels read packed blocks in place; nothing here
//! runs on a hot path, and the code favours matching ggml line by line over speed (a scalar
//! loop, one block at a time, no SIMD, no allocation).
//!
//! Invariant: for every supported dtype the output is bit-identical to ggml's C reference
//! (`dequantize_row_*` in `ggml-quants.c`) and to the `gguf` Python package's numpy port. Each
//! value is computed with ggml's `f32` operations in ggml's order (Q6_K is `(d * sc) * q`, Q4_K
//! is `(d * sc) * q - dmin * m`). Why that is robust: an f16 scale has at most 11 significant
//! bits and a sub-block scale times a quant at most 12 more (Q6_K: |sc * q| <= 128 * 32), so
//! every product fits `f32`'s 24 bits exactly, and f16 subnormals stay far above `f32`'s. The
//! only rounding steps are the final add or subtract of a min (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K)
//! and Q8_K's `f32 * i8`. Reassociating the products, or contracting into a fused
//! multiply-add, cannot change a bit; dropping or reordering the min can.
//!
//! `f16` fields convert exactly; an `f16` NaN keeps its payload with the quiet bit set, as
//! x86's F16C and ggml do. Blocks are read by byte offset (see [`layout`]), little-endian, from
//! unaligned `&[u8]`; nothing is transmuted.
//!
//! Cost: O(elements); only [`dequantize_to_vec`] allocates. Supported: F32, F16, BF16, Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, and poot's own Q4_Z, Q8_Z and
//! F8_S (the in-memory forms of GPTQ/AWQ int4, 8-bit GPTQ and FP8, see [`hf`], [`hf_fp8`]). Q8_1 has a layout but no dequantizer (ggml
//! has none).

#[cfg(test)]
mod golden_tests;
pub mod hf;
pub mod hf_ct;
#[cfg(test)]
mod hf_ct_tests;
pub mod hf_fp8;
#[cfg(test)]
mod hf_fp8_tests;
#[cfg(test)]
mod hf_tests;
pub mod kquants;
pub mod layout;
pub mod legacy;

use thiserror::Error;

use crate::DType;

/// Why a buffer could not be dequantized.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum QuantError {
    /// `src` is not the byte size of `elems` elements of `dtype`.
    #[error("{dtype}: {elems} elements take {expected_bytes} bytes, got {got_bytes}")]
    LengthMismatch {
        dtype: DType,
        elems: u64,
        expected_bytes: u64,
        got_bytes: u64,
    },
    /// The element count is not a whole number of `dtype` blocks.
    #[error("{dtype}: {elems} elements are not whole {}-element blocks", dtype.block_elems())]
    NotWholeBlocks { dtype: DType, elems: u64 },
    /// poot has no reference dequantizer for `dtype`.
    #[error("no reference dequantizer for {dtype}")]
    Unsupported { dtype: DType },
}

/// Every dtype [`dequantize`] accepts.
pub const SUPPORTED: [DType; 17] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::Q8_K,
    DType::Q4_Z,
    DType::Q8_Z,
    DType::F8_S,
];

/// True when [`dequantize`] has a reference for `dtype`.
pub fn supports(dtype: DType) -> bool {
    SUPPORTED.contains(&dtype)
}

/// Dequantizes `dst.len()` elements of `dtype` from `src`, which must be exactly
/// `dtype.bytes_for(dst.len())` bytes. Bit-identical to ggml's `dequantize_row_*`.
///
/// Checks, in order: the dtype is supported, `dst.len()` is a whole number of blocks, and `src`
/// has the matching length. `dst` is untouched on error.
pub fn dequantize(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check(dtype, src.len(), dst.len())?;
    match dtype {
        DType::F32 => each_block(src, dst, legacy::f32),
        DType::F16 => each_block(src, dst, legacy::f16),
        DType::BF16 => each_block(src, dst, legacy::bf16),
        DType::Q4_0 => each_block(src, dst, legacy::q4_0),
        DType::Q4_1 => each_block(src, dst, legacy::q4_1),
        DType::Q5_0 => each_block(src, dst, legacy::q5_0),
        DType::Q5_1 => each_block(src, dst, legacy::q5_1),
        DType::Q8_0 => each_block(src, dst, legacy::q8_0),
        DType::Q2_K => each_block(src, dst, kquants::q2_k),
        DType::Q3_K => each_block(src, dst, kquants::q3_k),
        DType::Q4_K => each_block(src, dst, kquants::q4_k),
        DType::Q5_K => each_block(src, dst, kquants::q5_k),
        DType::Q6_K => each_block(src, dst, kquants::q6_k),
        DType::Q8_K => each_block(src, dst, kquants::q8_k),
        DType::Q4_Z => each_block(src, dst, legacy::q4_z),
        DType::Q8_Z => each_block(src, dst, legacy::q8_z),
        DType::F8_S => each_block(src, dst, legacy::f8_s),
        _ => return Err(QuantError::Unsupported { dtype }),
    }
    Ok(())
}

/// Dequantizes `src` into a new vector of `elems` values (tests and tools). The lengths are
/// checked before allocating, so a bogus `elems` cannot trigger a huge allocation.
pub fn dequantize_to_vec(dtype: DType, src: &[u8], elems: usize) -> Result<Vec<f32>, QuantError> {
    check(dtype, src.len(), elems)?;
    let mut out = vec![0.0; elems];
    dequantize(dtype, src, &mut out)?;
    Ok(out)
}

/// The checks [`dequantize`] documents, in its order.
fn check(dtype: DType, src_len: usize, elems: usize) -> Result<(), QuantError> {
    if !supports(dtype) {
        return Err(QuantError::Unsupported { dtype });
    }
    let elems = elems as u64;
    if !elems.is_multiple_of(dtype.block_elems()) {
        return Err(QuantError::NotWholeBlocks { dtype, elems });
    }
    // Only overflows for counts no slice can hold (supported dtypes take at most 4 bytes per
    // element); such a count then mismatches any real `src`.
    let expected_bytes = dtype.bytes_for(elems).unwrap_or(u64::MAX);
    let got_bytes = src_len as u64;
    if got_bytes != expected_bytes {
        return Err(QuantError::LengthMismatch {
            dtype,
            elems,
            expected_bytes,
            got_bytes,
        });
    }
    Ok(())
}

/// Runs a block decoder over `src` and `dst`, whose lengths the caller checked.
fn each_block<const B: usize, const E: usize>(
    src: &[u8],
    dst: &mut [f32],
    decode: fn(&[u8; B], &mut [f32; E]),
) {
    debug_assert_eq!(src.len() / B, dst.len() / E);
    for (b, y) in src.chunks_exact(B).zip(dst.chunks_exact_mut(E)) {
        // `chunks_exact` yields exactly B bytes and E values, so neither conversion can fail.
        decode(
            b.try_into().expect("B-byte chunk"),
            y.try_into().expect("E-value chunk"),
        );
    }
}

/// The `f16` at byte `off` of `b`, little-endian, as `f32` (exact; NaNs come back quiet).
#[inline]
fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_matches_layouts_and_the_dispatch() {
        for dt in DType::ALL {
            let elems = dt.block_elems() as usize * 2;
            let src = vec![0u8; dt.bytes_for(elems as u64).unwrap() as usize];
            let mut dst = vec![f32::NAN; elems];
            let got = dequantize(dt, &src, &mut dst);
            if supports(dt) {
                assert!(layout::layout(dt).is_some(), "{dt} has no layout");
                got.unwrap();
                // All-zero bytes mean zero scales, so every value is +-0.
                assert!(dst.iter().all(|&x| x == 0.0), "{dt}: {dst:?}");
            } else {
                assert_eq!(got, Err(QuantError::Unsupported { dtype: dt }));
                assert!(dst.iter().all(|x| x.is_nan()), "{dt}: dst touched on error");
            }
        }
    }

    #[test]
    fn length_errors_are_typed_and_leave_dst_alone() {
        let mut dst = [7.0f32; 64];
        assert_eq!(
            dequantize(DType::Q4_0, &[0; 35], &mut dst),
            Err(QuantError::LengthMismatch {
                dtype: DType::Q4_0,
                elems: 64,
                expected_bytes: 36,
                got_bytes: 35
            })
        );
        assert_eq!(
            dequantize(DType::Q6_K, &[0; 210], &mut dst),
            Err(QuantError::NotWholeBlocks {
                dtype: DType::Q6_K,
                elems: 64
            })
        );
        assert_eq!(
            dequantize(DType::Q8_1, &[0; 72], &mut dst),
            Err(QuantError::Unsupported { dtype: DType::Q8_1 })
        );
        assert!(dst.iter().all(|&x| x == 7.0));
        let msg = dequantize(DType::Q4_0, &[0; 35], &mut dst)
            .unwrap_err()
            .to_string();
        assert_eq!(msg, "Q4_0: 64 elements take 36 bytes, got 35");
    }

    #[test]
    fn empty_input_is_fine() {
        for dt in SUPPORTED {
            dequantize(dt, &[], &mut []).unwrap();
        }
    }

    #[test]
    fn to_vec_validates_before_allocating() {
        assert_eq!(
            dequantize_to_vec(DType::Q8_0, &[0; 34], usize::MAX / 2 + 1),
            Err(QuantError::LengthMismatch {
                dtype: DType::Q8_0,
                elems: (usize::MAX / 2 + 1) as u64,
                expected_bytes: DType::Q8_0.bytes_for((usize::MAX / 2 + 1) as u64).unwrap(),
                got_bytes: 34
            })
        );
        assert_eq!(
            dequantize_to_vec(DType::Q8_0, &[0; 34], 33),
            Err(QuantError::NotWholeBlocks {
                dtype: DType::Q8_0,
                elems: 33
            })
        );
        assert_eq!(
            dequantize_to_vec(DType::F32, &1.5f32.to_le_bytes(), 1),
            Ok(vec![1.5])
        );
    }
}
