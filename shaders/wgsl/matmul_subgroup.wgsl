// matmul.wgsl with the row-dot reduction done by subgroup shuffles (raw Vulkan only, where the
// device offers subgroup shuffles in compute and its subgroups hold 8 to 64 lanes: see
// crates/poot-wgpu/src/vk/mod.rs). Rows, tokens and each lane's chunks are matmul.wgsl's, so
// every lane's partial sum is bit for bit that kernel's; only the 8 partials of a row are added
// in another fixed order: ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)), the xor butterfly
// (ggml's hsum8 order), instead of s0 + s1 + ... + s7. It needs no workgroup memory and no
// barrier. The 8 lanes of a row are 8 consecutive lanes of one subgroup, taken from the
// subgroup builtins rather than the local index (Vulkan does not tie the two together), so a
// subgroup of 8, 16, 32 or 64 lanes holds 1, 2, 4 or 8 whole rows and the xor partners of a
// lane (lane ^ 4, ^ 2, ^ 1) are always lanes of its own row.
// No `enable subgroups;`: naga 30 refuses that directive as unimplemented and takes the
// subgroup builtins without it (the validator's capabilities gate them).
struct P { n: u32, k: u32, t: u32, row_bytes: u32, n_off: u32, out_stride: u32, chunks: u32, gx: u32 }
@group(0) @binding(0) var<storage, read> wt: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
const TT: u32 = 8u;
const SPLIT: u32 = 8u;

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
    var acc: array<f32, 8>;
    if (n < p.n) {
        var w: array<f32, 32>;
        let base = n * p.row_bytes;
        for (var c = s; c < p.chunks; c += SPLIT) {
            decode32(base, c, p.k, &w);
            let lim = min(32u, p.k - c * 32u);
            for (var tt = 0u; tt < tn; tt++) {
                let xo = (t0 + tt) * p.k + c * 32u;
                var sum = 0.0;
                for (var j = 0u; j < lim; j++) { sum += w[j] * x[xo + j]; }
                acc[tt] += sum;
            }
        }
    }
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
