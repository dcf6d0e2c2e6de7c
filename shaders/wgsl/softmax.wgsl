// Softmax over rows of d, one workgroup per row.
struct P { d: u32, rows: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: P;
var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x;
    if (r >= p.rows) { return; }
    let o = r * p.d;
    var m = -3.4028235e38;
    for (var i = li; i < p.d; i += 64u) { m = max(m, x[o + i]); }
    red[li] = m;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if (li < k) { red[li] = max(red[li], red[li + k]); }
        workgroupBarrier();
    }
    let mx = red[0];
    workgroupBarrier();
    var s = 0.0;
    for (var i = li; i < p.d; i += 64u) { s += exp(x[o + i] - mx); }
    red[li] = s;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if (li < k) { red[li] += red[li + k]; }
        workgroupBarrier();
    }
    let total = red[0];
    for (var i = li; i < p.d; i += 64u) { y[o + i] = exp(x[o + i] - mx) / total; }
}
