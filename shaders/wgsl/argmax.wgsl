// Greedy sampling: y[r] = index of the first maximum of row r; NaN never wins (a row of only
// NaN gives 0, as the CPU sampler). One workgroup per row; NONE marks "no value seen".
struct P { v: u32, rows: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<i32>;
@group(0) @binding(2) var<uniform> p: P;
var<workgroup> bv: array<f32, 64>;
var<workgroup> bi: array<u32, 64>;
const NONE: u32 = 0xffffffffu;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x;
    if (r >= p.rows) { return; }
    let o = r * p.v;
    var best = 0.0;
    var idx = NONE;
    // Each lane scans increasing indices, so a strict `>` keeps its first maximum.
    for (var i = li; i < p.v; i += 64u) {
        let v = x[o + i];
        if (v == v && (idx == NONE || v > best)) { best = v; idx = i; }
    }
    bv[li] = best;
    bi[li] = idx;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if (li < k) {
            let j = bi[li + k];
            let w = bv[li + k];
            let i = bi[li];
            if (j != NONE && (i == NONE || w > bv[li] || (w == bv[li] && j < i))) {
                bv[li] = w;
                bi[li] = j;
            }
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        var out = bi[0];
        if (out == NONE) { out = 0u; }
        y[r] = i32(out);
    }
}
