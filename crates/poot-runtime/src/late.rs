//! Late inputs: graph inputs the host supplies while the plan already runs.
//!
//! The sampling step's token mask depends on the token sampled one step earlier, so the host
//! computes it (the grammar engine) while the forward pass runs and hands it over through a
//! `LateInput`. A backend reads a late input only when it reaches the equation that needs it,
//! so the two overlap.
//!
//! Invariants: a slot is filled or failed at most once (later calls are ignored and return
//! false); a wait never outlives the run's deadline (it then returns `Timeout`, like any other
//! device wait); a failed slot ends the run with an error naming the input and the reason.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use poot_core::Deadline;

use crate::{HostTensor, RuntimeError};

#[derive(Debug)]
enum State {
    Pending,
    Ready(Arc<HostTensor>),
    Failed(String),
}

#[derive(Debug)]
struct Slot {
    state: Mutex<State>,
    changed: Condvar,
}

/// A handle to one late input; clones share the slot.
#[derive(Clone, Debug)]
pub struct LateInput {
    slot: Arc<Slot>,
}

impl Default for LateInput {
    fn default() -> Self {
        Self::new()
    }
}

impl LateInput {
    pub fn new() -> Self {
        Self {
            slot: Arc::new(Slot {
                state: Mutex::new(State::Pending),
                changed: Condvar::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half-written.
        self.slot.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn settle(&self, next: State) -> bool {
        let mut state = self.lock();
        if !matches!(*state, State::Pending) {
            return false;
        }
        *state = next;
        self.slot.changed.notify_all();
        true
    }

    /// Supplies the tensor; false if the slot was already settled.
    pub fn fill(&self, tensor: HostTensor) -> bool {
        self.settle(State::Ready(Arc::new(tensor)))
    }

    /// Marks the input as never coming (the host failed to compute it).
    pub fn fail(&self, reason: impl Into<String>) -> bool {
        self.settle(State::Failed(reason.into()))
    }

    /// True once filled or failed.
    pub fn is_settled(&self) -> bool {
        !matches!(*self.lock(), State::Pending)
    }

    /// Waits for the tensor until `deadline`.
    pub fn wait(&self, name: &str, deadline: Deadline) -> Result<Arc<HostTensor>, RuntimeError> {
        let mut state = self.lock();
        loop {
            match &*state {
                State::Ready(t) => return Ok(t.clone()),
                State::Failed(reason) => {
                    return Err(RuntimeError::Kernel {
                        op: "late_input",
                        detail: format!("the host failed to supply '{name}': {reason}"),
                    })
                }
                State::Pending => {}
            }
            let timeout = match deadline.remaining() {
                Some(d) if d.is_zero() => {
                    return Err(RuntimeError::Timeout {
                        during: format!("the wait for late input '{name}'"),
                    })
                }
                Some(d) => d,
                None => std::time::Duration::from_secs(3600),
            };
            state = self
                .slot
                .changed
                .wait_timeout(state, timeout)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn t() -> HostTensor {
        HostTensor::I32 {
            shape: vec![1],
            data: vec![7],
        }
    }

    #[test]
    fn fill_from_another_thread_wakes_the_waiter() {
        let late = LateInput::new();
        let filler = late.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            assert!(filler.fill(t()));
        });
        let got = late
            .wait("m", Deadline::after(Duration::from_secs(10)))
            .unwrap();
        assert_eq!(*got, t());
        h.join().unwrap();
        assert!(!late.fill(t()), "a slot settles once");
        assert!(!late.fail("late"));
    }

    #[test]
    fn failure_and_deadline_are_errors() {
        let late = LateInput::new();
        late.fail("grammar error");
        let e = late.wait("mask", Deadline::never()).unwrap_err();
        assert!(e.to_string().contains("grammar error") && e.to_string().contains("mask"));
        let late = LateInput::new();
        let e = late
            .wait("mask", Deadline::after(Duration::from_millis(10)))
            .unwrap_err();
        assert!(matches!(e, RuntimeError::Timeout { .. }));
    }
}
