//! `heads_f16` and `paged_grouped` against the per-head path, bit for bit.

use super::*;
use crate::kernels::attention::ggml_heads::head;
use crate::testutil::Rng;
use half::f16;

#[test]
fn grouped_heads_are_bit_identical_to_the_per_head_path() {
    if crate::Isa::detect() == crate::Isa::Scalar {
        return;
    }
    let mut rng = Rng::new(12);
    // (hd, g, lens of the tile's tokens): one token; ragged and whole groups of 8; a
    // shorter token after a longer one (its last group's later rows are in the block);
    // several position blocks; hd without AVX-512's 16-wide V.
    for (hd, g, lens) in [
        (64, 3, &[1][..]),
        (64, 3, &[37][..]),
        (64, 7, &[200, 201, 202][..]),
        (128, 4, &[9, 3, 16, 8][..]),
        (72, 2, &[50, 49][..]),
        (8, 2, &[300, 1, 299, 64, 65, 130, 7, 8][..]),
        (64, 4, &[129, 130, 131, 132, 133, 134, 135, 136][..]),
    ] {
        check(&mut rng, hd, g, lens, 3.0);
    }
}

/// `heads_f16` for one tile (`lens`, `g` heads of `hd`, queries in `-qmax..qmax`) against
/// `head` per token and head, bit for bit.
fn check(rng: &mut Rng, hd: usize, g: usize, lens: &[usize], qmax: f32) {
    let len = lens.iter().copied().max().unwrap();
    // Two KV heads per cache row; this group reads the second (offset hd).
    let (kv_heads, slots) = (2, len + 5);
    let row = kv_heads * hd;
    let (kc, vc) = (
        rng.f16_vec(slots * row, -2.0, 2.0),
        rng.f16_vec(slots * row, -2.0, 2.0),
    );
    // Scattered slots: position p lives at slot (p * 7 + 3) % slots, kept unique.
    let slot = |p: usize| (p * 7 + 3) % slots;
    let row_of = |p: usize| slot(p) * row + hd;
    let tt = lens.len();
    let q = rng.vec(tt * g * hd, -qmax, qmax);
    let scale = (hd as f32).powf(-0.5);
    let mut want = vec![0.0f32; tt * g * hd];
    let mut sc = Scratch::default();
    for (j, &l) in lens.iter().enumerate() {
        for h in 0..g {
            let at = (j * g + h) * hd;
            let (qh, oh) = (&q[at..at + hd], &mut want[at..at + hd]);
            head(true, qh, &kc, &vc, row_of, l, scale, &mut sc, oh);
        }
    }
    let mut got = vec![f32::NAN; tt * g * hd];
    let mut gs = Scratch::default();
    let q_of = |j: usize| &q[j * g * hd..(j + 1) * g * hd];
    let caches = (&kc[..], &vc[..]);
    // SAFETY: a SIMD Isa was detected (AVX2, FMA, F16C).
    unsafe { heads_f16(hd, g, q_of, lens, caches, row_of, scale, &mut gs, &mut got) };
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&want), "hd={hd} g={g} lens={lens:?}");
}

/// One token: `grouped_one` (AVX-512, 1 to 3 heads; the tiled path elsewhere and for 4 to 8),
/// lengths around the 8-position steps, head sizes of 16 to 128 (72: no 16-wide V, the tiled
/// path), and large queries whose softmax has zero weights.
#[test]
fn one_token_heads_are_bit_identical_to_the_per_head_path() {
    if crate::Isa::detect() == crate::Isa::Scalar {
        return;
    }
    let mut rng = Rng::new(13);
    for hd in [16, 64, 72, 128] {
        for g in 1..=8 {
            for len in [1, 2, 7, 8, 9, 16, 17, 63, 130] {
                check(&mut rng, hd, g, &[len], 3.0);
            }
        }
        check(&mut rng, hd, 3, &[100], 60.0);
    }
}

/// A whole paged step through `paged_attention_numerics` (ggml numerics, the grouped
/// path): two sequences' tokens interleaved (runs split inside a tile), more tokens than a
/// tile, a reused cache, on 1 and 2 threads, against `head` per token and head.
#[test]
fn paged_tiles_match_the_per_head_path_across_sequences() {
    use crate::kernels::attention::kv::{block_slot, AttentionInputs, AttentionShape, KvCacheMut};
    use crate::kernels::attention::paged_attention_numerics;
    use crate::kernels::ggml::Numerics;
    if crate::Isa::detect() == crate::Isa::Scalar {
        return;
    }
    let (nh, nkv, hd, bs) = (8, 2, 64, 16);
    let shape = AttentionShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        block_size: bs,
        num_blocks: 12,
        max_blocks_per_seq: 5,
        scale: 0.125,
    };
    // Sequence 0 in blocks 7, 2, 9, 0; sequence 1 in 4, 11, 1.
    let tables: Vec<i32> = vec![7, 2, 9, 0, -1, 4, 11, 1, -1, -1];
    // Sequence 0 already holds 20 positions, sequence 1 holds 5.
    let toks: Vec<(i32, i32)> = (20..30)
        .map(|p| (0, p))
        .chain((5..9).map(|p| (1, p)))
        .chain([(0, 30), (0, 31), (1, 9)])
        .collect();
    let t = toks.len();
    let mut rng = Rng::new(77);
    let row = nkv * hd;
    let cache: Vec<f16> = rng.f16_vec(shape.num_blocks * bs * row, -2.0, 2.0);
    let (q, k, v) = (
        rng.vec(t * nh * hd, -2.0, 2.0),
        rng.vec(t * row, -2.0, 2.0),
        rng.vec(t * row, -2.0, 2.0),
    );
    let slot_of = |seq: i32, p: i32| block_slot(&tables[seq as usize * 5..], bs, p as usize) as i32;
    let slots: Vec<i32> = toks.iter().map(|&(s, p)| slot_of(s, p)).collect();
    let seqs: Vec<i32> = toks.iter().map(|&(s, _)| s).collect();
    let positions: Vec<i32> = toks.iter().map(|&(_, p)| p).collect();
    let inputs = AttentionInputs {
        q: &q,
        k: &k,
        v: &v,
        slot_mapping: &slots,
        token_seq: &seqs,
        positions: &positions,
        block_tables: &tables,
    };
    let mut runs = Vec::new();
    let (mut kc, mut vc) = (cache.clone(), cache.clone());
    for threads in [1, 2] {
        let (mut k1, mut v1) = (cache.clone(), cache.clone());
        let mut out = vec![f32::NAN; t * nh * hd];
        let pool = crate::ThreadPool::new(threads).unwrap();
        let kv = KvCacheMut {
            k: &mut k1,
            v: &mut v1,
        };
        paged_attention_numerics(Numerics::Ggml, &shape, &inputs, kv, &mut out, &pool).unwrap();
        (kc, vc) = (k1, v1);
        runs.push(out);
    }
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&runs[0]), bits(&runs[1]), "thread count");
    let mut sc = Scratch::default();
    let mut want = vec![0.0f32; hd];
    for (i, &(seq, pos)) in toks.iter().enumerate() {
        for h in 0..nh {
            let kvh = h / (nh / nkv);
            let row_of = |p: usize| slot_of(seq, p as i32) as usize * row + kvh * hd;
            let at = (i * nh + h) * hd;
            let qh = &q[at..at + hd];
            let len = pos as usize + 1;
            head(true, qh, &kc, &vc, row_of, len, 0.125, &mut sc, &mut want);
            assert_eq!(
                bits(&runs[0][at..at + hd]),
                bits(&want),
                "token {i} head {h}"
            );
        }
    }
}
