//! The kernels and how each is launched: one description shared by the GPU (the driver) and
//! the CPU shim (`shim`), so the tests exercise the runtime's own grid, block and argument
//! choices as well as the kernel source.
//!
//! Every builder takes shapes the caller has already checked (the plan checks them at compile
//! time against the i32 and grid limits the kernels assume).

use std::ffi::c_void;

use poot_core::DType;

/// `shaders/cuda/common.cuh`: included by every kernel (NVRTC gets it as a named header).
pub const COMMON: (&str, &str) = (
    "common.cuh",
    include_str!("../../../shaders/cuda/common.cuh"),
);

/// The CPU shim header (used only by `shim`).
pub const CPU_SHIM: (&str, &str) = (
    "cpu_shim.h",
    include_str!("../../../shaders/cuda/cpu_shim.h"),
);

/// Kernel sources: (file name, text). `stall.cu` is fault injection for tests on a GPU.
pub const SOURCES: &[(&str, &str)] = &[
    ("matvec.cu", include_str!("../../../shaders/cuda/matvec.cu")),
    ("norm.cu", include_str!("../../../shaders/cuda/norm.cu")),
    (
        "eltwise.cu",
        include_str!("../../../shaders/cuda/eltwise.cu"),
    ),
    (
        "attention.cu",
        include_str!("../../../shaders/cuda/attention.cu"),
    ),
    ("stall.cu", include_str!("../../../shaders/cuda/stall.cu")),
];

/// Sources the CPU shim runs (everything but the GPU-timer stall kernel).
pub const SHIM_SOURCES: &[&str] = &["matvec.cu", "norm.cu", "eltwise.cu", "attention.cu"];

/// The `extern "C" __global__` kernel names a source defines, in order of appearance.
pub fn kernel_names(source: &str) -> Vec<&str> {
    source
        .split("__global__ void ")
        .skip(1)
        .filter_map(|rest| rest.split('(').next())
        .map(str::trim)
        .collect()
}

/// Rows one matvec block computes (`MV_ROWS` in matvec.cu: 8 warps of 256 threads).
pub const MV_ROWS: u32 = 8;
/// Tokens one matvec warp computes from one decode of its row (`MV_TOK` in matvec.cu).
pub const MV_TOK: u32 = 4;
/// Threads per block of every kernel.
pub const BLOCK: u32 = 256;

/// One kernel argument, by value as the kernel declares it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A device address (on the CPU shim, a host address).
    Ptr(u64),
    I32(i32),
    I64(i64),
    U64(u64),
    F32(f32),
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: &'static str,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub args: Vec<Arg>,
}

/// Argument storage laid out for `cuLaunchKernel`'s `void**` (and the shim's): each entry
/// points at its value, which lives as long as this struct.
#[derive(Debug)]
pub struct Params {
    values: Vec<u64>,
    ptrs: Vec<*mut c_void>,
}

impl Params {
    pub fn new(args: &[Arg]) -> Self {
        // Every argument fits in 8 bytes; a little-endian u64 slot holds each at offset 0,
        // which is where a 4-byte argument's bytes are read from.
        let values: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) | Arg::U64(p) => p,
                Arg::I64(v) => v as u64,
                Arg::I32(v) => u64::from(v as u32),
                Arg::F32(v) => u64::from(v.to_bits()),
            })
            .collect();
        let mut p = Self {
            values,
            ptrs: Vec::new(),
        };
        p.ptrs = p
            .values
            .iter_mut()
            .map(|v| (v as *mut u64).cast::<c_void>())
            .collect();
        p
    }

    pub fn as_ptr(&mut self) -> *mut *mut c_void {
        self.ptrs.as_mut_ptr()
    }
}

fn blocks(count: u64, per: u32) -> u32 {
    count.div_ceil(u64::from(per)) as u32
}

/// A launch of `BLOCK`-thread blocks (every kernel but `stall`).
fn launch(kernel: &'static str, grid: [u32; 3], args: Vec<Arg>) -> Launch {
    Launch {
        kernel,
        grid,
        block: [BLOCK, 1, 1],
        args,
    }
}

/// A launch of one thread per element of `n` (elementwise kernels over flat arrays).
fn per_element(kernel: &'static str, n: u64, args: Vec<Arg>) -> Launch {
    launch(kernel, [blocks(n, BLOCK), 1, 1], args)
}

/// A launch of one thread per element of `rows` rows of `width` (grid y: the row).
fn per_row_element(kernel: &'static str, width: u32, rows: u32, args: Vec<Arg>) -> Launch {
    launch(kernel, [blocks(width.into(), BLOCK), rows, 1], args)
}

/// The matvec kernel for a weight dtype (one token a warp), or `None` when there is none.
pub fn matvec_kernel(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "matvec_f32",
        DType::F16 => "matvec_f16",
        DType::Q8_0 => "matvec_q8_0",
        DType::Q4_0 => "matvec_q4_0",
        DType::Q4_1 => "matvec_q4_1",
        _ => return None,
    })
}

