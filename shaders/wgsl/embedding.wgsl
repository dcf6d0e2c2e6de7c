// y[t, :] = row ids[t] of the table, for ids in [v_lo, v_lo + rows) (this binding's rows).
// One lane per (token, 32-chunk); packed rows are decoded in place.
struct P { d: u32, row_bytes: u32, chunks: u32, t: u32, v_lo: u32, rows: u32, lanes_x: u32, _pad: u32 }
@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.lanes_x;
    if (i >= p.t * p.chunks) { return; }
    let t = i / p.chunks;
    let c = i % p.chunks;
    let id = ids[t];
    if (id < i32(p.v_lo) || id >= i32(p.v_lo + p.rows)) { return; }
    var w: array<f32, 32>;
    decode32(u32(id - i32(p.v_lo)) * p.row_bytes, c, p.d, &w);
    let lim = min(32u, p.d - c * 32u);
    for (var j = 0u; j < lim; j++) { y[t * p.d + c * 32u + j] = w[j]; }
}
