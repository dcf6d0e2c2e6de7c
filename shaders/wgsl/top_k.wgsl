// `top_k` ids, the one kernel of every TopK (the sampling step's top-20 over a vocabulary row
// and a router's top-k over a few experts): y[r, j] = the id of row r's (j+1)-th largest value,
// ties by lower id, NaN never ranked, -1 past the last ranked value (the CPU's `top_k_row`;
// rank.wgsl comes first). One workgroup of 64 lanes per row, rows over a 2-D grid of `gx`
// workgroups per grid row; round j takes the smallest (rank_key, id) above round j-1's, so the
// result is the CPU's exactly (integer comparisons only) and independent of thread scheduling.
// Cost: k passes over the row.
struct P { v: u32, rows: u32, k: u32, gx: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<i32>;
@group(0) @binding(2) var<uniform> p: P;
var<workgroup> bk: array<vec2<u32>, 64>;
const NONE: vec2<u32> = vec2<u32>(0xffffffffu, 0xffffffffu);

fn before(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x < b.x || (a.x == b.x && a.y < b.y);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x + wid.y * p.gx;
    // The same for the whole workgroup, so the barriers below stay in uniform control flow.
    if (r >= p.rows) { return; }
    var prev = vec2<u32>(0u, 0u);
    for (var j = 0u; j < p.k; j++) {
        var best = NONE;
        for (var i = li; i < p.v; i += 64u) {
            let v = x[r * p.v + i];
            let b = bitcast<u32>(v);
            let key = vec2<u32>(rank_key(v), i);
            let nan = (b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0u;
            if (!nan && (j == 0u || before(prev, key)) && before(key, best)) { best = key; }
        }
        bk[li] = best;
        workgroupBarrier();
        for (var s = 32u; s > 0u; s >>= 1u) {
            if (li < s && before(bk[li + s], bk[li])) { bk[li] = bk[li + s]; }
            workgroupBarrier();
        }
        prev = bk[0];
        if (li == 0u) { y[r * p.k + j] = select(i32(prev.y), -1, prev.x == NONE.x && prev.y == NONE.y); }
        workgroupBarrier();
    }
}
