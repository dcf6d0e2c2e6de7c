//! Token embedding lookup from a table in its stored dtype.
//!
//! Invariants: only the requested rows are decoded, straight from the packed table into `out`
//! (no table-sized buffer); decoding is exact (bit-identical to poot-core's reference on every
//! ISA), so `out` equals the reference dequantization of those rows. Every id is checked before
//! anything is written; an id outside `0..n_vocab` is a typed error, never a panic.
//!
//! Cost: O(ids * dim) decode work, no allocation.

use poot_core::DType;

use crate::error::{check_len, mul};
use crate::kernels::blocks::row_bytes;
use crate::kernels::format::Format;
use crate::kernels::simd::{self, Isa};
use crate::KernelError;

/// `out[i] = table[ids[i]]` for a `[n_vocab, dim]` table of `dtype` (`out` is `[ids, dim]`).
pub fn embedding(
    table: &[u8],
    dtype: DType,
    n_vocab: usize,
    dim: usize,
    ids: &[i32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let ck = Isa::detect().checked()?;
    let p = Format::of(dtype).ok_or(KernelError::UnsupportedDType {
        op: "embedding",
        dtype,
    })?;
    let row = row_bytes("embedding", dtype, dim)?;
    check_len(
        "embedding table",
        mul(n_vocab, row, "embedding table")?,
        table.len(),
    )?;
    check_ids_and_out(ids, n_vocab, dim, out)?;
    if dim == 0 {
        return Ok(());
    }
    for (&id, dst) in ids.iter().zip(out.chunks_exact_mut(dim)) {
        let id = id as usize; // checked above: 0 <= id < n_vocab
        simd::decode(ck, p, &table[id * row..(id + 1) * row], dst);
    }
    Ok(())
}

/// `out` holds `ids.len()` rows of `dim`, and every id is in `0..n_vocab` (the first bad one is
/// the error), before anything is written.
fn check_ids_and_out(
    ids: &[i32],
    n_vocab: usize,
    dim: usize,
    out: &[f32],
) -> Result<(), KernelError> {
    check_len(
        "embedding out",
        mul(ids.len(), dim, "embedding out")?,
        out.len(),
    )?;
    match ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id < 0 || id as usize >= n_vocab)
    {
        Some((at, &id)) => Err(KernelError::IndexOutOfRange {
            what: "embedding ids",
            at,
            value: i64::from(id),
            bound: n_vocab,
        }),
        None => Ok(()),
    }
}

