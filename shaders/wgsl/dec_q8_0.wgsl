// Q8_0: 34-byte blocks of 32: f16 d, then 32 i8 quants. y = d * q.
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + c * 34u;
    let d = wf16(b);
    for (var j = 0u; j < 32u; j++) {
        (*v)[j] = d * wi8(b + 2u + j);
    }
}
