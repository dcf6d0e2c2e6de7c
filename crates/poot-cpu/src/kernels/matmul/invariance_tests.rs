//! Batch invariance: a token's row of a matmul is the same, bit for bit, whatever tokens share
//! the call, for every weight dtype, both numerics, every ISA this CPU runs and both layouts
//! (stored, and repacked under ggml numerics). This is what makes a request's answer
//! independent of who else is being served, and of how its prefill was chunked.

use super::*;
use crate::kernels::format::DECODABLE;
use crate::testutil::{synthetic_weights, Rng};

/// Rows `[t, n]` of `w` against `x`, through the layout the runtime would use.
#[allow(
    clippy::too_many_arguments,
    reason = "a matmul's operands plus its path"
)]
fn product(
    numerics: Numerics,
    isa: Isa,
    w: &[u8],
    dt: DType,
    (n, k): (usize, usize),
    x: &[f32],
    t: usize,
    pool: &ThreadPool,
) -> Vec<u32> {
    let mut out = vec![f32::NAN; t * n];
    match repack_for(numerics, isa, w, dt, n, k).unwrap() {
        Some(rp) => matmul_repacked(isa, x, t, k, &rp, &mut out, pool).unwrap(),
        None => matmul_numerics(numerics, isa, x, t, k, w, dt, n, &mut out, pool).unwrap(),
    }
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn a_tokens_row_does_not_depend_on_the_tokens_beside_it() {
    let pool = ThreadPool::new(2).unwrap();
    let mut rng = Rng::new(31);
    let mut checked = 0;
    for dt in DECODABLE {
        // 512: whole k-quant super-blocks; 20 and 18 rows: tinyBLAS's `n % 4` both ways; 72 and
        // 76: float `k` with and without 8-lane slices (76 is not a multiple of 8).
        let mut shapes = vec![(20, 512), (18, 512)];
        if matches!(dt, DType::F16 | DType::F32 | DType::BF16) {
            shapes.extend([(12, 72), (12, 76)]);
        }
        for (n, k) in shapes {
            let w = synthetic_weights(dt, n, k, 7);
            // 13 tokens: more than one token group of every tiled path.
            let t = 13;
            let x = rng.vec(t * k, -2.0, 2.0);
            for numerics in [Numerics::Exact, Numerics::Ggml] {
                for isa in Isa::available() {
                    let all = product(numerics, isa, &w, dt, (n, k), &x, t, &pool);
                    for j in [0, 5, 12] {
                        let xj = &x[j * k..(j + 1) * k];
                        let one = product(numerics, isa, &w, dt, (n, k), xj, 1, &pool);
                        assert_eq!(
                            one,
                            all[j * n..(j + 1) * n],
                            "{dt} n={n} k={k} {numerics:?} {isa:?} token {j}"
                        );
                        // Two tokens (the smallest batch) as well as thirteen.
                        let two = &x[j.saturating_sub(1) * k..(j.saturating_sub(1) + 2) * k];
                        let pair = product(numerics, isa, &w, dt, (n, k), two, 2, &pool);
                        let at = if j == 0 { 0 } else { n };
                        assert_eq!(one, pair[at..at + n], "{dt} {numerics:?} {isa:?} pair {j}");
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 0);
}
