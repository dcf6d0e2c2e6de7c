// Elementwise ops over f32: 0 add, 1 mul (b broadcast by `i % bn`), 2 silu, 3 gelu (tanh), 5 softcap,
// 6.. the IR's `Unary` kinds in `UnaryKind::ALL` order (relu, gelu_erf, tanh, sigmoid, neg, exp,
// sqrt, rsqrt, abs, log, step, gelu_erf_grad), 32.. its `Scalar` ops: 32 + 2 * kind (add, sub, mul, div) + reverse, the
// scalar's bits in `bn`;
// 4 silu with ggml's vector expf (ggml numerics: the CPU runtime's ggml::expf, lane for lane,
// so SiLU outputs match ggml's where `fma` is fused instead of differing by the shader exp's
// ulps, which the Q8 quantization of the next matmul would amplify).
struct P { n: u32, bn: u32, op: u32, lanes_x: u32 }
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.lanes_x;
    if (i >= p.n) { return; }
    let v = a[i];
    var r: f32;
    switch p.op {
        case 0u: { r = v + b[i % p.bn]; }
        case 1u: { r = v * b[i % p.bn]; }
        // softcap: `bn` holds the cap's bits; tanh of a clamped argument (|x| >= 10 is +-1).
        case 5u: {
            let c = bitcast<f32>(p.bn);
            r = tanh(clamp(v * (1.0 / c), -10.0, 10.0)) * c;
        }
        case 2u: { r = v / (1.0 + exp(-v)); }
        case 6u: { r = select(v, 0.0, v < 0.0); }
        case 7u: { r = gelu_erf(v); }
        case 8u: { r = tanh(v); }
        case 9u: { r = 1.0 / (1.0 + exp(-v)); }
        case 10u: { r = -v; }
        case 11u: { r = exp(v); }
        case 12u: { r = sqrt(v); }
        case 13u: { r = 1.0 / sqrt(v); }
        case 14u: { r = abs(v); }
        case 15u: { r = log(v); }
        case 16u: { r = select(0.0, 1.0, v > 0.0); }
        case 17u: { r = gelu_erf_grad(v); }
        case 32u, 33u, 34u, 35u, 36u, 37u, 38u, 39u: {
            let c = bitcast<f32>(p.bn);
            var l = v;
            var rr = c;
            if ((p.op & 1u) == 1u) { l = c; rr = v; }
            switch (p.op - 32u) / 2u {
                case 0u: { r = l + rr; }
                case 1u: { r = l - rr; }
                case 2u: { r = l * rr; }
                default: { r = l / rr; }
            }
        }
        case 4u: { r = v / (1.0 + ggml_expf(0.0 - v)); }
        default: {
            r = 0.5 * v * (1.0 + tanh(0.7978845608 * (v + 0.044715 * v * v * v)));
        }
    }
    y[i] = r;
}

// Exact GELU 0.5 x (1 + erf(x / sqrt 2)) with erf from Abramowitz & Stegun 7.1.26 (absolute
// error below 1.5e-7, so within about 2e-7 |x| of the CPU's f64-rounded value); WGSL has no erf.
fn gelu_erf(x: f32) -> f32 {
    let z = abs(x) * 0.70710678118654752;
    let t = 1.0 / (1.0 + 0.3275911 * z);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
        + t * 1.061405429))));
    // erfc(|z|) ~ poly * exp(-z^2): for x < 0, 1 + erf(z) is that tail itself (no cancelling).
    let tail = poly * exp(-z * z);
    return 0.5 * x * select(2.0 - tail, tail, x < 0.0);
}

// The derivative of exact GELU, Phi(x) + x phi(x), with the same erf polynomial as `gelu_erf`.
fn gelu_erf_grad(x: f32) -> f32 {
    let z = abs(x) * 0.70710678118654752;
    let t = 1.0 / (1.0 + 0.3275911 * z);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
        + t * 1.061405429))));
    let tail = poly * exp(-z * z);
    let cdf = 0.5 * select(2.0 - tail, tail, x < 0.0);
    return cdf + x * 0.3989422804014327 * exp(-0.5 * x * x);
}

// One lane of ggml's AVX2 ggml_v_expf (ARM optimized-routines expf); see poot-cpu's ggml.rs.
fn ggml_expf(x: f32) -> f32 {
    // ggml rounds x * log2(e) to an integer with the magic constant 0x1.8p23 (z = fma(x, log2e,
    // 0x1.8p23); n = z - 0x1.8p23): shader compilers may fold that to n = x * log2e (lavapipe
    // does), so it is `round` here (half-even, as the magic add), and the exponent bits of z
    // are n << 23. They differ only when x * log2e rounds across a half-integer (rare).
    let n = round(x * bitcast<f32>(0x3fb8aa3bu));
    let b = fma(-n, bitcast<f32>(0x35bfbe8eu), fma(-n, bitcast<f32>(0x3f317200u), x));
    let e = bitcast<u32>(i32(n)) << 23u;
    let k = bitcast<f32>(e + 0x3f800000u); // 2^n: + the bits of 1.0
    let u = b * b;
    let j = fma(
        fma(fma(bitcast<f32>(0x3c072010u), b, bitcast<f32>(0x3d2b9f17u)), u,
            fma(bitcast<f32>(0x3e2aaf33u), b, bitcast<f32>(0x3efffedbu))),
        u, bitcast<f32>(0x3f7ffff6u) * b);
    if (abs(n) <= 126.0) { return fma(j, k, k); }
    var g = 0u;
    if (n <= 0.0) { g = 0x82000000u; }
    let s1 = bitcast<f32>(g + 0x7f000000u);
    if (abs(n) > 192.0) { return s1 * s1; }
    let s2 = bitcast<f32>(e - g);
    return fma(s2, j, s2) * s1;
}
