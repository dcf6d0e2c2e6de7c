//! Per-request sampling state kept between steps, and a step's sampling inputs.
//!
//! The sampling step runs in the step graph; what it needs from one step to the next lives
//! here, so a steady-state step asks the host nothing: each request's seeded random stream
//! ([`Pcg64`], numpy's `PCG64` continued exactly, so a seeded request draws the same floats as
//! `np.random.default_rng(seed).random(dtype=np.float32)`), its settings, the counts behind its
//! penalties and its logit bias. [`step_sampling`] lays a step's rows out as the sampling
//! inputs of the step-graph contract (`temperature`, `top_k`, `top_p`, `min_p`, `uniform`, and
//! the adjust lists when a row penalizes or biases).
//!
//! Invariants:
//! - One uniform is drawn per sampled row, at layout time, in row order; rows that do not
//!   sample (prefill chunks) draw none.
//! - An adjust list names each token at most once: prompt tokens (only under a repetition
//!   penalty) carry count 0, generated ones their count, bias-only ones -1; the adjust width is
//!   0 when no row adjusts, else the longest list rounded up to a power of two, at least 16.
//! - Padding rows (past the step's rows, up to its padded `seqs`) are greedy and adjust nothing.

use std::collections::HashMap;

use crate::TokenId;

/// numpy's `PCG64` bit generator (XSL-RR 128/64), with its buffered 32-bit half.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pcg64 {
    state: u128,
    inc: u128,
    has_uint32: bool,
    uinteger: u32,
}

const PCG_MULT: u128 = (0x2360_ED05_1FC6_5DA4_u128 << 64) | 0x4385_DF64_9FCC_F645;

impl Pcg64 {
    /// The generator at numpy's `bit_generator.state` (`state`, `inc`, `has_uint32`,
    /// `uinteger`), so draws continue numpy's stream.
    pub fn from_numpy_state(state: u128, inc: u128, has_uint32: bool, uinteger: u32) -> Self {
        Self {
            state,
            inc,
            has_uint32,
            uinteger,
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
        let hi = (self.state >> 64) as u64;
        let lo = self.state as u64;
        (hi ^ lo).rotate_right((self.state >> 122) as u32)
    }

    fn next_u32(&mut self) -> u32 {
        if self.has_uint32 {
            self.has_uint32 = false;
            return self.uinteger;
        }
        let next = self.next_u64();
        self.has_uint32 = true;
        self.uinteger = (next >> 32) as u32;
        next as u32
    }

    /// The next float in [0, 1), as numpy's `random(dtype=np.float32)` makes it.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 * (1.0 / 16_777_216.0)
    }
}

/// One request's sampling settings (validated by the caller, `SamplingParams`).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingSpec {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = no cut.
    pub top_k: i32,
    /// 1 = no cut.
    pub top_p: f32,
    /// 0 = no cut.
    pub min_p: f32,
    /// 1 = none.
    pub repetition: f32,
    /// 0 = none.
    pub presence: f32,
    /// 0 = none.
    pub frequency: f32,
    /// `(token, bias)` pairs, each token once.
    pub bias: Vec<(TokenId, f32)>,
    /// The prompt's tokens, each once (only read under a repetition penalty).
    pub prompt_tokens: Vec<TokenId>,
    /// Whether sampled rows return logprobs.
    pub logprobs: bool,
    /// Whether sampled rows take a guidance mask.
    pub guided: bool,
    /// Whether the request's prefill chunks return prompt logprobs.
    pub prompt_logprobs: bool,
}

impl SamplingSpec {
    fn penalized(&self) -> bool {
        self.repetition != 1.0 || self.presence != 0.0 || self.frequency != 0.0
    }
}

/// One request's state between steps.
#[derive(Debug, Clone)]
pub struct RequestSampling {
    spec: SamplingSpec,
    rng: Pcg64,
    /// Generated tokens with their counts, in first-seen order.
    counts: Vec<(TokenId, i32)>,
    index: HashMap<TokenId, usize>,
    /// Whether the request's next row is (part of) a prefill: until its first sample, and
    /// again after a preemption.
    pub in_prefill: bool,
}

impl RequestSampling {
    /// A new request's state (in prefill).
    pub fn new(spec: SamplingSpec, rng: Pcg64) -> Self {
        Self {
            spec,
            rng,
            counts: Vec::new(),
            index: HashMap::new(),
            in_prefill: true,
        }
    }

    /// The request's settings.
    pub fn spec(&self) -> &SamplingSpec {
        &self.spec
    }