/// The several-token kernel for a weight dtype (`MV_TOK` tokens a warp from one decode).
pub fn matmul_kernel(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "matmul_f32",
        DType::F16 => "matmul_f16",
        DType::Q8_0 => "matmul_q8_0",
        DType::Q4_0 => "matmul_q4_0",
        DType::Q4_1 => "matmul_q4_1",
        _ => return None,
    })
}

/// The dtype code `poot_elem` in eltwise.cu switches on (`POOT_F32`.. in common.cuh).
pub fn dtype_code(dtype: DType) -> Option<i32> {
    Some(match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Q8_0 => 2,
        DType::Q4_0 => 3,
        DType::Q4_1 => 4,
        _ => return None,
    })
}

/// `y [t, n] = x [t, k] @ w [n, k]^T`; `w` is stored in `dtype` (see `matvec_kernel`).
pub fn matvec(dtype: DType, w: u64, x: u64, y: u64, t: u32, n: u32, k: u32) -> Launch {
    let (kernel, tiles) = if t == 1 {
        (matvec_kernel(dtype), 1)
    } else {
        (matmul_kernel(dtype), t.div_ceil(MV_TOK))
    };
    launch(
        kernel.expect("the plan checked the dtype"),
        [blocks(n.into(), MV_ROWS), tiles, 1],
        vec![
            Arg::Ptr(w),
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::I32(n as i32),
            Arg::I32(k as i32),
            Arg::I32(t as i32),
        ],
    )
}

pub fn rms_norm(x: u64, w: u64, y: u64, t: u32, d: u32, eps: f32) -> Launch {
    launch(
        "rms_norm_f32",
        [t, 1, 1],
        vec![
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::Ptr(y),
            Arg::I32(d as i32),
            Arg::F32(eps),
        ],
    )
}

/// `add_f32` or `mul_f32`: `out[i] = a[i] op b[i % nb]`.
pub fn binary(kernel: &'static str, a: u64, b: u64, out: u64, n: u64, nb: u64) -> Launch {
    per_element(
        kernel,
        n,
        vec![
            Arg::Ptr(a),
            Arg::Ptr(b),
            Arg::Ptr(out),
            Arg::I64(n as i64),
            Arg::I64(nb as i64),
        ],
    )
}

/// The code `cast_f32` takes for a stored float dtype (F32, F16, BF16), or `None`.
pub fn cast_code(dtype: DType) -> Option<i32> {
    Some(match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 5,
        _ => return None,
    })
}

/// `out [n]` = the `n` stored words of `w` as f32 (`cast_code`'s dtypes).
pub fn cast(w: u64, dtype: DType, out: u64, n: u64) -> Launch {
    per_element(
        "cast_f32",
        n,
        vec![
            Arg::Ptr(w),
            Arg::Ptr(out),
            Arg::I64(n as i64),
            Arg::I32(cast_code(dtype).expect("the plan checked the dtype")),
        ],
    )
}

pub fn silu(x: u64, out: u64, n: u64) -> Launch {
    per_element(
        "silu_f32",
        n,
        vec![Arg::Ptr(x), Arg::Ptr(out), Arg::I64(n as i64)],
    )
}

/// GELU (tanh approximation) of `n` floats.
pub fn gelu(x: u64, out: u64, n: u64) -> Launch {
    per_element(
        "gelu_f32",
        n,
        vec![Arg::Ptr(x), Arg::Ptr(out), Arg::I64(n as i64)],
    )
}

/// `tanh(x / cap) * cap` of `n` floats.
pub fn softcap(x: u64, out: u64, n: u64, cap: f32) -> Launch {
    per_element(
        "softcap_f32",
        n,
        vec![
            Arg::Ptr(x),
            Arg::Ptr(out),
            Arg::I64(n as i64),
            Arg::F32(cap),
        ],
    )
}

/// Rotates `x [t, n_heads * head_dim]` into `out` with `cs` = (cos, sin) pairs `[t, half]`.
#[allow(clippy::too_many_arguments, reason = "the kernel's own signature")]
pub fn rope(
    x: u64,
    cs: u64,
    out: u64,
    t: u32,
    n_heads: u32,
    head_dim: u32,
    half: u32,
    neox: bool,
) -> Launch {
    let total = u64::from(t) * u64::from(n_heads) * u64::from(head_dim);
    per_element(
        "rope_f32",
        total,
        vec![
            Arg::Ptr(x),
            Arg::Ptr(cs),
            Arg::Ptr(out),
            Arg::I32(t as i32),
            Arg::I32(n_heads as i32),
            Arg::I32(head_dim as i32),
            Arg::I32(half as i32),
            Arg::I32(i32::from(neox)),
        ],
    )
}

