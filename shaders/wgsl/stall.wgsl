// Fault injection only (WgpuOptions::inject_stall_iters): one lane spins `iters` rounds of an
// LCG whose result is stored, so the loop cannot be removed. It makes a submission run past its
// deadline on any adapter, which is how the bounded-wait and poisoning path is tested for real.
struct P { iters: u32, _a: u32, _b: u32, _c: u32 }
@group(0) @binding(0) var<storage, read_write> sink: array<u32>;
@group(0) @binding(1) var<uniform> p: P;

@compute @workgroup_size(1)
fn main() {
    var s = sink[0];
    for (var i = 0u; i < p.iters; i++) {
        for (var j = 0u; j < 1024u; j++) { s = s * 1664525u + 1013904223u; }
    }
    sink[0] = s;
}
