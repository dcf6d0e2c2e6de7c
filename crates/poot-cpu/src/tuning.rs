//! The knobs kernels read deep inside their loops (code path, prefetch distances, huge pages),
//! per runtime rather than per process.
//!
//! A [`crate::CpuRuntime`] builds one [`Tuning`] from its [`crate::CpuOptions`] and installs it
//! on its pool's worker threads once (they serve that runtime only) and on the calling thread
//! for the length of each compile, KV setup and run ([`Tuning::enter`]). Kernels read
//! [`Tuning::current`]: the innermost installed value, or outside any runtime the process
//! defaults ([`Tuning::process_default`]: the built-in values, each overridden by its
//! `POOT_CPU_*` variable, read once). So two runtimes in one process can run with different
//! knobs, and a kernel called on its own behaves as before the knobs were options.
//!
//! Cost: one thread-local read per kernel call (never per element).

use std::cell::Cell;
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
        CURRENT
            .with(Cell::get)
            .unwrap_or_else(Tuning::process_default)
    }

    /// Makes `self` this thread's tuning until the guard drops (then the previous one again).
    pub(crate) fn enter(self) -> Entered {
        Entered(CURRENT.with(|c| c.replace(Some(self))))
    }

    /// Makes `self` this thread's tuning for good (a pool worker that serves one runtime).
    pub(crate) fn install(self) {
        CURRENT.with(|c| c.set(Some(self)));
    }
}

/// Restores the previous tuning of this thread when dropped ([`Tuning::enter`]).
#[must_use]
pub(crate) struct Entered(Option<Tuning>);

impl Drop for Entered {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}
