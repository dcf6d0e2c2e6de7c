// A CPU emulation of the slice of the CUDA driver API and NVRTC that poot-cuda calls, linked
// into the CPU shim library (src/shim.rs) so the runtime's own host code (plans, arena
// addresses, staging, launches, bounded waits, poisoning) runs in the ordinary test suite.
// "Device" memory is host memory; a launch runs the kernel source through cpu_shim.h at once;
// NVRTC "compiles" to a placeholder image (the kernels are already in this library). The one
// asynchronous behaviour modelled is the fault-injection `stall` kernel: it makes the stream
// busy for its duration, so events recorded after it stay "not ready" until then.
//
// This is a test double for the host side only; kernel numerics are the shim's, and nothing
// here says anything about a real GPU.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

struct PootKernel {
    const char* name;
    void (*launch)(unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void**);
};
extern "C" const PootKernel poot_kernels[];

namespace {

using Clock = std::chrono::steady_clock;

struct Stream {
    Clock::time_point busy_until;
};
struct Event {
    Clock::time_point ready_at;
    Clock::time_point recorded;
};

// Marks the stall kernel's handle (it is GPU-only source; the emulator models its effect).
const PootKernel STALL = {"stall", nullptr};

std::mutex streams;

}  // namespace

#define API extern "C" __attribute__((visibility("default"))) int

