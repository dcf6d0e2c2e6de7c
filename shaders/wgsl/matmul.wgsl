// y[t, n_off + n] = sum_k x[t, k] * W[n, k] for the rows n of W held by this binding.
// One workgroup per (n, tile of TT tokens): each lane decodes every WG-th 32-chunk of row n
// once and multiplies it into TT token rows; lanes are summed by a tree in workgroup memory.
struct P { n: u32, k: u32, t: u32, row_bytes: u32, n_off: u32, out_stride: u32, chunks: u32, gx: u32 }
@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
const TT: u32 = 8u;
const WG: u32 = 64u;
var<workgroup> red: array<f32, 512>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = wid.x + wid.y * p.gx;
    let t0 = wid.z * TT;
    if (n >= p.n) { return; }
    var acc: array<f32, 8>;
    var w: array<f32, 32>;
    let base = n * p.row_bytes;
    for (var c = li; c < p.chunks; c += WG) {
        decode32(base, c, p.k, &w);
        let lim = min(32u, p.k - c * 32u);
        for (var tt = 0u; tt < TT; tt++) {
            let t = t0 + tt;
            if (t < p.t) {
                let xo = t * p.k + c * 32u;
                var s = 0.0;
                for (var j = 0u; j < lim; j++) { s += w[j] * x[xo + j]; }
                acc[tt] += s;
            }
        }
    }
    for (var tt = 0u; tt < TT; tt++) { red[tt * WG + li] = acc[tt]; }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            for (var tt = 0u; tt < TT; tt++) { red[tt * WG + li] += red[tt * WG + li + s]; }
        }
        workgroupBarrier();
    }
    if (li < TT && t0 + li < p.t) {
        y[(t0 + li) * p.out_stride + p.n_off + n] = red[li * WG];
    }
}
