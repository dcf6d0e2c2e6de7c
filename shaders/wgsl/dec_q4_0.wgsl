// Q4_0: 18-byte blocks of 32: f16 d, 16 bytes; low nibbles are 0..16, high 16..32. y = d * (q - 8).
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + c * 18u;
    let d = wf16(b);
    for (var j = 0u; j < 16u; j++) {
        let q = wbyte(b + 2u + j);
        (*v)[j] = d * (f32(q & 0xfu) - 8.0);
        (*v)[j + 16u] = d * (f32(q >> 4u) - 8.0);
    }
}
