// y[r, j] = x[r, ids[r * id_stride + j]] for x [rows, e] and ids [rows, k] (a router's
// probabilities at its chosen experts, id_stride = k) or ids [1, k] for every row (an
// act-order layer's stored input_perm, id_stride = 0). An id outside 0..e gives NaN: ids made
// on the device (top_k_ids of a row with NaN logits gives -1) cannot be checked before the
// step, and NaN carries through moe_combine to the token's row instead of a silent number.
// Host ids are checked on the host (inputs at each step, stored ids once at compile).
struct P { rows: u32, e: u32, k: u32, lanes_x: u32, id_stride: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.lanes_x;
    if (i >= p.rows * p.k) { return; }
    let r = i / p.k;
    let id = ids[r * p.id_stride + i % p.k];
    if (id < 0 || u32(id) >= p.e) {
        y[i] = bitcast<f32>(0x7fc00000u);
        return;
    }
    y[i] = x[r * p.e + u32(id)];
}
