//! Activations, broadcasting elementwise ops and softmax over the last dimension.
//!
//! Formulas and rounding (each evaluated in `f32` in exactly this order unless noted):
//! - `silu(x) = x / (1 + exp(-x))` (ggml `ggml_silu_f32`); within 4 ulp of exact.
//! - `gelu_tanh(x) = (0.5 * x) * (1 + tanh((s * x) * (1 + (a * x) * x)))`, `s = sqrt(2/pi)`,
//!   `a = 0.044715` (ggml's formula; ggml's f16 lookup table is not reproduced).
//! - `gelu_erf(x) = 0.5 * x * (1 + erf(x / sqrt 2))`, computed in `f64` (erf below, with erfc
//!   for negative `x` so the tail keeps its relative precision) and rounded once: within 1 ulp.
//! - `softmax`: `m = max(row)`, `e_i = exp(x_i - m)` in `f32`, `sum` of the `e_i` in `f64`
//!   (ggml), then `e_i * (1 / sum) as f32`. A row of all `-inf` gives NaNs (as ggml and torch).
//! - `add`/`mul`: `b` is either `a`'s shape or one row repeated over `a` (`a.len() % b.len() ==
//!   0`); results are exact `f32` operations.
//!
//! Unary ops come in place (`silu`) and out of place (`silu_to`); shapes are checked before any
//! write. Cost: O(n), no allocation.

use crate::error::check_len;
use crate::KernelError;

