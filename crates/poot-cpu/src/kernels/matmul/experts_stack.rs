//! An expert stack re-laid one expert at a time, the first time a step routes a token to it.
//!
//! Why: re-laying the whole stack when a plan compiles reads and rewrites every expert of a
//! MoE checkpoint (most of its bytes) before the first token, although a step reads only the
//! experts its tokens chose. Here compiling only reserves the stack's re-laid buffer (address
//! space: no page is touched) and [`LazyStack::ensure`] re-lays each expert into its own span
//! when a step first selects it, several experts at once spread over the pool's threads.
//!
//! Layout: expert `e`'s rows are 8-row groups `e * n / 8 .. (e + 1) * n / 8` of the `[E * n, k]`
//! matrix, exactly what re-laying the stack whole gives (each expert is whole groups), so the
//! expert kernel reads both alike and gives the same bits.
//!
//! Invariants: an expert's span is written once, inside the initializer of its own `OnceLock`,
//! through a raw pointer to that span only, and is read only after that lock reports the
//! expert ready (the lock orders the write before every read); after construction no
//! reference to the whole buffer exists, only to ready experts' spans, so re-laying one expert
//! never aliases reading another. Only dtypes whose re-lay keeps its kind expert by expert are
//! re-laid lazily ([`lazily_relaid`]: not Q4_Z, whose symmetric tensors re-lay as Q4_0).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use poot_core::DType;

use crate::error::{check_len, mul};
use crate::hugemem::HugeBytes;
use crate::kernels::blocks::{row_bytes, RG};
use crate::kernels::format::Format;
use crate::kernels::ggml::Numerics;
use crate::kernels::matmul::repack::{Repack, Repacked};
use crate::kernels::matmul::repack_k::RepackedK;
use crate::kernels::qact::QK_K;
use crate::kernels::simd::Isa;
use crate::pool::ThreadPool;
use crate::KernelError;

/// Whether an `[E, n, k]` stack of `dtype` is re-laid by [`LazyStack`] under `numerics`: the
/// dtypes with an 8-row layout under ggml numerics (those the dense matmuls re-lay), but Q4_Z.
pub(crate) fn lazily_relaid(numerics: Numerics, dtype: DType, n: usize) -> bool {
    numerics == Numerics::Ggml
        && dtype != DType::Q4_Z
        && n.is_multiple_of(RG)
        && Format::of(dtype).is_some_and(|f| Repacked::supports(f) || RepackedK::supports(f))
}

/// `n` stored rows of `k` columns of `kind` in its 8-row layout (the dense re-lay's bytes).
fn relay_rows(kind: Format, w: &[u8], n: usize, k: usize) -> Result<Repack, KernelError> {
    let rb = row_bytes("expert stack", kind.dtype(), k)?;
    check_len("expert stack", mul(n, rb, "expert stack")?, w.len())?;
    Ok(if Repacked::supports(kind) {
        Repack::Q(Repacked::new_on(kind, w, n, k / 32, None))
    } else {
        Repack::K(RepackedK::new_on(kind, w, n, k / QK_K, None))
    })
}

/// See the module docs.
pub(crate) struct LazyStack {
    dtype: DType,
    kind: Format,
    n_exp: usize,
    n: usize,
    k: usize,
    /// An 8-row re-lay of zero rows: the kind and blocks per row every expert's re-lay has.
    template: Repack,
    /// Bytes of one expert's re-lay (`n / 8` groups of `group_len`).
    span: usize,
    group_len: usize,
    /// Start of `_data` (see the invariants): written only through this pointer.
    base: *mut u8,
    _data: HugeBytes,
    ready: Vec<OnceLock<Result<(), String>>>,
    filled: AtomicUsize,
}

// SAFETY: `base` points into `_data`, which the stack owns; expert spans are written once under
// their `OnceLock` and only read after it (module docs), so sharing the stack is sound.
unsafe impl Send for LazyStack {}
// SAFETY: as above.
unsafe impl Sync for LazyStack {}

impl std::fmt::Debug for LazyStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyStack")
            .field("dtype", &self.dtype)
            .field("experts", &self.n_exp)
            .field("n", &self.n)
            .field("k", &self.k)
            .field("ready", &self.filled.load(Ordering::Relaxed))
            .finish()
    }
}

