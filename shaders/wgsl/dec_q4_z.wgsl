// Q4_Z (poot's GPTQ/AWQ int4): 19-byte blocks of 32: f16 d, u8 zero z, 16 bytes; low nibbles
// are 0..16, high 16..32. y = d * (q - z); q - z is a small integer, so the product is exact.
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + c * 19u;
    let d = wf16(b);
    let z = f32(wbyte(b + 2u));
    for (var w = 0u; w < 4u; w++) {
        let q = wword(b + 3u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let x = q >> (8u * i);
            (*v)[4u * w + i] = d * (f32(x & 0xfu) - z);
            (*v)[4u * w + i + 16u] = d * (f32((x >> 4u) & 0xfu) - z);
        }
    }
}
