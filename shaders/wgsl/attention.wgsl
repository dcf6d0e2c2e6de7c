// Paged attention, one workgroup per (token, head): token t attends to positions 0..=pos of its
// sequence through the block table, in tiles of 64 positions with an online softmax (running
// max m and sum l). Each lane owns head dims li, li + 64, ... (head_dim <= 256).
// `window` > 0: the token reads only its last `window` positions (a sliding-window layer);
// `softcap` > 0: scores become tanh(s * (1 / softcap)) * softcap (Gemma 2).
struct P {
    t: u32, heads: u32, kv_heads: u32, hd: u32,
    bs: u32, max_blocks: u32, num_blocks: u32, scale: f32,
    seqs: u32, window: u32, softcap: f32, _c: u32,
}
@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<f32>;
@group(0) @binding(2) var<storage, read> vc: array<f32>;
@group(0) @binding(3) var<storage, read> token_seq: array<i32>;
@group(0) @binding(4) var<storage, read> positions: array<i32>;
@group(0) @binding(5) var<storage, read> block_tables: array<i32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
@group(0) @binding(7) var<uniform> p: P;
var<workgroup> qs: array<f32, 256>;
var<workgroup> sc: array<f32, 64>;
var<workgroup> slots: array<i32, 64>;
var<workgroup> red: array<f32, 64>;
var<workgroup> wpos: i32;
var<workgroup> wseq: i32;
const NEG: f32 = -3.4028235e38;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wid.x;
    let h = wid.y;
    if (t >= p.t) { return; }
    let kvh = h / (p.heads / p.kv_heads);
    let row = p.kv_heads * p.hd;
    let qo = (t * p.heads + h) * p.hd;
    for (var d = li; d < p.hd; d += 64u) { qs[d] = q[qo + d]; }
    if (li == 0u) { wseq = token_seq[t]; wpos = positions[t]; }
    let seq = workgroupUniformLoad(&wseq);
    let n = workgroupUniformLoad(&wpos) + 1;
    var m = NEG;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    var lo = 0;
    if (p.window > 0u && n > i32(p.window)) { lo = n - i32(p.window); }
    for (var p0 = lo; p0 < n; p0 += 64) {
        let j = p0 + i32(li);
        var s = NEG;
        var slot = -1;
        if (j < n && seq >= 0 && u32(seq) < p.seqs) {
            let bi = u32(j) / p.bs;
            if (bi < p.max_blocks) {
                let blk = block_tables[u32(seq) * p.max_blocks + bi];
                if (blk >= 0 && u32(blk) < p.num_blocks) {
                    slot = blk * i32(p.bs) + i32(u32(j) % p.bs);
                    let ko = u32(slot) * row + kvh * p.hd;
                    var dot = 0.0;
                    for (var d = 0u; d < p.hd; d++) { dot += qs[d] * kc[ko + d]; }
                    s = dot * p.scale;
                    if (p.softcap > 0.0) { s = softcap(s, p.softcap); }
                }
            }
        }
        slots[li] = slot;
        red[li] = s;
        workgroupBarrier();
        for (var k = 32u; k > 0u; k >>= 1u) {
            if (li < k) { red[li] = max(red[li], red[li + k]); }
            workgroupBarrier();
        }
        let mnew = max(m, red[0]);
        workgroupBarrier();
        var e = 0.0;
        if (slot >= 0) { e = exp(s - mnew); }
        sc[li] = e;
        red[li] = e;
        workgroupBarrier();
        for (var k = 32u; k > 0u; k >>= 1u) {
            if (li < k) { red[li] += red[li + k]; }
            workgroupBarrier();
        }
        let corr = exp(m - mnew);
        l = l * corr + red[0];
        for (var r = 0u; r < 4u; r++) {
            let d = li + 64u * r;
            if (d < p.hd) {
                var a = acc[r] * corr;
                for (var jj = 0u; jj < 64u; jj++) {
                    let sl = slots[jj];
                    if (sl >= 0) { a += sc[jj] * vc[u32(sl) * row + kvh * p.hd + d]; }
                }
                acc[r] = a;
            }
        }
        m = mnew;
        workgroupBarrier();
    }
    for (var r = 0u; r < 4u; r++) {
        let d = li + 64u * r;
        if (d < p.hd) {
            var o = 0.0;
            if (l > 0.0) { o = acc[r] / l; }
            y[qo + d] = o;
        }
    }
}

// tanh of a clamped argument (|x| >= 10 is +-1 in f32; some tanh lowerings overflow above).
fn softcap(s: f32, c: f32) -> f32 {
    return tanh(clamp(s * (1.0 / c), -10.0, 10.0)) * c;
}
