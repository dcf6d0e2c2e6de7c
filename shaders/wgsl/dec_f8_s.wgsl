// F8_S (poot's FP8 block): 36-byte blocks of 32: an f32 scale d, then 32 OCP E4M3 bytes.
// y = e4m3(q) * d. Each E4M3 code is built as the f32 bit pattern of its exact value (4 exponent
// bits, bias 7, 3 mantissa bits; exponent 0 subnormal: m * 2^-9; S.1111.111 is NaN; no
// infinities), then one f32 multiply, as the CPU's decoder does.
fn e4m3(q: u32) -> f32 {
    let s = (q & 0x80u) << 24u;
    let e = (q >> 3u) & 15u;
    let m = q & 7u;
    if (e == 15u && m == 7u) { return bitcast<f32>(s | 0x7fc00000u); }
    if (e == 0u) { return bitcast<f32>(s | bitcast<u32>(f32(m) * 0.001953125)); }
    return bitcast<f32>(s | ((e + 120u) << 23u) | (m << 20u));
}

fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + c * 36u;
    let d = bitcast<f32>(wword(b));
    for (var w = 0u; w < 8u; w++) {
        let q = wword(b + 4u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            (*v)[4u * w + i] = e4m3((q >> (8u * i)) & 0xffu) * d;
        }
    }
}
