//! The CUDA kernels' numerics on the CPU: each kernel *source* (`shaders/cuda/*.cu`) is built
//! by the host C++ compiler against `cpu_shim.h` and launched through the same `ops`
//! descriptions the GPU runtime uses, then compared with the CPU runtime's kernels under the
//! bound stated at each test. Shapes are the models' and ragged ones (rows not a multiple of
//! a block's 8, blocks per row not a multiple of 32 lanes, float rows of odd length).
mod common;

use common::{abs_dots, dequant, dot_bound, packed, Rng, MATMUL_DTYPES};
use poot_core::DType;
use poot_cpu::kernels::{self as cpu, RopeConfig, RopeScaling, RopeStyle, RopeTable};
use poot_cpu::ThreadPool;
use poot_cuda::ops::{self, Launch};
use poot_cuda::shim::Shim;

fn shim() -> Option<&'static Shim> {
    match Shim::get() {
        Ok(s) => Some(s),
        // No compiler at all: say so and skip; a compiler that rejects the sources fails.
        Err(e) if e.starts_with("running") => {
            eprintln!("SKIP: no host C++ compiler for the CUDA shim ({e})");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn addr<T>(v: &[T]) -> u64 {
    v.as_ptr() as u64
}

/// An output buffer's address: taken from a mutable borrow, since the kernel writes it.
fn out<T>(v: &mut [T]) -> u64 {
    v.as_mut_ptr() as u64
}

fn launch(s: &Shim, l: &Launch) {
    // SAFETY: every test below sizes its host buffers for the launch's shapes.
    unsafe { s.launch(l) }.unwrap();
}

/// Matvec/matmul shapes: (t, n, k). SmolLM2's (576 -> 1536), a row count off the 8-row
/// block, blocks per row off the 32 lanes, and token counts below, past and across the
/// 4-token group a warp computes from one decode of its row.
const MATMUL_SHAPES: [(usize, usize, usize); 6] = [
    (1, 1536, 576),
    (1, 13, 96),
    (3, 67, 1088),
    (2, 5, 32),
    (6, 67, 1088),
    (9, 13, 96),
];

#[test]
fn matvec_matches_the_cpu_runtime_for_every_packed_dtype() {
    let Some(s) = shim() else { return };
    let pool = ThreadPool::new(1).unwrap();
    let mut rng = Rng(7);
    for dtype in MATMUL_DTYPES {
        for (t, n, k) in MATMUL_SHAPES {
            let w = packed(dtype, n, k, &mut rng);
            let x = rng.vec(t * k);
            let mut got = vec![f32::NAN; t * n];
            launch(
                s,
                &ops::matvec(
                    dtype,
                    addr(&w),
                    addr(&x),
                    out(&mut got),
                    t as u32,
                    n as u32,
                    k as u32,
                ),
            );
            let mut want = vec![0.0; t * n];
            cpu::matmul(&x, t, k, &w, dtype, n, &mut want, &pool).unwrap();
            let sums = abs_dots(&x, t, k, &dequant(dtype, &w, n * k), n);
            for i in 0..t * n {
                let err = f64::from((got[i] - want[i]).abs());
                assert!(
                    err <= dot_bound(k, sums[i]),
                    "{dtype} t={t} n={n} k={k} [{i}]: shim {} cpu {} (bound {})",
                    got[i],
                    want[i],
                    dot_bound(k, sums[i])
                );
            }
        }
    }
}

/// A token's row is summed in the same order whatever the tokens beside it: the matvec of 7
/// tokens gives, for each, the bits of that token alone.
#[test]
fn a_tokens_result_does_not_depend_on_the_token_count() {
    let Some(s) = shim() else { return };
    let mut rng = Rng(13);
    let (t, n, k) = (7, 19, 160);
    for dtype in MATMUL_DTYPES {
        let w = packed(dtype, n, k, &mut rng);
        let x = rng.vec(t * k);
        let run = |x: &[f32], t: usize| {
            let mut got = vec![f32::NAN; t * n];
            launch(
                s,
                &ops::matvec(
                    dtype,
                    addr(&w),
                    addr(x),
                    out(&mut got),
                    t as u32,
                    n as u32,
                    k as u32,
                ),
            );
            got
        };
        let all = run(&x, t);
        for i in 0..t {
            let one = run(&x[i * k..(i + 1) * k], 1);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&all[i * n..(i + 1) * n]),
                bits(&one),
                "{dtype} token {i}"
            );
        }
    }
}

