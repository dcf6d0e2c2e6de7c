// BF16 is the high half of an f32: widening is exact.
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    for (var j = 0u; j < 32u; j += 2u) {
        let e = c * 32u + j;
        let w = wword(base + 2u * e);
        (*v)[j] = select(0.0, bitcast<f32>(w << 16u), e < k);
        (*v)[j + 1u] = select(0.0, bitcast<f32>(w & 0xffff0000u), e + 1u < k);
    }
}