pub fn embedding(table: u64, dtype: DType, ids: u64, out: u64, n_ids: u32, dim: u32) -> Launch {
    per_row_element(
        "embedding",
        dim,
        n_ids,
        vec![
            Arg::Ptr(table),
            Arg::Ptr(ids),
            Arg::Ptr(out),
            Arg::I32(dim as i32),
            Arg::I32(dtype_code(dtype).expect("the plan checked the dtype")),
        ],
    )
}

/// `out [o, w]` = columns `start..start + w` of `x [o, in_w]` (a slice along one axis, the
/// axes before it folded into `o`, the axis and those after into `in_w`).
pub fn slice_cols(x: u64, out: u64, o: u32, in_w: u32, w: u32, start: u32) -> Launch {
    per_row_element(
        "slice_cols",
        w,
        o,
        vec![
            Arg::Ptr(x),
            Arg::Ptr(out),
            Arg::I32(in_w as i32),
            Arg::I32(w as i32),
            Arg::I32(start as i32),
        ],
    )
}

pub fn gather_rows(x: u64, rows: u64, out: u64, r: u32, d: u32) -> Launch {
    per_row_element(
        "gather_rows",
        d,
        r,
        vec![
            Arg::Ptr(x),
            Arg::Ptr(rows),
            Arg::Ptr(out),
            Arg::I32(d as i32),
        ],
    )
}

/// Shapes of one paged-attention launch sequence (see attention.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub t: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub block_size: u32,
    pub max_blocks: u32,
}

impl AttnShape {
    /// Positions a score row holds: the block table's reach.
    pub fn ctx(&self) -> u32 {
        self.max_blocks * self.block_size
    }
    /// Scratch floats: every score row, then one inverse sum per (token, head).
    pub fn scratch_floats(&self) -> u64 {
        let rows = u64::from(self.t) * u64::from(self.n_heads);
        rows * u64::from(self.ctx()) + rows
    }
}

/// Device addresses one paged attention reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnAddrs {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub out: u64,
    pub slots: u64,
    pub seqs: u64,
    pub positions: u64,
    pub tables: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    /// `AttnShape::scratch_floats` floats.
    pub scratch: u64,
}

/// The four launches of one paged attention: KV write, scores, softmax, weighted sum.
/// `window` > 0 reads only each token's last `window` positions; `softcap` > 0 caps scores.
pub fn paged_attention(
    s: &AttnShape,
    a: &AttnAddrs,
    scale: f32,
    window: u32,
    softcap: f32,
) -> [Launch; 4] {
    let row = s.n_kv_heads * s.head_dim;
    let rows = s.t * s.n_heads;
    let inv = a.scratch + u64::from(rows) * u64::from(s.ctx()) * 4;
    let ptr = Arg::Ptr;
    let int = |v: u32| Arg::I32(v as i32);
    [
        per_row_element(
            "kv_write",
            row,
            s.t,
            vec![
                ptr(a.k),
                ptr(a.v),
                ptr(a.slots),
                ptr(a.k_cache),
                ptr(a.v_cache),
                int(row),
            ],
        ),
        per_row_element(
            "attn_scores",
            s.ctx(),
            rows,
            vec![
                ptr(a.q),
                ptr(a.k_cache),
                ptr(a.tables),
                ptr(a.seqs),
                ptr(a.positions),
                ptr(a.scratch),
                int(s.n_heads),
                int(s.n_kv_heads),
                int(s.head_dim),
                int(s.block_size),
                int(s.max_blocks),
                int(s.ctx()),
                Arg::F32(scale),
                int(window),
                Arg::F32(softcap),
            ],
        ),
        launch(
            "attn_softmax",
            [rows, 1, 1],
            vec![
                ptr(a.scratch),
                ptr(inv),
                ptr(a.positions),
                int(s.n_heads),
                int(s.ctx()),
                int(window),
            ],
        ),
        per_row_element(
            "attn_out",
            s.head_dim,
            rows,
            vec![
                ptr(a.scratch),
                ptr(inv),
                ptr(a.v_cache),
                ptr(a.tables),
                ptr(a.seqs),
                ptr(a.positions),
                ptr(a.out),
                int(s.n_heads),
                int(s.n_kv_heads),
                int(s.head_dim),
                int(s.block_size),
                int(s.max_blocks),
                int(s.ctx()),
                int(window),
            ],
        ),
    ]
}

/// Fault injection: one block spinning on the GPU timer for `ns` (see stall.cu).
pub fn stall(ns: u64, sink: u64) -> Launch {
    Launch {
        kernel: "stall",
        grid: [1, 1, 1],
        block: [32, 1, 1],
        args: vec![Arg::U64(ns), Arg::Ptr(sink)],
    }
}

#[cfg(test)]
#[path = "ops_tests.rs"]
mod tests;
