// Little-endian byte readers over a stored weight (any byte offset; blocks are not 4-aligned).
fn wbyte(off: u32) -> u32 {
    return (wt[off >> 2u] >> ((off & 3u) * 8u)) & 0xffu;
}
fn wu16(off: u32) -> u32 {
    return wbyte(off) | (wbyte(off + 1u) << 8u);
}
fn wf16(off: u32) -> f32 {
    return unpack2x16float(wu16(off)).x;
}
fn wi8(off: u32) -> f32 {
    return f32(bitcast<i32>(wbyte(off) << 24u) >> 24u);
}
