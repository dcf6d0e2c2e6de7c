// Paged attention in llama.cpp's CPU arithmetic; layout, grid and lanes as attention.wgsl. q is
// rounded to f16 and the pool holds f16-rounded K/V (kv_write.wgsl with round = 1). ggml
// normalizes the softmax weights before rounding them to f16 for the product with V, so this
// runs two passes over the positions: the max and the sum of exp (online, pass 1), then the
// weights f16(exp(s - max) * (1 / sum)) times V (pass 2); scores are recomputed in pass 2.
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

fn f16r(v: f32) -> f32 { return unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x; }

struct Score { s: f32, slot: i32 }

// The scaled score of position j of `seq` (NEG and slot -1 outside the sequence or the pool).
fn score(j: i32, n: i32, seq: i32, kvh: u32) -> Score {
    var r = Score(NEG, -1);
    if (j < n && seq >= 0 && u32(seq) < p.seqs) {
        let bi = u32(j) / p.bs;
        if (bi < p.max_blocks) {
            let blk = block_tables[u32(seq) * p.max_blocks + bi];
            if (blk >= 0 && u32(blk) < p.num_blocks) {
                r.slot = blk * i32(p.bs) + i32(u32(j) % p.bs);
                let ko = u32(r.slot) * p.kv_heads * p.hd + kvh * p.hd;
                var dot = 0.0;
                for (var d = 0u; d < p.hd; d++) { dot += qs[d] * kc[ko + d]; }
                r.s = dot * p.scale;
                if (p.softcap > 0.0) {
                    r.s = tanh(clamp(r.s * (1.0 / p.softcap), -10.0, 10.0)) * p.softcap;
                }
            }
        }
    }
    return r;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wid.x;
    let h = wid.y;
    if (t >= p.t) { return; }
    let kvh = h / (p.heads / p.kv_heads);
    let row = p.kv_heads * p.hd;
    let qo = (t * p.heads + h) * p.hd;
    for (var d = li; d < p.hd; d += 64u) { qs[d] = f16r(q[qo + d]); }
    if (li == 0u) { wseq = token_seq[t]; wpos = positions[t]; }
    let seq = workgroupUniformLoad(&wseq);
    let n = workgroupUniformLoad(&wpos) + 1;
    // A sliding-window layer reads only the last `window` positions.
    var lo = 0;
    if (p.window > 0u && n > i32(p.window)) { lo = n - i32(p.window); }
    var m = NEG;
    var l = 0.0;
    for (var p0 = lo; p0 < n; p0 += 64) {
        let r = score(p0 + i32(li), n, seq, kvh);
        red[li] = r.s;
        workgroupBarrier();
        for (var k = 32u; k > 0u; k >>= 1u) {
            if (li < k) { red[li] = max(red[li], red[li + k]); }
            workgroupBarrier();
        }
        let mnew = max(m, red[0]);
        workgroupBarrier();
        var e = 0.0;
        if (r.slot >= 0) { e = exp(r.s - mnew); }
        red[li] = e;
        workgroupBarrier();
        for (var k = 32u; k > 0u; k >>= 1u) {
            if (li < k) { red[li] += red[li + k]; }
            workgroupBarrier();
        }
        l = l * exp(m - mnew) + red[0];
        m = mnew;
        workgroupBarrier();
    }
    var inv = 0.0;
    if (l > 0.0) { inv = 1.0 / l; }
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var p0 = lo; p0 < n; p0 += 64) {
        let r = score(p0 + i32(li), n, seq, kvh);
        var w = 0.0;
        if (r.slot >= 0) { w = f16r(exp(r.s - m) * inv); }
        sc[li] = w;
        slots[li] = r.slot;
        workgroupBarrier();
        for (var rr = 0u; rr < 4u; rr++) {
            let d = li + 64u * rr;
            if (d < p.hd) {
                var a = acc[rr];
                for (var jj = 0u; jj < 64u; jj++) {
                    let sl = slots[jj];
                    if (sl >= 0) { a += sc[jj] * vc[u32(sl) * row + kvh * p.hd + d]; }
                }
                acc[rr] = a;
            }
        }
        workgroupBarrier();
    }
    for (var rr = 0u; rr < 4u; rr++) {
        let d = li + 64u * rr;
        if (d < p.hd) { y[qo + d] = acc[rr]; }
    }
}