#[test]
fn f32_weights_of_odd_length_take_the_ragged_tail() {
    let Some(s) = shim() else { return };
    let pool = ThreadPool::new(1).unwrap();
    let mut rng = Rng(11);
    for dtype in [DType::F32, DType::F16] {
        for (t, n, k) in [(1, 9, 37), (2, 3, 100)] {
            let w = packed(dtype, n, k, &mut rng);
            let x = rng.vec(t * k);
            let mut got = vec![f32::NAN; t * n];
            launch(
                s,
                &ops::matvec(
                    dtype,
                    addr(&w),
                    addr(&x),
                    out(&mut got),
                    t as u32,
                    n as u32,
                    k as u32,
                ),
            );
            let mut want = vec![0.0; t * n];
            cpu::matmul(&x, t, k, &w, dtype, n, &mut want, &pool).unwrap();
            let sums = abs_dots(&x, t, k, &dequant(dtype, &w, n * k), n);
            for i in 0..t * n {
                assert!(
                    f64::from((got[i] - want[i]).abs()) <= dot_bound(k, sums[i]),
                    "{dtype} [{i}]"
                );
            }
        }
    }
}

/// RMS norm: the f64 sum's order is the only difference from the CPU kernel, far below one
/// f32 rounding of the mean, so the outputs are equal to within 2 ulp of each value.
#[test]
fn rms_norm_matches_the_cpu_runtime() {
    let Some(s) = shim() else { return };
    let mut rng = Rng(3);
    for (t, d) in [(1, 576), (3, 2048), (2, 77)] {
        let x = rng.vec(t * d);
        let w = rng.vec(d);
        let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut got = vec![f32::NAN; t * d];
        launch(
            s,
            &ops::rms_norm(addr(&x), addr(&w), out(&mut got), t as u32, d as u32, 1e-5),
        );
        let mut want = vec![0.0; t * d];
        cpu::rms_norm(&x, t, d, &wb, DType::F32, 1e-5, &mut want).unwrap();
        for i in 0..t * d {
            assert!(
                (got[i] - want[i]).abs() <= 2.0 * f32::EPSILON * want[i].abs(),
                "t={t} d={d} [{i}]: {} vs {}",
                got[i],
                want[i]
            );
        }
    }
}

/// Add and mul round once, as the CPU does: equal bits. SiLU: the host libm's expf against
/// Rust's exp, within 4 ulp of the result.
#[test]
fn elementwise_ops_match_the_cpu_runtime() {
    let Some(s) = shim() else { return };
    let mut rng = Rng(5);
    let (n, nb) = (3 * 1000, 1000);
    let a: Vec<f32> = rng.vec(n).iter().map(|v| v * 8.0).collect();
    let b = rng.vec(nb);
    for (kernel, f) in [
        ("add_f32", (|x, y| x + y) as fn(f32, f32) -> f32),
        ("mul_f32", |x, y| x * y),
    ] {
        let mut got = vec![f32::NAN; n];
        launch(
            s,
            &ops::binary(
                kernel,
                addr(&a),
                addr(&b),
                out(&mut got),
                n as u64,
                nb as u64,
            ),
        );
        for i in 0..n {
            assert_eq!(
                got[i].to_bits(),
                f(a[i], b[i % nb]).to_bits(),
                "{kernel} [{i}]"
            );
        }
    }
    let mut got = vec![f32::NAN; n];
    launch(s, &ops::silu(addr(&a), out(&mut got), n as u64));
    for i in 0..n {
        let want = cpu::act::silu_f32(a[i]);
        assert!(
            (got[i] - want).abs() <= 4.0 * f32::EPSILON * want.abs().max(f32::MIN_POSITIVE),
            "silu({}) {} vs {want}",
            a[i],
            got[i]
        );
    }
    // GELU and soft-capping: the CPU's operations, tanhf within a few ulp (of the output's
    // magnitude: 1 + tanh loses the relative bound near -1).
    let mut got = vec![f32::NAN; n];
    launch(s, &ops::gelu(addr(&a), out(&mut got), n as u64));
    for i in 0..n {
        let want = cpu::act::gelu_tanh_f32(a[i]);
        assert!(
            (got[i] - want).abs() <= 8.0 * f32::EPSILON * a[i].abs().max(1.0),
            "gelu({}) {} vs {want}",
            a[i],
            got[i]
        );
    }
    let mut got = vec![f32::NAN; n];
    launch(s, &ops::softcap(addr(&a), out(&mut got), n as u64, 0.75));
    for i in 0..n {
        let want = (a[i] * (1.0 / 0.75f32)).tanh() * 0.75;
        assert!(
            (got[i] - want).abs() <= 4.0 * f32::EPSILON,
            "softcap({}) {} vs {want}",
            a[i],
            got[i]
        );
    }
}

