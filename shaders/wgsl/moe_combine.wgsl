// y[t, d] = sum over j = 0..k, in that order, of w[t, j] * x[t * k + j, d]: each token's
// expert outputs weighted by its routing weights, in the CPU runtime's order.
struct P { t: u32, d: u32, k: u32, lanes_x: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.lanes_x;
    if (i >= p.t * p.d) { return; }
    let t = i / p.d;
    let d = i % p.d;
    var acc = 0.0;
    for (var j = 0u; j < p.k; j++) {
        acc += w[t * p.k + j] * x[(t * p.k + j) * p.d + d];
    }
    y[i] = acc;
}
