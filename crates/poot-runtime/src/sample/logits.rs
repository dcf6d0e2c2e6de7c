//! The sampling step's logit ops: penalties and bias, the guidance mask, top-k ids and
//! logprobs, one row at a time (rows are independent; each is O(V) or O(V + W)).
//!
//! Invariant: a row with any non-finite logit (NaN, +inf or -inf from the model) leaves
//! `adjust_row` and `mask_row` all NaN, so the `Sample` node reports -1 for it rather than
//! drawing from a broken distribution; `logprobs_row` gives NaN for it.

use crate::RuntimeError;

fn invalid(op: &'static str, detail: String) -> RuntimeError {
    RuntimeError::Kernel { op, detail }
}

fn poison_if_broken(row: &mut [f32]) -> bool {
    if row.iter().all(|x| x.is_finite()) {
        return false;
    }
    row.fill(f32::NAN);
    true
}

/// One row's penalties and bias (see `poot_graph::AdjustInputs`).
#[derive(Clone, Copy, Debug)]
pub struct Adjust<'a> {
    pub ids: &'a [i32],
    pub counts: &'a [i32],
    pub bias: &'a [f32],
    pub repetition: f32,
    pub presence: f32,
    pub frequency: f32,
}

/// Applies, per listed id: the repetition penalty (seen ids), then presence and frequency
/// (generated ids), then the bias.
pub fn adjust_row(row: &mut [f32], a: &Adjust<'_>) -> Result<(), RuntimeError> {
    let ok = a.repetition.is_finite()
        && a.repetition > 0.0
        && a.presence.is_finite()
        && a.frequency.is_finite();
    if !ok {
        return Err(invalid(
            "adjust_logits",
            format!(
                "repetition {} (> 0), presence {}, frequency {} must be finite",
                a.repetition, a.presence, a.frequency
            ),
        ));
    }
    if poison_if_broken(row) {
        return Ok(());
    }
    let v = row.len();
    for ((&id, &count), &bias) in a.ids.iter().zip(a.counts).zip(a.bias) {
        if id < 0 {
            continue;
        }
        let Some(x) = row.get_mut(id as usize) else {
            return Err(invalid(
                "adjust_logits",
                format!("token id {id} is outside the vocabulary of {v}"),
            ));
        };
        if !bias.is_finite() && bias != f32::NEG_INFINITY {
            return Err(invalid("adjust_logits", format!("bias {bias} for id {id}")));
        }
        if count >= 0 && a.repetition != 1.0 {
            *x = if *x > 0.0 {
                *x / a.repetition
            } else {
                *x * a.repetition
            };
        }
        if count > 0 {
            *x -= a.presence + a.frequency * count as f32;
        }
        *x += bias;
    }
    Ok(())
}

/// Sets the tokens whose bit is clear in `mask` (ceil(V/32) words) to -inf.
pub fn mask_row(row: &mut [f32], mask: &[i32]) {
    if poison_if_broken(row) {
        return;
    }
    for (w, chunk) in row.chunks_mut(32).enumerate() {
        let bits = mask[w] as u32;
        if bits == u32::MAX {
            continue;
        }
        for (j, x) in chunk.iter_mut().enumerate() {
            if bits >> j & 1 == 0 {
                *x = f32::NEG_INFINITY;
            }
        }
    }
}

/// The ids of the `out.len()` largest values of `row`, largest first, ties by lower id; NaN
/// never ranks; -1 pads when fewer remain.
pub fn top_k_row(row: &[f32], out: &mut [i32]) {
    let k = out.len();
    let mut order: Vec<u32> = (0..row.len() as u32)
        .filter(|&i| !row[i as usize].is_nan())
        .collect();
    let rank = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if k < order.len() {
        order.select_nth_unstable_by(k, rank);
        order.truncate(k);
    }
    order.sort_unstable_by(rank);
    out.fill(-1);
    for (o, &i) in out.iter_mut().zip(&order) {
        *o = i as i32;
    }
}

/// `log_softmax(row)[ids]` into `out`; NaN for id -1 and for a row with a non-finite logit.
pub fn logprobs_row(row: &[f32], ids: &[i32], out: &mut [f32]) -> Result<(), RuntimeError> {
    let v = row.len();
    if let Some(&bad) = ids.iter().find(|&&i| i < -1 || i >= v as i32) {
        return Err(invalid(
            "logprobs",
            format!("token id {bad} is outside the vocabulary of {v}"),
        ));
    }
    if row.iter().any(|x| !x.is_finite()) {
        out.fill(f32::NAN);
        return Ok(());
    }
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
    let lse = f64::from(max) + sum.ln();
    for (o, &id) in out.iter_mut().zip(ids) {
        *o = if id < 0 {
            f32::NAN
        } else {
            (f64::from(row[id as usize]) - lse) as f32
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_then_bias() {
        let mut row = [2.0, -2.0, 1.0, 0.5];
        let a = Adjust {
            ids: &[0, 1, 2, 3, -1],
            counts: &[2, 0, -1, 1, 0],
            bias: &[0.0, 0.0, 5.0, -1.0, 9.0],
            repetition: 2.0,
            presence: 0.5,
            frequency: 0.25,
        };
        adjust_row(&mut row, &a).unwrap();
        // id 0: 2/2 - 0.5 - 0.5; id 1: -2*2 (prompt only); id 2: bias only; id 3: 0.25-0.75-1.
        assert_eq!(row, [0.0, -4.0, 6.0, -1.5]);
    }

    #[test]
    fn broken_rows_become_nan_and_bad_ids_are_errors() {
        let mut row = [1.0, f32::INFINITY];
        let a = Adjust {
            ids: &[0],
            counts: &[1],
            bias: &[0.0],
            repetition: 1.0,
            presence: 0.0,
            frequency: 0.0,
        };
        adjust_row(&mut row, &a).unwrap();
        assert!(row.iter().all(|x| x.is_nan()));
        let mut row = [1.0, 2.0];
        let a = Adjust { ids: &[2], ..a };
        assert!(adjust_row(&mut row, &a).is_err());
    }

    #[test]
    fn mask_bits_select_tokens() {
        let mut row = vec![1.0f32; 40];
        let mut mask = [0i32; 2];
        mask[0] = 1 << 3;
        mask[1] = 1 << 1; // token 33
        mask_row(&mut row, &mask);
        let allowed: Vec<usize> = (0..40).filter(|&i| row[i].is_finite()).collect();
        assert_eq!(allowed, vec![3, 33]);
    }

    #[test]
    fn top_k_and_logprobs() {
        let row = [0.0, 3.0, 1.0, 3.0, f32::NAN];
        let mut ids = [0; 3];
        top_k_row(&row, &mut ids);
        assert_eq!(ids, [1, 3, 2]);
        let mut ids = [0; 6];
        top_k_row(&row, &mut ids);
        assert_eq!(ids, [1, 3, 2, 0, -1, -1]);
        let row = [0.0f32, 1.0, 2.0];
        let mut out = [0.0; 3];
        logprobs_row(&row, &[2, 0, -1], &mut out).unwrap();
        let lse = (1.0f64 + 1f64.exp() + 2f64.exp()).ln();
        assert!((f64::from(out[0]) - (2.0 - lse)).abs() < 1e-6);
        assert!((f64::from(out[1]) + lse).abs() < 1e-6);
        assert!(out[2].is_nan());
        assert!(logprobs_row(&row, &[3], &mut out[..1]).is_err());
    }
}