    /// Counts an accepted token (for the penalties).
    pub fn accept(&mut self, token: TokenId) {
        match self.index.get(&token) {
            Some(&i) => self.counts[i].1 += 1,
            None => {
                self.index.insert(token, self.counts.len());
                self.counts.push((token, 1));
            }
        }
    }

    /// `(ids, counts, bias)` of the adjust list; None when nothing is adjusted.
    pub fn adjust_entries(&self) -> Option<(Vec<i32>, Vec<i32>, Vec<f32>)> {
        let s = &self.spec;
        let penalized = s.penalized();
        if !penalized && s.bias.is_empty() {
            return None;
        }
        let mut ids: Vec<i32> = Vec::new();
        let mut counts: Vec<i32> = Vec::new();
        let mut where_: HashMap<TokenId, usize> = HashMap::new();
        let mut put =
            |t: TokenId, c: i32, ids: &mut Vec<i32>, counts: &mut Vec<i32>| match where_.get(&t) {
                Some(&i) => {
                    if c >= 0 {
                        counts[i] = c;
                    }
                    i
                }
                None => {
                    where_.insert(t, ids.len());
                    ids.push(t as i32);
                    counts.push(c);
                    ids.len() - 1
                }
            };
        if penalized {
            if s.repetition != 1.0 {
                for &t in &s.prompt_tokens {
                    put(t, 0, &mut ids, &mut counts);
                }
            }
            for &(t, c) in &self.counts {
                put(t, c, &mut ids, &mut counts);
            }
        }
        let mut bias = vec![0.0f32; ids.len()];
        for &(t, b) in &s.bias {
            let i = put(t, -1, &mut ids, &mut counts);
            if i == bias.len() {
                bias.push(b);
            } else {
                bias[i] = b;
            }
        }
        Some((ids, counts, bias))
    }
}

/// A step's sampling inputs, `seqs` rows each (padding rows greedy).
#[derive(Debug, Clone, PartialEq)]
pub struct StepSampling {
    /// Rows, padding included.
    pub seqs: usize,
    /// Per-row settings and draws.
    pub temperature: Vec<f32>,
    /// Per-row `top_k`.
    pub top_k: Vec<i32>,
    /// Per-row `top_p`.
    pub top_p: Vec<f32>,
    /// Per-row `min_p`.
    pub min_p: Vec<f32>,
    /// Per-row seeded draw (0 where the row does not sample).
    pub uniform: Vec<f32>,
    /// Adjust width (0: no adjust inputs).
    pub adjust: usize,
    /// `[seqs, adjust]` ids (-1 pads).
    pub adj_ids: Vec<i32>,
    /// `[seqs, adjust]` counts (-1 pads).
    pub adj_counts: Vec<i32>,
    /// `[seqs, adjust]` biases.
    pub adj_bias: Vec<f32>,
    /// Per-row repetition penalty.
    pub repetition: Vec<f32>,
    /// Per-row presence penalty.
    pub presence: Vec<f32>,
    /// Per-row frequency penalty.
    pub frequency: Vec<f32>,
    /// Rows that sample and take a guidance mask.
    pub mask_rows: Vec<usize>,
    /// Whether any sampled row wants logprobs.
    pub logprobs: bool,
}

