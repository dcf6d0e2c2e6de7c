// Writes each token's k and v into its KV slot (slot_mapping[t]; -1 or out of range skips).
// Layout per layer: [num_blocks * block_size slots, kv_heads * head_dim].
struct P { t: u32, row: u32, slots: u32, lanes_x: u32 }
@group(0) @binding(0) var<storage, read> k: array<f32>;
@group(0) @binding(1) var<storage, read> v: array<f32>;
@group(0) @binding(2) var<storage, read> slot_mapping: array<i32>;
@group(0) @binding(3) var<storage, read_write> kc: array<f32>;
@group(0) @binding(4) var<storage, read_write> vc: array<f32>;
@group(0) @binding(5) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.lanes_x;
    if (i >= p.t * p.row) { return; }
    let t = i / p.row;
    let e = i % p.row;
    let slot = slot_mapping[t];
    if (slot < 0 || u32(slot) >= p.slots) { return; }
    kc[u32(slot) * p.row + e] = k[i];
    vc[u32(slot) * p.row + e] = v[i];
}
