// Q4_0: 18-byte blocks of 32: f16 d, 16 bytes; low nibbles are 0..16, high 16..32. y = d * (q - 8).
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + c * 18u;
    let d = wf16(b);
    for (var w = 0u; w < 4u; w++) {
        let q = wword(b + 2u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let x = q >> (8u * i);
            (*v)[4u * w + i] = d * (f32(x & 0xfu) - 8.0);
            (*v)[4u * w + i + 16u] = d * (f32((x >> 4u) & 0xfu) - 8.0);
        }
    }
}
