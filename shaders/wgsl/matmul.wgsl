// y[t, n_off + n] = sum_k x[t, k] * W[n, k] for the rows n of W held by this binding.
// One lane per weight row and tile of TT tokens: the lane decodes each 32-value chunk of its row
// once and multiplies it into the TT token rows of x (read by every lane alike), so there are
// no barriers and no workgroup memory; the f32 sum over k runs in chunk order.
struct P { n: u32, k: u32, t: u32, row_bytes: u32, n_off: u32, out_stride: u32, chunks: u32, gx: u32 }
@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
const TT: u32 = 8u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = gid.x + gid.y * p.gx * 64u;
    let t0 = gid.z * TT;
    if (n >= p.n) { return; }
    let tn = min(TT, p.t - t0);
    var acc: array<f32, 8>;
    var w: array<f32, 32>;
    let base = n * p.row_bytes;
    for (var c = 0u; c < p.chunks; c++) {
        decode32(base, c, p.k, &w);
        let lim = min(32u, p.k - c * 32u);
        for (var tt = 0u; tt < tn; tt++) {
            let xo = (t0 + tt) * p.k + c * 32u;
            var s = 0.0;
            for (var j = 0u; j < lim; j++) { s += w[j] * x[xo + j]; }
            acc[tt] += s;
        }
    }
    for (var tt = 0u; tt < tn; tt++) {
        y[(t0 + tt) * p.out_stride + p.n_off + n] = acc[tt];
    }
}
