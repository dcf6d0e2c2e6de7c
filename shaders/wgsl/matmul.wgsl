// The matmul of matmul_lanes.wgsl (prepended): lane 0 of each row adds the row's 8 lane sums in
// lane order (s0 + s1 + ... + s7) through workgroup memory.
// The lanes' sums: [row in group][token][lane of the row].
var<workgroup> part: array<f32, 512>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = li / SPLIT;
    let s = li % SPLIT;
    let n = (wg.x + wg.y * p.gx) * (64u / SPLIT) + r;
    let t0 = wg.z * TT;
    let tn = min(TT, p.t - t0);
    var acc = lane_sums(n, s, t0, tn);
    for (var tt = 0u; tt < TT; tt++) {
        part[(r * TT + tt) * SPLIT + s] = acc[tt];
    }
    workgroupBarrier();
    if (n < p.n && s == 0u) {
        for (var tt = 0u; tt < tn; tt++) {
            var total = 0.0;
            for (var l = 0u; l < SPLIT; l++) { total += part[(r * TT + tt) * SPLIT + l]; }
            y[(t0 + tt) * p.out_stride + p.n_off + n] = total;
        }
    }
}
