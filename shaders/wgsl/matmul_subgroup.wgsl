// The matmul of matmul_lanes.wgsl (prepended) with the row-dot reduction done by subgroup
// shuffles (raw Vulkan only, where the device offers subgroup shuffles in compute and its
// subgroups hold 8 to 64 lanes: see crates/poot-wgpu/src/vk/mod.rs). Rows, tokens and each
// lane's chunks are matmul.wgsl's, so every lane's partial sum is bit for bit that kernel's;
// only the 8 partials of a row are added in another fixed order: ((s0 + s4) + (s2 + s6)) +
// ((s1 + s5) + (s3 + s7)), the xor butterfly (ggml's hsum8 order), instead of s0 + s1 + ... +
// s7. It needs no workgroup memory and no barrier. The 8 lanes of a row are 8 consecutive lanes
// of one subgroup, taken from the subgroup builtins rather than the local index (Vulkan does not
// tie the two together), so a subgroup of 8, 16, 32 or 64 lanes holds 1, 2, 4 or 8 whole rows
// and the xor partners of a lane (lane ^ 4, ^ 2, ^ 1) are always lanes of its own row.
// No `enable subgroups;`: naga 30 refuses that directive as unimplemented and takes the
// subgroup builtins without it (the validator's capabilities gate them).

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let r = sg * (sg_size / SPLIT) + lane / SPLIT;
    let s = lane % SPLIT;
    let n = (wg.x + wg.y * p.gx) * (64u / SPLIT) + r;
    let t0 = wg.z * TT;
    let tn = min(TT, p.t - t0);
    var acc = lane_sums(n, s, t0, tn);
    // Every lane of the subgroup takes part in each shuffle (tn is the same for the whole
    // workgroup); lanes past the last row carry zeros and write nothing.
    for (var tt = 0u; tt < tn; tt++) {
        var v = acc[tt];
        v += subgroupShuffleXor(v, 4u);
        v += subgroupShuffleXor(v, 2u);
        v += subgroupShuffleXor(v, 1u);
        if (n < p.n && s == 0u) {
            y[(t0 + tt) * p.out_stride + p.n_off + n] = v;
        }
    }
}
