//! The CPU sampler: the `Sample` node, one token id per row.
//!
//! Deterministic given the row's uniform draw: temperature 0 is argmax (first maximum);
//! otherwise logits / temperature, then top-k (k > 0), softmax, then top-p (the smallest prefix
//! of tokens by descending probability whose mass reaches p), and the draw picks by cumulative
//! probability. Ties sort by token id, so the order is total. Cost O(V log V) per sampled row.

use crate::KernelError;

fn invalid(detail: String) -> KernelError {
    KernelError::InvalidArgument {
        what: "sample",
        detail,
    }
}

/// Index of the first maximum; NaN never wins.
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] || row[best].is_nan() && !x.is_nan() {
            best = i;
        }
    }
    best
}

/// Samples one id from `row` (the logits of one sequence).
pub(crate) fn sample_row(
    row: &[f32],
    temperature: f32,
    top_k: i32,
    top_p: f32,
    uniform: f32,
) -> Result<i32, KernelError> {
    if row.is_empty() {
        return Err(invalid("empty logits row".into()));
    }
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(invalid(format!(
            "temperature must be finite and >= 0, got {temperature}"
        )));
    }
    if !(top_p > 0.0 && top_p <= 1.0) || top_k < 0 || !(0.0..1.0).contains(&uniform) {
        return Err(invalid(format!(
            "top_k {top_k}, top_p {top_p}, uniform {uniform}"
        )));
    }
    if temperature == 0.0 {
        return Ok(argmax(row) as i32);
    }
    let mut order: Vec<u32> = (0..row.len() as u32)
        .filter(|&i| !row[i as usize].is_nan())
        .collect();
    if order.is_empty() {
        return Err(invalid("every logit is NaN".into()));
    }
    order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    if top_k > 0 {
        order.truncate(top_k as usize);
    }
    let max = row[order[0] as usize] / temperature;
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| f64::from(row[i as usize] / temperature - max).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    let mut keep = probs.len();
    if top_p < 1.0 {
        let mut mass = 0.0;
        for (i, p) in probs.iter().enumerate() {
            mass += p;
            if mass >= f64::from(top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    let kept: f64 = probs[..keep].iter().sum();
    let target = f64::from(uniform) * kept;
    let mut acc = 0.0;
    for (i, p) in probs[..keep].iter().enumerate() {
        acc += p;
        if target < acc {
            return Ok(order[i] as i32);
        }
    }
    Ok(order[keep - 1] as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_first_argmax() {
        assert_eq!(
            sample_row(&[1.0, 3.0, 3.0, -1.0], 0.0, 0, 1.0, 0.5).unwrap(),
            1
        );
        assert_eq!(sample_row(&[f32::NAN, 2.0], 0.0, 0, 1.0, 0.0).unwrap(), 1);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        for u in [0.0, 0.3, 0.999] {
            assert_eq!(
                sample_row(&[0.1, 0.2, 5.0, 0.3], 2.0, 1, 1.0, u).unwrap(),
                2
            );
        }
    }

    #[test]
    fn uniform_draw_walks_the_distribution() {
        // Two equal logits: probability 0.5 each; ties order by id.
        let row = [0.0, 0.0];
        assert_eq!(sample_row(&row, 1.0, 0, 1.0, 0.25).unwrap(), 0);
        assert_eq!(sample_row(&row, 1.0, 0, 1.0, 0.75).unwrap(), 1);
    }

    #[test]
    fn top_p_cuts_the_tail() {
        // p(2) ~ 0.84 >= 0.8: only token 2 survives.
        let row = [0.0, 1.0, 3.0];
        for u in [0.0, 0.5, 0.99] {
            assert_eq!(sample_row(&row, 1.0, 0, 0.8, u).unwrap(), 2);
        }
    }

    #[test]
    fn impossible_settings_are_errors() {
        assert!(sample_row(&[1.0], -1.0, 0, 1.0, 0.0).is_err());
        assert!(sample_row(&[1.0], 1.0, 0, 0.0, 0.0).is_err());
        assert!(sample_row(&[1.0], 1.0, -2, 1.0, 0.0).is_err());
        assert!(sample_row(&[1.0], 1.0, 0, 1.0, 1.0).is_err());
        assert!(sample_row(&[], 1.0, 0, 1.0, 0.0).is_err());
    }
}
