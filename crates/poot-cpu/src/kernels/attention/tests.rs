//! Paged attention against a naive dense causal attention in f64 over the same K/V history.
//!
//! Bound per output element of a token attending to `L` positions: with `S = max_p scale *
//! sum_d |q_d k_pd|`, `R = max_p (s_max - s_p)` and `V = max_{p,d} |v_pd|`,
//! `|got - exact| <= 2 * V * (2 * (hd / 8 + 8) * 2^-24 * S + (4 + R) * 2^-24 + 2 * (L + 4) *
//! 2^-24)`: score rounding perturbs the softmax weights relatively, the f32 subtraction feeds
//! `exp`, and the weighted sum and the normalizer accumulate `L` terms in f32.

#![allow(
    clippy::needless_range_loop,
    reason = "index-heavy numerical references"
)]

use super::*;
use crate::testutil::Rng;

const ULP: f64 = 1.0 / 16_777_216.0;

/// One position's K and V rows (`n_kv_heads * head_dim` each).
type Rows = (Vec<f32>, Vec<f32>);

/// A token of a step: its sequence, its position, and whether its K/V are written.
#[derive(Clone, Copy)]
struct Tok(usize, usize, bool);

struct World {
    shape: AttentionShape,
    tables: Vec<Vec<i32>>,
    /// Per sequence, per position: the K and V rows (`n_kv_heads * head_dim`) in the cache.
    hist: Vec<Vec<Option<Rows>>>,
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
    rng: Rng,
}

impl World {
    fn new(shape: AttentionShape, tables: Vec<Vec<i32>>) -> Self {
        let len = shape.num_blocks * shape.block_size * shape.n_kv_heads * shape.head_dim;
        let cap = shape.max_blocks_per_seq * shape.block_size;
        World {
            shape,
            hist: vec![vec![None; cap]; tables.len()],
            tables,
            // Stale garbage in unwritten slots must never be read.
            k_cache: vec![f32::NAN; len],
            v_cache: vec![f32::NAN; len],
            rng: Rng::new(17),
        }
    }

    fn step(&mut self, toks: &[Tok]) {
        let s = self.shape;
        let (t, kv_row, q_row) = (
            toks.len(),
            s.n_kv_heads * s.head_dim,
            s.n_heads * s.head_dim,
        );
        let q = self.rng.vec(t * q_row, -1.0, 1.0);
        let k = self.rng.vec(t * kv_row, -1.0, 1.0);
        let v = self.rng.vec(t * kv_row, -1.0, 1.0);
        let mb = s.max_blocks_per_seq;
        let mut block_tables = vec![-1; self.tables.len() * mb];
        for (seq, tb) in self.tables.iter().enumerate() {
            block_tables[seq * mb..seq * mb + tb.len()].copy_from_slice(tb);
        }
        let slot = |&Tok(seq, pos, write): &Tok| {
            let blk = self.tables[seq][pos / s.block_size];
            if write {
                blk * s.block_size as i32 + (pos % s.block_size) as i32
            } else {
                -1
            }
        };
        let slot_mapping: Vec<i32> = toks.iter().map(slot).collect();
        let token_seq: Vec<i32> = toks.iter().map(|t| t.0 as i32).collect();
        let positions: Vec<i32> = toks.iter().map(|t| t.1 as i32).collect();
        let inputs = AttentionInputs {
            q: &q,
            k: &k,
            v: &v,
            slot_mapping: &slot_mapping,
            token_seq: &token_seq,
            positions: &positions,
            block_tables: &block_tables,
        };
        for (i, &Tok(seq, pos, write)) in toks.iter().enumerate() {
            if write {
                let rows = (
                    k[i * kv_row..(i + 1) * kv_row].to_vec(),
                    v[i * kv_row..(i + 1) * kv_row].to_vec(),
                );
                self.hist[seq][pos] = Some(rows);
            }
        }
        // Run on a copy with one thread and on the real caches with three: same bits.
        let (mut k1, mut v1) = (self.k_cache.clone(), self.v_cache.clone());
        let mut out1 = vec![f32::NAN; t * q_row];
        let one = ThreadPool::new(1).unwrap();
        let cache = KvCacheMut {
            k: &mut k1,
            v: &mut v1,
        };
        paged_attention(&s, &inputs, cache, &mut out1, &one).unwrap();
        let mut out = vec![f32::NAN; t * q_row];
        let three = ThreadPool::new(3).unwrap();
        let cache = KvCacheMut {
            k: &mut self.k_cache,
            v: &mut self.v_cache,
        };
        paged_attention(&s, &inputs, cache, &mut out, &three).unwrap();
        assert!(
            out.iter()
                .zip(&out1)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "thread count"
        );
        self.check(toks, &q, &out);
    }

