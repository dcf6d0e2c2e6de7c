// Q5_0: 22-byte blocks of 32: f16 d, u32 qh (bit j is element j's fifth bit), 16 bytes of
// nibbles (low nibbles are 0..16, high 16..32). y = d * (q - 16).
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + c * 22u;
    let d = wf16(b);
    let qh = wword(b + 2u);
    for (var w = 0u; w < 4u; w++) {
        let q = wword(b + 6u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let j = 4u * w + i;
            let x = q >> (8u * i);
            let lo = (x & 0xfu) | (((qh >> j) & 1u) << 4u);
            let hi = ((x >> 4u) & 0xfu) | (((qh >> (j + 16u)) & 1u) << 4u);
            (*v)[j] = d * f32(i32(lo) - 16);
            (*v)[j + 16u] = d * f32(i32(hi) - 16);
        }
    }
}
