// Mixture-of-experts matmul over experts packed in place: y[s, n] = sum_k x[xr(s), k] *
// W[ids[s], n, k] for the step's slots s (token t's slot j is s = t * per_tok + j; xr(s) is
// t when every slot of a token reads its row of x, else s), for the experts' rows held by this
// binding (global row g = e * n_rows + n in [row0, row0 + rows)).
// A workgroup takes expert e = e0 + wg.y and 8 of its rows, 8 lanes per row as matmul.wgsl.
// Lane 0 walks the slots in order and hands out those routed to e in tiles of up to 8; each
// tile decodes the rows' 32-value chunks once and multiplies them into the tile's x rows. So
// an expert's rows are read once per 8 of its slots, an expert no slot chose is never read,
// and no expert table is ever built. Each slot's sum runs in the same order (chunk order
// within a lane, then lanes 0..7) whatever the other slots, so a result does not depend on
// how the step's tokens were routed. A slot whose id is outside 0..E matches no workgroup and
// its row stays unwritten; gather_cols gives NaN for it, so moe_combine's row is NaN too.
struct P {
    n: u32, k: u32, slots: u32, per_tok: u32,
    row_bytes: u32, row0: u32, rows: u32, chunks: u32,
    e0: u32, shared_x: u32, _a: u32, _b: u32,
}
@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<i32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: P;
const TT: u32 = 8u;
const SPLIT: u32 = 8u;
// The lanes' sums: [row in group][slot of the tile][lane of the row].
var<workgroup> part: array<f32, 512>;
var<workgroup> tile: array<u32, 8>;
var<workgroup> tile_n: u32;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = li / SPLIT;
    let s = li % SPLIT;
    let e = p.e0 + wg.y;
    let n = wg.x * (64u / SPLIT) + r;
    let g = e * p.n + n;
    let held = n < p.n && g >= p.row0 && g < p.row0 + p.rows;
    let base = select(0u, (g - p.row0) * p.row_bytes, held);
    var cursor = 0u;
    loop {
        // The previous tile's readers of `tile` and `part` are done past this barrier.
        workgroupBarrier();
        if (li == 0u) {
            var m = 0u;
            while (cursor < p.slots && m < TT) {
                if (ids[cursor] == i32(e)) {
                    tile[m] = cursor;
                    m++;
                }
                cursor++;
            }
            tile_n = m;
        }
        let tn = workgroupUniformLoad(&tile_n);
        if (tn == 0u) { break; }
        var acc: array<f32, 8>;
        if (held) {
            var w: array<f32, 32>;
            for (var c = s; c < p.chunks; c += SPLIT) {
                decode32(base, c, p.k, &w);
                let lim = min(32u, p.k - c * 32u);
                for (var tt = 0u; tt < tn; tt++) {
                    let slot = tile[tt];
                    let xr = select(slot, slot / p.per_tok, p.shared_x == 1u);
                    let xo = xr * p.k + c * 32u;
                    var sum = 0.0;
                    for (var j = 0u; j < lim; j++) { sum += w[j] * x[xo + j]; }
                    acc[tt] += sum;
                }
            }
        }
        for (var tt = 0u; tt < TT; tt++) {
            part[(r * TT + tt) * SPLIT + s] = acc[tt];
        }
        workgroupBarrier();
        if (held && s == 0u) {
            for (var tt = 0u; tt < tn; tt++) {
                var total = 0.0;
                for (var l = 0u; l < SPLIT; l++) { total += part[(r * TT + tt) * SPLIT + l]; }
                y[tile[tt] * p.n + n] = total;
            }
        }
    }
}
