// y[r] = (x[r] * (1 / sqrt(mean(x[r]^2) + eps))) * w, one workgroup per row.
struct P { d: u32, rows: u32, eps: f32, _pad: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x;
    if (r >= p.rows) { return; }
    let o = r * p.d;
    var s = 0.0;
    for (var i = li; i < p.d; i += 64u) { s += x[o + i] * x[o + i]; }
    red[li] = s;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if (li < k) { red[li] += red[li + k]; }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(red[0] / f32(p.d) + p.eps);
    for (var i = li; i < p.d; i += 64u) { y[o + i] = (x[o + i] * scale) * w[i]; }
}
