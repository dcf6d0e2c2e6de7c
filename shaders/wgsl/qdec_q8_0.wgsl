// Q8_0 as integers: the 32 i8 quants; returns (d, 0). See dec_q8_0.wgsl.
fn qdecode32(base: u32, c: u32, v: ptr<function, array<i32, 32>>) -> vec2<f32> {
    let b = base + c * 34u;
    for (var w = 0u; w < 8u; w++) {
        let q = wword(b + 2u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            (*v)[4u * w + i] = bitcast<i32>(q << (24u - 8u * i)) >> 24u;
        }
    }
    return vec2<f32>(wf16(b), 0.0);
}
