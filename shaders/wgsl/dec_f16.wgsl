fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    for (var j = 0u; j < 32u; j += 2u) {
        let e = c * 32u + j;
        let h = unpack2x16float(wword(base + 2u * e));
        (*v)[j] = select(0.0, h.x, e < k);
        (*v)[j + 1u] = select(0.0, h.y, e + 1u < k);
    }
}
