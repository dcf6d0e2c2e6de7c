// Q5_0 as integers: the 32 quants q - 16 (-16..15); returns (d, 0). See dec_q5_0.wgsl.
fn qdecode32(base: u32, c: u32, v: ptr<function, array<i32, 32>>) -> vec2<f32> {
    let b = base + c * 22u;
    let qh = wword(b + 2u);
    for (var w = 0u; w < 4u; w++) {
        let q = wword(b + 6u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let j = 4u * w + i;
            let x = q >> (8u * i);
            (*v)[j] = i32((x & 0xfu) | (((qh >> j) & 1u) << 4u)) - 16;
            (*v)[j + 16u] = i32(((x >> 4u) & 0xfu) | (((qh >> (j + 16u)) & 1u) << 4u)) - 16;
        }
    }
    return vec2<f32>(wf16(b), 0.0);
}
