//! The sampling step's row functions, shared by every runtime that samples on the host side
//! of its device (the CPU runtime, and the wgpu runtime's host step): the `Sample` node here,
//! the logit ops (`adjust_logits`, `mask_logits`, `top_k`, `logprobs`) in `logits`.
//!
//! `Sample` semantics (the numpy reference in tests/numpy_runtime.py follows them exactly):
//! - A row holding a NaN or +inf, or with every logit -inf (nothing allowed), gives -1: the
//!   host ends that request with an error finish reason instead of emitting a garbage token.
//! - Temperature 0 is argmax (the first maximum).
//! - Otherwise, over x = logits / temperature with the -inf tokens dropped: top-k (k > 0) keeps
//!   the k largest; the kept tokens are ordered by descending x, ties by lower id (a total
//!   order); top-p keeps the shortest prefix whose probability mass reaches p (mass over every
//!   top-k survivor); min-p keeps tokens whose probability is at least min_p times the top
//!   token's; the row's uniform draw u picks the first kept token whose cumulative
//!   probability (renormalized over the kept set) exceeds u.
//!
//! Cost: O(V) for the softmax terms, plus sorting only a prefix of the candidates: the prefix
//! grows (256, then x4) until it covers the top-p cut and the draw, so a peaked distribution
//! never sorts the whole vocabulary.

mod logits;

pub use logits::{adjust_row, logprobs_row, mask_row, top_k_row, Adjust};

use crate::RuntimeError;

fn invalid(detail: String) -> RuntimeError {
    RuntimeError::Kernel {
        op: "sample",
        detail,
    }
}

/// Index of the first maximum; NaN never wins (0 when every value is NaN).
///
/// Two branch-free passes (the maximum over 16 lanes, which the compiler vectorizes, then the
/// first index holding it) instead of one compare-and-branch per value: greedy decoding runs
/// this over the whole vocabulary every step.
fn argmax(row: &[f32]) -> usize {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = row.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = m.max(x); // `max` ignores a NaN operand
        }
    }
    let m = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    // The first chunk holding `m`, then its first `m`: each chunk's test folds without an
    // early exit, so it vectorizes (with `has_bad_logit`'s, the sampler went from 0.65% to
    // 0.30% of a SmolLM2 decode's samples: plain `position`/`any` were scalar loops).
    let c = row
        .chunks(SCAN)
        .position(|c| c.iter().fold(false, |f, &x| f | (x == m)))
        .unwrap_or(0);
    let at = row[c * SCAN..].iter().position(|&x| x == m).unwrap_or(0);
    c * SCAN + at
}

/// Values per chunk of the sampler's vectorized scans.
const SCAN: usize = 256;

/// True when `row` holds a NaN or +inf (the model's output is broken).
pub fn has_bad_logit(row: &[f32]) -> bool {
    // Per chunk without an early exit, so it vectorizes (see `argmax`).
    row.chunks(SCAN).any(|c| {
        c.iter()
            .fold(false, |f, &x| f | x.is_nan() | (x == f32::INFINITY))
    })
}

/// Per-row sampling settings (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct SampleSettings {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub uniform: f32,
}

impl SampleSettings {
    /// Refuses impossible settings (the host validates them first; this is a safety net).
    pub fn check(&self) -> Result<(), RuntimeError> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(invalid(format!(
                "temperature must be finite and >= 0, got {t}"
            )));
        }
        let ok = self.top_p > 0.0
            && self.top_p <= 1.0
            && self.top_k >= 0
            && (0.0..1.0).contains(&self.min_p)
            && (0.0..1.0).contains(&self.uniform);
        if !ok {
            return Err(invalid(format!(
                "top_k {}, top_p {}, min_p {}, uniform {}",
                self.top_k, self.top_p, self.min_p, self.uniform
            )));
        }
        Ok(())
    }
}

/// Descending by value, ties by lower id.
fn rank(x: &[f32]) -> impl Fn(&u32, &u32) -> std::cmp::Ordering + '_ {
    move |&a, &b| x[b as usize].total_cmp(&x[a as usize]).then(a.cmp(&b))
}

