// Q2_K: 84-byte super-blocks of 256: 16 scale bytes (4-bit scale low, 4-bit min high, one per
// 16 values), qs[64] (2-bit quants, four per byte), f16 d, f16 dmin. Chunk c of 32 is half
// n = s / 4, shift j = s % 4 of poot-core's reference loop: quant l is bits 2j of qs[32n + l],
// scale byte 8n + 2j + l / 16. y = (d * sc) * q - dmin * m.
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + (c >> 3u) * 84u;
    let s = c & 7u;
    let n = s >> 2u;
    let j = s & 3u;
    let d = wf16(b + 80u);
    let dmin = wf16(b + 82u);
    let sc0 = wbyte(b + 8u * n + 2u * j);
    let sc1 = wbyte(b + 8u * n + 2u * j + 1u);
    let dl0 = d * f32(sc0 & 0xfu);
    let ml0 = dmin * f32(sc0 >> 4u);
    let dl1 = d * f32(sc1 & 0xfu);
    let ml1 = dmin * f32(sc1 >> 4u);
    let qs = b + 16u + 32u * n;
    for (var w = 0u; w < 8u; w++) {
        let q = wword(qs + 4u * w) >> (2u * j);
        let dl = select(dl1, dl0, w < 4u);
        let ml = select(ml1, ml0, w < 4u);
        for (var i = 0u; i < 4u; i++) {
            (*v)[4u * w + i] = dl * f32((q >> (8u * i)) & 3u) - ml;
        }
    }
}
