//! Per-thread reusable scratch buffers, so the kernels allocate nothing in the steady state.
//!
//! Each thread (the pool's persistent workers and the caller) keeps a small stack of buffers
//! per element type. [`Scratch::take`] pops one (or starts an empty one) and sizes it; dropping
//! the [`Scratch`] pushes it back on the stack of the thread that drops it. Nested takes simply
//! get different buffers. After a warm-up call of each shape, no call allocates.
//!
//! Invariants: a buffer's contents are unspecified on `take` beyond what the caller asks
//! (`zeroed` fills with the default value); at most `KEEP` buffers per type stay parked per
//! thread, and none larger than `MAX_BYTES`, so idle memory stays bounded (a prefill's big
//! buffers go back to the allocator).

use std::cell::Cell;
use std::ops::{Deref, DerefMut};

use crate::kernels::qact::BlockQ8;
use crate::kernels::qact::BlockQ8K;

const KEEP: usize = 8;
const MAX_BYTES: usize = 8 << 20;

/// An element type with a per-thread stack of parked buffers.
pub(crate) trait Parked: Sized + Clone + Default + 'static {
    fn with_stack<R>(f: impl FnOnce(&mut Vec<Vec<Self>>) -> R) -> R;
}

macro_rules! parked {
    ($t:ty, $name:ident) => {
        thread_local! {
            static $name: Cell<Vec<Vec<$t>>> = const { Cell::new(Vec::new()) };
        }
        impl Parked for $t {
            fn with_stack<R>(f: impl FnOnce(&mut Vec<Vec<Self>>) -> R) -> R {
                $name.with(|c| {
                    let mut stack = c.take();
                    let r = f(&mut stack);
                    c.set(stack);
                    r
                })
            }
        }
    };
}

parked!(f32, F32S);
parked!(BlockQ8, Q8S);
parked!(BlockQ8K, Q8KS);
parked!([i32; 8], CORRS);
parked!(u8, BYTES);
parked!(u16, HALVES);
parked!(usize, USIZES);

/// A buffer borrowed from this thread's stack (see the module docs).
#[derive(Debug)]
pub(crate) struct Scratch<T: Parked>(Vec<T>);

impl<T: Parked> Scratch<T> {
    /// A buffer of `len` default values.
    pub(crate) fn zeroed(len: usize) -> Self {
        // The smallest parked buffer that holds `len` (each call shape finds the one it had
        // last time, so nothing grows once warm), else the largest, grown.
        let mut v = T::with_stack(|s| {
            let fit = s
                .iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= len)
                .min_by_key(|(_, v)| v.capacity())
                .or_else(|| s.iter().enumerate().max_by_key(|(_, v)| v.capacity()))
                .map(|(i, _)| i);
            fit.map(|i| s.swap_remove(i))
        })
        .unwrap_or_default();
        v.clear();
        v.resize(len, T::default());
        Scratch(v)
    }
}

impl<T: Parked> Deref for Scratch<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

impl<T: Parked> DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.0
    }
}

impl<T: Parked> Drop for Scratch<T> {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        if v.capacity() * std::mem::size_of::<T>() <= MAX_BYTES {
            T::with_stack(|s| {
                if s.len() < KEEP {
                    s.push(v);
                }
            });
        }
    }
}

/// Per-thread scratch of the ggml attention path (its per-head and grouped kernels, which
/// depend on this module and not the other way round).
#[derive(Debug, Default)]
pub(crate) struct AttnScratch {
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) scores: Vec<f32>,
    pub(crate) acc: Vec<f32>,
    /// A token tile's outputs (the grouped kernel's).
    pub(crate) o: Vec<f32>,
    /// The cache row offset of each position (the one-token grouped kernel's).
    pub(crate) rows: Vec<usize>,
}

thread_local! {
    static ATTN: Cell<Option<Box<AttnScratch>>> = const { Cell::new(None) };
}

/// The ggml attention path's per-thread scratch, parked between calls.
#[derive(Debug)]
pub(crate) struct AttnGuard(Option<Box<AttnScratch>>);

impl AttnGuard {
    pub(crate) fn take() -> Self {
        AttnGuard(Some(ATTN.with(Cell::take).unwrap_or_default()))
    }
}

impl Deref for AttnGuard {
    type Target = AttnScratch;
    fn deref(&self) -> &AttnScratch {
        self.0.as_deref().expect("present until drop")
    }
}

impl DerefMut for AttnGuard {
    fn deref_mut(&mut self) -> &mut AttnScratch {
        self.0.as_deref_mut().expect("present until drop")
    }
}

impl Drop for AttnGuard {
    fn drop(&mut self) {
        ATTN.with(|c| c.set(self.0.take()));
    }
}
