// Q5_K: 176-byte super-blocks of 256 (8 sub-blocks of 32): f16 d, f16 dmin, 12 bytes of 6-bit
// scales and mins (packed as Q4_K's), qh[32] (bit s of byte l is element l of sub-block s's
// fifth bit), 128 bytes of nibbles (32 bytes hold sub-blocks 2i (low) and 2i+1 (high)).
// y = (d * sc) * q - dmin * m, as poot-core's reference.
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + (c >> 3u) * 176u;
    let s = c & 7u;
    let d = wf16(b);
    let dmin = wf16(b + 2u);
    let sc = b + 4u;
    var scale: u32;
    var mn: u32;
    if (s < 4u) {
        scale = wbyte(sc + s) & 63u;
        mn = wbyte(sc + s + 4u) & 63u;
    } else {
        scale = (wbyte(sc + s + 4u) & 0xfu) | ((wbyte(sc + s - 4u) >> 6u) << 4u);
        mn = (wbyte(sc + s + 4u) >> 4u) | ((wbyte(sc + s) >> 6u) << 4u);
    }
    let d1 = d * f32(scale);
    let m1 = dmin * f32(mn);
    let qs = b + 48u + (s >> 1u) * 32u;
    let shift = (s & 1u) * 4u;
    for (var w = 0u; w < 8u; w++) {
        let q = wword(qs + 4u * w) >> shift;
        let h = wword(b + 16u + 4u * w) >> s;
        for (var i = 0u; i < 4u; i++) {
            let x = ((q >> (8u * i)) & 0xfu) | (((h >> (8u * i)) & 1u) << 4u);
            (*v)[4u * w + i] = d1 * f32(x) - m1;
        }
    }
}
