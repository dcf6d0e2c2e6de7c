// Batched matmul y[.., i, j] = sum_t a[.., i, t] * b[.., t, j] over f32 operands, one invocation
// per output, t in increasing order (the CPU's order; a fused multiply-add may round once less).
// Batch dims (rank <= 8) broadcast: `sa`/`sb` are each operand's plane strides, 0 where broadcast.
struct P {
    n: u32, brank: u32, m: u32, lanes_x: u32,
    k: u32, cols: u32, _p0: u32, _p1: u32,
    shape: array<vec4<u32>, 2>,
    sa: array<vec4<u32>, 2>,
    sb: array<vec4<u32>, 2>,
}
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = gid.x + gid.y * p.lanes_x;
    if (o >= p.n) { return; }
    let j = o % p.cols;
    let i = (o / p.cols) % p.m;
    var rest = o / (p.cols * p.m);
    var pa = 0u;
    var pb = 0u;
    for (var q = 0u; q < p.brank; q++) {
        let axis = p.brank - 1u - q;
        let d = p.shape[axis / 4u][axis % 4u];
        let idx = rest % d;
        rest = rest / d;
        pa += idx * p.sa[axis / 4u][axis % 4u];
        pb += idx * p.sb[axis / 4u][axis % 4u];
    }
    let ao = pa * p.m * p.k + i * p.k;
    let bo = pb * p.k * p.cols + j;
    var s = 0.0;
    for (var t = 0u; t < p.k; t++) {
        s += a[ao + t] * b[bo + t * p.cols];
    }
    y[o] = s;
}
