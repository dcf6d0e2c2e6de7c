// y[t, n_off + n] = dot(W[n], x[t]) for Q4_K/Q6_K weights against Q8_K activations
// (quant_q8k.wgsl, 81 words per block), in the CPU runtime's ggml order (qdot_k.rs): per
// super-block the exact integers (sumi, summ) from `kdot` (specialized per dtype by
// kdot_<dtype>.wgsl), then acc = fma(d_w * d_x, sumi, acc), accm = fma(dmin_w * d_x, summ,
// accm); the result is acc - accm. Every integer step is exact, so only the fusion of WGSL's
// `fma` can differ from the CPU. One lane per weight row and token.
struct P { n: u32, k: u32, t: u32, row_bytes: u32, n_off: u32, out_stride: u32, blocks: u32, gx: u32 }
@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read> qa: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

// The i8 activation quant `i` of the Q8_K block at word `ab`.
fn aq(ab: u32, i: u32) -> i32 {
    return bitcast<i32>(qa[ab + (i >> 2u)] << (24u - 8u * (i & 3u))) >> 24u;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = gid.x + gid.y * p.gx * 64u;
    let t = gid.z;
    if (n >= p.n || t >= p.t) { return; }
    var acc = 0.0;
    var accm = 0.0;
    for (var sb = 0u; sb < p.blocks; sb++) {
        let base = n * p.row_bytes + sb * KBYTES;
        let ab = (t * p.blocks + sb) * 81u;
        let ints = kdot(base, ab);
        let dx = bitcast<f32>(qa[ab + 64u]);
        let dm = kscales(base);
        acc = fma(dm.x * dx, f32(ints.x), acc);
        accm = fma(dm.y * dx, f32(ints.y), accm);
    }
    y[t * p.out_stride + p.n_off + n] = acc - accm;
}