impl LazyStack {
    /// A stack of `n_exp` experts of `n` rows by `k` of `dtype`, none re-laid yet, or `None`
    /// when [`lazily_relaid`] says no. Reads no stored byte.
    pub(crate) fn new(
        numerics: Numerics,
        isa: Isa,
        dtype: DType,
        (n_exp, n, k): (usize, usize, usize),
    ) -> Result<Option<LazyStack>, KernelError> {
        isa.checked()?;
        let kind = match Format::of(dtype) {
            Some(kind) if lazily_relaid(numerics, dtype, n) && n_exp > 0 => kind,
            _ => return Ok(None),
        };
        let zeros = vec![0u8; RG * row_bytes("expert stack", dtype, k)?];
        let template = relay_rows(kind, &zeros, RG, k)?;
        let span = mul(n / RG, template.bytes(), "expert stack")?;
        let mut data = HugeBytes::zeroed(mul(n_exp, span, "expert stack")?);
        let base = data.as_mut_ptr();
        Ok(Some(LazyStack {
            dtype,
            kind,
            n_exp,
            n,
            k,
            span,
            group_len: template.bytes(),
            template,
            base,
            _data: data,
            ready: (0..n_exp).map(|_| OnceLock::new()).collect(),
            filled: AtomicUsize::new(0),
        }))
    }

    /// The layout every expert has (its kind and blocks per row; 8 rows).
    pub(crate) fn layout(&self) -> &Repack {
        &self.template
    }

    /// Experts, and rows and columns of each.
    pub(crate) fn shape(&self) -> (usize, usize, usize) {
        (self.n_exp, self.n, self.k)
    }

    /// Whether expert `e` is re-laid (and readable through [`LazyStack::group`]).
    pub(crate) fn is_ready(&self, e: usize) -> bool {
        self.ready
            .get(e)
            .and_then(OnceLock::get)
            .is_some_and(Result::is_ok)
    }

    /// Bytes of the experts re-laid so far.
    pub(crate) fn bytes(&self) -> usize {
        self.filled.load(Ordering::Relaxed) * self.span
    }

    /// Group `g` (of `n / 8`) of expert `e`.
    ///
    /// # Panics
    /// If expert `e` is not ready (the expert kernel checks every selected expert first).
    pub(crate) fn group(&self, e: usize, g: usize) -> &[u8] {
        assert!(self.is_ready(e), "expert {e} read before it was re-laid");
        let len = self.group_len;
        assert!((g + 1) * len <= self.span, "group {g} of {}", self.n / RG);
        // SAFETY: the range lies inside expert e's span of `_data`, which is written once,
        // before `ready[e]` was set (checked above), and never again.
        unsafe { std::slice::from_raw_parts(self.base.add(e * self.span + g * len), len) }
    }

    /// Re-lays every expert named in `ids` that is not ready yet, from `stored(e)` (expert
    /// `e`'s stored `[n, k]` bytes), the experts spread over `pool`'s threads; `then(e)` runs
    /// once for each expert this call re-laid (the caller releases its stored pages). Safe to
    /// call from several threads at once: each expert is re-laid once. Ids must already lie in
    /// `0..E`; a stored expert of the wrong length is a typed error naming it.
    pub(crate) fn ensure<'s>(
        &self,
        ids: &[i32],
        stored: &(dyn Fn(usize) -> &'s [u8] + Sync),
        pool: &ThreadPool,
        then: &(dyn Fn(usize) + Sync),
    ) -> Result<(), KernelError> {
        let mut missing: Vec<usize> = Vec::new();
        for &id in ids {
            let e = id as usize;
            if self.ready[e].get().is_none() && !missing.contains(&e) {
                missing.push(e);
            }
        }
        pool.for_each(missing.len(), |i| {
            let e = missing[i];
            let mut mine = false;
            self.ready[e].get_or_init(|| {
                mine = true;
                self.relay(e, stored(e))
            });
            if mine && self.is_ready(e) {
                then(e);
            }
        });
        for &id in ids {
            if let Some(Err(detail)) = self.ready[id as usize].get() {
                return Err(KernelError::InvalidArgument {
                    what: "expert stack",
                    detail: format!("expert {id}: {detail}"),
                });
            }
        }
        Ok(())
    }

    /// Expert `e` re-laid into its span (called once, from its lock's initializer), in place:
    /// a re-lay made elsewhere and copied in had been a temporary the size of an expert.
    fn relay(&self, e: usize, stored: &[u8]) -> Result<(), String> {
        let rb = row_bytes("expert stack", self.dtype, self.k).map_err(|err| err.to_string())?;
        let want = mul(self.n, rb, "expert stack").map_err(|err| err.to_string())?;
        check_len("expert stack", want, stored.len()).map_err(|err| err.to_string())?;
        // SAFETY: expert e's span lies inside `_data` (`n_exp * span` bytes), is written only
        // here, once (this runs inside `ready[e]`'s initializer), and is not read before that
        // lock is set; `stored` is the checkpoint's bytes, not this buffer.
        let out =
            unsafe { std::slice::from_raw_parts_mut(self.base.add(e * self.span), self.span) };
        // The template is this kind's re-lay of 8 rows, so every expert's spans `n / 8` of its
        // groups: the lengths `relay_into` asserts hold.
        match &self.template {
            Repack::Q(_) => Repacked::relay_into(self.kind, stored, self.n, self.k / 32, out, None),
            _ => RepackedK::relay_into(self.kind, stored, self.n, self.k / QK_K, out, None),
        }
        self.filled.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
