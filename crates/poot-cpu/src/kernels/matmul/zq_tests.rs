//! The zero-point integer matmul (`Q4_Z`, `Q8_Z`): every ISA and thread count bit-identical to
//! the portable loop, within `matmul/q8.rs`'s bound of the exact product of the reference
//! dequantization (exact in `f32`, so equal to a float64 one) with the unquantized activations;
//! zero points of GPTQ/AWQ's range and outside it (the other branch of the x86 loop).

use poot_core::quant::layout;
use poot_core::DType;

use crate::kernels::arch::generic::zdot_generic::dot_scalar;
use crate::kernels::format::Format;
use crate::kernels::ggml::Numerics;
use crate::kernels::matmul::q8::tests::check;
use crate::kernels::matmul::MatmulPath;
use crate::kernels::qact::BlockQ8;
use crate::testutil::{synthetic_weights, Rng};

/// `n x k` synthetic weights of `dt` with zero points drawn by `zero` (block index, rng).
fn with_zeros(
    dt: DType,
    n: usize,
    k: usize,
    seed: u32,
    zero: impl Fn(usize, u32) -> u16,
) -> Vec<u8> {
    let mut w = synthetic_weights(dt, n, k, seed);
    let mut rng = Rng::new(seed + 100);
    let bb = dt.block_bytes() as usize;
    for (i, b) in w.chunks_exact_mut(bb).enumerate() {
        let z = zero(i, rng.next_u32());
        match dt {
            DType::Q4_Z => b[layout::q4_z::Z.offset] = z as u8,
            _ => b[layout::q8_z::Z.range()].copy_from_slice(&z.to_le_bytes()),
        }
    }
    w
}

#[test]
fn gptq_range_zeros_within_the_quantization_bound() {
    // 13 rows: three full groups of 4 and a ragged one; k = 96: three blocks. Q4_Z zeros
    // 0..=16 (v1's `+1` reaches 16), Q8_Z zeros 0..=256.
    let w = with_zeros(DType::Q4_Z, 13, 96, 3, |_, r| (r % 17) as u16);
    check("Q4_Z gptq zeros", DType::Q4_Z, &w, 13, 96, 21);
    let w = with_zeros(DType::Q8_Z, 13, 96, 4, |_, r| (r % 257) as u16);
    check("Q8_Z gptq zeros", DType::Q8_Z, &w, 13, 96, 22);
}

#[test]
fn any_stored_zero_within_the_quantization_bound() {
    // Every other block's zero above 128 (Q4_Z's slow branch) or above 256 (Q8_Z).
    let w = with_zeros(DType::Q4_Z, 9, 128, 5, |i, r| {
        if i % 2 == 0 {
            129 + (r % 127) as u16
        } else {
            (r % 256) as u16
        }
    });
    check("Q4_Z any zero", DType::Q4_Z, &w, 9, 128, 23);
    let w = with_zeros(DType::Q8_Z, 9, 128, 6, |i, r| {
        if i % 2 == 0 {
            r as u16
        } else {
            (r % 300) as u16
        }
    });
    check("Q8_Z any zero", DType::Q8_Z, &w, 9, 128, 24);
}

#[test]
fn zero_point_dtypes_take_the_integer_path_under_ggml_only() {
    assert_eq!(
        MatmulPath::choose(Numerics::Ggml, DType::Q4_Z),
        MatmulPath::Q8(Format::Q4_Z)
    );
    assert_eq!(
        MatmulPath::choose(Numerics::Ggml, DType::Q8_Z),
        MatmulPath::Q8(Format::Q8_Z)
    );
    assert_eq!(
        MatmulPath::choose(Numerics::Exact, DType::Q4_Z),
        MatmulPath::Decoded
    );
}

