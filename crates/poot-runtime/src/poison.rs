//! Poisoning: once a runtime has missed a deadline it is never used again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::error::RuntimeError;
use crate::Health;

/// A one-way flag with a reason. Cheap to check on every call.
#[derive(Debug, Default)]
pub struct Poison {
    poisoned: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl Poison {
    /// Marks the runtime dead; the first reason is kept.
    pub fn poison(&self, reason: impl Into<String>) {
        let mut slot = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(reason.into());
        }
        self.poisoned.store(true, Ordering::Release);
    }

    /// `Err(Poisoned)` once poisoned.
    pub fn check(&self) -> Result<(), RuntimeError> {
        if !self.poisoned.load(Ordering::Acquire) {
            return Ok(());
        }
        let reason = self
            .reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Err(RuntimeError::Poisoned {
            reason: reason.unwrap_or_default(),
        })
    }

    pub fn health(&self) -> Health {
        match self.check() {
            Ok(()) => Health::Ok,
            Err(_) => Health::Poisoned {
                reason: self
                    .reason
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
                    .unwrap_or_default(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poison_is_one_way_and_keeps_the_first_reason() {
        let p = Poison::default();
        assert!(p.check().is_ok());
        p.poison("deadline during matmul");
        p.poison("later");
        assert!(
            matches!(p.check(), Err(RuntimeError::Poisoned { reason }) if reason == "deadline during matmul")
        );
        assert_eq!(
            p.health(),
            Health::Poisoned {
                reason: "deadline during matmul".into()
            }
        );
    }
}
