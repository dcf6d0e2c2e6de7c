// Activation rows to Q8_K blocks, as ggml's quantize_row_q8_K (the CPU runtime's qact.rs):
// per 256 values max = the value of largest magnitude (the first on ties), iscale = -127 / max,
// q = clamp(round_half_even(iscale * x), -127, 127) (WGSL `round` is half-even), d = 1 / iscale
// (all 0 when max == 0), and the sums of each 16 quants. Out: 81 words per block, 64 words of
// the 256 i8 quants (little-endian), the bits of d (f32), then the 16 sums as i32.
// One lane per block; the caller guarantees whole blocks (k % 256 == 0).
struct P { blocks: u32, lanes_x: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> qa: array<u32>;
@group(0) @binding(2) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x + gid.y * p.lanes_x;
    if (b >= p.blocks) { return; }
    let xo = b * 256u;
    let o = b * 81u;
    var amax = 0.0;
    var mx = 0.0;
    for (var j = 0u; j < 256u; j++) {
        let v = x[xo + j];
        if (abs(v) > amax) {
            amax = abs(v);
            mx = v;
        }
    }
    var iscale = 0.0;
    if (amax != 0.0) { iscale = -127.0 / mx; }
    for (var g = 0u; g < 16u; g++) {
        var sum: i32 = 0;
        for (var w = 0u; w < 4u; w++) {
            var word = 0u;
            for (var i = 0u; i < 4u; i++) {
                let q = clamp(i32(round(iscale * x[xo + 16u * g + 4u * w + i])), -127, 127);
                sum += q;
                word |= (bitcast<u32>(q) & 0xffu) << (8u * i);
            }
            qa[o + 4u * g + w] = word;
        }
        qa[o + 65u + g] = bitcast<u32>(sum);
    }
    var d = 0.0;
    if (amax != 0.0) { d = 1.0 / iscale; }
    qa[o + 64u] = bitcast<u32>(d);
}
