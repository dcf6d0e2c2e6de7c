// Q4_1 as integers: the 32 quants (0..15); returns (d, m). See dec_q4_1.wgsl.
fn qdecode32(base: u32, c: u32, v: ptr<function, array<i32, 32>>) -> vec2<f32> {
    let b = base + c * 20u;
    for (var w = 0u; w < 4u; w++) {
        let q = wword(b + 4u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            let x = q >> (8u * i);
            (*v)[4u * w + i] = i32(x & 0xfu);
            (*v)[4u * w + i + 16u] = i32((x >> 4u) & 0xfu);
        }
    }
    return vec2<f32>(wf16(b), wf16(b + 2u));
}
