// Little-endian readers over a stored weight at any byte offset (blocks are not 4-aligned).
// `wword` reads the 4 bytes at `off` with at most two aligned loads (a funnel shift), so the
// decoders load a 32-value chunk in 4 to 8 words instead of byte by byte.
fn wword(off: u32) -> u32 {
    let a = off >> 2u;
    let s = (off & 3u) * 8u;
    if (s == 0u) { return wt[a]; }
    return (wt[a] >> s) | (wt[a + 1u] << (32u - s));
}
fn wbyte(off: u32) -> u32 {
    return (wt[off >> 2u] >> ((off & 3u) * 8u)) & 0xffu;
}
fn wf16(off: u32) -> f32 {
    return unpack2x16float(wbyte(off) | (wbyte(off + 1u) << 8u)).x;
}
fn wi8(off: u32) -> f32 {
    return f32(bitcast<i32>(wbyte(off) << 24u) >> 24u);
}
