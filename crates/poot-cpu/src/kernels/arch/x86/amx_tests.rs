//! The AMX tiles: present where the CPU says so, and bit-identical to the block order's scalar
//! reference on every kind, ragged shape, partial token tile and pool thread.

use super::*;
use crate::kernels::arch::generic::qdot_generic::dot_scalar_blocks;
use crate::kernels::qact::quantize_row_q8;
use crate::testutil::{synthetic_weights, Rng};
use poot_core::DType;
use std::arch::asm;

fn cpuinfo_has(flag: &str) -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| s.split_whitespace().any(|w| w == flag))
        .unwrap_or(false)
}

#[test]
fn available_where_the_cpu_and_linux_have_tiles() {
    // Linux lists amx_int8 only where the kernel manages tile state, and then grants it on
    // request; a refusal here would silently drop the fast path.
    let listed = cfg!(target_os = "linux") && cpuinfo_has("amx_int8") && cpuinfo_has("avx512bw");
    assert_eq!(available(), listed, "AMX availability vs /proc/cpuinfo");
    println!("AMX available: {}", available());
}

#[test]
fn bit_identical_to_the_block_order_on_every_thread() {
    if !crate::testutil::isa_runs("amx", available()) {
        return;
    }
    let mut rng = Rng::new(5);
    for dt in [DType::Q4_0, DType::Q5_0, DType::Q8_0] {
        let kind = Format::of(dt).unwrap();
        // Panels cut by the matrix's end (n = 8 and 40: a missing second group; 21: ragged),
        // token tiles whole, partial, and both; up to 20 panels over 4 threads.
        for (n, k, t) in [(8, 64, 2), (21, 96, 17), (40, 512, 16), (320, 128, 35)] {
            let w = synthetic_weights(dt, n, k, 29);
            let nb = k / 32;
            let x: Vec<f32> = (0..t * k)
                .map(|i| rng.uniform(-3.0, 3.0) * (i % 9) as f32)
                .collect();
            let mut a = vec![BlockQ8::default(); t * nb];
            for (xr, ar) in x.chunks_exact(k).zip(a.chunks_exact_mut(nb)) {
                quantize_row_q8(xr, ar, kind.act_sum());
            }
            let rb = w.len() / n;
            let want: Vec<u32> = (0..t * n)
                .map(|i| {
                    let (j, r) = (i / n, i % n);
                    let row = &w[r * rb..(r + 1) * rb];
                    dot_scalar_blocks(kind, row, &a[j * nb..(j + 1) * nb]).to_bits()
                })
                .collect();
            let rp = Repacked::new(kind, &w, n, nb);
            for threads in [1, 4] {
                let pool = ThreadPool::new(threads).unwrap();
                let mut out = vec![f32::NAN; t * n];
                matmul(&rp, &a, t, &mut out, &pool);
                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{dt} n={n} k={k} t={t} x{threads}");
            }
        }
    }
}

#[test]
fn a_configuration_the_thread_had_survives_a_call() {
    if !crate::testutil::isa_runs("amx", available()) {
        return;
    }
    // Another library's tiles on the calling thread (which runs tasks too): tmm7 as 2 x 8.
    let mut theirs = TileConfig::zeroed();
    theirs.palette = 1;
    theirs.colsb[7] = 8;
    theirs.rows[7] = 2;
    // SAFETY: tile permission held (`available`); a valid palette-1 configuration.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &theirs, options(nostack, readonly)) };
    let (n, k, t) = (64, 128, 20);
    let w = synthetic_weights(DType::Q4_0, n, k, 3);
    let a = vec![BlockQ8::default(); t * k / 32];
    let rp = Repacked::new(Format::Q4_0, &w, n, k / 32);
    let mut out = vec![0.0f32; t * n];
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads).unwrap();
        matmul(&rp, &a, t, &mut out, &pool);
    }
    let mut after = TileConfig::zeroed();
    // SAFETY: as above; a tile instruction on tmm7 faults unless its configuration is back.
    unsafe {
        asm!("tilezero tmm7", options(nostack, nomem));
        asm!("sttilecfg [{}]", in(reg) &mut after, options(nostack));
        asm!("tilerelease", options(nostack, nomem));
    }
    assert_eq!((after.palette, after.colsb[7], after.rows[7]), (1, 8, 2));
    assert_eq!((after.colsb[0], after.rows[0]), (0, 0), "ours is gone");
}
