// Q8_0: 34-byte blocks of 32: f16 d, then 32 i8 quants. y = d * q.
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    let b = base + c * 34u;
    let d = wf16(b);
    for (var w = 0u; w < 8u; w++) {
        let q = wword(b + 2u + 4u * w);
        for (var i = 0u; i < 4u; i++) {
            (*v)[4u * w + i] = d * f32(bitcast<i32>(q << (24u - 8u * i)) >> 24u);
        }
    }
}
