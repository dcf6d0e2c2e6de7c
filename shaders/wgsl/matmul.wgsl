// y[t, n_off + n] = sum_k x[t, k] * W[n, k] for the rows n of W held by this binding.
// A workgroup of 64 lanes takes 8 weight rows and a tile of TT tokens: 8 lanes share a row, lane
// s decoding its 32-value chunks s, s + 8, ... once each and multiplying them into the TT token
// rows of x; then lane 0 of the row adds the 8 lanes' sums in lane order. A GPU so gets 8 lanes
// per row and neighbouring lanes read neighbouring chunks. Each token's sum runs in the same
// order (chunk order within a lane, then lanes 0..7) whatever the number of tokens, so a row's
// result does not depend on the tokens beside it.
struct P { n: u32, k: u32, t: u32, row_bytes: u32, n_off: u32, out_stride: u32, chunks: u32, gx: u32 }
@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
const TT: u32 = 8u;
const SPLIT: u32 = 8u;
// The lanes' sums: [row in group][token][lane of the row].
var<workgroup> part: array<f32, 512>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = li / SPLIT;
    let s = li % SPLIT;
    let n = (wg.x + wg.y * p.gx) * (64u / SPLIT) + r;
    let t0 = wg.z * TT;
    let tn = min(TT, p.t - t0);
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
    for (var tt = 0u; tt < TT; tt++) {
        part[(r * TT + tt) * SPLIT + s] = acc[tt];
    }
    workgroupBarrier();
    if (n < p.n && s == 0u) {
        for (var tt = 0u; tt < tn; tt++) {
            var total = 0.0;
            for (var l = 0u; l < SPLIT; l++) { total += part[(r * TT + tt) * SPLIT + l]; }
            y[(t0 + tt) * p.out_stride + p.n_off + n] = total;
        }
    }
}
