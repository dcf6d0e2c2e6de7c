// Q3_K: 110-byte super-blocks of 256: hmask[32] (a set bit s of byte l means no -4 for element
// l of chunk s), qs[64] (low 2 bits, four per byte), 12 bytes of 16 packed 6-bit scales, f16 d.
// Chunk c of 32 is half n = s / 4, shift j = s % 4 of poot-core's reference loop: quant l is
// bits 2j of qs[32n + l], scale 8n + 2j + l / 16. y = (d * (sc - 32)) * (q - (h ? 0 : 4)).
fn q3_scale(sc: u32, i: u32) -> i32 {
    // Scales 0..8 are the low nibbles of bytes 0..8, scales 8..16 their high nibbles.
    let byte = wbyte(sc + (i & 7u));
    let low = select(byte >> 4u, byte & 0xfu, i < 8u);
    let high = (wbyte(sc + 8u + (i & 3u)) >> (2u * (i >> 2u))) & 3u;
    return i32(low | (high << 4u)) - 32;
}

fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + (c >> 3u) * 110u;
    let s = c & 7u;
    let n = s >> 2u;
    let j = s & 3u;
    let d = wf16(b + 108u);
    let dl0 = d * f32(q3_scale(b + 96u, 8u * n + 2u * j));
    let dl1 = d * f32(q3_scale(b + 96u, 8u * n + 2u * j + 1u));
    let qs = b + 32u + 32u * n;
    for (var w = 0u; w < 8u; w++) {
        let q = wword(qs + 4u * w) >> (2u * j);
        let h = wword(b + 4u * w) >> s;
        let dl = select(dl1, dl0, w < 4u);
        for (var i = 0u; i < 4u; i++) {
            let lo = i32((q >> (8u * i)) & 3u);
            let sub = select(4, 0, ((h >> (8u * i)) & 1u) != 0u);
            (*v)[4u * w + i] = dl * f32(lo - sub);
        }
    }
}
