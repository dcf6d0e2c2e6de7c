// y[r, :] = x[rows[r], :]; rows were checked against t on the host.
struct P { r: u32, d: u32, t: u32, lanes_x: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> rows: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.lanes_x;
    if (i >= p.r * p.d) { return; }
    let src = rows[i / p.d];
    if (src < 0 || u32(src) >= p.t) { y[i] = 0.0; return; }
    y[i] = x[u32(src) * p.d + i % p.d];
}