/// RoPE with the host's angles: each output is the CPU's two rounded products and one add,
/// so equal bits, for both pairings, partial rotation and scaled frequencies.
#[test]
fn rope_matches_the_cpu_runtime_bit_for_bit() {
    let Some(s) = shim() else { return };
    let mut rng = Rng(9);
    let cases = [
        (RopeStyle::Interleaved, 64, 64, RopeScaling::None, 9),
        (
            RopeStyle::NeoX,
            64,
            32,
            RopeScaling::Linear { factor: 2.0 },
            3,
        ),
        (
            RopeStyle::NeoX,
            128,
            128,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 8192,
            },
            4,
        ),
    ];
    for (style, head_dim, rot_dim, scaling, n_heads) in cases {
        let table = RopeTable::new(&RopeConfig {
            style,
            head_dim,
            rot_dim,
            theta: 10000.0,
            scaling,
        })
        .unwrap();
        let t = 5;
        let positions: Vec<i32> = vec![0, 1, 7, 300, 4095];
        let x = rng.vec(t * n_heads * head_dim);
        let mut cs = Vec::new();
        cpu::rope_angles(&positions, &table, &mut cs).unwrap();
        let csf: Vec<f32> = cs.iter().flat_map(|&(c, s)| [c, s]).collect();
        let mut got = vec![f32::NAN; x.len()];
        let neox = style == RopeStyle::NeoX;
        launch(
            s,
            &ops::rope(
                addr(&x),
                addr(&csf),
                out(&mut got),
                t as u32,
                n_heads as u32,
                head_dim as u32,
                (rot_dim / 2) as u32,
                neox,
            ),
        );
        let mut want = x.clone();
        cpu::rope(&mut want, t, n_heads, &positions, &table).unwrap();
        for i in 0..x.len() {
            assert_eq!(
                got[i].to_bits(),
                want[i].to_bits(),
                "{style:?} rot {rot_dim} [{i}]: {} vs {}",
                got[i],
                want[i]
            );
        }
    }
}

/// Embedding rows and gathered rows are exact decodes / copies: equal bits.
#[test]
fn embedding_and_gather_rows_are_exact() {
    let Some(s) = shim() else { return };
    let mut rng = Rng(13);
    let (vocab, dim) = (50, 576);
    let ids: Vec<i32> = vec![0, 49, 7, 7, 23];
    for dtype in MATMUL_DTYPES {
        let table = packed(dtype, vocab, dim, &mut rng);
        let mut got = vec![f32::NAN; ids.len() * dim];
        launch(
            s,
            &ops::embedding(
                addr(&table),
                dtype,
                addr(&ids),
                out(&mut got),
                ids.len() as u32,
                dim as u32,
            ),
        );
        let mut want = vec![0.0; ids.len() * dim];
        cpu::embedding(&table, dtype, vocab, dim, &ids, &mut want).unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{dtype}"
        );
    }
    let x = rng.vec(6 * 300);
    let rows: Vec<i32> = vec![5, 0, 2];
    let mut got = vec![f32::NAN; 3 * 300];
    launch(
        s,
        &ops::gather_rows(addr(&x), addr(&rows), out(&mut got), 3, 300),
    );
    for (r, &src) in rows.iter().enumerate() {
        assert_eq!(
            &got[r * 300..(r + 1) * 300],
            &x[src as usize * 300..(src as usize + 1) * 300]
        );
    }
}

/// The runtime without a driver: a typed error that names what is missing.
#[test]
fn without_a_driver_the_runtime_is_a_typed_error() {
    if std::env::var("POOT_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
        return; // a device machine: the device suite covers construction
    }
    match poot_cuda::CudaRuntime::new(poot_cuda::CudaOptions::default()) {
        Ok(rt) => eprintln!(
            "SKIP: this machine has a CUDA device ({})",
            rt.device().name
        ),
        Err(poot_runtime::RuntimeError::DeviceUnavailable { backend, missing }) => {
            assert_eq!(backend, "cuda");
            assert!(
                missing.contains("libcuda.so.1")
                    || missing.contains("NVRTC")
                    || missing.contains("device"),
                "{missing}"
            );
        }
        Err(e) => panic!("expected DeviceUnavailable, got {e:?}"),
    }
}

/// A slice along any axis is an exact copy of the CPU's columns.
#[test]
fn slice_cols_copies_the_columns() {
    let Some(s) = shim() else { return };
    let mut rng = Rng(29);
    // x [3, 5, 40] sliced on axis 1 to 1..4: [3, 120] columns 40..160 of [3, 200].
    let x = rng.vec(3 * 5 * 40);
    let mut got = vec![f32::NAN; 3 * 3 * 40];
    launch(
        s,
        &ops::slice_cols(addr(&x), out(&mut got), 3, 200, 120, 40),
    );
    for o in 0..3 {
        assert_eq!(
            &got[o * 120..(o + 1) * 120],
            &x[o * 200 + 40..o * 200 + 160]
        );
    }
}
