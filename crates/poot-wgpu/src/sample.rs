//! The `Sample` node on wgpu: greedy rows are an argmax on the device (`argmax.wgsl`); rows
//! with a temperature run this host step over their read-back logits row, with the CPU
//! runtime's exact semantics (logits / temperature, top-k, softmax in f64, top-p, then the
//! row's uniform draw walks the cumulative mass; ties order by token id).
//!
//! Why a host step: a device top-k/top-p needs a sort or a radix select per row; until that
//! kernel exists, only rows that sample read their logits back (greedy decoding reads back
//! token ids only). New logit processors (penalties, bias, min_p, masks) slot in as
//! [`SampleParams`] fields checked in [`check`] and applied in [`sample_row`] before the cut.
//! Cost: O(V log V) per non-greedy row.

use poot_runtime::RuntimeError;

/// One row's sampling parameters (the `Sample` node's inputs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SampleParams {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub uniform: f32,
}

fn invalid(detail: String) -> RuntimeError {
    RuntimeError::Kernel {
        op: "sample",
        detail,
    }
}

/// Refuses settings the CPU sampler refuses, for every row (greedy rows too).
pub(crate) fn check(p: &SampleParams) -> Result<(), RuntimeError> {
    if !(p.temperature.is_finite() && p.temperature >= 0.0) {
        return Err(invalid(format!(
            "temperature must be finite and >= 0, got {}",
            p.temperature
        )));
    }
    if !(p.top_p > 0.0 && p.top_p <= 1.0) || p.top_k < 0 || !(0.0..1.0).contains(&p.uniform) {
        return Err(invalid(format!(
            "top_k {}, top_p {}, uniform {}",
            p.top_k, p.top_p, p.uniform
        )));
    }
    Ok(())
}

/// Samples one id from a row of logits with `p.temperature > 0`.
pub(crate) fn sample_row(row: &[f32], p: &SampleParams) -> Result<i32, RuntimeError> {
    let mut order: Vec<u32> = (0..row.len() as u32)
        .filter(|&i| !row[i as usize].is_nan())
        .collect();
    if order.is_empty() {
        return Err(invalid("every logit is NaN (or the row is empty)".into()));
    }
    order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    if p.top_k > 0 {
        order.truncate(p.top_k as usize);
    }
    let max = row[order[0] as usize] / p.temperature;
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| f64::from(row[i as usize] / p.temperature - max).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|x| *x /= total);
    let mut keep = probs.len();
    if p.top_p < 1.0 {
        let mut mass = 0.0;
        for (i, x) in probs.iter().enumerate() {
            mass += x;
            if mass >= f64::from(p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    let kept: f64 = probs[..keep].iter().sum();
    let target = f64::from(p.uniform) * kept;
    let mut acc = 0.0;
    for (i, x) in probs[..keep].iter().enumerate() {
        acc += x;
        if target < acc {
            return Ok(order[i] as i32);
        }
    }
    Ok(order[keep - 1] as i32)
}
