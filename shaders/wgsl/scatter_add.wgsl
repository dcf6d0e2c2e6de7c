// y[r, c] = sum over t in order with ids[t] == r of src[t, c] (0 where no id is r): the
// adjoint of a row gather (an embedding table's gradient). No atomics (WGSL has no portable
// float atomics): each output element is one lane that walks every id and adds its rows in
// order of t, so the sum is deterministic and rounds exactly as the CPU kernel's (0.0 plus
// each row in turn). Cost: rows * d lanes each reading T ids, the one-hot matmul's O(rows * T
// * d) without its [rows, T] matrix. Host ids are checked against rows on the host; an id
// made on the device outside 0..rows matches no row and is dropped.
struct P { rows: u32, d: u32, t: u32, lanes_x: u32 }
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.lanes_x;
    if (i >= p.rows * p.d) { return; }
    let r = i32(i / p.d);
    let c = i % p.d;
    var acc = 0.0;
    for (var t = 0u; t < p.t; t = t + 1u) {
        if (ids[t] == r) {
            acc = acc + src[t * p.d + c];
        }
    }
    y[i] = acc;
}
