//! The knobs kernels read deep inside their loops (code path, prefetch distances, huge pages),
//! per runtime rather than per process.
//!
//! A [`crate::CpuRuntime`] builds one [`Tuning`] from its [`crate::CpuOptions`] and installs it
//! on its pool's worker threads as each starts (`PoolConfig::tuning`; they serve that runtime
//! only) and on the calling thread
//! for the length of each compile, KV setup and run (`Tuning::enter`). Kernels read
//! [`Tuning::current`]: the innermost installed value, or outside any runtime the process
//! defaults ([`Tuning::process_default`]: the built-in values, each overridden by its
//! `POOT_CPU_*` variable, read once). So two runtimes in one process can run with different
//! knobs, and a kernel called on its own behaves as before the knobs were options.
//!
//! Cost: while every runtime of the process runs with the process defaults (the usual case),
//! [`Tuning::current`] is one relaxed atomic load and a `OnceLock` read, as the per-knob
//! `OnceLock`s it replaced were; only once some runtime differs does it read the thread-local
//! (once per kernel call or 8-row group, never per element).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::Isa;

/// The kernels' share of [`crate::CpuOptions`] (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuning {
    /// The code path the kernels take (already capped to what this CPU runs).
    pub isa: Isa,
    /// Bytes ahead the streaming integer kernels prefetch (`0`: one line per super-block).
    pub prefetch: usize,
    /// Bytes ahead the AVX-512 one-token F16/BF16 loops prefetch into L2.
    pub prefetch_float: usize,
    /// Whether the 16-row quantized dots prefetch the next unit's super-blocks.
    pub prefetch_next: bool,
    /// Whether large buffers ask for transparent huge pages.
    pub huge_pages: bool,
}

thread_local! {
    static CURRENT: Cell<Option<Tuning>> = const { Cell::new(None) };
}

/// Set (for good) once a tuning other than the process default is installed or entered;
/// until then no thread's tuning can differ from the default and [`Tuning::current`] skips the
/// thread-local. Relaxed is enough: a thread sets it before it installs or enters the tuning,
/// and a pool worker is handed its tuning through the pool's own synchronization.
static CUSTOM: AtomicBool = AtomicBool::new(false);

/// The whole number in environment variable `name` (a byte count, a duration in
/// microseconds, a switch), or `default` when it is unset or not a number.
pub(crate) fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The code path named by `POOT_CPU_ISA`, when set to a path's name.
pub(crate) fn env_isa() -> Option<Isa> {
    std::env::var("POOT_CPU_ISA")
        .ok()
        .and_then(|n| Isa::from_name(n.trim()))
}

impl Tuning {
    /// The built-in values, each overridden by its environment variable where set:
    /// `POOT_CPU_ISA`, `POOT_CPU_PREFETCH`, `POOT_CPU_PREFETCH_FLOAT`, `POOT_CPU_PREFETCH_NEXT`
    /// and `POOT_CPU_THP`. Read once per process.
    pub fn process_default() -> Tuning {
        static DEFAULT: OnceLock<Tuning> = OnceLock::new();
        *DEFAULT.get_or_init(|| Tuning {
            isa: Isa::capped(env_isa().unwrap_or(Isa::Amx)),
            prefetch: env_usize("POOT_CPU_PREFETCH", 2048),
            prefetch_float: env_usize("POOT_CPU_PREFETCH_FLOAT", 8192),
            prefetch_next: env_usize("POOT_CPU_PREFETCH_NEXT", 1) != 0,
            huge_pages: std::env::var("POOT_CPU_THP").map_or(true, |v| v != "0"),
        })
    }

    /// The tuning the kernels on this thread follow (see the module docs).
    #[inline]
    pub fn current() -> Tuning {
        if !CUSTOM.load(Ordering::Relaxed) {
            return Tuning::process_default();
        }
        CURRENT
            .with(Cell::get)
            .unwrap_or_else(Tuning::process_default)
    }

    fn note(self) {
        if self != Tuning::process_default() {
            CUSTOM.store(true, Ordering::Relaxed);
        }
    }

    /// Makes `self` this thread's tuning until the guard drops (then the previous one again).
    pub(crate) fn enter(self) -> Entered {
        self.note();
        Entered(CURRENT.with(|c| c.replace(Some(self))))
    }

    /// Makes `self` this thread's tuning for good (a pool worker that serves one runtime, as it
    /// starts).
    pub(crate) fn install(self) {
        self.note();
        CURRENT.with(|c| c.set(Some(self)));
    }
}

/// Restores the previous tuning of this thread when dropped (`Tuning::enter`).
#[must_use]
pub(crate) struct Entered(Option<Tuning>);

impl Drop for Entered {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}
