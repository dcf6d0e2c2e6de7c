// One value per row of d: op 0 sum, 1 mean (sum / d), 2 max (NaN anywhere gives NaN), by a
// workgroup reduction in f32 (the CPU sums in f64); `ninf` holds -inf's bits.
struct P { d: u32, rows: u32, op: u32, ninf: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: P;
var<workgroup> red: array<f32, 64>;

fn pick(m: f32, v: f32) -> f32 {
    if (v != v || m != m) { return v + m; }
    return max(m, v);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let o = wid.x * p.d;
    var s = 0.0;
    if (p.op == 2u) { s = bitcast<f32>(p.ninf); }
    for (var i = li; i < p.d; i += 64u) {
        if (p.op == 2u) { s = pick(s, x[o + i]); } else { s += x[o + i]; }
    }
    red[li] = s;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if (li < k) {
            if (p.op == 2u) { red[li] = pick(red[li], red[li + k]); } else { red[li] += red[li + k]; }
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        var r = red[0];
        if (p.op == 1u) { r = r / f32(p.d); }
        y[wid.x] = r;
    }
}
