// Elementwise ops over f32: 0 add, 1 mul (b broadcast by `i % bn`), 2 silu, 3 gelu (tanh).
struct P { n: u32, bn: u32, op: u32, lanes_x: u32 }
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.lanes_x;
    if (i >= p.n) { return; }
    let v = a[i];
    let u = b[i % p.bn];
    var r: f32;
    switch p.op {
        case 0u: { r = v + u; }
        case 1u: { r = v * u; }
        case 2u: { r = v / (1.0 + exp(-v)); }
        default: {
            r = 0.5 * v * (1.0 + tanh(0.7978845608 * (v + 0.044715 * v * v * v)));
        }
    }
    y[i] = r;
}
