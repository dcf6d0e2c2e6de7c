// Rotary embedding: cs holds, per token, cos then sin of each rotated pair's angle (computed on
// the host in the CPU runtime's f32 order), so only the rotation itself runs here, unfused.
// style 0: pairs (2i, 2i+1); style 1 (NeoX): pairs (i, i + rot/2). Dims past rot are copied.
struct P { t: u32, heads: u32, hd: u32, rot: u32, style: u32, lanes_x: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> cs: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.lanes_x;
    if (i >= p.t * p.heads * p.hd) { return; }
    let d = i % p.hd;
    let t = i / (p.heads * p.hd);
    let head = i - d;
    if (d >= p.rot) { y[i] = x[i]; return; }
    let half = p.rot / 2u;
    var pair: u32;
    var i0: u32;
    var i1: u32;
    var second: bool;
    if (p.style == 0u) {
        pair = d / 2u;
        i0 = head + 2u * pair;
        i1 = i0 + 1u;
        second = (d & 1u) == 1u;
    } else {
        pair = d % half;
        i0 = head + pair;
        i1 = i0 + half;
        second = d >= half;
    }
    let c = cs[t * p.rot + pair];
    let s = cs[t * p.rot + half + pair];
    let x0 = x[i0];
    let x1 = x[i1];
    if (second) { y[i] = x0 * s + x1 * c; } else { y[i] = x0 * c - x1 * s; }
}
