// Greedy sampling: y[r] = index of the first maximum of row r, or -1 when the row holds a NaN or
// +inf or every value is -inf (the CPU sampler's rule: a broken row yields no token). One
// workgroup per row; NONE marks "no value seen". Non-finite values are recognised by their bits,
// since WGSL lets a compiler assume float arithmetic never sees them.
struct P { v: u32, rows: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<i32>;
@group(0) @binding(2) var<uniform> p: P;
var<workgroup> bv: array<f32, 64>;
var<workgroup> bi: array<u32, 64>;
var<workgroup> bad: array<u32, 64>;
const NONE: u32 = 0xffffffffu;
const NEG_INF: u32 = 0xff800000u;

fn broken(v: f32) -> bool {
    let b = bitcast<u32>(v);
    // Exponent all ones: NaN or an infinity; only -inf is allowed (a masked token).
    return (b & 0x7f800000u) == 0x7f800000u && b != NEG_INF;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x;
    if (r >= p.rows) { return; }
    let o = r * p.v;
    var best = 0.0;
    var idx = NONE;
    var seen_bad = 0u;
    // Each lane scans increasing indices, so a strict `>` keeps its first maximum.
    for (var i = li; i < p.v; i += 64u) {
        let v = x[o + i];
        if (broken(v)) {
            seen_bad = 1u;
        } else if (bitcast<u32>(v) != NEG_INF && (idx == NONE || v > best)) {
            best = v;
            idx = i;
        }
    }
    bv[li] = best;
    bi[li] = idx;
    bad[li] = seen_bad;
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
            bad[li] = max(bad[li], bad[li + k]);
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        if (bad[0] != 0u || bi[0] == NONE) {
            y[r] = -1;
        } else {
            y[r] = i32(bi[0]);
        }
    }
}
