// Q6_K: 210-byte super-blocks of 256: ql[128] (low nibbles), qh[64] (2 high bits), 16 i8
// scales (one per 16 values), f16 d last. Chunk c of 32 is half n = s / 4, group g = s % 4 of
// poot-core's reference loop. y = (d * sc) * (q - 32).
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + (c >> 3u) * 210u;
    let s = c & 7u;
    let n = s >> 2u;
    let g = s & 3u;
    let d = wf16(b + 208u);
    let ql = b + 64u * n + (g & 1u) * 32u;
    let qh = b + 128u + 32u * n;
    let sc = b + 192u + 8u * n + 2u * g;
    let lshift = (g >> 1u) * 4u;
    let hshift = 2u * g;
    let s0 = d * wi8(sc);
    let s1 = d * wi8(sc + 1u);
    for (var w = 0u; w < 8u; w++) {
        let lo = wword(ql + 4u * w) >> lshift;
        let hi = wword(qh + 4u * w) >> hshift;
        let scale = select(s1, s0, w < 4u);
        for (var i = 0u; i < 4u; i++) {
            let q = ((lo >> (8u * i)) & 0xfu) | (((hi >> (8u * i)) & 3u) << 4u);
            (*v)[4u * w + i] = scale * f32(i32(q) - 32);
        }
    }
}
