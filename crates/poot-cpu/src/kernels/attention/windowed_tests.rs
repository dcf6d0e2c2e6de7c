//! Windowed and soft-capped attention against a dense f64 reference over the same history,
//! with every cache slot outside a token's window poisoned to NaN after the write: a windowed
//! layer that read one would return NaN.

use super::*;
use crate::kernels::attention::{paged_attention_masked, KvCacheMut};
use crate::testutil::Rng;

const BLOCK: usize = 4;

struct Case {
    shape: AttentionShape,
    table: Vec<i32>,
    k_hist: Vec<f32>,
    v_hist: Vec<f32>,
}

fn case(n_heads: usize, n_kv_heads: usize, head_dim: usize, len: usize) -> Case {
    let blocks = len.div_ceil(BLOCK);
    // Scattered physical blocks, in reverse order.
    let table: Vec<i32> = (0..blocks).rev().map(|b| b as i32).collect();
    let mut rng = Rng::new(5);
    let row = n_kv_heads * head_dim;
    Case {
        shape: AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim,
            block_size: BLOCK,
            num_blocks: blocks,
            max_blocks_per_seq: blocks,
            scale: 1.0 / (head_dim as f32).sqrt(),
        },
        table,
        k_hist: rng.vec(len * row, -1.0, 1.0),
        v_hist: rng.vec(len * row, -1.0, 1.0),
    }
}

/// Prefills `len` positions (one step), poisons the slots the last token may not read, then
/// runs the last token again as a decode step (slot -1) under `mask` and `numerics`.
fn run(c: &Case, len: usize, mask: AttentionMask, numerics: Numerics) -> (Vec<f32>, Vec<f32>) {
    let s = c.shape;
    let row = s.n_kv_heads * s.head_dim;
    let slot = |p: usize| c.table[p / BLOCK] * BLOCK as i32 + (p % BLOCK) as i32;
    let mut rng = Rng::new(9);
    let q = rng.vec(s.n_heads * s.head_dim, -1.0, 1.0);
    let cells = s.num_blocks * BLOCK * row;
    let (mut kc, mut vc) = (vec![0.0f32; cells], vec![0.0f32; cells]);
    for p in 0..len {
        let at = slot(p) as usize * row;
        kc[at..at + row].copy_from_slice(&c.k_hist[p * row..(p + 1) * row]);
        vc[at..at + row].copy_from_slice(&c.v_hist[p * row..(p + 1) * row]);
    }
    let pos = len - 1;
    for p in 0..mask.first(pos) {
        let at = slot(p) as usize * row;
        kc[at..at + row].fill(f32::NAN);
        vc[at..at + row].fill(f32::NAN);
    }
    let inputs = AttentionInputs {
        q: &q,
        k: &vec![0.0; row],
        v: &vec![0.0; row],
        slot_mapping: &[-1],
        token_seq: &[0],
        positions: &[pos as i32],
        block_tables: &c.table,
    };
    let mut out = vec![f32::NAN; s.n_heads * s.head_dim];
    let pool = ThreadPool::new(2).unwrap();
    let cache = KvCacheMut {
        k: &mut kc,
        v: &mut vc,
    };
    paged_attention_masked(numerics, mask, &s, &inputs, cache, &mut out, &pool).unwrap();
    (q, out)
}

/// Dense attention of one token at `pos` over positions `first(pos)..=pos`, in f64.
fn reference(c: &Case, q: &[f32], pos: usize, mask: AttentionMask) -> Vec<f64> {
    let s = c.shape;
    let (hd, row) = (s.head_dim, s.n_kv_heads * s.head_dim);
    let group = s.n_heads / s.n_kv_heads;
    let mut out = vec![0.0f64; s.n_heads * hd];
    for h in 0..s.n_heads {
        let kvh = h / group;
        let span = mask.first(pos)..=pos;
        let scores: Vec<f64> = span
            .clone()
            .map(|p| {
                let k = &c.k_hist[p * row + kvh * hd..][..hd];
                let dot: f64 = (0..hd)
                    .map(|d| f64::from(q[h * hd + d]) * f64::from(k[d]))
                    .sum();
                let sc = dot * f64::from(s.scale);
                if mask.softcap > 0.0 {
                    let cap = f64::from(mask.softcap);
                    (sc / cap).tanh() * cap
                } else {
                    sc
                }
            })
            .collect();
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        for (p, w) in span.zip(&e) {
            for d in 0..hd {
                out[h * hd + d] += w / z * f64::from(c.v_hist[p * row + kvh * hd + d]);
            }
        }
    }
    out
}

#[test]
fn windowed_layers_never_read_outside_the_window() {
    let c = case(4, 2, 16, 14);
    for numerics in [Numerics::Exact, Numerics::Ggml] {
        for window in [1, 3, 5, 8, 14, 20] {
            let mask = AttentionMask {
                window,
                softcap: 0.0,
            };
            let (q, got) = run(&c, 14, mask, numerics);
            let want = reference(&c, &q, 13, mask);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(*g) - w).abs() <= 1e-5,
                    "{numerics:?} window {window} [{i}]: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn soft_capped_scores_with_and_without_a_window() {
    // Large scores so the cap bites (|s| well above the cap).
    let mut c = case(2, 1, 32, 11);
    c.shape.scale = 4.0;
    for numerics in [Numerics::Exact, Numerics::Ggml] {
        for window in [0, 4] {
            let mask = AttentionMask {
                window,
                softcap: 2.5,
            };
            let (q, got) = run(&c, 11, mask, numerics);
            let want = reference(&c, &q, 10, mask);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(*g) - w).abs() <= 1e-5,
                    "{numerics:?} window {window} [{i}]: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn an_empty_mask_is_the_unmasked_kernel_and_a_bad_cap_is_refused() {
    let c = case(4, 2, 16, 9);
    let none = AttentionMask::default();
    assert!(none.is_none());
    let (_, a) = run(&c, 9, none, Numerics::Exact);
    let (_, b) = run(
        &c,
        9,
        AttentionMask {
            window: 9,
            softcap: 0.0,
        },
        Numerics::Exact,
    );
    // A window as long as the sequence reads the same positions, in the same order.
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    let s = c.shape;
    let row = s.n_kv_heads * s.head_dim;
    let (mut kc, mut vc) = (
        vec![0.0; s.num_blocks * BLOCK * row],
        vec![0.0; s.num_blocks * BLOCK * row],
    );
    let inputs = AttentionInputs {
        q: &vec![0.0; s.n_heads * s.head_dim],
        k: &vec![0.0; row],
        v: &vec![0.0; row],
        slot_mapping: &[-1],
        token_seq: &[0],
        positions: &[0],
        block_tables: &c.table,
    };
    let bad = AttentionMask {
        window: 0,
        softcap: f32::NAN,
    };
    let cache = KvCacheMut {
        k: &mut kc,
        v: &mut vc,
    };
    let mut out = vec![0.0; s.n_heads * s.head_dim];
    let pool = ThreadPool::new(1).unwrap();
    assert!(
        paged_attention_masked(Numerics::Exact, bad, &s, &inputs, cache, &mut out, &pool).is_err()
    );
}
