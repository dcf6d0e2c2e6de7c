// `mask_logits`: y = x with the tokens whose bit is clear in mask[r] (ceil(V/32) words) set to
// -inf; a row with any non-finite value comes out all NaN (the CPU's `mask_row`). No
// arithmetic, so the result is the CPU's bit for bit. One workgroup of 64 lanes per row.
struct P { v: u32, rows: u32, words: u32, _a: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> mask: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
var<workgroup> bad: array<u32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.x * p.v;
    var nf = 0u;
    for (var i = li; i < p.v; i += 64u) {
        nf |= u32((bitcast<u32>(x[row + i]) & 0x7f800000u) == 0x7f800000u);
    }
    bad[li] = nf;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) { bad[li] |= bad[li + s]; }
        workgroupBarrier();
    }
    let poisoned = bad[0] != 0u;
    for (var i = li; i < p.v; i += 64u) {
        let on = (mask[wid.x * p.words + i / 32u] >> (i % 32u)) & 1u;
        let v = select(bitcast<f32>(0xff800000u), x[row + i], on != 0u);
        y[row + i] = select(v, bitcast<f32>(0x7fc00000u), poisoned);
    }
}