#[test]
fn the_portable_loop_is_the_per_block_integer_sum() {
    // dot_scalar against a direct sum over the unpacked integers: 8 lanes of exact i32 sums,
    // `fma(d_w * d_x, lane, acc)`, then hsum8.
    for dt in [DType::Q4_Z, DType::Q8_Z] {
        let kind = Format::of(dt).unwrap();
        let k = 64;
        let w = with_zeros(dt, 1, k, 8, |_, r| (r % 20) as u16);
        let x = Rng::new(9).vec(k, -1.0, 1.0);
        let mut a = vec![BlockQ8::default(); k / 32];
        crate::kernels::qact::quantize_row_q8(&x, &mut a, false);
        let mut acc = [0.0f32; 8];
        for (b, ab) in a.iter().enumerate() {
            let blk = &w[b * kind.block_bytes()..(b + 1) * kind.block_bytes()];
            let (q, d) = crate::kernels::arch::generic::zdot_generic::unpack(kind, blk);
            let wf = crate::testutil::reference(dt, blk, 32);
            for (e, &qe) in q.iter().enumerate() {
                // The unpacked integer times the scale is the reference dequantization.
                assert_eq!(qe as f32 * d, wf[e], "{dt} block {b} element {e}");
            }
            for (l, acc) in acc.iter_mut().enumerate() {
                let lane: i32 = (4 * l..4 * l + 4).map(|e| q[e] * i32::from(ab.qs[e])).sum();
                *acc = (d * ab.d).mul_add(lane as f32, *acc);
            }
        }
        let want = crate::kernels::ggml::hsum8(&acc);
        assert_eq!(dot_scalar(kind, &w, &a).to_bits(), want.to_bits(), "{dt}");
    }
}

#[test]
fn a_symmetric_q4z_tensor_takes_the_q4_0_layout_bit_identically() {
    use crate::kernels::embedding::{embedding, embedding_repacked};
    use crate::kernels::matmul::repack::{Repack, Repacked};
    use crate::kernels::matmul::{matmul_repacked, repack_for};
    use crate::{Isa, ThreadPool};
    // 13 rows: a full group and a ragged one. Every zero 8 (sym: true), then one block's 9.
    let (n, k) = (13, 96);
    let sym = with_zeros(DType::Q4_Z, n, k, 12, |_, _| 8);
    let mut asym = sym.clone();
    asym[7 * DType::Q4_Z.block_bytes() as usize + layout::q4_z::Z.offset] = 9;
    let pool = ThreadPool::new(2).unwrap();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for isa in Isa::available() {
        let rp = repack_for(Numerics::Ggml, isa, &sym, DType::Q4_Z, n, k)
            .unwrap()
            .unwrap();
        assert!(
            matches!(&rp, Repack::Q(r) if r.kind == Format::Q4_0),
            "{isa:?}"
        );
        let general = Repack::Q(Repacked::new(Format::Q4_Z, &sym, n, k / 32));
        for t in [1, 2, 5] {
            let x = Rng::new(50 + t as u32).vec(t * k, -1.0, 1.0);
            let (mut got, mut want) = (vec![f32::NAN; t * n], vec![f32::NAN; t * n]);
            matmul_repacked(isa, &x, t, k, &rp, &mut got, &pool).unwrap();
            matmul_repacked(isa, &x, t, k, &general, &mut want, &pool).unwrap();
            assert_eq!(bits(&got), bits(&want), "{isa:?} t={t}");
        }
        let rp = repack_for(Numerics::Ggml, isa, &asym, DType::Q4_Z, n, k)
            .unwrap()
            .unwrap();
        assert!(
            matches!(&rp, Repack::Q(r) if r.kind == Format::Q4_Z),
            "{isa:?}"
        );
    }
    // Rows read back from the Q4_0 re-lay decode to the stored Q4_Z rows' values.
    let rp = Repack::Q(Repacked::symmetric_q4z_on(&sym, n, k / 32, None).unwrap());
    let ids = [12, 0, 7];
    let (mut got, mut want) = (vec![f32::NAN; 3 * k], vec![f32::NAN; 3 * k]);
    embedding(&sym, DType::Q4_Z, n, k, &ids, &mut want).unwrap();
    embedding_repacked(&rp, &ids, &mut got).unwrap();
    assert_eq!(bits(&got), bits(&want));
}
