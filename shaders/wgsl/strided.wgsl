// Strided elementwise ops of lowered torch graphs: y[o] = f(a[ia], b[ib]), where ia and ib come
// from o's index over `shape` (rank <= 8, outermost first) and each operand's element strides
// (0 on a broadcast axis). op: 0 add, 1 sub, 2 mul, 3 div (`BinaryKind::ALL` order), 4 copy a
// (a permute: a's strides permuted), 5 causal mask (copy a; -inf where, in the last two dims
// [m, n], col > row + n - m). `ninf` holds -inf's bits (WGSL has no infinite constants).
struct P {
    n: u32, rank: u32, op: u32, lanes_x: u32,
    shape: array<vec4<u32>, 2>,
    sa: array<vec4<u32>, 2>,
    sb: array<vec4<u32>, 2>,
    ninf: u32, _p0: u32, _p1: u32, _p2: u32,
}
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = gid.x + gid.y * p.lanes_x;
    if (o >= p.n) { return; }
    var rest = o;
    var ia = 0u;
    var ib = 0u;
    var col = 0u;
    var row = 0u;
    for (var k = 0u; k < p.rank; k++) {
        let axis = p.rank - 1u - k;
        let d = p.shape[axis / 4u][axis % 4u];
        let i = rest % d;
        rest = rest / d;
        ia += i * p.sa[axis / 4u][axis % 4u];
        ib += i * p.sb[axis / 4u][axis % 4u];
        if (k == 0u) { col = i; }
        if (k == 1u) { row = i; }
    }
    let v = a[ia];
    var r = v;
    switch p.op {
        case 0u: { r = v + b[ib]; }
        case 1u: { r = v - b[ib]; }
        case 2u: { r = v * b[ib]; }
        case 3u: { r = v / b[ib]; }
        case 5u: {
            let m = p.shape[(p.rank - 2u) / 4u][(p.rank - 2u) % 4u];
            let n = p.shape[(p.rank - 1u) / 4u][(p.rank - 1u) % 4u];
            if (col + m > row + n) { r = bitcast<f32>(p.ninf); }
        }
        default: {}
    }
    y[o] = r;
}
