// ids[r, j] = the id of the j-th largest value of row r of x [rows, v], as the CPU's
// `top_k_row`: largest first, equal values by lower id, NaN never chosen, -1 once fewer than k
// values are left. Values are ranked by f32 total order (-0 below +0), compared as the
// integers `key` maps them to. One lane per row makes k passes over the row, each taking the
// best value ranked after the previous pick (a router's rows are tens of experts wide).
struct P { rows: u32, v: u32, k: u32, lanes_x: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> ids: array<i32>;
@group(0) @binding(2) var<uniform> p: P;

fn key(f: f32) -> u32 {
    let b = bitcast<u32>(f);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x + gid.y * p.lanes_x;
    if (r >= p.rows) { return; }
    let o = r * p.v;
    var pk = 0u;
    var pi = -1;
    for (var j = 0u; j < p.k; j++) {
        var bk = 0u;
        var bi = -1;
        for (var i = 0u; i < p.v; i++) {
            let b = bitcast<u32>(x[o + i]);
            // NaN: exponent all ones and a nonzero mantissa.
            if ((b & 0x7fffffffu) > 0x7f800000u) { continue; }
            let kk = key(x[o + i]);
            let after = pi < 0 || kk < pk || (kk == pk && i32(i) > pi);
            if (after && (bi < 0 || kk > bk)) {
                bk = kk;
                bi = i32(i);
            }
        }
        if (bi < 0) {
            for (var jj = j; jj < p.k; jj++) { ids[r * p.k + jj] = -1; }
            return;
        }
        ids[r * p.k + j] = bi;
        pk = bk;
        pi = bi;
    }
}
