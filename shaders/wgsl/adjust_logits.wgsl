// `adjust_logits`: penalties and bias over a sparse per-row list, in the CPU's order
// (`poot_runtime::sample::adjust_row`). One workgroup of 64 lanes per row; lane l owns the
// tokens i with i % 64 == l and applies, in list order, the entries naming its tokens, so
// repeated ids compose as on the CPU with no cross-lane writes. The host validated the list
// and folded each entry into (id, flags, pen, bias): flags bit 0 applies the repetition
// penalty (a seen id), bit 1 subtracts pen = presence + frequency * count (computed on the
// host in f32, as the CPU does, so no fused multiply-add can change it). The division by the
// penalty is done in f64 and rounded once, which is the f32 quotient when the device's f64
// division is correctly rounded (lavapipe's is; Vulkan allows a few ulp). A row with any
// non-finite value comes out all NaN.
struct P { v: u32, rows: u32, w: u32, _a: u32 }
struct Entry { id: i32, flags: u32, pen: f32, bias: f32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> e: array<Entry>;
@group(0) @binding(2) var<storage, read> rep: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: P;
var<workgroup> bad: array<u32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x;
    let row = r * p.v;
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
        y[row + i] = select(x[row + i], bitcast<f32>(0x7fc00000u), poisoned);
    }
    if (poisoned) { return; }
    let rp = rep[r];
    for (var j = 0u; j < p.w; j++) {
        let a = e[r * p.w + j];
        if (a.id < 0 || (u32(a.id) & 63u) != li) { continue; }
        var v = y[row + u32(a.id)];
        if ((a.flags & 1u) != 0u) { v = select(v * rp, f32(f64(v) / f64(rp)), v > 0.0); }
        if ((a.flags & 2u) != 0u) { v -= a.pen; }
        y[row + u32(a.id)] = v + a.bias;
    }
}
