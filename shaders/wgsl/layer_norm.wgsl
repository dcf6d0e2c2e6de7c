// Layer norm over rows of d: y = ((x - mean) * (1 / sqrt(var + eps))) * w + b, mean and the
// biased variance by two workgroup reductions in f32 (the CPU sums in f64). flags: bit 0 a
// weight is bound at `w`, bit 1 a bias at `bb` (otherwise those bindings hold x, unread).
struct P { d: u32, rows: u32, eps: f32, flags: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> bb: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: P;
var<workgroup> red: array<f32, 64>;

fn row_sum(li: u32) -> f32 {
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if (li < k) { red[li] += red[li + k]; }
        workgroupBarrier();
    }
    return red[0];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x;
    let o = r * p.d;
    var s = 0.0;
    for (var i = li; i < p.d; i += 64u) { s += x[o + i]; }
    red[li] = s;
    let mean = row_sum(li) / f32(p.d);
    workgroupBarrier();
    var q = 0.0;
    for (var i = li; i < p.d; i += 64u) { let c = x[o + i] - mean; q += c * c; }
    red[li] = q;
    let rstd = 1.0 / sqrt(row_sum(li) / f32(p.d) + p.eps);
    for (var i = li; i < p.d; i += 64u) {
        var v = (x[o + i] - mean) * rstd;
        if ((p.flags & 1u) != 0u) { v = v * w[i]; }
        if ((p.flags & 2u) != 0u) { v = v + bb[i]; }
        y[o + i] = v;
    }
}