/// [`embedding`] from a table in the 8-row layout (`matmul/repack.rs`): each row is rebuilt in a
/// reused buffer, in the re-lay's own dtype (a symmetric Q4_Z table's rows come back as the Q4_0
/// rows of the same values), then decoded as above, so `out` is bit-identical.
pub(crate) fn embedding_repacked(
    table: &crate::kernels::matmul::repack::Repack,
    ids: &[i32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let ck = Isa::detect().checked()?;
    let dtype = table.dtype();
    let p = Format::of(dtype).ok_or(KernelError::UnsupportedDType {
        op: "embedding",
        dtype,
    })?;
    let (n_vocab, dim) = (table.n(), table.k());
    let row = row_bytes("embedding", dtype, dim)?;
    check_ids_and_out(ids, n_vocab, dim, out)?;
    let mut bytes = crate::kernels::scratch::Scratch::<u8>::zeroed(row);
    for (&id, dst) in ids.iter().zip(out.chunks_exact_mut(dim.max(1))) {
        table.stored_row(id as usize, &mut bytes);
        simd::decode(ck, p, &bytes, dst);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{real_slices, reference, synthetic_weights};

    #[test]
    fn rows_match_the_reference_bit_for_bit_on_the_real_q8_0_table() {
        let Some(file) = real_slices() else { return };
        let info = file
            .tensor("smollm2.token_embd.Q8_0")
            .expect("embedding slice");
        let (n_vocab, dim) = (info.shape[0] as usize, info.shape[1] as usize);
        let table = file.tensor_bytes(info);
        let all = reference(info.dtype, table, n_vocab * dim);
        let ids = [3, 0, 31, 3, 17];
        let mut out = vec![f32::NAN; ids.len() * dim];
        embedding(table, info.dtype, n_vocab, dim, &ids, &mut out).unwrap();
        for (i, &id) in ids.iter().enumerate() {
            let want = &all[id as usize * dim..(id as usize + 1) * dim];
            let got = &out[i * dim..(i + 1) * dim];
            assert!(
                got.iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "id {id}"
            );
        }
    }

    #[test]
    fn every_decodable_dtype_looks_up_exact_rows() {
        for (s, dt) in crate::kernels::format::DECODABLE.into_iter().enumerate() {
            let dim = if dt.is_quantized() {
                dt.block_elems() as usize * 2
            } else {
                19
            };
            let n_vocab = 6;
            let table = synthetic_weights(dt, n_vocab, dim, 40 + s as u32);
            let all = reference(dt, &table, n_vocab * dim);
            let ids = [5, 1, 1, 0];
            let mut out = vec![0.0; ids.len() * dim];
            embedding(&table, dt, n_vocab, dim, &ids, &mut out).unwrap();
            for (i, &id) in ids.iter().enumerate() {
                let want = &all[id as usize * dim..(id as usize + 1) * dim];
                assert_eq!(&out[i * dim..(i + 1) * dim], want, "{dt} id {id}");
            }
        }
    }

    #[test]
    fn bad_ids_and_shapes_are_typed_errors_and_write_nothing() {
        let table = synthetic_weights(DType::Q4_0, 4, 32, 1);
        let mut out = vec![9.0; 64];
        assert_eq!(
            embedding(&table, DType::Q4_0, 4, 32, &[1, 4], &mut out),
            Err(KernelError::IndexOutOfRange {
                what: "embedding ids",
                at: 1,
                value: 4,
                bound: 4
            })
        );
        assert_eq!(
            embedding(&table, DType::Q4_0, 4, 32, &[-1, 0], &mut out),
            Err(KernelError::IndexOutOfRange {
                what: "embedding ids",
                at: 0,
                value: -1,
                bound: 4
            })
        );
        assert_eq!(
            embedding(&table, DType::Q4_0, 5, 32, &[0, 0], &mut out),
            Err(KernelError::Length {
                what: "embedding table",
                expected: 90,
                got: 72
            })
        );
        assert_eq!(
            embedding(&table, DType::Q4_0, 4, 32, &[0], &mut out),
            Err(KernelError::Length {
                what: "embedding out",
                expected: 32,
                got: 64
            })
        );
        assert_eq!(
            embedding(&table, DType::I32, 4, 32, &[0, 0], &mut out),
            Err(KernelError::UnsupportedDType {
                op: "embedding",
                dtype: DType::I32
            })
        );
        assert!(out.iter().all(|&v| v == 9.0));
    }

    #[test]
    fn repacked_tables_give_the_same_rows() {
        use crate::kernels::format::Format;
        use crate::kernels::matmul::repack::{Repack, Repacked};
        use crate::kernels::matmul::repack_k::RepackedK;
        let kinds = [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q8_0,
            DType::Q4_K,
            DType::Q6_K,
        ];
        for dt in kinds {
            let dim = if dt.block_elems() == 256 { 512 } else { 96 };
            let n = 19;
            let table = synthetic_weights(dt, n, dim, 8);
            let rp = match Format::of(dt).filter(|&f| Repacked::supports(f)) {
                Some(kind) => Repack::Q(Repacked::new(kind, &table, n, dim / 32)),
                None => Repack::K(RepackedK::new(
                    Format::of(dt).unwrap(),
                    &table,
                    n,
                    dim / 256,
                )),
            };
            let ids = [18, 0, 7, 8, 18];
            let mut want = vec![0.0f32; ids.len() * dim];
            embedding(&table, dt, n, dim, &ids, &mut want).unwrap();
            let mut got = vec![f32::NAN; ids.len() * dim];
            embedding_repacked(&rp, &ids, &mut got).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{dt}");
            let err = embedding_repacked(&rp, &[3, 19], &mut got[..2 * dim]).unwrap_err();
            assert!(
                matches!(err, KernelError::IndexOutOfRange { at: 1, .. }),
                "{err}"
            );
        }
    }
}
