// The CPU shim: lets a host C++ compiler build poot's CUDA kernels unchanged, so the ordinary
// test suite runs *the same source* the GPU runs (as AMD's HIP-CPU does for HIP).
//
// Model: a launch runs its blocks one after another; inside a block every CUDA thread is a
// fiber with its own stack (entered once through ucontext, then switched with
// _setjmp/_longjmp), scheduled round-robin on one OS thread. __syncthreads() yields to the
// scheduler; a pass over all fibers therefore ends with each one at the barrier
// (or finished), and the next pass releases them. A block where some threads finished while
// others wait at a barrier is the divergent-barrier bug CUDA would hang on: the shim aborts
// with a message instead. Warp shuffles exchange through a per-block slot array between two
// barriers, so kernels must call them with every thread of the block (the dialect's rule;
// shaders/cuda/README.md). __shared__ variables are function statics: one block runs at a
// time, so they are per block as on the GPU.
//
// Float semantics: the tests compile with -ffp-contract=off and NVRTC runs with --fmad=false,
// so both execute the source's roundings in the source's order; only library functions
// (expf) differ between the host libm and the GPU's.
#ifndef POOT_CPU_SHIM_H
#define POOT_CPU_SHIM_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <csetjmp>
#include <mutex>
#include <setjmp.h>
#include <ucontext.h>
#include <vector>

struct dim3 {
    unsigned int x, y, z;
};

namespace poot_shim {

struct Fiber {
    ucontext_t ctx;  // first entry only
    jmp_buf jb;      // every later resume
    dim3 tid;
    bool started;
    bool done;
};

struct Block {
    jmp_buf sched;
    std::vector<Fiber> fibers;
    int current;
    // Shuffle exchange: one 8-byte slot per thread.
    std::vector<uint64_t> slots;
};

inline Block*& block() {
    static Block* b = nullptr;
    return b;
}
inline dim3& block_idx() {
    static dim3 v;
    return v;
}
inline dim3& block_dim() {
    static dim3 v;
    return v;
}
inline dim3& grid_dim() {
    static dim3 v;
    return v;
}

// Yields to the scheduler. Switches use _setjmp/_longjmp, which (unlike swapcontext) make no
// signal-mask system call: a barrier costs a register save per thread, not a syscall.
inline void sync() {
    Block* b = block();
    Fiber& f = b->fibers[b->current];
    if (!_setjmp(f.jb)) {
        _longjmp(b->sched, 1);
    }
}

inline unsigned flat_tid() {
    Block* b = block();
    dim3 t = b->fibers[b->current].tid;
    dim3 d = block_dim();
    return t.x + d.x * (t.y + d.y * t.z);
}

template <class T>
inline T shfl(T v, unsigned src_lane_of(unsigned lane, int arg), int arg) {
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    Block* b = block();
    unsigned me = flat_tid();
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    b->slots[me] = bits;
    sync();
    unsigned lane = me & 31u;
    unsigned src = (me & ~31u) | (src_lane_of(lane, arg) & 31u);
    uint64_t got = b->slots[src];
    sync();
    T out;
    std::memcpy(&out, &got, sizeof(T));
    return out;
}

inline unsigned lane_xor(unsigned lane, int m) { return lane ^ (unsigned)m; }
inline unsigned lane_down(unsigned lane, int d) {
    unsigned s = lane + (unsigned)d;
    return s < 32u ? s : lane;
}

typedef void (*Body)(void* env);

struct Start {
    Body body;
    void* env;
};

inline Start*& start() {
    static Start* s = nullptr;
    return s;
}

[[noreturn]] inline void fiber_main() {
    Block* b = block();
    start()->body(start()->env);
    b->fibers[b->current].done = true;
    _longjmp(b->sched, 1);
}

// Runs `body` as every thread of every block of the launch. Launches from several host
// threads take turns: the block state above is one per process.
inline void launch(dim3 grid, dim3 blk, Body body, void* env) {
    static std::mutex one_at_a_time;
    std::lock_guard<std::mutex> guard(one_at_a_time);
    const size_t stack_bytes = 64 * 1024;
    size_t threads = (size_t)blk.x * blk.y * blk.z;
    if (threads == 0 || threads > 1024 || threads % 32 != 0) {
        std::fprintf(stderr, "poot cpu shim: block of %zu threads (need 32..1024, whole warps)\n",
                     threads);
        std::abort();
    }
    // Not value-initialized: a fiber's stack needs no zeroes, and zeroing 16 MiB per launch
    // was most of a small launch's time.
    std::unique_ptr<char[]> stacks(new char[threads * stack_bytes]);
    Block b;
    b.fibers.resize(threads);
    b.slots.assign(threads, 0);
    Start s{body, env};
    block() = &b;
    start() = &s;
    grid_dim() = grid;
    block_dim() = blk;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                block_idx() = dim3{bx, by, bz};
                for (size_t i = 0; i < threads; ++i) {
                    Fiber& f = b.fibers[i];
                    f.tid = dim3{(unsigned)(i % blk.x), (unsigned)((i / blk.x) % blk.y),
                                 (unsigned)(i / ((size_t)blk.x * blk.y))};
                    f.done = false;
                    f.started = false;
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = stacks.get() + i * stack_bytes;
                    f.ctx.uc_stack.ss_size = stack_bytes;
                    f.ctx.uc_link = nullptr;  // fibers end by jumping to the scheduler
                    makecontext(&f.ctx, (void (*)())fiber_main, 0);
                }
                for (;;) {
                    volatile size_t done = 0;
                    for (volatile size_t i = 0; i < threads; ++i) {
                        Fiber& f = b.fibers[i];
                        if (f.done) {
                            done = done + 1;
                            continue;
                        }
                        b.current = (int)i;
                        if (!_setjmp(b.sched)) {
                            if (!f.started) {
                                f.started = true;
                                setcontext(&f.ctx);
                            }
                            _longjmp(f.jb, 1);
                        }
                        if (b.fibers[i].done) done = done + 1;
                    }
                    if (done == threads) break;
                    if (done != 0) {
                        std::fprintf(stderr,
                                     "poot cpu shim: block (%u,%u,%u): %zu of %zu threads exited "
                                     "while others wait at a barrier (a divergent barrier)\n",
                                     bx, by, bz, done, threads);
                        std::abort();
                    }
                }
            }
    block() = nullptr;
}

}  // namespace poot_shim

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define __launch_bounds__(...)
#define threadIdx (poot_shim::block()->fibers[poot_shim::block()->current].tid)
#define blockIdx (poot_shim::block_idx())
#define blockDim (poot_shim::block_dim())
#define gridDim (poot_shim::grid_dim())

inline void __syncthreads() { poot_shim::sync(); }
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int m) {
    return poot_shim::shfl(v, poot_shim::lane_xor, m);
}
template <class T>
inline T __shfl_down_sync(unsigned, T v, int d) {
    return poot_shim::shfl(v, poot_shim::lane_down, d);
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}

#endif
