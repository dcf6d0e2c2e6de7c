// Q8_K: 292-byte super-blocks of 256: f32 d, 256 i8 quants, 16 i16 block sums (dot products
// only; not read). y = d * q. Chunk c of 32 is quants 32 * (c % 8) of super-block c / 8.
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + (c >> 3u) * 292u;
    let d = bitcast<f32>(wword(b));
    let qs = b + 4u + 32u * (c & 7u);
    for (var w = 0u; w < 8u; w++) {
        let q = wword(qs + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            (*v)[4u * w + i] = d * f32(bitcast<i32>(q << (24u - 8u * i)) >> 24u);
        }
    }
}
