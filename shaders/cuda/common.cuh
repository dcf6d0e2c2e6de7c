// Helpers every poot CUDA kernel includes. Written in the dialect that both NVRTC and the CPU
// shim (cpu_shim.h) accept: plain integer and float arithmetic, no CUDA headers, so one source
// runs on the GPU and, bit for bit except transcendental functions, on the CPU in the tests.
#ifndef POOT_COMMON_CUH
#define POOT_COMMON_CUH

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef signed char i8;

// IEEE binary16 bits to f32, exactly (subnormals, infinities and NaN payloads included). Done
// with integer operations rather than cuda_fp16.h so the CPU shim computes the same bits.
__device__ __forceinline__ float poot_f16(u32 h) {
    u32 sign = (h & 0x8000u) << 16;
    u32 exp = (h >> 10) & 0x1Fu;
    u32 man = h & 0x3FFu;
    u32 bits;
    if (exp == 0x1Fu) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0u) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0u) {
        bits = sign;
    } else {
        // Subnormal: normalize the mantissa (value = man * 2^-24).
        u32 e = 113u;
        while ((man & 0x400u) == 0u) {
            man <<= 1;
            e -= 1u;
        }
        bits = sign | (e << 23) | ((man & 0x3FFu) << 13);
    }
    return __uint_as_float(bits);
}

// One little-endian u16 at a 2-byte aligned address.
__device__ __forceinline__ u32 poot_ld16(const u8* p) {
    return (u32)(*(const u16*)p);
}

// Sum over the 32 lanes of a warp; every lane gets the total. The xor tree fixes the order of
// the additions, so the GPU and the shim add in the same order.
__device__ __forceinline__ float poot_warp_sum(float v) {
    for (int m = 16; m > 0; m >>= 1) {
        v += __shfl_xor_sync(0xFFFFFFFFu, v, m);
    }
    return v;
}

__device__ __forceinline__ double poot_warp_sum_f64(double v) {
    for (int m = 16; m > 0; m >>= 1) {
        v += __shfl_xor_sync(0xFFFFFFFFu, v, m);
    }
    return v;
}

// Weight dtypes, numbered as the Rust side passes them (crates/poot-cuda/src/ops.rs).
#define POOT_F32 0
#define POOT_F16 1
#define POOT_Q8_0 2
#define POOT_Q4_0 3
#define POOT_Q4_1 4
// Only cast_f32 reads BF16 (poot_elem has no BF16 case).
#define POOT_BF16 5

#endif
