// What matmul.wgsl and matmul_subgroup.wgsl share (prepended to both): y[t, n_off + n] =
// sum_k x[t, k] * W[n, k] for the rows n of W held by this binding. A workgroup of 64 lanes
// takes 8 weight rows and a tile of TT tokens: 8 lanes share a row, lane s decoding its 32-value
// chunks s, s + 8, ... once each and multiplying them into the TT token rows of x
// (`lane_sums`). A GPU so gets 8 lanes per row and neighbouring lanes read neighbouring chunks.
// Each kernel then adds a row's 8 lane sums in a fixed order of its own. A lane's sum for a
// token runs in chunk order whatever the number of tokens, so a row's result does not depend on
// the tokens beside it.
struct P { n: u32, k: u32, t: u32, row_bytes: u32, n_off: u32, out_stride: u32, chunks: u32, gx: u32 }
@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
const TT: u32 = 8u;
const SPLIT: u32 = 8u;

// Lane s's sums of row n for tokens t0..t0 + tn (zeros past the last row or token).
fn lane_sums(n: u32, s: u32, t0: u32, tn: u32) -> array<f32, 8> {
    var acc: array<f32, 8>;
    if (n < p.n) {
        var w: array<f32, 32>;
        let base = n * p.row_bytes;
        for (var c = s; c < p.chunks; c += SPLIT) {
            decode32(base, c, p.k, &w);
            let lim = min(32u, p.k - c * 32u);
            for (var tt = 0u; tt < tn; tt++) {
                let xo = (t0 + tt) * p.k + c * 32u;
                var sum = 0.0;
                for (var j = 0u; j < lim; j++) { sum += w[j] * x[xo + j]; }
                acc[tt] += sum;
            }
        }
    }
    return acc;
}
