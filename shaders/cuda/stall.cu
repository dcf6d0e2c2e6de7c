// Fault injection (tests only): spins on the GPU's nanosecond timer for `ns`, so a step that
// starts with it misses any shorter deadline. Bounded, so a process that gives up on it still
// exits once it ends. GPU only: it reads %globaltimer, which the CPU shim does not model.
extern "C" __global__ void stall(unsigned long long ns, unsigned int* sink) {
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    unsigned long long now = start;
    unsigned int spins = 0;
    while (now - start < ns) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        spins += 1;
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        *sink = spins;
    }
}
