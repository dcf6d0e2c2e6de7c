enable f16;
// F16 weights with f16 arithmetic (adapters with `shader-f16`, WgpuOptions::f16_arithmetic):
// as matmul.wgsl, but each product is taken in f16 (x rounded to f16, two products per
// vec2<f16> multiply) and the products are summed in f32. Bound: about 2^-10 relative per
// product, stated in the conformance suite.
struct P { n: u32, k: u32, t: u32, row_bytes: u32, n_off: u32, out_stride: u32, chunks: u32, gx: u32 }
@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
const TT: u32 = 8u;

fn wpair(off: u32) -> vec2<f16> {
    let a = off >> 2u;
    let s = (off & 3u) * 8u;
    var w = wt[a];
    if (s != 0u) { w = (w >> s) | (wt[a + 1u] << (32u - s)); }
    // f16 -> f32 -> f16 is exact (naga cannot bitcast u32 to vec2<f16>).
    return vec2<f16>(unpack2x16float(w));
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = gid.x + gid.y * p.gx * 64u;
    let t0 = gid.z * TT;
    if (n >= p.n) { return; }
    let tn = min(TT, p.t - t0);
    var acc: array<f32, 8>;
    let base = n * p.row_bytes;
    let pairs = p.k / 2u;
    for (var e = 0u; e < pairs; e++) {
        let w = wpair(base + 4u * e);
        for (var tt = 0u; tt < tn; tt++) {
            let xo = (t0 + tt) * p.k + 2u * e;
            let prod = vec2<f16>(vec2<f32>(x[xo], x[xo + 1u])) * w;
            acc[tt] += f32(prod.x) + f32(prod.y);
        }
    }
    if ((p.k & 1u) == 1u) {
        let w = f32(wpair(base + 2u * (p.k - 1u)).x);
        for (var tt = 0u; tt < tn; tt++) {
            acc[tt] += f32(f16(x[(t0 + tt) * p.k + p.k - 1u])) * w;
        }
    }
    for (var tt = 0u; tt < tn; tt++) {
        y[(t0 + tt) * p.out_stride + p.n_off + n] = acc[tt];
    }
}
