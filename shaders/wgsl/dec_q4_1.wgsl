// Q4_1: 20-byte blocks of 32: f16 d, f16 m, 16 bytes of nibbles. y = d * q + m.
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + c * 20u;
    let d = wf16(b);
    let m = wf16(b + 2u);
    for (var j = 0u; j < 16u; j++) {
        let q = wbyte(b + 4u + j);
        (*v)[j] = d * f32(q & 0xfu) + m;
        (*v)[j + 16u] = d * f32(q >> 4u) + m;
    }
}
