//! Deadlines: every device wait in poot is bounded by one.
//!
//! A `Deadline` is an absolute instant (or none, for tests and offline tools). Waits compute
//! their remaining time from it; nothing sleeps past it. The default for device work is
//! `DEFAULT_DEVICE_TIMEOUT` (600 s).

use std::time::{Duration, Instant};

/// The default bound on any single device wait.
pub const DEFAULT_DEVICE_TIMEOUT: Duration = Duration::from_secs(600);

/// An absolute point in time after which work must stop with a timeout error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    at: Option<Instant>,
}

impl Deadline {
    /// A deadline `timeout` from now.
    pub fn after(timeout: Duration) -> Self {
        Self {
            at: Instant::now().checked_add(timeout),
        }
    }

    /// The default device deadline (600 s from now).
    pub fn default_device() -> Self {
        Self::after(DEFAULT_DEVICE_TIMEOUT)
    }

    /// No deadline at all. Only for tests and tools that run no device work.
    pub const fn never() -> Self {
        Self { at: None }
    }

    /// True once the deadline has passed.
    pub fn expired(&self) -> bool {
        self.at.is_some_and(|at| Instant::now() >= at)
    }

    /// Time left, or `None` when there is no deadline. Zero once expired.
    pub fn remaining(&self) -> Option<Duration> {
        self.at
            .map(|at| at.saturating_duration_since(Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry() {
        assert!(Deadline::after(Duration::ZERO).expired());
        assert!(!Deadline::after(Duration::from_secs(60)).expired());
        assert!(!Deadline::never().expired());
        assert_eq!(Deadline::never().remaining(), None);
    }
}
