// Q8_Z (poot's 8-bit GPTQ): 36-byte blocks of 32: f16 d, u16 zero z, 32 u8 quants.
// y = d * (q - z); q - z is a small integer, so the product is exact.
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + c * 36u;
    let d = wf16(b);
    let z = f32(wbyte(b + 2u) | (wbyte(b + 3u) << 8u));
    for (var w = 0u; w < 8u; w++) {
        let q = wword(b + 4u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            (*v)[4u * w + i] = d * (f32((q >> (8u * i)) & 0xffu) - z);
        }
    }
}