/// `x / (1 + exp(-x))`.
#[inline]
pub fn silu_f32(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_COEF_A: f32 = 0.044_715;

/// ggml's tanh-approximated GELU.
#[inline]
pub fn gelu_tanh_f32(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// Exact GELU, `0.5 * x * (1 + erf(x / sqrt 2))`, rounded once from `f64`.
#[inline]
pub fn gelu_erf_f32(x: f32) -> f32 {
    let x = f64::from(x);
    let z = x * std::f64::consts::FRAC_1_SQRT_2;
    // 1 + erf(z) = erfc(-z); for z < 0 that avoids cancelling 1 against -erf.
    let one_plus_erf = if z < 0.0 { erfc(-z) } else { 2.0 - erfc(z) };
    (0.5 * x * one_plus_erf) as f32
}

/// The derivative of exact GELU, `Phi(x) + x * phi(x)` with `Phi(x) = (1 + erf(x / sqrt 2)) / 2`
/// and `phi(x) = exp(-x^2 / 2) / sqrt(2 pi)`, rounded once from `f64`.
#[inline]
pub fn gelu_erf_grad_f32(x: f32) -> f32 {
    let x = f64::from(x);
    let z = x * std::f64::consts::FRAC_1_SQRT_2;
    let one_plus_erf = if z < 0.0 { erfc(-z) } else { 2.0 - erfc(z) };
    let pdf = (-0.5 * x * x).exp()
        * (0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2);
    (0.5 * one_plus_erf + x * pdf) as f32
}

/// `erfc(z)` for `z >= 0` in `f64`: the C library's (`erfc` is C99; glibc's is within 1 ulp
/// in `f64`, so the `f32` results above stay within 1 ulp; the tests pin known values). A
/// series in Rust gave the same values at about 70 ns an element, which made GELU most of a
/// small transformer's forward.
fn erfc(z: f64) -> f64 {
    extern "C" {
        #[link_name = "erfc"]
        fn c_erfc(x: f64) -> f64;
    }
    // SAFETY: C99's `erfc` is a pure function of its argument, defined for every `f64` (NaN
    // in, NaN out), from the C library std already links.
    unsafe { c_erfc(z) }
}

macro_rules! unary {
    ($(#[$doc:meta])* $inplace:ident, $to:ident, $f:ident) => {
        $(#[$doc])*
        pub fn $inplace(x: &mut [f32]) {
            x.iter_mut().for_each(|v| *v = $f(*v));
        }

        $(#[$doc])*
        /// Out of place: `out[i] = f(x[i])`.
        pub fn $to(x: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
            check_len(concat!(stringify!($to), " out"), x.len(), out.len())?;
            out.iter_mut().zip(x).for_each(|(o, &v)| *o = $f(v));
            Ok(())
        }
    };
}

unary!(
    /// SiLU (swish), in place.
    silu, silu_to, silu_f32
);
unary!(
    /// GELU, tanh approximation (ggml's), in place.
    gelu_tanh, gelu_tanh_to, gelu_tanh_f32
);
unary!(
    /// GELU with the exact erf, in place.
    gelu_erf, gelu_erf_to, gelu_erf_f32
);

/// Soft-capping in place: `x = tanh(x * (1 / cap)) * cap`, the order of llama.cpp's Gemma 2
/// graph (`ggml_scale`, `ggml_tanh`, `ggml_scale`); `cap` must be positive and finite.
pub fn softcap(x: &mut [f32], cap: f32) -> Result<(), KernelError> {
    if !(cap.is_finite() && cap > 0.0) {
        return Err(KernelError::InvalidArgument {
            what: "softcap cap",
            detail: format!("{cap} is not positive and finite"),
        });
    }
    let inv = 1.0 / cap;
    x.iter_mut().for_each(|v| *v = (*v * inv).tanh() * cap);
    Ok(())
}

/// SwiGLU: `out[i] = silu(gate[i]) * up[i]`.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    check_len("silu_mul up", gate.len(), up.len())?;
    check_len("silu_mul out", gate.len(), out.len())?;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu_f32(g) * u;
    }
    Ok(())
}

/// Checks that `b` is `a`'s shape or a row that tiles `a`.
fn check_broadcast(what: &'static str, a: usize, b: usize) -> Result<(), KernelError> {
    if b == a || (b > 0 && a.is_multiple_of(b)) {
        Ok(())
    } else {
        Err(KernelError::InvalidArgument {
            what,
            detail: format!("cannot broadcast {b} values over {a}"),
        })
    }
}

macro_rules! binary {
    ($(#[$doc:meta])* $name:ident, $inplace:ident, $op:tt, $op_assign:tt) => {
        $(#[$doc])*
        /// `b` is `a`'s shape or one row repeated over `a`; `out` is `a`'s shape.
        pub fn $name(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
            check_broadcast(concat!(stringify!($name), " b"), a.len(), b.len())?;
            check_len(concat!(stringify!($name), " out"), a.len(), out.len())?;
            if b.is_empty() {
                return Ok(());
            }
            for (oc, ac) in out.chunks_mut(b.len()).zip(a.chunks(b.len())) {
                for ((o, &x), &y) in oc.iter_mut().zip(ac).zip(b) {
                    *o = x $op y;
                }
            }
            Ok(())
        }

        $(#[$doc])*
        /// In place on `a`; `b` is `a`'s shape or one row repeated over `a`.
        pub fn $inplace(a: &mut [f32], b: &[f32]) -> Result<(), KernelError> {
            check_broadcast(concat!(stringify!($inplace), " b"), a.len(), b.len())?;
            if b.is_empty() {
                return Ok(());
            }
            for ac in a.chunks_mut(b.len()) {
                for (x, &y) in ac.iter_mut().zip(b) {
                    *x $op_assign y;
                }
            }
            Ok(())
        }
    };
}

binary!(
    /// Elementwise `a + b`.
    add, add_inplace, +, +=
);
binary!(
    /// Elementwise `a * b`.
    mul, mul_inplace, *, *=
);

/// Softmax over each row of `d` values of `x`, in place (see the module docs for rounding).
pub fn softmax(x: &mut [f32], d: usize) -> Result<(), KernelError> {
    if d == 0 || !x.len().is_multiple_of(d) {
        if x.is_empty() {
            return Ok(());
        }
        return Err(KernelError::InvalidArgument {
            what: "softmax d",
            detail: format!("{} values are not rows of {d}", x.len()),
        });
    }
    for row in x.chunks_exact_mut(d) {
        softmax_row(row);
    }
    Ok(())
}

/// Softmax of one row in place.
pub(crate) fn softmax_row(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    row.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
#[path = "act_tests.rs"]
mod tests;
