// Fault injection only (WgpuRuntime::inject_stall): every lane of a [256, iters] grid of
// 64-lane workgroups runs 32 x 1024 atomic read-modify-writes on device memory. Atomics are
// side effects no shader compiler may fold away (lavapipe's LLVM folds plain arithmetic loops),
// and the work is spread over many lanes because lavapipe caps one loop nest at 65535
// iterations. The kernel thus really occupies the device long past a short deadline on any
// adapter; this is how the bounded-wait and poisoning path is tested.
struct P { iters: u32, _a: u32, _b: u32, _c: u32 }
@group(0) @binding(0) var<storage, read_write> sink: array<atomic<u32>>;
@group(0) @binding(1) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32) {
    if (p.iters == 0u) { return; }
    for (var i = 0u; i < 32u; i++) {
        for (var j = 0u; j < 1024u; j++) {
            atomicAdd(&sink[li & 15u], i ^ j);
        }
    }
}