/// The sampling inputs of a step whose rows are `rows` (`sample[i]`: row `i` samples), padded
/// to `seqs` rows; draws one uniform per sampled row.
pub fn step_sampling(
    rows: &mut [&mut RequestSampling],
    sample: &[bool],
    seqs: usize,
) -> StepSampling {
    assert_eq!(rows.len(), sample.len(), "one sample flag per row");
    assert!(rows.len() <= seqs, "padded rows hold the step's rows");
    let mut out = StepSampling {
        seqs,
        temperature: vec![0.0; seqs],
        top_k: vec![0; seqs],
        top_p: vec![1.0; seqs],
        min_p: vec![0.0; seqs],
        uniform: vec![0.0; seqs],
        adjust: 0,
        adj_ids: Vec::new(),
        adj_counts: Vec::new(),
        adj_bias: Vec::new(),
        repetition: vec![1.0; seqs],
        presence: vec![0.0; seqs],
        frequency: vec![0.0; seqs],
        mask_rows: Vec::new(),
        logprobs: false,
    };
    let mut lists = Vec::with_capacity(rows.len());
    for (i, (r, &s)) in rows.iter_mut().zip(sample).enumerate() {
        let spec = &r.spec;
        out.temperature[i] = spec.temperature;
        out.top_k[i] = spec.top_k.max(0);
        out.top_p[i] = spec.top_p;
        out.min_p[i] = spec.min_p;
        out.repetition[i] = spec.repetition;
        out.presence[i] = spec.presence;
        out.frequency[i] = spec.frequency;
        if s {
            out.logprobs |= spec.logprobs;
            if spec.guided {
                out.mask_rows.push(i);
            }
        }
        lists.push(r.adjust_entries());
        if s {
            out.uniform[i] = r.rng.next_f32();
        }
    }
    let longest = lists.iter().flatten().map(|l| l.0.len()).max();
    if let Some(n) = longest {
        let w = n.next_power_of_two().max(16);
        out.adjust = w;
        out.adj_ids = vec![-1; seqs * w];
        out.adj_counts = vec![-1; seqs * w];
        out.adj_bias = vec![0.0; seqs * w];
        for (row, list) in lists.into_iter().enumerate() {
            if let Some((ids, counts, bias)) = list {
                let at = row * w;
                out.adj_ids[at..at + ids.len()].copy_from_slice(&ids);
                out.adj_counts[at..at + counts.len()].copy_from_slice(&counts);
                out.adj_bias[at..at + bias.len()].copy_from_slice(&bias);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SamplingSpec {
        SamplingSpec {
            temperature: 0.8,
            top_k: -1,
            top_p: 1.0,
            min_p: 0.0,
            repetition: 1.0,
            presence: 0.0,
            frequency: 0.0,
            bias: Vec::new(),
            prompt_tokens: vec![5, 6],
            logprobs: false,
            guided: false,
            prompt_logprobs: false,
        }
    }

    #[test]
    fn a_half_drawn_u64_is_used_before_the_next_step() {
        let mut a = Pcg64::from_numpy_state(7, 3, false, 0);
        let mut b = a.clone();
        let whole = b.next_u64();
        assert_eq!(a.next_u32(), whole as u32);
        assert_eq!(a.next_u32(), (whole >> 32) as u32);
        let f = a.next_f32();
        assert!((0.0..1.0).contains(&f));
    }

    #[test]
    fn plain_rows_adjust_nothing_and_only_sampled_rows_draw() {
        let mut a = RequestSampling::new(spec(), Pcg64::from_numpy_state(1, 1, false, 0));
        let mut b = RequestSampling::new(spec(), Pcg64::from_numpy_state(1, 1, false, 0));
        let out = step_sampling(&mut [&mut a, &mut b], &[true, false], 4);
        assert_eq!(out.adjust, 0);
        assert!(out.uniform[0] > 0.0 && out.uniform[1] == 0.0);
        assert_eq!(out.top_k, vec![0, 0, 0, 0]); // -1 means no cut, as 0
        assert_eq!(out.temperature, vec![0.8, 0.8, 0.0, 0.0]);
        // b drew nothing: its next draw is a's first.
        let first = out.uniform[0];
        let again = step_sampling(&mut [&mut b], &[true], 1);
        assert_eq!(again.uniform[0], first);
    }

    #[test]
    fn adjust_lists_name_each_token_once() {
        let mut s = spec();
        s.repetition = 1.3;
        s.bias = vec![(6, 2.0), (9, -1.0)];
        let mut r = RequestSampling::new(s, Pcg64::from_numpy_state(1, 1, false, 0));
        r.accept(6);
        r.accept(6);
        r.accept(7);
        let (ids, counts, bias) = r.adjust_entries().unwrap();
        assert_eq!(ids, vec![5, 6, 7, 9]);
        assert_eq!(counts, vec![0, 2, 1, -1]);
        assert_eq!(bias, vec![0.0, 2.0, 0.0, -1.0]);
        let out = step_sampling(&mut [&mut r], &[true], 2);
        assert_eq!(out.adjust, 16);
        assert_eq!(&out.adj_ids[..5], &[5, 6, 7, 9, -1]);
        assert!(out.adj_ids[16..].iter().all(|&i| i == -1));
        assert_eq!(out.repetition, vec![1.3, 1.0]);
    }

    #[test]
    fn presence_alone_skips_the_prompt() {
        let mut s = spec();
        s.presence = 0.5;
        let mut r = RequestSampling::new(s, Pcg64::from_numpy_state(1, 1, false, 0));
        assert_eq!(r.adjust_entries().unwrap().0, Vec::<i32>::new());
        r.accept(3);
        assert_eq!(r.adjust_entries().unwrap(), (vec![3], vec![1], vec![0.0]));
    }
}
