// Q5_1: 24-byte blocks of 32: f16 d, f16 m, u32 qh (fifth bits), 16 bytes of nibbles.
// y = d * q + m.
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + c * 24u;
    let d = wf16(b);
    let m = wf16(b + 2u);
    let qh = wword(b + 4u);
    for (var w = 0u; w < 4u; w++) {
        let q = wword(b + 8u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let j = 4u * w + i;
            let x = q >> (8u * i);
            let lo = (x & 0xfu) | (((qh >> j) & 1u) << 4u);
            let hi = ((x >> 4u) & 0xfu) | (((qh >> (j + 16u)) & 1u) << 4u);
            (*v)[j] = d * f32(lo) + m;
            (*v)[j + 16u] = d * f32(hi) + m;
        }
    }
}
