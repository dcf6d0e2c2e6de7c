// Strided copy of 32-bit words (f32 or i32): dst[dst_off + o * dst_stride + c] =
// src[src_off + o * src_stride + c] for o < outer, c < cols. Slice and concat are this.
struct P { outer: u32, cols: u32, src_stride: u32, src_off: u32, dst_stride: u32, dst_off: u32, lanes_x: u32, _a: u32 }
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.lanes_x;
    if (i >= p.outer * p.cols) { return; }
    let o = i / p.cols;
    let c = i % p.cols;
    dst[p.dst_off + o * p.dst_stride + c] = src[p.src_off + o * p.src_stride + c];
}
