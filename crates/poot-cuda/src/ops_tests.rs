//! Unit tests of the launch descriptions: every kernel named in a source, the grids each
//! builder forms, and the argument storage `cuLaunchKernel` reads.

use super::*;

#[test]
fn every_source_names_its_kernels() {
    let names: Vec<&str> = SOURCES.iter().flat_map(|(_, s)| kernel_names(s)).collect();
    for k in [
        "matvec_q8_0",
        "matvec_q4_0",
        "matvec_q4_1",
        "matvec_f16",
        "matvec_f32",
        "matmul_q8_0",
        "matmul_f32",
        "rms_norm_f32",
        "add_f32",
        "mul_f32",
        "silu_f32",
        "gelu_f32",
        "softcap_f32",
        "rope_f32",
        "embedding",
        "gather_rows",
        "slice_cols",
        "stall",
        "kv_write",
        "attn_scores",
        "attn_softmax",
        "attn_out",
        "cast_f32",
    ] {
        assert!(names.contains(&k), "{k} missing from {names:?}");
    }
    assert_eq!(names.len(), 26, "{names:?}");
}

#[test]
fn launches_cover_their_elements_in_blocks_of_block_threads() {
    // One decode per warp of 8 rows, 4 tokens a warp past a single token.
    let l = matvec(DType::Q8_0, 1, 2, 3, 5, 17, 64);
    assert_eq!(
        (l.kernel, l.grid, l.block),
        ("matmul_q8_0", [3, 2, 1], [BLOCK, 1, 1])
    );
    let l = matvec(DType::F16, 1, 2, 3, 1, 8, 64);
    assert_eq!((l.kernel, l.grid), ("matvec_f16", [1, 1, 1]));
    // Elementwise: one thread an element.
    let l = silu(1, 2, 257);
    assert_eq!(
        (l.kernel, l.grid, l.block),
        ("silu_f32", [2, 1, 1], [BLOCK, 1, 1])
    );
    assert_eq!(l.args, [Arg::Ptr(1), Arg::Ptr(2), Arg::I64(257)]);
    assert_eq!(gelu(1, 2, 256).grid, [1, 1, 1]);
    assert_eq!(cast(1, DType::BF16, 2, 513).args[3], Arg::I32(5));
    // Rows on grid y, one thread a column.
    assert_eq!(slice_cols(1, 2, 7, 600, 300, 10).grid, [2, 7, 1]);
    assert_eq!(rms_norm(1, 2, 3, 9, 4096, 1e-6).grid, [9, 1, 1]);
    let s = AttnShape {
        t: 3,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
        block_size: 16,
        max_blocks: 20,
    };
    let a = AttnAddrs {
        q: 1,
        k: 2,
        v: 3,
        out: 4,
        slots: 5,
        seqs: 6,
        positions: 7,
        tables: 8,
        k_cache: 9,
        v_cache: 10,
        scratch: 11,
    };
    let grids = paged_attention(&s, &a, 0.125, 0, 0.0).map(|l| (l.kernel, l.grid, l.block));
    let b = [BLOCK, 1, 1];
    assert_eq!(
        grids,
        [
            ("kv_write", [1, 3, 1], b),
            ("attn_scores", [2, 12, 1], b),
            ("attn_softmax", [12, 1, 1], b),
            ("attn_out", [1, 12, 1], b),
        ]
    );
    assert_eq!(stall(5, 6).block, [32, 1, 1]);
}

#[test]
fn params_point_at_each_value_in_its_low_bytes() {
    let mut p = Params::new(&[Arg::I32(-2), Arg::F32(1.5), Arg::Ptr(0xdead_beef_0000)]);
    let ptrs = p.as_ptr();
    // SAFETY: `ptrs` has three entries, each pointing at a live u64 slot of `p`.
    unsafe {
        assert_eq!(*(*ptrs).cast::<i32>(), -2);
        assert_eq!(*(*ptrs.add(1)).cast::<f32>(), 1.5);
        assert_eq!(*(*ptrs.add(2)).cast::<u64>(), 0xdead_beef_0000);
    }
}