/// Sorts the first `n` entries of `order` into rank order (the rest stay unsorted).
fn sort_prefix(order: &mut [u32], x: &[f32], n: usize) {
    let n = n.min(order.len());
    if n < order.len() {
        order.select_nth_unstable_by(n, rank(x));
    }
    order[..n].sort_unstable_by(rank(x));
}

/// Samples one id from `row` (the logits of one sequence); -1 when the row is unusable.
pub fn sample_row(row: &[f32], s: SampleSettings) -> Result<i32, RuntimeError> {
    if row.is_empty() {
        return Err(invalid("empty logits row".into()));
    }
    s.check()?;
    if has_bad_logit(row) {
        return Ok(-1);
    }
    let best = argmax(row);
    if row[best] == f32::NEG_INFINITY {
        return Ok(-1);
    }
    if s.temperature == 0.0 {
        return Ok(best as i32);
    }
    let max = row[best];
    let mut order: Vec<u32> = (0..row.len() as u32)
        .filter(|&i| row[i as usize] > f32::NEG_INFINITY)
        .collect();
    if s.top_k > 0 && (s.top_k as usize) < order.len() {
        let k = s.top_k as usize;
        order.select_nth_unstable_by(k - 1, rank(row));
        order.truncate(k);
    }
    // Unnormalized probabilities; the top token's is exactly 1.
    let inv_t = 1.0 / f64::from(s.temperature);
    let weight = |i: u32| ((f64::from(row[i as usize]) - f64::from(max)) * inv_t).exp();
    let total: f64 = order.iter().map(|&i| weight(i)).sum();
    let min_p = f64::from(s.min_p);
    let min_p_count = if min_p > 0.0 {
        order.iter().filter(|&&i| weight(i) >= min_p).count()
    } else {
        order.len()
    };
    let mut sorted = 0;
    let grow = |sorted: &mut usize, need: usize, order: &mut Vec<u32>| {
        if need > *sorted {
            let n = (need.max(256)).max(*sorted * 4).min(order.len());
            sort_prefix(order, row, n);
            *sorted = n;
        }
    };
    // The kept prefix: shortest reaching top_p of the mass, at most the min-p survivors.
    let (mut keep, mut kept_mass) = (order.len().min(min_p_count), total);
    if s.top_p < 1.0 || keep < order.len() {
        let target = f64::from(s.top_p) * total;
        let mut acc = 0.0;
        let mut i = 0;
        loop {
            if i == keep {
                break;
            }
            grow(&mut sorted, i + 1, &mut order);
            acc += weight(order[i]);
            i += 1;
            if s.top_p < 1.0 && acc >= target {
                break;
            }
        }
        keep = i;
        kept_mass = acc;
    }
    let target = f64::from(s.uniform) * kept_mass;
    let mut acc = 0.0;
    for i in 0..keep {
        grow(&mut sorted, i + 1, &mut order);
        acc += weight(order[i]);
        if target < acc {
            return Ok(order[i] as i32);
        }
    }
    grow(&mut sorted, keep, &mut order);
    Ok(order[keep - 1] as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(row: &[f32], t: f32, top_k: i32, top_p: f32, min_p: f32, u: f32) -> i32 {
        let s = SampleSettings {
            temperature: t,
            top_k,
            top_p,
            min_p,
            uniform: u,
        };
        sample_row(row, s).unwrap()
    }

    #[test]
    fn greedy_is_first_argmax() {
        assert_eq!(draw(&[1.0, 3.0, 3.0, -1.0], 0.0, 0, 1.0, 0.0, 0.5), 1);
        // Against the one-pass definition, over lengths around the 16 lanes, the tail and the
        // scan's chunks.
        let naive = |row: &[f32]| {
            let mut best = 0;
            for (i, &x) in row.iter().enumerate() {
                if x > row[best] || row[best].is_nan() && !x.is_nan() {
                    best = i;
                }
            }
            best
        };
        for len in [1, 15, 16, 17, 40, 255, 256, 257, 1000] {
            for at in [0, len / 2, len - 1] {
                let mut row: Vec<f32> = (0..len).map(|i| ((i * 37) % 11) as f32).collect();
                row[at] = 50.0;
                if len > 2 {
                    row[len - 2] = 50.0; // a tie: the first wins
                    row[1] = f32::NAN;
                }
                assert_eq!(argmax(&row), naive(&row), "len {len} at {at}");
            }
        }
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 1);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    }

    #[test]
    fn broken_rows_give_minus_one() {
        assert_eq!(draw(&[f32::NAN, 2.0], 0.0, 0, 1.0, 0.0, 0.0), -1);
        assert_eq!(draw(&[f32::INFINITY, 2.0], 1.0, 0, 1.0, 0.0, 0.0), -1);
        let none = [f32::NEG_INFINITY; 3];
        assert_eq!(draw(&none, 0.0, 0, 1.0, 0.0, 0.0), -1);
        assert_eq!(draw(&none, 1.0, 0, 1.0, 0.0, 0.0), -1);
        // -inf alone is a masked token, not an error.
        assert_eq!(draw(&[f32::NEG_INFINITY, 0.0], 1.0, 0, 1.0, 0.0, 0.9), 1);
        // A bad value past the scan's first chunks, or in the last short one.
        for at in [700, 999] {
            for bad in [f32::NAN, f32::INFINITY] {
                let mut row = vec![1.0f32; 1000];
                row[at] = bad;
                assert_eq!(draw(&row, 0.0, 0, 1.0, 0.0, 0.0), -1, "{bad} at {at}");
            }
        }
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        for u in [0.0, 0.3, 0.999] {
            assert_eq!(draw(&[0.1, 0.2, 5.0, 0.3], 2.0, 1, 1.0, 0.0, u), 2);
        }
    }

    #[test]
    fn uniform_draw_walks_the_distribution() {
        // Two equal logits: probability 0.5 each; ties order by id.
        let row = [0.0, 0.0];
        assert_eq!(draw(&row, 1.0, 0, 1.0, 0.0, 0.25), 0);
        assert_eq!(draw(&row, 1.0, 0, 1.0, 0.0, 0.75), 1);
    }

    #[test]
    fn top_p_cuts_the_tail() {
        // p(2) ~ 0.84 >= 0.8: only token 2 survives.
        let row = [0.0, 1.0, 3.0];
        for u in [0.0, 0.5, 0.99] {
            assert_eq!(draw(&row, 1.0, 0, 0.8, 0.0, u), 2);
        }
    }

    #[test]
    fn min_p_cuts_relative_to_the_top() {
        // p ratios to the top: 1, e^-1 ~ 0.37, e^-3 ~ 0.05. min_p 0.1 keeps ids 2 and 1.
        let row = [0.0, 2.0, 3.0];
        assert_eq!(draw(&row, 1.0, 0, 1.0, 0.1, 0.999), 1);
        assert_eq!(draw(&row, 1.0, 0, 1.0, 0.5, 0.999), 2);
    }

    #[test]
    fn large_flat_rows_sort_past_the_first_prefix() {
        // 5000 equal logits: the draw lands deep in the order, past the first 256.
        let row = vec![0.0f32; 5000];
        assert_eq!(draw(&row, 1.0, 0, 1.0, 0.0, 0.9001), 4500);
        assert_eq!(draw(&row, 1.0, 0, 0.5, 0.0, 0.5), 1250);
    }

    #[test]
    fn impossible_settings_are_errors() {
        let bad = |t: f32, k: i32, p: f32, m: f32, u: f32| {
            let s = SampleSettings {
                temperature: t,
                top_k: k,
                top_p: p,
                min_p: m,
                uniform: u,
            };
            sample_row(&[1.0], s).is_err()
        };
        assert!(bad(-1.0, 0, 1.0, 0.0, 0.0));
        assert!(bad(1.0, 0, 0.0, 0.0, 0.0));
        assert!(bad(1.0, -2, 1.0, 0.0, 0.0));
        assert!(bad(1.0, 0, 1.0, 0.0, 1.0));
        assert!(bad(1.0, 0, 1.0, 1.0, 0.0));
        assert!(sample_row(
            &[],
            SampleSettings {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                uniform: 0.0
            }
        )
        .is_err());
    }
}
