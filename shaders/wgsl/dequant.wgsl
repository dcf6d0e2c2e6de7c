// y = the f32 values of a small stored tensor (norm weights, biases): rows of d.
// `r0` is the first row of this binding's part (weights split across bindings).
struct P { d: u32, row_bytes: u32, chunks: u32, rows: u32, lanes_x: u32, r0: u32, _b: u32, _c: u32 }
@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.lanes_x;
    if (i >= p.rows * p.chunks) { return; }
    let r = i / p.chunks;
    let c = i % p.chunks;
    var w: array<f32, 32>;
    decode32(r * p.row_bytes, c, p.d, &w);
    let lim = min(32u, p.d - c * 32u);
    for (var j = 0u; j < lim; j++) { y[(p.r0 + r) * p.d + c * 32u + j] = w[j]; }
}
