// y[t, n_off + n] = dot(W[n], x[t]) in llama.cpp's CPU arithmetic, x being Q8_0/Q8_1 blocks from
// quant_q8.wgsl (10 words per block). Per 32-block the integer products are summed exactly in
// 8 lanes of 4 values (i32), then acc[l] = fma(d_w * d_x, lane_l, acc[l]) block after block and,
// for Q4_1, summs = fma(m_w, s_x, summs); the result is hsum8(acc) + summs: ggml's AVX2
// ggml_vec_dot_*_q8_* order (the CPU runtime's qdot.rs), so only fma fusion can differ.
// One lane per weight row and tile of TT tokens, as matmul.wgsl.
struct P { n: u32, k: u32, t: u32, row_bytes: u32, n_off: u32, out_stride: u32, chunks: u32, gx: u32 }
@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read> qa: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
const TT: u32 = 4u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = gid.x + gid.y * p.gx * 64u;
    let t0 = gid.z * TT;
    if (n >= p.n) { return; }
    let tn = min(TT, p.t - t0);
    var acc: array<f32, 32>;
    var summs: array<f32, 4>;
    var w: array<i32, 32>;
    let base = n * p.row_bytes;
    for (var c = 0u; c < p.chunks; c++) {
        let dm = qdecode32(base, c, &w);
        for (var tt = 0u; tt < tn; tt++) {
            let ab = ((t0 + tt) * p.chunks + c) * 10u;
            let scale = dm.x * bitcast<f32>(qa[ab + 8u]);
            for (var l = 0u; l < 8u; l++) {
                let word = qa[ab + l];
                var lane: i32 = 0;
                for (var i = 0u; i < 4u; i++) {
                    lane += w[4u * l + i] * (bitcast<i32>(word << (24u - 8u * i)) >> 24u);
                }
                acc[tt * 8u + l] = fma(scale, f32(lane), acc[tt * 8u + l]);
            }
            summs[tt] = fma(dm.y, bitcast<f32>(qa[ab + 9u]), summs[tt]);
        }
    }
    for (var tt = 0u; tt < tn; tt++) {
        let a = tt * 8u;
        // ggml's hsum8: (a0+a4 + a2+a6) + (a1+a5 + a3+a7).
        let r = ((acc[a + 4u] + acc[a]) + (acc[a + 6u] + acc[a + 2u]))
            + ((acc[a + 5u] + acc[a + 1u]) + (acc[a + 7u] + acc[a + 3u]));
        y[(t0 + tt) * p.out_stride + p.n_off + n] = r + summs[tt];
    }
}
