// Activation rows to ggml's Q8_0 / Q8_1 blocks, as llama.cpp's x86 quantize_row_q8_0/_1 does
// (the CPU runtime's qact.rs): per 32 values amax = max |x|, d = amax / 127, id = 127 / amax
// (0 when amax == 0), q = round_half_even(x * id) (WGSL `round` is half-even); d is stored
// f16-rounded and, for Q8_1, s = f16(d * sum(q)) with the unrounded d. Out: 10 words per block,
// 8 words of the 32 i8 quants (little-endian), then the bits of d and of s (0 for Q8_0).
// One lane per block; the caller guarantees whole blocks (k % 32 == 0).
struct P { blocks: u32, with_sum: u32, lanes_x: u32, _a: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> qa: array<u32>;
@group(0) @binding(2) var<uniform> p: P;

fn f16r(v: f32) -> f32 { return unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x; }

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x + gid.y * p.lanes_x;
    if (b >= p.blocks) { return; }
    let xo = b * 32u;
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) { amax = max(amax, abs(x[xo + j])); }
    let d = amax / 127.0;
    var id = 0.0;
    if (amax != 0.0) { id = 127.0 / amax; }
    var sum: i32 = 0;
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var i = 0u; i < 4u; i++) {
            // |x * id| <= 127 up to rounding, so the clamp only guards non-finite input.
            let q = clamp(i32(round(x[xo + 4u * w + i] * id)), -128, 127);
            sum += q;
            word |= (bitcast<u32>(q) & 0xffu) << (8u * i);
        }
        qa[b * 10u + w] = word;
    }
    var s = 0.0;
    if (p.with_sum != 0u) { s = f16r(d * f32(sum)); }
    qa[b * 10u + 8u] = bitcast<u32>(f16r(d));
    qa[b * 10u + 9u] = bitcast<u32>(s);
}
