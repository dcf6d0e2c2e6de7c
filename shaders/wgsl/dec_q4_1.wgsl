// Q4_1: 20-byte blocks of 32: f16 d, f16 m, 16 bytes of nibbles. y = d * q + m.
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + c * 20u;
    let d = wf16(b);
    let m = wf16(b + 2u);
    for (var w = 0u; w < 4u; w++) {
        let q = wword(b + 4u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let x = q >> (8u * i);
            (*v)[4u * w + i] = d * f32(x & 0xfu) + m;
            (*v)[4u * w + i + 16u] = d * f32((x >> 4u) & 0xfu) + m;
        }
    }
}
