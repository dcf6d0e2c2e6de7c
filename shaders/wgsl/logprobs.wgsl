// `logprobs`: y[r, j] = log_softmax(x[r])[ids[r, j]] (f64math.wgsl comes first), the CPU's
// order of operations: the f32 maximum, s = sum of exp(f64(x - max)) (here a fixed tree over
// 64 lanes, the CPU's is sequential), lse = f64(max) + ln(s), y = f32(f64(x[id]) - lse). NaN for
// id -1 (or one outside the row) and for a row with a non-finite value. The f64 sum and ln are
// within a few f64 ulp of the CPU's, so y is the CPU's f32 or one ulp from it.
struct P { v: u32, rows: u32, k: u32, _a: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
var<workgroup> mx: array<f32, 64>;
var<workgroup> bad: array<u32, 64>;
var<workgroup> sum: array<f64, 64>;

fn nonfinite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.x * p.v;
    var m = bitcast<f32>(0xff800000u);
    var nf = 0u;
    for (var i = li; i < p.v; i += 64u) {
        let v = x[row + i];
        if (nonfinite(v)) { nf = 1u; } else { m = max(m, v); }
    }
    mx[li] = m;
    bad[li] = nf;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) {
            mx[li] = max(mx[li], mx[li + s]);
            bad[li] |= bad[li + s];
        }
        workgroupBarrier();
    }
    let top = mx[0];
    var acc = 0.0lf;
    for (var i = li; i < p.v; i += 64u) { acc += exp64(f64(x[row + i] - top)); }
    sum[li] = acc;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) { sum[li] += sum[li + s]; }
        workgroupBarrier();
    }
    let lse = f64(top) + ln64(sum[0]);
    for (var j = li; j < p.k; j += 64u) {
        let id = ids[wid.x * p.k + j];
        var out = bitcast<f32>(0x7fc00000u);
        if (bad[0] == 0u && id >= 0 && u32(id) < p.v) { out = f32(f64(x[row + u32(id)]) - lse); }
        y[wid.x * p.k + j] = out;
    }
}