API cuInit(unsigned) { return 0; }
API cuDriverGetVersion(int* v) { *v = 0; return 0; }
API cuDeviceGetCount(int* n) { *n = 1; return 0; }
API cuDeviceGet(int* d, int ordinal) {
    if (ordinal != 0) return 101;  // CUDA_ERROR_INVALID_DEVICE
    *d = 0;
    return 0;
}
API cuDeviceGetName(char* name, int len, int) {
    std::strncpy(name, "poot CPU emulator", (size_t)len);
    name[len - 1] = 0;
    return 0;
}
API cuDeviceGetAttribute(int* v, int attr, int) {
    *v = attr == 75 ? 9 : attr == 76 ? 0 : 1;  // "sm_90", one multiprocessor
    return 0;
}
API cuDeviceTotalMem_v2(size_t* b, int) { *b = (size_t)1 << 32; return 0; }
API cuDevicePrimaryCtxRetain(void** ctx, int) { *ctx = (void*)1; return 0; }
API cuDevicePrimaryCtxRelease_v2(int) { return 0; }
API cuCtxSetCurrent(void*) { return 0; }
API cuStreamCreate(void** s, unsigned) { *s = new Stream{Clock::now()}; return 0; }
API cuStreamDestroy_v2(void* s) { delete static_cast<Stream*>(s); return 0; }
API cuEventCreate(void** e, unsigned) { *e = new Event{}; return 0; }
API cuEventDestroy_v2(void* e) { delete static_cast<Event*>(e); return 0; }
API cuEventRecord(void* e, void* s) {
    std::lock_guard<std::mutex> g(streams);
    auto now = Clock::now();
    Event* ev = static_cast<Event*>(e);
    Stream* st = static_cast<Stream*>(s);
    ev->ready_at = st->busy_until > now ? st->busy_until : now;
    ev->recorded = now;
    return 0;
}
API cuEventQuery(void* e) {
    std::lock_guard<std::mutex> g(streams);
    return Clock::now() >= static_cast<Event*>(e)->ready_at ? 0 : 600;  // NOT_READY
}
API cuEventElapsedTime(float* ms, void* a, void* b) {
    auto d = static_cast<Event*>(b)->recorded - static_cast<Event*>(a)->recorded;
    *ms = std::chrono::duration<float, std::milli>(d).count();
    return 0;
}
API cuMemAlloc_v2(uint64_t* p, size_t n) {
    void* m = std::aligned_alloc(256, (n + 255) / 256 * 256);
    if (!m) return 2;  // CUDA_ERROR_OUT_OF_MEMORY
    *p = (uint64_t)m;
    return 0;
}
API cuMemFree_v2(uint64_t p) { std::free((void*)p); return 0; }
API cuMemGetInfo_v2(size_t* free_b, size_t* total) {
    *free_b = *total = (size_t)1 << 32;
    return 0;
}
API cuMemHostAlloc(void** p, size_t n, unsigned) {
    *p = std::malloc(n);
    return *p ? 0 : 2;
}
API cuMemFreeHost(void* p) { std::free(p); return 0; }
API cuMemcpyHtoDAsync_v2(uint64_t dst, const void* src, size_t n, void*) {
    std::memcpy((void*)dst, src, n);
    return 0;
}
API cuMemcpyDtoHAsync_v2(void* dst, uint64_t src, size_t n, void*) {
    std::memcpy(dst, (const void*)src, n);
    return 0;
}
API cuMemsetD8Async(uint64_t dst, unsigned char v, size_t n, void*) {
    std::memset((void*)dst, v, n);
    return 0;
}
API cuModuleLoadData(void** m, const void*) { *m = (void*)1; return 0; }
API cuModuleUnload(void*) { return 0; }
API cuModuleGetFunction(void** f, void*, const char* name) {
    if (std::strcmp(name, "stall") == 0) {
        *f = (void*)&STALL;
        return 0;
    }
    for (const PootKernel* k = poot_kernels; k->name; ++k) {
        if (std::strcmp(k->name, name) == 0) {
            *f = (void*)k;
            return 0;
        }
    }
    return 500;  // CUDA_ERROR_NOT_FOUND
}
API cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned, void* s, void** params, void**) {
    const PootKernel* k = static_cast<const PootKernel*>(f);
    if (k == &STALL) {
        uint64_t ns = *static_cast<uint64_t*>(params[0]);
        std::lock_guard<std::mutex> g(streams);
        Stream* st = static_cast<Stream*>(s);
        auto now = Clock::now();
        auto from = st->busy_until > now ? st->busy_until : now;
        st->busy_until = from + std::chrono::nanoseconds(ns);
        return 0;
    }
    k->launch(gx, gy, gz, bx, by, bz, params);
    return 0;
}
// Resources: the emulation has no registers; it reports 32 per thread (about what ptxas gives
// these kernels) so the compile-time body-limit check runs the same way as on a GPU.
API cuFuncGetAttribute(int* v, int attr, void*) {
    *v = attr == 4 ? 32 : 0;  // CU_FUNC_ATTRIBUTE_NUM_REGS
    return 0;
}
API cuGetErrorName(int r, const char** s) {
    *s = r == 600 ? "CUDA_ERROR_NOT_READY" : r == 500 ? "CUDA_ERROR_NOT_FOUND" : "CUDA_ERROR";
    return 0;
}

// NVRTC: the kernels are already compiled into this library.
API nvrtcVersion(int* major, int* minor) {
    *major = 0;
    *minor = 0;
    return 0;
}
API nvrtcCreateProgram(void** prog, const char*, const char*, int, const char* const*,
                       const char* const*) {
    *prog = (void*)1;
    return 0;
}
API nvrtcCompileProgram(void*, int, const char* const*) { return 0; }
API nvrtcGetProgramLogSize(void*, size_t* n) { *n = 1; return 0; }
API nvrtcGetProgramLog(void*, char* log) { log[0] = 0; return 0; }
API nvrtcGetCUBINSize(void*, size_t* n) { *n = 4; return 0; }
API nvrtcGetCUBIN(void*, char* out) { std::memcpy(out, "\x7f" "ELF", 4); return 0; }
API nvrtcGetPTXSize(void*, size_t* n) { *n = 1; return 0; }
API nvrtcGetPTX(void*, char* out) { out[0] = 0; return 0; }
API nvrtcDestroyProgram(void** prog) { *prog = nullptr; return 0; }
