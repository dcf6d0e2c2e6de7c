// Writes each token's k and v into its KV slot (slot_mapping[t]; -1 or out of range skips).
// Layout per layer: [num_blocks * block_size slots, kv_heads * head_dim]. With `round` set (ggml
// numerics) the values are rounded through f16, as llama.cpp's f16 KV cache stores them.
struct P { t: u32, row: u32, slots: u32, lanes_x: u32, round: u32, _a: u32, _b: u32, _c: u32 }
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
    var kv = vec2<f32>(k[i], v[i]);
    if (p.round != 0u) { kv = unpack2x16float(pack2x16float(kv)); }
    kc[u32(slot) * p.row + e] = kv.x;
    vc[u32(slot) * p.row + e] = kv.y;
}