    fn check(&self, toks: &[Tok], q: &[f32], out: &[f32]) {
        let s = self.shape;
        let (hd, group) = (s.head_dim, s.n_heads / s.n_kv_heads);
        for (i, &Tok(seq, pos, _)) in toks.iter().enumerate() {
            for h in 0..s.n_heads {
                let qh = &q[(i * s.n_heads + h) * hd..][..hd];
                let kvh = h / group;
                let rows: Vec<&Rows> = (0..=pos)
                    .map(|p| self.hist[seq][p].as_ref().expect("position written before"))
                    .collect();
                let (mut scores, mut big_s) = (Vec::new(), 0.0f64);
                for (kr, _) in &rows {
                    let kh = &kr[kvh * hd..(kvh + 1) * hd];
                    let dot: f64 = qh
                        .iter()
                        .zip(kh)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    let abs: f64 = qh
                        .iter()
                        .zip(kh)
                        .map(|(&a, &b)| f64::from(a * b).abs())
                        .sum();
                    scores.push(dot * f64::from(s.scale));
                    big_s = big_s.max(abs * f64::from(s.scale));
                }
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let range = scores.iter().map(|&x| m - x).fold(0.0, f64::max);
                let e: Vec<f64> = scores.iter().map(|&x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                let vmax = rows
                    .iter()
                    .flat_map(|(_, vr)| vr[kvh * hd..(kvh + 1) * hd].iter())
                    .fold(0.0f64, |a, &b| a.max(f64::from(b).abs()));
                let l = (pos + 1) as f64;
                let tol = 2.0
                    * vmax
                    * (2.0 * (hd as f64 / 8.0 + 8.0) * ULP * big_s
                        + (4.0 + range) * ULP
                        + 2.0 * (l + 4.0) * ULP);
                for d in 0..hd {
                    let want: f64 = rows
                        .iter()
                        .zip(&e)
                        .map(|((_, vr), &w)| w / z * f64::from(vr[kvh * hd + d]))
                        .sum();
                    let got = f64::from(out[(i * s.n_heads + h) * hd + d]);
                    assert!(
                        (got - want).abs() <= tol,
                        "token {i} (seq {seq} pos {pos}) head {h} [{d}]: {got} vs {want}, tol {tol:e}"
                    );
                }
            }
        }
    }
}

fn gqa_shape() -> AttentionShape {
    AttentionShape {
        n_heads: 6,
        n_kv_heads: 2,
        head_dim: 8,
        block_size: 4,
        num_blocks: 16,
        max_blocks_per_seq: 4,
        scale: 1.0 / 8f32.sqrt(),
    }
}

#[test]
fn matches_dense_causal_attention_over_steps_with_gqa_and_scattered_blocks() {
    let tables = vec![vec![5, 11, 2, 8], vec![9, 0, 14, 7], vec![3, 12, 1, 15]];
    let mut w = World::new(gqa_shape(), tables);
    // Step 1: two prompts' first chunks, interleaved.
    let step1: Vec<Tok> = [
        (0, 0),
        (1, 0),
        (0, 1),
        (0, 2),
        (1, 1),
        (0, 3),
        (1, 2),
        (0, 4),
        (1, 3),
        (0, 5),
    ]
    .map(|(s, p)| Tok(s, p, true))
    .to_vec();
    w.step(&step1);
    // Step 2: a chunk of seq 1, a decode token of seq 0, and a new prompt (seq 2).
    let mut step2: Vec<Tok> = (4..10).map(|p| Tok(1, p, true)).collect();
    step2.push(Tok(0, 6, true));
    step2.extend((0..3).map(|p| Tok(2, p, true)));
    w.step(&step2);
    // Step 3: decode tokens, and a recomputed token whose K/V are already cached (slot -1).
    w.step(&[
        Tok(0, 7, true),
        Tok(2, 3, true),
        Tok(0, 6, false),
        Tok(1, 10, true),
    ]);
    // Step 4: the rest of seq 2 up to the last position its table can hold.
    w.step(&(4..16).map(|p| Tok(2, p, true)).collect::<Vec<_>>());
}

#[test]
fn multi_head_with_odd_sizes() {
    // MHA (group 1), a head size that is not a multiple of 8, a block size of 3.
    let shape = AttentionShape {
        n_heads: 3,
        n_kv_heads: 3,
        head_dim: 20,
        block_size: 3,
        num_blocks: 9,
        max_blocks_per_seq: 4,
        scale: 0.3,
    };
    let mut w = World::new(shape, vec![vec![8, 1, 4, 6], vec![0, 7]]);
    w.step(
        &(0..7)
            .map(|p| Tok(0, p, true))
            .chain([Tok(1, 0, true)])
            .collect::<Vec<_>>(),
    );
    w.step(&[
        Tok(1, 1, true),
        Tok(0, 7, true),
        Tok(1, 2, true),
        Tok(1, 3, true),
    ]);
}

/// A small valid call, for the error tests to break one thing at a time.
struct Case {
    q: Vec<f32>,
    k: Vec<f32>,
    slots: Vec<i32>,
    seqs: Vec<i32>,
    pos: Vec<i32>,
    tables: Vec<i32>,
}

fn run_case(shape: &AttentionShape, c: &Case) -> Result<(), KernelError> {
    // The caches always have `gqa_shape()`'s size, so a wrong shape shows as a length error.
    let g = gqa_shape();
    let kv = g.num_blocks * g.block_size * g.n_kv_heads * g.head_dim;
    let (mut kc, mut vc) = (vec![0.5f32; kv], vec![0.5f32; kv]);
    let mut out = vec![9.0f32; c.q.len()];
    let inputs = AttentionInputs {
        q: &c.q,
        k: &c.k,
        v: &c.k,
        slot_mapping: &c.slots,
        token_seq: &c.seqs,
        positions: &c.pos,
        block_tables: &c.tables,
    };
    let pool = ThreadPool::new(2).unwrap();
    let r = paged_attention(
        shape,
        &inputs,
        KvCacheMut {
            k: &mut kc,
            v: &mut vc,
        },
        &mut out,
        &pool,
    );
    if r.is_err() {
        assert!(
            kc.iter().chain(&vc).all(|&x| x == 0.5),
            "cache written on error"
        );
        assert!(out.iter().all(|&x| x == 9.0), "out written on error");
    }
    r
}

#[test]
fn bad_indices_and_shapes_are_typed_errors_that_write_nothing() {
    let s = gqa_shape();
    let base = || Case {
        q: vec![0.1; 2 * 6 * 8],
        k: vec![0.2; 2 * 2 * 8],
        slots: vec![20, 21],
        seqs: vec![0, 0],
        pos: vec![0, 1],
        tables: vec![5, 11, -1, -1, 9, 0, 14, 7],
    };
    run_case(&s, &base()).unwrap();
    let oor = |what, at, value, bound| {
        Err(KernelError::IndexOutOfRange {
            what,
            at,
            value,
            bound,
        })
    };
    let mut c = base();
    c.slots[1] = 64;
    assert_eq!(run_case(&s, &c), oor("attention slot_mapping", 1, 64, 64));
    c.slots[1] = -2;
    assert_eq!(run_case(&s, &c), oor("attention slot_mapping", 1, -2, 64));
    let mut c = base();
    c.seqs[0] = 2;
    assert_eq!(run_case(&s, &c), oor("attention token_seq", 0, 2, 2));
    let mut c = base();
    c.pos[1] = 16;
    assert_eq!(run_case(&s, &c), oor("attention positions", 1, 16, 16));
    c.pos[1] = -1;
    assert_eq!(run_case(&s, &c), oor("attention positions", 1, -1, 16));
    // Position 8 needs logical block 2 of seq 0, which is padding (-1) ... or out of range.
    let mut c = base();
    c.pos[1] = 8;
    c.slots[1] = -1;
    assert_eq!(run_case(&s, &c), oor("attention block_tables", 2, -1, 16));
    c.tables[2] = 16;
    assert_eq!(run_case(&s, &c), oor("attention block_tables", 2, 16, 16));
    // A write slot that disagrees with the block table.
    let mut c = base();
    c.slots[1] = 22;
    assert!(matches!(
        run_case(&s, &c),
        Err(KernelError::InvalidArgument {
            what: "attention slot_mapping",
            ..
        })
    ));
    let mut c = base();
    c.tables.pop();
    assert!(matches!(
        run_case(&s, &c),
        Err(KernelError::InvalidArgument { .. })
    ));
    let mut c = base();
    c.q.pop();
    assert!(matches!(
        run_case(&s, &c),
        Err(KernelError::Length {
            what: "attention q",
            ..
        })
    ));
    let mut bad = s;
    bad.n_kv_heads = 4;
    assert!(matches!(
        run_case(&bad, &base()),
        Err(KernelError::InvalidArgument { .. })
    ));
    bad = s;
    bad.scale = f32::NAN;
    assert!(matches!(
        run_case(&bad, &base()),
        Err(KernelError::InvalidArgument { .. })
    ));
    bad = s;
    bad.num_blocks = 17;
    assert!(matches!(
        run_case(&bad, &base()),
        Err(KernelError::Length {
            what: "attention k_cache",
            ..
        })
    ));
}

#[test]
fn an_empty_step_is_fine() {
    let s = gqa_shape();
    let c = Case {
        q: vec![],
        k: vec![],
        slots: vec![],
        seqs: vec![],
        pos: vec![],
        tables: vec![],
    };
    run_case(&s, &c).unwrap();
}

/// The bulk f32 -> f16 store of new K/V rows rounds as `from_f32` does, value by value:
/// ties, subnormals, overflow, infinities and NaN included, at lengths around 8.
#[test]
fn bulk_kv_store_rounds_like_one_value_at_a_time() {
    use crate::kernels::attention::kv::KvElem;
    let mut rng = crate::testutil::Rng::new(5);
    let mut src = rng.vec(37, -70000.0, 70000.0);
    let specials = [
        0.0,
        -0.0,
        1.0 + 1.0 / 2048.0, // a tie between two halves
        6.0e-8,             // a subnormal half
        1.0e-9,             // below the smallest subnormal
        65520.0,            // rounds to infinity
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    src[..specials.len()].copy_from_slice(&specials);
    for len in [0, 1, 7, 8, 9, 37] {
        let mut bulk = vec![half::f16::ZERO; len];
        half::f16::slice_from_f32(&src[..len], &mut bulk);
        for (i, (b, &x)) in bulk.iter().zip(&src).enumerate() {
            assert_eq!(
                b.to_bits(),
                half::f16::from_f32(x).to_bits(),
                "value {i} of {len}"
            );
        }
    }
}
