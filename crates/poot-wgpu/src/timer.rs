//! The per-dispatch timer: with [`WgpuRuntime::record_spans`] on and an adapter that offers
//! `timestamp-query`, every compute pass of a step writes a device timestamp at its start and
//! its end (`wgpu_submit`), and the step's dispatches, grouped by the equation they compute,
//! become [`WgpuRuntime::last_run_spans`]: `(equation index, op kind, start_s, end_s)`, the
//! shape the CPU runtime's spans have.
//!
//! Invariants: spans come only from device timestamps, never from estimates; on an adapter
//! without timestamps (see [`WgpuRuntime::timestamps_supported`]) or on raw Vulkan the spans
//! stay empty. Times are seconds from the step's first timestamp on the device's clock, which
//! is not correlated with the host's. A step that records no dispatch (a readback) leaves
//! the last spans as they were. The timestamps are read back with the step's outputs (16
//! bytes a dispatch) and are not counted in `readback_bytes`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use poot_graph::Op;

use crate::exec::Dispatch;
use crate::gpu::Device;
use crate::plan::WgpuPlan;
use crate::WgpuRuntime;

/// One equation of a timed step: (index, op kind, start_s, end_s).
pub type EquationSpan = (usize, String, f64, f64);

/// The timer's switch and the last timed step's spans.
#[derive(Debug, Default)]
pub(crate) struct Timer {
    on: AtomicBool,
    last: Mutex<Vec<EquationSpan>>,
}

/// Whether the next step on `rt` writes timestamps.
pub(crate) fn timed(rt: &WgpuRuntime) -> bool {
    rt.timer.on.load(Ordering::Relaxed) && rt.timestamps_supported()
}

/// Keeps a timed step's spans: `stamps` holds each dispatch's begin and end ticks in order.
pub(crate) fn keep_spans(
    rt: &WgpuRuntime,
    plan: &WgpuPlan,
    dispatches: &[Dispatch],
    stamps: &[u64],
) {
    let Device::Wgpu(g) = &rt.gpu else {
        return;
    };
    if dispatches.is_empty() || stamps.len() < 2 * dispatches.len() {
        return;
    }
    // The stall kernel (fault injection) computes no equation and is left out.
    let timed = || {
        dispatches
            .iter()
            .enumerate()
            .filter(|(_, d)| d.eq != usize::MAX)
    };
    let Some(first) = timed().map(|(i, _)| stamps[2 * i]).min() else {
        return;
    };
    let secs = |t: u64| t.saturating_sub(first) as f64 * g.tick_ns * 1e-9;
    let mut spans: Vec<EquationSpan> = Vec::new();
    for (i, d) in timed() {
        let a = secs(stamps[2 * i]);
        let b = secs(stamps[2 * i + 1]).max(a);
        match spans.last_mut() {
            // One equation's dispatches (weight parts, dequantized operands) merge.
            Some(s) if s.0 == d.eq => {
                s.2 = s.2.min(a);
                s.3 = s.3.max(b);
            }
            _ => spans.push((d.eq, kind_of(plan, d.eq), a, b)),
        }
    }
    *rt.timer.last.lock().unwrap_or_else(|e| e.into_inner()) = spans;
}

/// The span label of equation `i`: its op's name, matmuls by weight dtype (as the CPU's).
fn kind_of(plan: &WgpuPlan, i: usize) -> String {
    let g = &plan.graph;
    match g.equations.get(i) {
        Some(Op::MatMul { w, .. }) => format!("matmul {}", g.info(*w).dtype),
        Some(op) => op.name().to_string(),
        None => "unknown".to_string(),
    }
}

impl WgpuRuntime {
    /// Times every later step's dispatches for `last_run_spans` (where the adapter offers
    /// timestamps; a no-op elsewhere).
    pub fn record_spans(&self, on: bool) {
        self.timer.on.store(on, Ordering::Relaxed);
    }

    /// The last timed step's equations as `(index, op kind, start_s, end_s)`, seconds from its
    /// first timestamp; empty while the timer is off or the adapter has no timestamps.
    pub fn last_run_spans(&self) -> Vec<EquationSpan> {
        if !self.timer.on.load(Ordering::Relaxed) {
            return Vec::new();
        }
        self.timer
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether this device writes timestamps inside compute passes (wgpu with an adapter
    /// offering `timestamp-query`; never on raw Vulkan here).
    pub fn timestamps_supported(&self) -> bool {
        matches!(&self.gpu, Device::Wgpu(g) if g.timestamps)
    }
}
