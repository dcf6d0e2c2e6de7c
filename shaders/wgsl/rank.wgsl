// Rank keys of the sampling kernels (included by sample.wgsl and top_k.wgsl). A logit's key
// orders like Rust's `f32::total_cmp` reversed: a larger value has a smaller key, and the key
// of every finite value is at most KEY_FINITE (-inf's key is one more). With the token id as a
// second key, (key, id) is the CPU's rank order exactly (descending value, ties by lower id),
// so a search over it never depends on how threads are scheduled.
const KEY_FINITE: u32 = 0xff7fffffu;
const NEG_INF_BITS: u32 = 0xff800000u;

fn rank_key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return ~select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// A NaN or +inf (the model's output is broken); -inf alone is a masked token. By bits: WGSL
// lets a compiler assume float arithmetic never sees non-finite values.
fn broken(v: f32) -> bool {
    let b = bitcast<u32>(v);
    return (b & 0x7f800000u) == 0x7f800000u && b != NEG_INF_BITS;
}

fn nonfinite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u;
}
