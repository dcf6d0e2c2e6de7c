// F32 rows: `base` is 4-aligned.
fn decode32(base: u32, c: u32, k: u32, v: ptr<function, array<f32, 32>>) {
    for (var j = 0u; j < 32u; j++) {
        let e = c * 32u + j;
        if (e < k) { (*v)[j] = bitcast<f32>(wt[(base >> 2u) + e]); } else { (*v)[j] = 0.0; }
    }
}
