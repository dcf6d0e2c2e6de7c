//! Per-op-kind timing of plan runs (`CpuOptions::profile`, or `POOT_CPU_PROFILE` set).
//!
//! Each equation's kernel call is timed and added to a bucket named by its op kind (matmuls
//! also by weight dtype), split into one-row calls (decode) and many-row calls (prefill), so the
//! report shows where a decode step's time goes. The report also gives the wall time since the
//! first run and how much of it was spent outside `run` (the Python driver, sampling on the
//! host, tokenization).
//!
//! Invariants: when profiling is off nothing here is touched (one branch per equation); when
//! on, buckets are allocated on first use only, so the steady state allocates nothing. The
//! report goes to the file named by `POOT_CPU_PROFILE` (unless it is `1`, then stderr) when the
//! runtime is dropped, and is available as a string from `CpuRuntime::profile_report`.
//!
//! The last run's equations are also kept as spans (index, op kind, start since the run
//! began, duration; at most `MAX_SPANS`) for a timeline (`CpuRuntime::last_run_spans`); a
//! runtime that only records spans (`CpuRuntime::record_spans`) never emits a report.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One equation of the last run: (index, op kind, start since the run began, duration).
pub type EquationSpan = (usize, String, Duration, Duration);

/// Spans kept per run; a longer run keeps its first `MAX_SPANS`.
const MAX_SPANS: usize = 1 << 16;

#[derive(Default, Debug)]
struct Inner {
    buckets: HashMap<String, (Duration, u64)>,
    runs: [(Duration, u64); 2],
    first: Option<Instant>,
    run_at: Option<Instant>,
    spans: Vec<EquationSpan>,
}

/// Accumulated timings (see the module docs).
#[derive(Default, Debug)]
pub(crate) struct Profile {
    inner: Mutex<Inner>,
}

impl Profile {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `d` to the bucket `kind` (`rows == 1`: the decode half) and keeps equation `i`'s
    /// span, which started at `t0`.
    pub(crate) fn add(&self, i: usize, kind: &str, rows: usize, (t0, d): (Instant, Duration)) {
        let mut g = self.lock();
        if let Some(at) = g.run_at {
            if g.spans.len() < MAX_SPANS {
                let start = t0.saturating_duration_since(at);
                g.spans.push((i, kind.to_owned(), start, d));
            }
        }
        let half = if rows <= 1 { "decode" } else { "prefill" };
        let key = format!("{half:<8}{kind}");
        let e = g.buckets.entry(key).or_default();
        e.0 += d;
        e.1 += 1;
    }

    /// Marks the start of a run.
    pub(crate) fn start_run(&self) -> Instant {
        let now = Instant::now();
        let mut g = self.lock();
        g.first.get_or_insert(now);
        g.run_at = Some(now);
        g.spans.clear();
        now
    }

    /// The spans of the last run (see the module docs).
    pub(crate) fn last_run(&self) -> Vec<EquationSpan> {
        self.lock().spans.clone()
    }

    /// Adds one whole run that took `d` (`decode`: every matmul had one row).
    pub(crate) fn end_run(&self, decode: bool, d: Duration) {
        let mut g = self.lock();
        let r = &mut g.runs[usize::from(!decode)];
        r.0 += d;
        r.1 += 1;
    }

    /// The table: per bucket total ms, calls, us per call and share of its half's run time.
    pub(crate) fn report(&self) -> String {
        let g = self.lock();
        let mut s = String::new();
        let wall = g.first.map_or(Duration::ZERO, |f| f.elapsed());
        let in_runs = g.runs[0].0 + g.runs[1].0;
        let _ = writeln!(
            s,
            "poot-cpu profile: wall {:.1} ms since the first run, {:.1} ms inside runs \
             ({} decode runs {:.1} ms, {} prefill runs {:.1} ms), {:.1} ms outside",
            ms(wall),
            ms(in_runs),
            g.runs[0].1,
            ms(g.runs[0].0),
            g.runs[1].1,
            ms(g.runs[1].0),
            ms(wall.saturating_sub(in_runs))
        );
        let mut rows: Vec<_> = g.buckets.iter().collect();
        rows.sort_by(|a, b| a.0[..8].cmp(&b.0[..8]).then(b.1 .0.cmp(&a.1 .0)));
        let _ = writeln!(
            s,
            "{:<40} {:>10} {:>8} {:>10} {:>7}",
            "half / op", "total ms", "calls", "us/call", "share"
        );
        for (k, (d, n)) in rows {
            let half = if k.starts_with("decode") { 0 } else { 1 };
            let total = g.runs[half].0;
            let share = if total.is_zero() {
                0.0
            } else {
                d.as_secs_f64() / total.as_secs_f64() * 100.0
            };
            let _ = writeln!(
                s,
                "{:<40} {:>10.2} {:>8} {:>10.2} {:>6.1}%",
                k,
                ms(*d),
                n,
                d.as_secs_f64() * 1e6 / (*n).max(1) as f64,
                share
            );
        }
        s
    }

    /// Writes the report where `POOT_CPU_PROFILE` says (see the module docs).
    pub(crate) fn emit(&self) {
        if self.lock().first.is_none() {
            return;
        }
        let report = self.report();
        match std::env::var("POOT_CPU_PROFILE") {
            Ok(path) if !path.is_empty() && path != "1" => {
                if std::fs::write(&path, &report).is_err() {
                    eprint!("{report}");
                }
            }
            _ => eprint!("{report}"),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The profile bucket of equation `i` (matmuls by weight dtype) and its row count.
pub(super) fn kind_of(plan: &super::CpuPlan, op: &poot_graph::Op, i: usize) -> (String, usize) {
    let g = &plan.graph;
    let rows = g.values[i].shape.first().copied().unwrap_or(1);
    match op {
        poot_graph::Op::MatMul { w, .. } => (format!("matmul {}", g.info(*w).dtype), rows),
        _ => (op.name().to_string(), rows),
    }
}
